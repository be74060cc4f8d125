import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def causal_attention_kernel(q_ptr, k_ptr, v_ptr, out_ptr, S, D, scale, BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr):
    # one program per batch entry: the whole (S, S) score tile fits in one block at these sizes
    base = tl.program_id(0) * S * D
    rows = tl.arange(0, BLOCK_S)
    dims = tl.arange(0, BLOCK_D)
    tile = rows[:, None] * D + dims[None, :]
    tile_mask = (rows[:, None] < S) & (dims[None, :] < D)
    q = tl.load(q_ptr + base + tile, mask=tile_mask, other=0.0)
    v = tl.load(v_ptr + base + tile, mask=tile_mask, other=0.0)
    # load k already transposed to (D, S)
    kt = tl.load(k_ptr + base + rows[None, :] * D + dims[:, None], mask=(dims[:, None] < D) & (rows[None, :] < S), other=0.0)
    scores = tl.dot(q, kt, input_precision="ieee") * scale
    # key j is visible to query i only when j <= i (and j is a real position)
    keep = (rows[None, :] <= rows[:, None]) & (rows[None, :] < S)
    scores = tl.where(keep, scores, float("-inf"))
    p = tl.exp(scores - tl.max(scores, axis=1)[:, None])
    p = p / tl.sum(p, axis=1)[:, None]
    tl.store(out_ptr + base + tile, tl.dot(p, v, input_precision="ieee"), mask=tile_mask)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, q, k, v):
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        seq, dim = q.shape[-2], q.shape[-1]
        out = torch.empty_like(q)
        causal_attention_kernel[(q.numel() // (seq * dim),)](
            q, k, v, out, seq, dim, dim**-0.5, BLOCK_S=triton.next_power_of_2(seq), BLOCK_D=triton.next_power_of_2(dim)
        )
        return out
