"""What several table kinds share: a comparison's cells in a row of the schema, and the caption's
notes (golds left out, rows cut off at the token cap, a random-weight base)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from ..stats import VERDICT, Comparison

BASE_RANDOM = (
    " The base is a random-weight initialisation, not a pretrained model: its rows are a floor, "
    "not a baseline."
)


def mirrored(c: Comparison) -> Comparison:
    """The same comparison seen from the other side."""
    return dataclasses.replace(
        c,
        mean_a=c.mean_b,
        mean_b=c.mean_a,
        delta=-c.delta,
        low=-c.high,
        high=-c.low,
        verdict={"a": "b", "b": "a", "tie": "tie", "zero": "zero"}[c.verdict],
    )


def comparison_cells(c: Comparison | None, holm: bool = True) -> dict[str, Any]:
    """The schema's comparison columns of a row (COMPARISON), none where there is no comparison."""
    if c is None:
        return {}
    return {
        "delta": c.delta,
        "ci_low": c.low,
        "ci_high": c.high,
        "verdict": VERDICT[c.verdict],
        **({"p_value": c.p_value, "p_holm": c.p_holm} if holm else {}),
    }


def token_cells(c: Comparison | None, solved: bool = True) -> dict[str, Any]:
    """Δ mean tokens with its interval, and the token ratio (model / reference); no ratio unless
    both ``solved`` something (the lengths of wrong answers only are no economy)."""
    if c is None:
        return {}
    return {
        "delta_tokens": c.delta,
        "tokens_ci_low": c.low,
        "tokens_ci_high": c.high,
        "token_ratio": c.mean_a / c.mean_b if c.mean_b and solved else None,
    }


def cap_note(flagged: list[str], flag: float) -> str:
    """The caption's word on the rows ``render.cap_cell`` marks."""
    if not flagged:
        return ""
    return (
        f" † more than {flag:.0%} of answers hit the token cap ({', '.join(flagged)}): their "
        "accuracy counts those cut-off answers as wrong, so a difference there may be truncation, "
        "not ability."
    )


def gold_note(excluded: int, where: str) -> str:
    """The caption's count of problems left out for a gold answer that does not parse."""
    if not excluded:
        return ""
    return (
        f" {excluded} problem{'s' if excluded != 1 else ''} of {where} with a gold answer that "
        "does not parse as written left out of accuracy (grade status gold_unparseable)."
    )


def gold_sources(excluded: Mapping[str, set[str]]) -> str:
    """Prompts left out for a gold answer that does not parse, per source, for a caption."""
    if not excluded:
        return ""
    counts = ", ".join(f"{src} {len(ids)}" for src, ids in sorted(excluded.items()))
    return (
        f" Teacher prompts with a gold answer that does not parse as written left out of accuracy "
        f"(grade status gold_unparseable), per source: {counts}."
    )
