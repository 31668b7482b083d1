"""Checks of a ``matmul_ogs`` call's arguments (types, devices, shapes, strides, routing); each bad argument raises
an OgsgenError that names it and the fix. The operands' formats, and the checks of each scale against its
operand, are in ``ogsgen.runtime.operands``."""
from __future__ import annotations

from typing import NamedTuple

import torch

from ..devices import check_kernel_device
from ..errors import SpecError, SpecTypeError, UnsupportedError
from ..moe.metadata import RaggedTensorMetadata
from ..numerics.layouts import SwizzledMxValues
from ..types import (Epilogue, FlexCtx, FusedActivation, FusedComm, GatherIndx, InFlexData, OutFlexData,
                     PrecisionConfig, RoutingData, ScatterIndx)
from .memory import check_distinct_elements
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


class CallShape(NamedTuple):
    """What a call's checked shapes say: its batch, rows (sorted rows when ragged), output rows and columns, and its
    tensors by argument name, those the kernels write and the others."""
    batched: bool
    ragged: bool
    batch: int
    m: int
    out_rows: int
    n_out: int
    out_shape: tuple
    written: dict
    read: dict


# The largest grid dimension past the first: batched calls put their batch there.
MAX_GRID_Y = 65535


def check_call_shapes(x_op, w_op, y_fmt, n, routing_data, gather_indx, scatter_indx, pc, bias, betas, gammas,
                      out_alpha, y, fused_comm, act, epi, y_acc_in, preact) -> CallShape:
    """The shapes, dtypes and devices of a call's tensors against its operands (x_op, w_op: ``ogsgen.runtime.
    operands``; ``n``: w's logical N) and output format: batched, dense or ragged rows, bias, betas, gammas, y,
    y_acc_in, an MX output's scales, preact."""
    x, w, x_fmt = x_op.values, w_op.values, x_op.format
    batched = x.ndim == 3
    ragged = routing_data is not None and routing_data.expt_hist is not None
    if batched:
        for name, value in (("gather_indx", gather_indx), ("scatter_indx", scatter_indx)):
            if value is not None:
                raise SpecError(f"{name} is not supported in batched mode (3-D x); pass 2-D x with routing_data")
        if ragged:
            raise SpecError("routing_data is not supported in batched mode (3-D x); pass 2-D x")
        if w.ndim != 3 or w.shape[0] != x.shape[0]:
            raise SpecError(f"batched x of shape {tuple(x.shape)} needs w of shape (B={x.shape[0]}, K, N), "
                            f"got {tuple(w.shape)}")
    elif not ragged:
        if gather_indx is not None or scatter_indx is not None:
            raise SpecError("gather_indx and scatter_indx index expert-sorted rows: pass routing_data with a "
                            "histogram (ogsgen.routing(logits, k) builds all three)")
        if w.ndim == 3 and w.shape[0] != 1:
            missing = "routing_data.expt_hist is None" if routing_data is not None else "there is no routing_data"
            raise SpecError(f"w of shape {tuple(w.shape)} holds {w.shape[0]} experts but {missing}; pass a 2-D w "
                            f"(K, N), a 3-D x for a batched matmul, or routing_data with a histogram (ogsgen.routing)")
    if ragged:
        m, out_rows = check_routing(x, w, routing_data, gather_indx, scatter_indx)
    else:
        m = out_rows = x.shape[-2]
    out_dtype = y_fmt.torch_dtype
    batch = x.shape[0] if batched else 1
    if x_fmt.scaling == "block_f32" and batched:
        raise SpecError(f"{x_fmt.name} products take 2-D x (tokens or sorted rows, K); got shape {tuple(x.shape)}: "
                        f"flatten the batch into the rows")
    reduction_n = act.specs.reduction_n
    if n % reduction_n:
        raise SpecError(f"w has N={n} columns, which the activation {act.specs.name} cannot fold by "
                        f"reduction_n={reduction_n}; N must be a multiple of {reduction_n}")
    n_out = n // reduction_n
    w_batch = w.shape[0] if w.ndim == 3 else 1
    check_tensor(bias, "bias", ndims=(1, 2), dtype=torch.float32)
    if bias is not None and (bias.shape[-1] != n or (bias.ndim == 2 and bias.shape[0] not in (1, w_batch))):
        raise SpecError(f"bias must have shape ({n},) or ({w_batch}, {n}), got {tuple(bias.shape)}")
    if bias is not None and bias.stride(-1) != 1 and n > 1:
        raise SpecError("bias must be contiguous along N (stride(-1) == 1); pass bias.contiguous()")
    check_vector(betas, "betas", m, torch.float32)
    check_vector(gammas, "gammas", m, torch.float32)
    if betas is not None and bias is None:
        raise SpecError("betas scale the bias, but bias is None; pass a bias or drop betas")
    if out_alpha is not None and not isinstance(out_alpha, (int, float)):
        raise SpecTypeError(f"out_alpha must be a Python float, got {type(out_alpha).__name__}")
    out_shape = (batch, out_rows, n_out) if batched else (out_rows, n_out)
    shapes = (out_shape,) if batched else (out_shape, (1, out_rows, n_out))  # a single matmul: 2-D or 3-D
    if fused_comm is not None:  # y: this rank's buffer, its rows interleaved with the other reduce shards'
        check_fused_comm(fused_comm, x, y, batched, y_acc_in, out_rows)
        shapes = ((out_rows * fused_comm.n_reduce_shards, n_out),)
    for name, buffer in (("y", y), ("y_acc_in", y_acc_in)):
        if buffer is None:
            continue
        check_tensor(buffer, name, ndims=(2, 3))
        if tuple(buffer.shape) not in shapes:
            raise SpecError(f"{name} must have shape {' or '.join(map(str, shapes))}, got {tuple(buffer.shape)}")
    if y_fmt.has_block_scales:
        expected = out_shape[:-1] + (-(-n_out // y_fmt.block_size),)
        check_tensor(pc.out_scale, "precision_config.out_scale", dtype=y_fmt.scale_dtype)
        if tuple(pc.out_scale.shape) != expected:
            one = "one e8m0 byte" if y_fmt.scale_element == "e8m0" else "one float32 scale"
            raise SpecError(f"precision_config.out_scale must hold {one} per {y_fmt.block_size} output columns "
                            f"of each row ({y_fmt.name}): shape {expected}, got {tuple(pc.out_scale.shape)}")
    if y is not None and y.dtype != out_dtype:
        raise SpecError(f"y has dtype {y.dtype} but the output dtype is {out_dtype}; "
                        f"set precision_config.out_dtype={y.dtype} or pass a {out_dtype} y")
    if y_acc_in is not None and scatter_indx is not None:
        raise SpecError("y_acc_in cannot be combined with scatter_indx: accumulate after the scatter instead")
    if preact is not None:
        check_preact(preact, act, scatter_indx, fused_comm, y_fmt, (batch, m, n) if batched else (m, n), out_dtype)
    written, read = named_tensors(x_op, w_op, bias, routing_data if ragged else None, gather_indx, scatter_indx, pc,
                                  betas, gammas, y, act, epi, y_acc_in, preact)
    check_devices(x, {**read, **written})
    check_distinct_elements(written)
    if batch > MAX_GRID_Y:
        raise SpecError(f"batched x has B={batch} > {MAX_GRID_Y} entries, more than one launch covers; "
                        f"split the batch")
    return CallShape(batched, ragged, batch, m, out_rows, n_out, out_shape, written, read)


def check_preact(preact, act, scatter_indx, fused_comm, y_fmt, shape, dtype) -> None:
    if act.specs.is_default or scatter_indx is not None or fused_comm is not None or y_fmt.scaling != "none":
        raise SpecError("preact keeps a matmul's rows before its activation: it needs a fused_activation and a plain "
                        "output, without scatter_indx or fused_comm")
    check_tensor(preact, "preact", ndims=(len(shape),), dtype=dtype)
    if tuple(preact.shape) != shape:
        raise SpecError(f"preact must have the matmul's shape before the activation, {shape}, got "
                        f"{tuple(preact.shape)}")


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


def named_tensors(x_op, w_op, bias, routing_data, gather_indx, scatter_indx, pc: PrecisionConfig, betas, gammas, y,
                  act, epi, y_acc_in, preact=None) -> tuple[dict, dict]:
    """(written, read): a call's tensors by argument name, those the kernels write (``written_tensors``) and the
    others (x's and w's with their scales, as their ScaledOperands hold them); non-tensors (a function's float
    arguments) are left out."""
    read = {"x": x_op.values, "w": w_op.values, "bias": bias, "betas": betas, "gammas": gammas, "y_acc_in": y_acc_in,
            "precision_config.weight_scale": w_op.block_scales, "precision_config.act_scale": x_op.block_scales,
            "precision_config.flex_ctx.lhs_data.scale": x_op.global_scale,
            "precision_config.flex_ctx.rhs_data.scale": w_op.global_scale,
            "precision_config.flex_ctx.out_data.expected_scale": pc.flex_ctx.out_data.expected_scale}
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
