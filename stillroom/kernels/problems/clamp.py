"""Clamp every element of x to the range [min_value, max_value]."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, min_value, max_value):
        super().__init__()
        self.min_value = min_value
        self.max_value = max_value

    def forward(self, x):
        return torch.clamp(x, self.min_value, self.max_value)


def get_inputs():
    return [torch.randn(16, 256)]


def get_init_inputs():
    return [-0.5, 0.5]
