"""ogsgen for training and torch.compile: the differentiable, traceable ``matmul_ogs`` (the public one) and the
custom ops behind it."""
from .api import matmul_ogs

__all__ = ["matmul_ogs"]
