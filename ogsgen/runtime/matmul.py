"""``matmul_ogs``: map a call (its arguments checked by ``validation``) to its kernel variants and launch
parameters, build the kernels' arguments and launch them; repeated calls replay a launch plan."""
from __future__ import annotations

import contextlib
import dataclasses
from functools import lru_cache

import torch

from ..devices import target
from ..errors import PerformanceWarning, SpecError, UnsupportedError, VariantNotBuiltError, warn_at_caller
from ..moe import checks as routing_checks
from ..moe.metadata import make_ragged_tensor_metadata
from ..numerics import interpreter
from ..numerics.fp8_blocks import row_quantization, scales_shape
from ..spec.formats import FP8_BLOCK
from ..spec.operands import ScaledOperand
from ..spec.variant import KernelVariant, split_k_plan, topk_plan, topk_split_k_plan
from ..types import Epilogue, FusedActivation, PrecisionConfig, RoutingData
from . import memory, plans, wgmma_hazards
from .arguments import Call, MatmulInputs, ReduceInputs, matmul_launch, reduce_launch
from .inner import inner_matmul
from .opt_flags import TileProblem, current_constraints, format_facts, make_opt_flags
from .operands import describe_operands, unfold_declared
from .descriptors import persistent_blocker, tma_blocker, ws_blocker
from .memory import resolve_lazy_views
from .signature import SAME_ALLOWED, WRITTEN, call_signature
from .validation import check_argument_types, check_call_shapes, reject_unsupported, written_tensors

@lru_cache(maxsize=1024)
def _variant(x_fmt, w_fmt, y_fmt, ragged, gather, scatter, bias, betas, gammas, y_acc_in, activation,
             epilogue, fused_comm=False, preact=False) -> KernelVariant:
    return KernelVariant(x_fmt, w_fmt, y_fmt, ragged=ragged, gather=gather, scatter=scatter, bias=bias, betas=betas,
                         gammas=gammas, y_acc_in=y_acc_in, activation=activation, epilogue=epilogue,
                         fused_comm=fused_comm, preact=preact)


def _launch_matmul(variant: KernelVariant, call: Call, flags, out: torch.Tensor, **operands):
    """One matmul kernel writing ``out``: (M, N) / (B, M, N) rows, or (S, B, M, N) fp32 partials.

    ``operands``: bias, betas, gammas, y_acc_in, out_alpha and optionally split_k. Kernels that upcast in
    registers on Hopper go through ``wgmma_hazards.launch_checked``, which replaces a binary with ptxas's wgmma
    register hazard."""
    inputs = MatmulInputs(variant, call, flags, out, **operands)
    if variant.upcasts_in_registers and _has_wgmma(call.x):
        wgmma_hazards.launch_checked(inputs)
        return
    kernel, grid, args, options = matmul_launch(inputs)
    plans.launch(kernel, grid, args, compiling=wgmma_hazards.compiling(flags), **options)


def _has_wgmma(x: torch.Tensor) -> bool:
    """Whether x's device runs Hopper's wgmma (sm_90), whose register operand the hazard check is about."""
    return x.is_cuda and target(x.device).wgmma


def _launch_reduce(variant: KernelVariant, call: Call, parts: torch.Tensor, out: torch.Tensor, **operands):
    """The reduce kernel summing ``parts`` into ``out`` (``arguments.ReduceInputs`` says what each holds)."""
    kernel, grid, args, options = reduce_launch(ReduceInputs(variant, call, parts, out, **operands))
    plans.launch(kernel, grid, args, **options)


# Shared defaults (building them costs microseconds per call); matmul_ogs never mutates its arguments.
_DEFAULT_PRECISION, _NO_ACTIVATION, _NO_EPILOGUE = PrecisionConfig(), FusedActivation(), Epilogue()


