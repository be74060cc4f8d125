"""Rules merge and select_merge: base and fine-tune interpolated at each ratio (runtime/merge.py),
and the ratio chosen on a dev split that no reported table uses (choosing on a reported benchmark
would make its row optimistic). Also rule merge_adapter: a LoRA / QLoRA adapter streamed into its
full-precision base (runtime/adapter_merge.py), a CPU job of its own after the training job."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Literal

from pydantic import Field

from ..config import Experiment, StageParams, Tables, WeightHook
from ..config.training import MergeRatio
from ..ids import normalize_prompt
from ..io import DataError, iter_jsonl, write_json
from .contract import stage

# The CLI imports every stage module to list the stages, and the rules build each job's params with
# the ``*_params`` functions here: what loads torch (or sympy) is imported where a stage runs.


class Params(StageParams):
    ratio: MergeRatio = Field(description="ratio x fine-tune + (1 - ratio) x base")
    weight_hooks: list[WeightHook] = []


def job_params(exp: Experiment, merge: str) -> Params:
    """The params of the job writing the merge named ``merge`` (rule merge's {merge} wildcard):
    its identity's ratio."""
    ratios = {m.name: m.ratio for m in exp.model_ids if m.kind == "merge"}
    return Params(seed=exp.seed, ratio=ratios[merge], weight_hooks=exp.student.weight_hooks)


@stage(
    "merge",
    params=Params,
    inputs=("base", "tuned"),
    outputs=("model",),
    help="interpolate base and fine-tuned weights",
)
def run(
    *,
    base: str,
    tuned: str,
    out_model: str,
    params: Mapping[str, Any] | Params,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """One merge at ``params.ratio``."""
    from ..runtime.hooks import WeightHooks
    from ..runtime.merge import interpolate

    p = Params.parse(params, where="merge")
    hooks = WeightHooks(p.weight_hooks)
    summary = interpolate(base, tuned, out_model, p.ratio, hooks=hooks)
    log(
        f"merged {summary['tensors']} tensors ({summary['parameters']:,} parameters) at "
        f"ratio={p.ratio} in {summary['seconds']:.2f}s"
    )
    return summary


class AdapterParams(StageParams):
    weight_hooks: list[WeightHook] = []


def adapter_job_params(exp: Experiment) -> AdapterParams:
    """The params of every merge_adapter job: the student's weight hooks."""
    return AdapterParams(seed=exp.seed, weight_hooks=exp.student.weight_hooks)


@stage(
    "merge_adapter",
    params=AdapterParams,
    inputs=("base", "adapter"),
    outputs=("model",),
    help="merge a LoRA / QLoRA adapter into its full-precision base, streamed shard by shard",
)
def run_adapter(
    *,
    base: str,
    adapter: str,
    out_model: str,
    params: Mapping[str, Any] | AdapterParams,
    threads: int = 1,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """An adapter (e.g. a QLoRA one) streamed into its full-precision base, shard by shard: the
    training job's adapter made the checkpoint that evaluation and merges read."""
    import torch

    from ..runtime.adapter_merge import stream_merge
    from ..runtime.hooks import WeightHooks

    p = AdapterParams.parse(params, where="merge_adapter")
    torch.set_num_threads(threads)
    summary = stream_merge(base, adapter, out_model, hooks=WeightHooks(p.weight_hooks))
    log(
        f"merged adapter {adapter} into {base}: {summary['tensors_merged']} of "
        f"{summary['tensors']} tensors ({summary['parameters']:,} parameters, "
        f"{summary['shards']} shards) in {summary['seconds']:.2f}s"
    )
    return summary


def choose(accuracy: Mapping[str, float], weights: Mapping[str, float]) -> str:
    """The most accurate model; among equals the one with the least fine-tuned weight (a merge
    that ties the base at fewer tokens: less fine-tune is the cheaper choice)."""
    return max(accuracy, key=lambda m: (accuracy[m], -weights[m]))


def choose_by_tokens(grids: Mapping[str, tuple], weights: Mapping[str, float], p) -> str:
    """The fewest mean tokens among the models whose accuracy ties the most accurate one's: the
    paired bootstrap interval of their difference contains 0."""
    from ..analysis.stats import paired_bootstrap

    best = choose({m: float(g[1].mean()) for m, g in grids.items()}, weights)
    boot = {"n_resamples": p.n_resamples, "confidence": p.confidence, "seed": p.seed}
    tied = [
        m
        for m, g in grids.items()
        if m == best or paired_bootstrap(g[1], grids[best][1], **boot).verdict == "tie"
    ]
    return min(tied, key=lambda m: (float(grids[m][2].mean()), weights[m]))


def _prompts(path: str) -> set[str]:
    return {normalize_prompt(r["prompt"]).lower() for r in iter_jsonl(path, required=("prompt",))}


class SelectParams(StageParams, Tables):
    benchmark: str = Field(description="the dev split the ratio is chosen on")
    select_by: Literal["accuracy", "tokens"] = "accuracy"
    ratios: dict[str, MergeRatio] = Field(
        description="each merge's ratio, by its model name (the merges' identities)"
    )


def select_job_params(exp: Experiment) -> SelectParams:
    """The params of the select_merge job: the dev split, the rule and every merge's ratio."""
    return SelectParams(
        seed=exp.seed,
        benchmark=exp.merge.select_on,
        select_by=exp.merge.select_by,
        ratios={m.name: m.ratio for m in exp.model_ids if m.kind == "merge"},
        **exp.tables.model_dump(),
    )


def decide(
    graded: Mapping[str, str], p: SelectParams
) -> tuple[str, dict[str, float], dict[str, float]]:
    """The merge chosen from its graded dev records, with each one's accuracy and mean tokens
    (``audit --bundle`` decides again from the bundled records)."""
    from ..analysis.grids import score_matrix  # numpy: imported by the job that selects

    weights = {name: p.ratios[name] for name in graded}
    grids = {name: score_matrix(path) for name, path in graded.items()}
    accuracy = {name: float(g[1].mean()) for name, g in grids.items()}
    tokens = {name: round(float(g[2].mean()), 3) for name, g in grids.items()}
    if p.select_by == "tokens":
        return choose_by_tokens(grids, weights, p), accuracy, tokens
    return choose(accuracy, weights), accuracy, tokens


@stage(
    "select_merge",
    params=SelectParams,
    inputs=("graded*", "dev", "reported*"),
    outputs=("merge_choice",),
    help="choose the merge ratio by accuracy on a dev split disjoint from every reported benchmark",
)
def select_merge(
    *,
    graded: Mapping[str, str],
    dev: str,
    reported: Mapping[str, str],
    out_merge_choice: str,
    params: Mapping[str, Any] | SelectParams,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Pick among the merges in ``graded`` (graded dev samples by model name; each one's ratio in
    ``params.ratios``) by dev accuracy."""
    p = SelectParams.parse(params, where="merge")
    dev_prompts = _prompts(dev)
    for name, path in reported.items():
        shared = dev_prompts & _prompts(path)
        if shared:
            raise DataError(
                f"select: the dev split {dev} shares {len(shared)} prompts with reported benchmark "
                f"'{name}' ({path}), e.g. {min(shared)[:80]!r}; choose on a disjoint split"
            )
    unknown = sorted(set(graded) - set(p.ratios))
    if unknown:
        raise DataError(
            f"select: {', '.join(unknown)}: no merge ratio in params.ratios "
            f"(have {sorted(p.ratios)})"
        )
    chosen, accuracy, tokens = decide(graded, p)
    write_json(
        out_merge_choice,
        {
            "selected": chosen,
            "ratio": p.ratios[chosen],
            "benchmark": p.benchmark,
            "select_by": p.select_by,
            "accuracy": accuracy,
            "mean_tokens": tokens,
        },
    )
    log(
        f"selected {chosen} on {p.benchmark} by {p.select_by}: "
        + ", ".join(f"{m} {a:.3f} ({tokens[m]:.0f} tokens)" for m, a in sorted(accuracy.items()))
    )
    return {"selected": chosen, "accuracy": accuracy, "mean_tokens": tokens}
