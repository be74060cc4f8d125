"""Rules evaluate and evaluate_budget: k answers per problem from a model, on identical problems
and sample indices for every model so that the tables can pair them.

The model runs in process (``hf``: batched sampling on CPU or one GPU) or behind an
OpenAI-compatible server (``sglang``: the checkpoint's server shared by its evaluation jobs, rules
serve_model; or ``openai``: runtime/served.py), as
``open_lm`` picks. Either way long answers are continued while cut off (``request_tokens`` <
``max_new_tokens``) or budget-forced (``budget``; runtime/decoding.py). Answers end at the model's
stop set (runtime/stops.py), which the samples' sidecar records.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from pydantic import Field

from ..config import Decoding, Experiment, Forcing, StageParams, Student
from ..config.evaluation import HFBackend, OpenAIBackend, parse_backend
from ..config.training import EffortTagIn
from ..data.sources import load_benchmark
from ..grading.formats import END_THINK, effort_tag, user_content, with_effort_tag
from ..io import DataError, Journal, stat_fingerprint
from ..provenance.sidecars import Notes, digest
from .contract import stage

if TYPE_CHECKING:
    from ..runtime.decoding import Answer

# The CLI imports every stage module to list the stages, and the rules build each job's params with
# the ``*job_params`` functions here: the runtime (numpy, asyncio, torch) is imported where a model
# is evaluated, not here.


class Params(StageParams, Decoding, Forcing):
    model_name: str
    benchmark: str
    effort_tag: str = Field(pattern=r"\$effort")
    effort_tag_in: EffortTagIn = Student.model_fields["effort_tag_in"].default
    budget: int | None = Field(None, ge=1, description="a thinking budget: budget forcing")

    def param_values(self) -> dict[str, Any]:
        """Without a budget, nothing is forced: the forcing settings are not the job's params, so
        a change to eval.budget_force reruns only the budget jobs."""
        values = super().param_values()
        if self.budget is None:
            for key in ("budget", *Forcing.model_fields):
                del values[key]
        return values


def _job(exp: Experiment, model: str, bench: str, **own: Any) -> Params:
    # eval's decoding (not its benchmark list or budget forcing) and the student's effort tag
    return Params(
        seed=exp.seed,
        model_name=model,
        benchmark=bench,
        effort_tag=exp.student.effort_tag,
        effort_tag_in=exp.student.effort_tag_in,
        **{**exp.eval.model_dump(include=set(Decoding.model_fields)), **own},
    )


def job_params(exp: Experiment, model: str, bench: str) -> Params:
    """The params of rule evaluate's job: ``model`` on ``bench``."""
    return _job(exp, model, bench)


def budget_job_params(exp: Experiment, model: str, bench: str, budget: int | str) -> Params:
    """The params of rule evaluate_budget's job: ``model`` on ``bench`` at thinking budget
    ``budget`` (its wildcard's text), forced as eval.budget_force says."""
    forcing = exp.eval.budget_force.model_dump(include=set(Forcing.model_fields))
    return _job(exp, model, bench, budget=int(budget), **forcing)


def effort_job_params(exp: Experiment, model: str, bench: str, effort: str) -> Params:
    """The params of rule evaluate_effort's job: ``model`` on ``bench``, its prompts tagged with
    ``effort``."""
    return _job(exp, model, bench, effort=effort)


def load_problems(path: str, benchmark: str) -> list[dict[str, Any]]:
    """The benchmark's items, each with its prompt id (a problem listed twice is refused, naming
    both lines; the pool job already checked every configured benchmark)."""
    return load_benchmark(path, f"benchmark '{benchmark}'", benchmark=benchmark)


def _generate(lm, prefixes: list[list[int]], p: Params, seed: int, room: int) -> list[Answer]:
    """One batch of answers within ``room`` new tokens: budget-forced, or sampled and continued
    while cut off."""
    from ..runtime.decoding import budget_force, continue_truncated

    common = {"temperature": p.temperature, "top_p": p.top_p, "seed": seed}
    if p.budget:
        budget = min(p.budget, room - p.answer_tokens - len(lm.encode(END_THINK + p.answer_cue)))
        if budget < 1:
            raise DataError(
                f"eval: the context leaves {room} new tokens, too few for any thinking before the "
                f"forced close and the {p.answer_tokens}-token answer"
            )
        return budget_force(
            lm,
            prefixes,
            budget=budget,
            answer_tokens=p.answer_tokens,
            cue=p.answer_cue,
            **common,
        )
    limit = min(p.max_new_tokens, room)
    request = min(limit, p.request_tokens or limit)
    first = lm.complete(prefixes, max_new_tokens=request, **common)
    return continue_truncated(lm, prefixes, first, limit=limit, request_tokens=request, **common)


