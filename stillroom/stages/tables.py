"""Rules tables, budget_tables, effort_tables, kernel_tables and teacher_tables: per benchmark,
paired bootstrap tables (Markdown, CSV, LaTeX) and the accuracy-against-length plot; accuracy
against thinking budget; each trained effort against the reference effort; for the kernel track,
compile / correct / launch / rule / reward rates (kernels/tables.py); and, when efforts go to
different teachers, the teachers' trace lengths on the prompts they share.

Every model is compared with the base and with the fine-tuned model on the same problems and
sample indices; a difference whose confidence interval contains 0 is reported as a tie, and two
models that both score 0 everywhere as "both 0". The budget table sets budget forcing beside the
hard cutoff of the same samples (their ``cutoff_grade``, stages/grade.py).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from pydantic import Field

from ..analysis.grids import INSTRUCTION_METRICS, instruction_metrics, score_matrix
from ..analysis.stats import VERDICT, Comparison, holm_comparisons, mcnemar_exact, paired_bootstrap
from ..config import Effort, PairedTables, SeededTables, StageParams, Tables
from ..io import DataError, atomic_path, iter_jsonl, read_json, write_text
from ..kernels.tables import Params as KernelParams
from ..tables import fmt, frame, write_csv
from .contract import stage

Params = PairedTables


def _interval(delta: Any, low: Any, high: Any, spec: str = "+.3f") -> str:
    """Δ [low, high], or — where the table has no comparison."""
    if pd.isna(delta):
        return "—"
    # + 0.0: a mirrored zero prints as +0.000, not -0.000
    return f"{delta + 0.0:{spec}} [{low + 0.0:{spec}}, {high + 0.0:{spec}}]"


def _cap_cell(rate: Any, flag: float, spec: str = ".3f") -> str:
    """The cap-hit rate, marked † above ``flag`` (its accuracy counts cut-off answers as wrong)."""
    return fmt(rate, spec) + (" †" if not pd.isna(rate) and rate > flag else "")


def _cap_note(flagged: list[str], flag: float) -> str:
    """The caption's word on the rows ``_cap_cell`` marks."""
    if not flagged:
        return ""
    return (
        f" † more than {flag:.0%} of answers hit the token cap ({', '.join(flagged)}): their "
        "accuracy counts those cut-off answers as wrong, so a difference there may be truncation, "
        "not ability."
    )


def _gold_note(excluded: int, where: str) -> str:
    """The caption's count of problems left out for a gold answer that does not parse."""
    if not excluded:
        return ""
    return (
        f" {excluded} problem{'s' if excluded != 1 else ''} of {where} with a gold answer that "
        "does not parse as written left out of accuracy (grade status gold_unparseable)."
    )


BASE_RANDOM = (
    " The base is a random-weight initialisation, not a pretrained model: its rows are a floor, "
    "not a baseline."
)


def _mirrored(c: Comparison) -> Comparison:
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


def _comparison_cells(c: Comparison | None, holm: bool = True) -> dict[str, Any]:
    if c is None:
        return {}
    return {
        "delta": c.delta,
        "ci_low": c.low,
        "ci_high": c.high,
        "verdict": VERDICT[c.verdict],
        **({"p_value": c.p_value, "p_holm": c.p_holm} if holm else {}),
    }


def _token_cells(c: Comparison | None, solved: bool = True) -> dict[str, Any]:
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


_LATEX_SPECIAL = {
    "\\": "\\textbackslash{}",
    "&": "\\&",
    "%": "\\%",
    "$": "\\$",
    "#": "\\#",
    "_": "\\_",
    "{": "\\{",
    "}": "\\}",
    "~": "\\textasciitilde{}",
    "^": "\\textasciicircum{}",
    "Δ": "$\\Delta$",
    "×": "$\\times$",
    "†": "$^\\dagger$",
}


def _esc(text: str) -> str:
    """pdflatex-safe: specials escaped, the caption's Unicode as math."""
    return "".join(_LATEX_SPECIAL.get(ch, ch) for ch in text)


