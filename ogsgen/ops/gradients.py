"""The backward of ``ogsgen::matmul_ogs``, on ogsgen's own kernels.

Forward, per matmul row p (a dense row, or an expert-sorted row of expert e(p)):
    z_p = out_alpha * (x_p @ W[e(p)] + betas_p * bias[e(p)]),   y_p = gammas_p * act(z_p)
with x_p gathered from x's token rows (gather) and y_p summed into its token's row (scatter). Backward:
    dg_p = dy[token of p] (scatter) or dy_p;  d gammas_p = <dg_p, act(z_p)>;  dz_p = act'(z_p)^T (gammas_p dg_p)
    dx = dz @ W^T:  matmul_ogs(dz, w.mT) with the forward's gather as the scatter (a gathered token's rows summed)
    dW[e] = x[rows of e]^T @ dz[rows of e]:  the ragged-K kernel (matmul_ogs_inner), x's tokens read through
            the forward's gather
    d bias[e] = sum over e's rows of betas_p dz_p
z is what the forward stored (``save_preact``: built-in activations, whose preact variants the default catalog has;
in the output dtype, as torch's autograd of a linear layer keeps it), else recomputed by the same matmul without
its activation and gammas (fp32 output), where act' or d gammas need it. dz and d gammas come from one fused
kernel with the activation's backward function (ogsgen.ops.activation_backward), or, for an activation registered
without one, from torch's autograd of its reference. No loop over experts; nothing synchronizes.
"""
from __future__ import annotations

import torch

from ..moe.metadata import BLOCK_SIZES
from ..runtime.opt_flags import current_constraints
from ..spec.catalog import PREACT_ACTIVATIONS
from ..spec.functions import registered
from ..types import INNER_BLOCK_K
from .custom_ops import activation_backward_op


# ogsgen::matmul_ogs's differentiable inputs, by position
X, W, BIAS, BETAS, GAMMAS, Y_ACC_IN = 0, 1, 2, 11, 12, 13
N_INPUTS = 22


def saves_preact(activation, scatter: bool) -> bool:
    """Whether a differentiated call with this activation (a registered FnSpecs, or None) stores its rows before it."""
    # (the default catalog builds those activations' preact variants; a user's activation is recomputed)
    return (activation is not None and not scatter and activation.name in PREACT_ACTIVATIONS
            and registered("activation", activation.name) is activation)


def matmul_ogs_setup_context(ctx, inputs, output):
    (x, w, bias, hist, slice_offs, block_offs, schedule, gather_src, gather_dst, scatter_src, scatter_dst, betas,
     gammas, _y_acc_in, n_expts_tot, n_expts_act, out_alpha, activation, activation_args, _out_dtype,
     allow_tf32, save_preact) = inputs
    _, preact = output
    ctx.mark_non_differentiable(preact)
    ctx.save_for_backward(x, w, bias, hist, slice_offs, block_offs, schedule, gather_src, gather_dst, scatter_src,
                          scatter_dst, betas, gammas, preact if save_preact else None)
    ctx.scalars = (n_expts_tot, n_expts_act, out_alpha, activation, tuple(activation_args), allow_tf32)


