"""Stage 4: teacher samples for one (teacher, effort, shard).

Records are appended to ``<out>.partial`` and fsynced one by one, so a killed job resumes where it
stopped; the final file appears (atomically, sorted by key) only once every sample is present.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from .io import dumps_line, read_jsonl, write_jsonl
from .pool import POOL_KEYS
from .provenance import now
from .teachers import make_teacher


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


def run(*, shard: str, out_samples: str, params: Mapping[str, Any], log: Callable[[str], None] = print,
        **_: Any) -> dict[str, Any]:
    teacher_name, effort, k, seed = params["teacher"], params["effort"], params["samples"], params["seed"]
    teacher = make_teacher(teacher_name, params["spec"])
    problems = read_jsonl(shard, required=POOL_KEYS)
    partial = Path(out_samples + ".partial")
    done = _resume(partial, log)
    if done:
        log(f"resuming: {len(done)} samples already done")
    total = len(problems) * k
    t0 = last_log = time.monotonic()
    with open(partial, "a", encoding="utf-8") as fh:
        for problem in problems:
            for index in range(k):
                key = sample_key(problem["prompt_id"], teacher_name, effort, index)
                if key in done:
                    continue
                start = time.monotonic()
                completion = teacher.complete(problem, effort, index, seed)
                rec = {
                    "key": key, "prompt_id": problem["prompt_id"], "teacher": teacher_name, "effort": effort,
                    "sample_index": index, "source": problem["source"], "kind": problem["kind"],
                    "prompt": problem["prompt"], "answer": problem["answer"], "response": completion.text,
                    "reasoning": completion.reasoning, "finish_reason": completion.finish_reason,
                    "prompt_tokens": completion.prompt_tokens, "completion_tokens": completion.completion_tokens,
                    "model": completion.model, "latency_s": round(time.monotonic() - start, 6),
                    "created_at": now(),
                }
                fh.write(dumps_line(rec))
                fh.flush()
                os.fsync(fh.fileno())
                done[key] = rec
                if time.monotonic() - last_log > 10:  # a progress line every 10 s on long shards
                    last_log = time.monotonic()
                    log(f"{len(done)}/{total} samples ({len(done) / (last_log - t0):.0f}/s)")
    records = sorted(done.values(), key=lambda r: (r["prompt_id"], r["sample_index"]))
    write_jsonl(out_samples, records)
    partial.unlink()
    tokens = sum(r["completion_tokens"] for r in records)
    log(f"{teacher_name}/{effort}: {len(records)} samples, {tokens} completion tokens")
    return {"samples": len(records), "prompts": len(problems), "completion_tokens": tokens,
            "prompt_tokens": sum(r["prompt_tokens"] for r in records)}
