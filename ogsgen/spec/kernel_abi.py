"""The generated kernels' parameters, declared once.

Each kernel (``tiled``: one program per output tile; ``persistent``: TMA-fed, one program per SM; ``reduce``) lists
its parameters in signature order, one source line per tuple. A parameter has a name, the variants that have it,
whether it is a compile-time constant, whether it changes with the number of tokens (then Triton must not
specialize on it, so that one binary serves every batch size), and how the runtime computes its value. The renderer
writes each kernel's signature and ``do_not_specialize`` list from these lists (``signature_lines``,
``per_call_names``); the runtime builds a launch's arguments by walking the same lists (``parameters``), so a
parameter cannot be added to a kernel and forgotten by its launch, or the reverse.

A value function reads the runtime's launch inputs ``a`` (``ogsgen.runtime.arguments``): ``a.call`` (x_op and w_op,
the operands' values with their scales (``ogsgen.spec.operands``), m, n, k, batch, routing, gather_indx,
scatter_indx, act, epi, pc: what every kernel of a call shares), ``a.out`` (the tensor
the kernel writes), the launch's operands (bias, betas, gammas, y_acc_in, out_alpha, split_k, preact), its tile sizes and
the values the runtime derives (descriptors, schedules, program counts).
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Callable

from .variant import KernelVariant

# The ragged TMA descriptors' row bound (ogsgen.runtime.descriptors explains the address arithmetic): the kernels
# compute coordinates relative to it.
RAGGED_ROWS_BOUND = 1 << 30

# Kernel parameter prefixes of closure-function arguments: they keep user argument names from
# colliding with the kernel's own parameters (N, K, ...).
ARG_PREFIX = {"activation": "act_", "epilogue": "epi_"}


def _always(variant: KernelVariant) -> bool:
    return True


@dataclass(frozen=True)
class Param:
    name: str
    value: Callable[[Any], Any]
    when: Callable[[KernelVariant], bool] = _always
    constexpr: bool = False
    per_call: bool = False  # changes with the number of tokens (or experts, programs): not specialized on

    def declaration(self) -> str:
        return f"{self.name}: tl.constexpr" if self.constexpr else self.name


@dataclass(frozen=True)
class FunctionArgs:
    """The arguments of the variant's activation or epilogue, each a parameter named with ``ARG_PREFIX``."""
    kind: str

    def expand(self, variant: KernelVariant) -> tuple[Param, ...]:
        spec = variant.functions().get(self.kind)
        if spec is None:
            return ()
        values = _activation_values if self.kind == "activation" else _epilogue_values
        return tuple(Param(ARG_PREFIX[self.kind] + name, lambda a, i=i: values(a)[i],
                           per_call=name in spec.fn_arg_do_not_specialize)
                     for i, name in enumerate(spec.fn_arg_names))


def _activation_values(a) -> tuple:
    return a.call.act.fn_args


def _epilogue_values(a) -> tuple:
    return a.epilogue_values


# Conditions on the variant.
def _ragged(v): return v.ragged
def _inner(v): return v.inner
def _fused_comm(v): return v.fused_comm
def _not_inner(v): return not v.inner
def _not_ragged(v): return not v.ragged
def _split(v): return v.can_split_k
def _x_mx(v): return v.x.scales_apply == "operand"
def _x_mx_batched(v): return _x_mx(v) and not v.ragged
def _w_mx(v): return v.w.scales_apply == "operand"
def _upcasts(v): return v.upcasts_in_registers
def _x_global(v): return v.x.has_global_scale
def _w_global(v): return v.w.has_global_scale
def _y_flex(v): return v.y.scaling == "flexpoint"
# block scales applied to the products, per K group or in the epilogue (not to the values, as _x_mx / _w_mx)
def _x_scales_products(v): return v.x.has_block_scales and v.x.scales_apply != "operand"
def _w_scales_products(v): return v.w.has_block_scales and v.w.scales_apply != "operand"
def _k_groups(v): return v.w.scales_apply == "k_group"
def _y_scales(v): return v.y.has_block_scales
def _y_scales_batched(v): return _y_scales(v) and not v.ragged
def _y_flex_batched(v): return _y_flex(v) and not v.ragged
def _y_by_pointers(v): return not v.persistent_stores_y_by_tma
def _y_by_pointers_batched(v): return not v.persistent_stores_y_by_tma and not v.ragged
def _persistent_has_pointer_strides(v): return _y_by_pointers(v) or v.y_acc_in or _y_scales(v) or v.preact  # TMA: none
def _acc_batched(v): return v.y_acc_in and not v.ragged
def _preact(v): return v.preact
def _preact_batched(v): return v.preact and not v.ragged
def _gather(v): return v.gather
def _not_gather(v): return not v.gather
def _scatter(v): return v.scatter
def _not_scatter(v): return not v.scatter


