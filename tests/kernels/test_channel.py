"""The validator's data channels: regions of one file in a job directory, mapped by the job, so
that the size of an honest kernel's data is bounded by the machine and not by a file-size cap."""

import textwrap

import pytest
import torch

from stillroom.kernels import channel, evaluate


def test_regions_round_trip_and_outputs_must_fit_their_layout(tmp_path):
    x, t, h = torch.randn(3, 5), torch.randint(0, 4, (7,)), torch.randn(4, dtype=torch.bfloat16)
    layout, size = channel.plan([([x, t, 2, h], [x])])
    assert size == 4 * channel.ALIGN and layout[0]["inputs"][2] == {"value": 2}
    channel.create(tmp_path / channel.FILE, size)
    shared = channel.Mapping(tmp_path / channel.FILE, writable=True)
    sent = shared.inputs(layout[0])
    for region, value in zip(sent, [x, t, 2, h], strict=True):
        if isinstance(value, torch.Tensor):
            region.copy_(value)
    # a tensor's storage is its own region, not the whole file
    assert sent[0].untyped_storage().nbytes() == x.numel() * 4
    assert channel.put(shared, layout[0], (x, x)) == "returned 2 output(s), expected 1"
    assert channel.put(shared, layout[0], x.double()) == (
        "output 0 is float64 (3, 5), expected float32 (3, 5)"
    )
    assert channel.put(shared, layout[0], 3) == "output 0 is int, expected a tensor"
    assert channel.put(shared, layout[0], x.t().contiguous().t() * 2) is None
    back = channel.Mapping(tmp_path / channel.FILE, writable=False)
    got = back.inputs(layout[0])
    assert torch.equal(got[0], x) and torch.equal(got[1], t) and torch.equal(got[3], h)
    assert torch.equal(back.tensor(layout[0]["outputs"][0]), x * 2)
    shared.close()
    back.close()


# ReLU at KernelBench's published size, drawn as KernelBench does (torch.rand)
BIG_RELU = textwrap.dedent('''
    """ReLU at KernelBench's size."""
    import torch
    import torch.nn as nn


    class Model(nn.Module):
        def forward(self, x):
            return torch.relu(x)


    def get_inputs():
        return [torch.rand(64, 393216)]


    def get_init_inputs():
        return []
    ''')
# one program per 2^20 elements: few enough programs for Triton's interpreter
BIG_BLOCK_RELU = textwrap.dedent("""
    import torch
    import torch.nn as nn
    import triton
    import triton.language as tl


    @triton.jit
    def relu_kernel(x_ptr, out_ptr, n, per_program, BLOCK: tl.constexpr):
        # each program walks its span block by block: few programs for Triton's interpreter, and a
        # block within the rule reward's limit
        start = tl.program_id(0) * per_program
        for i in range(0, per_program, BLOCK):
            offs = start + i + tl.arange(0, BLOCK)
            mask = offs < n
            x = tl.load(x_ptr + offs, mask=mask)
            tl.store(out_ptr + offs, tl.maximum(x, 0.0), mask=mask)


    class ModelNew(nn.Module):
        def forward(self, x):
            x = x.contiguous()
            out = torch.empty_like(x)
            span = 1 << 20
            relu_kernel[(triton.cdiv(x.numel(), span),)](x, out, x.numel(), span, BLOCK=2048)
            return out
    """)


@pytest.mark.slow
def test_an_honest_kernel_on_384_mib_of_data_earns_full_reward():
    """Inputs and outputs of 384 MiB (trial 0 and the negative case), beyond any file-size cap:
    neither job writes a file; both map their channel."""
    r = evaluate(BIG_RELU, BIG_BLOCK_RELU, trials=1, cases=["negative"], timeout_s=120)
    assert (r.reward, r.status, r.cases) == (1.0, "scored", ["negative"]), r.reasons
