"""A ``matmul_ogs`` call's operands described once, at its entry: x and w with the scales the PrecisionConfig holds
for them become ScaledOperands (``ogsgen.spec.operands``), and the output gets its format. This is the one place
that learns a format from dtypes, from which scales are present and from the scales' shapes, and checks each scale
against its operand; below it the runtime and the kernel parameters read the descriptors."""
from __future__ import annotations

from functools import lru_cache

import torch

from ..devices import target
from ..errors import SpecError, UnsupportedError
from ..numerics.layouts import SwizzledMxValues
from ..spec.formats import (FLEX_BY_DTYPE, FP8_BLOCK, FP8_E4M3_B128, FP8_E4M3_CHANNEL, MX_BLOCK,
                            MX_FP8_BY_DTYPE, MXFP4, NVFP4, SWIZZLED_MXFP4, NumericFormat, plain_format_of)
from ..spec.operands import ScaledOperand
from ..spec.variant import KernelVariant
from ..types import FlexCtx, InFlexData, PrecisionConfig
from .validation import check_tensor


def describe_operands(x, w, pc: PrecisionConfig, declared: tuple | None = None
                      ) -> tuple[ScaledOperand, ScaledOperand, NumericFormat]:
    """(x, w, the output's format) of a call; ``x`` a tensor, ``w`` a tensor or SwizzledMxValues, each of its
    ``declared`` format (x's, w's: None where not declared; their scales in ``pc``: ``unfold_declared``) or of the
    one its dtype and scales say. Raises an error naming the argument and the fix for a dtype, shape or scale that
    no format explains."""
    declared_x, declared_w = declared or (None, None)
    if declared_x is None:
        return _described(x, w, pc, declared_w)
    try:
        x_op, w_op, y_fmt = _described(x, w, pc, declared_w)
    except (SpecError, UnsupportedError) as error:  # (the checks name the config's fields: x's own are these)
        raise type(error)(str(error).replace("precision_config.act_scale", "x.block_scales").replace(
            "precision_config.flex_ctx.lhs_data.scale", "x.global_scale")) from None
    if x_op.format != declared_x:
        raise SpecError(f"x was declared {declared_x.name}, but with {w_op.format.name} weights its values and scales "
                        f"are read as {x_op.format.name}; declare x as {x_op.format.name}, or quantize it as "
                        f"{w_op.format.name} weights take it")
    return x_op, w_op, y_fmt


def _described(x, w, pc: PrecisionConfig, declared: NumericFormat | None):
    _check_act_scale_dtype(pc)
    check_tensor(x, "x", ndims=(2, 3))
    names = _CONFIG_NAMES if declared is None else _DECLARED_NAMES
    if not isinstance(w, SwizzledMxValues):
        check_tensor(w, "w", ndims=(2, 3))
        w = reinterpret(w, pc.flex_ctx.rhs_data.dtype, "w")
    x = reinterpret(x, pc.flex_ctx.lhs_data.dtype, "x")
    x_fmt, w_fmt, y_fmt, k = _formats(x, w, pc, declared, names)
    values, n = (w.data if isinstance(w, SwizzledMxValues) else w), w.shape[-1]
    if x.shape[-1] != k:
        packed = f" (packed {w_fmt.name}: 2 values per byte)" if w_fmt.element == "e2m1" else ""
        raise SpecError(f"x has K={x.shape[-1]} columns but w has {k} rows{packed} "
                        f"(w is (..., K, N) = {tuple(w.shape)})")
    _check_scales(pc, x_fmt, w_fmt, y_fmt, values, k, n, tuple(x.shape[:-1]), names)
    w_scales = pc.weight_scale if w_fmt.has_block_scales else None
    if w_fmt.scale_element == "e4m3":  # their bits: the kernel's masked loads fill 0, which Triton's interpreter
        w_scales = w_scales.view(torch.uint8)  # cannot cast to fp8 (the upcast reads e4m3 bits)
    scale_block_n = w_fmt.scale_block_n(w_scales, n)
    x_op = ScaledOperand(x, x_fmt, k, pc.act_scale if x_fmt.has_block_scales else None,
                         global_scale=pc.flex_ctx.lhs_data.scale)
    w_op = ScaledOperand(values, w_fmt, k, w_scales, scale_block_n, global_scale=pc.flex_ctx.rhs_data.scale)
    return x_op, w_op, y_fmt