@dataclasses.dataclass
class Paired:
    """The paired table of one benchmark: its data and what its rendering says around it."""

    df: pd.DataFrame
    base: str
    tuned: str
    caption: str
    pct: int
    labels: dict[str, str]  # model -> its row label (the merge chosen on dev is marked)
    chosen: dict[str, Any] | None
    cap_hit_flag: float = 1.0  # cap-hit rates above it are marked †
    # IFEval's accuracies per model (stillroom.analysis.grids.instruction_metrics), for a
    # benchmark of instructions; accuracy above is prompt-level strict
    instructions: dict[str, dict[str, float]] | None = None
    # each model's share of fine-tuned weights where known (PairedTables.weights): the sweep's x
    weights: dict[str, float] = dataclasses.field(default_factory=dict)

    def rows(self, model: str) -> tuple[pd.Series, pd.Series]:
        """The model's rows against the base and against the fine-tune."""
        mine = self.df[self.df["model"] == model]
        ref = mine.set_index("reference")
        return ref.loc[self.base], ref.loc[self.tuned]

    @property
    def models(self) -> list[str]:
        return list(dict.fromkeys(self.df["model"]))

    def markdown(self) -> str:
        base, tuned, pct = self.base, self.tuned, self.pct
        lines = [
            f"### {self.caption}",
            "",
            f"| model | accuracy | mean tokens | cap hit | Δ vs {base} [{pct}% CI] | vs {base} | "
            f"Δ vs {tuned} [{pct}% CI] | vs {tuned} |",
            "|" + "---|" * 8,
        ]
        for m in self.models:
            vb, vt = self.rows(m)
            lines.append(
                f"| {self.labels[m]} | {vb['accuracy']:.3f} | {vb['mean_tokens']:.1f} | "
                f"{_cap_cell(vb['cap_hit_rate'], self.cap_hit_flag)} | "
                + " | ".join(
                    f"{_interval(r['delta'], r['ci_low'], r['ci_high'])} | {fmt(r['verdict'], '')}"
                    for r in (vb, vt)
                )
                + " |"
            )
        lines += [
            "",
            f"Token economy: mean tokens per answer, Δ against each reference with its paired "
            f"bootstrap {pct}% CI, and × the reference's mean.",
            "",
            f"| model | mean tokens | Δ tokens vs {base} [{pct}% CI] | × {base} | "
            f"Δ tokens vs {tuned} [{pct}% CI] | × {tuned} |",
            "|" + "---|" * 6,
        ]
        for m in self.models:
            vb, vt = self.rows(m)
            cells = [
                f"{_interval(r['delta_tokens'], r['tokens_ci_low'], r['tokens_ci_high'], '+.1f')}"
                f" | {fmt(r['token_ratio'], '.2f')}{'' if pd.isna(r['token_ratio']) else '×'}"
                for r in (vb, vt)
            ]
            lines.append(
                f"| {self.labels[m]} | {vb['mean_tokens']:.1f} | " + " | ".join(cells) + " |"
            )
        if self.instructions:
            lines += [
                "",
                "IFEval: prompt level, the share of answers following all their instructions; "
                "instruction level, the share of all instructions followed; loose also accepts an "
                "instruction followed once the first or last line, or markdown `*`, is removed.",
                "",
                "| model | prompt strict | prompt loose | instruction strict | instruction loose |",
                "|" + "---|" * 5,
            ]
            lines += [
                f"| {self.labels[m]} | "
                + " | ".join(f"{self.instructions[m][k]:.3f}" for k in INSTRUCTION_METRICS)
                + " |"
                for m in self.models
            ]
        if self.chosen:
            lines += [
                "",
                f"Merge ratio chosen on `{self.chosen['benchmark']}` (never reported here): "
                f"{self.chosen['selected']}, dev accuracy "
                + ", ".join(f"{m} {a:.3f}" for m, a in sorted(self.chosen["accuracy"].items())),
            ]
        return "\n".join(lines) + "\n"

    def latex(self) -> str:
        """A booktabs table of the same rows."""
        base, tuned = self.base, self.tuned

        def cell(r: pd.Series) -> str:
            if pd.isna(r["delta"]):
                return "---"
            bold = "\\textbf{%s}" if r["verdict"] in ("better", "worse") else "%s"
            return bold % f"${r['delta']:+.3f}$ [${r['ci_low']:+.3f}$, ${r['ci_high']:+.3f}$]"

        out = [
            "\\begin{table}[t]",
            "\\centering",
            "\\small",
            "\\begin{tabular}{lrrrrll}",
            "\\toprule",
            f"Model & Acc. & Tokens & Tok. $\\times$ {_esc(base)} & Cap hit & "
            f"$\\Delta$ vs {_esc(base)} & $\\Delta$ vs {_esc(tuned)} \\\\",
            "\\midrule",
        ]
        for m in self.models:
            vb, vt = self.rows(m)
            out.append(
                f"{_esc(self.labels[m])} & {vb['accuracy']:.3f} & {vb['mean_tokens']:.0f} & "
                f"{fmt(vb['token_ratio'], '.2f', '---')} & "
                f"{_esc(_cap_cell(vb['cap_hit_rate'], self.cap_hit_flag))} & "
                f"{cell(vb)} & {cell(vt)} \\\\"
            )
        out += [
            "\\bottomrule",
            "\\end{tabular}",
            f"\\caption{{{_esc(self.caption)}}}",
            f"\\label{{tab:{self.df['benchmark'].iloc[0]}}}",
            "\\end{table}",
        ]
        return "\n".join(out) + "\n"


