"""``triton_kernels.tensor`` (3.6): the tensor wrappers of ``ogsgen.compat.triton_kernels.tensor`` plus the routing
path that replaced the ``routing`` module: ``SparseMatrix`` (``topk``'s result, with its ``mask_metadata``) and
``make_ragged_tensor_metadata``."""
from .._routing import RaggedTensorMetadata, SparseMatrix, make_ragged_tensor_metadata
from .._tensor import (BIT, FP4, Bitmatrix, FloatType, IntegerType, Storage, Tensor, bitwidth, convert_layout,
                       wrap_torch_tensor)

__all__ = ["BIT", "FP4", "Bitmatrix", "FloatType", "IntegerType", "RaggedTensorMetadata", "SparseMatrix", "Storage",
           "Tensor", "bitwidth", "convert_layout", "make_ragged_tensor_metadata", "wrap_torch_tensor"]
