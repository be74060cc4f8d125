"""KernelBook-style rows as kernel SFT examples (stillroom/data/kernelbook.py): rows written here
in the format of GPUMODE/KernelBook (real rows cannot be fetched on this machine). Honest rows are
kept, broken ones dropped with the reward's reasons, a malformed file refused naming its row."""

import json

import pytest

from stillroom.config import ValidatorOptions
from stillroom.config.data import KernelBookSource
from stillroom.data import kernelbook
from stillroom.io import DataError

# The rows imitate KernelBook's columns (python_code, triton_code, entry_point, uuid; the dataset
# card at https://huggingface.co/datasets/GPUMODE/KernelBook) and its triton_code, which is torch
# 2.5 Inductor's output module (kernels, call(args), class <entry_point>New), as in
# https://github.com/pytorch-labs/popcorn-kernels (cleaned_triton/*.py).
RELU_PY = """import torch
import torch.nn as nn


class PlainRelu(nn.Module):

    def __init__(self):
        super().__init__()

    def forward(self, x):
        return torch.relu(x)


def get_inputs():
    return [torch.rand([4, 4, 4, 4]) - 0.5]


def get_init_inputs():
    return [[], {}]
"""

HEAD = """import torch
import triton
import triton.language as tl
from torch._inductor.runtime.triton_heuristics import grid
from torch._C import _cuda_getCurrentRawStream as get_raw_stream
{helpers}import torch.nn as nn
assert_size_stride = torch._C._dynamo.guards.assert_size_stride
empty_strided_cuda = torch._C._dynamo.guards._empty_strided_cuda
"""

RELU_TRITON = """

@triton.jit
def triton_poi_fused_relu_0(in_ptr0, out_ptr0, xnumel, XBLOCK: tl.constexpr):
    xnumel = 256
    xoffset = tl.program_id(0) * XBLOCK
    xindex = xoffset + tl.arange(0, XBLOCK)[:]
    xmask = xindex < xnumel
    x0 = xindex
    tmp0 = tl.load(in_ptr0 + x0, xmask)
    tmp1 = tl.full([1], 0, tl.int32)
    tmp2 = {maximum}(tmp1, tmp0)
    tl.store(out_ptr0 + x0, {stored}, xmask)


def call(args):
    arg0_1, = args
    args.clear()
    assert_size_stride(arg0_1, (4, 4, 4, 4), (64, 16, 4, 1))
    with torch.cuda._DeviceGuard(0):
        torch.cuda.set_device(0)
        buf0 = empty_strided_cuda((4, 4, 4, 4), (64, 16, 4, 1), torch.float32)
        get_raw_stream(0)
        triton_poi_fused_relu_0[grid(256)](arg0_1, buf0, 256, XBLOCK=128, num_warps=4,
            num_stages=1)
        del arg0_1
    return buf0,


class {name}New(nn.Module):

    def __init__(self):
        super().__init__()

    def forward(self, input_0):
        arg0_1 = input_0
        output = call([arg0_1])
        return output[0]
"""

SCALE_PY = """import torch
import torch.nn as nn


class Scale(nn.Module):

    def __init__(self, n, init=1.0):
        super().__init__()
        self.weight = nn.Parameter(torch.full((n,), init))

    def forward(self, x):
        return x * self.weight


def get_inputs():
    return [torch.rand([4, 4, 4, 4])]


def get_init_inputs():
    return [[4], {'init': 0.5}]
"""

SCALE_TRITON = (
    HEAD.format(helpers="")
    + """

@triton.jit
def triton_poi_fused_mul_0(in_ptr0, in_ptr1, out_ptr0, xnumel, XBLOCK: tl.constexpr):
    xnumel = 256
    xoffset = tl.program_id(0) * XBLOCK
    xindex = xoffset + tl.arange(0, XBLOCK)[:]
    xmask = xindex < xnumel
    x2 = xindex
    x0 = xindex % 4
    tmp0 = tl.load(in_ptr0 + x2, xmask)
    tmp1 = tl.load(in_ptr1 + x0, xmask, eviction_policy='evict_last')
    tmp2 = tmp0 * tmp1
    tl.store(out_ptr0 + x2, tmp2, xmask)


def call(args):
    primals_1, primals_2 = args
    args.clear()
    assert_size_stride(primals_1, (4,), (1,))
    assert_size_stride(primals_2, (4, 4, 4, 4), (64, 16, 4, 1))
    with torch.cuda._DeviceGuard(0):
        torch.cuda.set_device(0)
        buf0 = empty_strided_cuda((4, 4, 4, 4), (64, 16, 4, 1), torch.float32)
        get_raw_stream(0)
        triton_poi_fused_mul_0[grid(256)](primals_2, primals_1, buf0, 256, XBLOCK=256,
            num_warps=4, num_stages=1)
        del primals_1
    return buf0, primals_2


class ScaleNew(nn.Module):

    def __init__(self, n, init=1.0):
        super().__init__()
        self.weight = nn.Parameter(torch.full((n,), init))

    def forward(self, input_0):
        primals_1 = self.weight
        primals_2 = input_0
        output = call([primals_1, primals_2])
        return output[0]
"""
)


def relu_row(uuid, name="PlainRelu", helpers=False, stored="tmp2", **extra):
    triton = HEAD.format(
        helpers="from torch._inductor.runtime import triton_helpers\n" if helpers else ""
    ) + RELU_TRITON.format(
        name=name,
        maximum="triton_helpers.maximum" if helpers else "tl.maximum",
        stored=stored,
    )
    return {
        "uuid": uuid,
        "entry_point": name,
        "python_code": RELU_PY.replace("PlainRelu", name),
        "triton_code": triton,
        "repo_name": "example/repo",
        **extra,
    }


