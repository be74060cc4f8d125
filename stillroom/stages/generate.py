"""Rule generate: teacher samples for one (teacher, shard) at one effort, or at the efforts of an
effort group in one run (one server start), into one file.

Requests go out concurrently (the teacher's ``concurrency``). Each record is appended to
``<out>.partial`` and fsynced, so a job killed at any point resumes where it stopped without losing
or duplicating a sample; samples that failed for good are recorded with their error and retried on
the next run; the final file appears (atomically, sorted by effort, prompt and sample) only once
every sample is present.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from typing import Any

from pydantic import Field, model_validator

from ..config import Effort, Experiment, StageParams, TeacherSpec
from ..data.records import POOL_KEYS
from ..io import Journal, read_jsonl
from ..provenance.sidecars import Notes, now
from ..teachers import Completion, SkipSample, Teacher, TeacherError, make_teacher
from ..teachers.budget import BudgetExhausted
from .contract import stage


class Params(StageParams):
    """One shard at ``effort``, or at several ``efforts`` (in order, each record naming its own) in
    one run, so that one server start serves them all."""

    teacher: str
    spec: TeacherSpec
    effort: Effort | None = Field(None, exclude_if=lambda v: v is None)
    efforts: list[Effort] | None = Field(None, exclude_if=lambda v: v is None)
    samples: int = Field(ge=1, description="samples per prompt")

    @model_validator(mode="after")
    def _one_of(self) -> Params:
        if (self.effort is None) == (self.efforts is None):
            raise ValueError("effort: give effort or efforts")
        return self


def job_params(exp: Experiment, teacher: str, efforts: str | list[str]) -> Params:
    """The params of a generation job of ``teacher``: one effort (its {effort} wildcard), or an
    effort group's ``efforts`` (a list: one job for all, in order); generation's samples per
    prompt."""
    one = {"efforts": efforts} if isinstance(efforts, list) else {"effort": efforts}
    return Params(
        seed=exp.seed,
        teacher=teacher,
        spec=exp.teachers[teacher],
        samples=exp.generation.samples_per_prompt,
        **one,
    )


# Teacher settings that change how it is reached, not what it writes: a killed shard resumes with
# its finished (maybe paid-for) records when only these changed since.
OPERATIONAL = {
    "concurrency",
    "price",
    "max_failed_fraction",
    "base_url",
    "api_key_env",
    "timeout_s",
    "max_attempts",
    "backoff_base_s",
    "backoff_max_s",
    "budget",
}
SERVER_OPERATIONAL = {"startup_timeout_s", "stop_timeout_s", "health_path", "host", "env"}


def fingerprint(p: Params) -> dict[str, Any]:
    """What a shard's records depend on besides its prompts: a partial file written under anything
    else (another model, sampling, effort wording, seed) is started over, never mixed in."""
    spec = {k: v for k, v in p.spec.dump().items() if k not in OPERATIONAL}
    if isinstance(spec.get("server"), dict):
        spec["server"] = {k: v for k, v in spec["server"].items() if k not in SERVER_OPERATIONAL}
    return {"teacher": p.teacher, "spec": spec, "seed": p.seed, "samples": p.samples}


def sample_key(prompt_id: str, teacher: str, effort: str, index: int) -> str:
    return f"{prompt_id}/{teacher}/{effort}/{index}"


def _record(
    problem: Mapping[str, Any],
    teacher: str,
    effort: str,
    index: int,
    completion: Completion | None,
    latency: float,
    error: TeacherError | None = None,
    skipped: str | None = None,
) -> dict[str, Any]:
    c = completion
    return {
        "key": sample_key(problem["prompt_id"], teacher, effort, index),
        "prompt_id": problem["prompt_id"],
        "teacher": teacher,
        "effort": effort,
        "sample_index": index,
        "source": problem["source"],
        "kind": problem["kind"],
        "prompt": problem["prompt"],
        "answer": problem["answer"],
        "response": c.text if c else None,
        "reasoning": c.reasoning if c else None,
        "finish_reason": c.finish_reason if c else None,
        "prompt_tokens": c.prompt_tokens if c else 0,
        "completion_tokens": c.completion_tokens if c else 0,
        "model": c.model if c else None,
        "attempts": c.extra.get("attempts", 1) if c else (error.attempts if error else 0),
        "sampling": c.extra.get("sampling") if c else None,
        "latency_s": round(latency, 6),
        "created_at": now(),
        "error": str(error) if error else None,
        "skipped": skipped,
        "max_tokens_clamped_from": c.extra.get("max_tokens_clamped_from") if c else None,
    }


async def _drive(
    teacher: Teacher,
    pending: list[tuple[dict[str, Any], int, str]],
    seed: int,
    sink: Callable[[dict[str, Any]], None],
    log: Callable[[str], None],
) -> None:
    """Complete ``pending`` (problem, sample index, effort) samples with at most ``concurrency``
    requests in flight; each record goes to ``sink`` as soon as it exists, so a kill loses only what
    was in flight."""
    todo = iter(pending)
    t0 = last_log = time.monotonic()
    state: dict[str, Any] = {"done": 0, "tokens": 0, "exhausted": None}

    async def worker() -> None:
        nonlocal last_log
        # a shared iterator: each sample goes to exactly one worker
        for problem, index, effort in todo:
            if state["exhausted"]:
                return
            start = time.monotonic()
            args = (problem, teacher.name, effort, index)
            try:
                c = await teacher.acomplete(problem, effort, index, seed)
                rec = _record(*args, c, time.monotonic() - start)
            except TeacherError as exc:
                rec = _record(*args, None, time.monotonic() - start, error=exc)
            except SkipSample as exc:
                rec = _record(*args, None, time.monotonic() - start, skipped=str(exc))
            except BudgetExhausted as exc:
                # stop admitting; requests in flight still finish and are kept
                state["exhausted"] = exc
                return
            sink(rec)
            state["done"] += 1
            state["tokens"] += rec["completion_tokens"]
            # a progress line every 10 s on long shards
            if time.monotonic() - last_log > 10:
                last_log = time.monotonic()
                rate = state["done"] / (last_log - t0)
                log(
                    f"{state['done']}/{len(pending)} samples, "
                    f"{state['tokens'] / (last_log - t0):.0f} output tok/s, "
                    f"ETA {(len(pending) - state['done']) / rate:.0f} s"
                )

    concurrency = teacher.concurrency
    try:
        # a finished shard starts no server
        if pending:
            await teacher.astart()
            await asyncio.gather(*(worker() for _ in range(min(concurrency, len(pending)))))
    finally:
        await teacher.aclose()
    if state["exhausted"]:
        raise BudgetExhausted(
            f"{state['exhausted']}. {state['done']} samples were done in this run, "
            f"{len(pending) - state['done']} remain; rerun after the reset to resume"
        )


def _summary(records: list[dict[str, Any]], price: Mapping[str, float]) -> dict[str, Any]:
    prompt, completion = (
        sum(r["prompt_tokens"] for r in records),
        sum(r["completion_tokens"] for r in records),
    )
    return {
        "samples": len(records),
        "failed": sum(bool(r["error"]) for r in records),
        "skipped": sum(bool(r.get("skipped")) for r in records),
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "attempts": sum(r["attempts"] for r in records),
        # price: dollars per million tokens
        "cost_usd": round(
            (prompt * price.get("input_per_mtok", 0) + completion * price.get("output_per_mtok", 0))
            / 1e6,
            6,
        ),
    }


@stage(
    "generate",
    params=Params,
    inputs=("shard", "server?"),
    outputs=("samples",),
    help="teacher samples for one (teacher, shard) at one effort, or at several in one run",
)
def run(
    *,
    shard: str,
    out_samples: str,
    params: Mapping[str, Any] | Params,
    server: str | None = None,
    log: Callable[[str], None] = print,
    notes: Notes | None = None,
) -> dict[str, Any]:
    p = Params.parse(params, where="generate")
    notes = Notes() if notes is None else notes
    efforts = p.efforts or [p.effort]
    teacher_name, k = p.teacher, p.samples
    teacher = make_teacher(teacher_name, p.spec.dump(), notes, server)
    problems = read_jsonl(shard, required=POOL_KEYS)
    one = {"efforts": efforts} if p.efforts else {"effort": p.effort}
    journal = Journal(out_samples, log, {**fingerprint(p), **one})
    # records that failed for good are not done: they are retried; records of prompts no longer in
    # the shard, or whose problem changed under the same id (a corrected answer), are dropped
    problem_of = {
        sample_key(problem["prompt_id"], teacher_name, e, i): problem
        for e in efforts
        for problem in problems
        for i in range(k)
    }
    done = {
        key: r
        for key, r in journal.load().items()
        if not r.get("error")
        and key in problem_of
        and all(r.get(f) == problem_of[key][f] for f in POOL_KEYS)
    }
    if done:
        log(f"resuming: {len(done)} samples already done")
    pending = [
        (problem, i, e)
        for e in efforts
        for problem in problems
        for i in range(k)
        if sample_key(problem["prompt_id"], teacher_name, e, i) not in done
    ]
    with journal:

        def sink(rec: dict[str, Any]) -> None:
            journal.append([rec])
            done[rec["key"]] = rec

        asyncio.run(_drive(teacher, pending, p.seed, sink, log))
    records = {
        e: sorted(
            (r for r in done.values() if r["effort"] == e),
            key=lambda r: (r["prompt_id"], r["sample_index"]),
        )
        for e in efforts
    }
    for recs in records.values():
        failed = [r for r in recs if r["error"]]
        if len(failed) > teacher.spec["max_failed_fraction"] * len(recs):
            raise TeacherError(
                f"{len(failed)} of {len(recs)} samples failed for good (e.g. {failed[0]['key']}: "
                f"{failed[0]['error']}); they stay in {journal.partial} and are retried on the "
                "next run",
                failed[0]["attempts"],
            )
    # the model the server answered as (a hosted API's dated snapshot behind an alias)
    served = sorted({r["model"] for recs in records.values() for r in recs if r["model"]})
    notes.add_resolved(
        {
            "role": f"teacher:{teacher_name}",
            "configured": p.spec.dump().get("model"),
            "served": served,
        }
    )
    # each effort's records together, in the group's order: grading one reads them as they are
    # a served job's journal stays: Snakemake reruns every client of a server it starts, and
    # deletes a failed group's finished outputs; these come back from it without a request
    journal.finish([r for e in efforts for r in records[e]], keep=server is not None)
    per_effort = {}
    for e in efforts:
        per_effort[e] = _summary(records[e], teacher.spec["price"])
        m = per_effort[e]
        log(
            f"{teacher_name}/{e}: {m['samples']} samples "
            f"({m['failed']} failed, {m['skipped']} skipped), "
            f"{m['completion_tokens']} completion tokens"
        )
    total = _summary([r for recs in records.values() for r in recs], teacher.spec["price"])
    return {
        **total,
        "prompts": len(problems),
        **({"per_effort": per_effort} if len(efforts) > 1 else {}),
        # a client of a shared server (None: resumed whole, it sent no request): the ledger bills
        # that server once, not each client
        **({"server": teacher.served_by} if server else {}),
    }
