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
    # subtracting the row max keeps exp from overflowing; masked lanes become exp(-inf) = 0
    e = tl.exp(x - tl.max(x, axis=0))
    tl.store(out_ptr + row * N + cols, e / tl.sum(e, axis=0), mask=mask)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        x = x.contiguous()
        out = torch.empty_like(x)
        n = x.shape[-1]
        softmax_kernel[(x.numel() // n,)](x, out, n, BLOCK=triton.next_power_of_2(n))
        return out
