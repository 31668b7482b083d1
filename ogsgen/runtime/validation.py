"""Checks of a ``matmul_ogs`` call's arguments (types, devices, shapes, strides, formats, scales, routing) and the
formats they imply; each bad argument raises an OgsgenError that names it and the fix."""
from __future__ import annotations

import dataclasses
from functools import lru_cache

import torch

from ..devices import check_kernel_device, target
from ..errors import SpecError, SpecTypeError, UnsupportedError
from ..moe.metadata import RaggedTensorMetadata
from ..numerics.layouts import HOPPER_GROUP, HOPPER_SLAB, SwizzledMxValues
from ..numerics.mx import MX_BLOCK
from ..spec.formats import (FLEX_BY_DTYPE, FP8_BLOCK, FP8_E4M3_B128, FP8_E4M3_CHANNEL, MX_FP8_BY_DTYPE, MXFP4,
                            MXFP4_HOPPER, plain_format_of)
from ..spec.variant import KernelVariant
from ..types import (Epilogue, FlexCtx, FusedActivation, FusedComm, GatherIndx, InFlexData, OutFlexData,
                     PrecisionConfig, RoutingData, ScatterIndx)
from .opt_flags import row_tiles




def check_tensor(value, name: str, ndims=None, dtype=None, required=False):
    if value is None and not required:
        return
    if not isinstance(value, torch.Tensor):
        raise SpecTypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    if ndims is not None and value.ndim not in ndims:
        raise SpecError(f"{name} must have {' or '.join(map(str, ndims))} dimensions, got shape {tuple(value.shape)}")
    if dtype is not None and value.dtype != dtype:
        raise SpecError(f"{name} must be {dtype}, got {value.dtype}; convert it with .to({dtype})")


def check_vector(value, name: str, length: int, dtype):
    """A contiguous 1-D tensor of ``length`` elements of ``dtype`` (indices, betas, gammas)."""
    if value is None or (value.__class__ is torch.Tensor and value.dtype == dtype and value.shape == (length,)
                         and (length < 2 or value.stride(0) == 1)):
        return  # the common case in one expression: this runs for every index tensor of every call
    check_tensor(value, name, ndims=(1,), dtype=dtype)
    if value.shape[0] != length or (value.stride(0) != 1 and length > 1):
        raise SpecError(f"{name} must be a contiguous {dtype} vector of length {length}, got shape "
                        f"{tuple(value.shape)} and stride {value.stride()}")


def check_devices(x, tensors: dict):
    check_kernel_device(x, "x")
    for name, t in tensors.items():
        if t.device != x.device:
            raise SpecError(f"{name} is on {t.device} but x is on {x.device}; move all tensors to one device")