def _batch_stride(t) -> int:
    """The stride between a tensor's matrices (the dimension before rows); 0 for a single matrix."""
    return t.stride(-3) if t.ndim >= 3 else 0


def _stride_w_k(a) -> int:
    # Swizzled mxfp4 values are (..., N slabs, K words or bytes): their K stride is the last.
    return a.call.w.stride(-1) if a.variant.w.layout != "strided" else a.call.w.stride(-2)


def _stride_w_n(a) -> int:
    return a.call.w.stride(-2) if a.variant.w.layout != "strided" else a.call.w.stride(-1)


def _even_k(a) -> bool:
    # K steps need no mask (a ragged-K call's segments always take them)
    return a.call.k % a.flags.block_k == 0 and a.call.k > 0 and not a.variant.inner


def _flex_out(a):
    return a.call.pc.flex_ctx.out_data


def _out_scale_batch_stride(a) -> int:
    # one flexpoint output scale per batch entry when there are several, else one for the tensor
    out = _flex_out(a)
    return int(any(s is not None and s.numel() > 1 for s in (out.expected_scale, out.actual_scale)))


def _x_block_scale_stride_m(a) -> int:
    scale = a.call.x_op.block_scales  # one per row, or one for the tensor (a static activation scale)
    return scale.stride(0) if scale.numel() > 1 else 0


def _bias_batch_stride(a) -> int:
    bias = a.bias
    return bias.stride(0) if bias.ndim == 2 and bias.shape[0] > 1 else 0


# Lines shared by the kernels.
_FLEX_OUTPUT = (Param("YExpectedScale", lambda a: _flex_out(a).expected_scale, _y_flex),
                Param("YActualScale", lambda a: _flex_out(a).actual_scale, _y_flex),
                Param("stride_out_scale_b", _out_scale_batch_stride, _y_flex_batched))
_Y_SCALES = (Param("YScale", lambda a: a.call.pc.out_scale, _y_scales),
             Param("stride_ys_b", lambda a: _batch_stride(a.call.pc.out_scale), _y_scales_batched),
             Param("stride_ys_m", lambda a: a.call.pc.out_scale.stride(-2), _y_scales),
             Param("stride_ys_n", lambda a: a.call.pc.out_scale.stride(-1), _y_scales))
_FUNCTION_ARGS = ((FunctionArgs("activation"),), (FunctionArgs("epilogue"),))
_FUNCTIONS = ((Param("ACTIVATION_FN", lambda a: a.call.act.specs.fn, lambda v: v.activation is not None,
                     constexpr=True),),
              (Param("EPILOGUE_FN", lambda a: a.call.epi.specs.fn, lambda v: v.epilogue is not None,
                     constexpr=True),))
_SATURATE = (Param("SATURATE_INF", lambda a: a.call.pc.flexpoint_saturate_inf, _y_flex, constexpr=True),)
_GAMMAS = (Param("Gammas", lambda a: a.gammas, lambda v: v.gammas),)
# Fused communication: every rank's output buffer (int64 addresses), each row's shard (None: all-gather)
_FUSED_COMM = (Param("PeerPtrs", lambda a: a.call.comm.out_handles, _fused_comm),
               Param("ScatterShardIndx", lambda a: a.call.comm.scatter_shard_indx, _fused_comm),
               Param("reduce_rank", lambda a: a.call.comm.reduce_rank, _fused_comm),
               Param("N_REDUCE_SHARDS", lambda a: a.call.comm.n_reduce_shards, _fused_comm, constexpr=True))
