"""``triton_kernels.topk`` (<= 3.5): ``topk`` returning ``(vals, indx, bitmatrix)``."""
from ...errors import SpecError
from .._routing import select_topk


def topk(x, k, apply_softmax=True, dim=1, return_bitmatrix=True, y_indx=None, n_rows=None):
    """Each row's ``k`` largest entries of ``x`` (or the experts ``y_indx`` names), sorted by expert id: (vals in
    x's dtype, softmaxed over the k with ``apply_softmax``; indx int16; their Bitmatrix). ``ogsgen.moe.select_experts``
    chooses them."""
    if return_bitmatrix is not True:
        raise SpecError("topk: return_bitmatrix must be True (triton_kernels' topk always returns the bitmatrix)")
    return select_topk(x, k, apply_softmax, dim, y_indx, n_rows)