def matmul_ogs(x, w, bias, routing_data=None, gather_indx=None, scatter_indx=None, precision_config=None,
               betas=None, gammas=None, out_alpha=None, y=None, fused_comm=None, fused_activation=None,
               epilogue=None, y_acc_in=None, inner_routing_data=None):
    """The launch path of ``ogsgen.matmul_ogs`` (ogsgen.ops.api, which documents the arguments): checks a call,
    picks its kernel variants and launch parameters and launches them, without autograd (inputs that require
    grad are refused here; the public matmul_ogs, which checks that itself, calls ``launch`` directly).
    """
    if torch.is_grad_enabled() and _requires_grad(x, w, bias, betas, gammas, y_acc_in):
        _refuse_gradients(x=x, w=w, bias=bias, betas=betas, gammas=gammas, y_acc_in=y_acc_in)
    return launch(x, w, bias, routing_data, gather_indx, scatter_indx, precision_config, betas, gammas, out_alpha, y,
                  fused_comm, fused_activation, epilogue, y_acc_in, inner_routing_data)


def launch(x, w, bias, routing_data=None, gather_indx=None, scatter_indx=None, precision_config=None, betas=None,
           gammas=None, out_alpha=None, y=None, fused_comm=None, fused_activation=None, epilogue=None, y_acc_in=None,
           inner_routing_data=None, preact=None):
    """``matmul_ogs`` for a caller that has made sure no input requires grad.

    ``preact`` (for ogsgen's backward): a tensor shaped as the matmul's rows before the activation, (rows, N) or
    (B, rows, N) in the output dtype, which the kernel fills with them (``out_alpha * (x @ w + betas * bias)``).

    A call whose signature (shapes, strides, dtypes, devices and alignment of the tensors, values of the
    rest) an earlier call had replays that call's launch plan (``ogsgen.runtime.plans``) without checking
    its arguments again.
    """
    pc = precision_config if precision_config is not None else _DEFAULT_PRECISION
    act = fused_activation if fused_activation is not None else _NO_ACTIVATION
    epi = epilogue if epilogue is not None else _NO_EPILOGUE
    declared = None
    if w.__class__ is ScaledOperand or x.__class__ is ScaledOperand:
        # (their formats enter the signature; their tensors the list, as a plain call's)
        x, w, pc, declared = unfold_declared(x, w, pc)
    tensors = signature = None
    if fused_comm is None and inner_routing_data is None and not routing_checks.DEBUG:
        try:
            tensors, signature = call_signature(x, w, bias, routing_data, gather_indx, scatter_indx, pc, betas,
                                                gammas, out_alpha, y, act, epi, y_acc_in, preact, declared)
            plan = plans.lookup(signature, tensors)
        except (AttributeError, TypeError):  # a malformed argument (the checked path says which) or unhashable
            tensors = plan = None
        if plan is not None:
            if routing_data is not None and routing_data.expt_hist is not None and \
                    routing_checks.host_checks_apply(x):
                _check_routing_on_host(x, routing_data, gather_indx, scatter_indx)
            return plan.run(tensors)
    with plans.recording() as rec:
        y_out = _checked_matmul_ogs(x, w, bias, routing_data, gather_indx, scatter_indx, pc, betas, gammas,
                                    out_alpha, y, fused_comm, act, epi, y_acc_in, inner_routing_data, preact, declared)
    if tensors is not None:
        # (a guard where the caller passed a tensor the kernels write: y, the output scales, preact)
        guard = memory.DisjointGuard(tensors, WRITTEN, SAME_ALLOWED) \
            if any(tensors[i] is not None for i in WRITTEN) else None
        if (plan := plans.build(rec, tensors, y_out, guard)) is not None:
            plans.store(signature, plan)
    return y_out


def _requires_grad(*tensors) -> bool:
    for t in tensors:  # a plain loop: any() over a generator costs microseconds on every call
        if t is not None and getattr(t, "requires_grad", False):
            return True
    return False


