"""Rules tables, budget_tables, effort_tables, kernel_tables and teacher_tables: per benchmark,
paired bootstrap tables (Markdown, CSV, LaTeX) and the accuracy-against-length plot; accuracy
against thinking budget; each trained effort against the reference effort; for the kernel track,
compile / correct / launch / rule / reward rates (kernels/tables.py); and, when efforts go to
different teachers, the teachers' trace lengths on the prompts they share.

Every model is compared with the base and with the fine-tuned model on the same problems and
sample indices; a difference whose confidence interval contains 0 is reported as a tie.
"""

from __future__ import annotations

import csv
import dataclasses
import io
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import Field

from ..analysis.grids import score_matrix
from ..analysis.stats import VERDICT, Comparison, holm_comparisons, mcnemar_exact, paired_bootstrap
from ..config import Effort, PairedTables, Section, Tables
from ..io import DataError, atomic_path, iter_jsonl, read_json, write_text

Params = PairedTables


def _fmt(c: Comparison | None) -> tuple[str, str]:
    if c is None:
        return "—", "—"
    return f"{c.delta:+.3f} [{c.low:+.3f}, {c.high:+.3f}]", VERDICT[c.verdict]


def _fmt_tokens(c: Comparison | None) -> tuple[str, str]:
    """Δ mean tokens with its interval, and the token ratio (model / reference)."""
    if c is None:
        return "—", "—"
    ratio = f"{c.mean_a / c.mean_b:.2f}×" if c.mean_b else "—"
    return f"{c.delta:+.1f} [{c.low:+.1f}, {c.high:+.1f}]", ratio


def _token_cells(c: Comparison | None) -> tuple[str, ...]:
    if c is None:
        return ("",) * 4
    ratio = f"{c.mean_a / c.mean_b:.6f}" if c.mean_b else ""
    return f"{c.delta:.3f}", f"{c.low:.3f}", f"{c.high:.3f}", ratio


def _mirrored(c: Comparison) -> Comparison:
    """The same comparison seen from the other side."""
    return dataclasses.replace(
        c,
        mean_a=c.mean_b,
        mean_b=c.mean_a,
        delta=-c.delta,
        low=-c.high,
        high=-c.low,
        verdict={"a": "b", "b": "a", "tie": "tie"}[c.verdict],
    )


def _latex(rows: list[dict[str, Any]], refs: tuple[str, str], caption: str, label: str) -> str:
    """A booktabs table of the same rows."""
    special = {
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
    }

    def esc(text: str) -> str:
        """pdflatex-safe: specials escaped, the caption's Unicode as math."""
        return "".join(special.get(ch, ch) for ch in text)

    def cell(c: Comparison | None) -> str:
        if c is None:
            return "---"
        bold = "\\textbf{%s}" if c.verdict != "tie" else "%s"
        return bold % f"${c.delta:+.3f}$ [${c.low:+.3f}$, ${c.high:+.3f}$]"

    def ratio(c: Comparison | None) -> str:
        return f"{c.mean_a / c.mean_b:.2f}" if c is not None and c.mean_b else "---"

    out = [
        "\\begin{table}[t]",
        "\\centering",
        "\\small",
        "\\begin{tabular}{lrrrrll}",
        "\\toprule",
        f"Model & Acc. & Tokens & Tok. $\\times$ {esc(refs[0])} & Cap hit & "
        f"$\\Delta$ vs {esc(refs[0])} & $\\Delta$ vs {esc(refs[1])} \\\\",
        "\\midrule",
    ]
    for r in rows:
        out.append(
            f"{esc(r['label'])} & {r['accuracy']:.3f} & {r['mean_tokens']:.0f} & "
            f"{ratio(r['tokens_vs'][refs[0]])} & {r['cap_hit']:.3f} & "
            f"{cell(r['vs'][refs[0]])} & {cell(r['vs'][refs[1]])} \\\\"
        )
    out += [
        "\\bottomrule",
        "\\end{tabular}",
        f"\\caption{{{esc(caption)}}}",
        f"\\label{{{label}}}",
        "\\end{table}",
    ]
    return "\n".join(out) + "\n"


