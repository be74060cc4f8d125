import json

import numpy as np
import pandas as pd
import pytest
import yaml

from stillroom.analysis.tables import budget, load, paired, plots, teachers
from stillroom.cli import main
from stillroom.config import ConfigError, Experiment, ModelId, merge_configs
from stillroom.io import DataError, write_jsonl
from stillroom.review.recompute import recompute
from stillroom.stages import tables

from ..conftest import REPO, default_config, recipe_files

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
    # 30 of 120 answers still cut off: above tables.cap_hit_flag (0.1), flagged in cell and caption
    assert base_row.split("|")[4].strip() == "0.250 †"
    sft_row = next(
        line for line in open(out["md"]).read().splitlines() if line.startswith("| sft |")
    )
    assert sft_row.split("|")[4].strip() == "0.000"
    assert "† more than 10% of answers hit the token cap (base)" in open(out["md"]).read()
    assert "0.250 $^\\dagger$" in open(out["tex"]).read()
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
    assert "119 problems" in md
    assert "1 problem of heldout with a gold answer that does not parse as written left out" in md
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


def _effort_table(tmp_path, graded, teacher, efforts=("low", "medium", "high")):
    """The per-effort table of ``graded`` against ``teacher`` shards, reference medium: (metrics,
    {"md": path, "csv": path})."""
    out = {k: str(tmp_path / f"e.{k}") for k in ("md", "csv")}
    params = {**PARAMS, "efforts": list(efforts), "reference": "medium"}
    params.pop("base"), params.pop("tuned")
    metrics = tables.effort_run(
        graded=graded,
        teacher=teacher,
        out_markdown=out["md"],
        out_csv=out["csv"],
        params=params,
        log=lambda _: None,
    )
    return metrics, out


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
    metrics, out = _effort_table(tmp_path, graded, {"medium-00000": str(teacher)})
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


def _traces(path, teacher, effort, prompts, tokens, k=2, correct=lambda i: i % 4 != 0):
    """Graded generation records of one (teacher, effort): ``tokens(i, s)`` per sample."""
    rows = [
        {
            "key": f"p{i:02d}/{teacher}/{effort}/{s}",
            "prompt_id": f"p{i:02d}",
            "teacher": teacher,
            "effort": effort,
            "sample_index": s,
            "completion_tokens": tokens(i, s),
            "grade": {"correct": correct(i)},
            "error": None,
            "skipped": None,
        }
        for i in prompts
        for s in range(k)
    ]
    write_jsonl(path, rows)
    return str(path)


TEACHERS = {"medium": "api", "low": "selfhost", "high": "selfhost"}


def _teacher_table(tmp_path, graded, teachers=TEACHERS):
    out = {k: str(tmp_path / f"teachers.{k}") for k in ("md", "csv")}
    metrics = tables.teacher_run(
        graded=graded,
        out_markdown=out["md"],
        out_csv=out["csv"],
        params={"reference": "api", "teachers": teachers, "n_resamples": 2000, "seed": 0},
        log=lambda _: None,
    )
    return metrics, open(out["md"]).read(), open(out["csv"]).read().splitlines()


