import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def row_loss_kernel(logits_ptr, targets_ptr, loss_ptr, C, BLOCK: tl.constexpr):
    # loss = logsumexp(row) - row[target], with the row max subtracted so exp cannot overflow
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    x = tl.load(logits_ptr + row * C + cols, mask=cols < C, other=float("-inf"))
    row_max = tl.max(x, axis=0)
    lse = row_max + tl.log(tl.sum(tl.exp(x - row_max), axis=0))
    target = tl.load(targets_ptr + row)
    picked = tl.load(logits_ptr + row * C + target)
    tl.store(loss_ptr + row, lse - picked)


@triton.jit
def mean_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(out_ptr, tl.sum(tl.load(x_ptr + offs, mask=offs < n, other=0.0), axis=0) / n)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, logits, targets):
        logits = logits.contiguous()
        targets = targets.contiguous()
        rows, classes = logits.shape
        losses = torch.empty(rows, dtype=logits.dtype, device=logits.device)
        out = torch.empty((), dtype=logits.dtype, device=logits.device)
        row_loss_kernel[(rows,)](logits, targets, losses, classes, BLOCK=triton.next_power_of_2(classes))
        mean_kernel[(1,)](losses, out, rows, BLOCK=triton.next_power_of_2(rows))
        return out