def paired(
    graded: Mapping[str, str],
    params: Mapping[str, Any] | Params,
    selection: str | None = None,
) -> Paired:
    """The paired table of one benchmark, in memory (``run`` writes it; ``audit --recompute``
    compares it with the written one)."""
    params = Params.parse(params, where="tables")
    base, tuned = params.base, params.tuned
    chosen = read_json(selection) if selection else None
    for ref in (base, tuned):
        if ref not in graded:
            raise DataError(
                f"tables: reference model '{ref}' has no graded samples (have {sorted(graded)})"
            )
    mats = {name: score_matrix(path) for name, path in graded.items()}
    ref_index, ref_shape = mats[base][0], mats[base][1].shape
    for name, (index, score, *_) in mats.items():
        if index != ref_index or score.shape != ref_shape:
            raise DataError(
                f"tables: model '{name}' was not evaluated on the same problems and sample indices "
                f"as '{base}' ({score.shape} vs {ref_shape}); pairing is impossible"
            )
    two_level = params.two_level
    boot = params.boot
    refs = (base, tuned)
    # One family for Holm: every distinct comparison once (base vs sft appears in both columns,
    # mirrored).
    pairs = [
        (name, ref) for name in mats for ref in refs if name != ref and (name, ref) != (base, tuned)
    ]
    raw = [paired_bootstrap(mats[name][1], mats[ref][1], **boot) for name, ref in pairs]
    corrected = dict(zip(pairs, holm_comparisons(raw), strict=True))
    corrected[(base, tuned)] = _mirrored(corrected[(tuned, base)])
    # Token economy: the paired difference in mean tokens per answer (not part of Holm's family: it
    # describes cost, it does not call a winner).
    tokens_vs = {
        (name, ref): paired_bootstrap(mats[name][2], mats[ref][2], **boot)
        for name in mats
        for ref in refs
        if name != ref
    }
    solved = {name: bool(m[1].any()) for name, m in mats.items()}
    single = ref_shape[1] == 1
    rows, labels = [], {}
    for name, (_, score, tokens, capped, _) in mats.items():
        mark = (
            f" (chosen on {chosen['benchmark']})" if chosen and chosen["selected"] == name else ""
        )
        labels[name] = name + mark
        for ref in refs:
            mc = mcnemar_exact(score, mats[ref][1]) if single and ref != name else None
            rows.append(
                {
                    "benchmark": params.benchmark,
                    "model": name,
                    "problems": score.shape[0],
                    "samples": score.shape[1],
                    "accuracy": float(score.mean()),
                    "mean_tokens": float(tokens.mean()),
                    "cap_hit_rate": float(capped.mean()),
                    "reference": ref,
                    **_comparison_cells(corrected.get((name, ref))),
                    "mcnemar_p": None if mc is None else mc.p_value,
                    **_token_cells(tokens_vs.get((name, ref)), solved[name] and solved[ref]),
                }
            )
    pct = round(100 * params.confidence)
    flagged = [labels[m] for m, mat in mats.items() if mat[3].mean() > params.cap_hit_flag]
    caption = (
        f"{params.benchmark}: {ref_shape[0]} problems × {ref_shape[1]} samples. "
        f"Δ: paired bootstrap over problems{' then samples' if two_level else ''} "
        f"({params.n_resamples} resamples), {pct}% CI; Holm's correction across the {len(pairs)} "
        "comparisons of this table; a difference is a tie unless its CI excludes 0 and it "
        "survives Holm."
        + (" McNemar's exact p in the CSV." if single else "")
        + (
            ' A comparison where both score 0 on every problem reads "both 0"; no token ratio '
            "where either has no correct answer."
            if not all(solved.values())
            else ""
        )
        + _gold_note(mats[base][4], params.benchmark)
        + _cap_note(flagged, params.cap_hit_flag)
        + (BASE_RANDOM if params.base_random else "")
    )
    instructions = {name: instruction_metrics(path) for name, path in graded.items()}
    return Paired(
        frame("paired", rows),
        base,
        tuned,
        caption,
        pct,
        labels,
        chosen,
        params.cap_hit_flag,
        instructions if all(instructions.values()) else None,
        weights=params.weights,
    )


