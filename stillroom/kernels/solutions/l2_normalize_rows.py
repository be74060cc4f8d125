import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def l2_normalize_kernel(x_ptr, out_ptr, N, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < N
    x = tl.load(x_ptr + row * N + cols, mask=mask, other=0.0)
    norm = tl.maximum(tl.sqrt(tl.sum(x * x, axis=0)), eps)
    tl.store(out_ptr + row * N + cols, x / norm, mask=mask)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        x = x.contiguous()
        out = torch.empty_like(x)
        n = x.shape[-1]
        l2_normalize_kernel[(x.numel() // n,)](x, out, n, 1e-12, BLOCK=triton.next_power_of_2(n))
        return out