def run(
    *,
    graded: Mapping[str, str],
    out_markdown: str,
    out_csv: str,
    out_latex: str,
    out_plot: str,
    params: Mapping[str, Any] | Params,
    selection: str | None = None,
    log: Callable[[str], None] = print,
    **_: Any,
) -> dict[str, Any]:
    """The tables of one benchmark; ``selection`` (the select stage's JSON) marks the merge chosen
    on dev.

    Every model is compared with the base and with the fine-tune. Holm's correction runs across all
    those comparisons (they are one sweep): a difference is called only if its CI excludes 0 and its
    corrected p-value is below 1 - confidence. With one sample per problem McNemar's exact test is
    reported too.
    """
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
    boot = {
        "n_resamples": params.n_resamples,
        "confidence": params.confidence,
        "seed": params.seed,
        "two_level": two_level,
    }
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
    single = ref_shape[1] == 1
    rows = []
    for name, (_, score, tokens, capped, _) in mats.items():
        mark = (
            f" (chosen on {chosen['benchmark']})" if chosen and chosen["selected"] == name else ""
        )
        rows.append(
            {
                "model": name,
                "label": name + mark,
                "accuracy": float(score.mean()),
                "mean_tokens": float(tokens.mean()),
                "cap_hit": float(capped.mean()),
                "problems": score.shape[0],
                "samples": score.shape[1],
                "vs": {ref: corrected.get((name, ref)) for ref in refs},
                "tokens_vs": {ref: tokens_vs.get((name, ref)) for ref in refs},
                "mcnemar": {ref: mcnemar_exact(score, mats[ref][1]) for ref in refs if ref != name}
                if single
                else {},
            }
        )
    pct = round(100 * params.confidence)
    caption = (
        f"{params.benchmark}: {rows[0]['problems']} problems × {rows[0]['samples']} samples. "
        f"Δ: paired bootstrap over problems{' then samples' if two_level else ''} "
        f"({params.n_resamples} resamples), {pct}% CI; Holm's correction across the {len(pairs)} "
        "comparisons of this table; a difference is a tie unless its CI excludes 0 and it "
        "survives Holm."
        + (" McNemar's exact p in the CSV." if single else "")
        + (
            f" {mats[base][4]} problems with an unparseable gold answer excluded."
            if mats[base][4]
            else ""
        )
    )
    header = (
        f"| model | accuracy | mean tokens | cap hit | Δ vs {base} [{pct}% CI] | vs {base} | "
        f"Δ vs {tuned} [{pct}% CI] | vs {tuned} |"
    )
    lines = [f"### {caption}", "", header, "|" + "---|" * 8]
    buf = io.StringIO()
    writer = csv.writer(buf)
    writer.writerow(
        [
            "benchmark",
            "model",
            "problems",
            "samples",
            "accuracy",
            "mean_tokens",
            "cap_hit_rate",
            "reference",
            "delta",
            "ci_low",
            "ci_high",
            "p_value",
            "p_holm",
            "verdict",
            "mcnemar_p",
            "delta_tokens",
            "tokens_ci_low",
            "tokens_ci_high",
            "token_ratio",
        ]
    )
    for r in rows:
        (db, vb), (dt, vt) = _fmt(r["vs"][base]), _fmt(r["vs"][tuned])
        lines.append(
            f"| {r['label']} | {r['accuracy']:.3f} | {r['mean_tokens']:.1f} | {r['cap_hit']:.3f} | "
            f"{db} | {vb} | {dt} | {vt} |"
        )
        for ref, c in r["vs"].items():
            mc = r["mcnemar"].get(ref)
            writer.writerow(
                [
                    params.benchmark,
                    r["model"],
                    r["problems"],
                    r["samples"],
                    f"{r['accuracy']:.6f}",
                    f"{r['mean_tokens']:.3f}",
                    f"{r['cap_hit']:.6f}",
                    ref,
                    *(
                        ("",) * 6
                        if c is None
                        else (
                            f"{c.delta:.6f}",
                            f"{c.low:.6f}",
                            f"{c.high:.6f}",
                            f"{c.p_value:.6g}",
                            f"{c.p_holm:.6g}",
                            VERDICT[c.verdict],
                        )
                    ),
                    "" if mc is None else f"{mc.p_value:.6g}",
                    *_token_cells(r["tokens_vs"][ref]),
                ]
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
    for r in rows:
        (db, xb), (dt, xt) = (_fmt_tokens(r["tokens_vs"][ref]) for ref in refs)
        lines.append(f"| {r['label']} | {r['mean_tokens']:.1f} | {db} | {xb} | {dt} | {xt} |")
    if chosen:
        lines += [
            "",
            f"Merge ratio chosen on `{chosen['benchmark']}` (never reported here): "
            f"{chosen['selected']}, dev accuracy "
            + ", ".join(f"{m} {a:.3f}" for m, a in sorted(chosen["accuracy"].items())),
        ]
    write_text(out_markdown, "\n".join(lines) + "\n")
    write_text(out_csv, buf.getvalue())
    write_text(out_latex, _latex(rows, refs, caption, f"tab:{params.benchmark}"))
    _plot(rows, out_plot, params.benchmark, base, tuned)
    log("\n" + "\n".join(lines))
    return {
        "models": len(rows),
        "accuracy": {r["model"]: round(r["accuracy"], 4) for r in rows},
        "cap_hit_rate": {r["model"]: round(r["cap_hit"], 4) for r in rows},
        "mean_tokens": {r["model"]: round(r["mean_tokens"], 3) for r in rows},
    }


def _plot(rows: list[dict[str, Any]], path: str, title: str, base: str, tuned: str) -> None:
    """Accuracy against mean tokens, and the merge-ratio sweep (base at 0, the fine-tune at 1)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, sweep) = plt.subplots(1, 2, figsize=(9, 3.6), dpi=120)
    for r in rows:
        ax.scatter(r["mean_tokens"], r["accuracy"], s=36)
        ax.annotate(
            r["model"],
            (r["mean_tokens"], r["accuracy"]),
            textcoords="offset points",
            xytext=(4, 4),
            fontsize=8,
        )
    ax.set(xlabel="mean response tokens", ylabel="accuracy", title=title, ylim=(-0.03, 1.03))
    ratio = {base: 0.0, tuned: 1.0} | {
        r["model"]: float(r["model"].split("-", 1)[1])
        for r in rows
        if r["model"].startswith("merge-")
    }
    points = sorted(
        (ratio[r["model"]], r["accuracy"], r["vs"][base]) for r in rows if r["model"] in ratio
    )
    sweep.plot([p[0] for p in points], [p[1] for p in points], marker="o")
    # the CI of the difference from base, drawn around the point
    for x, y, c in points:
        if c is not None:
            sweep.errorbar(
                x,
                y,
                yerr=[[c.delta - c.low], [c.high - c.delta]],
                fmt="none",
                capsize=3,
                color="grey",
            )
    sweep.set(
        xlabel="fine-tuned weight in the merge",
        ylabel="accuracy",
        title="merge-ratio sweep",
        ylim=(-0.03, 1.03),
    )
    for a in (ax, sweep):
        a.grid(alpha=0.3)
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png")
    plt.close(fig)


class BudgetParams(Section):
    seed: int = 0
    benchmark: str


def budget_run(
    *,
    graded: Mapping[str, str],
    out_markdown: str,
    out_csv: str,
    out_plot: str,
    params: Mapping[str, Any] | BudgetParams,
    log: Callable[[str], None] = print,
    **_: Any,
) -> dict[str, Any]:
    """Accuracy against thinking budget: ``graded`` names are ``<model>@<budget>``. Every answer had
    its chance to answer (forced ones after the end-of-thinking cue), so no cut-off counts as a
    wrong answer."""
    params = BudgetParams.parse(params, where="tables")
    rows = []
    for name, path in graded.items():
        model, _, budget = name.rpartition("@")
        required = ("grade", "completion_tokens", "forced", "thinking_tokens")
        # an unparseable gold is a benchmark bug, not a wrong answer
        recs = [
            r
            for r in iter_jsonl(path, required=required)
            if r["grade"].get("status") != "gold_unparseable"
        ]
        if not recs:
            raise DataError(f"{path}: no graded samples")
        thought = [r["thinking_tokens"] for r in recs if r["thinking_tokens"] is not None]
        rows.append(
            {
                "model": model,
                "budget": int(budget),
                "samples": len(recs),
                "accuracy": float(np.mean([bool(r["grade"]["correct"]) for r in recs])),
                "forced": float(np.mean([bool(r["forced"]) for r in recs])),
                "thinking": float(np.mean(thought)) if thought else float("nan"),
                "tokens": float(np.mean([r["completion_tokens"] for r in recs])),
            }
        )
    rows.sort(key=lambda r: (r["model"], r["budget"]))
    lines = [
        f"### {params.benchmark}: accuracy against thinking budget "
        "(budget forcing: thinking closed at the budget, then a short answer)",
        "",
        "| model | budget | samples | accuracy | forced | mean thinking tokens | mean tokens |",
        "|" + "---|" * 7,
    ]
    lines += [
        f"| {r['model']} | {r['budget']} | {r['samples']} | {r['accuracy']:.3f} | "
        f"{r['forced']:.3f} | {r['thinking']:.1f} | {r['tokens']:.1f} |"
        for r in rows
    ]
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=["benchmark", *rows[0]])
    writer.writeheader()
    writer.writerows({"benchmark": params.benchmark, **r} for r in rows)
    write_text(out_markdown, "\n".join(lines) + "\n")
    write_text(out_csv, buf.getvalue())

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.6), dpi=120)
    for model in sorted({r["model"] for r in rows}):
        mine = [r for r in rows if r["model"] == model]
        ax.plot([r["budget"] for r in mine], [r["accuracy"] for r in mine], marker="o", label=model)
    ax.set(
        xscale="log",
        xlabel="thinking budget (tokens)",
        ylabel="accuracy",
        title=params.benchmark,
        ylim=(-0.03, 1.03),
    )
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    with atomic_path(out_plot) as tmp:
        fig.savefig(tmp, format="png")
    plt.close(fig)
    log("\n" + "\n".join(lines))
    return {"rows": len(rows)}


class EffortParams(Tables):
    seed: int = 0
    benchmark: str
    efforts: list[Effort] = Field(min_length=2)
    reference: Effort


def _teacher_rows(teacher: Mapping[str, str], p: EffortParams) -> list[dict[str, Any]]:
    """The teacher's own accuracy and length per effort, from its graded generation shards, on the
    training prompts each effort shares with the reference effort."""
    by_effort: dict[str, dict[str, list[tuple[float, float]]]] = {e: {} for e in p.efforts}
    teachers: dict[str, str] = {}
    required = ("prompt_id", "effort", "grade", "completion_tokens")
    for path in teacher.values():
        for r in iter_jsonl(path, required=required):
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
        rows.append(
            {
                "model": f"teacher ({teachers[effort]})" if mixed else "teacher",
                "effort": effort,
                "problems": len(shared),
                "samples": len(mine),
                "accuracy": float(np.mean([a for a, _ in mine])),
                "mean_tokens": tokens,
                "token_ratio": tokens / float(np.mean([t for _, t in theirs])),
                "cap_hit": None,
                "vs": None,
                "tokens_vs": None,
            }
        )
    return rows


def effort_run(
    *,
    graded: Mapping[str, str],
    teacher: Mapping[str, str],
    out_markdown: str,
    out_csv: str,
    params: Mapping[str, Any] | EffortParams,
    log: Callable[[str], None] = print,
    **_: Any,
) -> dict[str, Any]:
    """The student at each effort it was trained with: ``graded`` names are ``<model>@<effort>``.
    Per effort: accuracy with its paired bootstrap CI against the reference effort (same problems
    and sample indices; the CI alone decides, no Holm), mean tokens and the token ratio against the
    reference; the teacher's own rows (``teacher``: graded generation shards) for reference, each
    naming its teacher when efforts have different ones."""
    p = EffortParams.parse(params, where="eval.per_effort")
    boot = {
        "n_resamples": p.n_resamples,
        "confidence": p.confidence,
        "seed": p.seed,
        "two_level": p.two_level,
    }
    mats = {name: score_matrix(path) for name, path in graded.items()}
    models = list(dict.fromkeys(name.rpartition("@")[0] for name in graded))
    rows = []
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
            rows.append(
                {
                    "model": model,
                    "effort": effort,
                    "problems": score.shape[0],
                    "samples": score.size,
                    "accuracy": float(score.mean()),
                    "mean_tokens": float(tokens.mean()),
                    "token_ratio": float(tokens.mean() / ref[2].mean()) if ref[2].mean() else None,
                    "cap_hit": float(capped.mean()),
                    "vs": paired_bootstrap(score, ref[1], **boot) if other else None,
                    "tokens_vs": paired_bootstrap(tokens, ref[2], **boot) if other else None,
                }
            )
    rows += _teacher_rows(teacher, p)
    pct = round(100 * p.confidence)
    ref_name = p.reference
    lines = [
        f"### {p.benchmark}: each model at each effort it was trained with (its effort tag). "
        f"Δ against {ref_name}: paired bootstrap over problems ({p.n_resamples} resamples), "
        f"{pct}% CI; × {ref_name}: mean tokens relative to {ref_name}. Teacher rows: its graded "
        f"generation shards, on the training prompts each effort shares with {ref_name}.",
        "",
        f"| model | effort | samples | accuracy | Δ vs {ref_name} [{pct}% CI] | vs {ref_name} | "
        f"mean tokens | Δ tokens [{pct}% CI] | × {ref_name} | cap hit |",
        "|" + "---|" * 10,
    ]
    buf = io.StringIO()
    writer = csv.writer(buf)
    writer.writerow(
        [
            "benchmark",
            "model",
            "effort",
            "problems",
            "samples",
            "accuracy",
            "reference",
            "delta",
            "ci_low",
            "ci_high",
            "verdict",
            "mean_tokens",
            "delta_tokens",
            "tokens_ci_low",
            "tokens_ci_high",
            "token_ratio",
            "cap_hit_rate",
        ]
    )
    for r in rows:
        delta, verdict = _fmt(r["vs"])
        tokens_delta, _ = _fmt_tokens(r["tokens_vs"])
        ratio = "—" if r["token_ratio"] is None else f"{r['token_ratio']:.2f}×"
        cap = "—" if r["cap_hit"] is None else f"{r['cap_hit']:.3f}"
        lines.append(
            f"| {r['model']} | {r['effort']} | {r['samples']} | {r['accuracy']:.3f} | {delta} | "
            f"{verdict} | {r['mean_tokens']:.1f} | {tokens_delta} | {ratio} | {cap} |"
        )
        c = r["vs"]
        writer.writerow(
            [
                p.benchmark,
                r["model"],
                r["effort"],
                r["problems"],
                r["samples"],
                f"{r['accuracy']:.6f}",
                ref_name,
                *(
                    ("",) * 4
                    if c is None
                    else (f"{c.delta:.6f}", f"{c.low:.6f}", f"{c.high:.6f}", VERDICT[c.verdict])
                ),
                f"{r['mean_tokens']:.3f}",
                *_token_cells(r["tokens_vs"])[:3],
                "" if r["token_ratio"] is None else f"{r['token_ratio']:.6f}",
                "" if r["cap_hit"] is None else f"{r['cap_hit']:.6f}",
            ]
        )
    write_text(out_markdown, "\n".join(lines) + "\n")
    write_text(out_csv, buf.getvalue())
    log("\n" + "\n".join(lines))
    return {
        "rows": len(rows),
        "token_ratio": {
            f"{r['model']}@{r['effort']}": round(r["token_ratio"], 4)
            for r in rows
            if r["token_ratio"] is not None
        },
    }


class TeacherParams(Section):
    """The teachers table: ``teachers`` is generation.efforts -> the teacher of each (in order),
    ``reference`` generation.teacher. One-level bootstrap over prompts (two_level does not apply:
    a prompt's failed samples leave it fewer, so samples per prompt may differ)."""

    seed: int = 0
    reference: str
    teachers: dict[Effort, str] = Field(min_length=1)
    # tables.n_resamples and tables.confidence, their bounds defined once (config.Tables)
    n_resamples: int = Tables.model_fields["n_resamples"]
    confidence: float = Tables.model_fields["confidence"]


def teacher_run(
    *,
    graded: Mapping[str, str],
    out_markdown: str,
    out_csv: str,
    params: Mapping[str, Any] | TeacherParams,
    log: Callable[[str], None] = print,
    **_: Any,
) -> dict[str, Any]:
    """Trace lengths per (teacher, effort) on the prompts every one of them answered, from the
    graded generation shards (``graded``): accuracy and mean completion tokens (per-prompt means,
    averaged), and for each other teacher's row against the reference teacher at each of its
    efforts, the paired mean-token difference with its bootstrap CI over the shared prompts and the
    token ratio. Samples that failed or were skipped wrote no trace and are left out."""
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
    for path in graded.values():
        for r in iter_jsonl(path, required=required):
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
    shared = sorted(set.intersection(*(set(c) for c in cells.values())))
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
            rows.append({"cell": cell, "vs": other, "tokens_vs": c, **mine})
    pct = round(100 * p.confidence)
    caption = (
        f"Teacher traces on the {len(shared)} prompts every (teacher, effort) below answered. "
        "Efforts limited to a subset of the shards (generation.effort_shards) share only that "
        "subset, so an effort run on every prompt is cut down to it here (its own prompt count is "
        "in the CSV). Accuracy and mean completion tokens: per-prompt means, averaged. Against "
        f"the reference teacher {ref} (generation.teacher) at each of its efforts: Δ mean tokens "
        f"with a paired bootstrap over the shared prompts ({p.n_resamples} resamples), {pct}% CI, "
        f"and × {ref}, the ratio of mean tokens. Each effort has one teacher, so a difference "
        "mixes the change of teacher with the change of effort: read × against the spacing one "
        "teacher gives those efforts. Failed and skipped samples wrote no trace and are left out."
    )
    lines = [
        f"### {caption}",
        "",
        f"| teacher | effort | samples | accuracy | mean tokens | vs {ref} at | "
        f"Δ tokens [{pct}% CI] | × {ref} |",
        "|" + "---|" * 8,
    ]
    buf = io.StringIO()
    writer = csv.writer(buf)
    writer.writerow(
        [
            "teacher",
            "effort",
            "prompts",
            "prompts_shared",
            "samples",
            "accuracy",
            "mean_tokens",
            "reference_teacher",
            "reference_effort",
            "delta_tokens",
            "tokens_ci_low",
            "tokens_ci_high",
            "token_ratio",
        ]
    )
    for r in rows:
        (teacher, effort), c = r["cell"], r["tokens_vs"]
        delta, ratio = _fmt_tokens(c)
        accuracy, tokens = float(r["accuracy"].mean()), float(r["tokens"].mean())
        lines.append(
            f"| {teacher} | {effort} | {r['samples']} | {accuracy:.3f} | {tokens:.1f} | "
            f"{'— (reference)' if r['vs'] is None else r['vs'][1]} | {delta} | {ratio} |"
        )
        writer.writerow(
            [
                teacher,
                effort,
                r["prompts"],
                len(shared),
                r["samples"],
                f"{accuracy:.6f}",
                f"{tokens:.3f}",
                *(("", "") if r["vs"] is None else r["vs"]),
                *_token_cells(c),
            ]
        )
    write_text(out_markdown, "\n".join(lines) + "\n")
    write_text(out_csv, buf.getvalue())
    log("\n" + "\n".join(lines))
    return {
        "prompts_shared": len(shared),
        "mean_tokens": {
            f"{t}@{e}": round(float(stats[(t, e)]["tokens"].mean()), 3) for t, e in order
        },
        "token_ratio": {
            "{}@{} vs {}@{}".format(*r["cell"], *r["vs"]): round(
                r["tokens_vs"].mean_a / r["tokens_vs"].mean_b, 4
            )
            for r in rows
            if r["vs"] is not None and r["tokens_vs"].mean_b
        },
    }


def kernel_tables(**kwargs: Any) -> dict[str, Any]:
    """The kernel track's tables (kernels/tables.py)."""
    from ..kernels.tables import run as kernel_run

    return kernel_run(**kwargs)


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