def _refuse_gradients(**tensors):
    for name, t in tensors.items():
        if getattr(t, "requires_grad", False):
            raise UnsupportedError(f"{name} requires grad, but ogsgen.runtime.matmul_ogs (the launch path) has no "
                                   f"autograd: call ogsgen.matmul_ogs, which is differentiable, or call this one "
                                   f"under torch.no_grad() with {name}.detach()")


def _check_routing_on_host(x, routing_data, gather_indx, scatter_indx):
    n_rows = gather_indx.src_indx.numel() if gather_indx is not None else x.shape[-2]
    routing_checks.check_routing_data(routing_data, n_rows, gather_indx, scatter_indx)


# MoE calls of this many rows and more (prefill) ran 3-7% slower with K-contiguous W than with N-contiguous W in the
# bench; 0-2% (up to 5% against its fastest run) since ogsgen encodes the weight's TMA descriptor with a 256-byte L2
# promotion on Triton 3.6 (docs/performance.md, "Weight layouts"); decode rows ran as fast.
_K_CONTIGUOUS_WARN_ROWS = 8192
_warned_k_contiguous = False


def _warn_k_contiguous_once(w):
    global _warned_k_contiguous
    if _warned_k_contiguous:
        return
    _warned_k_contiguous = True
    warn_at_caller(f"ogsgen: w is K-contiguous (strides {tuple(w.stride())}: an (E, N, K) tensor viewed as (E, K, N), "
                   f"as nn.Linear and vLLM store expert weights); prefill-sized MoE calls run up to 7% slower than "
                   f"with N-contiguous w (0-5% on Triton 3.6; docs/performance.md, 'Weight layouts'). Lay the weights "
                   f"out once at load time: ogsgen.prepare_expert_weights(weight, layout='out_in'), or w.contiguous() "
                   f"of the (E, K, N) view. (Warned once per process.)", PerformanceWarning)


