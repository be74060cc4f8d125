"""Group normalisation of an NCHW tensor: channels split into groups, each (sample, group) normalised to zero mean and unit variance, then a per-channel weight and bias."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, num_groups, num_channels):
        super().__init__()
        self.gn = nn.GroupNorm(num_groups, num_channels)

    def forward(self, x):
        return self.gn(x)


def get_inputs():
    return [torch.randn(2, 16, 8, 8)]


def get_init_inputs():
    return [4, 16]
