import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def log_softmax_kernel(x_ptr, out_ptr, N, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < N
    x = tl.load(x_ptr + row * N + cols, mask=mask, other=float("-inf"))
    # shift by the row max so exp cannot overflow; masked lanes contribute exp(-inf) = 0
    shifted = x - tl.max(x, axis=0)
    lse = tl.log(tl.sum(tl.exp(shifted), axis=0))
    tl.store(out_ptr + row * N + cols, shifted - lse, mask=mask)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        x = x.contiguous()
        out = torch.empty_like(x)
        n = x.shape[-1]
        log_softmax_kernel[(x.numel() // n,)](x, out, n, BLOCK=triton.next_power_of_2(n))
        return out
