import torch
import torch.nn as nn


class Model(nn.Module):
    """
    diag(A) @ B, without building the N x N diagonal matrix.
    """

    def __init__(self):
        super().__init__()

    def forward(self, A, B):
        """
        Args:
            A (torch.Tensor): the diagonal, shape (N,).
            B (torch.Tensor): shape (N, M).

        Returns:
            torch.Tensor: shape (N, M), row i of B scaled by A[i].
        """
        return A.unsqueeze(1) * B


M = 4096
N = 4096


def get_inputs():
    A = torch.randn(N)
    B = torch.randn(N, M)
    return [A, B]


def get_init_inputs():
    return []
