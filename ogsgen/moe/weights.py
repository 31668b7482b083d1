"""From checkpoint-style expert weights to what ``matmul_ogs`` takes.

Checkpoints store expert weights as ``(E, out, in)`` (``nn.Linear`` order; HF, gpt-oss) or
``(E, in, out)``; the gate and up projections of a SwiGLU MLP either concatenated along ``out``
(``[gate; up]``: DeepSeek, Qwen, merged Mixtral) or already interleaved (gpt-oss). ``matmul_ogs``
wants ``(E, K=in, N=out)`` with gate and up columns interleaved for the fused SwiGLU, and scaled
formats stored K-contiguous (Hopper reads fp8 and MX weights along K).

fp8 checkpoints with float32 block scales (``"fp8e4m3_b128"``: DeepSeek-V3/R1, Qwen3-FP8; ``"fp8e4m3_channel"``:
llm-compressor's FP8-Dynamic) are taken as they are, or quantized from bf16/fp32 in the checkpoint's own blocks of
the (out, in) matrix; docs/formats.md says how their scales are laid out. NVFP4 (``"nvfp4"``: ModelOpt's FP4
checkpoints) enters as ``(weight, weight_scale)`` with ``global_scale=weight_scale_2``, or quantized from floats.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..devices import check_kernel_device, target
from ..errors import SpecError, SpecTypeError
from ..numerics.codecs import check_global_scale, codec_of
from ..numerics.fp8_blocks import FP8_BLOCK
from ..numerics.layouts import VALUE_LAYOUTS, SwizzledMxValues, swizzle_mx_values
from ..numerics.mx import ROUNDINGS
from ..numerics.operands import dequantize_operand
from ..spec.formats import BY_NAME, format_named
from ..spec.operands import ScaledOperand
from ..types import FlexCtx, InFlexData, PrecisionConfig

FORMATS = tuple(name for name, f in BY_NAME.items() if f.layout == "strided")  # (value_layout picks the layout)
# quantize's options (a codec's, ogsgen.numerics.codecs) and the values that leave them unused
_OPTION_DEFAULTS = {"rounding": "up", "pow2_scales": False, "global_scale": None}


def _interleave(t: torch.Tensor, dim: int) -> torch.Tensor:
    """[gate; up] along ``dim`` -> gate0, up0, gate1, up1, ..."""
    dim %= t.ndim
    gate, up = t.chunk(2, dim=dim)
    return torch.stack([gate, up], dim=dim + 1).flatten(dim, dim + 1)


def _deinterleave(t: torch.Tensor, dim: int) -> torch.Tensor:
    """Inverse of :func:`_interleave`."""
    dim %= t.ndim
    pairs = t.unflatten(dim, (-1, 2))
    return torch.cat([pairs.select(dim + 1, 0), pairs.select(dim + 1, 1)], dim=dim)


@dataclass
class PreparedWeights:
    """Expert weights ready for ``matmul_ogs``: pass ``w`` and ``bias``, and ``precision_config()``."""
    w: torch.Tensor | SwizzledMxValues    # (E, K, N); mxfp4, nvfp4: uint8 (E, K // 2, N) (mxfp4: or swizzled)
    bias: torch.Tensor | None            # float32 (E, N), columns ordered as w's
    format: str
    weight_scale: torch.Tensor | None = None   # MX: uint8 (E, cdiv(K, 32), N); fp8e4m3_b128: float32
    # (E, cdiv(K, 128), cdiv(N, 128)), or (E, cdiv(K, 128), N) when gate/up were interleaved; fp8e4m3_channel:
    # float32 (E, 1, N); nvfp4: float8_e4m3fn (E, K // 16, N)
    scale: torch.Tensor | None = None          # fp8, nvfp4 (its global scale): float32 (E,) or one for all
    gate_up: str | None = None
    layout: str = "out_in"

    @property
    def operand(self) -> torch.Tensor | SwizzledMxValues | ScaledOperand:
        """The w to pass ``matmul_ogs``: the tensor for unscaled formats, else a ScaledOperand carrying the scales
        (then pass no precision_config for them: ``matmul_ogs(x, prepared.operand, prepared.bias, ...)``)."""
        if self.weight_scale is None and self.scale is None:
            return self.w
        made_of = (self.w, self.weight_scale, self.scale)
        cached = self.__dict__.get("_operand")  # (built once: matmul_ogs(x, prepared.operand, ...) in a loop)
        if cached is None or any(a is not b for a, b in zip(cached[0], made_of)):
            cached = made_of, ScaledOperand.of(self.w, self.format, block_scales=self.weight_scale,
                                               global_scale=self.scale)
            self.__dict__["_operand"] = cached
        return cached[1]

    def precision_config(self, **fields) -> PrecisionConfig:
        """A PrecisionConfig carrying these weights' scales (plus any other fields given)."""
        if self.scale is not None:
            flex = fields.pop("flex_ctx", FlexCtx())
            fields["flex_ctx"] = FlexCtx(flex.lhs_data, InFlexData(scale=self.scale), flex.out_data, flex.acc_data)
        return PrecisionConfig(weight_scale=self.weight_scale, **fields)

    def dequantize(self, checkpoint_order: bool = False) -> torch.Tensor:
        """The float32 weights the kernel computes with: (E, K, N), or in the checkpoint's layout and
        gate/up order when ``checkpoint_order``."""
        operand = self.operand
        dense = operand.float() if isinstance(operand, torch.Tensor) else dequantize_operand(operand)
        if checkpoint_order:
            if self.gate_up == "concatenated":
                dense = _deinterleave(dense, -1)
            if self.layout == "out_in":
                dense = dense.mT
        return dense


