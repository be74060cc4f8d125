"""The evaluate stage: k answers per problem, long answers continued from their exact tokens and
budget-forced answers recorded, in process and through a real served model."""

import json

import pytest

from stillroom.io import read_jsonl, write_jsonl


def test_evaluate_stage_records_segments_and_forced_answers(setup, tmp_path):
    from stillroom.cli import main

    write_jsonl(
        tmp_path / "bench.jsonl",
        [{"prompt": f"What is {i} + 1?", "answer": str(i + 1), "kind": "math"} for i in range(3)],
    )
    common = {
        "model_name": "base",
        "benchmark": "b",
        "samples": 2,
        "temperature": 0.7,
        "top_p": 0.95,
        "batch_size": 6,
        "effort": None,
        "effort_tag": "{reasoning effort: $effort}",
        "seed": 3,
    }
    args = ["evaluate", "--model", str(setup / "base"), "--problems", str(tmp_path / "bench.jsonl")]
    long = {**common, "max_new_tokens": 24, "request_tokens": 8}
    assert (
        main([*args, "--out-samples", str(tmp_path / "long.jsonl"), "--params", json.dumps(long)])
        == 0
    )
    rows = read_jsonl(tmp_path / "long.jsonl")
    assert len(rows) == 6 and all(r["completion_tokens"] <= 24 for r in rows)
    assert any(len(r.get("segments", [])) == 3 for r in rows)  # a random model runs to the limit
    forced = {**common, "max_new_tokens": 24, "budget": 8, "answer_tokens": 4}
    assert (
        main(
            [*args, "--out-samples", str(tmp_path / "forced.jsonl"), "--params", json.dumps(forced)]
        )
        == 0
    )
    rows = read_jsonl(tmp_path / "forced.jsonl")
    assert all(r["budget"] == 8 and r["forced"] and r["thinking_tokens"] == 8 for r in rows)


@pytest.mark.slow
def test_evaluation_through_a_real_served_model(setup, tmp_path):
    """The sglang backend's lifecycle with a real OpenAI-compatible server (`transformers serve`)
    for the checkpoint under evaluation: raw completions, continued while cut off, and
    budget-forced."""
    import sys
    from pathlib import Path

    from stillroom.cli import main

    write_jsonl(
        tmp_path / "bench.jsonl",
        [{"prompt": f"What is {i} + 1?", "answer": str(i + 1), "kind": "math"} for i in range(2)],
    )
    serve = Path(sys.executable).parent / "transformers"
    backend = {
        "backend": "sglang",
        "concurrency": 4,
        "server": {
            "command": f"{serve} serve {{model_path}} "
            "--host 127.0.0.1 --port {port} --device cpu",
            "startup_timeout_s": 120,
        },
    }
    common = {
        "model_name": "base",
        "benchmark": "b",
        "samples": 2,
        "temperature": 1.0,
        "top_p": 1.0,
        "batch_size": 4,
        "effort": None,
        "effort_tag": "{reasoning effort: $effort}",
        "seed": 3,
        "backend": backend,
    }
    args = ["evaluate", "--model", str(setup / "base"), "--problems", str(tmp_path / "bench.jsonl")]
    long = {**common, "max_new_tokens": 16, "request_tokens": 6}
    assert (
        main([*args, "--out-samples", str(tmp_path / "long.jsonl"), "--params", json.dumps(long)])
        == 0
    )
    rows = read_jsonl(tmp_path / "long.jsonl")
    assert len(rows) == 4 and any(len(r.get("segments", [])) >= 2 for r in rows)
    assert all(
        r["completion_tokens"] <= 16 + 2 for r in rows
    )  # re-tokenised text may differ by a token
    forced = {**common, "max_new_tokens": 16, "budget": 5, "answer_tokens": 4}
    assert (
        main(
            [*args, "--out-samples", str(tmp_path / "forced.jsonl"), "--params", json.dumps(forced)]
        )
        == 0
    )
    rows = read_jsonl(tmp_path / "forced.jsonl")
    assert all(r["forced"] and "</think>" in r["response"] for r in rows)
