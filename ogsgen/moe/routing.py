"""From router logits (or top-k ids and weights computed elsewhere) to RoutingData, GatherIndx, ScatterIndx.

Gate ``g = token * k + slot`` is one (token, expert) pair. Gates are sorted by expert, stably, so
the rows of each expert are contiguous and keep token order. ``GatherIndx.src_indx[p]`` is the gate
at sorted position ``p`` and ``ScatterIndx.src_indx[g]`` the sorted position of gate ``g``; dropped
gates (expert id -1) have no position: they are -1 there and -1 fills the tail of the sorted order.

Everything here runs on the device without host synchronization: torch's top-k, sort and scatter,
and Triton kernels for the histogram and the ragged metadata.
"""
from __future__ import annotations

import torch

from ..devices import check_kernel_device
from ..errors import SpecError, SpecTypeError
from ..types import GatherIndx, RoutingData, ScatterIndx
from .checks import check_expert_ids, host_checks_apply
from .metadata import (MAX_EXPERTS, RaggedTensorMetadata, check_row_count, expert_histogram,
                       make_ragged_tensor_metadata)


def _check_topk_inputs(topk_ids, topk_weights, n_expts_tot, expected_tokens_per_expt):
    if not isinstance(topk_ids, torch.Tensor) or topk_ids.ndim != 2:
        raise SpecError(f"topk_ids must be a (n_tokens, k) tensor, got "
                        f"{tuple(topk_ids.shape) if isinstance(topk_ids, torch.Tensor) else type(topk_ids).__name__}")
    if topk_ids.dtype not in (torch.int16, torch.int32, torch.int64):
        raise SpecError(f"topk_ids must hold integer expert ids, got {topk_ids.dtype}")
    if topk_ids.shape[1] < 1:
        raise SpecError(f"topk_ids must hold at least one expert per token (k >= 1), got shape {tuple(topk_ids.shape)}")
    if not isinstance(topk_weights, torch.Tensor) or topk_weights.shape != topk_ids.shape:
        raise SpecError(f"topk_weights must be a tensor of topk_ids' shape {tuple(topk_ids.shape)}, got "
                        f"{tuple(topk_weights.shape) if isinstance(topk_weights, torch.Tensor) else topk_weights!r}")
    if not topk_weights.dtype.is_floating_point:
        raise SpecError(f"topk_weights must be floating point gate weights, got {topk_weights.dtype}")
    if topk_weights.device != topk_ids.device:
        raise SpecError(f"topk_weights is on {topk_weights.device} but topk_ids is on {topk_ids.device}")
    if not isinstance(n_expts_tot, int) or isinstance(n_expts_tot, bool) or n_expts_tot < 1:
        raise SpecError(f"n_expts_tot must be a positive int, got {n_expts_tot!r}")
    if n_expts_tot > MAX_EXPERTS:
        raise SpecError(f"n_expts_tot={n_expts_tot} is more experts than ogsgen's block schedule holds "
                        f"({MAX_EXPERTS})")
    if expected_tokens_per_expt is not None and (not isinstance(expected_tokens_per_expt, int)
                                                 or isinstance(expected_tokens_per_expt, bool)
                                                 or expected_tokens_per_expt < 1):
        raise SpecError(f"expected_tokens_per_expt must be None or a positive int, got {expected_tokens_per_expt!r}")
    check_kernel_device(topk_ids, "topk_ids")


def routing_from_topk(topk_ids: torch.Tensor, topk_weights: torch.Tensor, n_expts_tot: int,
                      expected_tokens_per_expt: int | None = None):
    """Routing for top-k choices made elsewhere (vLLM, expert parallelism).

    topk_ids: (n_tokens, k) expert ids in [0, n_expts_tot), -1 for a dropped or non-local expert; any k. Other ids
    raise SpecError on the CPU and with OGSGEN_DEBUG=1; on a GPU they fail a device assert (no host sync).
    topk_weights: (n_tokens, k) gate weights, become ``RoutingData.gate_scal`` (float32) in sorted order.
    """
    _check_topk_inputs(topk_ids, topk_weights, n_expts_tot, expected_tokens_per_expt)
    n_tokens, n_expts_act = topk_ids.shape
    device = topk_ids.device
    # In the caller's integer dtype: range-checked before anything narrows it. The histogram kernels read its memory:
    # a lazily negated view (torch._neg_view) is resolved to a copy holding its values.
    ids = topk_ids.resolve_neg().reshape(-1)
    n_gates = ids.numel()
    check_row_count(n_gates, "topk_ids.numel()")
    if host_checks_apply(ids):
        check_expert_ids(topk_ids, n_expts_tot)
    valid = ids >= 0
    # Dropped gates sort after every expert (key E), then get no position.
    keys = torch.where(valid, ids, n_expts_tot)
    sorted_to_gate = torch.argsort(keys, stable=True).to(torch.int32)
    gate_to_sorted = torch.empty_like(sorted_to_gate)
    gate_to_sorted.scatter_(0, sorted_to_gate.long(), torch.arange(n_gates, dtype=torch.int32, device=device))
    sorted_valid = valid.gather(0, sorted_to_gate.long())
    sorted_to_gate = torch.where(sorted_valid, sorted_to_gate, -1)
    gate_to_sorted = torch.where(valid, gate_to_sorted, -1)
    weights = topk_weights.reshape(-1).float()
    gate_scal = torch.where(sorted_valid, weights.gather(0, sorted_to_gate.clamp_min(0).long()), 0.0)
    if torch.compiler.is_compiling():  # the kernels as one custom op, which torch.compile traces
        hist, *meta = torch.ops.ogsgen.routing_metadata(ids, n_expts_tot, n_gates)
        meta = RaggedTensorMetadata(hist, *meta)
    else:
        hist = expert_histogram(ids, n_expts_tot)  # asserts the ids' range on the device
        meta = make_ragged_tensor_metadata(hist, n_gates)
    routing_data = RoutingData(gate_scal, hist, n_expts_tot, n_expts_act, expt_data=meta,
                               expected_tokens_per_expt=expected_tokens_per_expt)
    return (routing_data, GatherIndx(src_indx=sorted_to_gate, dst_indx=gate_to_sorted),
            ScatterIndx(src_indx=gate_to_sorted, dst_indx=sorted_to_gate))


