import torch
import torch.nn as nn


class Model(nn.Module):
    """
    Elementwise ReLU.
    """

    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """
        Args:
            x (torch.Tensor): any shape.

        Returns:
            torch.Tensor: max(x, 0), the shape of x.
        """
        return torch.relu(x)


batch_size = 4096
dim = 393216


def get_inputs():
    x = torch.randn(batch_size, dim)
    return [x]


def get_init_inputs():
    return []
