import torch
import torch.nn as nn


class Model(nn.Module):
    """
    One square matrix product, C = A @ B.
    """

    def __init__(self):
        super().__init__()

    def forward(self, A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
        """
        Args:
            A (torch.Tensor): shape (N, N).
            B (torch.Tensor): shape (N, N).

        Returns:
            torch.Tensor: shape (N, N).
        """
        return torch.matmul(A, B)


N = 2048 * 2


def get_inputs():
    A = torch.rand(N, N)
    B = torch.rand(N, N)
    return [A, B]


def get_init_inputs():
    return []  # nothing to build the model from