def _checked_matmul_ogs(x, w, bias, routing_data, gather_indx, scatter_indx, pc, betas, gammas, out_alpha, y,
                        fused_comm, act, epi, y_acc_in, inner_routing_data, preact=None, declared=None):
    """``matmul_ogs`` with every argument checked, for the first call of a signature."""
    check_argument_types(x, w, routing_data, gather_indx, scatter_indx, pc, act, epi)
    reject_unsupported(pc)
    (x, w, bias, routing_data, gather_indx, scatter_indx, pc, betas, gammas, fused_comm, act, epi, y_acc_in,
     inner_routing_data) = resolve_lazy_views(written_tensors(pc, y, preact), (
        x, w, bias, routing_data, gather_indx, scatter_indx, pc, betas, gammas, fused_comm, act, epi, y_acc_in,
        inner_routing_data))
    if inner_routing_data is not None:
        if preact is not None:
            raise SpecError("preact is taken by matmuls with an activation, not with inner_routing_data")
        return inner_matmul(x, w, bias, routing_data, gather_indx, scatter_indx, pc, betas, gammas, out_alpha, y, act,
                            epi, y_acc_in, inner_routing_data)
    n = w.shape[-1]  # (a swizzled w's logical N)
    x_op, w_op, y_fmt = describe_operands(x, w, pc, declared)
    x_fmt, w_fmt, x, w = x_op.format, w_op.format, x_op.values, w_op.values
    shape = check_call_shapes(x_op, w_op, y_fmt, n, routing_data, gather_indx, scatter_indx, pc, bias, betas, gammas,
                              out_alpha, y, fused_comm, act, epi, y_acc_in, preact)
    batched, ragged, batch, m, out_rows, n_out, out_shape, written, read = shape
    out_dtype = y_fmt.torch_dtype
    if ragged and routing_checks.host_checks_apply(x):
        _check_routing_on_host(x, routing_data, gather_indx, scatter_indx)
    # The tensors a call writes overlap none of its other tensors, except y_acc_in that is y itself (in-place
    # accumulation: each tile reads its elements before it writes them).
    memory.check_outputs_disjoint(written, read, same_allowed=(("y", "y_acc_in"),))
    if y is None:
        y = plans.new_buffer(out_shape, out_dtype, x.device)
    if y_fmt.scaling == "flexpoint" and pc.flex_ctx.out_data.actual_scale is not None:
        # atomics take the max of this call's tiles; a call without output elements has none, its absmax 0
        plans.zero(pc.flex_ctx.out_data.actual_scale)
    if batch * out_rows * n_out == 0:
        return y
    if ragged and routing_data.expt_data is None:
        routing_data = RoutingData(routing_data.gate_scal, routing_data.expt_hist, routing_data.n_expts_tot,
                                   routing_data.n_expts_act, make_ragged_tensor_metadata(routing_data.expt_hist, m),
                                   routing_data.expected_tokens_per_expt)

    if x_fmt.has_block_scales and x_op.block_scales is None:  # (a float x for fp8 block weights: made here)
        x_op = _quantized_activations(x_op)
        x = x_op.values
    variant = _variant(x_fmt, w_fmt, y_fmt, ragged, gather_indx is not None, scatter_indx is not None,
                       bias is not None, betas is not None, gammas is not None, y_acc_in is not None,
                       None if act.specs.is_default else act.specs, None if epi.specs.is_default else epi.specs,
                       fused_comm is not None, preact is not None)
    call = Call(x_op, w_op, batch, m, n, routing_data if ragged else None, gather_indx, scatter_indx, act, epi, pc,
                comm=fused_comm)
    if not x.is_cuda:  # Triton's interpreter: corrected, so that it computes what the GPU does
        interpreter.prepare((x_fmt.element, w_fmt.element, y_fmt.element))
    # (a fused-communication scatter takes the top-k reduce for any k: it writes every token's row to the ranks)
    topk = scatter_indx is not None and (routing_data.n_expts_act > 1 or fused_comm is not None)
    flags, matmul_variant, reduce_variant, matmul_out = _launch_choice(variant, call, y, n_out, topk)
    # Launches go to the current device: switch only when x lives elsewhere (the switch costs microseconds).
    other_device = x.is_cuda and x.device.index != torch.cuda.current_device()
    if other_device:
        plans.not_plannable()  # a plan launches on the current device
    try:
        with torch.cuda.device(x.device) if other_device else contextlib.nullcontext():
            if reduce_variant is None:
                if scatter_indx is not None:
                    plans.zero(y)  # tokens whose only gate was dropped get zeros
                _launch_matmul(variant, call, flags, y, bias=bias, betas=betas, gammas=gammas, y_acc_in=y_acc_in,
                               out_alpha=out_alpha, preact=preact)
            else:
                _launch_matmul(matmul_variant, call, flags, matmul_out, bias=bias, betas=betas, gammas=None,
                               y_acc_in=None, out_alpha=out_alpha, split_k=flags.split_k)
                _launch_reduce(reduce_variant, call, matmul_out, y if y.ndim == 3 else y.unsqueeze(0), gammas=gammas,
                               epilogue_values=epi.fn_arg_values_finalize or epi.fn_arg_values_matmul,
                               scatter_src=scatter_indx.src_indx if topk else None)
    except VariantNotBuiltError as exc:
        raise VariantNotBuiltError(f"{exc}. This call's matmul variant: {variant.as_code()}") from None
    return y


