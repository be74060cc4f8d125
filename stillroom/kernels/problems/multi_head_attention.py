"""Multi-head self-attention: a fused linear QKV projection, per-head softmax(q @ k^T / sqrt(head_dim)) @ v, then a linear output projection."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, embed_dim, num_heads):
        super().__init__()
        self.num_heads = num_heads
        self.qkv = nn.Linear(embed_dim, 3 * embed_dim)
        self.proj = nn.Linear(embed_dim, embed_dim)

    def forward(self, x):
        batch, seq, embed = x.shape
        head_dim = embed // self.num_heads
        qkv = self.qkv(x).view(batch, seq, 3, self.num_heads, head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        attn = torch.softmax(torch.matmul(q, k.transpose(-2, -1)) / head_dim**0.5, dim=-1)
        out = torch.matmul(attn, v).transpose(1, 2).reshape(batch, seq, embed)
        return self.proj(out)


def get_inputs():
    return [torch.randn(2, 16, 64)]


def get_init_inputs():
    return [64, 4]
