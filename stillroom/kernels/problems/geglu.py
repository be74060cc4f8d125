"""GELU gating: gelu(a) * b elementwise, with the exact erf GELU."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, a, b):
        return F.gelu(a) * b


def get_inputs():
    return [torch.randn(16, 256), torch.randn(16, 256)]


def get_init_inputs():
    return []
