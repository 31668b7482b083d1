"""``triton_kernels.tensor``: the tensor wrappers (``Tensor``, ``Storage``, the sub-byte dtypes ``FP4`` and ``BIT``,
``Bitmatrix``) and ``wrap_torch_tensor`` / ``convert_layout``, holding ogsgen's storage (``ogsgen.compat._tensor``).
As in triton_kernels <= 3.5 there is no ``SparseMatrix`` here (callers take that as the sign of this
generation)."""
from .._tensor import (BIT, FP4, Bitmatrix, FloatType, IntegerType, Storage, Tensor, bitwidth, convert_layout,
                       wrap_torch_tensor)

__all__ = ["BIT", "FP4", "Bitmatrix", "FloatType", "IntegerType", "Storage", "Tensor", "bitwidth", "convert_layout",
           "wrap_torch_tensor"]