def check_argument_types(x, w, routing_data, gather_indx, scatter_indx, pc, act, epi) -> None:
    """The arguments are of the types the API takes (read before anything reads their fields)."""
    check_tensor(x, "x", required=True)
    if not isinstance(w, SwizzledMxValues):
        check_tensor(w, "w", required=True)
    for name, value, kind, example in (
            ("precision_config", pc, PrecisionConfig, "ogsgen.PrecisionConfig(out_dtype=...)"),
            ("fused_activation", act, FusedActivation, "ogsgen.FusedActivation(ogsgen.swiglu, (alpha, limit))"),
            ("epilogue", epi, Epilogue, "ogsgen.Epilogue(specs, values)"),
            ("routing_data", routing_data, RoutingData, "from ogsgen.routing(logits, k)"),
            ("gather_indx", gather_indx, GatherIndx, "from ogsgen.routing(logits, k)"),
            ("scatter_indx", scatter_indx, ScatterIndx, "from ogsgen.routing(logits, k)")):
        if value is not None and not isinstance(value, kind):
            article = "an" if kind.__name__[0] in "AEIOU" else "a"
            raise SpecTypeError(f"{name} must be {article} {kind.__name__} or None ({example}), got "
                                f"{type(value).__name__}")
    if not isinstance(pc.flex_ctx, FlexCtx):
        raise SpecTypeError(f"precision_config.flex_ctx must be a FlexCtx, got {type(pc.flex_ctx).__name__}")
    flex = pc.flex_ctx
    for name, value, kind in (("lhs_data", flex.lhs_data, InFlexData), ("rhs_data", flex.rhs_data, InFlexData),
                              ("acc_data", flex.acc_data, InFlexData), ("out_data", flex.out_data, OutFlexData)):
        if not isinstance(value, kind):
            raise SpecTypeError(f"precision_config.flex_ctx.{name} must be an ogsgen.{kind.__name__}, got "
                                f"{type(value).__name__}")
    for name in ("allow_tf32", "enforce_bitwise_invariance", "flexpoint_saturate_inf"):
        if not isinstance(getattr(pc, name), bool):
            raise SpecTypeError(f"precision_config.{name} must be True or False, got {getattr(pc, name)!r}")
    if pc.out_dtype is not None and not isinstance(pc.out_dtype, torch.dtype):
        raise SpecTypeError(f"precision_config.out_dtype must be a torch.dtype (e.g. torch.float32) or None, got "
                            f"{pc.out_dtype!r}")
    if pc.max_num_imprecise_acc is not None and (not isinstance(pc.max_num_imprecise_acc, int)
                                                 or isinstance(pc.max_num_imprecise_acc, bool)
                                                 or pc.max_num_imprecise_acc < 0):
        raise SpecTypeError(f"precision_config.max_num_imprecise_acc must be a non-negative int (K values an fp8 dot "
                            f"sums in the tensor cores' reduced precision before adding to float32) or None, got "
                            f"{pc.max_num_imprecise_acc!r}")
    if routing_data is not None:
        for name in ("n_expts_tot", "n_expts_act"):
            value = getattr(routing_data, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise SpecTypeError(f"routing_data.{name} must be a positive int, got {value!r}")
        if routing_data.expt_data is not None and not isinstance(routing_data.expt_data, RaggedTensorMetadata):
            raise SpecTypeError(f"routing_data.expt_data must be None or a RaggedTensorMetadata (from "
                                f"ogsgen.moe.make_ragged_tensor_metadata), got {type(routing_data.expt_data).__name__}")


def check_distinct_elements(tensors: dict) -> None:
    """Written tensors whose elements do not overlap each other (an expanded tensor's do, and rows closer together
    than their length: programs would store to the same memory). Taken by increasing stride, each dimension must
    step past the span of the ones before it; that also refuses the few layouts whose dimensions interleave
    without overlapping (strides (2, 3) for shape (3, 2)), which no allocation makes."""
    for name, t in tensors.items():
        if t.numel() == 0:
            continue
        span = 0  # the elements the dimensions of smaller strides reach past the first one
        for stride, size in sorted((abs(stride), size) for size, stride in zip(t.shape, t.stride()) if size > 1):
            if stride <= span:
                raise SpecError(f"{name} (shape {tuple(t.shape)}, strides {t.stride()}) has elements that overlap "
                                f"each other in memory{' (an expanded tensor)' if stride == 0 else ''}: the kernels "
                                f"would store several results to one address; pass a tensor with distinct elements, "
                                f"such as torch.empty's")
            span += (size - 1) * stride


def is_lazy_view(t: torch.Tensor) -> bool:
    """Whether torch keeps ``t``'s negation or conjugation as a flag (``torch._neg_view``, the imaginary part of a
    ``conj()`` view) and not in its memory, which is what a kernel reads and writes."""
    return t.is_neg() or t.is_conj()


def resolve_lazy_views(written: dict, arguments: tuple) -> tuple:
    """``arguments`` (a call's) with each lazily negated or conjugated tensor in them (themselves, their tuples'
    items and their dataclasses' fields, at any depth) replaced by a copy holding its values; the very same
    objects where there is none. A written tensor (``written``: by argument name) with the flag is refused: the
    kernels would write a copy, not it."""
    for name, t in written.items():
        if is_lazy_view(t):
            raise SpecError(f"{name} is a lazily negated or conjugated view ({name}.is_neg() or {name}.is_conj() is "
                            f"set): torch negates the values in its memory when it reads them, so what the kernels "
                            f"write there would read back negated; pass a tensor without the flag (and negate or "
                            f"conjugate the result afterwards)")
    return _resolved(arguments)


def _resolved(value):
    if isinstance(value, torch.Tensor):
        return value.resolve_neg().resolve_conj() if is_lazy_view(value) else value
    if isinstance(value, tuple):
        items = tuple(_resolved(item) for item in value)
        return value if all(new is old for new, old in zip(items, value)) else items
    fields = getattr(value, "__dataclass_fields__", None)
    if fields is None or isinstance(value, type):
        return value
    changed = {}
    for name, field in fields.items():
        if field.init and (new := _resolved(old := getattr(value, name))) is not old:
            changed[name] = new
    return dataclasses.replace(value, **changed) if changed else value


def check_fused_comm(comm, x, y, batched: bool, y_acc_in, out_rows: int) -> None:
    """A FusedComm the kernels can write through: its ranks' addresses, shards and this rank's buffer ``y``."""
    if not isinstance(comm, FusedComm):
        raise SpecTypeError(f"fused_comm must be an ogsgen.FusedComm, got {type(comm).__name__}")
    for name, used in (("batched x (3-D)", batched), ("y_acc_in", y_acc_in is not None)):
        if used:
            raise UnsupportedError(f"fused_comm writes the output rows to the ranks' buffers, not with {name}")
    handles = comm.out_handles
    check_tensor(handles, "fused_comm.out_handles", ndims=(1,), required=True)
    if handles.dtype not in (torch.int64, torch.uint64):
        raise SpecError(f"fused_comm.out_handles must hold int64 addresses of the ranks' buffers (e.g. "
                        f"torch.tensor(symm_mem_handle.buffer_ptrs, dtype=torch.int64)), got {handles.dtype}")
    world, shards = handles.numel(), comm.n_reduce_shards
    if not isinstance(shards, int) or isinstance(shards, bool) or shards < 1 or world % shards:
        raise SpecError(f"fused_comm.n_reduce_shards must be a positive int dividing the {world} ranks of "
                        f"out_handles, got {shards!r}")
    if not isinstance(comm.reduce_rank, int) or isinstance(comm.reduce_rank, bool) or \
            not 0 <= comm.reduce_rank < shards:
        raise SpecError(f"fused_comm.reduce_rank must be an int in [0, n_reduce_shards={shards}), got "
                        f"{comm.reduce_rank!r}")
    if comm.scatter_shard_indx is None:
        if world != shards:
            raise SpecError(f"fused_comm without scatter_shard_indx all-gathers the rows over n_reduce_shards ranks, "
                            f"but out_handles has {world}: pass n_reduce_shards={world} or a scatter_shard_indx")
    else:
        check_vector(comm.scatter_shard_indx, "fused_comm.scatter_shard_indx", out_rows, torch.int32)
    if y is None:
        raise SpecError(f"fused_comm needs y, this rank's own buffer among out_handles, of shape (rows * "
                        f"n_reduce_shards, N) = ({out_rows * shards}, N)")
    check_devices(x, {"fused_comm.out_handles": handles, "y": y, **(
        {"fused_comm.scatter_shard_indx": comm.scatter_shard_indx} if comm.scatter_shard_indx is not None else {})})
    if x.device.type != "cuda":  # free on the host: the addresses and shards are there
        if y.data_ptr() not in handles.tolist():
            raise SpecError("y must be this rank's own buffer, one of fused_comm.out_handles (its address is not "
                            "among them)")
        if comm.scatter_shard_indx is not None and out_rows:
            shard = comm.scatter_shard_indx
            if int(shard.min()) < 0 or int(shard.max()) >= world // shards:
                raise SpecError(f"fused_comm.scatter_shard_indx must name shards in [0, {world // shards}) "
                                f"(ranks / n_reduce_shards)")


def check_acc_scale(pc: PrecisionConfig) -> None:
    """``acc_scale`` would scale y_acc_in (y = result + acc_scale * y_acc_in), which no kernel does."""
    if not isinstance(pc.acc_scale, (int, float)) or pc.acc_scale != 1:
        raise UnsupportedError(f"precision_config.acc_scale={pc.acc_scale!r} is not supported (it would scale "
                               f"y_acc_in: y = result + acc_scale * y_acc_in; triton_kernels' matmul_ogs ignores it): "
                               f"leave it 1.0 and scale y_acc_in itself, y_acc_in * acc_scale (or "
                               f"y_acc_in.mul_(acc_scale) when y_acc_in is y)")


def reject_unsupported(pc: PrecisionConfig):
    check_acc_scale(pc)
    unsupported = {
        "precision_config.flex_ctx.acc_data (a y_acc_in scale)": pc.flex_ctx.acc_data.scale is not None,
    }
    for name, used in unsupported.items():
        if used:
            raise UnsupportedError(f"{name} is not supported by this ogsgen build yet; leave it None")
    if pc.act_scale is None:
        return
    check_tensor(pc.act_scale, "precision_config.act_scale")
    if pc.act_scale.dtype == torch.float32:
        if getattr(pc.weight_scale, "dtype", None) not in (torch.float32, torch.uint8):
            raise SpecError("precision_config.act_scale of float32 is the scale of an e4m3 x for fp8e4m3_b128, "
                            "fp8e4m3_channel or mxfp4 weights, which need their precision_config.weight_scale as well "
                            "(ogsgen.prepare_expert_weights(..., format='fp8e4m3_b128').precision_config())")
    elif pc.act_scale.dtype != torch.uint8:
        raise SpecError(f"precision_config.act_scale must be uint8 (the e8m0 scales of an mxfp8 x, one per "
                        f"{MX_BLOCK} values of K: ogsgen.numerics.quantize_mx(x, 'e4m3') makes x and them) or "
                        f"float32 (the scales of an e4m3 x for fp8e4m3_b128 or fp8e4m3_channel weights), got "
                        f"{pc.act_scale.dtype}")


def reinterpret(tensor, flex_dtype, name):
    """Flexpoint data may arrive as raw bytes with its fp8 dtype in the InFlexData."""
    if flex_dtype is not None and tensor.dtype == torch.uint8 and flex_dtype in FLEX_BY_DTYPE:
        return tensor.view(flex_dtype)
    if flex_dtype is not None and tensor.dtype != flex_dtype:
        raise SpecError(f"{name} has dtype {tensor.dtype} but its InFlexData says {flex_dtype}")
    return tensor


def _unwrap_swizzled(w, x):
    """(values tensor, its format, logical K) of a swizzled ``w``; checks it is whole and made for x's GPU."""
    data = w.data
    words = (-(-w.n // HOPPER_SLAB), -(-w.k // HOPPER_GROUP) * HOPPER_GROUP * 2)
    if w.layout != "hopper" or not isinstance(data, torch.Tensor) or data.dtype != torch.int32 \
            or data.ndim not in (2, 3) or tuple(data.shape[-2:]) != words:
        raise SpecError(f"w is a SwizzledMxValues whose data does not hold K={w.k} x N={w.n} values in the hopper "
                        f"layout (int32, (..., {words[0]}, {words[1]})); make it with ogsgen.swizzle_mx_values")
    if x.is_cuda:
        capability = target(x.device).capability
        if capability[0] != w.capability[0]:
            raise SpecError(f"w was swizzled (layout {w.layout!r}) for a compute capability "
                            f"{w.capability[0]}.{w.capability[1]} GPU but x is on a {capability[0]}.{capability[1]} "
                            f"GPU; swizzle the strided values for this GPU: "
                            f"ogsgen.swizzle_mx_values(ogsgen.unswizzle_mx_values(w))")
    return w.data, MXFP4_HOPPER, w.k


def operand_formats(x, w, pc: PrecisionConfig):
    """(x format, w format, y format, logical K) of a call, from dtypes and the precision config."""
    if _mx_activations(pc):
        x_fmt = _mx_activation_format(x)
    elif x.dtype in FLEX_BY_DTYPE:
        x_fmt = FLEX_BY_DTYPE[x.dtype]
    else:
        x_fmt = plain_format_of(x.dtype, "x")
    k = w.shape[-2]
    if isinstance(w, SwizzledMxValues):
        if pc.weight_scale is None:
            raise SpecError("w holds swizzled mxfp4 values but precision_config.weight_scale is None; pass their "
                            "e8m0 scales")
        w, w_fmt, k = _unwrap_swizzled(w, x)
    elif pc.weight_scale is not None and w.dtype == torch.float8_e4m3fn and \
            getattr(pc.weight_scale, "dtype", None) == torch.float32:
        w_fmt = _block_f32_weight_format(w, pc.weight_scale)
        x_fmt = _block_f32_activation_format(x, pc.act_scale, w_fmt)
    elif pc.weight_scale is not None:
        if w.dtype == torch.uint8:
            w_fmt, k = MXFP4, 2 * w.shape[-2]  # two e2m1 values per byte along K
        elif w.dtype in MX_FP8_BY_DTYPE:
            if w.dtype == torch.float8_e4m3fn and isinstance(pc.weight_scale, torch.Tensor) and \
                    pc.weight_scale.is_floating_point():  # (block scales of another float dtype: not e8m0 bytes)
                raise SpecError(f"precision_config.weight_scale of e4m3 w must be float32 (fp8e4m3_b128 or "
                                f"fp8e4m3_channel scales: convert it with .float()) or uint8 (the e8m0 scales of "
                                f"mxfp8 weights), got {pc.weight_scale.dtype}")
            w_fmt = MX_FP8_BY_DTYPE[w.dtype]
        else:
            raise SpecError(f"precision_config.weight_scale makes w an mx tensor: w must be uint8 (packed mxfp4, "
                            f"two values per byte along K) or float8 (mxfp8 with uint8 scales, or e4m3 with float32 "
                            f"scales: fp8e4m3_b128, fp8e4m3_channel), got {w.dtype}")
    elif w.dtype in FLEX_BY_DTYPE:
        w_fmt = FLEX_BY_DTYPE[w.dtype]
    elif w.dtype == torch.uint8:
        raise SpecError("w is uint8 (packed mxfp4) but precision_config.weight_scale is None; pass its e8m0 scales")
    else:
        w_fmt = plain_format_of(w.dtype, "w")
        if w_fmt != x_fmt and x_fmt.scaling == "none":
            raise SpecError(f"w.dtype ({w.dtype}) must equal x.dtype ({x.dtype}); convert one with .to()")
    if w_fmt.element == "e2m1" and getattr(pc.act_scale, "dtype", None) == torch.float32:
        x_fmt = _e4m3_rows_format(x, pc)
    elif w_fmt.scaling == "block_e8m0" and getattr(pc.act_scale, "dtype", None) == torch.float32:
        # (no kernel reads it: taken silently, it would be ignored)
        raise SpecError("precision_config.act_scale of float32 is the scale of an e4m3 x for fp8e4m3_b128, "
                        "fp8e4m3_channel or mxfp4 weights; mxfp8 weights take bf16 or fp16 x (without act_scale) or an "
                        "mxfp8 x with uint8 e8m0 act_scale (ogsgen.numerics.quantize_mx(x, 'e4m3') makes both): drop "
                        "act_scale or pass the mxfp8 x's e8m0 scales")
    if pc.out_scale is not None:  # an MX output: fp8 values and e8m0 scales per 32 columns
        out_dtype = pc.out_dtype or torch.float8_e4m3fn
        if out_dtype not in MX_FP8_BY_DTYPE:
            raise SpecError(f"precision_config.out_scale makes the output mxfp8: out_dtype must be a float8 dtype "
                            f"(or None for e4m3), got {out_dtype}")
        y_fmt = MX_FP8_BY_DTYPE[out_dtype]
    else:
        # x's dtype for a plain or a 16-bit x; bf16 for an fp8 x and for an fp32 x quantized here (fp8 block weights)
        out_dtype = pc.out_dtype or (x.dtype if x.dtype.itemsize == 2 or x_fmt.scaling == "none" else torch.bfloat16)
        y_fmt = FLEX_BY_DTYPE[out_dtype] if out_dtype in FLEX_BY_DTYPE else plain_format_of(out_dtype,
                                                                                         "precision_config.out_dtype")
    if x.is_cuda and any(f.bits == 8 for f in (x_fmt, w_fmt, y_fmt)):
        _check_fp8_hardware(x.device)
    problem = _unsupported_formats(x_fmt, w_fmt, y_fmt)
    if problem:
        raise SpecError(f"x {x.dtype} with w {w.dtype} ({w_fmt.name}) and output {out_dtype}: {problem}")
    return x_fmt, w_fmt, y_fmt, k


def _mx_activations(pc: PrecisionConfig) -> bool:
    """Whether precision_config.act_scale holds e8m0 scales (uint8): x is then mxfp8."""
    return pc.act_scale is not None and pc.act_scale.dtype == torch.uint8


def _mx_activation_format(x):
    if x.dtype not in MX_FP8_BY_DTYPE:
        raise SpecError(f"precision_config.act_scale of uint8 (e8m0 scales) makes x mxfp8: x must be "
                        f"torch.float8_e4m3fn or torch.float8_e5m2, got {x.dtype}; "
                        f"ogsgen.numerics.quantize_mx(x, 'e4m3') makes x's values and scales from a bf16 x")
    return MX_FP8_BY_DTYPE[x.dtype]


def _e4m3_rows_format(x, pc: PrecisionConfig):
    """x's format with mxfp4 w and a float32 precision_config.act_scale: e4m3 scaled per row (or one scale)."""
    if x.dtype != torch.float8_e4m3fn:
        raise SpecError(f"precision_config.act_scale of float32 is the scale of an e4m3 x, but x is {x.dtype}; pass "
                        f"x quantized (ogsgen.numerics.quantize_fp8(x, (1, 0)) gives x per row and its scales) or "
                        f"drop act_scale")
    if pc.flex_ctx.lhs_data.scale is not None:
        raise SpecError("x has two scales, precision_config.act_scale and precision_config.flex_ctx.lhs_data.scale; "
                        "pass one of them")
    return FP8_E4M3_CHANNEL


def _block_f32_weight_format(w, scale):
    """fp8e4m3_b128 or fp8e4m3_channel: e4m3 w with float32 weight scales, told apart by the scales' shape."""
    k, n = w.shape[-2:]
    blocks = (-(-k // FP8_BLOCK), -(-n // FP8_BLOCK))
    # (with K <= 128, one scale per column is both: the channel kernel, which scales once after the K loop)
    expected = {blocks: FP8_E4M3_B128, (blocks[0], n): FP8_E4M3_B128, (1, n): FP8_E4M3_CHANNEL}
    batch = tuple(w.shape[:-2])
    if scale.ndim != w.ndim or tuple(scale.shape[:-2]) != batch or tuple(scale.shape[-2:]) not in expected:
        raise SpecError(f"precision_config.weight_scale for w of shape {tuple(w.shape)} (K={k}, N={n}) must be "
                        f"{(*batch, 1, n)} (one scale per column: fp8e4m3_channel) or {(*batch, *blocks)} / "
                        f"{(*batch, blocks[0], n)} (per {FP8_BLOCK} x {FP8_BLOCK} block, or per {FP8_BLOCK} rows "
                        f"and column: fp8e4m3_b128), got {tuple(scale.shape)}; ogsgen.prepare_expert_weights makes "
                        f"them from a checkpoint")
    return expected[tuple(scale.shape[-2:])]


def _block_f32_activation_format(x, act_scale, w_fmt):
    """x's format with block-scaled fp8 w: w's (matmul_ogs quantizes a bf16, fp16 or fp32 x to it; an e4m3 x
    comes with its scales in precision_config.act_scale)."""
    if act_scale is not None and act_scale.dtype == torch.uint8:
        raise SpecError(f"precision_config.act_scale of uint8 makes x mxfp8, which {w_fmt.name} weights do not take: "
                        f"pass bf16 x (matmul_ogs quantizes it) or e4m3 x with float32 scales "
                        f"(ogsgen.numerics.quantize_fp8)")
    if x.dtype in (torch.bfloat16, torch.float16, torch.float32):
        if act_scale is not None:
            raise SpecError("precision_config.act_scale is the scale of an e4m3 x, but x is "
                            f"{x.dtype} (matmul_ogs quantizes it itself); drop act_scale or pass x quantized")
        return w_fmt
    if x.dtype != torch.float8_e4m3fn:
        raise SpecError(f"x has dtype {x.dtype}; with {w_fmt.name} weights x is bf16, fp16, fp32 (quantized by "
                        f"matmul_ogs) or torch.float8_e4m3fn with precision_config.act_scale")
    if act_scale is None:
        raise SpecError(f"x is e4m3 but precision_config.act_scale is None; pass its float32 scales "
                        f"(ogsgen.numerics.quantize_fp8(x, {(1, FP8_BLOCK) if w_fmt.block_size else (1, 0)}) makes "
                        f"both)")
    return w_fmt


@lru_cache(maxsize=None)
def _unsupported_formats(x_fmt, w_fmt, y_fmt) -> str:
    """Why no kernel path takes these formats ('' when one does); cached, it runs on every call."""
    try:
        KernelVariant(x_fmt, w_fmt, y_fmt).check_supported()
    except UnsupportedError as exc:
        return str(exc)
    return ""


_NO_PERSISTENT_KERNEL = ("this call's kernel variant has no persistent kernel: that needs plain bf16 or fp16 x and w "
                         "of one format")


def persistent_blocker(variant: KernelVariant, x: torch.Tensor) -> str | None:
    """None when the variant's persistent TMA kernel can run on x's device, else why it cannot. (Whether x and w
    suit TMA is checked only for calls that pick the kernel: ``tma_blocker``.)"""
    if not variant.has_persistent_kernel:
        return _NO_PERSISTENT_KERNEL
    if x.is_cuda and not target(x.device).tma:
        return "the persistent kernel loads tiles by TMA, which needs a GPU of compute capability 9.0 or later"
    return None


def tma_blocker(x: torch.Tensor, w: torch.Tensor, x_gathered: bool, y: torch.Tensor | None) -> str | None:
    """None when TMA descriptors can describe x, w and y, else what to change. (``x_gathered``: the kernel reads
    x's rows by pointers, no descriptor. ``y``: the output the kernel stores by TMA, None where it stores by
    pointers.)"""
    if x_gathered:
        x = None
    if y is not None and y.shape[-1] * y.element_size() % 16:
        return (f"TMA needs rows of a multiple of 16 bytes: the output's rows ({y.shape[-1]} columns of "
                f"{y.element_size()} bytes) are not; N // reduction_n must be a multiple of {16 // y.element_size()}")
    # a K-major w (last stride not 1) is read through a descriptor of w.mT
    for name, tensor in (("x", x), ("w", w if w.stride(-1) == 1 else w.mT), ("y", y)):
        if tensor is None:
            continue
        if tensor.numel() == 0:
            return f"{name} is empty (shape {tuple(tensor.shape)}): a TMA descriptor needs every dimension >= 1"
        if tensor.is_contiguous() and not (tensor.shape[-1] * tensor.element_size() % 16 or tensor.data_ptr() % 16):
            continue  # the common case, checked cheaply: every stride is a multiple of the row's 16-byte size
        strides = tensor.stride()
        if strides[-1] != 1 or tensor.data_ptr() % 16 or any(stride * tensor.element_size() % 16
                                                             for stride in strides[:-1]):
            along = "N or K" if name == "w" else "its last dimension"
            return (f"TMA needs {name} 16-byte aligned, contiguous along {along} and with its other "
                    f"strides multiples of 16 bytes (got strides {tuple(strides)}); pass {name}.contiguous() "
                    f"(and K, N multiples of 8)")
    return None


def _check_fp8_hardware(device) -> None:
    if not target(device).fp8:
        capability = target(device).capability
        raise SpecError(f"fp8 tensors need a GPU of compute capability 8.9 or newer (Ada, Hopper); {device} is "
                        f"{capability[0]}.{capability[1]}: use bf16/fp16, or mxfp4 weights (dequantized in the kernel)")


def _check_act_scale(scale, x_fmt, rows: int, k: int) -> None:
    """An e4m3 x's float32 scales: per row and 128 columns of K (fp8e4m3_b128), or per row, or one for the tensor
    (fp8e4m3_channel)."""
    if x_fmt.block_size:
        expected, shapes = "(M, cdiv(K, 128))", ((rows, -(-k // FP8_BLOCK)),)
    else:
        expected, shapes = "(M, 1) per row, or (1,) for the tensor", ((rows, 1), (1,), (1, 1), ())
    if tuple(scale.shape) not in shapes:
        raise SpecError(f"precision_config.act_scale for e4m3 x of {rows} rows and K={k} ({x_fmt.name}) must have "
                        f"shape {expected} = {shapes[0]}, got {tuple(scale.shape)}")


def _check_mx_act_scale(scale, x_lead: tuple, k: int) -> None:
    """An mxfp8 x's e8m0 scales: one per 32 values of K of each row, (..., M, cdiv(K, 32)) for x (..., M, K)."""
    expected = (*x_lead, -(-k // MX_BLOCK))
    if tuple(scale.shape) != expected:
        raise SpecError(f"precision_config.act_scale must hold one e8m0 byte per {MX_BLOCK} values of K of each "
                        f"row of x: shape {expected} for x of shape {(*x_lead, k)}, got {tuple(scale.shape)}")


def check_scales(pc: PrecisionConfig, x_fmt, w_fmt, y_fmt, w, k, n, x_lead: tuple):
    flex = pc.flex_ctx
    w_batch = w.shape[0] if w.ndim == 3 else 1
    for name, scale, fmt, lengths in (("precision_config.flex_ctx.lhs_data.scale", flex.lhs_data.scale, x_fmt, (1,)),
                                      ("precision_config.flex_ctx.rhs_data.scale", flex.rhs_data.scale, w_fmt,
                                       (1, w_batch))):
        if scale is None:
            continue
        if fmt.scaling != "flexpoint":
            raise SpecError(f"{name} is set but the operand is {fmt.name}, not fp8 flexpoint; drop the scale")
        check_tensor(scale, name, dtype=torch.float32)
        if scale.numel() not in lengths or not scale.is_contiguous():
            raise SpecError(f"{name} must be a contiguous float32 tensor of {' or '.join(map(str, sorted(set(lengths))))} "
                            f"element(s), got shape {tuple(scale.shape)}")
    out = flex.out_data
    for name, scale in (("expected_scale", out.expected_scale), ("actual_scale", out.actual_scale)):
        if scale is None:
            continue
        if y_fmt.scaling != "flexpoint":
            raise SpecError(f"precision_config.flex_ctx.out_data.{name} is set but the output is {y_fmt.name}; "
                            f"set precision_config.out_dtype to an fp8 dtype or drop the scale")
        check_tensor(scale, f"precision_config.flex_ctx.out_data.{name}", dtype=torch.float32)
    if w_fmt.scaling == "block_e8m0":
        scale = pc.weight_scale
        k_blocks = -(-k // MX_BLOCK)
        expected = (w_batch, k_blocks, n) if w.ndim == 3 else (k_blocks, n)
        check_tensor(scale, "precision_config.weight_scale", dtype=torch.uint8)
        # K groups past cdiv(K, 32) are padding, never read: vLLM pads them to a multiple of 4 on Hopper
        shape = tuple(scale.shape)
        if len(shape) != len(expected) or shape[-2] < k_blocks or shape[:-2] + shape[-1:] != expected[:-2] + (n,):
            raise SpecError(f"precision_config.weight_scale must hold one e8m0 byte per {MX_BLOCK} values of K: "
                            f"shape {expected} for w of logical shape (..., K={k}, N={n}) (more K groups may follow, "
                            f"as padding: they are not read), got {shape}")
    if x_fmt.scaling == "block_f32" and pc.act_scale is not None:
        _check_act_scale(pc.act_scale, x_fmt, x_lead[-1], k)
    if x_fmt.scaling == "block_e8m0":
        _check_mx_act_scale(pc.act_scale, x_lead, k)
    fp8_dot = x_fmt.bits == 8 and (w_fmt.scaling in ("flexpoint", "block_f32") or (
        x_fmt.scales_apply == "epilogue" and w_fmt.element == "e2m1"))
    if pc.max_num_imprecise_acc is not None and not fp8_dot:
        raise SpecError("precision_config.max_num_imprecise_acc applies to fp8 dots only (fp8 x with fp8 or mxfp4 "
                        "w); leave it None")


def check_routing(x, w, routing_data: RoutingData, gather_indx, scatter_indx) -> tuple[int, int]:
    """Validate the MoE arguments; returns (sorted rows, output rows)."""
    if not isinstance(routing_data, RoutingData):
        raise SpecTypeError(f"routing_data must be a RoutingData, got {type(routing_data).__name__}")
    n_expts, k = routing_data.n_expts_tot, routing_data.n_expts_act
    # (n_expts_act may exceed n_expts_tot: under expert parallelism a token's k gates outnumber a rank's experts)
    if not isinstance(n_expts, int) or n_expts < 1 or not isinstance(k, int) or k < 1:
        raise SpecError(f"routing_data needs n_expts_tot >= 1 and n_expts_act >= 1 (ints), got n_expts_act={k!r}, "
                        f"n_expts_tot={n_expts!r}")
    check_vector(routing_data.expt_hist, "routing_data.expt_hist", n_expts, torch.int32)
    if x.ndim != 2:
        raise SpecError(f"with routing_data, x must be 2-D (tokens or sorted rows, K), got shape {tuple(x.shape)}")
    if w.ndim != 3 or w.shape[0] != n_expts:
        raise SpecError(f"w must hold one (K, N) matrix per expert, shape ({n_expts}, K, N) for "
                        f"routing_data.n_expts_tot={n_expts}, got {tuple(w.shape)}")
    if gather_indx is not None:
        n_rows = x.shape[0] * k
        check_vector(gather_indx.src_indx, "gather_indx.src_indx", n_rows, torch.int32)
        check_vector(gather_indx.dst_indx, "gather_indx.dst_indx", n_rows, torch.int32)
    else:
        n_rows = x.shape[0]
    if scatter_indx is not None:
        if n_rows % k:
            raise SpecError(f"scatter_indx: {n_rows} sorted rows are not a whole number of tokens of "
                            f"n_expts_act={k} gates")
        check_vector(scatter_indx.src_indx, "scatter_indx.src_indx", n_rows, torch.int32)
        check_vector(scatter_indx.dst_indx, "scatter_indx.dst_indx", n_rows, torch.int32)
    meta = routing_data.expt_data
    if meta is not None and (meta.slice_sizes.shape != (n_expts,)
                             or meta.block_schedule_data.shape[1] < row_tiles(n_rows, 16, n_expts)):
        raise SpecError("routing_data.expt_data does not describe routing_data.expt_hist for these rows; build it "
                        "with ogsgen.moe.make_ragged_tensor_metadata(expt_hist, n_rows)")
    return n_rows, (n_rows // k if scatter_indx is not None else n_rows)


def named_tensors(x, w, bias, routing_data, gather_indx, scatter_indx, pc: PrecisionConfig, betas, gammas, y, act,
                   epi, y_acc_in, preact=None) -> tuple[dict, dict]:
    """(written, read): a call's tensors by argument name, those the kernels write (``written_tensors``) and the
    others; non-tensors (a function's float arguments) are left out."""
    flex = pc.flex_ctx
    read = {"x": x, "w": w, "bias": bias, "betas": betas, "gammas": gammas, "y_acc_in": y_acc_in,
            "precision_config.weight_scale": pc.weight_scale, "precision_config.act_scale": pc.act_scale,
            "precision_config.flex_ctx.lhs_data.scale": flex.lhs_data.scale,
            "precision_config.flex_ctx.rhs_data.scale": flex.rhs_data.scale,
            "precision_config.flex_ctx.out_data.expected_scale": flex.out_data.expected_scale}
    if routing_data is not None:
        read["routing_data.expt_hist"] = routing_data.expt_hist
        meta = routing_data.expt_data
        if meta is not None:
            read.update({f"routing_data.expt_data.{field}": getattr(meta, field) for field in (
                "slice_sizes", "slice_offs", "block_offs_data", "block_schedule_data")})
    for name, index in (("gather_indx", gather_indx), ("scatter_indx", scatter_indx)):
        if index is not None:
            read.update({f"{name}.src_indx": index.src_indx, f"{name}.dst_indx": index.dst_indx})
    for name, values in (("fused_activation.fn_args", act.fn_args),
                         ("epilogue.fn_arg_values_matmul", epi.fn_arg_values_matmul),
                         ("epilogue.fn_arg_values_finalize", epi.fn_arg_values_finalize)):
        read.update({f"{name}[{i}]": value for i, value in enumerate(values)})
    return written_tensors(pc, y, preact), {n: t for n, t in read.items() if isinstance(t, torch.Tensor)}


def written_tensors(pc: PrecisionConfig, y, preact=None) -> dict:
    """The tensors a call's kernels write, by argument name: y, an MX output's scales, a flexpoint output's actual
    scale, preact."""
    written = {"y": y, "precision_config.out_scale": pc.out_scale,
               "precision_config.flex_ctx.out_data.actual_scale": pc.flex_ctx.out_data.actual_scale, "preact": preact}
    return {n: t for n, t in written.items() if isinstance(t, torch.Tensor)}
