"""NVFP4: the weights of NVIDIA ModelOpt's FP4 checkpoints (DeepSeek-R1-FP4, Qwen3 FP4 and others).

A weight of shape (..., out, in) is stored as

* ``weight``: uint8 (..., out, in // 2), two e2m1 codes per byte along ``in`` (K), value 2i in the LOW nibble;
  a code's bit 3 is its sign, bits 0..2 index the magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6;
* ``weight_scale``: float8_e4m3fn (..., out, in // 16), one block scale per 16 consecutive values of K;
* ``weight_scale_2``: float32, one global scale: a scalar, or one per expert (shape (E,)) for stacked experts;

and means e2m1(code) * weight_scale * weight_scale_2. The e2m1 value times its block scale is exact in float32
(and in bf16: at most 5 significant bits, from 2**-10 to 2688); :func:`dequantize_nvfp4` multiplies that product by
the global scale, one float32 rounding, as a kernel that multiplies its accumulator by the global scale in its
epilogue does. (ModelOpt's own dequantize multiplies the two scales first: its result can differ from this one in
the last bit of float32.) K must be a multiple of 16: whole blocks (ModelOpt's own rule for ``in``).

:func:`quantize_nvfp4` follows ModelOpt's export (``NVFP4QTensor`` in modelopt/torch/quantization/qtensor/
nvfp4_tensor.py of NVIDIA/Model-Optimizer, read at commit 211c6b3 on 2026-12-06), in float32:

* global scale g = amax / (6 * 448) = amax / 2688 (IEEE division), amax = max |weight| over the tensor, or over
  each expert (dim 0) with ``per_expert=True``; or the ``global_scale`` given;
* block scale s = e4m3(block_amax / (6 * g)): ``6 * g`` rounded to float32, then the division; a quotient of 0 (a
  block of zeros) becomes 1.0; the quotient is clamped to [2**-9, 448] (2**-9, e4m3's smallest subnormal, keeps a
  block of tiny values from a zero scale, as ModelOpt's export does; 448 only matters for a given global scale
  below amax / 2688, whose blocks then saturate at +-6) and converted to e4m3 rounding to nearest, ties to even;
* codes: each value divided by ``s * g`` (that product rounded to float32, then the division), rounded to the
  nearest e2m1 value, ties to the even code (0.25 -> 0, 0.75 -> 1.0, 1.25 -> 1.0, 1.75 -> 2.0, 2.5 -> 2.0,
  3.5 -> 4.0, 5 -> 4.0), saturating at +-6 (``ogsgen.numerics.mx.encode_e2m1``, the thresholds of ModelOpt's ``_cast_fp4``);
  a value that rounds to 0 keeps its sign (-0.1 -> code 8, -0), and -0.0 gives code 0, as in ModelOpt.

Where ModelOpt has no rule, ogsgen chooses: an all-zero tensor (or expert), whose amax / 2688 is 0 (ModelOpt then
divides 0 by 0 and stores NaN block scales), gets the global scale 1.0, its blocks the scale 1.0 and codes 0 (so
does one whose amax is below about 2e-42, where the quotient underflows); a block holding a NaN or an infinity gets
the block scale NaN (0x7F) and codes 0, so that it dequantizes to NaN (as ogsgen's MX and fp8 block formats do),
and the global amax leaves such values out. vLLM's and TensorRT-LLM's CUDA quantization kernels compute their
version of the rule with approximate reciprocals (rcp.approx.ftz): their block scales and codes can differ from
these near rounding boundaries.

In a kernel, :func:`upcast_nvfp4_rows` turns a tile of codes and its block scales into e2m1 * block scale (exact);
the global scale, one factor per tensor or per expert, is the caller's to apply in its epilogue.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..errors import SpecError, SpecTypeError
from ..spec.functions import settle_triton_cache_keys
from .codecs import Codec, check_global_scale
from .fp8_blocks import FP8_E4M3_MAX
from .jit import e2m1_bytes_to_bf16, e2m1_times_2_14
from .mx import _check_tensor, decode_e2m1, encode_e2m1

NVFP4_BLOCK = 16          # values of K that share one e4m3 block scale
E2M1_MAX = 6.0
GLOBAL_SCALE_DIVISOR = E2M1_MAX * FP8_E4M3_MAX  # 2688: amax / 2688 is ModelOpt's global scale
SMALLEST_BLOCK_SCALE = 2.0 ** -9                # e4m3's smallest subnormal: block scales are clamped to it
NAN_BLOCK_SCALE = 0x7F                          # e4m3's NaN: the scale of a block holding a NaN or an infinity
_FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _check_dtype(t: torch.Tensor, name: str, dtype: torch.dtype, fix: str) -> None:
    if t.dtype != dtype:
        raise SpecError(f"{name} must be {dtype}, got {t.dtype}; {fix}")


def _check_k(k: int, name: str, shape) -> None:
    if k % NVFP4_BLOCK:
        raise SpecError(f"{name} of shape {tuple(shape)} has K = {k} values along its last axis: NVFP4 needs K to "
                        f"be a multiple of {NVFP4_BLOCK} (whole blocks); pad K with zeros to "
                        f"{-(-k // NVFP4_BLOCK) * NVFP4_BLOCK}")


def dequantize_nvfp4(codes: torch.Tensor, block_scales: torch.Tensor, global_scale: torch.Tensor) -> torch.Tensor:
    """The float32 weight (..., K) that NVFP4 ``codes`` (uint8 (..., K // 2), the low nibble first),
    ``block_scales`` (float8_e4m3fn (..., K // 16)) and ``global_scale`` (float32: a scalar, or shape (E,) for
    codes of shape (E, ..., K // 2)) mean: e2m1 * block scale (exact) times the global scale (rounded once).

    A ModelOpt checkpoint's ``weight``, ``weight_scale`` and ``weight_scale_2`` go in as they are. A NaN block scale
    (0x7F or 0xFF) gives NaN for its 16 values; a block scale of 0 gives zeros.
    """
    _check_tensor(codes, "codes")
    _check_tensor(block_scales, "block_scales")
    _check_dtype(codes, "codes", torch.uint8, "NVFP4 weights hold two e2m1 codes per byte: pass the checkpoint's "
                 "uint8 weight, or codes.view(torch.uint8)")
    _check_dtype(block_scales, "block_scales", torch.float8_e4m3fn, "a checkpoint's weight_scale is "
                 "float8_e4m3fn: pass it as it is, or view raw bytes with block_scales.view(torch.float8_e4m3fn)")
    if codes.ndim == 0:
        raise SpecError("codes must have K // 2 bytes along its last axis, got a 0-dim tensor")
    k = codes.shape[-1] * 2
    _check_k(k, "codes", codes.shape)
    expected = (*codes.shape[:-1], k // NVFP4_BLOCK)
    if tuple(block_scales.shape) != expected:
        raise SpecError(f"block_scales must have one scale per {NVFP4_BLOCK} values of K: shape {expected} for codes "
                        f"of shape {tuple(codes.shape)} (K = {k}), got {tuple(block_scales.shape)}")
    if block_scales.device != codes.device:
        raise SpecError(f"block_scales is on {block_scales.device}, codes on {codes.device}: move them to one device")
    g = check_global_scale(global_scale, tuple(codes.shape[:-1])).to(codes.device)
    return (_scaled_blocks(codes, block_scales) * g).flatten(-2)


def _scaled_blocks(codes: torch.Tensor, block_scales: torch.Tensor) -> torch.Tensor:
    """e2m1 values times their block scales (exact: at most 5 significant bits), (..., K // 16, 16)."""
    values = decode_e2m1(torch.stack([codes & 15, codes >> 4], dim=-1).flatten(-2))
    return values.unflatten(-1, (-1, NVFP4_BLOCK)) * block_scales.float()[..., None]


def quantize_nvfp4(weight: torch.Tensor, global_scale: torch.Tensor | None = None, *, per_expert: bool = False):
    """Quantize a float weight (..., K) (fp32, bf16 or fp16; K a multiple of 16) to NVFP4 by ModelOpt's rule (the
    module docstring): returns (codes uint8 (..., K // 2), block_scales float8_e4m3fn (..., K // 16),
    global_scale float32), the global scale a 0-dim tensor, or shape (E,) with ``per_expert=True`` (one per
    index of dim 0, from each expert's own amax). A given ``global_scale`` (float32, positive, finite: a scalar or
    (E,)) is used as it is and returned.
    """
    _check_tensor(weight, "weight")
    if weight.dtype not in _FLOAT_DTYPES:
        raise SpecError(f"weight must be float32, bfloat16 or float16, got {weight.dtype}; an already quantized "
                        f"weight goes to dequantize_nvfp4, other dtypes through weight.float()")
    if weight.ndim == 0:
        raise SpecError("weight must have K values along its last axis, got a 0-dim tensor")
    _check_k(weight.shape[-1], "weight", weight.shape)
    if not isinstance(per_expert, bool):
        raise SpecTypeError(f"per_expert must be a bool, got {per_expert!r}")
    if per_expert and global_scale is not None:
        raise SpecError("per_expert=True asks for global scales computed per expert, but global_scale is given: "
                        "pass one or the other (a given global_scale of shape (E,) is per expert already)")
    if per_expert and weight.ndim < 2:
        raise SpecError(f"per_expert=True needs experts along dim 0 of a weight of shape (E, ..., K), got shape "
                        f"{tuple(weight.shape)}")
    w = weight.float()
    finite = torch.isfinite(w)
    magnitude = torch.where(finite, w.abs(), 0.0)
    if global_scale is None:
        rows = magnitude.flatten(1) if per_expert else magnitude.reshape(1, -1)
        amax = torch.cat([rows, rows.new_zeros(rows.shape[0], 1)], dim=1).amax(dim=1)  # (the 0 column: empty rows)
        g = amax / GLOBAL_SCALE_DIVISOR
        g = torch.where(g > 0, g, 1.0)
        global_scale = g if per_expert else g.reshape(())
    g = check_global_scale(global_scale, tuple(weight.shape[:-1])).to(w.device)
    if not bool((global_scale > 0).all()):
        raise SpecError(f"global_scale must be positive, got {global_scale.tolist()}; omit it to use amax / "
                        f"{GLOBAL_SCALE_DIVISOR:g} (ModelOpt's global scale)")
    blocks = w.unflatten(-1, (-1, NVFP4_BLOCK))
    nonfinite = ~finite.unflatten(-1, (-1, NVFP4_BLOCK)).all(dim=-1)
    block_amax = magnitude.unflatten(-1, (-1, NVFP4_BLOCK)).amax(dim=-1)
    g_blocks = g.squeeze(-1)                                          # (drops the values' axis of a per-expert g)
    quotient = block_amax / (6.0 * g_blocks)
    quotient = torch.where(quotient == 0, 1.0, quotient).clamp(SMALLEST_BLOCK_SCALE, FP8_E4M3_MAX)
    scale_bits = torch.where(nonfinite, NAN_BLOCK_SCALE, quotient.to(torch.float8_e4m3fn).view(torch.uint8))
    block_scales = scale_bits.to(torch.uint8).view(torch.float8_e4m3fn)
    scaled = blocks / (block_scales.float() * g_blocks)[..., None]
    scaled = torch.where(nonfinite[..., None], 0.0, scaled) + 0.0     # (+ 0.0: -0.0 becomes +0.0, code 0)
    nibbles = encode_e2m1(scaled.flatten(-2))
    codes = nibbles[..., 0::2] | (nibbles[..., 1::2] << 4)
    return codes, block_scales, global_scale


def _quantize_weights(rows: torch.Tensor, fmt, global_scale: torch.Tensor | None = None):
    """NVFP4 codes and block scales of (E, N, K) floats, with the global scale given or one per expert."""
    codes, block_scales, global_scale = quantize_nvfp4(rows.float().contiguous(), global_scale,
                                                       per_expert=global_scale is None)
    return codes, block_scales, global_scale.reshape(-1)


@triton.jit
def e4m3_values(codes):
    """e4m3 block scales (tl.float8e4nv, or their bits as uint8) -> their float32 values, exactly, with integer
    operations: an e4m3 code's exponent and mantissa bits placed in an fp16's read as its value times 2**-8
    (subnormals too); the hardware fp16 -> fp32 conversion is exact. 0x7F and 0xFF, e4m3's NaN, give NaN."""
    if codes.dtype == tl.float8e4nv:
        codes = codes.to(tl.uint8, bitcast=True)
    bits = codes.to(tl.int32)
    half_bits = ((bits & 0x7F) << 7) | ((bits & 0x80) << 8)
    value = half_bits.to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32) * 256.0
    return tl.where((bits & 0x7F) == 0x7F, float("nan"), value)


@triton.jit
def upcast_nvfp4_rows(values, scales, ELEMENT: tl.constexpr, OUT_DTYPE: tl.constexpr):
    """A (R, S) tile of NVFP4 rows (R rows of W^T, S values of K: the K-major W tile of ``upcast_mx_rows``), as
    OUT_DTYPE: each e2m1 value times its block scale, exact in bf16, fp16 and fp32.

    values: (R, S // 2) uint8, two e2m1 codes per byte (value 2i in the low nibble of byte i); scales:
    (R, S // 16) e4m3 block scales (tl.float8e4nv, or their bits as uint8); ELEMENT: "e2m1" (the codecs' readers
    share one signature). A NaN scale gives NaN for its 16 values, a scale of 0 zeros. The global scale (per tensor or per expert) is NOT applied: the caller multiplies
    its fp32 accumulator by it in the epilogue. bf16 takes the packed bf16x2 upcast of mxfp4 (the e4m3 scale is
    exact in bf16), the others fp32 products, rounded once to OUT_DTYPE (exactly: at most 5 significant bits).
    """
    tl.static_assert(ELEMENT == "e2m1", "NVFP4 values are e2m1")
    ROWS: tl.constexpr = scales.shape[0]
    BLOCKS: tl.constexpr = scales.shape[1]
    factors = e4m3_values(scales)[:, :, None]
    if OUT_DTYPE == tl.bfloat16:
        low, high = e2m1_bytes_to_bf16(tl.reshape(values, (ROWS, BLOCKS, 8)),
                                       tl.broadcast_to(factors.to(tl.bfloat16), (ROWS, BLOCKS, 8)))
    else:
        codes = tl.reshape(values.to(tl.int32), (ROWS, BLOCKS, 8))
        low = (e2m1_times_2_14(codes & 15) * 16384.0 * factors).to(OUT_DTYPE)
        high = (e2m1_times_2_14(codes >> 4) * 16384.0 * factors).to(OUT_DTYPE)
    return tl.reshape(tl.join(low, high), (ROWS, BLOCKS * 16))


settle_triton_cache_keys(upcast_nvfp4_rows)  # (as ogsgen.numerics.jit's helpers: callees first)
CODEC = Codec(_quantize_weights,
              lambda values, block_scales, fmt: _scaled_blocks(values.mT, block_scales.mT).flatten(-2).mT,
              options=("global_scale",), reader=upcast_nvfp4_rows)
