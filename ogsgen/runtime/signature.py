"""A ``matmul_ogs`` call's signature: everything its checked path reads (shapes, strides, dtypes, devices and
alignment of the tensors, values of the rest). A call whose signature an earlier call had replays that call's launch
plan (``ogsgen.runtime.plans``) with its own tensors, given in the same order."""
from __future__ import annotations

import torch

from ..numerics.layouts import SwizzledMxValues
from .opt_flags import current_constraints

# The first tensors of a call's list, by argument name, in order; routing, index and function argument tensors follow.
_FIRST_TENSORS = ("x", "w", "bias", "betas", "gammas", "y", "y_acc_in", "precision_config.weight_scale",
                  "precision_config.out_scale", "precision_config.act_scale", "lhs_data.scale", "rhs_data.scale",
                  "out_data.expected_scale", "out_data.actual_scale", "acc_data.scale", "preact")
# Positions of the tensors the kernels write, and of y_acc_in, which may be y itself (in-place accumulation).
WRITTEN = tuple(_FIRST_TENSORS.index(name) for name in ("y", "precision_config.out_scale", "out_data.actual_scale",
                                                         "preact"))
SAME_ALLOWED = ((_FIRST_TENSORS.index("y"), _FIRST_TENSORS.index("y_acc_in")),)


def call_signature(x, w, bias, routing_data, gather_indx, scatter_indx, pc, betas, gammas, out_alpha, y, act,
                   epi, y_acc_in, preact, declared=None) -> tuple[list, tuple]:
    """(the call's tensors in a fixed order, its signature): everything the checked path reads (``declared``: the
    formats of an x and a w declared as ScaledOperands). Non-tensor entries of the list (None, function argument
    values) enter the signature by type and value."""
    swizzled = w.__class__ is SwizzledMxValues
    flex = pc.flex_ctx
    lhs, rhs, out = flex.lhs_data, flex.rhs_data, flex.out_data
    # (_FIRST_TENSORS, in its order)
    tensors = [x, w.data if swizzled else w, bias, betas, gammas, y, y_acc_in, pc.weight_scale, pc.out_scale,
               pc.act_scale, lhs.scale, rhs.scale, out.expected_scale, out.actual_scale, flex.acc_data.scale, preact]
    scalars = [current_constraints(), out_alpha.__class__, out_alpha, pc.acc_scale, pc.max_num_imprecise_acc,
               pc.allow_tf32, pc.flexpoint_saturate_inf, pc.out_dtype, pc.enforce_bitwise_invariance, lhs.dtype,
               rhs.dtype, act.specs, epi.specs, declared,
               (w.k, w.n, w.layout, w.capability) if swizzled else None,
               routing_data is None, gather_indx is None, scatter_indx is None]
    derived = ()
    if routing_data is not None:
        meta = routing_data.expt_data
        scalars += (routing_data.__class__, routing_data.n_expts_tot, routing_data.n_expts_act,
                    routing_data.expected_tokens_per_expt, meta.__class__)
        tensors.append(routing_data.expt_hist)
        if meta is not None:
            tensors += (meta.slice_sizes, meta.slice_offs, meta.block_offs_data, meta.block_schedule_data)
            derived = (*meta.offs_rows(), *meta.schedule_rows())  # views of the two, described by them
    if gather_indx is not None:
        tensors += (gather_indx.src_indx, gather_indx.dst_indx)
    if scatter_indx is not None:
        tensors += (scatter_indx.src_indx, scatter_indx.dst_indx)
    tensors += (*act.fn_args, *epi.fn_arg_values_matmul, *epi.fn_arg_values_finalize)
    if x.is_cuda:
        scalars.append(torch.cuda.current_device())
    # (is_neg: a lazily negated view's memory holds other values, which the checked path resolves; the conjugate
    # flag exists only on complex tensors, which no kernel takes)
    described = [None if t is None else (t.shape, t.stride(), t.dtype, t.device, t.data_ptr() & 15, t.is_neg())
                 if isinstance(t, torch.Tensor) else (t.__class__, t) for t in tensors]
    tensors += derived
    return tensors, (*scalars, *described)
