"""``triton_kernels.numerics_details.mxfp``: ``downcast_to_mxfp`` and ``upcast_from_mxfp`` on ogsgen's kernels."""
from ..._mxfp import DequantScaleRoundingMode, downcast_to_mxfp, upcast_from_mxfp

__all__ = ["DequantScaleRoundingMode", "downcast_to_mxfp", "upcast_from_mxfp"]
