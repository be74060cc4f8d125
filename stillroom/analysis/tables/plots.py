"""The tables' plots: accuracy against mean tokens beside the merge-ratio sweep (the paired table),
and accuracy against thinking budget (the budget table)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

import pandas as pd

from ...io import atomic_path
from .paired import PairedTable


def paired_plot(table: PairedTable, weights: Mapping[str, float], path: str) -> None:
    """Accuracy against mean tokens, and the merge-ratio sweep: each model of ``weights`` at its
    fine-tuned weight (base at 0, the fine-tune at 1, a merge at its ratio)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    base = table.base
    # each model's row against the base: its own numbers and its difference from base
    vs_base = table.df[table.df["reference"] == base].set_index("model")
    fig, (ax, sweep) = plt.subplots(1, 2, figsize=(9, 3.6), dpi=120)
    for _, r in vs_base.iterrows():
        ax.scatter(r["mean_tokens"], r["accuracy"], s=36, clip_on=False)
    ax.set(
        xlabel="mean response tokens",
        ylabel="accuracy",
        title=str(table.df["benchmark"].iloc[0]),
        ylim=fitted(vs_base["accuracy"]),
    )
    ax.margins(x=0.15)
    points = sorted(
        ((weights[m], r) for m, r in vs_base.iterrows() if m in weights), key=lambda p: p[0]
    )
    # each point's paired difference from base with its CI (base itself at 0): an accuracy axis
    # with the difference's CI drawn around the point would run below 0
    delta = [0.0 if x == 0.0 else r["delta"] for x, r in points]
    sweep.plot([x for x, _ in points], delta, marker="o")
    sweep.axhline(0.0, color="grey", lw=0.8)
    for x, r in points:
        if x != 0.0 and not pd.isna(r["delta"]):
            sweep.errorbar(
                x,
                r["delta"],
                yerr=[[r["delta"] - r["ci_low"]], [r["ci_high"] - r["delta"]]],
                fmt="none",
                capsize=3,
                color="grey",
            )
    shown = [d for d in delta if not pd.isna(d)] + [
        v for x, r in points if x != 0.0 for v in (r["ci_low"], r["ci_high"]) if not pd.isna(v)
    ]
    sweep.set(
        xlabel="fine-tuned weight in the merge",
        ylabel=f"accuracy - base's ({table.pct}% CI)",
        title="merge-ratio sweep",
        ylim=fitted(shown, rates=False),
    )
    for a in (ax, sweep):
        a.grid(alpha=0.3)
    fig.tight_layout()
    place_labels(
        ax, [(r["mean_tokens"], r["accuracy"], table.labels[m]) for m, r in vs_base.iterrows()]
    )
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png")
    plt.close(fig)


def fitted(values: Any, rates: bool = True) -> tuple[float, float]:
    """An axis fitted to ``values`` with a margin (data under 0.25 is not drawn on 0–1), kept
    within [0, 1.02] for ``rates`` (not for differences): a rate axis never shows a negative
    accuracy, so its points are drawn unclipped (``clip_on=False``) to show whole at 0."""
    v = pd.Series(values, dtype=float).dropna()
    low, high = (float(v.min()), float(v.max())) if len(v) else (0.0, 1.0)
    pad = max(0.08 * (high - low), 0.02)
    if not rates:
        return low - pad, high + pad
    return max(low - pad, 0.0), min(high + pad, 1.02)


# where a label may sit around its point (offset points) and how it is aligned there
_LABEL_SPOTS = [
    ((5, 5), "left", "bottom"),
    ((5, -5), "left", "top"),
    ((-5, 5), "right", "bottom"),
    ((-5, -5), "right", "top"),
    ((0, 8), "center", "bottom"),
    ((0, -8), "center", "top"),
    ((8, 0), "left", "center"),
    ((-8, 0), "right", "center"),
]


class _Placed(NamedTuple):
    cost: float  # pixels of overlap, less the part inside the axes
    label: Any  # the annotation
    box: Any  # its extent in pixels


def place_labels(ax: Any, points: list[tuple[float, float, str]]) -> None:
    """Each point's label at the spot around it that overlaps least (in pixels) the labels already
    placed, the other points and the outside of the axes: the first free spot when there is one."""
    from matplotlib.transforms import Bbox

    def overlap(a: Any, b: Any) -> float:
        w = min(a.x1, b.x1) - max(a.x0, b.x0)
        h = min(a.y1, b.y1) - max(a.y0, b.y0)
        return max(w, 0) * max(h, 0)

    renderer = ax.figure.canvas.get_renderer()
    frame_box = ax.get_window_extent(renderer)
    marks = []
    for x, y, _ in points:
        px, py = ax.transData.transform((x, y))
        marks.append(Bbox.from_extents(px - 4, py - 4, px + 4, py + 4))
    placed: list[Any] = []
    for x, y, text in points:
        best: _Placed | None = None
        for offset, ha, va in _LABEL_SPOTS:
            label = ax.annotate(
                text, (x, y), textcoords="offset points", xytext=offset, fontsize=8, ha=ha, va=va
            )
            box = label.get_window_extent(renderer)
            cost = (
                sum(overlap(box, b) for b in placed + marks)
                + box.width * box.height
                - overlap(box, frame_box)
            )
            if best is None or cost < best.cost:
                if best is not None:
                    best.label.remove()
                best = _Placed(cost, label, box)
            else:
                label.remove()
            if cost == 0:
                break
        placed.append(best.box)


def budget_plot(df: pd.DataFrame, path: str, benchmark: str) -> None:
    """Accuracy against budget per model: forcing solid, the hard cutoff dashed, each with its CI;
    the budget axis in powers of two, ticked at the budgets in plain numbers."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FixedLocator, NullLocator, StrMethodFormatter

    fig, ax = plt.subplots(figsize=(5.5, 3.8), dpi=120)
    # the two methods side by side at each budget (a small shift on the log axis), so that their
    # intervals do not hide each other
    styles = {"forcing": ("o-", "C{}", 2**-0.04), "cutoff": ("s--", "white", 2**0.04)}
    for i, (model, mine) in enumerate(df.groupby("model", sort=True)):
        for method, (fmt_, face, shift) in styles.items():
            m = mine[mine["method"] == method]
            acc = m["accuracy"].to_numpy()
            ax.errorbar(
                m["budget"].to_numpy(float) * shift,
                acc,
                yerr=[acc - m["acc_ci_low"].to_numpy(), m["acc_ci_high"].to_numpy() - acc],
                fmt=fmt_,
                color=f"C{i}",
                markerfacecolor=face.format(i),
                capsize=3,
                label=f"{model} ({method})",
                clip_on=False,
            )
    budgets_ = sorted(set(df["budget"].astype(int)))
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_locator(FixedLocator(budgets_))
    ax.xaxis.set_major_formatter(StrMethodFormatter("{x:.0f}"))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set(
        xlabel="thinking budget (tokens)",
        ylabel="accuracy",
        title=benchmark,
        ylim=fitted(pd.concat([df["acc_ci_low"], df["acc_ci_high"]])),
    )
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png")
    plt.close(fig)
