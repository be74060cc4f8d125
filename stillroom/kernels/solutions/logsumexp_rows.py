import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def logsumexp_kernel(x_ptr, out_ptr, N, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + row * N + cols, mask=cols < N, other=float("-inf"))
    # shift by the row max so exp cannot overflow; masked lanes contribute exp(-inf) = 0
    row_max = tl.max(x, axis=0)
    tl.store(out_ptr + row, row_max + tl.log(tl.sum(tl.exp(x - row_max), axis=0)))


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        x = x.contiguous()
        n = x.shape[-1]
        out = torch.empty(x.shape[:-1], dtype=x.dtype, device=x.device)
        logsumexp_kernel[(x.numel() // n,)](x, out, n, BLOCK=triton.next_power_of_2(n))
        return out
