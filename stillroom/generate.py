"""Stage 4: teacher samples for one (teacher, effort, shard).

Records are appended to ``<out>.partial`` and fsynced one by one, so a killed job resumes where it
stopped; the final file appears (atomically, sorted by key) only once every sample is present.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from .io import dumps_line, read_jsonl, write_jsonl
from .pool import POOL_KEYS
from .provenance import now
from .teachers import Completion, SkipSample, Teacher, TeacherError, make_teacher
from .teachers.budget import BudgetExhausted


def sample_key(prompt_id: str, teacher: str, effort: str, index: int) -> str:
    return f"{prompt_id}/{teacher}/{effort}/{index}"


def _resume(partial: Path, log: Callable[[str], None]) -> dict[str, dict[str, Any]]:
    """Completed records of an earlier run; a torn last line (killed mid-write) is dropped."""
    done: dict[str, dict[str, Any]] = {}
    if not partial.exists():
        return done
    lines = partial.read_text(encoding="utf-8").splitlines(keepends=True)
    good = 0
    for i, line in enumerate(lines):
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            if i != len(lines) - 1:
                raise ValueError(f"{partial}:{i + 1}: corrupt record in the middle of the file") from None
            log(f"warning: dropped a torn last line in {partial}")
            break
        done[rec["key"]] = rec
        good += len(line.encode())
    with open(partial, "r+b") as fh:  # cut the torn tail so appends start on a clean line
        fh.truncate(good)
    return done


def _record(problem: Mapping[str, Any], teacher: str, effort: str, index: int, completion: Completion | None,
            latency: float, error: TeacherError | None = None, skipped: str | None = None) -> dict[str, Any]:
    c = completion
    return {
        "key": sample_key(problem["prompt_id"], teacher, effort, index), "prompt_id": problem["prompt_id"],
        "teacher": teacher, "effort": effort, "sample_index": index, "source": problem["source"],
        "kind": problem["kind"], "prompt": problem["prompt"], "answer": problem["answer"],
        "response": c.text if c else None, "reasoning": c.reasoning if c else None,
        "finish_reason": c.finish_reason if c else None, "prompt_tokens": c.prompt_tokens if c else 0,
        "completion_tokens": c.completion_tokens if c else 0, "model": c.model if c else None,
        "attempts": c.extra.get("attempts", 1) if c else (error.attempts if error else 0),
        "sampling": c.extra.get("sampling") if c else None, "latency_s": round(latency, 6), "created_at": now(),
        "error": str(error) if error else None, "skipped": skipped,
        "max_tokens_clamped_from": c.extra.get("max_tokens_clamped_from") if c else None,
    }


async def _drive(teacher: Teacher, pending: list[tuple[dict[str, Any], int]], params: Mapping[str, Any],
                 sink: Callable[[dict[str, Any]], None], log: Callable[[str], None]) -> None:
    """Complete ``pending`` samples with at most ``concurrency`` requests in flight; each record goes to
    ``sink`` as soon as it exists, so a kill loses only what was in flight."""
    todo = iter(pending)
    t0 = last_log = time.monotonic()
    state: dict[str, Any] = {"done": 0, "tokens": 0, "exhausted": None}

    async def worker() -> None:
        nonlocal last_log
        for problem, index in todo:  # shared iterator: each sample goes to exactly one worker
            if state["exhausted"]:
                return
            start = time.monotonic()
            args = (problem, teacher.name, params["effort"], index)
            try:
                c = await teacher.acomplete(problem, params["effort"], index, params["seed"])
                rec = _record(*args, c, time.monotonic() - start)
            except TeacherError as exc:
                rec = _record(*args, None, time.monotonic() - start, error=exc)
            except SkipSample as exc:
                rec = _record(*args, None, time.monotonic() - start, skipped=str(exc))
            except BudgetExhausted as exc:  # stop admitting; requests in flight still finish and are kept
                state["exhausted"] = exc
                return
            sink(rec)
            state["done"] += 1
            state["tokens"] += rec["completion_tokens"]
            if time.monotonic() - last_log > 10:  # a progress line every 10 s on long shards
                last_log = time.monotonic()
                rate = state["done"] / (last_log - t0)
                log(f"{state['done']}/{len(pending)} samples, {state['tokens'] / (last_log - t0):.0f} output tok/s, "
                    f"ETA {(len(pending) - state['done']) / rate:.0f} s")

    concurrency = max(1, int(teacher.spec.get("concurrency", 1)))
    try:
        if pending:  # a finished shard starts no server
            await teacher.astart()
            await asyncio.gather(*(worker() for _ in range(min(concurrency, len(pending)))))
    finally:
        await teacher.aclose()
    if state["exhausted"]:
        raise BudgetExhausted(f"{state['exhausted']}. {state['done']} samples were done in this run, "
                              f"{len(pending) - state['done']} remain; rerun after the reset to resume")


def run(*, shard: str, out_samples: str, params: Mapping[str, Any], log: Callable[[str], None] = print,
        **_: Any) -> dict[str, Any]:
    teacher_name, effort, k = params["teacher"], params["effort"], params["samples"]
    teacher = make_teacher(teacher_name, params["spec"])
    problems = read_jsonl(shard, required=POOL_KEYS)
    partial = Path(out_samples + ".partial")
    done = {key: rec for key, rec in _resume(partial, log).items() if not rec.get("error")}  # failures: retry
    if done:
        log(f"resuming: {len(done)} samples already done")
    pending = [(p, i) for p in problems for i in range(k) if sample_key(p["prompt_id"], teacher_name, effort, i) not in done]
    with open(partial, "a", encoding="utf-8") as fh:
        def sink(rec: dict[str, Any]) -> None:
            fh.write(dumps_line(rec))
            fh.flush()
            os.fsync(fh.fileno())
            done[rec["key"]] = rec
        asyncio.run(_drive(teacher, pending, params, sink, log))
    records = sorted(done.values(), key=lambda r: (r["prompt_id"], r["sample_index"]))
    failed = [r for r in records if r["error"]]
    allowed = teacher.spec.get("max_failed_fraction", 0.0) * len(records)
    if len(failed) > allowed:
        raise TeacherError(f"{len(failed)} of {len(records)} samples failed for good (e.g. {failed[0]['key']}: "
                           f"{failed[0]['error']}); they stay in {partial} and are retried on the next run",
                           failed[0]["attempts"])
    write_jsonl(out_samples, records)
    partial.unlink()
    tokens = sum(r["completion_tokens"] for r in records)
    skipped = sum(bool(r.get("skipped")) for r in records)
    log(f"{teacher_name}/{effort}: {len(records)} samples ({len(failed)} failed, {skipped} skipped), "
        f"{tokens} completion tokens")
    price = teacher.spec.get("price", {})  # dollars per million tokens
    prompt_tokens = sum(r["prompt_tokens"] for r in records)
    cost = (prompt_tokens * price.get("input_per_mtok", 0) + tokens * price.get("output_per_mtok", 0)) / 1e6
    return {"samples": len(records), "failed": len(failed), "skipped": skipped, "prompts": len(problems),
            "completion_tokens": tokens, "cost_usd": round(cost, 6),
            "prompt_tokens": prompt_tokens,
            "attempts": sum(r["attempts"] for r in records)}