# What the errors call w's block scales and per-tensor scale: the config's fields, or a declared w's
_CONFIG_NAMES = ("precision_config.weight_scale", "precision_config.flex_ctx.rhs_data.scale")
_DECLARED_NAMES = ("w.block_scales", "w.global_scale")


def unfold_declared(x, w, pc: PrecisionConfig):
    """(x's values, w's values, the config with the declared operands' scales in the fields that carry them for
    plain tensors, (x's declared format, w's), None where not declared), for ``describe_operands``: the call's
    signature and its plan see the tensors as a plain call's."""
    # A field-for-field copy, on every call: a fifth of dataclasses.replace's time (which runs __init__ again).
    unfolded = object.__new__(PrecisionConfig)
    unfolded.__dict__.update(pc.__dict__)
    flex = pc.flex_ctx
    lhs, rhs, declared = flex.lhs_data, flex.rhs_data, [None, None]
    for i, (op, name, block_field, scale_field) in enumerate((
            (x, "x", "act_scale", "lhs_data"), (w, "w", "weight_scale", "rhs_data"))):
        if op.__class__ is not ScaledOperand:
            continue
        if getattr(pc, block_field) is not None or getattr(flex, scale_field).scale is not None:
            raise SpecError(f"{name} is a ScaledOperand, which carries its own scales: drop "
                            f"precision_config.{block_field} and precision_config.flex_ctx.{scale_field}.scale")
        setattr(unfolded, block_field, op.block_scales)
        if op.global_scale is not None:
            if i:
                rhs = InFlexData(rhs.dtype, op.global_scale)
            else:
                lhs = InFlexData(lhs.dtype, op.global_scale)
        declared[i] = op.format
    if lhs is not flex.lhs_data or rhs is not flex.rhs_data:
        unfolded.flex_ctx = FlexCtx(lhs, rhs, flex.out_data, flex.acc_data)
    return (x.values if declared[0] else x), (w.values if declared[1] else w), unfolded, tuple(declared)


def _check_act_scale_dtype(pc: PrecisionConfig) -> None:
    """precision_config.act_scale is uint8 (an mxfp8 x's e8m0 scales) or float32 (an e4m3 x's scales)."""
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
    mismatch = w.stored_mismatch()
    if mismatch is None and w.data.ndim not in (2, 3):
        mismatch = f"2 or 3 dimensions, not {w.data.ndim}"
    if mismatch is not None:
        raise SpecError(f"w is a SwizzledMxValues whose data does not hold K={w.k} x N={w.n} values in the {w.layout} "
                        f"layout ({mismatch}); make it with ogsgen.swizzle_mx_values")
    if x.is_cuda:
        capability = target(x.device).capability
        if capability[0] != w.capability[0]:
            raise SpecError(f"w was swizzled (layout {w.layout!r}) for a compute capability "
                            f"{w.capability[0]}.{w.capability[1]} GPU but x is on a {capability[0]}.{capability[1]} "
                            f"GPU; swizzle the strided values for this GPU: "
                            f"ogsgen.swizzle_mx_values(ogsgen.unswizzle_mx_values(w))")
    return w.data, SWIZZLED_MXFP4[w.layout], w.k


def scaled_output_format(out_scale: torch.Tensor, out_dtype: torch.dtype | None):
    """(out_dtype, format) of an output with block scales, which ``out_scale``'s dtype chooses: float32 makes
    fp8e4m3_b128 (e4m3 values, a scale per 128 columns of a row), uint8 mxfp8 (e8m0 scales per 32 columns; values
    in ``out_dtype``'s fp8, e4m3 by default)."""
    if getattr(out_scale, "dtype", None) not in (torch.uint8, torch.float32):
        raise SpecError(f"precision_config.out_scale must be uint8 (e8m0 scales per 32 columns: an mxfp8 output) or "
                        f"float32 (a scale per {FP8_BLOCK} columns of a row: an fp8e4m3_b128 output), got "
                        f"{getattr(out_scale, 'dtype', type(out_scale).__name__)}")
    out_dtype = out_dtype or torch.float8_e4m3fn
    if out_scale.dtype == torch.float32:
        if out_dtype != torch.float8_e4m3fn:
            raise SpecError(f"precision_config.out_scale of float32 makes the output fp8e4m3_b128 (e4m3 values, a "
                            f"scale per {FP8_BLOCK} columns of a row): out_dtype must be torch.float8_e4m3fn (or "
                            f"None), got {out_dtype}; a uint8 out_scale makes an mxfp8 output")
        return out_dtype, FP8_E4M3_B128
    if out_dtype not in MX_FP8_BY_DTYPE:
        raise SpecError(f"precision_config.out_scale makes the output mxfp8: out_dtype must be a float8 dtype "
                        f"(or None for e4m3), got {out_dtype}")
    return out_dtype, MX_FP8_BY_DTYPE[out_dtype]


