"""The public ``matmul_ogs``: the runtime's launch path, or, where autograd or torch.compile must see the call, the
custom op ``ogsgen::matmul_ogs`` (ogsgen.ops.custom_ops), which has a backward and a fake implementation."""
from __future__ import annotations

import numbers

import torch

from ..errors import SpecError, UnsupportedError
from ..moe.metadata import make_ragged_tensor_metadata
from ..numerics.layouts import SwizzledMxValues
from ..runtime import matmul as runtime
from ..runtime.validation import check_acc_scale
from ..spec.functions import registered
from ..types import PrecisionConfig, RoutingData
from .custom_ops import matmul_ogs_inner_op, matmul_ogs_op
from .gradients import saves_preact

_PLAIN_FLOATS = (torch.bfloat16, torch.float16, torch.float32)
_DEFAULT_PRECISION = PrecisionConfig()


def matmul_ogs(x, w, bias, routing_data=None, gather_indx=None, scatter_indx=None, precision_config=None,
               betas=None, gammas=None, out_alpha=None, y=None, fused_comm=None, fused_activation=None,
               epilogue=None, y_acc_in=None, inner_routing_data=None):
    """Y = epilogue(y_acc_in + gammas * act(out_alpha * (X @ W + betas * bias))), dense, batched or MoE.

    Dense: x (M, K), w (K, N), bias (N,). Batched: x (B, M, K), w (B, K, N), bias (B, N) or (N,).
    MoE (``routing_data`` with a histogram): w (E, K, N), bias (E, N); rows sorted by expert, read
    through ``gather_indx`` (x holds tokens) and written through ``scatter_indx`` (the k expert
    outputs of a token are summed; dropped gates add nothing). The result has ``N // reduction_n``
    columns and dtype ``precision_config.out_dtype`` or x.dtype; a preallocated ``y`` (any strides)
    is written and returned. ``inner_routing_data`` makes K the ragged axis (ogsgen.InnerRoutingData).

    Differentiable in x, w, bias, gammas and y_acc_in (bf16, fp16 and fp32 operands; a fused activation through
    its torch reference), and traceable by torch.compile(fullgraph=True): such calls go through the custom op
    ``ogsgen::matmul_ogs``. A call whose signature an earlier call had replays that call's launch plan.
    """
    if torch.compiler.is_compiling() or (torch.is_grad_enabled() and runtime._requires_grad(
            x, w, bias, betas, gammas, y_acc_in)):
        return _through_custom_op(x, w, bias, routing_data, gather_indx, scatter_indx, precision_config, betas,
                                  gammas, out_alpha, y, fused_comm, fused_activation, epilogue, y_acc_in,
                                  inner_routing_data)
    return runtime.launch(x, w, bias, routing_data, gather_indx, scatter_indx, precision_config, betas, gammas,
                          out_alpha, y, fused_comm, fused_activation, epilogue, y_acc_in, inner_routing_data)


