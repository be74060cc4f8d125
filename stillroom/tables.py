"""Stage 11: paired bootstrap tables (Markdown, CSV) and the accuracy-against-length plot.

Every model is compared with the base and with the fine-tuned model on the same problems and
sample indices; a difference whose confidence interval contains 0 is reported as a tie.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from .io import DataError, atomic_path, iter_jsonl, read_json, write_text
from .stats import Comparison, paired_bootstrap

VERDICT = {"a": "better", "b": "worse", "tie": "tie"}


def score_matrix(path: str) -> tuple[dict[str, int], np.ndarray, np.ndarray]:
    """(problem index, correct[problems, samples], completion tokens[problems, samples]) of one model."""
    cells: dict[tuple[str, int], tuple[float, int]] = {}
    for rec in iter_jsonl(path, required=("prompt_id", "sample_index", "grade", "completion_tokens")):
        cells[(rec["prompt_id"], rec["sample_index"])] = (float(bool(rec["grade"]["correct"])), rec["completion_tokens"])
    problems = sorted({p for p, _ in cells})
    samples = sorted({s for _, s in cells})
    if len(cells) != len(problems) * len(samples):
        raise DataError(f"{path}: not every problem has samples {samples}; paired tables need a full grid")
    index = {p: i for i, p in enumerate(problems)}
    score = np.zeros((len(problems), len(samples)))
    tokens = np.zeros_like(score)
    for (p, s), (c, t) in cells.items():
        score[index[p], samples.index(s)], tokens[index[p], samples.index(s)] = c, t
    return index, score, tokens


def _fmt(c: Comparison | None) -> tuple[str, str]:
    if c is None:
        return "—", "—"
    return f"{c.delta:+.3f} [{c.low:+.3f}, {c.high:+.3f}]", VERDICT[c.verdict]


def run(*, graded: Mapping[str, str], out_markdown: str, out_csv: str, out_plot: str, params: Mapping[str, Any],
        selection: str | None = None, log: Callable[[str], None] = print, **_: Any) -> dict[str, Any]:
    """The tables of one benchmark; ``selection`` (the select stage's JSON) marks the merge chosen on dev."""
    base, tuned = params["base"], params["tuned"]
    chosen = read_json(selection) if selection else None
    for ref in (base, tuned):
        if ref not in graded:
            raise DataError(f"tables: reference model '{ref}' has no graded samples (have {sorted(graded)})")
    mats = {name: score_matrix(path) for name, path in graded.items()}
    ref_index = mats[base][0]
    for name, (index, score, _) in mats.items():
        if index != ref_index or score.shape != mats[base][1].shape:
            raise DataError(f"tables: model '{name}' was not evaluated on the same problems and sample indices "
                            f"as '{base}' ({score.shape} vs {mats[base][1].shape}); pairing is impossible")
    boot = {"n_resamples": params["n_resamples"], "confidence": params["confidence"], "seed": params["seed"]}
    rows = []
    for name, (_, score, tokens) in mats.items():
        vs = {ref: (paired_bootstrap(score, mats[ref][1], **boot) if name != ref else None) for ref in (base, tuned)}
        rows.append({"model": name, "accuracy": float(score.mean()), "mean_tokens": float(tokens.mean()),
                     "problems": score.shape[0], "samples": score.shape[1], "vs": vs})
    pct = round(100 * params["confidence"])
    header = (f"| model | accuracy | mean tokens | Δ vs {base} [{pct}% CI] | vs {base} | "
              f"Δ vs {tuned} [{pct}% CI] | vs {tuned} |")
    lines = [f"### {params['benchmark']}: {rows[0]['problems']} problems × {rows[0]['samples']} samples, "
             f"paired bootstrap over problems ({params['n_resamples']} resamples); a CI containing 0 is a tie",
             "", header, "|" + "---|" * 7]
    buf = io.StringIO()
    writer = csv.writer(buf)
    writer.writerow(["benchmark", "model", "problems", "samples", "accuracy", "mean_tokens", "reference",
                     "delta", "ci_low", "ci_high", "verdict"])
    for r in rows:
        (db, vb), (dt, vt) = _fmt(r["vs"][base]), _fmt(r["vs"][tuned])
        mark = f" (chosen on {chosen['benchmark']})" if chosen and chosen["selected"] == r["model"] else ""
        lines.append(f"| {r['model']}{mark} | {r['accuracy']:.3f} | {r['mean_tokens']:.1f} | {db} | {vb} | {dt} | {vt} |")
        for ref, c in r["vs"].items():
            writer.writerow([params["benchmark"], r["model"], r["problems"], r["samples"], f"{r['accuracy']:.6f}",
                             f"{r['mean_tokens']:.3f}", ref, *(("", "", "", "") if c is None else
                             (f"{c.delta:.6f}", f"{c.low:.6f}", f"{c.high:.6f}", VERDICT[c.verdict]))])
    if chosen:
        lines += ["", f"Merge ratio chosen on `{chosen['benchmark']}` (never reported here): {chosen['selected']}, "
                  "dev accuracy " + ", ".join(f"{m} {a:.3f}" for m, a in sorted(chosen["accuracy"].items()))]
    write_text(out_markdown, "\n".join(lines) + "\n")
    write_text(out_csv, buf.getvalue())
    _plot(rows, out_plot, params["benchmark"])
    log("\n" + "\n".join(lines))
    return {"models": len(rows), "accuracy": {r["model"]: round(r["accuracy"], 4) for r in rows}}


def _plot(rows: list[dict[str, Any]], path: str, title: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.6), dpi=120)
    for r in rows:
        ax.scatter(r["mean_tokens"], r["accuracy"], s=36)
        ax.annotate(r["model"], (r["mean_tokens"], r["accuracy"]), textcoords="offset points", xytext=(4, 4), fontsize=8)
    ax.set(xlabel="mean response tokens", ylabel="accuracy", title=title, ylim=(-0.03, 1.03))
    ax.grid(alpha=0.3)
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png")
    plt.close(fig)


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
    print(f"Tables: {', '.join(str(t) for t in tables)} (+ .csv, .png); provenance: <artifact>.prov.json")
