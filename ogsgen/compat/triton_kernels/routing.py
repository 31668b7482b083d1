"""``triton_kernels.routing``: top-k routing into ``(RoutingData, GatherIndx, ScatterIndx)``, from logits
(``routing``) or from top-k choices and their bitmatrix (``routing_from_bitmatrix``)."""
from ...errors import UnsupportedError
from ...moe import routing as _routing
from ...types import GatherIndx, RoutingData, ScatterIndx
from .._routing import routing_from_bitmatrix

__all__ = ["GatherIndx", "RoutingData", "ScatterIndx", "routing", "routing_from_bitmatrix"]


def routing(logits, n_expts_act, sm_first=False, expt_indx=None, simulated_ep=1, n_rows=None):
    """triton_kernels' ``routing``: ``ogsgen.routing`` (the same sorted order, gate weights and index pairs)."""
    if simulated_ep != 1:
        raise UnsupportedError("routing: simulated_ep (expert parallelism simulated on one GPU) has no ogsgen "
                               "counterpart; leave it 1 (for real expert parallelism: ogsgen.routing_from_topk with "
                               "non-local experts as -1)")
    if n_rows is not None:
        raise UnsupportedError("routing: n_rows (route only the first rows of logits) has no ogsgen counterpart; "
                               "pass logits[:n_rows]")
    return _routing(logits, n_expts_act, sm_first=sm_first, expt_indx=expt_indx)
