"""``triton_kernels.swiglu``: ``swiglu_fn``, the fused SwiGLU activation's Triton function (ogsgen's built-in, which
computes the same interleaved gate/linear SwiGLU with ``alpha`` and ``limit``)."""
from ...spec.builtins import swiglu

swiglu_fn = swiglu.fn

__all__ = ["swiglu_fn"]
