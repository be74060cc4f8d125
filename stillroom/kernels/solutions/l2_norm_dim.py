import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def l2_norm_dim_kernel(x_ptr, out_ptr, R, INNER, BLOCK_R: tl.constexpr, BLOCK_I: tl.constexpr):
    # x is viewed as (outer, R, INNER); each program reduces R for one outer index and a block of INNER
    outer = tl.program_id(0)
    rows = tl.arange(0, BLOCK_R)
    cols = tl.program_id(1) * BLOCK_I + tl.arange(0, BLOCK_I)
    mask = (rows[:, None] < R) & (cols[None, :] < INNER)
    x = tl.load(x_ptr + outer * R * INNER + rows[:, None] * INNER + cols[None, :], mask=mask, other=0.0)
    y = tl.sqrt(tl.sum(x * x, axis=0))
    tl.store(out_ptr + outer * INNER + cols, y, mask=cols < INNER)


class ModelNew(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.dim = dim

    def forward(self, x):
        x = x.contiguous()
        dim = self.dim % x.dim()
        outer, r, inner = x.shape[:dim].numel(), x.shape[dim], x.shape[dim + 1 :].numel()
        out = torch.empty(x.shape[:dim] + x.shape[dim + 1 :], dtype=x.dtype, device=x.device)
        BLOCK_I = min(triton.next_power_of_2(inner), 64)
        grid = (outer, triton.cdiv(inner, BLOCK_I))
        l2_norm_dim_kernel[grid](x, out, r, inner, BLOCK_R=triton.next_power_of_2(r), BLOCK_I=BLOCK_I)
        return out
