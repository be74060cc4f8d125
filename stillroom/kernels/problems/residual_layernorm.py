"""Add a residual tensor to x, then apply layer normalisation over the last dimension with a learned weight and bias."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, normalized_shape):
        super().__init__()
        self.norm = nn.LayerNorm(normalized_shape)

    def forward(self, x, residual):
        return self.norm(x + residual)


def get_inputs():
    return [torch.randn(32, 64), torch.randn(32, 64)]


def get_init_inputs():
    return [64]