def prepare_expert_weights(weight, bias=None, *, layout: str = "out_in", gate_up: str | None = None,
                           format: str = "bf16", rounding: str = "up", value_layout: str = "auto",
                           weight_scale: torch.Tensor | None = None, pow2_scales: bool = False,
                           global_scale: torch.Tensor | None = None) -> PreparedWeights:
    """Transpose, interleave gate/up, quantize and lay out expert weights for ``matmul_ogs``.

    weight: a float tensor (E, out, in) for ``layout="out_in"`` or (E, in, out) for ``"in_out"``; or an
        already MX-quantized checkpoint ``(values, scales)`` in ``"out_in"`` layout, quantized along
        ``in`` (gpt-oss: uint8 blocks (E, out, in // 2) or (E, out, in // 32, 16), scales (E, out, in // 32)),
        with ``format="mxfp4"``; or an NVFP4 checkpoint ``(weight, weight_scale)`` (ModelOpt: uint8
        (E, out, in // 2), float8_e4m3fn (E, out, in // 16)) with ``format="nvfp4"`` and ``global_scale``; or an
        e4m3 checkpoint (torch.float8_e4m3fn) with its ``weight_scale``, for the formats fp8e4m3_b128 and
        fp8e4m3_channel.
    bias: None or (E, out).
    gate_up: None (no SwiGLU), ``"concatenated"`` ([gate; up] along out, interleaved here) or
        ``"interleaved"`` (already gate, up, gate, up, ...).
    format: one of FORMATS; fp8 gets one flexpoint scale per expert (absmax / max finite), MX one
        e8m0 scale per 32 values of K (``rounding`` as in ``ogsgen.numerics.quantize_mx``); fp8e4m3_b128 one
        float32 scale per 128 x 128 block of (out, in) (``pow2_scales``: powers of two, as UE8M0 checkpoints),
        fp8e4m3_channel one per output column (``ogsgen.numerics.quantize_fp8_torch``); nvfp4 an e4m3 scale per 16
        values of K and a float32 global scale per expert (``ogsgen.numerics.nvfp4.quantize_nvfp4``, in a multiple
        of 32).
    value_layout: how mxfp4 values are stored: ``"strided"``, ``"hopper"`` (swizzled for the in-register
        upcast, ``ogsgen.swizzle_mx_values``), ``"hopper_fp8"`` (for e4m3 activations on Hopper: converted to fp8
        wgmma operands in registers) or ``"auto"``: hopper when the weights are on a Hopper GPU.
    weight_scale: the float32 scales of an e4m3 checkpoint, taken as they are: fp8e4m3_b128 (E, cdiv(out, 128),
        cdiv(in, 128)) for "out_in" (DeepSeek's ``weight_scale_inv``), (E, cdiv(in, 128), cdiv(out, 128)) for
        "in_out"; fp8e4m3_channel (E, out), or (E, out, 1) for "out_in" and (E, 1, out) for "in_out". An "out_in"
        checkpoint without gate_up="concatenated" is not copied: ``w`` and ``weight_scale`` are views of it.
    pow2_scales: fp8e4m3_b128 from bf16/fp32 weights: scales rounded up to powers of two.
    global_scale: nvfp4: float32, a scalar or one per expert (E,): an NVFP4 checkpoint's ``weight_scale_2``
        (required with one); with float weights, the global scale to quantize with instead of amax / 2688 per
        expert. The weight means e2m1(code) * weight_scale * global_scale; ``precision_config()`` carries it.
    """
    if layout not in ("out_in", "in_out"):
        raise SpecError(f"layout must be 'out_in' (E, out, in) or 'in_out' (E, in, out), got {layout!r}")
    if gate_up not in (None, "concatenated", "interleaved"):
        raise SpecError(f"gate_up must be None, 'concatenated' or 'interleaved', got {gate_up!r}")
    if format not in FORMATS:
        raise SpecError(f"format must be one of {FORMATS}, got {format!r}")
    if value_layout not in ("auto", *VALUE_LAYOUTS):
        raise SpecError(f"value_layout must be 'auto' or one of {VALUE_LAYOUTS}, got {value_layout!r}")
    if value_layout not in ("auto", "strided") and format != "mxfp4":
        raise SpecError(f"value_layout={value_layout!r} applies to mxfp4 weights, not {format}; use 'auto' or "
                        f"'strided'")
    if rounding not in ROUNDINGS:
        raise SpecError(f"rounding must be one of {ROUNDINGS}, got {rounding!r}")
    if not isinstance(pow2_scales, bool):
        raise SpecTypeError(f"pow2_scales must be a bool, got {pow2_scales!r}")
    fmt = format_named(format)
    options = {"rounding": rounding, "pow2_scales": pow2_scales, "global_scale": global_scale}
    for option, value in options.items():
        default = _OPTION_DEFAULTS[option]
        if option not in _codec_options(fmt) and (value is not None if default is None else value != default):
            takers = [name for name in FORMATS if option in _codec_options(format_named(name))]
            raise SpecError(f"{option} applies to format={' or '.join(map(repr, takers))}, not {format!r}; leave it "
                            f"{default}")
    options = {option: value for option, value in options.items() if option in _codec_options(fmt)}
    e4m3_checkpoint = isinstance(weight, torch.Tensor) and weight.dtype == torch.float8_e4m3fn
    if weight_scale is not None or (e4m3_checkpoint and fmt.scale_dtype == torch.float32):
        prepared = _prepare_fp8_checkpoint(weight, weight_scale, bias, layout, gate_up, fmt, pow2_scales)
    elif isinstance(weight, tuple):
        prepared = _prepare_block_checkpoint(weight, bias, layout, gate_up, fmt, global_scale)
    else:
        prepared = _prepare_dense(weight, bias, layout, gate_up, fmt, options)
    if format == "mxfp4" and (swizzled := _swizzled_layout(value_layout, prepared.w.device)):
        prepared.w = swizzle_mx_values(prepared.w, swizzled)
    return prepared


