"""Every file the workflow writes, as one table of path templates under results/<experiment>: the
rules' input:/output:/log:/benchmark: (timing) and the plan's enumerations (the cost ledger's
artifacts, every sidecar, the tables) all format these, so each path is written once.

A field left out stays ``{name}``, a Snakemake wildcard of the rule that declares the path."""

from __future__ import annotations

from string import Formatter

from ..config import TEACHERS_TABLE

PATHS = {
    "benchmark": "benchmarks/{bench}.jsonl",  # a benchmark materialised from a dataset spec
    "pool": "pool/pool.jsonl",
    "heldout": "pool/heldout.jsonl",
    "dev": "pool/dev.jsonl",
    "decontaminated": "pool/decontaminated.jsonl",
    "decontam_report": "pool/decontam_report.json",
    "shard": "shards/shard-{shard}.jsonl",
    # {efforts}: the job's effort key (plan/generation.py), the effort itself unless it is grouped
    "generated": "gen/{teacher}/{efforts}/shard-{shard}.jsonl",
    # a running server's address, for its clients in the same allocation (a Snakemake service)
    "teacher_service": "serve/teachers/{teacher}/server-{server}.json",
    "graded_shard": "graded/{teacher}/{effort}/shard-{shard}.jsonl",
    "dataset": "dataset/train.jsonl",
    "ablation_dataset": "dataset/select-{selection}.jsonl",
    "tokenizer": "student/tokenizer",
    # base, sft<phase>, select-<selection>, a merge, grpo; <name>.adapter: a LoRA job's adapter
    "checkpoint": "ckpt/{model}",
    # {run}: one of EVAL_RUNS
    "samples": "eval/{run}/samples.jsonl",
    "graded": "eval/{run}/graded.jsonl",
    "model_service": "serve/models/{model}.json",  # a checkpoint served for its evaluations
    "merge_choice": "merge/selected.json",  # the merge chosen on dev
    # tables and ledgers, one file per {ext}
    "tables": "tables/{bench}.{ext}",
    "budget_tables": "tables/{bench}-budgets.{ext}",
    "effort_tables": "tables/{bench}-efforts.{ext}",
    "kernel_tables": "tables/{bench}-kernels.{ext}",
    "teacher_tables": f"tables/{TEACHERS_TABLE}.{{ext}}",
    "cost": "cost/ledger.{ext}",
    "config": "config/{hash}.json",  # the resolved config's snapshot, named by its hash
    "log": "logs/{job}.log",
    "timing": "timing/{job}.tsv",  # a benchmark: file (wall time, memory, I/O of each job)
}

# An evaluation run, the {run} of PATHS' samples and graded, by the rule that samples it.
EVAL_RUNS = {
    "evaluate": "{model}/{bench}",
    "evaluate_budget": "{model}/{bench}/budget-{budget}",
    "evaluate_effort": "{model}/{bench}/effort-{effort}",
}


def fill(template: str, **fields: object) -> str:
    """``template`` with ``fields`` filled in; every other ``{name}`` stays as it is."""
    parts, names = [], set()
    for literal, name, _, _ in Formatter().parse(template):
        parts.append(literal)
        if name is not None:
            names.add(name)
            parts.append(str(fields[name]) if name in fields else f"{{{name}}}")
    unknown = sorted(set(fields) - names)
    if unknown:
        raise KeyError(f"path template {template!r} has no field {', '.join(unknown)}")
    return "".join(parts)