_MATMUL_EPILOGUE = (
    (Param("WriteBackIndx", lambda a: a.call.scatter_indx.dst_indx, _scatter),),
    (Param("YAccIn", lambda a: a.y_acc_in, lambda v: v.y_acc_in),
     Param("stride_acc_b", lambda a: _batch_stride(a.y_acc_in), _acc_batched),
     Param("stride_acc_m", lambda a: a.y_acc_in.stride(-2), lambda v: v.y_acc_in),
     Param("stride_acc_n", lambda a: a.y_acc_in.stride(-1), lambda v: v.y_acc_in)),
    # the rows before the activation, kept for the backward
    (Param("PreAct", lambda a: a.preact, _preact),
     Param("stride_z_b", lambda a: _batch_stride(a.preact), _preact_batched),
     Param("stride_z_m", lambda a: a.preact.stride(-2), _preact),
     Param("stride_z_n", lambda a: a.preact.stride(-1), _preact)),
    (Param("Bias", lambda a: a.bias, lambda v: v.bias),
     Param("stride_bias_b", _bias_batch_stride, lambda v: v.bias)),
    (Param("Betas", lambda a: a.betas, lambda v: v.betas),),
    _GAMMAS,
    (Param("out_alpha", lambda a: 1.0 if a.out_alpha is None else float(a.out_alpha)),),
    *_FUNCTION_ARGS,
)
def _at_most(value: int | None, limit: int) -> int | None:
    return None if value is None else min(value, limit)


_MATMUL_TILES = (Param("BLOCK_M", lambda a: a.flags.block_m, constexpr=True),
                 Param("BLOCK_N", lambda a: a.flags.block_n, constexpr=True),
                 Param("BLOCK_K", lambda a: a.flags.block_k, constexpr=True),
                 Param("GROUP_M", lambda a: a.flags.group_m, constexpr=True))
_OFFSETS_64 = Param("OFFSETS_64", lambda a: a.offsets_64, constexpr=True)
_GATHER = (Param("GatherIndx", lambda a: a.call.gather_indx.src_indx, _gather),
           Param("n_expts_act", lambda a: a.call.routing.n_expts_act, _gather, per_call=True))
_M = Param("M", lambda a: a.call.m, lambda v: not v.ragged and not v.inner, per_call=True)
# A ragged-K call's M is a weight's size, not a token count: specialized, its divisibility lets the masked loads of
# x's rows (its contiguous axis) vectorize and go asynchronous
_INNER_M = Param("M", lambda a: a.call.m, _inner)
_N = Param("N", lambda a: a.call.n)
_K = Param("K", lambda a: a.call.k, _not_inner)


def _y_pointer_params(split: bool) -> tuple[Param, ...]:
    # (a fused-communication kernel stores through the ranks' addresses, with Y's row and column strides)
    return (Param("Y", lambda a: a.out, lambda v: not v.fused_comm),
            *((Param("stride_y_s", lambda a: a.out.stride(0) if a.split_k > 1 else 0, _split),) if split else ()),
            Param("stride_y_b", lambda a: _batch_stride(a.out), lambda v: not v.ragged and not v.fused_comm),
            Param("stride_y_m", lambda a: a.out.stride(-2)),
            Param("stride_y_n", lambda a: a.out.stride(-1)))


