"""Log-sigmoid elementwise: log(1 / (1 + exp(-x)))."""

import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def forward(self, x):
        return F.logsigmoid(x)


def get_inputs():
    return [torch.randn(16, 256)]


def get_init_inputs():
    return []
