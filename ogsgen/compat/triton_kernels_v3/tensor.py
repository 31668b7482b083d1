"""``triton_kernels.tensor`` (upstream main): the tensor wrappers and ``SparseMatrix`` of
``ogsgen.compat.triton_kernels_v36.tensor`` plus ``RaggedTensorMetadata``; ``remap_ragged_tensor_metadata``
(expert parallelism's local view) raises UnsupportedError."""
from ...errors import UnsupportedError
from .._routing import RaggedTensorMetadata, SparseMatrix, make_ragged_tensor_metadata
from .._tensor import (BIT, FP4, Bitmatrix, FloatType, IntegerType, Storage, Tensor, bitwidth, convert_layout,
                       wrap_torch_tensor)

__all__ = ["BIT", "FP4", "Bitmatrix", "FloatType", "IntegerType", "RaggedTensorMetadata", "SparseMatrix", "Storage",
           "Tensor", "bitwidth", "convert_layout", "make_ragged_tensor_metadata", "remap_ragged_tensor_metadata",
           "wrap_torch_tensor"]


def remap_ragged_tensor_metadata(ragged_tensor_metadata, slice_map):
    raise UnsupportedError("remap_ragged_tensor_metadata (one rank's experts of a global routing) has no ogsgen "
                           "counterpart; route a rank's share of the experts with ogsgen.expert_parallel_routing")
