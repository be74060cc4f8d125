"""Pointwise KL divergence of log-probabilities, unreduced: kl_div(log_q, p, reduction="none"), where
the inputs are a log-softmax and a softmax of random logits (rows of a batch over a vocabulary)."""

import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def forward(self, log_q, p):
        return F.kl_div(log_q, p, reduction="none")


def get_inputs():
    return [torch.randn(16, 120).log_softmax(-1), torch.randn(16, 120).softmax(-1)]


def get_init_inputs():
    return []
