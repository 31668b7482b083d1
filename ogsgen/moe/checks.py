"""Checks of routing data that read it back to the host (a synchronization).

A GPU call checks the shapes, dtypes and devices of its routing arguments, and the routing kernels assert on the
device that expert ids lie in [-1, E) and that a histogram has no negative count and fits the call's rows. What
only the host can afford to check (indices in range, the histogram against the indices, the metadata against the
histogram) runs on a GPU with ``OGSGEN_DEBUG=1`` (read when ogsgen is imported), and always on the CPU (Triton's
interpreter), where reading back costs nothing and a bad index would crash the process.
"""
from __future__ import annotations

import os

import torch

from ..errors import SpecError
from .metadata import make_ragged_tensor_metadata_torch

DEBUG = os.environ.get("OGSGEN_DEBUG", "0") == "1"


def host_checks_apply(tensor: torch.Tensor) -> bool:
    """Whether the synchronizing checks run for routing data on ``tensor``'s device (not in a graph torch.compile
    traces: there the kernels' device asserts check the routing)."""
    return (DEBUG or tensor.device.type != "cuda") and not torch.compiler.is_compiling()


def _first(bad: torch.Tensor) -> tuple:
    return tuple(int(i) for i in bad.nonzero()[0])


def check_expert_ids(ids: torch.Tensor, n_expts_tot: int, name: str = "topk_ids", dropped: bool = True) -> None:
    """Every id in [0, n_expts_tot), or -1 (a dropped or non-local gate) where ``dropped``."""
    lowest = -1 if dropped else 0
    bad = (ids < lowest) | (ids >= n_expts_tot)
    if bad.any():
        at = _first(bad)
        raise SpecError(f"{name}{list(at)} = {int(ids[at])} is not an expert id: ids must lie in [{lowest}, "
                        f"n_expts_tot={n_expts_tot})" + (" (-1 marks a dropped gate)" if dropped else ""))


def _check_index_range(index: torch.Tensor, name: str, n_rows: int) -> None:
    bad = (index < -1) | (index >= n_rows)
    if bad.any():
        at = _first(bad)[0]
        raise SpecError(f"{name}[{at}] = {int(index[at])} is outside [-1, {n_rows}) (the call's {n_rows} gates); "
                        f"build the indices with ogsgen.routing or ogsgen.routing_from_topk")


def check_routing_data(routing_data, n_rows: int, gather_indx=None, scatter_indx=None) -> None:
    """Check a MoE call's histogram, indices and metadata against each other for ``n_rows`` sorted rows (gates)."""
    hist = routing_data.expt_hist.long()
    if (hist < 0).any():
        expert = _first(hist < 0)[0]
        raise SpecError(f"routing_data.expt_hist[{expert}] = {int(hist[expert])}: a histogram counts rows, >= 0")
    n_routed = int(hist.sum())
    if n_routed > n_rows:
        raise SpecError(f"routing_data.expt_hist sums to {n_routed} rows, more than the call's {n_rows} sorted rows; "
                        f"the histogram does not describe these rows")
    for name, index in (("gather_indx", gather_indx), ("scatter_indx", scatter_indx)):
        if index is None:
            continue
        # src_indx/dst_indx name the two directions differently in a gather and a scatter
        sorted_name, gate_name = ("src_indx", "dst_indx") if name == "gather_indx" else ("dst_indx", "src_indx")
        sorted_to_gate, gate_to_sorted = getattr(index, sorted_name), getattr(index, gate_name)
        _check_index_range(sorted_to_gate, f"{name}.{sorted_name}", n_rows)
        _check_index_range(gate_to_sorted, f"{name}.{gate_name}", n_rows)
        positions = torch.arange(n_routed, device=hist.device)  # the routed rows with a gate
        if name == "scatter_indx":  # a routed row of dst_indx -1 is written nowhere (the kernels mask its store)
            positions = positions[sorted_to_gate[:n_routed] >= 0]
        nowhere = f" ({n_routed - len(positions)} of them written nowhere: -1)" if len(positions) < n_routed else ""
        for direction, values in ((sorted_name, sorted_to_gate), (gate_name, gate_to_sorted)):
            n_kept = int((values >= 0).sum())
            if n_kept != len(positions):
                raise SpecError(f"{name}.{direction}: {n_kept} routed rows but routing_data.expt_hist sums to "
                                f"{n_routed}{nowhere}; the histogram does not match the indices")
        if (sorted_to_gate[positions] < 0).any():
            raise SpecError(f"{name}.{sorted_name}: a dropped gate (-1) among the first {n_routed} sorted rows; the "
                            f"routed rows come first, in expert order")
        if not torch.equal(gate_to_sorted[sorted_to_gate[positions].long()].long(), positions):
            raise SpecError(f"{name}: src_indx and dst_indx are not inverse permutations of each other")
    meta = routing_data.expt_data
    if meta is None:
        return
    if not torch.equal(meta.slice_sizes.long(), hist):
        raise SpecError("routing_data.expt_data was computed for another histogram than routing_data.expt_hist")
    expected = make_ragged_tensor_metadata_torch(routing_data.expt_hist, n_rows)
    n_tiles = expected.block_schedule_data.shape[1]
    if not (torch.equal(meta.slice_offs.long(), expected.slice_offs.long())
            and torch.equal(meta.block_offs_data.long(), expected.block_offs_data.long())
            and torch.equal(meta.block_schedule_data[:, :n_tiles].long(), expected.block_schedule_data)):
        raise SpecError("routing_data.expt_data does not hold the offsets and block schedule of its histogram; build "
                        "it with ogsgen.moe.make_ragged_tensor_metadata(expt_hist, n_rows)")