TILED = (
    _y_pointer_params(split=True),
    (Param("X", lambda a: a.call.x),
     Param("stride_x_b", lambda a: _batch_stride(a.call.x), lambda v: not v.ragged and not (v.inner and v.gather)),
     Param("stride_x_m", lambda a: a.call.x.stride(-2)),
     Param("stride_x_k", lambda a: a.call.x.stride(-1))),
    # MX activations: e8m0 scales per 32 values of K, one row of them per row of x
    (Param("XMxScale", lambda a: a.call.x_op.block_scales, _x_mx),
     Param("stride_xmx_b", lambda a: _batch_stride(a.call.x_op.block_scales), _x_mx_batched),
     Param("stride_xmx_m", lambda a: a.call.x_op.block_scales.stride(-2), _x_mx),
     Param("stride_xmx_k", lambda a: a.call.x_op.block_scales.stride(-1), _x_mx)),
    (Param("W", lambda a: a.call.w),
     Param("stride_w_b", lambda a: _batch_stride(a.call.w)),
     Param("stride_w_k", _stride_w_k),
     Param("stride_w_n", _stride_w_n)),
    (Param("WMxScale", lambda a: a.call.w_op.block_scales, _w_mx),
     Param("stride_wmx_b", lambda a: _batch_stride(a.call.w_op.block_scales), _w_mx),
     Param("stride_wmx_k", lambda a: a.call.w_op.block_scales.stride(-2), _w_mx),
     Param("stride_wmx_n", lambda a: a.call.w_op.block_scales.stride(-1), _w_mx)),
    (Param("XScale", lambda a: a.call.x_op.global_scale, _x_global),),
    (Param("WScale", lambda a: a.call.w_op.global_scale, _w_global),
     Param("stride_wscale_b", lambda a: int(a.call.w_op.global_scale_per_batch), _w_global)),
    # fp8 with float32 block scales: x's per row (and 128 columns of K), w's per column or 128 (and 128 rows of K)
    (Param("XBlockScales", lambda a: a.call.x_op.block_scales, _x_scales_products),
     Param("stride_xbs_m", _x_block_scale_stride_m, _x_scales_products),
     Param("stride_xbs_k", lambda a: a.call.x_op.block_scales.stride(-1), _k_groups)),
    (Param("WBlockScales", lambda a: a.call.w_op.block_scales, _w_scales_products),
     Param("stride_wbs_b", lambda a: _batch_stride(a.call.w_op.block_scales), _w_scales_products),
     Param("stride_wbs_k", lambda a: a.call.w_op.block_scales.stride(-2), _k_groups),
     Param("stride_wbs_n", lambda a: a.call.w_op.block_scales.stride(-1), _w_scales_products),
     Param("W_SCALE_BLOCK_N", lambda a: a.call.w_op.scale_block_n, _k_groups, constexpr=True),
     Param("SWAP_AB", lambda a: a.flags.swap_ab, _k_groups, constexpr=True)),
    _FLEX_OUTPUT,
    _Y_SCALES,
    (Param("SliceSizes", lambda a: a.call.routing.expt_data.slice_sizes, _ragged),
     Param("SliceOffs", lambda a: a.call.routing.expt_data.slice_offs, _ragged),
     Param("BlockSchedule", lambda a: a.call.routing.expt_data.block_schedule(a.flags.block_m), _ragged),
     Param("n_row_tiles", lambda a: a.n_row_tiles, _ragged, per_call=True)),
    # Ragged K: expert e's segment of x's columns and w's rows (unpadded at SliceOffs[e], padded at
    # BlockOffs[e] * BLOCK_K).
    (Param("SliceSizes", lambda a: a.call.routing.expt_data.slice_sizes, _inner),
     Param("SliceOffs", lambda a: a.call.routing.expt_data.slice_offs, _inner),
     Param("BlockOffs", lambda a: a.call.routing.expt_data.block_offs(a.flags.block_k), _inner),
     Param("n_batches", lambda a: a.call.batch, _inner, per_call=True),
     Param("n_programs", lambda a: a.tiled_grid()[0], _inner, per_call=True)),
    _GATHER,
    *_MATMUL_EPILOGUE,
    _FUSED_COMM,
    (_M, _INNER_M, _N, _K, Param("split_k", lambda a: a.split_k, _split)),
    *_FUNCTIONS,
    (Param("DOT_PRECISION", lambda a: "tf32" if a.call.pc.allow_tf32 else "ieee", lambda v: v.x.element == "fp32",
           constexpr=True),),
    # (at most the K of one dot, BLOCK_K, as Triton asks: promoting more often than asked is only more precise)
    (Param("MAX_NUM_IMPRECISE_ACC", lambda a: _at_most(a.call.pc.max_num_imprecise_acc, a.flags.block_k),
           lambda v: v.fp8_dot or v.folds_mx_scales,
           constexpr=True),),
    _SATURATE,
    _MATMUL_TILES,
    (Param("X_PADDED", lambda a: a.call.inner.x_is_padded, lambda v: v.inner and not v.gather, constexpr=True),
     Param("W_PADDED", lambda a: a.call.inner.w_is_padded, _inner, constexpr=True)),
    (Param("EVEN_K", _even_k, constexpr=True),
     Param("WAIT_MMA", lambda a: a.flags.wait_mma, _upcasts, constexpr=True),
     _OFFSETS_64),
)

