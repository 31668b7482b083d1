"""``triton_kernels.numerics``: the flexpoint scale holders."""
from ...types import InFlexData, OutFlexData

__all__ = ["InFlexData", "OutFlexData"]
