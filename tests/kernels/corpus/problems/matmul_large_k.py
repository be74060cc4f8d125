"""Matrix multiplication with a long reduction dimension: (M, K) @ (K, N) with K much larger than M
and N, the shape split-K kernels are written for."""

import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, a, b):
        return torch.matmul(a, b)


def get_inputs():
    return [torch.randn(24, 512), torch.randn(512, 20)]


def get_init_inputs():
    return []
