"""KernelBench-format problems as a ``kind: kernels`` source: a directory of KernelBench's files
(``kernelbench/``: ten problems at their published sizes) or JSONL rows of their code, each checked
as the pool is built and scaled to ``max_input_elements`` for CPU runs; honest Triton solutions
earn reward 1 on the scaled problems."""

import os

# the interpreter runs Triton kernels on CPU; it must be chosen before triton is imported
os.environ.setdefault("TRITON_INTERPRET", "1")

import json
import re
import types
from pathlib import Path

import pytest
import torch

from stillroom.config import ConfigError
from stillroom.config.data import KernelSource
from stillroom.data.sources import iter_sources
from stillroom.io import DataError
from stillroom.kernels import PROBLEMS_DIR, evaluate
from stillroom.kernels.scaling import scale_problem
from stillroom.stages.pool import PoolParams

FIXTURES = Path(__file__).parent / "kernelbench"
BUDGET = 2**16


def records(**spec):
    spec = {"name": "kb", "kind": "kernels", **spec}
    sources = PoolParams.parse({"sources": [spec], "heldout": {"size": 0}}).sources
    return list(iter_sources(sources, {}, seed=0))


def run(src: str):
    """(total input elements, outputs) of a problem source, built and run as the validator does."""
    module = types.ModuleType("problem")
    exec(compile(src, "problem.py", "exec"), module.__dict__)
    torch.manual_seed(0)
    model = module.Model(*module.get_init_inputs())
    inputs = module.get_inputs()
    with torch.no_grad():
        out = model(*inputs)
    return sum(x.numel() for x in inputs), out


@pytest.fixture(scope="module")
def scaled():
    recs = records(dir=str(FIXTURES), max_input_elements=BUDGET)
    return {r["meta"]["problem"]: r for r in recs}


@pytest.mark.slow
def test_every_kernelbench_file_becomes_a_record_within_the_budget(scaled):
    assert sorted(scaled) == sorted(p.stem for p in FIXTURES.glob("*.py")) and len(scaled) == 10
    for name, rec in scaled.items():
        original = (FIXTURES / f"{name}.py").read_text()
        scale = rec["meta"]["scaled"]
        assert rec["kind"] == "kernel" and rec["prompt"] == rec["answer"], name
        assert "solution" not in rec["meta"], name  # no reference solution outside the project's
        before, after = scale["input_elements"]
        assert before > BUDGET >= after and scale["max_input_elements"] == BUDGET, name
        elements, out = run(rec["prompt"])
        assert elements == after, name
        assert all(t.isfinite().all() for t in ([out] if torch.is_tensor(out) else out)), name
        # only the assignments of the scaled constants changed; comments and layout are intact
        old_lines, new_lines = original.splitlines(), rec["prompt"].splitlines()
        assert len(old_lines) == len(new_lines), name
        changed = {
            a.split("=")[0].strip() for a, b in zip(old_lines, new_lines, strict=True) if a != b
        }
        assert changed == {c.split("[")[0] for c in scale["constants"]}, name

    constants = {name: rec["meta"]["scaled"]["constants"] for name, rec in scaled.items()}
    assert constants["1_Square_matrix_multiplication_"] == {"N": [4096, 128]}
    assert "N = 128\n" in scaled["1_Square_matrix_multiplication_"]["prompt"]  # was 2048 * 2
    # equal sizes are halved together: M and N stay equal, K stays the inner dimension
    assert constants["6_Matmul_with_large_K_dimension_"] == {
        "M": [256, 128],
        "N": [256, 128],
        "K": [524288, 128],
    }
    assert constants["19_ReLU"] == {"batch_size": [4096, 256], "dim": [393216, 192]}
    assert constants["89_cumsum"] == {"batch_size": [32768, 256], "input_shape[0]": [32768, 256]}
    # kernel size, in_channels (at the floor) and out_channels (not an input size) are untouched
    conv = scaled["63_conv_standard_2D__square_input__square_kernel"]["prompt"]
    assert constants["63_conv_standard_2D__square_input__square_kernel"] == {
        "width": [1024, 16],
        "height": [1024, 16],
    }
    assert "kernel_size = 3\n" in conv and "out_channels = 128\n" in conv
    assert "in_channels = 16\n" in conv and "# Test code\n" in conv
    # the reduced dim index stays; an odd size stays odd (boundary masks are still tested)
    reduction = constants["47_Sum_reduction_over_a_dimension"]
    assert "reduce_dim" not in reduction and reduction["dim2"][1] % 2 == 1
    assert "dim = 1\n" in scaled["89_cumsum"]["prompt"]


