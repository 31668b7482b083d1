"""``triton_kernels.numerics_details.mxfp``: as ``ogsgen.compat.triton_kernels.numerics_details.mxfp``."""
from ..._mxfp import DequantScaleRoundingMode, downcast_to_mxfp, upcast_from_mxfp

__all__ = ["DequantScaleRoundingMode", "downcast_to_mxfp", "upcast_from_mxfp"]
