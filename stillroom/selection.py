"""Choose the merge ratio on a dev split that no reported table uses (seed 003: "Sweep the ratio on a
small eval before committing"). Choosing on a reported benchmark would make its row optimistic.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from .ids import normalize_prompt
from .io import DataError, iter_jsonl, write_json
from .tables import score_matrix


def choose(accuracy: Mapping[str, float], weights: Mapping[str, float]) -> str:
    """The most accurate model; among equals the one with the least fine-tuned weight (the seed's 30/70
    merge tied the base at 1.8x fewer tokens: less fine-tune is the cheaper choice)."""
    return max(accuracy, key=lambda m: (accuracy[m], -weights[m]))


def _prompts(path: str) -> set[str]:
    return {normalize_prompt(r["prompt"]).lower() for r in iter_jsonl(path, required=("prompt",))}


def run(
    *,
    graded: Mapping[str, str],
    dev: str,
    reported: Mapping[str, str],
    out_selection: str,
    params: Mapping[str, Any],
    log: Callable[[str], None] = print,
    **_: Any,
) -> dict[str, Any]:
    """Pick among the merges in ``graded`` (graded dev samples, ``merge-<ratio>`` names) by dev accuracy."""
    dev_prompts = _prompts(dev)
    for name, path in reported.items():
        shared = dev_prompts & _prompts(path)
        if shared:
            raise DataError(
                f"select: the dev split {dev} shares {len(shared)} prompts with reported benchmark "
                f"'{name}' ({path}), e.g. {min(shared)[:80]!r}; choose on a disjoint split"
            )
    weights = {}
    for name in graded:
        prefix, _, ratio = name.partition("-")
        if prefix != "merge" or not ratio:
            raise DataError(f"select: '{name}' is not a merge-<ratio> model")
        weights[name] = float(ratio)
    accuracy = {
        name: float(score_matrix(path)[1].mean()) for name, path in graded.items()
    }  # [1]: correct
    chosen = choose(accuracy, weights)
    write_json(
        out_selection,
        {
            "selected": chosen,
            "tuned_weight": weights[chosen],
            "benchmark": params["benchmark"],
            "accuracy": accuracy,
        },
    )
    log(
        f"selected {chosen} on {params['benchmark']}: "
        + ", ".join(f"{m} {a:.3f}" for m, a in sorted(accuracy.items()))
    )
    return {"selected": chosen, "accuracy": accuracy}
