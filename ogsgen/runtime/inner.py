"""``matmul_ogs`` with ``inner_routing_data``: the ragged axis is K, as in an expert weights' gradient.

y[e] = x[:, segment e] @ w[segment e, :] (+ y_acc_in[e]) for each expert e, its segment the histogram's count of
entries along x's columns and w's rows, in expert order (a padded operand starts each at a multiple of block_k).
With ``gather_indx``, x holds tokens as columns (x = tokens.mT) and segment column p reads x column
``gather_indx.src_indx[p] // n_expts_act``: the first MoE matmul's weight gradient without gathering its input.
One launch of the tiled kernel of an ``inner`` variant, (expert, tile) programs, no host synchronization.
"""
from __future__ import annotations

from dataclasses import replace
from functools import lru_cache

import torch

from ..devices import target
from ..errors import InapplicableConstraintError, SpecError, SpecTypeError
from ..moe import checks as routing_checks
from ..moe.metadata import BLOCK_SIZES, make_ragged_tensor_metadata
from ..numerics import interpreter
from ..spec.formats import plain_format_of
from ..spec.operands import ScaledOperand
from ..spec.variant import KernelVariant
from ..types import InnerRoutingData, RoutingData
from . import plans
from .arguments import Call, MatmulInputs, matmul_launch
from .opt_flags import TILE_KEYS, TileProblem, current_constraints, make_opt_flags
from .memory import check_distinct_elements, check_outputs_disjoint
from .validation import check_devices, check_tensor, check_vector

_INNER_FLOATS = (torch.bfloat16, torch.float16, torch.float32)
WIDE_TILE_MIN = 1024  # 16-bit ragged-K products at least this many rows and columns take 128x256 tiles