def _formats(x, w, pc: PrecisionConfig, declared: NumericFormat | None, names: tuple[str, str]):
    """(x format, w format, y format, logical K) of a call: w's as declared, else from dtypes and the precision
    config."""
    if _mx_activations(pc):
        x_fmt = _mx_activation_format(x)
    elif x.dtype in FLEX_BY_DTYPE:
        x_fmt = FLEX_BY_DTYPE[x.dtype]
    else:
        x_fmt = plain_format_of(x.dtype, "x")
    k = w.shape[-2]
    if declared is not None:
        if isinstance(w, SwizzledMxValues):
            w, w_fmt, k = _unwrap_swizzled(w, x)
        else:
            w_fmt, k = declared, declared.logical_k(k)
        if w_fmt.scaling == "block_f32":
            check_tensor(pc.weight_scale, names[0], dtype=torch.float32)
            shown = _block_f32_weight_format(w, pc.weight_scale, names[0])
            if shown != w_fmt and k > FP8_BLOCK:  # (up to 128 rows of K a column's scale is a block's too)
                raise SpecError(f"{names[0]} of shape {tuple(pc.weight_scale.shape)} holds {shown.name} scales, but "
                                f"w was declared {w_fmt.name}")
    elif isinstance(w, SwizzledMxValues):
        if pc.weight_scale is None:
            raise SpecError("w holds swizzled mxfp4 values but precision_config.weight_scale is None; pass their "
                            "e8m0 scales")
        w, w_fmt, k = _unwrap_swizzled(w, x)
    elif pc.weight_scale is not None and w.dtype == torch.float8_e4m3fn and \
            getattr(pc.weight_scale, "dtype", None) == torch.float32:
        w_fmt = _block_f32_weight_format(w, pc.weight_scale, names[0])
    elif pc.weight_scale is not None:
        if w.dtype == torch.uint8:  # two e2m1 values per byte along K; e4m3 block scales make it NVFP4
            nvfp4 = getattr(pc.weight_scale, "dtype", None) == torch.float8_e4m3fn
            w_fmt = NVFP4 if nvfp4 else MXFP4
            k = w_fmt.logical_k(w.shape[-2])
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
        raise SpecError("w is uint8 (packed mxfp4 or nvfp4) but precision_config.weight_scale is None; pass its e8m0 "
                        "scales (mxfp4) or its float8_e4m3fn scales (nvfp4, with its global scale)")
    else:
        w_fmt = plain_format_of(w.dtype, "w")
        if w_fmt != x_fmt and x_fmt.scaling == "none":
            raise SpecError(f"w.dtype ({w.dtype}) must equal x.dtype ({x.dtype}); convert one with .to()")
    if w_fmt.scaling == "block_f32":
        x_fmt = _block_f32_activation_format(x, pc.act_scale, w_fmt)
    elif w_fmt.element == "e2m1" and w_fmt.scale_element == "e8m0" and \
            getattr(pc.act_scale, "dtype", None) == torch.float32:  # (mxfp4, either layout)
        x_fmt = _e4m3_rows_format(x, pc)
    elif w_fmt.scaling == "block_e8m0" and getattr(pc.act_scale, "dtype", None) == torch.float32:
        # (no kernel reads it: taken silently, it would be ignored)
        raise SpecError("precision_config.act_scale of float32 is the scale of an e4m3 x for fp8e4m3_b128, "
                        "fp8e4m3_channel or mxfp4 weights; mxfp8 weights take bf16 or fp16 x (without act_scale) or an "
                        "mxfp8 x with uint8 e8m0 act_scale (ogsgen.numerics.quantize_mx(x, 'e4m3') makes both): drop "
                        "act_scale or pass the mxfp8 x's e8m0 scales")
    if pc.out_scale is not None:
        out_dtype, y_fmt = scaled_output_format(pc.out_scale, pc.out_dtype)
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