def run(
    *,
    graded: Mapping[str, str],
    out_markdown: str,
    out_csv: str,
    out_latex: str,
    out_plot: str | None,
    params: Mapping[str, Any] | Params,
    selection: str | None = None,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """The tables of one benchmark; ``selection`` (the select stage's JSON) marks the merge chosen
    on dev; no ``out_plot``, no plot (the audit's recompute compares the numbers only).

    Every model is compared with the base and with the fine-tune. Holm's correction runs across all
    those comparisons (they are one sweep): a difference is called only if its CI excludes 0 and its
    corrected p-value is below 1 - confidence. With one sample per problem McNemar's exact test is
    reported too.
    """
    table = paired(graded, params, selection)
    markdown = table.markdown()
    write_text(out_markdown, markdown)
    write_csv(table.df, out_csv)
    write_text(out_latex, table.latex())
    if out_plot:
        _plot(table, out_plot)
    log("\n" + markdown.rstrip("\n"))
    own = table.df.drop_duplicates("model").set_index("model")
    return {
        "models": len(own),
        "accuracy": {m: round(float(v), 4) for m, v in own["accuracy"].items()},
        "cap_hit_rate": {m: round(float(v), 4) for m, v in own["cap_hit_rate"].items()},
        "mean_tokens": {m: round(float(v), 3) for m, v in own["mean_tokens"].items()},
        **(
            {
                "ifeval": {
                    m: {k: round(v, 4) for k, v in d.items()} for m, d in table.instructions.items()
                }
            }
            if table.instructions
            else {}
        ),
    }


def _plot(table: Paired, path: str) -> None:
    """Accuracy against mean tokens, and the merge-ratio sweep (base at 0, the fine-tune at 1)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    base, tuned = table.base, table.tuned
    # each model's row against the base: its own numbers and its difference from base
    vs_base = table.df[table.df["reference"] == base].set_index("model")
    fig, (ax, sweep) = plt.subplots(1, 2, figsize=(9, 3.6), dpi=120)
    for _, r in vs_base.iterrows():
        ax.scatter(r["mean_tokens"], r["accuracy"], s=36)
    ax.set(
        xlabel="mean response tokens",
        ylabel="accuracy",
        title=str(table.df["benchmark"].iloc[0]),
        ylim=_fitted(vs_base["accuracy"]),
    )
    ax.margins(x=0.15)
    ratio = {base: 0.0, tuned: 1.0} | table.weights
    points = sorted(
        ((ratio[m], r) for m, r in vs_base.iterrows() if m in ratio), key=lambda p: p[0]
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
        ylim=_fitted(shown, rates=False),
    )
    for a in (ax, sweep):
        a.grid(alpha=0.3)
    fig.tight_layout()
    _place_labels(
        ax, [(r["mean_tokens"], r["accuracy"], table.labels[m]) for m, r in vs_base.iterrows()]
    )
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png")
    plt.close(fig)


def _fitted(values: Any, rates: bool = True) -> tuple[float, float]:
    """An axis fitted to ``values`` with a margin (data under 0.25 is not drawn on 0–1), kept
    within [0, 1] for ``rates`` (not for differences)."""
    v = pd.Series(values, dtype=float).dropna()
    low, high = (float(v.min()), float(v.max())) if len(v) else (0.0, 1.0)
    pad = max(0.08 * (high - low), 0.02)
    if not rates:
        return low - pad, high + pad
    return max(low - pad, -0.02), min(high + pad, 1.02)


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


def _place_labels(ax: Any, points: list[tuple[float, float, str]]) -> None:
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
        best = None
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
            if best is None or cost < best[0]:
                if best is not None:
                    best[1].remove()
                best = (cost, label, box)
            else:
                label.remove()
            if cost == 0:
                break
        placed.append(best[2])


class BudgetParams(SeededTables):
    benchmark: str
    base_random: bool = PairedTables.model_fields["base_random"]


def budgets(graded: Mapping[str, str], params: Mapping[str, Any] | BudgetParams) -> pd.DataFrame:
    """The budget table in memory: ``graded`` names are ``<model>@<budget>``. Per (model, budget)
    two rows from the same samples: budget forcing (thinking closed at the budget, then an answer)
    and the hard cutoff (the answer cut at the budget and graded as is, ``cutoff_grade``), each
    accuracy with its bootstrap CI over problems; the forcing row carries its paired difference
    from the cutoff, Holm-corrected across the table's budgets."""
    p = BudgetParams.parse(params, where="tables")
    boot = p.boot
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
            "benchmark": p.benchmark,
            "model": model,
            "budget": int(budget),
            "samples": len(recs),
            "forced": float(np.mean([bool(r["forced"]) for r in recs])),
        }
        for method, (_, score, *_), tokens in (
            ("forcing", forcing, [r["completion_tokens"] for r in recs]),
            ("cutoff", cutoff, [min(r["completion_tokens"], int(budget)) for r in recs]),
        ):
            # the accuracy's own interval: the bootstrap of its difference from 0
            alone = paired_bootstrap(score, np.zeros_like(score), **boot)
            rows.append(
                common
                | {
                    "method": method,
                    "accuracy": float(score.mean()),
                    "acc_ci_low": alone.low + 0.0,
                    "acc_ci_high": alone.high + 0.0,
                    # the cutoff stops thinking wherever the budget falls: no count of its own
                    "thinking": thinking if method == "forcing" else None,
                    "tokens": float(np.mean(tokens)),
                }
            )
        pairs.append((rows[-2], paired_bootstrap(forcing[1], cutoff[1], **boot)))
        excluded = max(excluded, forcing[4])
    for row, c in zip((r for r, _ in pairs), holm_comparisons([c for _, c in pairs]), strict=True):
        row.update(_comparison_cells(c), reference="cutoff")
    rows.sort(key=lambda r: (r["model"], r["budget"], r["method"] != "forcing"))
    df = frame("budgets", rows)
    df.attrs["excluded"] = excluded  # problems whose gold does not parse, for the caption
    return df


