"""The generated elementwise family: every templated solution matches its problem on any shape and
value distribution, earns the kernel reward, and reaches the pool, the teacher and the tokenizer."""

import os

# the interpreter runs Triton kernels on CPU; it must be chosen before triton is imported
os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
import torch

from stillroom.data.sources import kernel_records
from stillroom.io import DataError
from stillroom.kernels import evaluate
from stillroom.kernels.family import (
    BINARY,
    SHAPES,
    UNARY,
    problem_names,
    problem_source,
    solution_source,
)
from stillroom.kernels.problemset import kernel_files, problem_count
from stillroom.teachers.kernel import kernel_solution

NAMES = problem_names("elementwise")


def _module(src: str, name: str) -> dict:
    namespace: dict = {"__name__": name}
    exec(compile(src, f"<{name}>", "exec"), namespace)
    return namespace


def test_the_family_is_every_op_at_every_shape():
    assert len(NAMES) == len(set(NAMES)) == (len(UNARY) + len(BINARY)) * len(SHAPES)
    assert "relu_7x33" in NAMES and "maximum_1000" in NAMES
    with pytest.raises(ValueError, match="unknown kernel family 'matmul'"):
        problem_names("matmul")
    with pytest.raises(ValueError, match="'relu_5x5' is not a problem of the elementwise family"):
        problem_source("relu_5x5")


def test_each_kernel_is_named_after_its_op_where_defined_and_launched():
    """The name is the answer's first choice (in the plan) and must agree with the launch: a
    student that defines one name and launches another fails to run, which GRPO learns to avoid."""
    for name in NAMES:
        op = name.rpartition("_")[0]
        src = solution_source(name)
        assert f"def {op}_kernel(" in src and f"        {op}_kernel[(" in src
        reasoning, _ = kernel_solution(problem_source(name), name, 0, family="elementwise")
        assert f"`{op}_kernel`" in reasoning


# one shape per op: the kernel is the same at every shape, and the values below cover the rest
@pytest.mark.slow
@pytest.mark.parametrize("name", [n for n in NAMES if n.endswith("_7x33")])
def test_solution_matches_reference_on_any_shape_and_values(name):
    problem = _module(problem_source(name), f"p_{name}")
    solution = _module(solution_source(name), f"s_{name}")
    ref, new = problem["Model"](), solution["ModelNew"]()
    arity = len(problem["get_inputs"]())
    torch.manual_seed(0)
    cases = [
        problem["get_inputs"](),
        [torch.zeros(5) for _ in range(arity)],  # under one block, all zero
        [torch.randn(3, 1031) * 1e4 for _ in range(arity)],  # several blocks, large magnitude
        [-torch.rand(2, 3, 7) for _ in range(arity)],  # negative only, an odd 3-d shape
    ]
    for inputs in cases:
        originals = [x.clone() for x in inputs]
        with torch.no_grad():
            got = new(*inputs)
            expected = ref(*originals)
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
        assert all(torch.equal(x, o) for x, o in zip(inputs, originals, strict=True))


@pytest.mark.parametrize("name", ["relu6_7x33", "maximum_1000"])
def test_solution_earns_the_kernel_reward(name):
    result = evaluate(
        problem_source(name), solution_source(name), device="cpu", trials=2, timeout_s=60, seed=0
    )
    assert result.correct and result.reward == 1.0, result


def test_family_source_gives_pool_records_the_teacher_answers():
    spec = {"name": "ew", "kind": "kernels", "family": "elementwise"}
    recs = list(kernel_records(spec))
    assert [r["meta"]["problem"] for r in recs] == NAMES and problem_count(spec) == len(NAMES)
    assert all(r["prompt"] == r["answer"] and r["kind"] == "kernel" for r in recs)
    assert recs[0]["meta"] == {"problem": NAMES[0], "solution": NAMES[0], "family": "elementwise"}
    assert kernel_files(spec) == {}  # generated: nothing on disk but the generator
    chosen = list(kernel_records({**spec, "problems": ["add_1000", "neg_16x256"]}))
    assert [r["meta"]["problem"] for r in chosen] == ["add_1000", "neg_16x256"]
    with pytest.raises(DataError, match=r"source 'ew': no problem for \['nope_1000'\]"):
        problem_count({**spec, "problems": ["add_1000", "nope_1000"]})
    rec = chosen[0]
    reasoning, block = kernel_solution(rec["prompt"], "add_1000", 0, family="elementwise")
    assert "`add_kernel`" in reasoning and block == f"```python\n{solution_source('add_1000')}```"
    _, wrong = kernel_solution(rec["prompt"], "add_1000", 0, "wrong", family="elementwise")
    assert "tl.store(out_ptr + offs, 0.5 * y" in wrong
