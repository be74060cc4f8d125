"""The grade stage: every sample graded by its kind's grader, the grader recorded with each record,
gold failures counted apart from wrong answers; teacher slips and kernel answers graded."""

from __future__ import annotations

import importlib.metadata
import json

from stillroom.config import Experiment, ValidatorOptions
from stillroom.io import read_jsonl, write_jsonl
from stillroom.stages import grade
from stillroom.teachers.procedural import ProceduralTeacher

from ..conftest import default_config, kernel_records
from .test_generate import _generate, _shard

# Hangs math-verify (sympy evaluates the tower without end) unless something stops it.
HANG = r"\boxed{9^{9^{9^{9}}}}"
SIX = "Which?\n" + "\n".join(f"({c}) option {c}" for c in "ABCDEF")


def test_run_records_grader_and_counts_gold_failures_apart(tmp_path):
    rows = [
        {"key": "a", "response": r"\boxed{7}", "answer": "7", "kind": "math"},
        {"key": "b", "response": r"\boxed{8}", "answer": "7", "kind": "math"},
        # golds that cannot be graded against
        {"key": "c", "response": r"\boxed{7}", "answer": "", "kind": "math", "benchmark": "m"},
        {"key": "c2", "response": r"\boxed{1}", "answer": r"1-\frac1{\mathrm{x}}", "kind": "math"},
        {"key": "d", "response": HANG, "answer": "7", "kind": "math"},
        {"key": "e", "response": None, "answer": "7", "kind": "math"},  # request failed for good
        {"key": "f", "response": "The answer is (J)", "answer": "J", "kind": "choice"},
        {"key": "g", "response": "Answer: A", "answer": "Z", "kind": "choice", "benchmark": "q"},
        # letters from the item's own options, not the configured ones
        {"key": "h", "response": "Answer: F", "answer": "F", "kind": "choice", "prompt": SIX},
    ]
    src, out, logs = tmp_path / "samples.jsonl", tmp_path / "graded.jsonl", []
    write_jsonl(src, rows)
    m = grade.run(
        samples=str(src),
        out_graded=str(out),
        params={"letters": "ABCDEFGHIJ", "timeout_s": 1},
        threads=2,
        log=logs.append,
    )
    assert {
        k: m[k]
        for k in (
            "samples",
            "correct",
            "wrong",
            "no_answer",
            "timeout",
            "crashed",
            "gold_unparseable",
        )
    } == {
        "samples": 9,
        "correct": 3,
        "wrong": 1,
        "no_answer": 1,
        "timeout": 1,
        "crashed": 0,
        "gold_unparseable": 3,
    }
    assert m["gold_problems"] == {"m": 1, "q": 1, "unknown": 1}
    assert any(line.startswith("warning: m: 1 problems have a gold") for line in logs)
    graded = read_jsonl(out)
    assert [r["grade"]["status"] for r in graded] == [
        "ok",
        "ok",
        "gold_unparseable",
        "gold_unparseable",
        "timeout",
        "no_answer",
        "ok",
        "gold_unparseable",
        "ok",
    ]
    problems = [r["grade"]["details"]["gold_problem"] for r in graded if r["key"] in "c c2 g"]
    assert problems == [
        "does not parse",
        "parses to 1 (read from '1-\\\\frac{1}{'), not to its whole text",
        "gold 'Z' is not one of the item's letters ABCDEFGHIJ",
    ]
    math_grader, choice_grader = graded[0]["grader"], graded[-1]["grader"]
    assert math_grader["options"]["boxed"] == "last"
    assert all(
        r["grader"] == (math_grader if r["kind"] == "math" else choice_grader) for r in graded
    )
    assert math_grader["name"] == "math-verify"
    assert math_grader["version"] == importlib.metadata.version("math-verify")
    assert (
        math_grader["options"]["timeout_s"] == 1 and math_grader["options"]["float_rounding"] == 6
    )
    assert choice_grader["name"] == "choice" and choice_grader[
        "version"
    ] == importlib.metadata.version("stillroom")
    assert choice_grader["options"]["letters"] == "ABCDEFGHIJ"
    assert m["graders"] == {"math": math_grader, "choice": choice_grader}


