"""Single-head scaled dot-product attention: softmax(q @ k^T / sqrt(d)) @ v for batched (B, S, d) inputs."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, q, k, v):
        scores = torch.matmul(q, k.transpose(-2, -1)) / q.shape[-1] ** 0.5
        return torch.matmul(torch.softmax(scores, dim=-1), v)


def get_inputs():
    return [torch.randn(2, 32, 16), torch.randn(2, 32, 16), torch.randn(2, 32, 16)]


def get_init_inputs():
    return []
