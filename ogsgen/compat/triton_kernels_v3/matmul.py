"""``triton_kernels.matmul`` (upstream main since 2026-01): ``matmul`` with ``RaggedTensorMetadata`` and plain index
tensors, on ``ogsgen.matmul_ogs``.

A ragged call (``a_ragged_metadata``) becomes ogsgen's MoE call: the metadata's histogram for the weights' experts,
``gather_indx`` (x's row for each sorted row) as a GatherIndx of gate ids, ``scatter_indx`` (the output row of each
sorted row) as a ScatterIndx. Results are this generation's: with a scatter, one output row per scattered row (per
(token, expert) pair), for ``reduce`` to sum. ``n_expts_act=k`` (an ogsgen extension) sums the k rows of each token
in the scatter instead, ogsgen's fused top-k combine: output row ``scatter_indx[p] // k``.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ...errors import SpecError, SpecTypeError, UnsupportedError
from ...moe import gather_rows
from ...moe.checks import host_checks_apply
from ...spec import FnSpecs as _FnSpecs
from ...types import Epilogue, FlexCtx, FusedActivation, GatherIndx, InFlexData, InnerRoutingData, OutFlexData
from ...types import FusedComm as _FusedComm
from ...types import PrecisionConfig as _PrecisionConfig
from ...types import RoutingData as _RoutingData
from ...types import ScatterIndx
from .._matmul import fn_specs, matmul_ogs
from .._routing import fit_metadata
from .._tensor import check_microblock, plain_operand, scale_operand, weight_operand

__all__ = ["Epilogue", "FlexCtx", "FnSpecs", "FusedActivation", "FusedComm", "InFlexData", "OutFlexData",
           "PrecisionConfig", "matmul"]


def FnSpecs(name, fn, fn_arg_names, fn_arg_do_not_specialize=(), reduction_n=1):  # noqa: N802 (a class there)
    """triton_kernels' ``FnSpecs(name, fn, fn_arg_names, fn_arg_do_not_specialize, reduction_n)``, as in
    ``ogsgen.compat.triton_kernels_v36``."""
    return fn_specs(name, fn, fn_arg_names, fn_arg_do_not_specialize, reduction_n)


FnSpecs.default = _FnSpecs.default


def FusedComm(*args, **kwargs):  # noqa: N802 (a class there)
    raise UnsupportedError("FusedComm(out_handles, map_dst_coord, all_writes_issued, ...): triton_kernels' "
                           "destination closures have no ogsgen counterpart; pass an ogsgen.FusedComm (out_handles, "
                           "scatter_shard_indx, reduce_rank, n_reduce_shards) as matmul's fused_comm")


@dataclass
class PrecisionConfig:
    """This generation's precision config: ``a_mx_scale``, ``b_mx_scale``, ``c_mx_scale`` are the microscaling
    scales of x, w and the output (ogsgen's ``act_scale``, ``weight_scale``, ``out_scale``); Tensors from
    ``convert_layout`` are read as ogsgen's storage. Microblocks are 32 values (mxfp4, mxfp8)."""
    max_num_imprecise_acc: int | None = None
    allow_tf32: bool = True
    flex_ctx: FlexCtx = field(default_factory=FlexCtx)
    acc_scale: float = 1.0
    flexpoint_saturate_inf: bool = False
    report_quantization_err_fn: object = None
    a_mx_scale: object = None
    b_mx_scale: object = None
    c_mx_scale: object = None
    c_microblock_size: int | None = None
    c_value_pack_factor: int = 1
    out_dtype: torch.dtype | None = None
    enforce_bitwise_invariance: bool = False
    a_microblock_size: int | None = None
    b_microblock_size: int | None = None


def _ogsgen_precision(pc):
    if pc is None or isinstance(pc, _PrecisionConfig):  # (ogsgen's own is taken as it is)
        return pc
    if not isinstance(pc, PrecisionConfig):
        raise SpecTypeError(f"precision_config must be this package's PrecisionConfig (or an ogsgen.PrecisionConfig), "
                            f"got {type(pc).__name__}")
    for name in ("a_microblock_size", "b_microblock_size", "c_microblock_size"):
        check_microblock(getattr(pc, name), f"precision_config.{name}")
    if pc.c_value_pack_factor != 1:
        raise UnsupportedError(f"precision_config.c_value_pack_factor={pc.c_value_pack_factor!r}: ogsgen writes no "
                               f"packed (mxfp4, nvfp4) outputs; leave it 1 (mxfp8 outputs: c_mx_scale)")
    return _PrecisionConfig(
        max_num_imprecise_acc=pc.max_num_imprecise_acc, allow_tf32=pc.allow_tf32, flex_ctx=pc.flex_ctx,
        acc_scale=pc.acc_scale, flexpoint_saturate_inf=pc.flexpoint_saturate_inf,
        report_quantization_err_fn=pc.report_quantization_err_fn,
        act_scale=scale_operand(pc.a_mx_scale, "precision_config.a_mx_scale"),
        weight_scale=scale_operand(pc.b_mx_scale, "precision_config.b_mx_scale"),
        out_scale=plain_operand(pc.c_mx_scale, "precision_config.c_mx_scale"), out_dtype=pc.out_dtype,
        enforce_bitwise_invariance=pc.enforce_bitwise_invariance)


def _index(t, name: str) -> torch.Tensor:
    if not isinstance(t, torch.Tensor) or t.ndim != 1 or t.dtype not in (torch.int16, torch.int32, torch.int64):
        raise SpecError(f"{name} must be a 1-D integer tensor of row indices, got "
                        f"{f'{t.dtype} {tuple(t.shape)}' if isinstance(t, torch.Tensor) else type(t).__name__}")
    return t.to(torch.int32).contiguous()


def _check_range(index: torch.Tensor, name: str, n_rows: int, what: str) -> None:
    if host_checks_apply(index) and index.numel() and (int(index.min()) < -1 or int(index.max()) >= n_rows):
        raise SpecError(f"{name} must hold {what} in [0, {n_rows}) (or -1 for none), got values in "
                        f"[{int(index.min())}, {int(index.max())}]")


def _inverse(positions: torch.Tensor) -> torch.Tensor:
    """The inverse of a partial permutation of [0, n) (-1: none), -1 where nothing maps; without a sync."""
    n = positions.numel()
    inverse = torch.full((n + 1,), -1, dtype=torch.int32, device=positions.device)
    slot = torch.where(positions >= 0, positions, n).long()  # the unmapped go to a slot past the end
    inverse.scatter_(0, slot, torch.arange(n, dtype=torch.int32, device=positions.device))
    return inverse[:n]


def _gather_as_gates(rows: torch.Tensor, per_row: int) -> GatherIndx:
    """A gather of x rows as ogsgen's gate ids: the j-th occurrence of row r is gate ``r * per_row + j``, which the
    kernel reads as row ``gate // per_row``; the gather must name no row more than ``per_row`` times."""
    n = rows.numel()
    order = torch.argsort(rows, stable=True)
    by_row = rows[order]
    positions = torch.arange(n, device=rows.device)
    starts = torch.ones(n, dtype=torch.bool, device=rows.device)
    starts[1:] = by_row[1:] != by_row[:-1]
    first = torch.where(starts, positions, 0).cummax(0).values  # where each row's run starts in by_row
    occurrence = torch.empty_like(positions)
    occurrence[order] = positions - first
    fits = (occurrence < per_row) | (rows < 0)
    message = (f"gather_indx names an x row more than {per_row} times (its length over x's rows): gather the rows "
               f"yourself (a[gather_indx]) and pass no gather_indx")
    if host_checks_apply(rows):
        if not bool(fits.all()):
            raise SpecError(message)
    else:
        torch._assert_async(fits.all(), message)  # a row's surplus occurrence would read the next row's data
    gates = torch.where(rows >= 0, rows * per_row + occurrence, -1).to(torch.int32)
    return GatherIndx(src_indx=gates, dst_indx=_inverse(gates))


def _ragged_call(a, n_expts, meta, gather_indx, scatter_indx, n_expts_act):
    """(a, RoutingData, GatherIndx, ScatterIndx) of ogsgen's MoE call for a call ragged along M."""
    if not isinstance(n_expts_act, int) or isinstance(n_expts_act, bool) or n_expts_act < 1:
        raise SpecError(f"n_expts_act must be a positive int (the rows of each token the scatter sums), got "
                        f"{n_expts_act!r}")
    if n_expts_act > 1 and scatter_indx is None:
        raise SpecError(f"n_expts_act={n_expts_act} sums the scattered rows of each token: it needs scatter_indx")
    meta = fit_metadata(meta, n_expts, "a_ragged_metadata")
    k, gather = n_expts_act, None
    if gather_indx is not None:
        rows = _index(gather_indx, "gather_indx")
        _check_range(rows, "gather_indx", a.shape[0], "rows of a")
        n_tokens = a.shape[0]
        per_row = rows.numel() // n_tokens if n_tokens else 0
        if per_row and rows.numel() == n_tokens * per_row and (scatter_indx is None or per_row == k):
            gather, k = _gather_as_gates(rows, per_row), per_row  # read in place by the kernel
        else:  # a gather ogsgen's kernel cannot express with this call's scatter: a copy of the rows
            a = gather_rows(a, rows, 1)
    n_rows = gather.src_indx.numel() if gather is not None else a.shape[0]
    scatter = None
    if scatter_indx is not None:
        rows_out = _index(scatter_indx, "scatter_indx")
        if rows_out.numel() != n_rows:
            raise SpecError(f"scatter_indx must name the output row of each of the call's {n_rows} rows, got "
                            f"{rows_out.numel()} entries")
        _check_range(rows_out, "scatter_indx", n_rows, "output rows")
        scatter = ScatterIndx(src_indx=_inverse(rows_out), dst_indx=rows_out)
    return a, _RoutingData(None, meta.slice_sizes, n_expts, k, meta), gather, scatter


def _ragged_k(a_meta, b_meta, gather_indx, scatter_indx) -> InnerRoutingData:
    if gather_indx is not None or scatter_indx is not None:
        raise SpecError("b_ragged_metadata (K ragged: per-expert weight gradients) takes no gather_indx or "
                        "scatter_indx")
    if a_meta is not None and a_meta is not b_meta and a_meta.slice_sizes is not b_meta.slice_sizes:
        raise UnsupportedError("a_ragged_metadata and b_ragged_metadata are two metadata: ogsgen's ragged-K matmul "
                               "takes one histogram for a's columns and b's rows; pass the same metadata for both (or "
                               "call ogsgen.matmul_ogs with ogsgen.InnerRoutingData, x_is_padded / w_is_padded)")
    hist = b_meta.slice_sizes
    return InnerRoutingData(_RoutingData(None, hist, hist.shape[0], 1, b_meta))


def matmul(a, b, bias, a_ragged_metadata=None, b_ragged_metadata=None, gather_indx=None, scatter_indx=None,
           precision_config=None, betas=None, gammas=None, out_alpha=None, c=None, fused_comm=None,
           fused_activation=None, epilogue=None, c_acc_in=None, *, n_expts_act=1):
    """This generation's ``matmul`` on ``ogsgen.matmul_ogs`` (the module docstring says how a call maps).
    ``gather_indx``: a's row for each row of the call; ``scatter_indx``: the output row of each (-1: none);
    ``betas`` and ``gammas`` per row of the call, in the metadata's (expert-sorted) order."""
    pc = _ogsgen_precision(precision_config)
    a, w = plain_operand(a, "a"), weight_operand(b, "b")
    if fused_comm is not None and not isinstance(fused_comm, _FusedComm):
        raise UnsupportedError(f"fused_comm: a {type(fused_comm).__name__}; ogsgen writes other GPUs' rows through "
                               f"an ogsgen.FusedComm (out_handles, scatter_shard_indx, reduce_rank, n_reduce_shards)")
    routing_data = gather = scatter = inner = None
    if b_ragged_metadata is not None:
        inner = _ragged_k(a_ragged_metadata, b_ragged_metadata, gather_indx, scatter_indx)
    elif a_ragged_metadata is not None:
        n_expts = w.shape[0] if w.ndim == 3 else 1  # (ogsgen's checks name a 2-D w's problem)
        a, routing_data, gather, scatter = _ragged_call(a, n_expts, a_ragged_metadata, gather_indx, scatter_indx,
                                                        n_expts_act)
    elif gather_indx is not None or scatter_indx is not None or n_expts_act != 1:
        raise UnsupportedError("gather_indx, scatter_indx and n_expts_act go with a_ragged_metadata (the rows' "
                               "experts); for a dense matmul of gathered rows pass a[gather_indx]")
    return matmul_ogs(a, w, bias, routing_data, gather, scatter, pc, betas, gammas, out_alpha, c,
                      fused_comm=fused_comm, fused_activation=fused_activation, epilogue=epilogue, y_acc_in=c_acc_in,
                      inner_routing_data=inner)
