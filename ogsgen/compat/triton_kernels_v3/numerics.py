"""``triton_kernels.numerics``: the flexpoint scale holders."""
from ..triton_kernels.numerics import InFlexData, OutFlexData

__all__ = ["InFlexData", "OutFlexData"]
