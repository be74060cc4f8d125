"""Stage 9: sample k answers per problem from a model, identical problems and sample indices for
every model so that the tables can pair them.

The model runs in process (``hf``: batched sampling on CPU or one GPU) or behind an OpenAI-compatible
server (``sglang`` started in the job, or ``openai``): see served_lm.py. Either way long answers are
continued while cut off (``request_tokens`` < ``max_new_tokens``) or budget-forced (``budget``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

from .dataset import effort_tag
from .decoding import Answer, budget_force, continue_truncated
from .ids import prompt_id
from .io import write_jsonl
from .kernels.prompting import user_content
from .sources import load_benchmark

ANSWER_CUE = "\nThe answer is"  # after a forced end of thinking; the students' own answer phrasing


def load_problems(path: str, benchmark: str) -> list[dict[str, Any]]:
    rows = load_benchmark(path)
    for row in rows:
        row.setdefault("prompt_id", prompt_id(row["prompt"], benchmark))
    ids = [r["prompt_id"] for r in rows]
    if len(set(ids)) != len(ids):
        raise ValueError(f"{path}: duplicate prompt ids; a benchmark must list each problem once")
    return rows


def _generate(lm, prefixes: list[list[int]], params: Mapping[str, Any], seed: int) -> list[Answer]:
    """One batch of answers: budget-forced, or sampled and continued while cut off (continue_truncated)."""
    common = {"temperature": params["temperature"], "top_p": params["top_p"], "seed": seed}
    if params.get("budget"):
        return budget_force(
            lm,
            prefixes,
            budget=params["budget"],
            answer_tokens=params.get("answer_tokens", 64),
            cue=params.get("answer_cue", ANSWER_CUE),
            **common,
        )
    limit = params["max_new_tokens"]
    request = min(limit, params.get("request_tokens") or limit)
    first = lm.complete(prefixes, max_new_tokens=request, **common)
    return continue_truncated(lm, prefixes, first, limit=limit, request_tokens=request, **common)


def run(
    *,
    model: str,
    problems: str,
    out_samples: str,
    params: Mapping[str, Any],
    threads: int = 1,
    log: Callable[[str], None] = print,
    **_: Any,
) -> dict[str, Any]:
    from .served_lm import open_lm

    rows = load_problems(problems, params["benchmark"])
    with open_lm(model, params.get("backend"), threads) as lm:
        records, generated, seconds = _sample_all(lm, rows, params, log)
    records.sort(key=lambda r: (r["prompt_id"], r["sample_index"]))
    write_jsonl(out_samples, records)
    cut = sum(r["finish_reason"] == "length" for r in records)
    return {
        "problems": len(rows),
        "samples": len(records),
        "completion_tokens": generated,
        "cap_hit_rate": round(cut / max(1, len(records)), 4),
        "continued": sum("segments" in r and not r.get("forced") for r in records),
        "forced": sum(bool(r.get("forced")) for r in records),
        "tokens_per_s": round(generated / max(seconds, 1e-9), 1),
    }


def _sample_all(
    lm, rows: list[dict[str, Any]], params: Mapping[str, Any], log: Callable[[str], None]
):
    """(records, completion tokens, seconds): k answers per problem, identical problems and sample indices
    for every model."""
    k, name, bench = params["samples"], params["model_name"], params["benchmark"]
    system = (
        [{"role": "system", "content": effort_tag(params["effort_tag"], params["effort"])}]
        if params.get("effort")
        else []
    )
    prompts = [
        lm.encode(lm.render(system + [{"role": "user", "content": user_content(r)}])) for r in rows
    ]
    order = sorted(
        range(len(rows)), key=lambda i: len(prompts[i])
    )  # similar lengths share a batch: less padding
    per_batch = max(1, params["batch_size"] // k)
    records: list[dict[str, Any]] = []
    t0, generated = time.monotonic(), 0
    for b in range(0, len(order), per_batch):
        idx = order[b : b + per_batch]
        answers = _generate(
            lm, [prompts[i] for i in idx for _ in range(k)], params, params["seed"] + b
        )
        for j, answer in enumerate(answers):
            row, s = rows[idx[j // k]], j % k
            generated += answer.completion_tokens
            record = {
                "key": f"{row['prompt_id']}/{name}/{s}",
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
            if params.get("budget"):
                record.update(
                    budget=params["budget"],
                    forced=answer.forced,
                    thinking_tokens=answer.thinking_tokens,
                )
            records.append(record)
        done = min(b + per_batch, len(order))
        log(
            f"{name} on {bench}: {done}/{len(rows)} problems, {generated / (time.monotonic() - t0):.0f} tok/s"
        )
    return records, generated, time.monotonic() - t0
