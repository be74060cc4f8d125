"""The kernel track's tables (rule kernel_tables): per model, how often a kernel answer compiles,
gives the right outputs, launches Triton, passes the rules and earns the reward (execution x
rules), each compared with the base and the fine-tune by a paired bootstrap over problems;
``fast_p`` where speedups were timed (GPU).

Every rate is over all samples: an answer without a complete code block ("answers" 0) fails every
metric. A problem on which the validator itself failed for any sample of any model (grade status
"harness": no score, not a wrong answer) is left out of every model's rates, so that the pairing
holds, and counted in the caption.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import pandas as pd

from ..analysis.grids import grade_grid, scores
from ..analysis.stats import VERDICT, holm_comparisons, paired_bootstrap
from ..config import Kernels, PairedTables
from ..io import DataError, write_text
from ..tables import frame, write_csv


class Params(PairedTables):
    fast_p: list[float] = Kernels.model_fields["fast_p"]


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


@dataclasses.dataclass
class Table:
    df: pd.DataFrame
    models: list[str]
    metrics: list[str]
    caption: str
    pct: int
    timed: bool
    harness_left_out: int

    def markdown(self) -> str:
        names, pct = self.metrics, self.pct
        rates = self.df.drop_duplicates(["model", "metric"]).set_index(["model", "metric"])["rate"]
        lines = [
            f"### {self.caption}",
            "",
            "| model | " + " | ".join(names) + " |",
            "|---|" + "---|" * len(names),
        ]
        lines += [
            f"| {m} | " + " | ".join(f"{rates[(m, k)]:.3f}" for k in names) + " |"
            for m in self.models
        ]
        lines += [
            "",
            "| comparison | " + " | ".join(f"Δ {k} [{pct}% CI]" for k in names) + " |",
            "|---|" + "---|" * len(names),
        ]
        compared = self.df.dropna(subset=["reference"])
        for (a, b), mine in compared.groupby(["model", "reference"], sort=False):
            by_metric = mine.set_index("metric")
            cells = [
                f"{r['delta']:+.3f} [{r['ci_low']:+.3f}, {r['ci_high']:+.3f}]"
                f"{'*' if r['verdict'] in ('better', 'worse') else ''}"
                for r in (by_metric.loc[k] for k in names)
            ]
            lines.append(f"| {a} vs {b} | " + " | ".join(cells) + " |")
        return "\n".join(lines) + "\n"


def table(graded: Mapping[str, str], params: Mapping[str, Any] | Params) -> Table:
    """The kernel table in memory (``run`` writes it; ``audit --recompute`` compares it with the
    written one)."""
    params = Params.parse(params, where="tables")
    base, tuned = params.base, params.tuned
    for ref in (base, tuned):
        if ref not in graded:
            raise DataError(
                f"kernel tables: reference model '{ref}' has no graded samples "
                f"(have {sorted(graded)})"
            )
    grids = {name: grade_grid(path) for name, path in graded.items()}  # each file read once
    index, shape = grids[base][0], grids[base][1].shape
    for name, (idx, grades, *_) in grids.items():
        if idx != index or grades.shape != shape:
            raise DataError(
                f"kernel tables: model '{name}' was not evaluated on the same problems and sample "
                f"indices as '{base}' ({grades.shape} vs {shape}); pairing is impossible"
            )
    # the validator's own failures are no one's score: their problems leave every model's grid
    failed = np.zeros(shape[0], dtype=bool)
    for _, grades, *_ in grids.values():
        failed |= np.array([[g.get("status") == "harness" for g in row] for row in grades]).any(1)
    if failed.all():
        raise DataError(
            f"kernel tables: the validator failed (grade status 'harness') on every one of the "
            f"{shape[0]} problems; nothing to compare"
        )
    grids = {name: (idx, grades[~failed], *rest) for name, (idx, grades, *rest) in grids.items()}
    shape = grids[base][1].shape
    metrics = dict(METRICS)
    timed = any(
        _details(g).get("speedup") is not None
        for _, grades, *_ in grids.values()
        for g in grades.flat
    )
    if timed:
        metrics |= {f"fast_{p:g}": fast_p(p) for p in params.fast_p}
    boot = {
        "n_resamples": params.n_resamples,
        "confidence": params.confidence,
        "seed": params.seed,
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
        mats = {name: scores(grid[1], value) for name, grid in grids.items()}
        for name, s in mats.items():
            rates[name][metric] = float(s.mean())
        # Holm across the comparisons of one metric, as the accuracy table does across its
        # comparisons.
        raw = [paired_bootstrap(mats[a], mats[b], **boot) for a, b in pairs]
        for pair, c in zip(pairs, holm_comparisons(raw), strict=True):
            deltas[pair][metric] = c
    pct = round(100 * params.confidence)
    names = list(metrics)
    left_out = (
        f" ({int(failed.sum())} more left out: the validator failed on them, not the answers)"
        if failed.any()
        else ""
    )
    caption = (
        f"{params.benchmark}: {shape[0]} kernel problems × {shape[1]} samples{left_out}. "
        "Rates over all samples; "
        f"Δ: paired bootstrap over problems ({params.n_resamples} resamples), {pct}% CI, Holm's "
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
            "benchmark": params.benchmark,
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
        {"benchmark": params.benchmark, "model": ref, "metric": k, "rate": rates[ref][k]}
        for ref in refs
        for k in names
    ]
    return Table(
        frame("kernels", rows), list(graded), names, caption, pct, timed, int(failed.sum())
    )


def run(
    *,
    graded: Mapping[str, str],
    out_markdown: str,
    out_csv: str,
    params: Mapping[str, Any] | Params,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    t = table(graded, params)
    markdown = t.markdown()
    write_text(out_markdown, markdown)
    write_csv(t.df, out_csv)
    log("\n" + markdown.rstrip("\n"))
    rates = t.df.drop_duplicates(["model", "metric"])
    return {
        "models": len(t.models),
        "timed": t.timed,
        "harness_left_out": t.harness_left_out,
        "rates": {
            m: {r["metric"]: round(r["rate"], 4) for _, r in rates[rates["model"] == m].iterrows()}
            for m in t.models
        },
    }