ROWS = [
    relu_row(1),  # kept: plain Triton
    {"uuid": 2, "entry_point": "Scale", "python_code": SCALE_PY, "triton_code": SCALE_TRITON},
    relu_row(3, name="InductorRelu", helpers=True),  # triton_helpers.maximum
    relu_row(4, name="WrongRelu", stored="tmp0"),  # stores its input: not a relu
    relu_row(5, name="BrokenRelu", stored="tmp2 +"),  # does not parse
]
KEPT = {"1", "2", "3"}
FAST = ValidatorOptions(trials=1)


def source(path, **extra):
    spec = {"name": "kb", "kind": "kernelbook", "path": str(path), "cases": ["mixed_sign"]}
    return KernelBookSource.parse({**spec, **extra}, where="dataset.sft_sources.0")


def write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_honest_rows_are_kept_and_broken_ones_dropped_with_reasons(tmp_path):
    spec = source(write(tmp_path / "kb.jsonl", ROWS))
    kept, report = kernelbook.grade(spec, FAST, effort="low", threads=2)
    assert {e["id"].split(":")[1] for e in kept} == KEPT, report["outcomes"]
    assert (report["rows"], report["kept"]) == (5, len(KEPT))
    assert report["dropped"] == 5 - len(KEPT) == sum(report["dropped_by_reason"].values())
    outcome = {o["id"]: o for o in report["outcomes"]}
    assert any("elements off" in r for r in outcome["4"]["reasons"]), outcome["4"]
    assert outcome["5"]["reasons"] == ["its Triton does not parse (invalid syntax, line 21)"]
    # the example teaches what was graded: the instruction GRPO asks with, the candidate as answer
    first = next(e for e in kept if e["id"] == "kb:1")
    user, assistant = first["messages"]
    assert "class Model(PlainRelu)" in user["content"]
    assert assistant["content"].startswith("```python\n")
    assert "class ModelNew(PlainReluNew)" in assistant["content"]
    assert "torch.cuda" not in assistant["content"]  # graded on CPU: the CPU's host calls
    assert first["source_record"] == {"file": spec.path, "row": f"{spec.path}:1", "id": "1"}


def test_a_reasoning_column_goes_before_the_code(tmp_path):
    rows = [relu_row(1, why="Relu is a max with zero per element.")]
    spec = source(write(tmp_path / "kb.jsonl", rows), columns={"reasoning": "why"})
    (kept,), _ = kernelbook.grade(spec, FAST, effort="low")
    answer = kept["messages"][1]["content"]
    assert answer.startswith("<think>Relu is a max with zero per element.</think>\n```python\n")


def test_the_candidate_keeps_cuda_host_calls_on_a_gpu():
    code = kernelbook.candidate(ROWS[0], "cuda")
    assert "torch.cuda._DeviceGuard(0)" in code and "device='cuda'" in code
    assert "def grid(*numels)" in code and "def get_raw_stream(index)" in code


def test_a_malformed_file_is_refused_naming_file_row_and_column(tmp_path):
    missing = dict(ROWS[0])
    del missing["triton_code"]
    spec = source(write(tmp_path / "kb.jsonl", [ROWS[1], missing]))
    with pytest.raises(DataError, match=r"kb\.jsonl:2: column 'triton_code' \(triton_code\)"):
        kernelbook.grade(spec, FAST, effort="low")
    torn = tmp_path / "torn.jsonl"
    torn.write_text(json.dumps(ROWS[1]) + "\n" + '{"uuid": 7, "entry_point": \n')
    with pytest.raises(DataError, match=r"torn\.jsonl:2"):
        list(kernelbook.rows(source(torn)))
    bad_name = dict(ROWS[0], entry_point="not a class")
    with pytest.raises(DataError, match=r"kb2\.jsonl:1: column 'entry_point' should name a class"):
        list(kernelbook.rows(source(write(tmp_path / "kb2.jsonl", [bad_name]))))


def test_a_parquet_file_is_read_like_the_hub_rows(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "kb.parquet"
    pq.write_table(pa.Table.from_pylist([ROWS[1], ROWS[0]]), path)
    got = [(where, row["id"]) for where, row in kernelbook.rows(source(path, limit=1))]
    assert got == [(f"{path} row 0", "2")]


def test_a_hub_source_must_pin_its_revision():
    with pytest.raises(Exception, match=r"dataset\.sft_sources\.0\.revision: .* pin"):
        KernelBookSource.parse(
            {"name": "kb", "kind": "kernelbook", "path": "GPUMODE/KernelBook"},
            where="dataset.sft_sources.0",
        )


def test_the_dataset_stage_adds_the_kept_rows_and_reports_the_dropped(tmp_path):
    from stillroom.io import read_jsonl
    from stillroom.stages.dataset import build

    spec = source(write(tmp_path / "kb.jsonl", [ROWS[0], ROWS[3]]))
    params = {
        "default_effort": "low",
        "untagged_fraction": 1.0,
        "effort_tag": "{effort: $effort}",
        "sft_sources": [spec.dump()],
        "kernel": FAST.dump(),
    }
    out = tmp_path / "train.jsonl"
    metrics = build(graded={}, out_dataset=str(out), params=params, log=lambda _: None)
    assert [r["id"] for r in read_jsonl(out)] == ["kb:1"]
    report = metrics["sft_sources"]["kb"]
    assert (report["kept"], report["dropped"]) == (1, 1)
    assert [o["id"] for o in report["outcomes"] if not o["kept"]] == ["4"]
