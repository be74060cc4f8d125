"""Dynamic tanh (DyT), a normalisation-free layer: gamma * tanh(alpha * x) + beta over the last
dimension, with a learned scalar alpha and per-feature gamma and beta."""

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, hidden_size, init_alpha):
        super().__init__()
        self.alpha = nn.Parameter(torch.full((1,), init_alpha))
        self.gamma = nn.Parameter(torch.ones(hidden_size))
        self.beta = nn.Parameter(torch.zeros(hidden_size))

    def forward(self, x):
        return self.gamma * torch.tanh(self.alpha * x) + self.beta


def get_inputs():
    return [torch.randn(16, 200)]


def get_init_inputs():
    return [200, 0.5]