PERSISTENT = (
    tuple(Param(p.name, p.value, lambda v, when=p.when: _y_by_pointers(v) and when(v))
          for p in _y_pointer_params(split=False)),
    # A gather's x rows are read by pointers (TMA cannot gather rows on Hopper), other x by XDesc.
    (Param("X", lambda a: a.call.x, _gather),
     Param("stride_x_m", lambda a: a.call.x.stride(-2), _gather),
     Param("stride_x_k", lambda a: a.call.x.stride(-1), _gather),
     Param("XDesc", lambda a: a.x_desc, _not_gather),
     Param("WDesc", lambda a: a.w_desc),
     Param("YDesc", lambda a: a.y_desc, lambda v: v.persistent_stores_y_by_tma)),
    _FLEX_OUTPUT,
    _Y_SCALES,
    (Param("SliceSizes", lambda a: a.call.routing.expt_data.slice_sizes, _ragged),
     Param("SliceOffs", lambda a: a.call.routing.expt_data.slice_offs, _ragged),
     Param("BlockOffs", lambda a: a.call.routing.expt_data.block_offs(a.flags.block_m), _ragged),
     Param("BlockSchedule", lambda a: a.call.routing.expt_data.block_schedule(a.flags.block_m), _ragged),
     Param("n_expts_tot", lambda a: a.call.routing.n_expts_tot, _ragged, per_call=True)),
    _GATHER,
    *_MATMUL_EPILOGUE,
    (_M, Param("n_batches", lambda a: a.call.batch, _not_ragged, per_call=True), _N, _K,
     Param("n_programs", lambda a: a.n_programs, per_call=True)),
    *_FUNCTIONS,
    _SATURATE,
    (*_MATMUL_TILES, Param("W_K_MAJOR", lambda a: a.w_k_major, constexpr=True),
     Param("EVEN_K", _even_k, _gather, constexpr=True),
     Param("OFFSETS_64", lambda a: a.offsets_64, _persistent_has_pointer_strides, constexpr=True)),
)

def _gluon_activation(a):
    from ..numerics.gluon_hopper import as_gluon  # (Gluon is imported where a call takes the kernel)
    return as_gluon(a.call.act.specs.fn)


# The warp-specialized kernel (fp8e4m3_b128, Gluon): its partitions take every parameter too, then the shared-memory
# slots and barriers. Tiles are 128 x 128 (BLOCK_N) with 128-deep K steps; STAGES slots are the launch's.
WARP_SPECIALIZED = (
    (Param("Y", lambda a: a.out), Param("stride_y_m", lambda a: a.out.stride(-2)),
     Param("stride_y_n", lambda a: a.out.stride(-1))),
    # A gather's x rows are copied by pointers (TMA cannot gather rows on Hopper), other x by XDesc.
    (Param("X", lambda a: a.call.x, _gather),
     Param("stride_x_m", lambda a: a.call.x.stride(-2), _gather),
     Param("XDesc", lambda a: a.ws_x_desc, _not_gather),
     Param("WDesc", lambda a: a.ws_w_desc)),
    (Param("XBlockScales", lambda a: a.call.x_op.block_scales),
     Param("stride_xbs_m", _x_block_scale_stride_m),
     Param("stride_xbs_k", lambda a: a.call.x_op.block_scales.stride(-1))),
    (Param("WBlockScales", lambda a: a.call.w_op.block_scales),
     Param("stride_wbs_b", lambda a: _batch_stride(a.call.w_op.block_scales)),
     Param("stride_wbs_k", lambda a: a.call.w_op.block_scales.stride(-2)),
     Param("stride_wbs_n", lambda a: a.call.w_op.block_scales.stride(-1)),
     Param("W_SCALE_BLOCK_N", lambda a: a.call.w_op.scale_block_n, constexpr=True)),
    (Param("SliceSizes", lambda a: a.call.routing.expt_data.slice_sizes),
     Param("SliceOffs", lambda a: a.call.routing.expt_data.slice_offs),
     Param("BlockOffs", lambda a: a.call.routing.expt_data.block_offs(a.flags.block_m)),
     Param("BlockSchedule", lambda a: a.call.routing.expt_data.block_schedule(a.flags.block_m)),
     Param("n_expts_tot", lambda a: a.call.routing.n_expts_tot, per_call=True)),
    _GATHER,
    *_MATMUL_EPILOGUE,
    (_N, _K),
    (Param("ACTIVATION_FN", _gluon_activation, lambda v: v.activation is not None, constexpr=True),),
    (Param("BLOCK_N", lambda a: a.flags.block_n, constexpr=True),
     Param("STAGES", lambda a: a.flags.num_stages, constexpr=True)),
)

