"""The paired table of one benchmark: every model against the base and against the fine-tune on the
same problems and sample indices (paired bootstrap, Holm's correction across the table, McNemar's
exact test with one sample per problem), its token economy and, for a benchmark of instructions,
IFEval's four accuracies."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

import pandas as pd

from ...config import PairedTables
from ...io import DataError
from ..grids import INSTRUCTION_METRICS, instruction_metrics, score_matrix
from ..stats import holm_comparisons, mcnemar_exact, paired_bootstrap
from . import render
from .cells import BASE_RANDOM, cap_note, comparison_cells, gold_note, mirrored, token_cells
from .render import Column, Grid, cap_cell, esc, fmt, interval, ratio
from .schema import frame, named_rows


class Shown(NamedTuple):
    """A model's line in the rendered table: its label and its rows against each reference."""

    model: str
    label: str
    vs_base: Any  # schema.named_rows of "paired"
    vs_tuned: Any


@dataclass
class PairedTable:
    """The paired table of one benchmark: its data and what its rendering says around it."""

    df: pd.DataFrame
    base: str
    tuned: str
    caption: str
    pct: int
    labels: dict[str, str]  # model -> its row label (the merge chosen on dev is marked)
    chosen: Mapping[str, Any] | None  # the select stage's JSON
    cap_hit_flag: float = 1.0  # cap-hit rates above it are marked †
    # IFEval's accuracies per model (grids.instruction_metrics), for a benchmark of instructions;
    # accuracy above is prompt-level strict
    instructions: dict[str, dict[str, float]] | None = None

    @property
    def models(self) -> list[str]:
        return list(dict.fromkeys(self.df["model"]))

    @property
    def benchmark(self) -> str:
        return str(self.df["benchmark"].iloc[0])

    def shown(self) -> list[Shown]:
        """Each model's rows against the base and against the fine-tune, in the table's order."""
        by_key = {(r.model, r.reference): r for r in named_rows(self.df)}
        return [
            Shown(m, self.labels[m], by_key[(m, self.base)], by_key[(m, self.tuned)])
            for m in self.models
        ]

    def markdown(self) -> str:
        base, tuned, pct = self.base, self.tuned, self.pct

        def versus(ref: str, side: str) -> list[Column]:
            return [
                Column(
                    f"Δ vs {ref} [{pct}% CI]",
                    lambda s: interval(*_delta(getattr(s, side))),
                ),
                Column(f"vs {ref}", lambda s: fmt(getattr(s, side).verdict, "")),
            ]

        def tokens(ref: str, side: str) -> list[Column]:
            return [
                Column(
                    f"Δ tokens vs {ref} [{pct}% CI]",
                    lambda s: interval(*_delta_tokens(getattr(s, side)), "+.1f"),
                ),
                Column(f"× {ref}", lambda s: ratio(getattr(s, side).token_ratio)),
            ]

        shown = self.shown()
        accuracy = Grid(
            [
                Column("model", lambda s: s.label),
                Column("accuracy", lambda s: f"{s.vs_base.accuracy:.3f}"),
                Column("mean tokens", lambda s: f"{s.vs_base.mean_tokens:.1f}"),
                Column("cap hit", lambda s: cap_cell(s.vs_base.cap_hit_rate, self.cap_hit_flag)),
                *versus(base, "vs_base"),
                *versus(tuned, "vs_tuned"),
            ],
            shown,
        )
        economy = Grid(
            [
                Column("model", lambda s: s.label),
                Column("mean tokens", lambda s: f"{s.vs_base.mean_tokens:.1f}"),
                *tokens(base, "vs_base"),
                *tokens(tuned, "vs_tuned"),
            ],
            shown,
        )
        parts: list[str | Grid] = [
            accuracy,
            f"Token economy: mean tokens per answer, Δ against each reference with its paired "
            f"bootstrap {pct}% CI, and × the reference's mean.",
            economy,
        ]
        if self.instructions:
            ifeval = self.instructions
            parts += [
                "IFEval: prompt level, the share of answers following all their instructions; "
                "instruction level, the share of all instructions followed; loose also accepts an "
                "instruction followed once the first or last line, or markdown `*`, is removed.",
                Grid(
                    [Column("model", lambda s: s.label)]
                    + [
                        Column(k.replace("_", " "), lambda s, k=k: f"{ifeval[s.model][k]:.3f}")
                        for k in INSTRUCTION_METRICS
                    ],
                    shown,
                ),
            ]
        if self.chosen:
            parts.append(
                f"Merge ratio chosen on `{self.chosen['benchmark']}` (never reported here): "
                f"{self.chosen['selected']}, dev accuracy "
                + ", ".join(f"{m} {a:.3f}" for m, a in sorted(self.chosen["accuracy"].items()))
            )
        return render.markdown(self.caption, *parts)

    def latex(self) -> str:
        """A booktabs table of the same rows."""
        base, tuned = esc(self.base), esc(self.tuned)

        def cell(r: Any) -> str:
            if pd.isna(r.delta):
                return "---"
            bold = "\\textbf{%s}" if r.verdict in ("better", "worse") else "%s"
            return bold % f"${r.delta:+.3f}$ [${r.ci_low:+.3f}$, ${r.ci_high:+.3f}$]"

        grid = Grid(
            [
                Column("Model", lambda s: esc(s.label), "l"),
                Column("Acc.", lambda s: f"{s.vs_base.accuracy:.3f}"),
                Column("Tokens", lambda s: f"{s.vs_base.mean_tokens:.0f}"),
                Column(
                    f"Tok. $\\times$ {base}", lambda s: fmt(s.vs_base.token_ratio, ".2f", "---")
                ),
                Column(
                    "Cap hit", lambda s: esc(cap_cell(s.vs_base.cap_hit_rate, self.cap_hit_flag))
                ),
                Column(f"$\\Delta$ vs {base}", lambda s: cell(s.vs_base), "l"),
                Column(f"$\\Delta$ vs {tuned}", lambda s: cell(s.vs_tuned), "l"),
            ],
            self.shown(),
        )
        return render.latex(grid, self.caption, f"tab:{self.benchmark}")

    def summary(self) -> dict[str, Any]:
        """The stage's summary: each model's accuracy, cap-hit rate and mean tokens (and IFEval's
        accuracies)."""
        own = self.df.drop_duplicates("model").set_index("model")
        return {
            "models": len(own),
            "accuracy": {m: round(float(v), 4) for m, v in own["accuracy"].items()},
            "cap_hit_rate": {m: round(float(v), 4) for m, v in own["cap_hit_rate"].items()},
            "mean_tokens": {m: round(float(v), 3) for m, v in own["mean_tokens"].items()},
            **(
                {
                    "ifeval": {
                        m: {k: round(v, 4) for k, v in d.items()}
                        for m, d in self.instructions.items()
                    }
                }
                if self.instructions
                else {}
            ),
        }