def _block_f32_weight_format(w, scale, name: str):
    """fp8e4m3_b128 or fp8e4m3_channel: e4m3 w with float32 weight scales, told apart by the scales' shape."""
    k, n = w.shape[-2:]
    blocks = (-(-k // FP8_BLOCK), -(-n // FP8_BLOCK))
    # (with K <= 128, one scale per column is both: the channel kernel, which scales once after the K loop)
    expected = {blocks: FP8_E4M3_B128, (blocks[0], n): FP8_E4M3_B128, (1, n): FP8_E4M3_CHANNEL}
    batch = tuple(w.shape[:-2])
    if scale.ndim != w.ndim or tuple(scale.shape[:-2]) != batch or tuple(scale.shape[-2:]) not in expected:
        raise SpecError(f"{name} for w of shape {tuple(w.shape)} (K={k}, N={n}) must be "
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


def _check_scales(pc: PrecisionConfig, x_fmt, w_fmt, y_fmt, w, k, n, x_lead: tuple, names: tuple[str, str]):
    """Each scale of the precision config against the operand it scales: its dtype and shape."""
    flex = pc.flex_ctx
    w_batch = w.shape[0] if w.ndim == 3 else 1
    for name, scale, fmt, lengths in (("precision_config.flex_ctx.lhs_data.scale", flex.lhs_data.scale, x_fmt, (1,)),
                                      (names[1], flex.rhs_data.scale, w_fmt,
                                       (1, w_batch))):
        if scale is None:
            continue
        if not fmt.has_global_scale:
            raise SpecError(f"{name} is set but the operand is {fmt.name}, which has no per-tensor scale (fp8 "
                            f"flexpoint and nvfp4 have one); drop the scale")
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
    if w_fmt.scales_apply == "operand":
        scale, block, element = pc.weight_scale, w_fmt.block_size, w_fmt.scale_element
        k_blocks = -(-k // block)
        expected = (w_batch, k_blocks, n) if w.ndim == 3 else (k_blocks, n)
        check_tensor(scale, names[0], dtype=w_fmt.scale_dtype)
        # K groups past cdiv(K, block) are padding, never read: vLLM pads mxfp4's to a multiple of 4 on Hopper
        shape = tuple(scale.shape)
        if len(shape) != len(expected) or shape[-2] < k_blocks or shape[:-2] + shape[-1:] != expected[:-2] + (n,):
            unit = "byte" if element == "e8m0" else "scale"
            raise SpecError(f"{names[0]} must hold one {element} {unit} per {block} values of K: "
                            f"shape {expected} for w of logical shape (..., K={k}, N={n}) (more K groups may follow, "
                            f"as padding: they are not read), got {shape}")
    if w_fmt.has_global_scale and w_fmt.has_block_scales and flex.rhs_data.scale is None:
        # (a kernel without it would compute e2m1 * block scale: off by the global scale, silently)
        raise SpecError(f"{w_fmt.name} w needs its float32 global scale (a checkpoint's weight_scale_2) in "
                        f"precision_config.flex_ctx.rhs_data.scale: one element, or one per expert; "
                        f"ogsgen.prepare_expert_weights(..., format='{w_fmt.name}').precision_config() sets it")
    if x_fmt.scaling == "block_f32" and pc.act_scale is not None:
        _check_act_scale(pc.act_scale, x_fmt, x_lead[-1], k)
    if x_fmt.scale_element == "e8m0":
        _check_mx_act_scale(pc.act_scale, x_lead, k)
    fp8_dot = x_fmt.bits == 8 and (w_fmt.scaling in ("flexpoint", "block_f32") or (
        x_fmt.scales_apply == "epilogue" and w_fmt.element == "e2m1"))
    if pc.max_num_imprecise_acc is not None and not fp8_dot:
        raise SpecError("precision_config.max_num_imprecise_acc applies to fp8 dots only (fp8 x with fp8 or mxfp4 "
                        "w); leave it None")
