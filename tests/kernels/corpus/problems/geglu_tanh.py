"""GELU gating with the tanh-approximated GELU: gelu_tanh(a) * b elementwise."""

import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def forward(self, a, b):
        return F.gelu(a, approximate="tanh") * b


def get_inputs():
    return [torch.randn(16, 256), torch.randn(16, 256)]


def get_init_inputs():
    return []
