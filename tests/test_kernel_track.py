"""The kernel track's pipeline pieces: problems as a source, the prompt and answer format, the
procedural teacher's kernel answers, grading by the validator, decontamination of code, kernel tables."""

import numpy as np
import pytest

from stillroom import dataset, grading, kernel_tables
from stillroom.decontam import NgramIndex
from stillroom.io import DataError, read_jsonl, write_jsonl
from stillroom.kernels import PROBLEMS_DIR
from stillroom.kernels.prompting import extract_code, instruction, user_content
from stillroom.sources import iter_sources
from stillroom.teachers.procedural import ProceduralTeacher

NAMES = ["relu", "softmax_rows", "layer_norm"]


def records(names=NAMES):
    return list(iter_sources([{"name": "kb", "kind": "kernels", "problems": names}], {}, seed=0))


def test_kernel_source_keeps_the_file_verbatim_as_prompt_and_gold(tmp_path):
    recs = records()
    assert [r["meta"] for r in recs] == [{"problem": n, "solution": n} for n in NAMES]
    src = (PROBLEMS_DIR / "softmax_rows.py").read_text()
    rec = recs[1]
    assert rec["kind"] == "kernel" and rec["prompt"] == rec["answer"] == src  # indentation intact
    assert len(records(None)) == len(list(PROBLEMS_DIR.glob("[!_]*.py"))) >= 40
    with pytest.raises(DataError, match=r"source 'kb': no problem file for \['nope'\]"):
        records(["relu", "nope"])
    (tmp_path / "mine.py").write_text(
        src
    )  # a directory of one's own problems: no reference solutions
    (tmp_path / "__init__.py").write_text("")
    own = list(iter_sources([{"name": "own", "kind": "kernels", "dir": str(tmp_path)}], {}, seed=0))
    assert [r["meta"] for r in own] == [{"problem": "mine"}] and own[0]["prompt"] == src
    with pytest.raises(DataError, match="no problem files"):
        list(
            iter_sources(
                [{"name": "own", "kind": "kernels", "dir": str(tmp_path / "none")}], {}, seed=0
            )
        )


def test_instruction_wraps_the_source_and_extract_code_finds_modelnew():
    rec = records(["relu"])[0]
    asked = user_content(rec)
    assert (
        asked == instruction(rec["prompt"])
        and "`ModelNew`" in asked
        and rec["prompt"].strip() in asked
    )
    assert user_content({"kind": "math", "prompt": "1+1?"}) == "1+1?"
    answer = (
        "<think>draft:\n```python\nclass ModelNew: pass\n```</think>\nHelper:\n```python\nx = 1\n```\n"
        "Final:\n```python\nimport torch\nclass ModelNew(torch.nn.Module): ...\n```\nand a tail\n```\ny\n```"
    )
    assert extract_code(answer).startswith(
        "import torch\nclass ModelNew"
    )  # after the reasoning, defines ModelNew
    assert extract_code("```py\nz = 2\n```") == "z = 2\n"
    assert extract_code("<think>never closed ```python\nclass ModelNew: pass\n```") is None
    assert extract_code("no code at all") is None


def test_procedural_teacher_answers_with_reasoning_and_code_and_slips():
    rec = records(["layer_norm"])[0]
    teacher = ProceduralTeacher("p", {"error_rate": 0.0})
    low, high = (teacher.complete(rec, e, 0, 1).text for e in ("low", "high"))
    assert low.startswith("<think>") and len(high) > len(low)
    assert "@triton.jit" in extract_code(high) and "layer_norm_kernel" in high
    slipped = ProceduralTeacher("p", {"error_rate": 1.0})
    codes = {extract_code(slipped.complete(rec, "medium", i, 1).text) for i in range(12)}
    assert any(
        "triton" not in c for c in codes
    )  # the torch slip: the reference's own code as ModelNew
    assert any("0.5 *" in c for c in codes)  # the wrong-kernel slip
    with pytest.raises(DataError, match="no meta.op or meta.solution"):
        teacher.complete({**rec, "meta": {}}, "low", 0, 1)


