"""What ogsgen's matmul custom ops run (ogsgen.ops.custom_ops declares them): ``ogsgen::matmul_ogs`` and
``ogsgen::matmul_ogs_inner`` (ragged K) rebuild the argument dataclasses from their flattened tensors and scalars
(RoutingData with its metadata, GatherIndx, ScatterIndx, FusedActivation, in the order ``pack_routing`` gives) and
launch the runtime's kernels; their fake (meta) implementations give the outputs' shapes.
"""
from __future__ import annotations

from typing import Optional

import torch

from ..moe.metadata import RaggedTensorMetadata
from ..runtime.matmul import launch
from ..spec.functions import registered
from ..types import FusedActivation, GatherIndx, InnerRoutingData, PrecisionConfig, RoutingData, ScatterIndx

Tensor = torch.Tensor


def routing_args(expt_hist, slice_offs, block_offs, block_schedule, n_expts_tot, n_expts_act) -> RoutingData | None:
    """The RoutingData a flattened call stands for (None for a dense or batched call)."""
    if expt_hist is None:
        return None
    meta = None if slice_offs is None else RaggedTensorMetadata(expt_hist, slice_offs, block_offs, block_schedule)
    return RoutingData(None, expt_hist, n_expts_tot, n_expts_act, meta)


def activation_of(name: str | None, args: list) -> FusedActivation | None:
    return None if name is None else FusedActivation(registered("activation", name), tuple(args))


def matmul_ogs(x: Tensor, w: Tensor, bias: Optional[Tensor], expt_hist: Optional[Tensor], slice_offs: Optional[Tensor],
               block_offs: Optional[Tensor], block_schedule: Optional[Tensor], gather_src: Optional[Tensor],
               gather_dst: Optional[Tensor], scatter_src: Optional[Tensor], scatter_dst: Optional[Tensor],
               betas: Optional[Tensor], gammas: Optional[Tensor], y_acc_in: Optional[Tensor], n_expts_tot: int,
               n_expts_act: int, out_alpha: Optional[float], activation: Optional[str], activation_args: list[float],
               out_dtype: Optional[torch.dtype], allow_tf32: bool, save_preact: bool) -> tuple[Tensor, Tensor]:
    """(y, the rows before the activation where ``save_preact``, else an empty tensor)."""
    routing_data = routing_args(expt_hist, slice_offs, block_offs, block_schedule, n_expts_tot, n_expts_act)
    preact = torch.empty(_preact_shape(x, w, gather_src), dtype=out_dtype or x.dtype, device=x.device) \
        if save_preact else None
    # (the inputs may require grad: this op's autograd is registered, so the launch path that skips that check)
    y = launch(x, w, bias, routing_data, None if gather_src is None else GatherIndx(gather_src, gather_dst),
               None if scatter_src is None else ScatterIndx(scatter_src, scatter_dst),
               PrecisionConfig(out_dtype=out_dtype, allow_tf32=allow_tf32), betas=betas, gammas=gammas,
               out_alpha=out_alpha, fused_activation=activation_of(activation, activation_args), y_acc_in=y_acc_in,
               preact=preact)
    return y, preact if preact is not None else x.new_empty(0, dtype=out_dtype or x.dtype)


def _preact_shape(x, w, gather_src) -> tuple:
    rows = gather_src.shape[0] if gather_src is not None else x.shape[-2]
    return (x.shape[0], rows, w.shape[-1]) if x.ndim == 3 else (rows, w.shape[-1])


def matmul_ogs_fake(x, w, bias, expt_hist, slice_offs, block_offs, block_schedule, gather_src, gather_dst, scatter_src,
                    scatter_dst, betas, gammas, y_acc_in, n_expts_tot, n_expts_act, out_alpha, activation,
                    activation_args, out_dtype, allow_tf32, save_preact):
    reduction_n = 1 if activation is None else registered("activation", activation).reduction_n
    rows = gather_src.shape[0] if gather_src is not None else x.shape[-2]
    if scatter_src is not None:
        rows = scatter_src.shape[0] // n_expts_act
    shape = (x.shape[0], rows, w.shape[-1] // reduction_n) if x.ndim == 3 else (rows, w.shape[-1] // reduction_n)
    preact = x.new_empty(_preact_shape(x, w, gather_src) if save_preact else (0,), dtype=out_dtype or x.dtype)
    return x.new_empty(shape, dtype=out_dtype or x.dtype), preact


def matmul_ogs_inner(x: Tensor, w: Tensor, expt_hist: Tensor, slice_offs: Optional[Tensor],
                     block_offs: Optional[Tensor], block_schedule: Optional[Tensor], gather_src: Optional[Tensor],
                     n_expts_act: int, block_k: int, out_dtype: Optional[torch.dtype], allow_tf32: bool) -> Tensor:
    base = routing_args(expt_hist, slice_offs, block_offs, block_schedule, expt_hist.shape[0], n_expts_act)
    gather = None if gather_src is None else GatherIndx(gather_src, gather_src)  # the kernel reads src_indx only
    return launch(x, w, None, gather_indx=gather, precision_config=PrecisionConfig(out_dtype=out_dtype,
                                                                                  allow_tf32=allow_tf32),
                  inner_routing_data=InnerRoutingData(base, block_k))


def matmul_ogs_inner_fake(x, w, expt_hist, slice_offs, block_offs, block_schedule, gather_src, n_expts_act, block_k,
                          out_dtype, allow_tf32):
    return x.new_empty((expt_hist.shape[0], x.shape[0], w.shape[1]), dtype=out_dtype or x.dtype)
