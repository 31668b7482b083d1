"""``triton_kernels.tensor_details.ragged_tensor``: ogsgen's ragged metadata under triton_kernels' names."""
from ..._routing import RaggedTensorMetadata, make_ragged_tensor_metadata

__all__ = ["RaggedTensorMetadata", "make_ragged_tensor_metadata"]
