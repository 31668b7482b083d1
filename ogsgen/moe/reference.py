"""Plain-torch routing reference (synchronizes; for tests): same results as ``routing_from_topk``."""
import torch

from ..types import GatherIndx, RoutingData, ScatterIndx
from .checks import check_expert_ids
from .metadata import make_ragged_tensor_metadata_torch


def routing_from_topk_torch(topk_ids: torch.Tensor, topk_weights: torch.Tensor, n_expts_tot: int):
    check_expert_ids(topk_ids, n_expts_tot)
    n_tokens, n_expts_act = topk_ids.shape
    ids = topk_ids.reshape(-1).tolist()
    weights = topk_weights.reshape(-1).float()
    kept = sorted((expert, gate) for gate, expert in enumerate(ids) if expert >= 0)
    sorted_to_gate = [gate for _, gate in kept] + [-1] * (len(ids) - len(kept))
    gate_to_sorted = [-1] * len(ids)
    for position, (_, gate) in enumerate(kept):
        gate_to_sorted[gate] = position
    device = topk_ids.device
    src = torch.tensor(sorted_to_gate, dtype=torch.int32, device=device)
    dst = torch.tensor(gate_to_sorted, dtype=torch.int32, device=device)
    gate_scal = torch.where(src >= 0, weights[src.clamp_min(0).long()], 0.0)
    hist = torch.bincount(torch.tensor([e for e, _ in kept], dtype=torch.long), minlength=n_expts_tot)
    hist = hist.to(torch.int32).to(device)
    routing_data = RoutingData(gate_scal, hist, n_expts_tot, n_expts_act,
                               expt_data=make_ragged_tensor_metadata_torch(hist, len(ids)))
    return routing_data, GatherIndx(src, dst), ScatterIndx(dst, src)


def routing_torch(logits: torch.Tensor, n_expts_act: int, sm_first: bool = False, expt_indx=None):
    scores = torch.softmax(logits.float(), dim=-1) if sm_first else logits.float()
    if expt_indx is None:
        scores, expt_indx = torch.topk(scores, n_expts_act, dim=-1)
    else:
        scores = scores.gather(1, expt_indx.long())
    expt_indx, order = torch.sort(expt_indx.int(), dim=-1, stable=True)
    scores = scores.gather(1, order)
    if not sm_first:
        scores = torch.softmax(scores, dim=-1)
    return routing_from_topk_torch(expt_indx, scores, logits.shape[1])