def _codec_options(fmt) -> tuple[str, ...]:
    return codec_of(fmt).options if fmt.scheme.codec else ()


def _swizzled_layout(value_layout: str, device: torch.device) -> str | None:
    """The swizzled layout mxfp4 values are stored in, or None for strided ones."""
    if value_layout != "auto":
        return None if value_layout == "strided" else value_layout
    return "hopper" if device.type == "cuda" and target(device).wgmma else None


def _check_outputs(bias, experts: int, out: int, gate_up) -> None:
    """The bias's shape, and an even ``out`` for gate_up."""
    if bias is not None:
        if not isinstance(bias, torch.Tensor):
            raise SpecTypeError(f"bias must be None or a float tensor (E, out) = {(experts, out)}, got "
                                f"{type(bias).__name__}; pass torch.tensor(...)")
        if tuple(bias.shape) != (experts, out):
            raise SpecError(f"bias must have shape (E, out) = {(experts, out)}, got {tuple(bias.shape)}")
    if gate_up is not None and out % 2:
        raise SpecError(f"gate_up needs an even number of output features, got {out}")


def _kernel_bias(bias, gate_up):
    """The bias as the kernel reads it: float32, contiguous, interleaved like the columns for concatenated gate/up."""
    if bias is None:
        return None
    return (_interleave(bias, -1) if gate_up == "concatenated" else bias).float().contiguous()


