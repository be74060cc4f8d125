import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def batch_norm_kernel(x_ptr, mean_ptr, var_ptr, w_ptr, b_ptr, out_ptr, n, C, HW, eps, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    # NCHW layout: the channel of a flat index is (index // HW) % C
    c = (offs // HW) % C
    x = tl.load(x_ptr + offs, mask=mask)
    mean = tl.load(mean_ptr + c, mask=mask)
    var = tl.load(var_ptr + c, mask=mask)
    w = tl.load(w_ptr + c, mask=mask)
    b = tl.load(b_ptr + c, mask=mask)
    tl.store(out_ptr + offs, (x - mean) * tl.rsqrt(var + eps) * w + b, mask=mask)


class ModelNew(nn.Module):
    def __init__(self, num_features):
        super().__init__()
        self.bn = nn.BatchNorm2d(num_features)

    def forward(self, x):
        x = x.contiguous()
        out = torch.empty_like(x)
        bn = self.bn
        n, c = x.numel(), x.shape[1]
        BLOCK = 1024
        batch_norm_kernel[(triton.cdiv(n, BLOCK),)](
            x, bn.running_mean, bn.running_var, bn.weight, bn.bias, out, n, c, x.shape[2:].numel(), bn.eps, BLOCK=BLOCK
        )
        return out
