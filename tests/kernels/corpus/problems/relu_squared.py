"""Squared ReLU elementwise: relu(x) ** 2."""

import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return torch.relu(x).square()


def get_inputs():
    return [torch.randn(16, 256)]


def get_init_inputs():
    return []
