"""Index (int64) of the maximum value along the dimension dim, removing that dimension."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.dim = dim

    def forward(self, x):
        return torch.argmax(x, dim=self.dim)


def get_inputs():
    return [torch.randn(16, 8, 24)]


def get_init_inputs():
    return [1]