def test_grading_stage_rejects_teacher_slips(tmp_path):
    gen, graded = str(tmp_path / "gen.jsonl"), str(tmp_path / "graded.jsonl")
    _generate(_shard(tmp_path), gen)
    m = grade.run(samples=gen, out_graded=graded, params={}, log=lambda _: None)
    rows = read_jsonl(graded)
    for r in rows:  # a procedural answer is correct exactly when it boxes the gold
        assert r["grade"]["correct"] == (f"\\boxed{{{r['answer']}}}" in r["response"])
    assert 0.25 < 1 - m["correct"] / m["samples"] < 0.55  # error_rate 0.4 at low effort
    assert m["status"] == {"ok": len(rows)}


def test_grading_kernel_answers_with_the_validator(tmp_path):
    """Through the grading stage's worker pool: reward 1 is correct; torch code (no program
    computes it: exec 0, rule 0) and a wrong kernel are not; no code block is no answer."""
    rec = kernel_records(["relu"])[0]
    good = ProceduralTeacher("p", {"backend": "procedural"}).complete(rec, "medium", 0, 1).text
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
    m = grade.run(
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
    assert (g[1]["details"]["exec_reward"], g[1]["details"]["rule_reward"]) == (0.0, 0.0)
    assert g[1]["details"]["reasons"][0].startswith("output 0 is not made by the program")
    assert (g[2]["details"]["exec_reward"], g[2]["details"]["compiled"]) == (0.0, True)
    assert m["correct"] == 1 and m["no_answer"] == 1
    info = graded[0]["grader"]
    assert info["name"] == "kernel-validator" and info["options"]["validator"]["trials"] == 2
    assert (
        info["options"]["timeout_s"] > 30
    )  # the pool's limit leaves the validator room to report its own


def test_budget_forced_answers_are_also_graded_as_the_hard_cutoff_leaves_them(tmp_path):
    """The cut at the budget is the first segment: a forced answer's thinking holds no answer, one
    that ended within the budget is the same answer either way."""
    budget = {"budget": 8, "thinking_tokens": 8}
    rows = [
        # still thinking at the budget: forcing closed it and the model answered 7
        {
            "key": "forced",
            "response": "let me think step by step </think> Final: \\boxed{7}",
            "segments": ["let me think step by step", " </think> Final:", " \\boxed{7}"],
            "answer": "7",
            "kind": "math",
            "forced": True,
            **budget,
        },
        # closed its thinking and answered within the budget
        {
            "key": "within",
            "response": "</think> \\boxed{7}",
            "answer": "7",
            "kind": "math",
            "forced": False,
            **budget,
        },
        # no budget: no cutoff grade
        {"key": "plain", "response": "\\boxed{7}", "answer": "7", "kind": "math"},
    ]
    src, out = tmp_path / "samples.jsonl", tmp_path / "graded.jsonl"
    write_jsonl(src, rows)
    m = grade.run(samples=str(src), out_graded=str(out), params={}, log=lambda _: None)
    forced, within, plain = read_jsonl(out)
    assert forced["grade"]["correct"] and not forced["cutoff_grade"]["correct"]
    assert forced["cutoff_grade"]["status"] == "no_answer"
    assert within["grade"]["correct"] and within["cutoff_grade"] == within["grade"]
    assert "cutoff_grade" not in plain
    assert m["samples"] == 3 and m["correct"] == 3  # the cutoff grades are no samples of their own


def test_a_grade_job_s_params_are_eval_s_letters_and_boxed_and_the_validator_s_options():
    exp = Experiment.parse(default_config())
    params = grade.job_params(exp)
    assert (params.letters, params.boxed) == (exp.eval.letters, exp.eval.boxed)
    assert params.seed == exp.seed and params.kernel == ValidatorOptions()
    # no kernels section: the validator's defaults written as none given; timeout_s, which no
    # config key sets, only where a --params gives it
    assert json.loads(params.as_param()) == {
        "seed": exp.seed,
        "letters": exp.eval.letters,
        "boxed": exp.eval.boxed,
        "kernel": {},
    }
    typed = grade.Params.parse({**json.loads(params.as_param()), "timeout_s": 2.5})
    assert json.loads(typed.as_param())["timeout_s"] == 2.5
