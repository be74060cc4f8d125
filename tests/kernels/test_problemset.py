"""Every kernel-track problem has a Triton solution that matches the PyTorch reference, and a
``kind: kernels`` source gives the problem files as pool records."""

import os

# the interpreter runs Triton kernels on CPU; it must be chosen before triton is imported
os.environ.setdefault("TRITON_INTERPRET", "1")

import ast
import importlib.util
import json
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


def _own(directory):
    return list(
        iter_sources(
            _sources({"name": "own", "kind": "kernels", "dir": str(directory)}), {}, seed=0
        )
    )


@pytest.mark.parametrize("function", ["get_inputs", "get_init_inputs"])
def test_a_problem_whose_inputs_fail_is_refused_naming_its_file(tmp_path, function):
    src = (PROBLEMS_DIR / "relu.py").read_text()
    path = tmp_path / "broken.py"
    path.write_text(
        src.replace(f"def {function}():", f"def {function}():\n    raise OSError('gone')")
    )
    with pytest.raises(DataError) as err:
        _own(tmp_path)
    assert str(err.value) == (
        f"source 'own': {path}: {function}() fails (OSError: gone); the validator calls it for "
        "every trial"
    )


def test_inputs_the_meta_device_cannot_build_are_built_for_real(tmp_path):
    # .item() has no value on the meta device, where the inputs are tried first
    src = (PROBLEMS_DIR / "relu.py").read_text()
    body = "def get_inputs():\n    n = int(torch.tensor([8]).item())\n    return [torch.randn(n)]\n"
    head, _, tail = src.partition("def get_inputs():")
    (tmp_path / "item.py").write_text(
        head + body + "\n\ndef get_init" + tail.split("def get_init", 1)[1]
    )
    assert [r["meta"] for r in _own(tmp_path)] == [{"problem": "item"}]


def test_a_problem_file_is_read_as_python_reads_it(tmp_path):
    """A BOM and CRLF are valid Python, as is Latin-1 under a coding line; Latin-1 without one
    is not, and its file and line are named."""
    src = (PROBLEMS_DIR / "relu.py").read_text()
    (tmp_path / "bom.py").write_bytes(b"\xef\xbb\xbf" + src.replace("\n", "\r\n").encode())
    assert [(r["meta"], r["prompt"]) for r in _own(tmp_path)] == [({"problem": "bom"}, src)]
    (tmp_path / "bom.py").unlink()
    declared = "# -*- coding: latin-1 -*-\n# caf\xe9\n" + src
    (tmp_path / "coded.py").write_bytes(declared.encode("latin-1"))
    assert [r["prompt"] for r in _own(tmp_path)] == [declared]
    (tmp_path / "coded.py").unlink()
    path = tmp_path / "latin.py"
    path.write_bytes(("# caf\xe9\n" + src).encode("latin-1"))
    with pytest.raises(DataError) as err:
        _own(tmp_path)
    assert str(err.value) == (
        f"source 'own': {path}:1: not UTF-8 text (byte 0xe9 at column 6), which Python reads a "
        "file in unless a coding line (PEP 263) says otherwise"
    )


def test_jsonl_problems_are_named_by_their_line_past_blank_lines(tmp_path):
    src = (PROBLEMS_DIR / "relu.py").read_text()
    path = tmp_path / "kb.jsonl"
    path.write_text(
        json.dumps({"name": "relu", "code": src})
        + "\n\n"
        + json.dumps({"name": "relu", "code": src})
    )
    spec = _sources({"name": "rows", "kind": "kernels", "path": str(path)})
    with pytest.raises(DataError, match=r"kb\.jsonl:3: problem name 'relu' is taken by line 1"):
        list(iter_sources(spec, {}, seed=0))
