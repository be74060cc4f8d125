import json

import numpy as np
import pytest

from stillroom.io import DataError, write_jsonl
from stillroom.stages import tables

PARAMS = {
    "benchmark": "heldout",
    "base": "base",
    "tuned": "sft",
    "n_resamples": 2000,
    "confidence": 0.95,
    "seed": 0,
}


def _graded(path, p_correct, n=120, k=2, seed=0, tokens=20):
    rng = np.random.default_rng(seed)
    rows = [
        {
            "prompt_id": f"p{i:03d}",
            "sample_index": s,
            "completion_tokens": tokens,
            "grade": {"correct": bool(rng.random() < p_correct)},
        }
        for i in range(n)
        for s in range(k)
    ]
    write_jsonl(path, rows)
    return str(path)


def test_tables_report_deltas_cis_and_ties(tmp_path):
    graded = {
        "base": _graded(tmp_path / "b.jsonl", 0.05, seed=1),
        "sft": _graded(tmp_path / "s.jsonl", 0.6, seed=2),
        "merge-0.5": _graded(tmp_path / "m.jsonl", 0.6, seed=3, tokens=30),
    }
    out = {k: str(tmp_path / f"t.{k}") for k in ("md", "csv", "tex", "png")}
    tables.run(
        graded=graded,
        out_markdown=out["md"],
        out_csv=out["csv"],
        out_latex=out["tex"],
        out_plot=out["png"],
        params=PARAMS,
        log=lambda _: None,
    )
    md = open(out["md"]).read()
    assert "Holm's correction across the 3 comparisons" in md
    sft_row = next(line for line in md.splitlines() if line.startswith("| sft |"))
    cells = [c.strip() for c in sft_row.split("|")[1:-1]]
    assert cells[3] == "0.000" and cells[5] == "better" and cells[6:] == ["—", "—"]  # no cap hits
    merge_row = next(line for line in md.splitlines() if line.startswith("| merge-0.5 |"))
    assert merge_row.split("|")[8].strip() == "tie"  # same accuracy as sft: CI contains 0
    assert "30.0" in merge_row
    rows = open(out["csv"]).read().splitlines()
    assert len(rows) == 1 + 3 * 2
    header = rows[0].split(",")
    sft_vs_base = dict(
        zip(
            header,
            next(r for r in rows if r.startswith("heldout,sft,") and ",base," in r).split(","),
            strict=False,
        )
    )
    assert float(sft_vs_base["ci_low"]) > 0 and sft_vs_base["verdict"] == "better"
    assert (
        float(sft_vs_base["p_holm"]) >= float(sft_vs_base["p_value"])
        and sft_vs_base["mcnemar_p"] == ""
    )
    tex = open(out["tex"]).read()
    assert (
        "\\toprule" in tex and "\\bottomrule" in tex and "merge-0.5 &" in tex and "\\textbf{" in tex
    )
    assert open(out["png"], "rb").read(4) == b"\x89PNG"


def test_cap_hits_holm_and_mcnemar_with_one_sample(tmp_path):
    graded = {
        "base": _graded(tmp_path / "b.jsonl", 0.3, k=1, seed=1),
        "sft": _graded(tmp_path / "s.jsonl", 0.6, k=1, seed=2),
    }
    rows = [json.loads(line) for line in open(graded["base"])]
    for r in rows[:30]:
        r["finish_reason"] = "length"
    write_jsonl(graded["base"], rows)
    out = {k: str(tmp_path / f"t.{k}") for k in ("md", "csv", "tex", "png")}
    tables.run(
        graded=graded,
        out_markdown=out["md"],
        out_csv=out["csv"],
        out_latex=out["tex"],
        out_plot=out["png"],
        params=PARAMS,
        log=lambda _: None,
    )
    base_row = next(
        line for line in open(out["md"]).read().splitlines() if line.startswith("| base |")
    )
    assert base_row.split("|")[4].strip() == "0.250"  # 30 of 120 answers still cut off
    csv_rows = open(out["csv"]).read().splitlines()
    header = csv_rows[0].split(",")
    sft_vs_base = dict(
        zip(
            header,
            next(r for r in csv_rows if r.startswith("heldout,sft,") and ",base," in r).split(","),
            strict=False,
        )
    )
    assert 0 < float(sft_vs_base["mcnemar_p"]) < 0.05


def test_tables_refuse_unpaired_models(tmp_path):
    graded = {
        "base": _graded(tmp_path / "b.jsonl", 0.1, n=100),
        "sft": _graded(tmp_path / "s.jsonl", 0.5, n=90),
    }
    with pytest.raises(DataError, match="not evaluated on the same problems"):
        tables.run(
            graded=graded,
            out_markdown=str(tmp_path / "t.md"),
            out_csv=str(tmp_path / "t.csv"),
            out_latex=str(tmp_path / "t.tex"),
            out_plot=str(tmp_path / "t.png"),
            params=PARAMS,
            log=lambda _: None,
        )
    with pytest.raises(DataError, match="reference model 'sft'"):
        tables.run(
            graded={"base": graded["base"]},
            out_markdown=str(tmp_path / "t.md"),
            out_csv=str(tmp_path / "t.csv"),
            out_latex=str(tmp_path / "t.tex"),
            out_plot=str(tmp_path / "t.png"),
            params=PARAMS,
        )