def _through_custom_op(x, w, bias, routing_data, gather_indx, scatter_indx, pc, betas, gammas, out_alpha, y,
                       fused_comm, act, epi, y_acc_in, inner):
    why = "under autograd (an input requires grad) or torch.compile"
    pc = pc if pc is not None else _DEFAULT_PRECISION
    check_acc_scale(pc)  # (the custom op takes only out_dtype and allow_tf32 of it)
    unsupported = {
        "y (a preallocated output)": y is not None, "fused_comm": fused_comm is not None,
        "epilogue": epi is not None and not epi.specs.is_default,
        "precision_config's scales, flexpoint data and bitwise invariance": _has_scales(pc),
        "mx weights (SwizzledMxValues)": isinstance(w, SwizzledMxValues)}
    if passed := [name for name, used in unsupported.items() if used]:
        raise UnsupportedError(f"matmul_ogs {why} takes bf16, fp16 or fp32 operands without {', '.join(passed)}; "
                               f"call it under torch.no_grad() with detached inputs, or outside the compiled region "
                               f"(torch.compiler.disable)")
    for name, t in (("x", x), ("w", w)):
        if not isinstance(t, torch.Tensor) or t.dtype not in _PLAIN_FLOATS:
            raise UnsupportedError(f"matmul_ogs {why}: {name} must be a bf16, fp16 or fp32 tensor, got "
                                   f"{getattr(t, 'dtype', type(t).__name__)} (quantized weights have no gradient "
                                   f"here: run them under torch.no_grad())")
    if betas is not None and betas.requires_grad:
        raise UnsupportedError("matmul_ogs: betas has no gradient; pass betas.detach()")
    if inner is not None:
        if runtime._requires_grad(x, w, y_acc_in):
            raise UnsupportedError("matmul_ogs with inner_routing_data (a weight gradient itself) has no gradient; "
                                   "pass detached x and w")
        if y_acc_in is not None or inner.x_is_padded or inner.w_is_padded:
            raise UnsupportedError(f"matmul_ogs with inner_routing_data {why}: y_acc_in and padded operands are "
                                   f"not taken; call it under torch.no_grad()")
        meta = _metadata(inner.base, min(x.shape[1], w.shape[0]))
        return matmul_ogs_inner_op(x, w, inner.base.expt_hist, meta.slice_offs, meta.block_offs_data,
                                   meta.block_schedule_data, None if gather_indx is None else gather_indx.src_indx,
                                   inner.base.n_expts_act, inner.block_k, pc.out_dtype, pc.allow_tf32)
    activation, activation_args = None, []
    if act is not None and not act.specs.is_default:
        activation, activation_args = _activation(act)
    ragged = routing_data is not None and routing_data.expt_hist is not None
    n_rows = gather_indx.src_indx.shape[0] if gather_indx is not None else x.shape[-2]
    meta = _metadata(routing_data, n_rows) if ragged else None
    # Under autograd a built-in activation's forward stores its rows before the activation for the backward.
    save_preact = saves_preact(act.specs if activation is not None else None, scatter_indx is not None) and \
        torch.is_grad_enabled() and runtime._requires_grad(x, w, bias, gammas)
    return matmul_ogs_op(
        x, w, bias, routing_data.expt_hist if ragged else None, *(_fields(meta) if ragged else (None,) * 3),
        *_indices(gather_indx), *_indices(scatter_indx), betas, gammas, y_acc_in,
        routing_data.n_expts_tot if ragged else 1, routing_data.n_expts_act if ragged else 1,
        None if out_alpha is None else float(out_alpha), activation, activation_args, pc.out_dtype, pc.allow_tf32,
        save_preact)[0]


def _has_scales(pc: PrecisionConfig) -> bool:
    flex = pc.flex_ctx
    return any(t is not None for t in (pc.weight_scale, pc.act_scale, pc.out_scale, flex.lhs_data.scale,
                                       flex.rhs_data.scale, flex.out_data.expected_scale, flex.out_data.actual_scale,
                                       flex.acc_data.scale)) or pc.enforce_bitwise_invariance


def _activation(act) -> tuple[str, list]:
    name = act.specs.name
    specs = registered("activation", name)
    # (identity first: under torch.compile with dynamic shapes a FusedActivation passed in as an argument has its
    # int fields traced as symbols, which FnSpecs' field-by-field equality cannot branch on)
    if specs is not act.specs and specs != act.specs:
        raise SpecError(f"fused_activation {name!r} is not the registered activation of that name; register it "
                        f"with ogsgen.register_activation")
    if act.specs.reference is None:
        raise UnsupportedError(f"fused_activation {name!r} has no torch reference, which its gradient is taken "
                               f"from: register it with reference=<torch function>")
    values = []
    for arg_name, value in zip(act.specs.fn_arg_names, act.fn_args):
        if not isinstance(value, numbers.Real) or isinstance(value, bool):
            raise UnsupportedError(f"fused_activation {name!r}: argument {arg_name} is a {type(value).__name__}; "
                                   f"under autograd or torch.compile activation arguments are numbers")
        values.append(float(value))
    return name, values


def _metadata(routing_data: RoutingData, n_rows: int):
    if routing_data.expt_data is not None:
        return routing_data.expt_data
    return make_ragged_tensor_metadata(routing_data.expt_hist, n_rows)


def _fields(meta) -> tuple:
    return meta.slice_offs, meta.block_offs_data, meta.block_schedule_data


def _indices(index) -> tuple:
    return (None, None) if index is None else (index.src_indx, index.dst_indx)