def test_grading_kernel_answers_with_the_validator(tmp_path):
    """Through the grading stage's worker pool: reward 1 is correct; torch code (exec 1, rule 0) and a wrong
    kernel are not; no code block is no answer."""
    rec = records(["relu"])[0]
    good = ProceduralTeacher("p", {}).complete(rec, "medium", 0, 1).text
    torch_code = (
        rec["prompt"].split("\ndef get_inputs")[0].replace("class Model(", "class ModelNew(")
    )
    wrong = good.replace("tl.store(out_ptr + offs, y", "tl.store(out_ptr + offs, y + 1")
    assert wrong != good
    rows = [
        {"key": str(i), "response": r, "answer": rec["answer"], "kind": "kernel"}
        for i, r in enumerate([good, f"```python\n{torch_code}```", wrong, "I cannot help"])
    ]
    write_jsonl(tmp_path / "s.jsonl", rows)
    m = grading.run(
        samples=str(tmp_path / "s.jsonl"),
        out_graded=str(tmp_path / "g.jsonl"),
        params={"kernel": {"trials": 2, "timeout_s": 30}, "seed": 3},
        threads=2,
        log=lambda _: None,
    )
    graded = read_jsonl(tmp_path / "g.jsonl")
    g = [r["grade"] for r in graded]
    assert [x["correct"] for x in g] == [True, False, False, False]
    assert [x["status"] for x in g] == ["ok", "ok", "ok", "no_answer"]
    assert (g[1]["details"]["exec_reward"], g[1]["details"]["rule_reward"]) == (1.0, 0.0)
    assert (g[2]["details"]["exec_reward"], g[2]["details"]["compiled"]) == (0.0, True)
    assert m["correct"] == 1 and m["no_answer"] == 1
    info = graded[0]["grader"]
    assert info["name"] == "kernel-validator" and info["options"]["validator"]["trials"] == 2
    assert (
        info["options"]["timeout_s"] > 30
    )  # the pool's limit leaves the validator room to report its own


def test_dataset_rows_are_instruction_reasoning_code(tmp_path):
    rec = records(["relu"])[0]
    text = ProceduralTeacher("p", {}).complete(rec, "medium", 0, 1).text
    graded = {
        **rec,
        "key": "k",
        "effort": "medium",
        "sample_index": 0,
        "response": text,
        "completion_tokens": 9,
        "grade": {"correct": True},
    }
    write_jsonl(tmp_path / "g.jsonl", [graded])
    dataset.build(
        graded={"a": str(tmp_path / "g.jsonl")},
        out_dataset=str(tmp_path / "d.jsonl"),
        params={
            "seed": 0,
            "default_effort": "high",
            "untagged_fraction": 0.0,
            "effort_tag": "[$effort]",
        },
        log=lambda _: None,
    )
    messages = read_jsonl(tmp_path / "d.jsonl")[0]["messages"]
    assert [m["role"] for m in messages] == ["system", "user", "assistant"]
    assert messages[1]["content"] == instruction(rec["prompt"])
    assert messages[2]["content"].startswith("<think>") and extract_code(messages[2]["content"])


def test_decontam_ignores_boilerplate_shared_by_many_items():
    """Every problem file shares its imports and class header: with them indexed, any two problems
    'overlap'; n-grams shared by more than one benchmark item are ignored, so only real overlap counts."""
    srcs = {r["meta"]["problem"]: r["prompt"] for r in records(None)}
    bench = [srcs["relu"], srcs["tanh"], srcs["sigmoid"]]
    plain, kept = NgramIndex({"b": bench}, n=13), NgramIndex({"b": bench}, n=13, max_items=1)
    assert all(plain.contaminated(s) for s in srcs.values())  # every file "overlaps" every other
    assert not kept.contaminated(srcs["matmul"]) and kept.ignored > 0
    assert kept.contaminated(srcs["relu"].replace("16", "32"))  # a near copy still matches


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
    out = kernel_tables.run(
        graded=graded, out_markdown=md, out_csv=csv_path, params=PARAMS, log=lambda _: None
    )
    assert out["rates"]["base"]["compiles"] == 0.0 and 0.6 < out["rates"]["sft"]["compiles"] < 1.0
    assert not out["timed"] and "fast_p needs timed speedups" in open(md).read()
    rows = [
        dict(
            zip(
                ["benchmark", "model", "metric", "rate", "reference", "delta", "low", "high"],
                line.split(","),
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
    out = kernel_tables.run(
        graded=timed,
        out_markdown=md,
        out_csv=csv_path,
        params={**PARAMS, "fast_p": [1.0, 2.0]},
        log=lambda _: None,
    )
    assert out["timed"] and out["rates"]["sft"]["fast_1"] == out["rates"]["sft"]["reward"]
    assert out["rates"]["sft"]["fast_2"] == 0.0
    with pytest.raises(DataError, match="reference model 'sft'"):
        kernel_tables.run(
            graded={"base": graded["base"]}, out_markdown=md, out_csv=csv_path, params=PARAMS
        )


def test_a_problem_file_shared_by_train_and_test_would_fail_the_pool(tmp_path):
    """The held-out split is carved from the kernel problems themselves, disjoint by id."""
    from stillroom.pool import build_pool

    out = {k: str(tmp_path / f"{k}.jsonl") for k in ("pool", "heldout", "dev")}
    m = build_pool(
        benchmarks={},
        out_pool=out["pool"],
        out_heldout=out["heldout"],
        out_dev=out["dev"],
        params={"seed": 0, "sources": [{"name": "kb", "kind": "kernels"}], "heldout": {"size": 12}},
        log=lambda _: None,
    )
    held = {r["prompt_id"] for r in read_jsonl(out["heldout"])}
    pool = {r["prompt_id"] for r in read_jsonl(out["pool"])}
    assert m["heldout"] == 12 and not held & pool and len(held | pool) == m["pool"] + 12