def _prepare_dense(weight, bias, layout, gate_up, fmt, options) -> PreparedWeights:
    if not isinstance(weight, torch.Tensor) or weight.ndim != 3 or not weight.dtype.is_floating_point:
        raise SpecError("weight must be a float tensor (E, out, in) or (E, in, out), or a (values, scales) tuple")
    w = weight.mT if layout == "out_in" else weight          # (E, K, N)
    k, n = w.shape[-2:]
    _check_outputs(bias, w.shape[0], n, gate_up)
    if fmt.scheme.codec is None:
        w = _interleave(w, -1) if gate_up == "concatenated" else w
        return PreparedWeights(w.to(fmt.torch_dtype).contiguous(), _kernel_bias(bias, gate_up), fmt.name,
                               gate_up=gate_up, layout=layout)
    codec = codec_of(fmt)
    if codec.runs_kernels:
        # (a Triton kernel quantizes: the weight must be where kernels run. A meta tensor has no data; on a GPU
        # the kernel would read its pointer, an illegal memory access)
        check_kernel_device(weight, "weight")
    if fmt.logical_k(1) == 2 and k % 2:
        raise SpecError(f"in must be even for {fmt.name} (two values per byte), got in={k} (weight "
                        f"{tuple(weight.shape)}, layout={layout!r}); pad in with a zero feature")
    # quantized in the checkpoint's own column order (fp8 blocks span 128 of them), then interleaved
    values, scales, global_scale = codec.quantize(w.mT, fmt, **options)
    return _prepared(values, scales, global_scale, bias, fmt, gate_up, layout)


