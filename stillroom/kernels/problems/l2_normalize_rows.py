"""Divide each row of a 2-D tensor by its L2 norm, with the norm clamped below at 1e-12."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return F.normalize(x, p=2.0, dim=1)


def get_inputs():
    return [torch.randn(32, 100)]


def get_init_inputs():
    return []