def _needs(p: Params, lm) -> int:
    """New tokens an answer may take: the thinking budget plus the forced close and the answer, or
    max_new_tokens."""
    if p.budget:
        return p.budget + len(lm.encode(END_THINK + p.answer_cue)) + p.answer_tokens
    return p.max_new_tokens


@contextlib.contextmanager
def open_lm(
    model_dir: str,
    backend: Any = None,
    threads: int = 1,
    notes: Notes | None = None,
    service: str | None = None,
    log: Callable[[str], None] = print,
) -> Iterator[Any]:
    """The model to evaluate, served as ``backend`` (eval.backend; default in process) says:
    ``hf`` (in process, runtime/lm.py), ``sglang`` (the checkpoint's server that this job's
    allocation shares, through its service file ``service`` (rule serve_model); given none, a server
    started inside the job from the command template with ``{model_path}`` and ``{port}``, always
    stopped; the weights it reports go to ``notes``) or ``openai`` (an already running server at
    ``base_url``)."""
    from ..runtime.served import ServedLM

    spec = parse_backend(backend or {"backend": "hf"})
    if isinstance(spec, HFBackend):
        from ..runtime.lm import LocalLM

        yield LocalLM(model_dir, threads)
    elif isinstance(spec, OpenAIBackend):
        key = os.environ.get(spec.api_key_env) if spec.api_key_env else None
        yield ServedLM(
            model_dir,
            spec.base_url,
            spec.model or model_dir,
            concurrency=spec.concurrency,
            api_key=key,
            stop_by=spec.stop_by,
        )
    else:
        import asyncio

        from ..runtime.service import Server, identity, note_weights, wait_ready

        server = {**spec.server.dump(), "model_path": model_dir}
        model = spec.model or model_dir  # the served name (e.g. --served-model-name)
        role = f"eval:{os.path.basename(model_dir)}"
        own, served_by = (None if service else Server(role, server)), None
        try:
            if own is None:
                ready = wait_ready(service, server["startup_timeout_s"] + 60, log)
                base_url, info, served_by = ready["base_url"], ready.get("model_info"), ready
            else:
                info, base_url = asyncio.run(own.astart()), own.base_url
            note_weights(notes, role, info)
            lm = ServedLM(
                model_dir, base_url, model, concurrency=spec.concurrency, stop_by=spec.stop_by
            )
            lm.served_by = served_by and identity(served_by)
            yield lm
        finally:
            if own is not None:
                own.stop()


@stage(
    "evaluate",
    params=Params,
    inputs=("model", "problems", "server?"),
    outputs=("samples",),
    help="sample answers to a benchmark, k per problem",
)
def run(
    *,
    model: str,
    problems: str,
    out_samples: str,
    server: str | None = None,
    params: Mapping[str, Any] | Params,
    threads: int = 1,
    log: Callable[[str], None] = print,
    notes: Notes | None = None,
) -> dict[str, Any]:
    """Sample every problem; batches are journaled as they finish (a killed job resumes without
    redoing one, to the same samples), and ``out_samples`` appears only when all are done."""
    from ..runtime.checkpoints import context_length
    from ..runtime.stops import stop_set

    p = Params.parse(params, where="eval")
    rows = load_problems(problems, p.benchmark)
    fingerprint = {
        "params": p.dump(),
        "problems": digest(problems)["sha256"],
        "model": stat_fingerprint(model),
        # samples of a partial file that stopped elsewhere are not mixed in
        "stops": stop_set(model).dump(),
    }
    journal = Journal(out_samples, log, fingerprint)
    done = journal.load()
    if done:
        log(f"resuming: {len(done)} samples already done")
    keys = [f"{r['prompt_id']}/{p.model_name}/{s}" for r in rows for s in range(p.samples)]
    if server and all(key in done for key in keys):
        # a served job rebuilt whole from its journal reaches no server (nor bills one)
        records, generated, seconds = [done[key] for key in keys], 0, 0.0
        stops, served_by = fingerprint["stops"], None
    else:
        with open_lm(model, p.backend, threads, notes, server, log) as lm, journal:
            records, generated, seconds = _sample_all(
                lm, rows, p, log, journal, done, p.context_length or context_length(model)
            )
            stops = lm.stops.dump()
            served_by = getattr(lm, "served_by", None)
    records.sort(key=lambda r: (r["prompt_id"], r["sample_index"]))
    # a served job's journal stays: Snakemake reruns every client of a server it starts, and
    # deletes a failed group's finished outputs; these come back from it without a request
    journal.finish(records, keep=server is not None)
    cut = sum(r["finish_reason"] == "length" for r in records)
    clamped = sum("context_limit" in r for r in records)
    return {
        "problems": len(rows),
        "samples": len(records),
        "completion_tokens": sum(r["completion_tokens"] for r in records),
        "cap_hit_rate": round(cut / max(1, len(records)), 4),
        "continued": sum("segments" in r and not r.get("forced") for r in records),
        "forced": sum(bool(r.get("forced")) for r in records),
        "tokens_per_s": round(generated / max(seconds, 1e-9), 1),
        # where answers ended (a "stop" is a token of this set; a cap hit is "length")
        "stops": stops,
        **({"resumed": len(done)} if done else {}),
        **({"context_clamped": clamped} if clamped else {}),
        # a client of a shared server: the ledger bills that server once, not each client
        **({"server": served_by} if server else {}),
    }