def test_without_the_knob_files_are_checked_and_kept_verbatim():
    recs = records(dir=str(FIXTURES))
    assert len(recs) == 10
    for rec in recs:
        assert rec["prompt"] == (FIXTURES / f"{rec['meta']['problem']}.py").read_text()
        assert rec["meta"] == {"problem": rec["meta"]["problem"]}
    # a problem within the budget is left as written, its reference solution still named
    (relu,) = records(problems=["relu"], max_input_elements=BUDGET)
    assert relu["meta"] == {"problem": "relu", "solution": "relu"}
    assert relu["prompt"] == (PROBLEMS_DIR / "relu.py").read_text()


def test_jsonl_rows_as_kernelbench_dataset_rows(tmp_path):
    path = tmp_path / "level1.jsonl"
    rows = [
        {"code": (FIXTURES / "19_ReLU.py").read_text(), "name": "19_ReLU", "problem_id": 19},
        {"code": (FIXTURES / "23_Softmax.py").read_text(), "name": "23_Softmax.py", "level": 1},
        {"code": (FIXTURES / "89_cumsum.py").read_text()},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    recs = records(path=str(path), max_input_elements=BUDGET)
    assert [r["meta"]["problem"] for r in recs] == ["19_ReLU", "23_Softmax", "row3"]
    assert recs[0]["meta"]["problem_id"] == 19 and recs[1]["meta"]["level"] == 1
    assert recs[0]["meta"]["scaled"]["constants"] == {
        "batch_size": [4096, 256],
        "dim": [393216, 192],
    }
    picked = records(path=str(path), problems=["row3", "19_ReLU"])
    assert [r["meta"]["problem"] for r in picked] == ["row3", "19_ReLU"]
    assert picked[1]["prompt"] == rows[0]["code"]  # no knob: the code as given
    with pytest.raises(DataError, match=r"no row named for \['20_LeakyReLU'\]"):
        records(path=str(path), problems=["20_LeakyReLU"])


def _bad_dir(tmp_path, name: str, src: str) -> Path:
    (tmp_path / f"{name}.py").write_text(src)
    return tmp_path


RELU = (FIXTURES / "19_ReLU.py").read_text()


@pytest.mark.parametrize(
    ("src", "error"),
    [
        (RELU.replace("class Model(", "class Net("), r"missing: Model$"),
        (RELU.replace("def get_inputs(", "def make_inputs("), r"missing: get_inputs$"),
        (RELU.replace("def get_init_inputs(", "def init_inputs("), r"missing: get_init_inputs$"),
        (RELU.replace("batch_size = 4096", "batch_size = = 4096"), r"not valid Python \(line 24"),
    ],
    ids=["no Model", "no get_inputs", "no get_init_inputs", "syntax error"],
)
def test_a_bad_file_is_named(tmp_path, src, error):
    root = _bad_dir(tmp_path, "19_ReLU", src)
    where = re.escape(str(root / "19_ReLU.py"))
    with pytest.raises(DataError, match=rf"source 'kb': {where}: .*{error}"):
        records(dir=str(root))


def test_a_bad_jsonl_row_is_named(tmp_path):
    path = tmp_path / "rows.jsonl"
    where = re.escape(str(path))
    path.write_text(json.dumps({"code": RELU, "name": "a"}) + "\n" + json.dumps({"name": "b"}))
    with pytest.raises(DataError, match=rf"{where}:2: key 'code' must hold the problem file's"):
        records(path=str(path))
    path.write_text(json.dumps({"code": RELU, "name": "a"}) + "\n" + json.dumps({"code": "x = ("}))
    with pytest.raises(DataError, match=rf"{where}:2 \(row2\): not valid Python"):
        records(path=str(path))
    path.write_text("\n".join(json.dumps({"code": RELU, "name": "a"}) for _ in range(2)))
    with pytest.raises(DataError, match=rf"{where}:2: problem name 'a' is taken by line 1"):
        records(path=str(path))


def test_a_problem_that_cannot_be_scaled_or_run_is_named(tmp_path):
    conv = FIXTURES / "63_conv_standard_2D__square_input__square_kernel.py"
    with pytest.raises(
        DataError,
        match=rf"{re.escape(str(conv))}: cannot scale to max_input_elements 1000: "
        r"get_inputs\(\) still gives 65536 elements with the constants that size it "
        r"\(batch_size, height, in_channels, width\) at their floor",
    ):
        records(dir=str(FIXTURES), problems=[conv.stem], max_input_elements=1000)
    literal = RELU.replace("torch.randn(batch_size, dim)", "torch.randn(4096, 4096)")
    root = _bad_dir(tmp_path, "literal", literal)
    with pytest.raises(DataError, match="no module-level integer constant of it sizes the inputs"):
        records(dir=str(root), max_input_elements=BUDGET)
    (root / "literal.py").write_text(RELU.replace("torch.relu(x)", "torch.log(x - 100)"))
    with pytest.raises(DataError, match=r"literal.py: output 0 has non-finite values"):
        records(dir=str(root), max_input_elements=BUDGET)
    # sizes are measured on the meta device; the scaled problem still has to run for real
    fails = RELU.replace("return torch.relu(x)", "assert x.is_meta, 'boom'\n        return x")
    (root / "literal.py").write_text(fails)
    with pytest.raises(
        DataError,
        match=r"literal.py: Model\(\*get_init_inputs\(\)\)\(\*get_inputs\(\)\) fails at the",
    ):
        records(dir=str(root), max_input_elements=BUDGET)


def test_every_assignment_form_is_scaled_in_place():
    src = """import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x, y):
        return x + y.sum()


σ = 1.0; rows = 2048  # the batch
height = width = 2**9
h2, w2 = 64, 1 << 6
channels: int = 3
depth: int = (
    16 * 3
)
area = height * width


def get_inputs():
    return [torch.randn(rows, channels, height, width), torch.randn(h2, w2, depth)]


def get_init_inputs():
    return []
"""
    out = scale_problem(src, 2**15, "mine.py")
    # the largest first, equal ones together: rows and height = width from 512, then h2, w2, depth
    assert out.constants == {
        "rows": [2048, 16],
        "height": [512, 16],
        "width": [512, 16],
        "h2": [64, 16],
        "w2": [64, 16],
        "depth": [48, 24],
    }
    assert out.elements == (2048 * 3 * 512 * 512 + 64 * 64 * 48, 16 * 3 * 16 * 16 + 16 * 16 * 24)
    # by UTF-8 byte columns (σ is two bytes), across lines, every other character as written
    assert out.src == (
        src.replace("rows = 2048", "rows = 16")
        .replace("width = 2**9", "width = 16")
        .replace("64, 1 << 6", "16, 16")
        .replace("16 * 3\n", "24\n")
    )
    assert "area = height * width\n" in out.src  # a computed constant follows its parts


def test_config_takes_one_of_dir_and_path():
    with pytest.raises(ConfigError, match="dir and path: give one"):
        KernelSource.parse({"name": "k", "kind": "kernels", "dir": "d", "path": "p.jsonl"})
    with pytest.raises(ConfigError, match="path"):
        KernelSource.parse({"name": "k", "kind": "kernels", "path": "p.csv"})
    with pytest.raises(ConfigError, match="max_input_elements"):
        KernelSource.parse({"name": "k", "kind": "kernels", "max_input_elements": 0})


RELU_SOLUTION = """
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def relu_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.maximum(tl.load(x_ptr + offs, mask=mask), 0.0), mask=mask)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        x = x.contiguous()
        out = torch.empty_like(x)
        relu_kernel[(triton.cdiv(x.numel(), 1024),)](x, out, x.numel(), BLOCK=1024)
        return out
"""

# one program per row, the whole row in one block: the scaled sizes fit a block
SOFTMAX_SOLUTION = """
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def softmax_kernel(x_ptr, out_ptr, N, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < N
    x = tl.load(x_ptr + row * N + cols, mask=mask, other=float("-inf"))
    e = tl.exp(x - tl.max(x, axis=0))
    tl.store(out_ptr + row * N + cols, e / tl.sum(e, axis=0), mask=mask)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        x = x.contiguous()
        out = torch.empty_like(x)
        n = x.shape[1]
        softmax_kernel[(x.shape[0],)](x, out, n, BLOCK=triton.next_power_of_2(n))
        return out
"""

CUMSUM_SOLUTION = """
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def cumsum_kernel(x_ptr, out_ptr, N, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < N
    x = tl.load(x_ptr + row * N + cols, mask=mask, other=0.0)
    tl.store(out_ptr + row * N + cols, tl.cumsum(x, axis=0), mask=mask)


class ModelNew(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.dim = dim

    def forward(self, x):
        # the problem scans dim 1 of a 2-D input: its rows
        x = x.contiguous()
        out = torch.empty_like(x)
        n = x.shape[1]
        cumsum_kernel[(x.shape[0],)](x, out, n, BLOCK=triton.next_power_of_2(n))
        return out
"""


@pytest.mark.slow
@pytest.mark.parametrize(
    ("name", "solution"),
    [("19_ReLU", RELU_SOLUTION), ("23_Softmax", SOFTMAX_SOLUTION), ("89_cumsum", CUMSUM_SOLUTION)],
    ids=["relu", "softmax", "cumsum"],
)
def test_an_honest_triton_solution_earns_1_on_the_scaled_problem(scaled, name, solution):
    r = evaluate(scaled[name]["answer"], solution, device="cpu", trials=2, timeout_s=120)
    assert r.reward == 1.0, r.reasons
