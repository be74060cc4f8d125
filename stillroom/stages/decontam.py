"""Rule decontam: drop every pool prompt that shares an n-gram with a benchmark item or a split of
the pool (data/decontam.py), and report each drop with the n-grams it shared. A second, shorter
n-gram detector only reports: the kept prompts it flags, with the matched items, for a reader to
judge."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any

from ..config import SPLITS, Decontam, Experiment, StageParams
from ..data.records import POOL_KEYS
from ..data.sources import load_benchmark
from ..io import read_jsonl, write_json, write_jsonl
from .contract import stage

# The CLI imports every stage module to list the stages, and rule decontam builds its job's params
# with job_params: the n-gram index (numpy) is imported where decontamination runs, not here.


class Params(StageParams, Decontam):
    """The config's decontam section, seeded."""


def job_params(exp: Experiment) -> Params:
    """The params of the decontam job: the decontam section."""
    return Params(seed=exp.seed, **exp.decontam.model_dump())


@stage(
    "decontam",
    params=Params,
    inputs=("pool", "benchmarks*"),
    outputs=("clean", "report"),
    help="drop every prompt sharing an n-gram with a benchmark item; write a report",
)
def run(
    *,
    pool: str,
    benchmarks: Mapping[str, str],
    out_clean: str,
    out_report: str,
    params: Mapping[str, Any] | Params,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    from ..data.decontam import NgramIndex

    p = Params.parse(params, where="decontam")
    # the pool's own splits come along as benchmarks; they may be configured empty
    items = {
        name: load_benchmark(
            path, f"benchmark '{name}'", allow_empty=name in SPLITS, benchmark=name
        )
        for name, path in benchmarks.items()
    }
    prompts = {name: [r["prompt"] for r in rows] for name, rows in items.items()}
    index = NgramIndex(prompts, n=p.ngram, max_items=p.ignore_common)
    rows = read_jsonl(pool, required=POOL_KEYS, types={"prompt": str})
    found = index.scan([r["prompt"] for r in rows])
    kept, dropped = [], []
    for row, matches in zip(rows, found, strict=True):
        if matches:
            dropped.append(_entry(row, matches, items))
        else:
            kept.append(row)
    audit = None
    if p.audit_ngram:
        # audit only: what a shorter n-gram would flag among the kept prompts, for a reader to judge
        second = NgramIndex(prompts, n=p.audit_ngram, max_items=p.ignore_common)
        flagged = [
            _entry(row, matches, items)
            for row, matches in zip(kept, second.scan([r["prompt"] for r in kept]), strict=True)
            if matches
        ]
        audit = {"ngram": p.audit_ngram, "flagged": len(flagged), "prompts": flagged}
    per_benchmark = Counter(b for d in dropped for b in {m["benchmark"] for m in d["matches"]})
    counts = {
        "pool": len(rows),
        "kept": len(kept),
        "dropped": len(dropped),
        "ngram": p.ngram,
        "dropped_per_benchmark": dict(per_benchmark),
        "dropped_per_source": dict(Counter(d["source"] for d in dropped)),
        "ignored_common_ngrams": index.ignored,
        "benchmark_items": {name: len(v) for name, v in items.items()},
        **({"audit_flagged": audit["flagged"]} if audit else {}),
    }
    write_jsonl(out_clean, kept)
    write_json(out_report, {**counts, "dropped": dropped, **({"audit": audit} if audit else {})})
    log(
        f"kept {len(kept)} of {len(rows)} prompts; dropped {len(dropped)} "
        f"(per benchmark {dict(per_benchmark)}, per source {counts['dropped_per_source']})"
        + (f"; a {p.audit_ngram}-gram audit flags {audit['flagged']} kept ones" if audit else "")
    )
    return counts


def _entry(row: Mapping[str, Any], matches, items: Mapping[str, list]) -> dict[str, Any]:
    """A pool prompt with the benchmark items it shares n-grams with."""
    shared = [
        {
            "benchmark": m.benchmark,
            "item": m.item,
            "ngram": m.ngram,
            "item_prompt": items[m.benchmark][m.item]["prompt"],
        }
        for m in matches
    ]
    return {**{k: row[k] for k in ("prompt_id", "source", "prompt")}, "matches": shared}