def _delta(r: Any) -> tuple[Any, Any, Any]:
    return r.delta, r.ci_low, r.ci_high


def _delta_tokens(r: Any) -> tuple[Any, Any, Any]:
    return r.delta_tokens, r.tokens_ci_low, r.tokens_ci_high


def paired(
    graded: Mapping[str, str],
    settings: PairedTables,
    chosen: Mapping[str, Any] | None = None,
) -> PairedTable:
    """The paired table of one benchmark from each model's graded samples (``graded``: model ->
    path); ``chosen``, the select stage's JSON, marks the merge chosen on dev.

    Holm's correction runs across all the table's comparisons (they are one sweep): a difference
    is called only if its CI excludes 0 and its corrected p-value is below 1 - confidence."""
    base, tuned = settings.base, settings.tuned
    for ref in (base, tuned):
        if ref not in graded:
            raise DataError(
                f"tables: reference model '{ref}' has no graded samples (have {sorted(graded)})"
            )
    grids = {name: score_matrix(path) for name, path in graded.items()}
    ref_index, ref_shape = grids[base].index, grids[base].score.shape
    for name, g in grids.items():
        if g.index != ref_index or g.score.shape != ref_shape:
            raise DataError(
                f"tables: model '{name}' was not evaluated on the same problems and sample indices "
                f"as '{base}' ({g.score.shape} vs {ref_shape}); pairing is impossible"
            )
    boot = settings.boot
    refs = (base, tuned)
    # One family for Holm: every distinct comparison once (base vs sft appears in both columns,
    # mirrored).
    pairs = [
        (name, ref)
        for name in grids
        for ref in refs
        if name != ref and (name, ref) != (base, tuned)
    ]
    raw = [paired_bootstrap(grids[name].score, grids[ref].score, **boot) for name, ref in pairs]
    corrected = dict(zip(pairs, holm_comparisons(raw), strict=True))
    corrected[(base, tuned)] = mirrored(corrected[(tuned, base)])
    # Token economy: the paired difference in mean tokens per answer (not part of Holm's family: it
    # describes cost, it does not call a winner).
    tokens_vs = {
        (name, ref): paired_bootstrap(grids[name].tokens, grids[ref].tokens, **boot)
        for name in grids
        for ref in refs
        if name != ref
    }
    solved = {name: bool(g.score.any()) for name, g in grids.items()}
    single = ref_shape[1] == 1
    rows, labels = [], {}
    for name, g in grids.items():
        mark = (
            f" (chosen on {chosen['benchmark']})" if chosen and chosen["selected"] == name else ""
        )
        labels[name] = name + mark
        for ref in refs:
            mc = mcnemar_exact(g.score, grids[ref].score) if single and ref != name else None
            rows.append(
                {
                    "benchmark": settings.benchmark,
                    "model": name,
                    "problems": g.score.shape[0],
                    "samples": g.score.shape[1],
                    "accuracy": float(g.score.mean()),
                    "mean_tokens": float(g.tokens.mean()),
                    "cap_hit_rate": float(g.capped.mean()),
                    "reference": ref,
                    **comparison_cells(corrected.get((name, ref))),
                    "mcnemar_p": None if mc is None else mc.p_value,
                    **token_cells(tokens_vs.get((name, ref)), solved[name] and solved[ref]),
                }
            )
    pct = round(100 * settings.confidence)
    flagged = [labels[m] for m, g in grids.items() if g.capped.mean() > settings.cap_hit_flag]
    caption = (
        f"{settings.benchmark}: {ref_shape[0]} problems × {ref_shape[1]} samples. "
        f"Δ: paired bootstrap over problems{' then samples' if settings.two_level else ''} "
        f"({settings.n_resamples} resamples), {pct}% CI; Holm's correction across the "
        f"{len(pairs)} comparisons of this table; a difference is a tie unless its CI excludes 0 "
        "and it survives Holm."
        + (" McNemar's exact p in the CSV." if single else "")
        + (
            ' A comparison where both score 0 on every problem reads "both 0"; no token ratio '
            "where either has no correct answer."
            if not all(solved.values())
            else ""
        )
        + gold_note(grids[base].excluded, settings.benchmark)
        + cap_note(flagged, settings.cap_hit_flag)
        + (BASE_RANDOM if settings.base_random else "")
    )
    instructions = {name: instruction_metrics(path) for name, path in graded.items()}
    return PairedTable(
        df=frame("paired", rows),
        base=base,
        tuned=tuned,
        caption=caption,
        pct=pct,
        labels=labels,
        chosen=chosen,
        cap_hit_flag=settings.cap_hit_flag,
        instructions=instructions if all(instructions.values()) else None,
    )