def inner_matmul(x, w, bias, routing_data, gather_indx, scatter_indx, pc, betas, gammas, out_alpha, y, act, epi,
                 y_acc_in, inner: InnerRoutingData):
    """The checked ragged-K call (``matmul_ogs``'s arguments, ``inner`` its inner_routing_data)."""
    base = _check_inner_data(inner)
    unused = {"bias": bias is not None, "routing_data": routing_data is not None,
              "scatter_indx": scatter_indx is not None, "betas": betas is not None, "gammas": gammas is not None,
              "out_alpha": out_alpha is not None, "fused_activation": not act.specs.is_default,
              "epilogue": not epi.specs.is_default}
    if passed := [name for name, used in unused.items() if used]:
        raise SpecError(f"inner_routing_data (ragged K, an expert weights' gradient) computes plain per-expert "
                        f"products: leave {', '.join(passed)} None (apply them to the operands or the result)")
    check_tensor(x, "x", ndims=(2,), required=True)
    check_tensor(w, "w", ndims=(2,), required=True)
    if x.dtype not in _INNER_FLOATS or w.dtype != x.dtype:
        raise SpecError(f"inner_routing_data takes bf16, fp16 or fp32 x and w of one dtype, got x {x.dtype} and "
                        f"w {w.dtype}; convert them with .to()")
    if pc.weight_scale is not None or pc.act_scale is not None or pc.flex_ctx.lhs_data.scale is not None \
            or pc.flex_ctx.rhs_data.scale is not None or pc.out_scale is not None \
            or pc.flex_ctx.out_data.expected_scale is not None:
        raise SpecError("inner_routing_data takes unscaled operands and output: leave precision_config's scales None")
    n_expts = base.n_expts_tot
    m, n = x.shape[0], w.shape[1]
    x_len, w_len = x.shape[1], w.shape[0]
    if gather_indx is not None:
        if inner.x_is_padded:
            raise SpecError("inner_routing_data.x_is_padded with gather_indx: gathered x columns are tokens, read "
                            "through the index, so x has no segments to pad; set x_is_padded=False")
        check_vector(gather_indx.src_indx, "gather_indx.src_indx", gather_indx.src_indx.numel(), torch.int32)
        x_len = gather_indx.src_indx.numel()  # the segments index the gather, not x
    out_dtype = pc.out_dtype or x.dtype
    y_fmt = plain_format_of(out_dtype, "precision_config.out_dtype")
    x_fmt = plain_format_of(x.dtype, "x")
    out_shape = (n_expts, m, n)
    for name, buffer in (("y", y), ("y_acc_in", y_acc_in)):
        check_tensor(buffer, name, ndims=(3,))
        if buffer is not None and tuple(buffer.shape) != out_shape:
            raise SpecError(f"{name} must have shape (experts, x rows, w columns) = {out_shape}, got "
                            f"{tuple(buffer.shape)}")
    if y is not None and y.dtype != out_dtype:
        raise SpecError(f"y has dtype {y.dtype} but the output dtype is {out_dtype}; set precision_config.out_dtype="
                        f"{y.dtype} or pass a {out_dtype} y")
    read = {"x": x, "w": w, "inner_routing_data.base.expt_hist": base.expt_hist}
    if gather_indx is not None:
        read["gather_indx.src_indx"] = gather_indx.src_indx
    if y_acc_in is not None:
        read["y_acc_in"] = y_acc_in
    written = {"y": y} if y is not None else {}
    check_devices(x, {**read, **written})
    check_distinct_elements(written)
    check_outputs_disjoint(written, read, same_allowed=(("y", "y_acc_in"),))
    if routing_checks.host_checks_apply(x):
        _check_segments_on_host(base.expt_hist, inner, x_len, w_len, gather_indx, x.shape[1])
    if y is None:
        y = plans.new_buffer(out_shape, out_dtype, x.device)
    if y.numel() == 0:
        return y
    plans.not_plannable()  # the segments' metadata is made per call
    if base.expt_data is None:
        bound = min(x_len, w_len)
        base = RoutingData(base.gate_scal, base.expt_hist, n_expts, base.n_expts_act,
                           make_ragged_tensor_metadata(base.expt_hist, bound), base.expected_tokens_per_expt)
    variant = _inner_variant(x_fmt, y_fmt, gather_indx is not None, y_acc_in is not None)
    k = max(1, min(x_len, w_len) // max(1, n_expts))  # (a K per expert: the segments' are ragged)
    call = Call(ScaledOperand(x, x_fmt, k), ScaledOperand(w, x_fmt, k), n_expts, m, n, base, gather_indx, None, act,
                epi, pc, inner=inner)
    if not x.is_cuda:
        interpreter.prepare((x_fmt.element, x_fmt.element, y_fmt.element))
    flags = _inner_flags(call, x, inner.block_k, pc.enforce_bitwise_invariance)
    kernel, grid, args, options = matmul_launch(MatmulInputs(variant, call, flags, y, bias=None, betas=None,
                                                             gammas=None, y_acc_in=y_acc_in, out_alpha=None))
    plans.launch(kernel, grid, args, **options)
    return y


@lru_cache(maxsize=64)
def _inner_variant(fmt, y_fmt, gather: bool, y_acc_in: bool) -> KernelVariant:
    return KernelVariant(fmt, fmt, y_fmt, inner=True, gather=gather, y_acc_in=y_acc_in)


def _check_inner_data(inner) -> RoutingData:
    if not isinstance(inner, InnerRoutingData):
        raise SpecTypeError(f"inner_routing_data must be an ogsgen.InnerRoutingData, got {type(inner).__name__}")
    base = inner.base
    if not isinstance(base, RoutingData) or base.expt_hist is None:
        raise SpecError("inner_routing_data.base must be a RoutingData with a histogram (expt_hist): the entries "
                        "of each expert's segment (ogsgen.routing builds one)")
    check_vector(base.expt_hist, "inner_routing_data.base.expt_hist", base.n_expts_tot, torch.int32)
    if inner.block_k not in BLOCK_SIZES:
        raise SpecError(f"inner_routing_data.block_k must be one of {BLOCK_SIZES} (the K tile, and the padding of a "
                        f"padded operand's segments), got {inner.block_k!r}")
    return base


def _check_segments_on_host(hist, inner, x_len, w_len, gather_indx, x_columns):
    """The segments fit their operands (synchronizes: run where that is free, or with routing checks on)."""
    counts = hist.long()
    if bool((counts < 0).any()):
        raise SpecError("inner_routing_data.base.expt_hist has a negative count")
    used = int(counts.sum())
    padded_counts = (counts + inner.block_k - 1) // inner.block_k * inner.block_k
    padded_end = int((torch.cumsum(padded_counts, 0) - padded_counts + counts).max()) if counts.numel() else 0
    for name, length, is_padded in (("x's columns" if gather_indx is None else "gather_indx", x_len,
                                     inner.x_is_padded), ("w's rows", w_len, inner.w_is_padded)):
        needed = padded_end if is_padded else used
        how = f"segments starting at multiples of block_k={inner.block_k}" if is_padded else "the histogram's sum"
        if needed > length:
            raise SpecError(f"the experts' segments need {needed} entries of {name} ({how}), but it has {length}")
    if gather_indx is not None and used:
        cols = gather_indx.src_indx[:used].long() // inner.base.n_expts_act
        if bool(((cols < 0) | (cols >= x_columns)).any()):
            raise SpecError(f"gather_indx.src_indx // n_expts_act must index x's {x_columns} columns (tokens)")


def _inner_flags(call: Call, x, block_k: int, bitwise_invariant: bool):
    n_sms = target(x.device).sm_count if x.is_cuda else None
    return inner_flags(x.element_size(), call.batch, call.m, call.n, call.k, block_k, n_sms, bitwise_invariant,
                       current_constraints())


def inner_flags(itemsize: int, n_expts: int, m: int, n: int, k_per_expert: int, block_k: int, n_sms: int | None,
                bitwise_invariant: bool = False, constraints: tuple = ()):
    """The batched heuristic's tile over (experts, x rows, w columns), with the K tile the segments are padded to.
    Each tile sums its expert's whole segment: a constraint on split_k (meant for the row-ragged matmuls of the same
    code) does not apply; one on block_k must agree with inner.block_k. ``persistent``: one program per SM, looping
    over the tiles (else one per tile)."""
    constraints = {key: value for key, value in constraints if key != "split_k"}
    persistent = constraints.pop("persistent", None)
    if constraints.get("block_k", block_k) != block_k:
        raise InapplicableConstraintError(f"opt_flags_constraints block_k={constraints['block_k']}: a ragged-K call "
                                          f"takes block_k={block_k}, its inner_routing_data.block_k")
    flags = make_opt_flags(TileProblem(itemsize, n_expts, m, n, k_per_expert, can_split=False, n_sms=n_sms,
                                       bitwise_invariant=bitwise_invariant,
                                       constraints=tuple(sorted(constraints.items()))))
    wide = itemsize == 2 and min(m, n) >= WIDE_TILE_MIN
    wide_persistent = wide and block_k >= 64
    if wide and not any(key in constraints for key in TILE_KEYS):
        # A weight gradient's products are short (an expert's tokens) and wide: each tile is a few K steps and a
        # store. With 32-row K steps, 128x128 tiles of one warpgroup, several per SM, overlap one tile's store with
        # the next one's loads; longer K steps fit 128x256 tiles, one program per SM looping over them (H200,
        # gpt-oss-120b and DeepSeek-V3 T=2048; docs/heuristics.md)
        if wide_persistent:
            flags = replace(flags, block_m=128, block_n=256, num_warps=8, num_stages=3 if block_k <= 64 else 2)
        else:
            flags = replace(flags, block_m=128, block_n=128, num_warps=4, num_stages=3)
        flags = replace(flags, maxnreg=None, wait_mma=False)
    return replace(flags, block_k=block_k, split_k=1,
                   persistent=wide_persistent if persistent is None else persistent)
