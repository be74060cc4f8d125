"""Stage 9: sample k answers per problem from a model, identical problems and sample indices for
every model so that the tables can pair them.

This is the local transformers path (batched sampling on CPU or one GPU); the same records can come
from a served model through a teacher backend on a cluster.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

from .dataset import effort_tag
from .ids import prompt_id
from .io import write_jsonl
from .sources import load_benchmark


def load_problems(path: str, benchmark: str) -> list[dict[str, Any]]:
    rows = load_benchmark(path)
    for row in rows:
        row.setdefault("prompt_id", prompt_id(row["prompt"], benchmark))
    ids = [r["prompt_id"] for r in rows]
    if len(set(ids)) != len(ids):
        raise ValueError(f"{path}: duplicate prompt ids; a benchmark must list each problem once")
    return rows


def run(*, model: str, problems: str, out_samples: str, params: Mapping[str, Any], threads: int = 1,
        log: Callable[[str], None] = print, **_: Any) -> dict[str, Any]:
    from .local_lm import LocalLM

    k, name, bench = params["samples"], params["model_name"], params["benchmark"]
    rows = load_problems(problems, bench)
    lm = LocalLM(model, threads)
    system = [{"role": "system", "content": effort_tag(params["effort_tag"], params["effort"])}] if params.get("effort") else []
    texts = [lm.render(system + [{"role": "user", "content": r["prompt"]}]) for r in rows]
    order = sorted(range(len(rows)), key=lambda i: len(texts[i]))  # similar lengths share a batch: less padding
    per_batch = max(1, params["batch_size"] // k)
    records: list[dict[str, Any]] = []
    t0, generated = time.monotonic(), 0
    for b in range(0, len(order), per_batch):
        idx = order[b: b + per_batch]
        batch = lm.sample([texts[i] for i in idx], k=k, temperature=params["temperature"], top_p=params["top_p"],
                          max_new_tokens=params["max_new_tokens"], seed=params["seed"] + b)
        for i, samples in zip(idx, batch):
            row = rows[i]
            for s, sample in enumerate(samples):
                generated += sample.completion_tokens
                records.append({
                    "key": f"{row['prompt_id']}/{name}/{s}", "prompt_id": row["prompt_id"], "model": name,
                    "benchmark": bench, "sample_index": s, "kind": row["kind"], "prompt": row["prompt"],
                    "answer": row["answer"], "response": sample.text, "finish_reason": sample.finish_reason,
                    "completion_tokens": sample.completion_tokens,
                })
        done = min(b + per_batch, len(order))
        log(f"{name} on {bench}: {done}/{len(rows)} problems, {generated / (time.monotonic() - t0):.0f} tok/s")
    records.sort(key=lambda r: (r["prompt_id"], r["sample_index"]))
    write_jsonl(out_samples, records)
    cut = sum(r["finish_reason"] == "length" for r in records)
    return {"problems": len(rows), "samples": len(records), "completion_tokens": generated,
            "cap_hit_rate": round(cut / max(1, len(records)), 4),
            "tokens_per_s": round(generated / (time.monotonic() - t0), 1)}