def matmul_ogs_backward(ctx, dy, _d_preact):
    (x, w, bias, hist, slice_offs, block_offs, schedule, gather_src, gather_dst, scatter_src, scatter_dst, betas,
     gammas, preact) = ctx.saved_tensors
    n_expts_tot, k, alpha, activation, activation_args, allow_tf32 = ctx.scalars
    need = ctx.needs_input_grad
    dy = dy.contiguous()  # (a sum's gradient arrives expanded, with stride 0; the kernels' TMA wants real strides)

    def matmul(*args):  # the forward's precision (tf32 dots for fp32 operands, or not)
        return torch.ops.ogsgen.matmul_ogs(*args, allow_tf32, False)[0]
    routing = (hist, slice_offs, block_offs, schedule)
    ragged = hist is not None
    routed_rows = slice_offs[n_expts_tot:] if ragged else None  # rows past it (dropped gates): zero gradients
    spec = registered("activation", activation) if activation is not None else None
    want_d_gammas = gammas is not None and need[GAMMAS]
    z = None
    if spec is not None or want_d_gammas:
        z = preact if preact is not None else matmul(
            x, w, bias, *routing, gather_src, gather_dst, None, None, betas, None, None, n_expts_tot, k, alpha, None, [],
            torch.float32)
    if spec is None and gammas is None and alpha is None and scatter_dst is None and not ragged \
            and dy.dtype == x.dtype:
        dz, d_gammas = dy, None  # a plain matmul's: dy itself
    elif spec is None or spec.backward is not None:
        dz, d_gammas = activation_backward_op(activation, list(activation_args), z, dy, scatter_dst, k, gammas,
                                              routed_rows, alpha, want_d_gammas, x.dtype)
        d_gammas = d_gammas if want_d_gammas else None
    else:
        dz, d_gammas = _dz_by_torch(spec, activation_args, z, dy, scatter_dst, k, gammas, routed_rows, alpha,
                                    want_d_gammas)
    operand = dz.to(x.dtype)
    grads = [None] * N_INPUTS
    if need[X]:
        if not ragged:
            dx = matmul(operand, w.mT, None, *routing, None, None, None, None, None, None, None, n_expts_tot, k, None,
                        None, [], x.dtype)
        elif gather_src is not None:  # the forward's gather, as a scatter: each token sums its rows
            dx = matmul(operand, w.mT, None, *routing, None, None, gather_dst, gather_src, None, None, None,
                        n_expts_tot, k, None, None, [], x.dtype)
        else:
            dx = _only_routed(matmul(operand, w.mT, None, *routing, None, None, None, None, None, None, None,
                                     n_expts_tot, k, None, None, [], x.dtype), routed_rows)
        grads[X] = dx
    if need[W]:
        if ragged:
            grads[W] = torch.ops.ogsgen.matmul_ogs_inner(x.mT, operand, *routing, gather_src, k, _inner_block_k(),
                                                         w.dtype, allow_tf32).reshape(w.shape)
        else:
            grads[W] = matmul(x.mT, operand, None, *routing, None, None, None, None, None, None, None, n_expts_tot, k,
                              None, None, [], w.dtype).reshape(w.shape)
    if bias is not None and need[BIAS]:
        grads[BIAS] = _bias_gradient(dz if betas is None else dz * betas[:, None], bias, routing, ragged)
    if d_gammas is not None:  # a batched call's gammas are shared by its batch entries: their rows' sums added
        d_gammas = d_gammas.reshape(-1, gammas.shape[0]).sum(0)
    grads[GAMMAS] = d_gammas
    if need[Y_ACC_IN]:
        grads[Y_ACC_IN] = dy
    return tuple(grads)


def _dz_by_torch(spec, activation_args, z, dy, scatter_dst, k, gammas, routed_rows, alpha, want_d_gammas):
    """activation_backward's (dz in fp32, d gammas) by torch ops, for an activation registered without a backward
    function: torch's autograd of its reference."""
    def only_routed(t):
        return _only_routed(t, routed_rows)

    if scatter_dst is not None:  # each row's token row of dy
        dg = only_routed(dy.index_select(0, (scatter_dst.long() // k).clamp_min(0)).float())
    else:
        dg = only_routed(dy.float())
    with torch.enable_grad():
        z_leaf = z.float().detach().requires_grad_()
        act = spec.reference(z_leaf, *activation_args)
    d_gammas = only_routed((dg * act.detach()).sum(-1).reshape(-1)) if want_d_gammas else None
    dz = torch.autograd.grad(act, z_leaf, dg * gammas[:, None] if gammas is not None else dg)[0]
    if alpha is not None:
        dz = dz * alpha
    return only_routed(dz), d_gammas


def _only_routed(rows, routed_rows):
    """``rows`` (n_rows, ...) with those at or past ``routed_rows`` (a one-element tensor, or None: all routed)
    zeroed."""
    if routed_rows is None:
        return rows
    routed = torch.arange(rows.shape[0], dtype=torch.int32, device=rows.device) < routed_rows
    return torch.where(routed.reshape(-1, *[1] * (rows.ndim - 1)), rows, 0.0)


def _inner_block_k() -> int:
    """dW's K tile: a block_k the caller constrains the matmuls to (one the metadata has), else INNER_BLOCK_K."""
    block_k = dict(current_constraints()).get("block_k", INNER_BLOCK_K)
    return block_k if block_k in BLOCK_SIZES else INNER_BLOCK_K


def _bias_gradient(dz, bias, routing, ragged):
    if ragged and bias.ndim == 2 and bias.shape[0] > 1:
        # each expert's rows summed: the ragged-K product of a row of ones with dz, which reads dz once (an
        # index_add would have every row's atomics meet in the experts' few bias rows); fp32 sums of exact
        # products, of 16-bit dz as it is (no fp32 copy) or of fp32 dz without tf32 rounding
        operand = (dz if dz.dtype in (torch.bfloat16, torch.float16) else dz.float()).contiguous()
        ones = torch.ones(1, dz.shape[0], dtype=operand.dtype, device=dz.device)
        summed = torch.ops.ogsgen.matmul_ogs_inner(ones, operand, *routing, None, 1, _inner_block_k(), torch.float32,
                                                   False)
        return summed[:, 0].to(bias.dtype)
    if not ragged and dz.ndim == 3 and bias.ndim == 2 and bias.shape[0] > 1:  # each batch entry's rows
        return dz.sum(1).to(bias.dtype)
    return dz.reshape(-1, dz.shape[-1]).sum(0).reshape(bias.shape).to(bias.dtype)