REDUCE = (
    (Param("Y", lambda a: a.out, lambda v: not v.fused_comm),
     Param("stride_y_b", lambda a: a.out.stride(0), lambda v: not v.fused_comm),
     Param("stride_y_m", lambda a: a.out.stride(1)),
     Param("stride_y_n", lambda a: a.out.stride(2))),
    # A scatter's partials: (rows, N), or split-K partials (split, rows, N) of the sorted rows.
    (Param("X", lambda a: a.parts, _scatter),
     Param("stride_x_s", lambda a: a.parts.stride(0) if a.parts.ndim == 3 else 0, _scatter),
     Param("stride_x_m", lambda a: a.parts.stride(-2), _scatter),
     Param("stride_x_n", lambda a: a.parts.stride(-1), _scatter)),
    (Param("ScatterSrcIndx", lambda a: a.scatter_src, _scatter),),
    # Split-K partials (split, batch, rows, N).
    (Param("X", lambda a: a.parts, _not_scatter),
     Param("stride_x_s", lambda a: a.parts.stride(0), _not_scatter),
     Param("stride_x_b", lambda a: a.parts.stride(1), _not_scatter),
     Param("stride_x_m", lambda a: a.parts.stride(-2), _not_scatter),
     Param("stride_x_n", lambda a: a.parts.stride(-1), _not_scatter)),
    (Param("SliceOffs", lambda a: a.call.routing.expt_data.slice_offs if a.call.routing else None, _not_scatter),
     Param("n_expts_tot", lambda a: a.call.routing.n_expts_tot if a.call.routing else 0, _not_scatter,
           per_call=True)),
    _GAMMAS,
    _FLEX_OUTPUT,
    _Y_SCALES,
    _FUSED_COMM,
    *_FUNCTION_ARGS,
    (Param("M", lambda a: a.m, per_call=True), Param("N", lambda a: a.n),
     Param("split_k", lambda a: a.parts.shape[0] if a.parts.ndim == 3 else 1, _scatter),
     Param("S", lambda a: a.parts.shape[0], _not_scatter)),
    *_FUNCTIONS,
    _SATURATE,
    (Param("S", lambda a: a.scatter_src.shape[0] // a.m, _scatter, constexpr=True),
     Param("RAGGED", lambda a: a.call.routing is not None, _not_scatter, constexpr=True)),
    (Param("BLOCK_M", lambda a: a.block_m, constexpr=True), Param("BLOCK_N", lambda a: a.block_n, constexpr=True),
     _OFFSETS_64),
)

KERNELS = {"tiled": TILED, "persistent": PERSISTENT, "warp_specialized": WARP_SPECIALIZED, "reduce": REDUCE}


@lru_cache(maxsize=4096)
def _present_lines(variant: KernelVariant, kernel: str) -> tuple[tuple[Param, ...], ...]:
    lines = []
    for line in KERNELS[kernel]:
        params = []
        for entry in line:
            if isinstance(entry, FunctionArgs):
                params.extend(entry.expand(variant))
            elif entry.when(variant):
                params.append(entry)
        if params:
            lines.append(tuple(params))
    return tuple(lines)


@lru_cache(maxsize=4096)
def parameters(variant: KernelVariant, kernel: str) -> tuple[Param, ...]:
    """The parameters of ``variant``'s ``kernel`` (a key of ``KERNELS``), in signature order."""
    return tuple(p for line in _present_lines(variant, kernel) for p in line)


def signature_lines(variant: KernelVariant, kernel: str) -> list[str]:
    """The kernel's parameter list as source lines (without indentation), each ending in a comma."""
    return [", ".join(p.declaration() for p in line) + "," for line in _present_lines(variant, kernel)]


def per_call_names(variant: KernelVariant, kernel: str) -> list[str]:
    """The kernel's ``do_not_specialize`` list."""
    return sorted(p.name for p in parameters(variant, kernel) if p.per_call)


def kernel_of(variant: KernelVariant, persistent: bool = False) -> str:
    """The name in ``KERNELS`` of the variant's kernel (its persistent one with ``persistent``)."""
    if variant.family == "reduce":
        return "reduce"
    return "persistent" if persistent else "tiled"