def _prepare_block_checkpoint(weight, bias, layout, gate_up, fmt, global_scale) -> PreparedWeights:
    """A checkpoint quantized along ``in`` as (values, block scales), 'out_in': MX (gpt-oss: values may come as
    (E, out, in // 32, 16) blocks) and NVFP4 (ModelOpt's (weight, weight_scale), global_scale=weight_scale_2)."""
    takers = [name for name in FORMATS if format_named(name).scales_apply == "operand"]
    if fmt.scales_apply != "operand" or layout != "out_in":
        raise SpecError(f"a (values, scales) checkpoint must be quantized along `in` in 'out_in' layout: pass "
                        f"format= one of {takers} and layout='out_in'")
    if len(weight) != 2:
        raise SpecError(f"a checkpoint weight must be a (values, scales) tuple of 2 tensors, got a tuple of "
                        f"{len(weight)}")
    values, scales = weight
    packed = fmt.logical_k(1) == 2
    values_kind = f"packed {fmt.name} values, two per byte" if packed else f"{fmt.name} values"
    for name, t, dtype, kind in (("values", values, fmt.torch_dtype, values_kind),
                                 ("scales", scales, fmt.scale_dtype, f"{fmt.scale_element} scales")):
        if not isinstance(t, torch.Tensor):
            raise SpecTypeError(f"checkpoint {name} must be a tensor, got {type(t).__name__}")
        if t.dtype != dtype:
            raise SpecError(f"checkpoint {name} must be {dtype} ({kind}) for format={fmt.name!r}, got {t.dtype}")
    block = fmt.block_size
    if values.ndim == 4 and values.shape[-1] * (2 if packed else 1) == block:  # gpt-oss's (E, out, in // 32, 16)
        values = values.flatten(-2)
    if values.ndim != 3:
        raise SpecError(f"checkpoint values must be (E, out, in{' // 2' if packed else ''}) or (E, out, in // "
                        f"{block}, {block // 2 if packed else block}) blocks, got shape {tuple(values.shape)}")
    k = fmt.logical_k(values.shape[-1])
    if scales.ndim != 3 or values.shape[:2] != scales.shape[:2] or scales.shape[-1] != -(-k // block):
        raise SpecError(f"checkpoint scales must be (E, out, in // {block}) = {(*values.shape[:2], -(-k // block))} "
                        f"for values {tuple(values.shape)} (in={k}: one scale per {block} values, rounded up), got "
                        f"{tuple(scales.shape)}")
    if fmt.has_global_scale:
        if global_scale is None:
            raise SpecError(f"an {fmt.name} checkpoint needs its float32 global scale: pass "
                            f"global_scale=weight_scale_2 (ModelOpt's name: a scalar, or one per expert)")
        check_global_scale(global_scale, (values.shape[0],))  # (its dtype, shape and finiteness)
        global_scale = global_scale.reshape(-1).contiguous()
    _check_outputs(bias, values.shape[0], values.shape[1], gate_up)
    return _prepared(values.contiguous(), scales, global_scale, bias, fmt, gate_up, layout)


def _prepare_fp8_checkpoint(weight, weight_scale, bias, layout, gate_up, fmt, pow2_scales) -> PreparedWeights:
    """An e4m3 checkpoint with float32 scales (its (out, in) blocks: DeepSeek's 128 x 128, or per output column)."""
    format = fmt.name
    if fmt.scale_dtype != torch.float32:
        takers = [name for name in FORMATS if format_named(name).scale_dtype == torch.float32]
        raise SpecError(f"weight_scale= goes with an e4m3 checkpoint of format {' or '.join(map(repr, takers))}, "
                        f"not {format!r}; MX and NVFP4 checkpoints pass weight=(values, scales)")
    if weight_scale is None:
        raise SpecError(f"an e4m3 weight of format {format!r} needs its checkpoint's float32 scales: pass "
                        f"weight_scale=")
    if not isinstance(weight, torch.Tensor) or weight.dtype != torch.float8_e4m3fn or weight.ndim != 3:
        got = (f"{weight.dtype} {tuple(weight.shape)}" if isinstance(weight, torch.Tensor)
               else type(weight).__name__)
        raise SpecError(f"with weight_scale=, weight must be the checkpoint's torch.float8_e4m3fn values (E, out, in) "
                        f"or (E, in, out), got {got}; pass bf16/fp32 weights without weight_scale to quantize them")
    values = weight if layout == "out_in" else weight.mT    # (E, N, K)
    n_expts, n, k = values.shape
    if not isinstance(weight_scale, torch.Tensor) or weight_scale.dtype != torch.float32:
        got = weight_scale.dtype if isinstance(weight_scale, torch.Tensor) else type(weight_scale).__name__
        raise SpecError(f"weight_scale must be a float32 tensor, got {got}; convert it with .float()")
    if weight_scale.device != weight.device:
        raise SpecError(f"weight_scale is on {weight_scale.device} but weight is on {weight.device}; move both to one "
                        f"device")
    if pow2_scales:
        raise SpecError("pow2_scales applies when quantizing bf16/fp32 weights; a checkpoint's scales are taken as "
                        "they are: leave it False")
    # The scales' accepted shapes, each with the view that turns it into (E, out blocks, in blocks).
    if fmt.block_size:
        blocks_n, blocks_k = -(-n // FP8_BLOCK), -(-k // FP8_BLOCK)
        accepted = ({(n_expts, blocks_n, blocks_k): lambda s: s} if layout == "out_in" else
                    {(n_expts, blocks_k, blocks_n): lambda s: s.mT})
    else:
        accepted = {(n_expts, n): lambda s: s[..., None],
                    **({(n_expts, n, 1): lambda s: s} if layout == "out_in" else {(n_expts, 1, n): lambda s: s.mT})}
    as_out_in = accepted.get(tuple(weight_scale.shape))
    if as_out_in is None:
        expected = " or ".join(str(shape) for shape in accepted)
        raise SpecError(f"weight_scale of format {format!r} for a {layout!r} weight {tuple(weight.shape)} must have "
                        f"shape {expected}, got {tuple(weight_scale.shape)}")
    _check_outputs(bias, n_expts, n, gate_up)
    return _prepared(values.contiguous(), as_out_in(weight_scale), None, bias, fmt, gate_up, layout)


def _prepared(values, scales, global_scale, bias, fmt, gate_up, layout) -> PreparedWeights:
    """PreparedWeights of K-contiguous values (E, N, stored K), their block scales (E, N or blocks of N, K blocks)
    and per-tensor scales, in the checkpoint's column order."""
    if gate_up == "concatenated":
        block_n = 1 if scales is None else fmt.scale_block_n(scales.mT, values.shape[1])
        if block_n > 1:  # blocks of columns split by the interleaving: one scale a column
            scales = scales.repeat_interleave(block_n, dim=1)[:, :values.shape[1]]
        values, scales = _interleave(values, 1), None if scales is None else _interleave(scales, 1)
    if scales is not None:
        # (scales applied to the values are read a tile of columns at a time: N contiguous; float32 block scales
        # stay views of an e4m3 checkpoint's)
        scales = scales.mT.contiguous() if fmt.scales_apply == "operand" else scales.mT
    return PreparedWeights(values.mT, _kernel_bias(bias, gate_up), fmt.name, weight_scale=scales, scale=global_scale,
                           gate_up=gate_up, layout=layout)
