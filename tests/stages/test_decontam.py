"""Rule decontam: pool prompts sharing an n-gram with a benchmark item or a split are dropped and
reported, everything else is kept as it was."""

from __future__ import annotations

import json

import pytest

from stillroom.config import ConfigError, Experiment, merge_configs
from stillroom.data.records import record
from stillroom.io import read_jsonl, write_jsonl
from stillroom.stages.decontam import job_params, run

from ..conftest import default_config

ITEM = "A train leaves the station at noon and travels sixty miles at a steady speed of thirty"


def test_contaminated_prompts_are_dropped_and_reported(tmp_path):
    pool = [
        record("web", "math", f"Problem: {ITEM.upper()} miles an hour. When?", "2", {}),
        record("gen", "math", "What is 2 + 2?", "4", {}),
        record("gen", "math", "A train leaves at noon; how far does it go in two hours?", "60", {}),
    ]
    write_jsonl(tmp_path / "pool.jsonl", pool)
    write_jsonl(tmp_path / "bench.jsonl", [{"prompt": ITEM, "answer": "x", "kind": "math"}])
    write_jsonl(tmp_path / "heldout.jsonl", [])
    metrics = run(
        pool=str(tmp_path / "pool.jsonl"),
        benchmarks={
            "bench": str(tmp_path / "bench.jsonl"),
            "heldout": str(tmp_path / "heldout.jsonl"),
        },
        out_clean=str(tmp_path / "clean.jsonl"),
        out_report=str(tmp_path / "report.json"),
        params={"ngram": 13, "seed": 0},
    )
    assert [r["prompt"] for r in read_jsonl(tmp_path / "clean.jsonl")] == [
        p["prompt"] for p in pool[1:]
    ]
    report = json.loads((tmp_path / "report.json").read_text())
    assert metrics["dropped"] == report["dropped"].__len__() == 1
    (dropped,) = report["dropped"]
    assert dropped["prompt_id"] == pool[0]["prompt_id"] and dropped["source"] == "web"
    assert dropped["matches"][0]["benchmark"] == "bench"
    assert dropped["matches"][0]["item_prompt"] == ITEM
    assert report["dropped_per_benchmark"] == {"bench": 1}
    assert report["benchmark_items"] == {"bench": 1, "heldout": 0}


def test_bad_params_are_refused_before_any_file_is_read(tmp_path):
    with pytest.raises(ConfigError, match="decontam.ngram: Input should be greater than or equal"):
        run(
            pool=str(tmp_path / "missing.jsonl"),
            benchmarks={},
            out_clean=str(tmp_path / "c"),
            out_report=str(tmp_path / "r"),
            params={"ngram": 2},
        )


def test_the_audit_detector_reports_what_the_dropping_one_kept_and_drops_nothing(tmp_path):
    """An 8-word overlap (a paraphrased copy) escapes the 13-gram index; the 8-gram audit names it
    with the matched item, and the prompt stays in the pool."""
    near = "Yesterday a train leaves the station at noon and travels sixty miles; how fast?"
    pool = [
        record("web", "math", near, "2", {}),
        record("gen", "math", "What is 2 + 2?", "4", {}),
    ]
    write_jsonl(tmp_path / "pool.jsonl", pool)
    write_jsonl(tmp_path / "bench.jsonl", [{"prompt": ITEM, "answer": "x", "kind": "math"}])
    common = dict(
        pool=str(tmp_path / "pool.jsonl"),
        benchmarks={"bench": str(tmp_path / "bench.jsonl")},
        out_clean=str(tmp_path / "clean.jsonl"),
        out_report=str(tmp_path / "report.json"),
    )
    metrics = run(**common, params={"ngram": 13, "audit_ngram": 8, "seed": 0})
    assert len(read_jsonl(tmp_path / "clean.jsonl")) == 2 and metrics["dropped"] == 0
    report = json.loads((tmp_path / "report.json").read_text())
    assert metrics["audit_flagged"] == report["audit"]["flagged"] == 1
    (flagged,) = report["audit"]["prompts"]
    assert flagged["prompt_id"] == pool[0]["prompt_id"] and flagged["matches"][0]["item"] == 0
    assert flagged["matches"][0]["item_prompt"] == ITEM
    assert flagged["matches"][0]["ngram"] == "a train leaves the station at noon and"

    run(**common, params={"ngram": 13, "audit_ngram": None, "seed": 0})
    assert "audit" not in json.loads((tmp_path / "report.json").read_text())
    with pytest.raises(ConfigError, match="decontam.audit_ngram: 13 should be shorter than ngram"):
        run(**common, params={"ngram": 13, "audit_ngram": 13})


def test_the_decontam_job_s_params_are_the_decontam_section():
    exp = Experiment.parse(merge_configs(default_config(), {"decontam": {"ngram": 11}}))
    job = json.loads(job_params(exp).as_param())
    assert job == {"seed": exp.seed, **exp.decontam.dump()} and job["ngram"] == 11