def _room(rows, prompts, idx, need: int, context: int | None, log) -> int:
    """New tokens the batch ``idx`` may take: ``need``, or less where the longest prompt leaves
    less of the model's context."""
    if context is None:
        return need
    longest = max(idx, key=lambda i: len(prompts[i]))
    room = context - len(prompts[longest])
    if room < 1:
        raise DataError(
            f"eval: problem {rows[longest]['prompt_id']} has a prompt of {len(prompts[longest])} "
            f"tokens, which leaves no room in the model's {context}-token context"
        )
    if room < need:
        log(f"warning: answers clamped to {room} new tokens to fit the {context}-token context")
    return min(room, need)


def _sample_all(
    lm,
    rows: list[dict[str, Any]],
    p: Params,
    log: Callable[[str], None],
    journal: Journal,
    done: Mapping[str, dict[str, Any]],
    context: int | None,
):
    """(records, completion tokens generated now, seconds): k answers per problem, identical
    problems and sample indices for every model; a batch found in ``done`` is not sampled again."""
    k, name, bench = p.samples, p.model_name, p.benchmark
    tag = effort_tag(p.effort_tag, p.effort) if p.effort else None
    prompts = [
        lm.encode(
            lm.render(
                with_effort_tag(
                    [{"role": "user", "content": user_content(r)}], tag, p.effort_tag_in
                )
            )
        )
        for r in rows
    ]
    need = _needs(p, lm)
    # Similar lengths share a batch: less padding.
    order = sorted(range(len(rows)), key=lambda i: len(prompts[i]))
    per_batch = max(1, p.batch_size // k)
    records: list[dict[str, Any]] = []
    t0, generated = time.monotonic(), 0
    for b in range(0, len(order), per_batch):
        idx = order[b : b + per_batch]
        keys = [f"{rows[i]['prompt_id']}/{name}/{s}" for i in idx for s in range(k)]
        if all(key in done for key in keys):
            records += [done[key] for key in keys]
            continue
        room = _room(rows, prompts, idx, need, context, log)
        answers = _generate(lm, [prompts[i] for i in idx for _ in range(k)], p, p.seed + b, room)
        batch = []
        for j, answer in enumerate(answers):
            row, s = rows[idx[j // k]], j % k
            generated += answer.completion_tokens
            record = {
                "key": keys[j],
                "prompt_id": row["prompt_id"],
                "model": name,
                "benchmark": bench,
                "sample_index": s,
                "kind": row["kind"],
                "prompt": row["prompt"],
                "answer": row["answer"],
                "response": lm.decode(answer.token_ids),
                "finish_reason": answer.finish_reason,
                "completion_tokens": answer.completion_tokens,
            }
            if len(answer.segments) > 1:
                record["segments"] = answer.segments
            if p.budget:
                record.update(
                    budget=p.budget,
                    forced=answer.forced,
                    thinking_tokens=answer.thinking_tokens,
                )
            if room < need:
                record["context_limit"] = room
            batch.append(record)
        journal.append(batch)
        records += batch
        done_now = min(b + per_batch, len(order))
        rate = generated / max(time.monotonic() - t0, 1e-9)
        log(f"{name} on {bench}: {done_now}/{len(rows)} problems, {rate:.0f} tok/s")
    return records, generated, time.monotonic() - t0
