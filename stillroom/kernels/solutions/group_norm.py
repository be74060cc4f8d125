import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def group_norm_kernel(x_ptr, w_ptr, b_ptr, out_ptr, G, CPG, HW, eps, BLOCK: tl.constexpr):
    # one program per (sample, group); in NCHW a group is CPG * HW contiguous elements
    pid = tl.program_id(0)
    size = CPG * HW
    idx = tl.arange(0, BLOCK)
    mask = idx < size
    x = tl.load(x_ptr + pid * size + idx, mask=mask, other=0.0)
    mean = tl.sum(x, axis=0) / size
    diff = tl.where(mask, x - mean, 0.0)
    rstd = tl.rsqrt(tl.sum(diff * diff, axis=0) / size + eps)
    c = (pid % G) * CPG + idx // HW
    w = tl.load(w_ptr + c, mask=mask)
    b = tl.load(b_ptr + c, mask=mask)
    tl.store(out_ptr + pid * size + idx, diff * rstd * w + b, mask=mask)


class ModelNew(nn.Module):
    def __init__(self, num_groups, num_channels):
        super().__init__()
        self.gn = nn.GroupNorm(num_groups, num_channels)

    def forward(self, x):
        x = x.contiguous()
        out = torch.empty_like(x)
        gn = self.gn
        n, c = x.shape[0], x.shape[1]
        cpg, hw = c // gn.num_groups, x.shape[2:].numel()
        group_norm_kernel[(n * gn.num_groups,)](
            x, gn.weight, gn.bias, out, gn.num_groups, cpg, hw, gn.eps, BLOCK=triton.next_power_of_2(cpg * hw)
        )
        return out
