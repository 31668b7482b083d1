"""``triton_kernels.swiglu``: ``swiglu_fn``, ogsgen's built-in SwiGLU function (``FnSpecs(..., reduction_n=2)``)."""
from ..triton_kernels.swiglu import swiglu_fn

__all__ = ["swiglu_fn"]