def expert_parallel_routing(topk_ids: torch.Tensor, topk_weights: torch.Tensor, n_expts_tot: int, rank: int,
                            world_size: int, expected_tokens_per_expt: int | None = None):
    """Routing of one rank's share of the experts under expert parallelism: experts ``[rank * E / world_size,
    (rank + 1) * E / world_size)`` (an even split of ``n_expts_tot``) get their local ids, every other gate -1 (not
    computed here; its row is another rank's). Returns ``routing_from_topk`` of the local ids over the local
    experts; the local expert e holds global expert ``rank * E / world_size + e``."""
    for name, value in (("rank", rank), ("world_size", world_size)):
        if not isinstance(value, int) or isinstance(value, bool):
            raise SpecTypeError(f"{name} must be an int, got {value!r}")
    if world_size < 1 or not 0 <= rank < world_size or n_expts_tot % world_size:
        raise SpecError(f"expert parallelism splits n_expts_tot={n_expts_tot} experts evenly over world_size="
                        f"{world_size} ranks: world_size must divide it and rank be in [0, world_size), got rank "
                        f"{rank}")
    local = n_expts_tot // world_size
    first = rank * local
    if not isinstance(topk_ids, torch.Tensor):
        raise SpecError(f"topk_ids must be a (n_tokens, k) tensor, got {type(topk_ids).__name__}")
    mine = (topk_ids >= first) & (topk_ids < first + local)
    return routing_from_topk(torch.where(mine, topk_ids - first, -1), topk_weights, local, expected_tokens_per_expt)


def routing(logits: torch.Tensor, n_expts_act: int, sm_first: bool = False, expt_indx: torch.Tensor | None = None):
    """Top-``n_expts_act`` routing of router ``logits`` (n_tokens, E).

    Each token's experts are sorted by id; gate weights are the softmax over the selected logits
    (``sm_first``: the softmax over all logits, taken before the top-k), float32 whatever the logits' dtype (what
    ``matmul_ogs`` takes as gammas). ``expt_indx`` (n_tokens, k) gives the experts instead of the top-k.
    """
    expt_indx, scores = select_experts(logits, n_expts_act, sm_first, expt_indx)
    if not sm_first:
        scores = torch.softmax(scores, dim=-1)
    return routing_from_topk(expt_indx, scores, logits.shape[1])


def select_experts(logits: torch.Tensor, n_expts_act: int, sm_first: bool = False,
                   expt_indx: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``routing``'s choice of experts: (expert ids (n_tokens, n_expts_act) int32, sorted by id within each token;
    their logits as float32, or with ``sm_first`` their entries of the softmax over each whole row of logits)."""
    if not isinstance(logits, torch.Tensor) or logits.ndim != 2:
        raise SpecError("logits must be a (n_tokens, n_expts_tot) tensor")
    if not logits.dtype.is_floating_point:
        raise SpecError(f"logits must be floating point, got {logits.dtype}")
    check_kernel_device(logits, "logits")
    n_expts_tot = logits.shape[1]
    if not isinstance(n_expts_act, int) or isinstance(n_expts_act, bool):
        raise SpecTypeError(f"n_expts_act must be an int in [1, n_expts_tot={n_expts_tot}] (the experts per token), "
                            f"got {n_expts_act!r}")
    if not 1 <= n_expts_act <= n_expts_tot:
        raise SpecError(f"n_expts_act must be an int in [1, n_expts_tot={n_expts_tot}], got {n_expts_act!r}")
    scores = torch.softmax(logits.float(), dim=-1) if sm_first else logits.float()
    if expt_indx is None:
        scores, expt_indx = torch.topk(scores, n_expts_act, dim=-1)
    else:
        if not isinstance(expt_indx, torch.Tensor):
            raise SpecTypeError(f"expt_indx must be None or a (n_tokens, k) tensor of expert ids, got "
                                f"{type(expt_indx).__name__}")
        if tuple(expt_indx.shape) != (logits.shape[0], n_expts_act):
            raise SpecError(f"expt_indx must have shape ({logits.shape[0]}, {n_expts_act}), "
                            f"got {tuple(expt_indx.shape)}")
        if expt_indx.dtype not in (torch.int16, torch.int32, torch.int64) or expt_indx.device != logits.device:
            raise SpecError(f"expt_indx must hold integer expert ids on {logits.device}, got {expt_indx.dtype} on "
                            f"{expt_indx.device}")
        if host_checks_apply(expt_indx):
            check_expert_ids(expt_indx, n_expts_tot, "expt_indx", dropped=False)
        scores = scores.gather(1, expt_indx.long())
    expt_indx, order = torch.sort(expt_indx.to(torch.int32), dim=-1, stable=True)
    return expt_indx, scores.gather(1, order)
