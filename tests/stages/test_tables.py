import json

import numpy as np
import pytest

from stillroom import cli, tables
from stillroom.io import DataError, read_json, write_jsonl
from stillroom.provenance import digest, redact, sidecar_path

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


def test_cli_runs_a_stage_and_writes_provenance(tmp_path, monkeypatch, capsys):
    graded = {"base": _graded(tmp_path / "b.jsonl", 0.1), "sft": _graded(tmp_path / "s.jsonl", 0.5)}
    monkeypatch.setenv("STILLROOM_CONFIG_SHA256", "abc123")
    monkeypatch.setenv("STILLROOM_API_KEY", "sk-secret")
    params = {**PARAMS, "api_key": "sk-secret", "api_key_env": "OPENAI_API_KEY"}
    md = tmp_path / "out" / "t.md"
    rc = cli.main(
        [
            "tables",
            "--graded",
            *[f"{k}={v}" for k, v in graded.items()],
            "--out-markdown",
            str(md),
            "--out-csv",
            str(tmp_path / "out" / "t.csv"),
            "--out-latex",
            str(tmp_path / "out" / "t.tex"),
            "--out-plot",
            str(tmp_path / "out" / "t.png"),
            "--params",
            json.dumps(params),
            "--rule",
            "tables",
            "--log",
            str(tmp_path / "t.log"),
        ]
    )
    assert rc == 0
    prov = read_json(sidecar_path(md))
    assert (
        prov["sha256"] == digest(md)["sha256"]
        and prov["rule"] == "tables"
        and prov["config_sha256"] == "abc123"
    )
    assert [i["sha256"] for i in prov["inputs"]["graded"]] == [
        digest(p)["sha256"] for p in graded.values()
    ]
    assert (
        set(prov["outputs"]) == {"markdown", "csv", "latex", "plot"}
        and prov["metrics"]["wall_s"] >= 0
    )
    text = json.dumps(prov)
    assert "sk-secret" not in text and prov["params"]["api_key"] == "<redacted>"
    assert prov["params"]["api_key_env"] == "OPENAI_API_KEY"
    assert "done in" in (tmp_path / "t.log").read_text()


def test_cli_bad_input_is_a_clear_error(tmp_path, capsys):
    bad = tmp_path / "g.jsonl"
    bad.write_text(
        '{"prompt_id": "p", "sample_index": 0, "completion_tokens": 3, "grade": {"correct": true}}\n{oops\n'
    )
    rc = cli.main(
        [
            "tables",
            "--graded",
            f"base={bad}",
            f"sft={bad}",
            "--out-markdown",
            str(tmp_path / "t.md"),
            "--out-csv",
            str(tmp_path / "t.csv"),
            "--out-latex",
            str(tmp_path / "t.tex"),
            "--out-plot",
            str(tmp_path / "t.png"),
            "--params",
            json.dumps(PARAMS),
        ]
    )
    assert rc == 2
    assert "g.jsonl:2: not valid JSON" in capsys.readouterr().err
    assert not (tmp_path / "t.md").exists() and not sidecar_path(tmp_path / "t.md").exists()
    assert (
        cli.main(
            [
                "tables",
                "--graded",
                "base=x",
                "--out-markdown",
                "a",
                "--out-csv",
                "b",
                "--out-latex",
                "d",
                "--out-plot",
                "c",
                "--params",
                "{not json",
            ]
        )
        == 2
    )


def test_redact_and_directory_digest(tmp_path):
    assert redact({"a": {"token": "t", "n": 1}, "list": [{"password": "p"}]}) == {
        "a": {"token": "<redacted>", "n": 1},
        "list": [{"password": "<redacted>"}],
    }
    counts = {
        "max_tokens": 5,
        "max_new_tokens": 6,
        "completion_tokens": 7,
        "daily_output_tokens": 8,
    }
    assert redact(counts) == counts  # token counts are not credentials
    assert redact({"hf_token": "x", "OPENAI_API_KEY": "y", "api_key_env": "OPENAI_API_KEY"}) == {
        "hf_token": "<redacted>",
        "OPENAI_API_KEY": "<redacted>",
        "api_key_env": "OPENAI_API_KEY",
    }
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "x.bin").write_bytes(b"1")
    first = digest(tmp_path / "d")
    assert set(first["files"]) == {"x.bin"}
    (tmp_path / "d" / "x.bin").write_bytes(b"2")
    assert digest(tmp_path / "d")["sha256"] != first["sha256"]


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