def budget_run(
    *,
    graded: Mapping[str, str],
    out_markdown: str,
    out_csv: str,
    out_plot: str | None,
    params: Mapping[str, Any] | BudgetParams,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Accuracy against thinking budget: ``graded`` names are ``<model>@<budget>``. Budget forcing
    gave every answer its chance to answer (forced ones after the end-of-thinking cue); the hard
    cutoff row grades the same answers cut at the budget, so the forcing row's Δ is what forcing
    adds. No ``out_plot``, no plot."""
    p = BudgetParams.parse(params, where="tables")
    df = budgets(graded, p)
    pct = round(100 * p.confidence)
    lines = [
        f"### {p.benchmark}: accuracy against thinking budget. Forcing: thinking closed at the "
        "budget, then a short answer; cutoff: the same answers cut at the budget tokens and "
        f"graded as is. Accuracy with its bootstrap {pct}% CI over problems ({p.n_resamples} "
        f"resamples); Δ forcing − cutoff: paired bootstrap on the same samples, {pct}% CI, Holm's "
        "correction across the table's budgets."
        + _gold_note(df.attrs["excluded"], p.benchmark)
        + (BASE_RANDOM if p.base_random and "base" in set(df["model"]) else ""),
        "",
        f"| model | budget | method | samples | accuracy [{pct}% CI] | forced | "
        f"mean thinking tokens | mean tokens | Δ vs cutoff [{pct}% CI] | vs cutoff |",
        "|" + "---|" * 10,
    ]
    lines += [
        f"| {r.model} | {r.budget} | {r.method} | {r.samples} | {r.accuracy:.3f} "
        f"[{r.acc_ci_low:.3f}, {r.acc_ci_high:.3f}] | {r.forced:.3f} | "
        f"{fmt(r.thinking, '.1f')} | {r.tokens:.1f} | {_interval(r.delta, r.ci_low, r.ci_high)} | "
        f"{fmt(r.verdict, '')} |"
        for r in df.itertuples()
    ]
    write_text(out_markdown, "\n".join(lines) + "\n")
    write_csv(df, out_csv)
    log("\n" + "\n".join(lines))
    if out_plot:
        _budget_plot(df, out_plot, p.benchmark)
    return {"rows": len(df)}


def _budget_plot(df: pd.DataFrame, path: str, benchmark: str) -> None:
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
        ylim=_fitted(pd.concat([df["acc_ci_low"], df["acc_ci_high"]])),
    )
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png")
    plt.close(fig)


class EffortParams(SeededTables):
    benchmark: str
    efforts: list[Effort] = Field(min_length=2)
    reference: Effort


def _gold_sources(excluded: Mapping[str, set[str]]) -> str:
    """Prompts left out for a gold answer that does not parse, per source, for a caption."""
    if not excluded:
        return ""
    counts = ", ".join(f"{src} {len(ids)}" for src, ids in sorted(excluded.items()))
    return (
        f" Teacher prompts with a gold answer that does not parse as written left out of accuracy "
        f"(grade status gold_unparseable), per source: {counts}."
    )


def _teacher_rows(
    teacher: Mapping[str, str], p: EffortParams, excluded: dict[str, set[str]]
) -> list[dict[str, Any]]:
    """The teacher's own accuracy and length per effort, from its graded generation shards, on the
    training prompts each effort shares with the reference effort; prompts whose gold does not
    parse are left out and collected per source in ``excluded``."""
    by_effort: dict[str, dict[str, list[tuple[float, float]]]] = {e: {} for e in p.efforts}
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
    ref = by_effort[p.reference]
    rows = []
    for effort in p.efforts:
        shared = sorted(set(by_effort[effort]) & set(ref))
        if not shared:
            continue
        mine = [c for pid in shared for c in by_effort[effort][pid]]
        theirs = [c for pid in shared for c in ref[pid]]
        tokens = float(np.mean([t for _, t in mine]))
        solved = any(a for a, _ in mine) and any(a for a, _ in theirs)
        rows.append(
            {
                "benchmark": p.benchmark,
                "model": f"teacher ({teachers[effort]})" if mixed else "teacher",
                "effort": effort,
                "problems": len(shared),
                "samples": len(mine),
                "accuracy": float(np.mean([a for a, _ in mine])),
                "reference": p.reference,
                "mean_tokens": tokens,
                "token_ratio": tokens / float(np.mean([t for _, t in theirs])) if solved else None,
            }
        )
    return rows


def efforts(
    graded: Mapping[str, str],
    teacher: Mapping[str, str],
    params: Mapping[str, Any] | EffortParams,
) -> pd.DataFrame:
    """The per-effort table in memory (see ``effort_run``)."""
    p = EffortParams.parse(params, where="eval.per_effort")
    boot = p.boot
    mats = {name: score_matrix(path) for name, path in graded.items()}
    models = list(dict.fromkeys(name.rpartition("@")[0] for name in graded))
    rows: list[dict[str, Any]] = []
    for model in models:
        ref_key = f"{model}@{p.reference}"
        if ref_key not in mats:
            raise DataError(f"tables: no graded samples of {model} at the reference effort")
        ref = mats[ref_key]
        for effort in p.efforts:
            index, score, tokens, capped, _ = mats[f"{model}@{effort}"]
            if index != ref[0] or score.shape != ref[1].shape:
                raise DataError(
                    f"tables: {model} at {effort} was not evaluated on the same problems and "
                    f"sample indices as at {p.reference}; pairing is impossible"
                )
            other = effort != p.reference
            vs = paired_bootstrap(score, ref[1], **boot) if other else None
            tokens_vs = paired_bootstrap(tokens, ref[2], **boot) if other else None
            rows.append(
                {
                    "benchmark": p.benchmark,
                    "model": model,
                    "effort": effort,
                    "problems": score.shape[0],
                    "samples": score.size,
                    "accuracy": float(score.mean()),
                    "reference": p.reference,
                    **_comparison_cells(vs, holm=False),
                    "mean_tokens": float(tokens.mean()),
                    **_token_cells(tokens_vs),
                    # no ratio where either side has no correct answer (see _token_cells)
                    "token_ratio": float(tokens.mean() / ref[2].mean())
                    if ref[2].mean() and score.any() and ref[1].any()
                    else None,
                    "cap_hit_rate": float(capped.mean()),
                }
            )
    excluded: dict[str, set[str]] = {}
    df = frame("efforts", rows + _teacher_rows(teacher, p, excluded))
    # for the caption: problems of the benchmark, and teacher prompts per source, left out
    df.attrs["excluded"] = max((m[4] for m in mats.values()), default=0)
    df.attrs["excluded_sources"] = excluded
    return df


def effort_run(
    *,
    graded: Mapping[str, str],
    teacher: Mapping[str, str],
    out_markdown: str,
    out_csv: str,
    params: Mapping[str, Any] | EffortParams,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """The student at each effort it was trained with: ``graded`` names are ``<model>@<effort>``.
    Per effort: accuracy with its paired bootstrap CI against the reference effort (same problems
    and sample indices; the CI alone decides, no Holm), mean tokens and the token ratio against the
    reference; the teacher's own rows (``teacher``: graded generation shards) for reference, each
    naming its teacher when efforts have different ones."""
    p = EffortParams.parse(params, where="eval.per_effort")
    df = efforts(graded, teacher, p)
    pct = round(100 * p.confidence)
    ref_name = p.reference
    flagged = [
        f"{r['model']} at {r['effort']}"
        for _, r in df.iterrows()
        if not pd.isna(r["cap_hit_rate"]) and r["cap_hit_rate"] > p.cap_hit_flag
    ]
    lines = [
        f"### {p.benchmark}: each model at each effort it was trained with (its effort tag). "
        f"Δ against {ref_name}: paired bootstrap over problems ({p.n_resamples} resamples), "
        f"{pct}% CI; × {ref_name}: mean tokens relative to {ref_name} (none where either has no "
        f"correct answer). Teacher rows: its graded generation shards, on the training prompts "
        f"each effort shares with {ref_name}."
        + _gold_note(df.attrs["excluded"], p.benchmark)
        + _gold_sources(df.attrs["excluded_sources"])
        + _cap_note(flagged, p.cap_hit_flag),
        "",
        f"| model | effort | samples | accuracy | Δ vs {ref_name} [{pct}% CI] | vs {ref_name} | "
        f"mean tokens | Δ tokens [{pct}% CI] | × {ref_name} | cap hit |",
        "|" + "---|" * 10,
    ]
    for _, r in df.iterrows():
        delta = _interval(r["delta"], r["ci_low"], r["ci_high"])
        tokens = _interval(r["delta_tokens"], r["tokens_ci_low"], r["tokens_ci_high"], "+.1f")
        ratio = fmt(r["token_ratio"], ".2f") + ("" if pd.isna(r["token_ratio"]) else "×")
        lines.append(
            f"| {r['model']} | {r['effort']} | {r['samples']} | {r['accuracy']:.3f} | {delta} | "
            f"{fmt(r['verdict'], '')} | {r['mean_tokens']:.1f} | {tokens} | {ratio} | "
            f"{_cap_cell(r['cap_hit_rate'], p.cap_hit_flag)} |"
        )
    write_text(out_markdown, "\n".join(lines) + "\n")
    write_csv(df, out_csv)
    log("\n" + "\n".join(lines))
    return {
        "rows": len(df),
        "token_ratio": {
            f"{r['model']}@{r['effort']}": round(r["token_ratio"], 4)
            for _, r in df.iterrows()
            if not pd.isna(r["token_ratio"])
        },
    }


class TeacherParams(StageParams):
    """The teachers table: ``teachers`` is generation.efforts -> the teacher of each (in order),
    ``reference`` generation.teacher. One-level bootstrap over prompts (two_level does not apply:
    a prompt's failed samples leave it fewer, so samples per prompt may differ)."""

    reference: str
    teachers: dict[Effort, str] = Field(min_length=1)
    # tables.n_resamples and tables.confidence, their bounds defined once (config.Tables)
    n_resamples: int = Tables.model_fields["n_resamples"]
    confidence: float = Tables.model_fields["confidence"]


def teachers(graded: Mapping[str, str], params: Mapping[str, Any] | TeacherParams) -> pd.DataFrame:
    """The teachers table in memory (see ``teacher_run``)."""
    p = TeacherParams.parse(params, where="tables")
    ref = p.reference
    if ref not in p.teachers.values():
        raise DataError(
            f"tables: the reference teacher '{ref}' generates none of {list(p.teachers)}"
        )
    cells: dict[tuple[str, str], dict[str, list[tuple[float, float]]]] = {
        (t, e): {} for e, t in p.teachers.items()
    }
    required = ("key", "prompt_id", "teacher", "effort", "grade", "completion_tokens")
    excluded: dict[str, set[str]] = {}
    for path in graded.values():
        for r in iter_jsonl(path, required=required):
            if r["grade"].get("status") == "gold_unparseable":
                # a benchmark bug, not a wrong trace: the prompt is left out of every cell
                excluded.setdefault(r.get("source", "unknown"), set()).add(r["prompt_id"])
                continue
            cell = (r["teacher"], r["effort"])
            if cell not in cells:
                owner = p.teachers.get(r["effort"])
                why = f"gives that effort to '{owner}'" if owner else "generates no such effort"
                raise DataError(
                    f"{path}: {r['key']} was written by '{r['teacher']}' at effort "
                    f"'{r['effort']}', but the config {why}"
                )
            if not (r.get("error") or r.get("skipped")):
                sample = (float(bool(r["grade"].get("correct"))), float(r["completion_tokens"]))
                cells[cell].setdefault(r["prompt_id"], []).append(sample)
    for (teacher, effort), prompts in cells.items():
        if not prompts:
            raise DataError(f"tables: no traces of teacher '{teacher}' at effort '{effort}'")
    dropped = set().union(*excluded.values())
    shared = sorted(set.intersection(*(set(c) for c in cells.values())) - dropped)
    if not shared:
        raise DataError(
            "tables: no prompt was answered by every (teacher, effort): "
            + ", ".join(f"{t}@{e} {len(c)}" for (t, e), c in cells.items())
        )
    # reference teacher first, then the others in the order they first generate
    order = sorted(cells, key=lambda c: (c[0] != ref, list(p.teachers.values()).index(c[0])))
    stats = {}
    for cell in order:
        per_prompt = np.array([np.mean(cells[cell][pid], axis=0) for pid in shared])
        stats[cell] = {
            "samples": sum(len(cells[cell][pid]) for pid in shared),
            "prompts": len(cells[cell]),
            "accuracy": per_prompt[:, 0],
            "tokens": per_prompt[:, 1],
        }
    boot = {"n_resamples": p.n_resamples, "confidence": p.confidence, "seed": p.seed}
    refs = [c for c in order if c[0] == ref]
    rows = []
    for cell in order:
        mine = stats[cell]
        for other in [None] if cell[0] == ref else refs:
            c = (
                None
                if other is None
                else paired_bootstrap(mine["tokens"], stats[other]["tokens"], **boot)
            )
            solved = other is not None and mine["accuracy"].any() and stats[other]["accuracy"].any()
            rows.append(
                {
                    "teacher": cell[0],
                    "effort": cell[1],
                    "prompts": mine["prompts"],
                    "prompts_shared": len(shared),
                    "samples": mine["samples"],
                    "accuracy": float(mine["accuracy"].mean()),
                    "mean_tokens": float(mine["tokens"].mean()),
                    "reference_teacher": None if other is None else other[0],
                    "reference_effort": None if other is None else other[1],
                    **_token_cells(c, solved),
                }
            )
    df = frame("teachers", rows)
    df.attrs["excluded_sources"] = excluded  # for the caption
    return df


def teacher_run(
    *,
    graded: Mapping[str, str],
    out_markdown: str,
    out_csv: str,
    params: Mapping[str, Any] | TeacherParams,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Trace lengths per (teacher, effort) on the prompts every one of them answered, from the
    graded generation shards (``graded``): accuracy and mean completion tokens (per-prompt means,
    averaged), and for each other teacher's row against the reference teacher at each of its
    efforts, the paired mean-token difference with its bootstrap CI over the shared prompts and the
    token ratio. Samples that failed or were skipped wrote no trace and are left out."""
    p = TeacherParams.parse(params, where="tables")
    ref = p.reference
    df = teachers(graded, p)
    pct = round(100 * p.confidence)
    caption = (
        f"Teacher traces on the {df['prompts_shared'].iloc[0]} prompts every (teacher, effort) "
        "below answered. "
        "Efforts limited to a subset of the shards (generation.effort_shards) share only that "
        "subset, so an effort run on every prompt is cut down to it here (its own prompt count is "
        "in the CSV). Accuracy and mean completion tokens: per-prompt means, averaged. Against "
        f"the reference teacher {ref} (generation.teacher) at each of its efforts: Δ mean tokens "
        f"with a paired bootstrap over the shared prompts ({p.n_resamples} resamples), {pct}% CI, "
        f"and × {ref}, the ratio of mean tokens. Each effort has one teacher, so a difference "
        "mixes the change of teacher with the change of effort: read × against the spacing one "
        "teacher gives those efforts. Failed and skipped samples wrote no trace and are left out; "
        "no ratio where either cell has no correct answer."
        + _gold_sources(df.attrs["excluded_sources"])
    )
    lines = [
        f"### {caption}",
        "",
        f"| teacher | effort | samples | accuracy | mean tokens | vs {ref} at | "
        f"Δ tokens [{pct}% CI] | × {ref} |",
        "|" + "---|" * 8,
    ]
    for _, r in df.iterrows():
        delta = _interval(r["delta_tokens"], r["tokens_ci_low"], r["tokens_ci_high"], "+.1f")
        ratio = fmt(r["token_ratio"], ".2f") + ("" if pd.isna(r["token_ratio"]) else "×")
        lines.append(
            f"| {r['teacher']} | {r['effort']} | {r['samples']} | {r['accuracy']:.3f} | "
            f"{r['mean_tokens']:.1f} | {fmt(r['reference_effort'], '', '— (reference)')} | "
            f"{delta} | {ratio} |"
        )
    write_text(out_markdown, "\n".join(lines) + "\n")
    write_csv(df, out_csv)
    log("\n" + "\n".join(lines))
    return {
        "prompts_shared": int(df["prompts_shared"].iloc[0]),
        "mean_tokens": {
            f"{r['teacher']}@{r['effort']}": round(r["mean_tokens"], 3)
            for _, r in df.drop_duplicates(["teacher", "effort"]).iterrows()
        },
        "token_ratio": {
            "{}@{} vs {}@{}".format(
                *r[["teacher", "effort", "reference_teacher", "reference_effort"]]
            ): round(r["token_ratio"], 4)
            for _, r in df.iterrows()
            if not pd.isna(r["reference_teacher"]) and not pd.isna(r["token_ratio"])
        },
    }


def kernel_tables(
    *,
    graded: Mapping[str, str],
    out_markdown: str,
    out_csv: str,
    params: Mapping[str, Any] | KernelParams,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """The kernel track's tables (kernels/tables.py)."""
    from ..kernels.tables import run as kernel_run

    return kernel_run(
        graded=graded, out_markdown=out_markdown, out_csv=out_csv, params=params, log=log
    )


def show(experiment_dir: str) -> None:
    """Print every result table of an experiment and where its artifacts are."""
    root = Path(experiment_dir)
    tables = sorted((root / "tables").glob("*.md"))
    if not tables:
        raise DataError(f"{root}/tables: no tables yet (run the pipeline first)")
    for t in tables:
        print(t.read_text())
    print("Artifacts:")
    for sub in sorted(p for p in root.iterdir() if p.is_dir()):
        print(f"  {sub}/")
    print(
        f"Tables: {', '.join(str(t) for t in tables)} (+ .csv, .tex, .png); "
        "provenance: <artifact>.prov.json"
    )


# The stages of this module, as the CLI and the rules call them (stages/contract.py).
stage(
    "tables",
    params=Params,
    inputs=("graded*", "selection?"),
    outputs=("markdown", "csv", "latex", "plot"),
    help="paired bootstrap tables and the accuracy/length plot",
)(run)
stage(
    "budget_tables",
    params=BudgetParams,
    inputs=("graded*",),
    outputs=("markdown", "csv", "plot"),
    help="accuracy against thinking budget (budget forcing), per model",
)(budget_run)
stage(
    "effort_tables",
    params=EffortParams,
    inputs=("graded*", "teacher*"),
    outputs=("markdown", "csv"),
    help="each model at each effort it was trained with, against the reference effort",
)(effort_run)
stage(
    "teacher_tables",
    params=TeacherParams,
    inputs=("graded*",),
    outputs=("markdown", "csv"),
    help="the teachers' trace lengths per effort on the prompts they share, against the reference "
    "teacher",
)(teacher_run)
stage(
    "kernel_tables",
    params=KernelParams,
    inputs=("graded*",),
    outputs=("markdown", "csv"),
    help="kernel track: compile, correct, launch, rule and reward rates with paired CIs; fast_p",
)(kernel_tables)
