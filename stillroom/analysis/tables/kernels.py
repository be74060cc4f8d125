"""The kernel track's table (rule kernel_tables): per model, how often a kernel answer compiles,
gives the right outputs, launches Triton, passes the rules and earns the reward (execution x
rules), each compared with the base and the fine-tune by a paired bootstrap over problems;
``fast_p`` where speedups were timed (GPU).

Every rate is over all samples: an answer without a complete code block ("answers" 0) fails every
metric. A problem on which the validator itself failed for any sample of any model (grade status
"harness": no score, not a wrong answer) is left out of every model's rates, so that the pairing
holds, and counted in the caption.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import pandas as pd

from ...config import PairedTables
from ...io import DataError
from ..grids import grade_grid, scores
from ..stats import VERDICT, holm_comparisons, paired_bootstrap
from . import render
from .render import Column, Grid
from .schema import frame, named_rows


def _details(grade: Mapping[str, Any]) -> Mapping[str, Any]:
    return grade.get("details") or {}


METRICS: dict[str, Callable[[Mapping[str, Any]], float]] = {
    "answers": lambda g: float(g.get("status") != "no_answer"),  # a complete ModelNew code block
    "compiles": lambda g: float(bool(_details(g).get("compiled"))),
    "correct": lambda g: float(bool(_details(g).get("correct"))),  # the execution reward
    "launches": lambda g: float(bool(_details(g).get("launched_triton"))),
    "rules": lambda g: float(_details(g).get("rule_reward", 0.0)),
    "reward": lambda g: float(_details(g).get("reward", 0.0)),
}


def fast_p(p: float) -> Callable[[Mapping[str, Any]], float]:
    """KernelBench's fast_p: the answer earns the reward and runs more than p times faster than the
    reference."""
    return lambda g: float(
        _details(g).get("reward") == 1.0 and (_details(g).get("speedup") or 0.0) > p
    )


class Pair(NamedTuple):
    """A model compared with a reference."""

    model: str
    reference: str


@dataclass
class KernelTable:
    df: pd.DataFrame
    models: list[str]
    metrics: list[str]
    caption: str
    pct: int
    timed: bool
    harness_left_out: int

    def markdown(self) -> str:
        names, pct = self.metrics, self.pct
        rows = named_rows(self.df)
        rate = {(r.model, r.metric): r.rate for r in rows}
        compared: dict[Pair, dict[str, Any]] = {}  # in the order of the table's rows
        for r in rows:
            if not pd.isna(r.reference):
                compared.setdefault(Pair(r.model, r.reference), {})[r.metric] = r
        rates = Grid(
            [Column("model", lambda m: m)]
            + [Column(k, lambda m, k=k: f"{rate[(m, k)]:.3f}") for k in names],
            self.models,
        )
        deltas = Grid(
            [Column("comparison", lambda pair: f"{pair.model} vs {pair.reference}")]
            + [
                Column(f"Δ {k} [{pct}% CI]", lambda pair, k=k: _delta(compared[pair][k]))
                for k in names
            ],
            list(compared),
        )
        return render.markdown(self.caption, rates, deltas)

    def summary(self) -> dict[str, Any]:
        rates = named_rows(self.df.drop_duplicates(["model", "metric"]))
        return {
            "models": len(self.models),
            "timed": self.timed,
            "harness_left_out": self.harness_left_out,
            "rates": {
                m: {r.metric: round(r.rate, 4) for r in rates if r.model == m} for m in self.models
            },
        }


def _delta(r: Any) -> str:
    """Δ [low, high], starred where the difference survives Holm."""
    star = "*" if r.verdict in ("better", "worse") else ""
    return f"{r.delta:+.3f} [{r.ci_low:+.3f}, {r.ci_high:+.3f}]{star}"


def table(
    graded: Mapping[str, str], settings: PairedTables, fast_ps: Sequence[float]
) -> KernelTable:
    """The kernel table of each model's graded kernel answers (``graded``: model -> path); fast_p
    for each p of ``fast_ps`` where speedups were timed."""
    base, tuned = settings.base, settings.tuned
    for ref in (base, tuned):
        if ref not in graded:
            raise DataError(
                f"kernel tables: reference model '{ref}' has no graded samples "
                f"(have {sorted(graded)})"
            )
    grids = {name: grade_grid(path) for name, path in graded.items()}  # each file read once
    index, shape = grids[base].index, grids[base].grades.shape
    for name, g in grids.items():
        if g.index != index or g.grades.shape != shape:
            raise DataError(
                f"kernel tables: model '{name}' was not evaluated on the same problems and sample "
                f"indices as '{base}' ({g.grades.shape} vs {shape}); pairing is impossible"
            )
    # the validator's own failures are no one's score: their problems leave every model's grid
    failed = np.zeros(shape[0], dtype=bool)
    for grid in grids.values():
        failed |= np.array(
            [[g.get("status") == "harness" for g in row] for row in grid.grades]
        ).any(1)
    if failed.all():
        raise DataError(
            f"kernel tables: the validator failed (grade status 'harness') on every one of the "
            f"{shape[0]} problems; nothing to compare"
        )
    grids = {name: g._replace(grades=g.grades[~failed]) for name, g in grids.items()}
    shape = grids[base].grades.shape
    metrics = dict(METRICS)
    timed = any(
        _details(g).get("speedup") is not None for grid in grids.values() for g in grid.grades.flat
    )
    if timed:
        metrics |= {f"fast_{p:g}": fast_p(p) for p in fast_ps}
    boot = {
        "n_resamples": settings.n_resamples,
        "confidence": settings.confidence,
        "seed": settings.seed,
    }
    refs = (base, tuned)
    pairs = [
        (name, ref)
        for name in graded
        for ref in refs
        if name != ref and (name, ref) != (base, tuned)
    ]
    rates: dict[str, dict[str, float]] = {name: {} for name in graded}
    deltas: dict[tuple[str, str], dict[str, Any]] = {pair: {} for pair in pairs}
    for metric, value in metrics.items():
        mats = {name: scores(grid.grades, value) for name, grid in grids.items()}
        for name, s in mats.items():
            rates[name][metric] = float(s.mean())
        # Holm across the comparisons of one metric, as the accuracy table does across its
        # comparisons.
        raw = [paired_bootstrap(mats[a], mats[b], **boot) for a, b in pairs]
        for pair, c in zip(pairs, holm_comparisons(raw), strict=True):
            deltas[pair][metric] = c
    pct = round(100 * settings.confidence)
    names = list(metrics)
    left_out = (
        f" ({int(failed.sum())} more left out: the validator failed on them, not the answers)"
        if failed.any()
        else ""
    )
    caption = (
        f"{settings.benchmark}: {shape[0]} kernel problems × {shape[1]} samples{left_out}. "
        "Rates over all samples; "
        f"Δ: paired bootstrap over problems ({settings.n_resamples} resamples), {pct}% CI, Holm's "
        "correction per metric; * marks a difference whose CI excludes 0 and survives Holm. "
        + (
            "fast_p: rewarded and more than p times faster than the reference."
            if timed
            else "fast_p needs timed speedups (kernels compiled on a GPU); "
            "these ran in the interpreter."
        )
    )
    rows = [
        {
            "benchmark": settings.benchmark,
            "model": a,
            "metric": k,
            "rate": rates[a][k],
            "reference": b,
            "delta": c.delta,
            "ci_low": c.low,
            "ci_high": c.high,
            "p_value": c.p_value,
            "p_holm": c.p_holm,
            "verdict": VERDICT[c.verdict],
        }
        for (a, b), cs in deltas.items()
        for k, c in cs.items()
    ]
    # the references' own rates, so that every model has its rows
    rows += [
        {"benchmark": settings.benchmark, "model": ref, "metric": k, "rate": rates[ref][k]}
        for ref in refs
        for k in names
    ]
    return KernelTable(
        frame("kernels", rows), list(graded), names, caption, pct, timed, int(failed.sum())
    )
