import torch
import torch.nn as nn


class Model(nn.Module):
    """
    Inclusive prefix sum along one dimension.

    Parameters:
        dim (int): the dimension scanned.
    """

    def __init__(self, dim):
        super().__init__()
        self.dim = dim

    def forward(self, x):
        """
        Args:
            x (torch.Tensor): shape (batch_size, *input_shape).

        Returns:
            torch.Tensor: the running sums along dim, the shape of x.
        """
        return torch.cumsum(x, dim=self.dim)


# Input sizes and the scanned dimension
batch_size = 32768
input_shape = (32768,)
dim = 1


def get_inputs():
    return [torch.randn(batch_size, *input_shape)]


def get_init_inputs():
    return [dim]
