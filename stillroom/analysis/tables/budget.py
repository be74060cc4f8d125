"""The budget table: accuracy against thinking budget, budget forcing beside the hard cutoff of the
same samples (their ``cutoff_grade``, stages/grade.py), so that the forcing row's Δ is what forcing
adds."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from ...config import SeededTables
from ...io import DataError, iter_jsonl
from ..grids import score_matrix
from ..stats import holm_comparisons, paired_bootstrap
from . import render
from .cells import BASE_RANDOM, comparison_cells, gold_note
from .render import Column, Grid, fmt, interval
from .schema import frame, named_rows


@dataclass
class BudgetTable:
    df: pd.DataFrame
    caption: str
    pct: int
    excluded: int  # problems whose gold does not parse

    def markdown(self) -> str:
        pct = self.pct
        grid = Grid(
            [
                Column("model", lambda r: r.model),
                Column("budget", lambda r: f"{r.budget}"),
                Column("method", lambda r: r.method),
                Column("samples", lambda r: f"{r.samples}"),
                Column(
                    f"accuracy [{pct}% CI]",
                    lambda r: f"{r.accuracy:.3f} [{r.acc_ci_low:.3f}, {r.acc_ci_high:.3f}]",
                ),
                Column("forced", lambda r: f"{r.forced:.3f}"),
                Column("mean thinking tokens", lambda r: fmt(r.thinking, ".1f")),
                Column("mean tokens", lambda r: f"{r.tokens:.1f}"),
                Column(
                    f"Δ vs cutoff [{pct}% CI]", lambda r: interval(r.delta, r.ci_low, r.ci_high)
                ),
                Column("vs cutoff", lambda r: fmt(r.verdict, "")),
            ],
            named_rows(self.df),
        )
        return render.markdown(self.caption, grid)

    def summary(self) -> dict[str, Any]:
        return {"rows": len(self.df)}


def budgets(
    graded: Mapping[str, str], settings: SeededTables, benchmark: str, base_random: bool = False
) -> BudgetTable:
    """The budget table: ``graded`` names are ``<model>@<budget>``. Per (model, budget) two rows
    from the same samples: budget forcing (thinking closed at the budget, then an answer) and the
    hard cutoff (the answer cut at the budget and graded as is, ``cutoff_grade``), each accuracy
    with its bootstrap CI over problems; the forcing row carries its paired difference from the
    cutoff, Holm-corrected across the table's budgets."""
    boot = settings.boot
    rows, pairs, excluded = [], [], 0
    for name, path in graded.items():
        model, _, budget = name.rpartition("@")
        required = ("grade", "cutoff_grade", "completion_tokens", "forced", "thinking_tokens")
        # an unparseable gold is a benchmark bug, not a wrong answer
        recs = [
            r
            for r in iter_jsonl(path, required=required)
            if r["grade"].get("status") != "gold_unparseable"
        ]
        if not recs:
            raise DataError(f"{path}: no graded samples")
        forcing, cutoff = score_matrix(path), score_matrix(path, "cutoff_grade")
        thought = [r["thinking_tokens"] for r in recs if r["thinking_tokens"] is not None]
        thinking = float(np.mean(thought)) if thought else None
        common = {
            "benchmark": benchmark,
            "model": model,
            "budget": int(budget),
            "samples": len(recs),
            "forced": float(np.mean([bool(r["forced"]) for r in recs])),
        }
        by_method = {}
        for method, score, tokens in (
            ("forcing", forcing.score, [r["completion_tokens"] for r in recs]),
            ("cutoff", cutoff.score, [min(r["completion_tokens"], int(budget)) for r in recs]),
        ):
            # the accuracy's own interval: the bootstrap of its difference from 0
            alone = paired_bootstrap(score, np.zeros_like(score), **boot)
            by_method[method] = common | {
                "method": method,
                "accuracy": float(score.mean()),
                "acc_ci_low": alone.low + 0.0,
                "acc_ci_high": alone.high + 0.0,
                # the cutoff stops thinking wherever the budget falls: no count of its own
                "thinking": thinking if method == "forcing" else None,
                "tokens": float(np.mean(tokens)),
            }
        rows += by_method.values()
        pairs.append((by_method["forcing"], paired_bootstrap(forcing.score, cutoff.score, **boot)))
        excluded = max(excluded, forcing.excluded)
    for row, c in zip((r for r, _ in pairs), holm_comparisons([c for _, c in pairs]), strict=True):
        row.update(comparison_cells(c), reference="cutoff")
    rows.sort(key=lambda r: (r["model"], r["budget"], r["method"] != "forcing"))
    df = frame("budgets", rows)
    pct = round(100 * settings.confidence)
    caption = (
        f"{benchmark}: accuracy against thinking budget. Forcing: thinking closed at the "
        "budget, then a short answer; cutoff: the same answers cut at the budget tokens and "
        f"graded as is. Accuracy with its bootstrap {pct}% CI over problems "
        f"({settings.n_resamples} resamples); Δ forcing − cutoff: paired bootstrap on the same "
        f"samples, {pct}% CI, Holm's correction across the table's budgets."
        + gold_note(excluded, benchmark)
        + (BASE_RANDOM if base_random and "base" in set(df["model"]) else "")
    )
    return BudgetTable(df, caption, pct, excluded)
