"""The per-effort table: the student at each effort it was trained with against the reference
effort, with the teacher's own rows on the training prompts for reference."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from ...config import SeededTables
from ...io import DataError, iter_jsonl
from ..grids import score_matrix
from ..stats import paired_bootstrap
from . import render
from .cells import cap_note, comparison_cells, gold_note, gold_sources, token_cells
from .render import Column, Grid, cap_cell, fmt, interval, ratio
from .schema import frame, named_rows


@dataclass
class EffortTable:
    df: pd.DataFrame
    caption: str
    pct: int
    reference: str
    cap_hit_flag: float

    def markdown(self) -> str:
        pct, ref = self.pct, self.reference
        grid = Grid(
            [
                Column("model", lambda r: r.model),
                Column("effort", lambda r: r.effort),
                Column("samples", lambda r: f"{r.samples}"),
                Column("accuracy", lambda r: f"{r.accuracy:.3f}"),
                Column(f"Δ vs {ref} [{pct}% CI]", lambda r: interval(r.delta, r.ci_low, r.ci_high)),
                Column(f"vs {ref}", lambda r: fmt(r.verdict, "")),
                Column("mean tokens", lambda r: f"{r.mean_tokens:.1f}"),
                Column(
                    f"Δ tokens [{pct}% CI]",
                    lambda r: interval(r.delta_tokens, r.tokens_ci_low, r.tokens_ci_high, "+.1f"),
                ),
                Column(f"× {ref}", lambda r: ratio(r.token_ratio)),
                Column("cap hit", lambda r: cap_cell(r.cap_hit_rate, self.cap_hit_flag)),
            ],
            named_rows(self.df),
        )
        return render.markdown(self.caption, grid)

    def summary(self) -> dict[str, Any]:
        return {
            "rows": len(self.df),
            "token_ratio": {
                f"{r.model}@{r.effort}": round(r.token_ratio, 4)
                for r in named_rows(self.df)
                if not pd.isna(r.token_ratio)
            },
        }


def _teacher_rows(
    teacher: Mapping[str, str],
    benchmark: str,
    efforts: Sequence[str],
    reference: str,
    excluded: dict[str, set[str]],
) -> list[dict[str, Any]]:
    """The teacher's own accuracy and length per effort, from its graded generation shards, on the
    training prompts each effort shares with the reference effort; prompts whose gold does not
    parse are left out and collected per source in ``excluded``."""
    by_effort: dict[str, dict[str, list[tuple[float, float]]]] = {e: {} for e in efforts}
    teachers: dict[str, str] = {}
    required = ("prompt_id", "effort", "grade", "completion_tokens")
    for path in teacher.values():
        for r in iter_jsonl(path, required=required):
            if r["grade"].get("status") == "gold_unparseable":
                excluded.setdefault(r.get("source", "unknown"), set()).add(r["prompt_id"])
                continue
            if r["effort"] in by_effort and not r.get("error"):
                cell = (float(bool(r["grade"].get("correct"))), float(r["completion_tokens"]))
                by_effort[r["effort"]].setdefault(r["prompt_id"], []).append(cell)
                teachers[r["effort"]] = r.get("teacher", "")
    # efforts of different teachers (generation.effort_teachers): each row names its teacher
    mixed = len(set(teachers.values())) > 1
    ref = by_effort[reference]
    rows = []
    for effort in efforts:
        shared = sorted(set(by_effort[effort]) & set(ref))
        if not shared:
            continue
        mine = [c for pid in shared for c in by_effort[effort][pid]]
        theirs = [c for pid in shared for c in ref[pid]]
        tokens = float(np.mean([t for _, t in mine]))
        solved = any(a for a, _ in mine) and any(a for a, _ in theirs)
        rows.append(
            {
                "benchmark": benchmark,
                "model": f"teacher ({teachers[effort]})" if mixed else "teacher",
                "effort": effort,
                "problems": len(shared),
                "samples": len(mine),
                "accuracy": float(np.mean([a for a, _ in mine])),
                "reference": reference,
                "mean_tokens": tokens,
                "token_ratio": tokens / float(np.mean([t for _, t in theirs])) if solved else None,
            }
        )
    return rows


def efforts(
    graded: Mapping[str, str],
    teacher: Mapping[str, str],
    settings: SeededTables,
    benchmark: str,
    efforts: Sequence[str],
    reference: str,
) -> EffortTable:
    """The student at each effort it was trained with: ``graded`` names are ``<model>@<effort>``.
    Per effort: accuracy with its paired bootstrap CI against the reference effort (same problems
    and sample indices; the CI alone decides, no Holm), mean tokens and the token ratio against the
    reference; the teacher's own rows (``teacher``: graded generation shards) for reference, each
    naming its teacher when efforts have different ones."""
    boot = settings.boot
    grids = {name: score_matrix(path) for name, path in graded.items()}
    models = list(dict.fromkeys(name.rpartition("@")[0] for name in graded))
    rows: list[dict[str, Any]] = []
    for model in models:
        ref_key = f"{model}@{reference}"
        if ref_key not in grids:
            raise DataError(f"tables: no graded samples of {model} at the reference effort")
        ref = grids[ref_key]
        for effort in efforts:
            g = grids[f"{model}@{effort}"]
            if g.index != ref.index or g.score.shape != ref.score.shape:
                raise DataError(
                    f"tables: {model} at {effort} was not evaluated on the same problems and "
                    f"sample indices as at {reference}; pairing is impossible"
                )
            other = effort != reference
            vs = paired_bootstrap(g.score, ref.score, **boot) if other else None
            tokens_vs = paired_bootstrap(g.tokens, ref.tokens, **boot) if other else None
            rows.append(
                {
                    "benchmark": benchmark,
                    "model": model,
                    "effort": effort,
                    "problems": g.score.shape[0],
                    "samples": g.score.size,
                    "accuracy": float(g.score.mean()),
                    "reference": reference,
                    **comparison_cells(vs, holm=False),
                    "mean_tokens": float(g.tokens.mean()),
                    **token_cells(tokens_vs),
                    # no ratio where either side has no correct answer (see token_cells)
                    "token_ratio": float(g.tokens.mean() / ref.tokens.mean())
                    if ref.tokens.mean() and g.score.any() and ref.score.any()
                    else None,
                    "cap_hit_rate": float(g.capped.mean()),
                }
            )
    # teacher prompts left out per source, for the caption
    excluded_sources: dict[str, set[str]] = {}
    df = frame(
        "efforts", rows + _teacher_rows(teacher, benchmark, efforts, reference, excluded_sources)
    )
    pct = round(100 * settings.confidence)
    flagged = [
        f"{r.model} at {r.effort}"
        for r in named_rows(df)
        if not pd.isna(r.cap_hit_rate) and r.cap_hit_rate > settings.cap_hit_flag
    ]
    caption = (
        f"{benchmark}: each model at each effort it was trained with (its effort tag). "
        f"Δ against {reference}: paired bootstrap over problems ({settings.n_resamples} "
        f"resamples), {pct}% CI; × {reference}: mean tokens relative to {reference} (none where "
        f"either has no correct answer). Teacher rows: its graded generation shards, on the "
        f"training prompts each effort shares with {reference}. Each model row is an "
        f"evaluation of its own, the prompts tagged with that effort (eval.per_effort): the paired "
        f"table of {benchmark} evaluates its prompts as eval.effort says (untagged by default), "
        "other prompts and so other samples, so its accuracy of the same model can differ from "
        "these rows."
        + gold_note(max((g.excluded for g in grids.values()), default=0), benchmark)
        + gold_sources(excluded_sources)
        + cap_note(flagged, settings.cap_hit_flag)
    )
    return EffortTable(df, caption, pct, reference, settings.cap_hit_flag)
