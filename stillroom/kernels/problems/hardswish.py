"""Apply hard-swish elementwise: x * clamp(x + 3, 0, 6) / 6."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return F.hardswish(x)


def get_inputs():
    return [torch.randn(16, 256)]


def get_init_inputs():
    return []