def test_problems_with_an_unparseable_gold_are_excluded_not_wrong(tmp_path):
    graded = {
        "base": _graded(tmp_path / "b.jsonl", 0.3, seed=1),
        "sft": _graded(tmp_path / "s.jsonl", 0.6, seed=2),
    }
    for path in graded.values():
        rows = [json.loads(line) for line in open(path)]
        for r in rows:
            if r["prompt_id"] == "p007":
                r["grade"] = {"correct": False, "status": "gold_unparseable"}
        write_jsonl(path, rows)
    out = {k: str(tmp_path / f"t.{k}") for k in ("md", "csv", "tex", "png")}
    m = tables.run(
        graded=graded,
        out_markdown=out["md"],
        out_csv=out["csv"],
        out_latex=out["tex"],
        out_plot=out["png"],
        params=PARAMS,
        log=lambda _: None,
    )
    md = open(out["md"]).read()
    assert "119 problems" in md and "1 problems with an unparseable gold answer excluded" in md
    assert m["models"] == 2


def test_token_economy_reads_off_a_tie_at_fewer_tokens(tmp_path):
    """A merge as accurate as the base at fewer tokens: the accuracy delta is a tie, the token
    delta's interval excludes 0, and the ratio says how many times fewer."""
    graded = {
        "base": _graded(tmp_path / "b.jsonl", 0.5, seed=1, tokens=90),
        "sft": _graded(tmp_path / "s.jsonl", 0.5, seed=2, tokens=60),
        "merge-0.5": _graded(tmp_path / "m.jsonl", 0.5, seed=3, tokens=50),
    }
    # per-problem spread, so the token interval is not a point
    rows = [json.loads(line) for line in open(graded["merge-0.5"])]
    for r in rows:
        r["completion_tokens"] += int(r["prompt_id"][1:]) % 7
    write_jsonl(graded["merge-0.5"], rows)
    out = {k: str(tmp_path / f"t.{k}") for k in ("md", "csv", "tex", "png")}
    metrics = tables.run(
        graded=graded,
        out_markdown=out["md"],
        out_csv=out["csv"],
        out_latex=out["tex"],
        out_plot=out["png"],
        params=PARAMS,
        log=lambda _: None,
    )
    md = open(out["md"]).read().splitlines()
    start = next(i for i, line in enumerate(md) if line.startswith("Token economy"))
    merge = next(line for line in md[start:] if line.startswith("| merge-0.5 |"))
    cells = [c.strip() for c in merge.split("|")[1:-1]]
    mean = metrics["mean_tokens"]["merge-0.5"]
    assert cells[1] == f"{mean:.1f}" and cells[3] == f"{mean / 90:.2f}×"
    low, high = (float(x) for x in cells[2].split("[")[1].rstrip("]").split(","))
    assert low < mean - 90 < high < 0
    csv_rows = open(out["csv"]).read().splitlines()
    header = csv_rows[0].split(",")
    line = next(r for r in csv_rows if r.startswith("heldout,merge-0.5,") and ",base," in r)
    row = dict(zip(header, line.split(","), strict=True))
    assert row["verdict"] == "tie" and float(row["tokens_ci_high"]) < 0
    assert abs(float(row["token_ratio"]) - mean / 90) < 1e-6
    assert "Tok. $\\times$ base" in open(out["tex"]).read()


def test_per_effort_table_compares_each_effort_with_the_reference(tmp_path):
    graded = {
        f"sft@{e}": _graded(tmp_path / f"{e}.jsonl", acc, seed=i, tokens=tok)
        for i, (e, acc, tok) in enumerate(
            [("low", 0.3, 13), ("medium", 0.5, 20), ("high", 0.9, 27)]
        )
    }
    teacher = tmp_path / "teacher.jsonl"
    write_jsonl(
        teacher,
        [
            {
                "prompt_id": f"t{i}",
                "effort": e,
                "grade": {"correct": (i + k) % 3 != 0},
                "completion_tokens": tok,
            }
            for i in range(10)
            for k, (e, tok) in enumerate([("low", 30), ("medium", 40), ("high", 60)])
            if e == "medium" or i < 6  # other efforts on a subset of the prompts
        ]
        + [
            {
                "prompt_id": "t0",
                "effort": "low",
                "error": "timeout",
                "grade": {},
                "completion_tokens": 0,
            }
        ],
    )
    out = {k: str(tmp_path / f"e.{k}") for k in ("md", "csv")}
    params = {**PARAMS, "efforts": ["low", "medium", "high"], "reference": "medium"}
    params.pop("base"), params.pop("tuned")
    metrics = tables.effort_run(
        graded=graded,
        teacher={"medium-00000": str(teacher)},
        out_markdown=out["md"],
        out_csv=out["csv"],
        params=params,
        log=lambda _: None,
    )
    assert metrics["token_ratio"] == {
        "sft@low": 0.65,
        "sft@medium": 1.0,
        "sft@high": 1.35,
        "teacher@low": 0.75,
        "teacher@medium": 1.0,
        "teacher@high": 1.5,
    }
    md = open(out["md"]).read().splitlines()
    high = next(line for line in md if line.startswith("| sft | high |"))
    assert "| better |" in high and "1.35×" in high
    medium = next(line for line in md if line.startswith("| sft | medium |"))
    assert "| — | — |" in medium  # the reference against itself
    rows = open(out["csv"]).read().splitlines()
    header = rows[0].split(",")
    low = dict(zip(header, next(r for r in rows if ",teacher,low," in r).split(","), strict=True))
    assert low["problems"] == "6" and low["samples"] == "6" and low["delta"] == ""
