"""Every kernel-track problem has a Triton solution that matches the PyTorch reference, and a
``kind: kernels`` source gives the problem files as pool records."""

import os

# the interpreter runs Triton kernels on CPU; it must be chosen before triton is imported
os.environ.setdefault("TRITON_INTERPRET", "1")

import ast
import importlib.util
from pathlib import Path

import pytest
import torch

from stillroom.data.sources import iter_sources
from stillroom.io import DataError
from stillroom.kernels import PROBLEMS_DIR
from stillroom.stages.pool import PoolParams

from ..conftest import KERNEL_PROBLEMS, kernel_records

KERNELS = Path(__file__).resolve().parents[2] / "stillroom" / "kernels"
PROBLEMS = sorted((KERNELS / "problems").glob("*.py"))


def load(path: Path, kind: str):
    spec = importlib.util.spec_from_file_location(f"kernel_{kind}_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_problem_set_is_complete():
    assert len(PROBLEMS) >= 40
    for path in PROBLEMS:
        doc = ast.get_docstring(ast.parse(path.read_text()))
        assert doc and "\n" not in doc.strip(), path.name
        solution = KERNELS / "solutions" / path.name
        assert solution.exists(), path.name
        assert "@triton.jit" in solution.read_text(), path.name


@pytest.mark.slow
@pytest.mark.parametrize("path", PROBLEMS, ids=lambda p: p.stem)
def test_solution_matches_reference(path):
    problem = load(path, "problem")
    solution = load(KERNELS / "solutions" / path.name, "solution")
    torch.manual_seed(0)
    init_inputs = problem.get_init_inputs()
    ref = problem.Model(*init_inputs)
    new = solution.ModelNew(*init_inputs)
    with torch.no_grad():
        # default inits (LayerNorm ones/zeros, BatchNorm mean 0 / var 1) would hide a solution that
        # ignores them
        for tensor in ref.state_dict().values():
            if tensor.is_floating_point():
                tensor.add_(0.1 * torch.randn_like(tensor))
    new.load_state_dict(ref.state_dict())
    for seed in (1, 2):
        torch.manual_seed(seed)
        inputs = problem.get_inputs()
        originals = [x.clone() for x in inputs]
        with torch.no_grad():
            # solution first: an output slot it never writes could otherwise reuse freed memory
            # holding the answer
            got = new(*inputs)
            expected = ref(*[x.clone() for x in originals])
        # every reduction here spans at most a few hundred fp32 terms, so 1e-4 holds despite a
        # different summation order
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)
        for x, original in zip(inputs, originals, strict=False):
            assert torch.equal(x, original), "solution modified its input"


def _sources(*specs):
    return PoolParams.parse({"sources": list(specs), "heldout": {"size": 0}}).sources


def test_kernel_source_keeps_the_file_verbatim_as_prompt_and_gold(tmp_path):
    recs = kernel_records()
    assert [r["meta"] for r in recs] == [{"problem": n, "solution": n} for n in KERNEL_PROBLEMS]
    src = (PROBLEMS_DIR / "softmax_rows.py").read_text()
    rec = recs[1]
    assert rec["kind"] == "kernel" and rec["prompt"] == rec["answer"] == src  # indentation intact
    assert len(kernel_records(None)) == len(list(PROBLEMS_DIR.glob("[!_]*.py"))) >= 40
    with pytest.raises(DataError, match=r"source 'kb': no problem file for \['nope'\]"):
        kernel_records(["relu", "nope"])
    # a directory of one's own problems: no reference solutions
    (tmp_path / "mine.py").write_text(src)
    (tmp_path / "__init__.py").write_text("")
    own = list(
        iter_sources(_sources({"name": "own", "kind": "kernels", "dir": str(tmp_path)}), {}, seed=0)
    )
    assert [r["meta"] for r in own] == [{"problem": "mine"}] and own[0]["prompt"] == src
    with pytest.raises(DataError, match="no problem files"):
        list(
            iter_sources(
                _sources({"name": "own", "kind": "kernels", "dir": str(tmp_path / "none")}),
                {},
                seed=0,
            )
        )
