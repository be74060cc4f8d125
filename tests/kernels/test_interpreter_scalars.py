"""A float argument of a kernel is an fp32 scalar, as Triton's compiler makes it: Triton's CPU
interpreter (3.9) hands it to the kernel as a Python float, so the common ``eps.to(tl.float32)``
(Liger's norms, its SwiGLU's gate multiplier) failed under the replay although it compiles."""

from __future__ import annotations

import textwrap

from stillroom.kernels import evaluate

from .test_validator import KERNELS

SCALE_SHIFT = (KERNELS / "problems" / "scale_shift.py").read_text()

CANDIDATE = textwrap.dedent("""
    import torch
    import torch.nn as nn
    import triton
    import triton.language as tl


    @triton.jit
    def scale_shift_kernel(x_ptr, out_ptr, scale, shift, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        x = tl.load(x_ptr + offs, mask=mask)
        y = x * scale.to(tl.float32) + shift
        tl.store(out_ptr + offs, y.to(x.dtype), mask=mask)


    class ModelNew(nn.Module):
        def __init__(self, scale, shift):
            super().__init__()
            self.scale, self.shift = scale, shift

        def forward(self, x):
            x = x.contiguous()
            out = torch.empty_like(x)
            scale_shift_kernel[(triton.cdiv(x.numel(), 256),)](
                x, out, self.scale, self.shift, x.numel(), BLOCK=256
            )
            return out
    """)


def test_a_float_argument_is_an_fp32_scalar_with_tensor_methods():
    r = evaluate(SCALE_SHIFT, CANDIDATE, trials=1, cases=["odd_shape"])
    assert r.reward == 1, r.reasons
