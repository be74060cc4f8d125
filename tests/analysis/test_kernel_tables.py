"""The kernel track's tables: compile, correct, launch, rule and reward rates with paired CIs, and
fast_p on timed speedups."""

import json

import numpy as np
import pytest

from stillroom.analysis.tables import kernels, load
from stillroom.cli import main
from stillroom.io import DataError, write_jsonl
from stillroom.review.recompute import recompute
from stillroom.stages.tables import KernelParams, kernel_tables


def _graded(path, reward_p, compiled_p, n=40, k=2, seed=0, speedup=None):
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n):
        for s in range(k):
            compiled = bool(rng.random() < compiled_p)
            reward = float(compiled and rng.random() < reward_p / max(compiled_p, 1e-9))
            details = {
                "compiled": compiled,
                "correct": bool(reward),
                "launched_triton": compiled,
                "rule_reward": float(compiled),
                "reward": reward,
                "speedup": speedup,
            }
            rows.append(
                {
                    "prompt_id": f"p{i:02d}",
                    "sample_index": s,
                    "completion_tokens": 5,
                    "grade": {"correct": bool(reward), "status": "ok", "details": details},
                }
            )
    write_jsonl(path, rows)
    return str(path)


PARAMS = {
    "benchmark": "heldout",
    "base": "base",
    "tuned": "sft",
    "n_resamples": 1000,
    "confidence": 0.95,
    "seed": 0,
}


def test_kernel_tables_rates_paired_cis_and_fast_p(tmp_path):
    graded = {
        "base": _graded(tmp_path / "b.jsonl", 0.0, 0.0, seed=1),
        "sft": _graded(tmp_path / "s.jsonl", 0.4, 0.8, seed=2),
        "grpo": _graded(tmp_path / "g.jsonl", 0.6, 0.9, seed=3),
    }
    md, csv_path = str(tmp_path / "k.md"), str(tmp_path / "k.csv")
    out = kernel_tables(
        graded=graded, out_markdown=md, out_csv=csv_path, params=PARAMS, log=lambda _: None
    )
    assert out["rates"]["base"]["compiles"] == 0.0 and 0.6 < out["rates"]["sft"]["compiles"] < 1.0
    assert not out["timed"] and "fast_p needs timed speedups" in open(md).read()
    rows = [
        dict(
            zip(
                ["benchmark", "model", "metric", "rate", "reference", "delta", "low", "high"],
                line.split(","),
                strict=False,
            )
        )
        for line in open(csv_path).read().splitlines()[1:]
    ]
    sft_reward = next(
        r
        for r in rows
        if r["model"] == "sft" and r["metric"] == "reward" and r["reference"] == "base"
    )
    assert float(sft_reward["low"]) > 0  # clearly better than a base that never compiles
    assert {r["metric"] for r in rows} == {
        "answers",
        "compiles",
        "correct",
        "launches",
        "rules",
        "reward",
    }
    # Timed speedups (GPU): fast_p columns appear, counting only rewarded answers faster than p.
    timed = {
        name: _graded(tmp_path / f"t{name}.jsonl", 0.5, 0.5, seed=4, speedup=1.5)
        for name in ("base", "sft")
    }
    out = kernel_tables(
        graded=timed,
        out_markdown=md,
        out_csv=csv_path,
        params={**PARAMS, "fast_p": [1.0, 2.0]},
        log=lambda _: None,
    )
    assert out["timed"] and out["rates"]["sft"]["fast_1"] == out["rates"]["sft"]["reward"]
    assert out["rates"]["sft"]["fast_2"] == 0.0
    with pytest.raises(DataError, match="reference model 'sft'"):
        kernel_tables(
            graded={"base": graded["base"]}, out_markdown=md, out_csv=csv_path, params=PARAMS
        )


def test_a_problem_the_validator_failed_on_is_left_out_of_every_model(tmp_path):
    graded = {
        "base": _graded(tmp_path / "b.jsonl", 0.2, 0.5, n=10, seed=1),
        "sft": _graded(tmp_path / "s.jsonl", 0.6, 0.9, n=10, seed=2),
    }
    rows = [json.loads(line) for line in open(graded["sft"])]
    rows[3]["grade"] = {"correct": False, "status": "harness", "details": {"status": "harness"}}
    write_jsonl(graded["sft"], rows)  # p01's second sample: the validator failed, not the answer
    md, csv_path = str(tmp_path / "k.md"), str(tmp_path / "k.csv")
    out = kernel_tables(
        graded=graded, out_markdown=md, out_csv=csv_path, params=PARAMS, log=lambda _: None
    )
    assert out["harness_left_out"] == 1
    assert "10 kernel problems" not in open(md).read()
    assert "9 kernel problems × 2 samples (1 more left out" in open(md).read()
    kept = [r for r in rows if r["prompt_id"] != "p01"]
    assert out["rates"]["sft"]["reward"] == round(
        sum(r["grade"]["details"]["reward"] for r in kept) / len(kept), 4
    )


def test_the_kernel_table_loads_typed_and_recomputes(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    graded = {
        "base": _graded(tmp_path / "b.jsonl", 0.1, 0.3, seed=1),
        "sft": _graded(tmp_path / "s.jsonl", 0.4, 0.8, seed=2),
        "grpo": _graded(tmp_path / "g.jsonl", 0.6, 0.9, seed=3),
    }
    args = ["kernel_tables", "--graded", *(f"{n}={p}" for n, p in graded.items())]
    args += [
        "--out-markdown",
        "k.md",
        "--out-csv",
        "k.csv",
        "--out-html",
        "k.html",
        "--params",
        json.dumps(PARAMS),
    ]
    assert main(args) == 0
    df = load("k.csv")
    p = KernelParams.parse(PARAMS)
    assert df.equals(kernels.table(graded, p, p.fast_p).df)
    assert str(df["verdict"].dtype) == "category" and df["rate"].dtype == float
    # the references' own rows have no comparison
    assert df[df["reference"].isna()]["model"].unique().tolist() == ["base", "sft"]
    assert recompute("k.md").ok
    lines = open("k.md").read().splitlines()
    i = next(i for i, line in enumerate(lines) if line.startswith("| grpo | "))
    cells = lines[i].split(" | ")
    cells[2] = "0.999"  # compiles
    lines[i] = " | ".join(cells)
    open("k.md", "w").write("\n".join(lines) + "\n")
    assert [(d.row, d.column, d.written) for d in recompute("k.md").differences] == [
        ("grpo", "compiles", "0.999")
    ]
