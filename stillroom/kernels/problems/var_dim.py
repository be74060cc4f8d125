"""Unbiased variance (divide by n - 1) of a tensor over the dimension dim, removing that dimension."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.dim = dim

    def forward(self, x):
        return torch.var(x, dim=self.dim)


def get_inputs():
    return [torch.randn(32, 64)]


def get_init_inputs():
    return [-1]
