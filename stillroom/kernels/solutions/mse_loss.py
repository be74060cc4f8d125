import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def mse_kernel(a_ptr, b_ptr, out_ptr, n, BLOCK: tl.constexpr):
    # a single program walks the whole (small) input, so the mean needs no second pass or atomics
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for start in range(0, n, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        mask = offs < n
        diff = tl.load(a_ptr + offs, mask=mask, other=0.0) - tl.load(b_ptr + offs, mask=mask, other=0.0)
        acc += diff * diff
    tl.store(out_ptr, tl.sum(acc, axis=0) / n)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, a, b):
        a = a.contiguous()
        b = b.contiguous()
        out = torch.empty((), dtype=a.dtype, device=a.device)
        mse_kernel[(1,)](a, b, out, a.numel(), BLOCK=1024)
        return out
