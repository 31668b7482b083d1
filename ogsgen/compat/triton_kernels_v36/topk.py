"""``triton_kernels.topk`` (3.6 and later): ``topk`` returning a ``SparseMatrix``."""
from .._routing import topk

__all__ = ["topk"]