def _launch_choice(variant: KernelVariant, call: Call, y: torch.Tensor, n_out: int, topk: bool):
    """(flags, matmul variant, reduce variant or None, the matmul's output) of a call: the launch heuristic's choice
    for its TileProblem, made again without the persistent kernel where TMA cannot describe its tensors."""
    x, w, m, routing = call.x, call.w, call.m, call.routing
    n_expts = routing.n_expts_tot if routing is not None else None
    tokens_per_expt = routing.expected_tokens_per_expt or max(1, m // n_expts) if routing is not None else 0
    # K splits where its partials are summed before anything nonlinear: by a reduce of their own, or by a top-k
    # scatter's combine when no activation comes between the two sums
    can_split = not variant.y_acc_in and not variant.fused_comm and not variant.preact and (
        not variant.scatter or (topk and variant.activation is None))
    w_k_major = variant.w.scaling == "none" and w.stride(-1) != 1
    if w_k_major and routing is not None and m >= _K_CONTIGUOUS_WARN_ROWS:
        _warn_k_contiguous_once(w)
    problem = TileProblem(
        x.element_size(), call.batch, m, call.n, call.k, variant.reduction_n, n_expts, tokens_per_expt, can_split,
        target(x.device).sm_count if x.is_cuda else None, bitwise_invariant=call.pc.enforce_bitwise_invariance,
        constraints=current_constraints(), persistent_blocker=persistent_blocker(variant, x),
        # (a top-k scatter's matmul writes sorted rows, which its reduce sums: that variant's kernel runs)
        ws_blocker=ws_blocker(topk_plan(variant)[0] if topk else variant, x, w, call.n, call.k),
        x_gathered=variant.gather, split_is_free=topk, w_k_major=w_k_major,
        **format_facts(variant.x, variant.w, variant.y),
        mx_scales_n_contiguous=variant.w.scales_apply == "operand" and call.w_op.block_scales.stride(-1) == 1)
    flags = make_opt_flags(problem)
    matmul_variant, reduce_variant, matmul_out = _matmul_output(variant, call, flags, topk, y, n_out)
    if flags.persistent:
        y_by_tma = matmul_out if matmul_variant.persistent_stores_y_by_tma else None
        if (tma_problem := tma_blocker(x, w, variant.gather, y_by_tma)) is not None:
            # the tiled kernel, or the error if persistent was forced
            flags = make_opt_flags(dataclasses.replace(problem, persistent_blocker=tma_problem))
            matmul_variant, reduce_variant, matmul_out = _matmul_output(variant, call, flags, topk, y, n_out)
    return flags, matmul_variant, reduce_variant, matmul_out


def _quantized_activations(x_op: ScaledOperand) -> ScaledOperand:
    """x quantized to e4m3 as the block-scaled weights' format says, per row and 128 columns of K or per row, into
    buffers of the call by a launch its plan replays."""
    x = x_op.values
    block = (1, FP8_BLOCK) if x_op.format.block_size else (1, 0)
    values = plans.new_buffer(tuple(x.shape), torch.float8_e4m3fn, x.device)
    scales = plans.new_buffer(scales_shape(x.shape, block), torch.float32, x.device)
    if scales.numel():
        if not x.is_cuda:
            interpreter.prepare(("e4m3",))
        kernel, grid, args = row_quantization(x, values, scales, block)
        plans.launch(kernel, grid, args)
    return x_op.with_block_scales(values, scales)


def _matmul_output(variant: KernelVariant, call: Call, flags, topk: bool, y: torch.Tensor,
                   n_out: int) -> tuple[KernelVariant, KernelVariant | None, torch.Tensor]:
    """(matmul variant, reduce variant or None, the matmul's output) of a call: y itself, or a buffer for the reduce
    to sum: a top-k scatter's rows in sorted order (scratch in the output dtype, or fp32 split-K partials
    (split, rows, N)), or split-K partials (split, batch, rows, N)."""
    m, n, device = call.m, call.n, call.x.device
    if topk and flags.split_k > 1:
        matmul_variant, reduce_variant = topk_split_k_plan(variant)
        return matmul_variant, reduce_variant, plans.new_buffer((flags.split_k, m, n), torch.float32, device)
    if topk:
        matmul_variant, reduce_variant = topk_plan(variant)
        return matmul_variant, reduce_variant, plans.new_buffer((m, n_out), matmul_variant.y.torch_dtype, device)
    if flags.split_k > 1:
        matmul_variant, reduce_variant = split_k_plan(variant)
        partials = plans.new_buffer((flags.split_k, call.batch, m, n), torch.float32, device)
        return matmul_variant, reduce_variant, partials
    return variant, None, y