def test_teachers_table_compares_lengths_on_the_prompts_every_teacher_answered(tmp_path):
    """medium (the API) on 12 prompts, low and high (self-hosted) on 8 of them: the table covers
    the 8; a failed and a skipped sample, and the API's prompts beyond the 8, change nothing."""
    api = _traces(tmp_path / "api.jsonl", "api", "medium", range(12), lambda i, s: 100 + 10 * s)
    with open(api, "a") as fh:  # traces of prompts the self-hosted efforts never saw
        fh.write(
            json.dumps(
                {
                    "key": "p00/api/medium/9",
                    "prompt_id": "p00",
                    "teacher": "api",
                    "effort": "medium",
                    "sample_index": 9,
                    "completion_tokens": 0,
                    "grade": {},
                    "error": "HTTP 500",
                }
            )
            + "\n"
        )
    graded = {
        "medium-00000": api,
        "low-00000": _traces(tmp_path / "low.jsonl", "selfhost", "low", range(8), lambda i, s: 70),
        "high-00000": _traces(
            tmp_path / "high.jsonl", "selfhost", "high", range(8), lambda i, s: 200 + i
        ),
    }
    skipped = json.loads(open(graded["high-00000"]).readline())
    skipped.update(key="p00/selfhost/high/7", sample_index=7, completion_tokens=0, skipped="ctx")
    with open(graded["high-00000"], "a") as fh:
        fh.write(json.dumps(skipped) + "\n")
    metrics, md, csv_rows = _teacher_table(tmp_path, graded)
    assert metrics["prompts_shared"] == 8
    # the API's per-prompt mean is 105; self-hosted high averages 200 + 3.5 over prompts 0..7
    assert metrics["mean_tokens"] == {
        "api@medium": 105.0,
        "selfhost@low": 70.0,
        "selfhost@high": 203.5,
    }
    assert metrics["token_ratio"] == {
        "selfhost@low vs api@medium": round(70 / 105, 4),
        "selfhost@high vs api@medium": round(203.5 / 105, 4),
    }
    assert "on the 8 prompts every (teacher, effort) below answered" in md
    assert "generation.effort_shards" in md and "mixes the change of teacher" in md
    lines = md.splitlines()
    assert lines[2].startswith("| teacher | effort | samples | accuracy | mean tokens | vs api at")
    assert lines[4] == "| api | medium | 16 | 0.750 | 105.0 | — (reference) | — | — |"
    high = lines[6]
    assert high.startswith("| selfhost | high | 16 | 0.750 | 203.5 | medium | +98.5 [")
    assert high.endswith("| 1.94× |")
    header = csv_rows[0].split(",")
    assert header == [
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
    rows = [dict(zip(header, r.split(","), strict=True)) for r in csv_rows[1:]]
    assert [(r["teacher"], r["effort"]) for r in rows] == [
        ("api", "medium"),
        ("selfhost", "low"),
        ("selfhost", "high"),
    ]
    assert rows[0]["prompts"] == "12" and rows[0]["reference_teacher"] == ""
    low = rows[1]
    assert low["prompts"] == low["prompts_shared"] == "8" and low["reference_effort"] == "medium"
    # every shared prompt: 70 against 105, so the interval is the difference itself
    assert float(low["delta_tokens"]) == float(low["tokens_ci_low"]) == -35.0
    assert float(rows[2]["tokens_ci_low"]) < 98.5 < float(rows[2]["tokens_ci_high"])


def test_teachers_table_pairs_each_row_with_every_effort_of_the_reference(tmp_path):
    graded = {
        f"{e}-00000": _traces(tmp_path / f"{e}.jsonl", t, e, range(6), lambda i, s, n=n: n)
        for e, t, n in [("low", "api", 50), ("medium", "api", 100), ("high", "selfhost", 300)]
    }
    teachers = {"low": "api", "medium": "api", "high": "selfhost"}
    metrics, md, _ = _teacher_table(tmp_path, graded, teachers)
    assert metrics["token_ratio"] == {
        "selfhost@high vs api@low": 6.0,
        "selfhost@high vs api@medium": 3.0,
    }
    assert "| selfhost | high | 12 | 0.667 | 300.0 | low | +250.0 [+250.0, +250.0] | 6.00× |" in md


def test_teachers_table_refuses_traces_of_another_teacher_and_disjoint_prompts(tmp_path):
    graded = {
        "medium-00000": _traces(tmp_path / "m.jsonl", "api", "medium", range(4), lambda i, s: 9),
        "low-00000": _traces(tmp_path / "l.jsonl", "api", "low", range(4), lambda i, s: 9),
    }
    with pytest.raises(
        DataError,
        match=r"l\.jsonl: p00/api/low/0 was written by 'api' at effort "
        r"'low', but the config gives that effort to 'selfhost'",
    ):
        _teacher_table(tmp_path, graded, {"medium": "api", "low": "selfhost"})
    graded["low-00000"] = _traces(
        tmp_path / "l.jsonl", "selfhost", "low", range(4, 8), lambda i, s: 9
    )
    with pytest.raises(DataError, match=r"no prompt was answered by every \(teacher, effort\)"):
        _teacher_table(tmp_path, graded, {"medium": "api", "low": "selfhost"})


def test_effort_table_names_each_efforts_teacher_when_they_differ(tmp_path):
    graded = {
        f"sft@{e}": _graded(tmp_path / f"{e}.jsonl", 0.5, seed=i)
        for i, e in enumerate(["low", "medium"])
    }
    teacher = {
        "low-00000": _traces(tmp_path / "tl.jsonl", "selfhost", "low", range(6), lambda i, s: 9),
        "medium-00000": _traces(tmp_path / "tm.jsonl", "api", "medium", range(6), lambda i, s: 9),
    }
    _, out = _effort_table(tmp_path, graded, teacher, efforts=["low", "medium"])
    md = open(out["md"]).read()
    assert "| teacher (selfhost) | low |" in md and "| teacher (api) | medium |" in md


def test_teachers_table_built_by_the_cli_loads_typed_and_recomputes(tmp_path, monkeypatch):
    """The data of record: the CSV loads back as the builder's DataFrame (typed), and the audit's
    recompute rebuilds it from the recorded inputs, names and seed."""
    monkeypatch.chdir(tmp_path)
    graded = {
        f"{e}-00000": _traces(tmp_path / f"{e}.jsonl", t, e, range(10), lambda i, s: 50 + 7 * i + s)
        for e, t in TEACHERS.items()
    }
    params = {"reference": "api", "teachers": TEACHERS, "n_resamples": 500, "seed": 5}
    args = ["teacher_tables", "--graded", *(f"{n}={p}" for n, p in graded.items())]
    args += ["--out-markdown", "t.md", "--out-csv", "t.csv", "--out-html", "t.html"]
    args += ["--params", json.dumps(params)]
    assert main(args) == 0
    df = load("t.md")
    p = tables.TeacherParams.parse(params)
    table = teachers.teachers(graded, p.reference, p.teachers, p.n_resamples, p.confidence, p.seed)
    assert df.equals(table.df)
    assert str(df["prompts"].dtype) == "Int64" and str(df["teacher"].dtype) == "string"
    assert df["reference_effort"].isna().tolist() == [True, False, False]
    assert recompute("t.md").ok


def test_a_table_recording_an_input_its_stage_no_longer_takes_is_refused_by_name(
    tmp_path, monkeypatch
):
    """A sidecar written before an input was renamed (the tables' merge choice was `selection`):
    the recompute names the input and says to rebuild, not a TypeError from the stage."""
    monkeypatch.chdir(tmp_path)
    graded = {
        f"{e}-00000": _traces(tmp_path / f"{e}.jsonl", t, e, range(10), lambda i, s: 50 + i + s)
        for e, t in TEACHERS.items()
    }
    params = {"reference": "api", "teachers": TEACHERS, "n_resamples": 200, "seed": 5}
    args = ["teacher_tables", "--graded", *(f"{n}={p}" for n, p in graded.items())]
    args += ["--out-markdown", "t.md", "--out-csv", "t.csv", "--out-html", "t.html"]
    assert main([*args, "--params", json.dumps(params)]) == 0
    side = tmp_path / "t.csv.prov.json"
    prov = json.loads(side.read_text())
    prov["inputs"]["selection"] = prov["inputs"]["graded"][0]
    side.write_text(json.dumps(prov))
    with pytest.raises(DataError, match=r"input selection is not an input of stage teacher_tables"):
        recompute("t.md")


def test_load_names_what_is_wrong_with_a_csv(tmp_path):
    (tmp_path / "x.csv").write_text("a,b\n1,2\n")
    with pytest.raises(DataError, match="x.csv: not a stillroom table: its columns"):
        load(tmp_path / "x.md")
    with pytest.raises(DataError, match="not a table: no CSV at"):
        load(tmp_path / "y")
    header = (
        "benchmark,model,budget,method,samples,accuracy,acc_ci_low,acc_ci_high,forced,thinking,"
        "tokens,reference,delta,ci_low,ci_high,p_value,p_holm,verdict\n"
    )
    (tmp_path / "b.csv").write_text(header + "h,sft,sixteen,cutoff,4,0.5,0,1,0,1.0,2.0,,,,,,,\n")
    with pytest.raises(DataError, match="b.csv: a column does not have its type"):
        load(tmp_path / "b.csv")
    (tmp_path / "b.csv").write_text(header + "h,sft,16,cutoff,4,0.5,0,1,0,,2.0,,,,,,,\n")
    df = load(tmp_path / "b")
    assert df["budget"].tolist() == [16] and pd.isna(df["thinking"][0])


def _budget_graded(path, budget, n=40):
    """Budget-forced samples of one budget: forced ones are right only once forcing closed their
    thinking (their cut at the budget holds no answer); half the unforced ones also right."""
    rows = []
    for i in range(n):
        forced = i % 2 == 0
        rows.append(
            {
                "prompt_id": f"p{i:02d}",
                "sample_index": 0,
                "grade": {"correct": forced or i % 4 == 1, "status": "ok"},
                "cutoff_grade": {"correct": not forced and i % 4 == 1, "status": "ok"},
                "completion_tokens": budget + 5 if forced else budget // 2,
                "forced": forced,
                "thinking_tokens": budget if forced else None,
            }
        )
    write_jsonl(path, rows)
    return str(path)


def test_budget_table_built_by_the_cli_loads_typed_and_recomputes(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    graded = {f"sft@{b}": _budget_graded(tmp_path / f"sft-{b}.jsonl", b) for b in (8, 32)}
    args = ["budget_tables", "--graded", *(f"{n}={p}" for n, p in graded.items())]
    args += ["--out-markdown", "b.md", "--out-csv", "b.csv", "--out-plot", "b.png"]
    args += ["--out-html", "b.html"]
    params = {"benchmark": "heldout", "n_resamples": 1000, "base_random": True}
    assert main([*args, "--params", json.dumps(params)]) == 0
    df = load("b")
    assert df["budget"].tolist() == [8, 8, 32, 32] and str(df["budget"].dtype) == "Int64"
    assert df["method"].tolist() == ["forcing", "cutoff"] * 2
    forcing, cutoff = df.iloc[0], df.iloc[1]
    # forcing answers the 20 forced samples the cutoff leaves without an answer
    assert forcing["accuracy"] == 0.75 and cutoff["accuracy"] == 0.25
    assert forcing["acc_ci_low"] < 0.75 < forcing["acc_ci_high"]
    assert forcing["delta"] == 0.5 and forcing["ci_low"] > 0 and forcing["verdict"] == "better"
    assert forcing["reference"] == "cutoff" and pd.isna(cutoff["delta"])
    # the cutoff's tokens stop at the budget; forcing's go on to answer
    assert cutoff["tokens"] == (20 * 8 + 20 * 4) / 40
    assert forcing["tokens"] == (20 * 13 + 20 * 4) / 40
    assert forcing["thinking"] == 8.0 and pd.isna(cutoff["thinking"])
    md = open("b.md").read()
    assert "| sft | 8 | forcing | 40 | 0.750 [" in md and "| better |" in md
    assert "random-weight" not in md  # no base row, nothing to say about it
    assert open("b.png", "rb").read(4) == b"\x89PNG"
    assert recompute("b.md").ok
    csv = open("b.csv").read()
    open("b.csv", "w").write(csv.replace(",sft,32,cutoff,40,", ",sft,32,cutoff,41,"))
    assert [(d.row, d.column) for d in recompute("b.md").differences] == [
        ("model=sft budget=32 method=cutoff", "samples")
    ]


def _instruction_graded(path, verdicts, tokens=20):
    """One sample per prompt of a two-instruction gold; verdicts: per prompt, (strict, loose)
    lists, or None for an answer graded without verdicts (timed out)."""
    gold = json.dumps([{"id": "punctuation:no_comma"}, {"id": "startend:quotation"}])
    rows = []
    for i, v in enumerate(verdicts):
        if v is None:
            grade = {"correct": False, "extracted": None, "status": "timeout", "details": None}
        else:
            strict, loose = v
            details = {
                "ids": ["punctuation:no_comma", "startend:quotation"],
                "strict": strict,
                "loose": loose,
                "prompt_strict": all(strict),
                "prompt_loose": all(loose),
            }
            grade = {"correct": all(strict), "status": "ok", "details": details}
        rows.append(
            {
                "prompt_id": f"p{i}",
                "sample_index": 0,
                "completion_tokens": tokens,
                "kind": "instructions",
                "answer": gold,
                "grade": grade,
            }
        )
    write_jsonl(path, rows)
    return str(path)


def test_instruction_benchmarks_report_ifevals_four_accuracies(tmp_path):
    both, first, none = [True, True], [True, False], [False, False]
    graded = {
        # prompt strict 1/4, loose 2/4; instruction strict 3/8, loose 5/8 (the timeout: 0 of 2)
        "base": _instruction_graded(
            tmp_path / "b.jsonl", [(both, both), (first, both), (none, first), None]
        ),
        "sft": _instruction_graded(
            tmp_path / "s.jsonl", [(both, both), (both, both), (first, first), (both, both)]
        ),
    }
    out = {k: str(tmp_path / f"t.{k}") for k in ("md", "csv", "tex")}
    metrics = tables.run(
        graded=graded,
        out_markdown=out["md"],
        out_csv=out["csv"],
        out_latex=out["tex"],
        out_plot=None,
        params={**PARAMS, "benchmark": "ifeval"},
        log=lambda _: None,
    )
    assert metrics["ifeval"]["base"] == {
        "prompt_strict": 0.25,
        "prompt_loose": 0.5,
        "instruction_strict": 0.375,
        "instruction_loose": 0.625,
    }
    assert metrics["ifeval"]["sft"]["instruction_strict"] == 0.875
    assert metrics["accuracy"] == {"base": 0.25, "sft": 0.75}  # accuracy is prompt-level strict
    md = open(out["md"]).read()
    assert "| model | prompt strict | prompt loose | instruction strict | instruction loose |" in md
    assert "| base | 0.250 | 0.500 | 0.375 | 0.625 |" in md
    assert "| sft | 0.750 | 0.750 | 0.875 | 0.875 |" in md


def test_other_benchmarks_show_no_instruction_accuracies(tmp_path):
    graded = {"base": _graded(tmp_path / "b.jsonl", 0.3), "sft": _graded(tmp_path / "s.jsonl", 0.6)}
    out = {k: str(tmp_path / f"t.{k}") for k in ("md", "csv", "tex")}
    metrics = tables.run(
        graded=graded,
        out_markdown=out["md"],
        out_csv=out["csv"],
        out_latex=out["tex"],
        out_plot=None,
        params=PARAMS,
        log=lambda _: None,
    )
    assert "ifeval" not in metrics and "prompt strict" not in open(out["md"]).read()


def test_budget_table_refuses_samples_graded_without_the_cutoff(tmp_path):
    path = tmp_path / "old.jsonl"
    rows = [json.loads(line) for line in open(_budget_graded(path, 8))]
    for r in rows:
        del r["cutoff_grade"]
    write_jsonl(path, rows)
    with pytest.raises(DataError, match="old.jsonl:1: missing key 'cutoff_grade'"):
        budget.budgets({"sft@8": str(path)}, tables.BudgetParams.parse({"benchmark": "h"}), "h")


def test_both_zero_reads_both_0_and_models_without_a_correct_answer_get_no_token_ratio(tmp_path):
    """The miniature's case: a random-init base and an undertrained fine-tune both score 0."""
    graded = {
        "base": _graded(tmp_path / "b.jsonl", 0.0, seed=1, tokens=40),
        "sft": _graded(tmp_path / "s.jsonl", 0.0, seed=2, tokens=20),
        "merge-0.5": _graded(tmp_path / "m.jsonl", 0.5, seed=3, tokens=30),
    }
    out = {k: str(tmp_path / f"t.{k}") for k in ("md", "csv", "tex", "png")}
    tables.run(
        graded=graded,
        out_markdown=out["md"],
        out_csv=out["csv"],
        out_latex=out["tex"],
        out_plot=out["png"],
        params={**PARAMS, "base_random": True},
        log=lambda _: None,
    )
    md = open(out["md"]).read()
    assert "-0.000" not in md
    lines = md.splitlines()
    base_row = next(line for line in lines if line.startswith("| base |"))
    sft_row = next(line for line in lines if line.startswith("| sft |"))
    # base against the fine-tune (mirrored) and the fine-tune against base
    assert "| +0.000 [+0.000, +0.000] | both 0 |" in base_row
    assert "| +0.000 [+0.000, +0.000] | both 0 |" in sft_row
    assert "random-weight initialisation" in md
    df = load(out["csv"])
    assert set(df.loc[df["model"].isin(["base", "sft"]), "verdict"].dropna()) == {"both 0"}
    merge = df[df["model"] == "merge-0.5"].set_index("reference")
    assert merge.loc["base", "verdict"] == "better"
    # lengths of wrong answers only are no economy: no ratio where either side solved nothing
    assert df["token_ratio"].isna().all()
    assert merge.loc["base", "delta_tokens"] == -10.0  # the difference in length stays
    tex = open(out["tex"]).read()
    assert "\\textbf{" in tex  # merge's wins, not the both-0 rows
    assert "\\textbf{$+0.000$" not in tex


def _capped(path, rate, n=120, k=2):
    """Mark the first ``rate`` share of a graded file's answers as cut off at the token cap."""
    rows = [json.loads(line) for line in open(path)]
    for r in rows[: round(rate * n * k)]:
        r["finish_reason"] = "length"
    write_jsonl(path, rows)
    return path


def test_effort_table_flags_rows_truncated_at_the_cap_and_counts_golds_per_source(tmp_path):
    graded = {
        "sft@medium": _graded(tmp_path / "medium.jsonl", 0.5, seed=1, tokens=20),
        "sft@high": _capped(_graded(tmp_path / "high.jsonl", 0.2, seed=2, tokens=60), 0.23),
        "sft@low": _graded(tmp_path / "low.jsonl", 0.0, seed=3, tokens=10),
    }
    teacher = tmp_path / "teacher.jsonl"
    write_jsonl(
        teacher,
        [
            {
                "prompt_id": f"t{i}",
                "source": "numina" if i < 8 else "openscience",
                "effort": e,
                # t0 (numina) and t9 (openscience): golds that do not parse
                "grade": {"correct": i % 2 == 0, "status": "ok"}
                if i not in (0, 9)
                else {"correct": False, "status": "gold_unparseable"},
                "completion_tokens": tok,
            }
            for i in range(10)
            for e, tok in [("low", 30), ("medium", 40), ("high", 60)]
        ],
    )
    metrics, out = _effort_table(tmp_path, graded, {"shard": str(teacher)})
    md = open(out["md"]).read()
    high = next(line for line in md.splitlines() if line.startswith("| sft | high |"))
    assert high.endswith("| 0.229 † |")  # 55 of 240
    assert "† more than 10% of answers hit the token cap (sft at high)" in md
    medium = next(line for line in md.splitlines() if line.startswith("| sft | medium |"))
    assert medium.endswith("| 0.000 |")
    # sft at low never answers right: no ratio; the teacher's are on the 8 prompts left
    assert "sft@low" not in metrics["token_ratio"] and metrics["token_ratio"]["sft@high"] == 3.0
    assert "per source: numina 1, openscience 1." in md
    df = load(out["csv"])
    teacher_rows = df[df["model"] == "teacher"].set_index("effort")
    assert teacher_rows.loc["medium", "problems"] == 8
    assert teacher_rows.loc["medium", "accuracy"] == 4 / 8  # t2, t4, t6, t8


def test_teachers_table_leaves_unparseable_golds_out_and_counts_them_per_source(tmp_path):
    graded = {}
    for teacher, effort in [("api", "medium"), ("selfhost", "low"), ("selfhost", "high")]:
        path = _traces(tmp_path / f"{effort}.jsonl", teacher, effort, range(8), lambda i, s: 50)
        rows = [json.loads(line) for line in open(path)]
        for r in rows:
            r["source"] = "numina"
            if r["prompt_id"] in ("p01", "p02"):
                r["grade"] = {"correct": False, "status": "gold_unparseable"}
        write_jsonl(path, rows)
        graded[effort] = path
    _, md, csv = _teacher_table(tmp_path, graded)
    assert "Teacher traces on the 6 prompts" in md
    assert "per source: numina 2." in md
    header = csv[0].split(",")
    ref = dict(zip(header, csv[1].split(","), strict=True))
    assert float(ref["accuracy"]) == 4 / 6  # p00 and p04 wrong; p01 and p02 left out


def test_place_labels_keeps_crowded_labels_apart(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(4, 3), dpi=100)
    points = [(100 + i, 0.1 + 0.002 * i, f"merge-0.{i}") for i in range(5)]
    ax.scatter([x for x, _, _ in points], [y for _, y, _ in points])
    ax.set(xlim=(0, 300), ylim=plots.fitted([y for _, y, _ in points]))
    plots.place_labels(ax, points)
    renderer = fig.canvas.get_renderer()
    boxes = [t.get_window_extent(renderer) for t in ax.texts]
    assert len(boxes) == 5
    assert not any(a.overlaps(b) for i, a in enumerate(boxes) for b in boxes[i + 1 :])
    plt.close(fig)
    low, high = plots.fitted([0.0, 0.12, 0.2])
    assert low == 0 and 0.2 < high < 0.25  # data under 0.25 is not drawn on 0-1, nor under 0
    assert plots.fitted([0.9, 1.0]) == (pytest.approx(0.88), 1.02)


def test_a_paired_table_without_references_or_identities_names_what_is_missing():
    params = {k: v for k, v in PARAMS.items() if k not in ("base", "tuned")}
    with pytest.raises(
        ConfigError, match="base: not given, and models has no model of kind 'base'"
    ):
        tables.Params.parse(params)


def test_budget_plot_ticks_the_budgets_in_plain_numbers(tmp_path, monkeypatch):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    graded = {f"sft@{b}": _budget_graded(tmp_path / f"sft-{b}.jsonl", b) for b in (16, 64, 256)}
    p = tables.BudgetParams.parse({"benchmark": "heldout", "n_resamples": 500})
    df = budget.budgets(graded, p, p.benchmark).df
    shown = {}
    monkeypatch.setattr(plt, "close", lambda fig: shown.setdefault("fig", fig))
    plots.budget_plot(df, str(tmp_path / "b.png"), "heldout")
    ax = shown["fig"].axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["16", "64", "256"]
    assert ax.get_ylim()[1] < 1.0  # fitted to the intervals (highest 0.75 + its CI)
    assert len(ax.get_legend().get_texts()) == 2  # forcing and cutoff


def test_the_sweep_plots_each_merges_difference_from_base_with_its_ci(tmp_path, monkeypatch):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from stillroom.config import ModelId

    # the references and the sweep's x come from the identities in params, not from the names
    models = [ModelId.base(), ModelId.sft(), *map(ModelId.merge, (0.3333333, 1e-05, 0.125))]
    graded = {
        m.name: _graded(tmp_path / f"{i}.jsonl", 0.1 - 0.02 * i, seed=i, tokens=40 - i)
        for i, m in enumerate(models)
    }
    params = {k: v for k, v in PARAMS.items() if k not in ("base", "tuned")}
    p = tables.Params.parse({**params, "models": [m.dump() for m in models]})
    table = paired.paired(graded, p)
    assert (table.base, table.tuned) == ("base", "sft")
    shown = {}
    monkeypatch.setattr(plt, "close", lambda fig: shown.setdefault("fig", fig))
    plots.paired_plot(table, p.weights, str(tmp_path / "p.png"))
    sweep = shown["fig"].axes[1]
    x, y = sweep.lines[0].get_data()
    vs_base = table.df[table.df["reference"] == "base"].set_index("model")
    assert list(x) == [0.0, 1e-05, 0.125, 0.3333333, 1.0]
    order = ["merge-1e-05", "merge-0.125", "merge-0.3333333", "sft"]
    assert list(y) == [0.0, *(vs_base.loc[m, "delta"] for m in order)]
    assert sweep.get_ylabel().startswith("accuracy - base's")
    low, high = sweep.get_ylim()
    assert low <= vs_base.loc["sft", "ci_low"] and high >= 0.0


def test_an_all_zero_plot_keeps_its_accuracy_axis_at_or_above_zero(tmp_path, monkeypatch):
    """tinycode's plot, every model at accuracy 0, drew its accuracy axis from -0.02."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from stillroom.config import ModelId

    models = [ModelId.base(), ModelId.sft(), ModelId.merge(0.5)]
    graded = {m.name: _graded(tmp_path / f"{i}.jsonl", 0.0, seed=i) for i, m in enumerate(models)}
    params = {k: v for k, v in PARAMS.items() if k not in ("base", "tuned")}
    p = tables.Params.parse({**params, "models": [m.dump() for m in models]})
    shown = {}
    monkeypatch.setattr(plt, "close", lambda fig: shown.setdefault("fig", fig))
    plots.paired_plot(paired.paired(graded, p), p.weights, str(tmp_path / "p.png"))
    ax = shown["fig"].axes[0]
    assert ax.get_ylabel() == "accuracy"
    assert ax.get_ylim()[0] == 0.0
    assert min(t for t in ax.get_yticks() if ax.get_ylim()[0] <= t <= ax.get_ylim()[1]) >= 0.0


def _experiment(**changes):
    return Experiment.parse(merge_configs(default_config(), changes))


def test_a_tables_job_names_the_models_identities_not_the_references_they_imply():
    odd = [1e-05, 0.125, 0.3333333]
    exp = _experiment(merge={"ratios": odd})
    params = tables.job_params(exp, "heldout", base_random=True)
    assert (params.base, params.tuned, params.weights["merge-1e-05"]) == ("base", "sft", 1e-05)
    job = json.loads(params.as_param())
    # the references follow from the identities: the job's params leave them out
    assert "base" not in job and "tuned" not in job and job["base_random"] is True
    assert [ModelId(**m) for m in job["models"]] == exp.model_ids
    assert [m["ratio"] for m in job["models"] if m["kind"] == "merge"] == odd
    assert job["seed"] == exp.seed and job["n_resamples"] == exp.tables.n_resamples
    # a pretrained base is the default caption: not in the params
    assert "base_random" not in json.loads(tables.job_params(exp, "heldout", False).as_param())
    # the budget table always says which base it had
    budget_job = json.loads(tables.budget_job_params(exp, "heldout", False).as_param())
    assert budget_job["base_random"] is False and budget_job["benchmark"] == "heldout"


def test_the_effort_and_teacher_tables_jobs_take_generation_s_efforts_and_teachers():
    exp = _experiment(eval={"per_effort": {"reference": "low"}})
    effort = tables.effort_job_params(exp, "heldout")
    assert effort.efforts == list(exp.generation.efforts) and effort.reference == "low"
    teacher = tables.teacher_job_params(exp)
    assert teacher.reference == exp.generation.teacher
    assert teacher.teachers == {e: exp.generation.teacher_of(e) for e in exp.generation.efforts}
    assert (teacher.n_resamples, teacher.confidence) == (
        exp.tables.n_resamples,
        exp.tables.confidence,
    )


def test_a_kernel_tables_job_adds_kernels_fast_p_to_the_paired_table_s_params():
    config: dict = {}
    for path in recipe_files(REPO / "config/experiments/autotriton-tiny.yaml"):
        config = merge_configs(config, yaml.safe_load(path.read_text()))
    exp = Experiment.parse(config)
    job = json.loads(tables.kernel_job_params(exp, "heldout", True).as_param())
    paired_job = json.loads(tables.job_params(exp, "heldout", True).as_param())
    assert job == {**paired_job, "fast_p": exp.kernels.fast_p}
