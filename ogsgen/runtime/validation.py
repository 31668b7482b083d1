"""Checks of a ``matmul_ogs`` call's arguments (types, devices, shapes, strides, routing); each bad argument raises
an OgsgenError that names it and the fix. The operands' formats, and the checks of each scale against its
operand, are in ``ogsgen.runtime.operands``."""
from __future__ import annotations

import dataclasses

import torch

from ..devices import check_kernel_device, target
from ..errors import SpecError, SpecTypeError, UnsupportedError
from ..moe.metadata import RaggedTensorMetadata
from ..numerics.layouts import SwizzledMxValues
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
