"""matmul_ogs with the fp8 checkpoint formats fp8e4m3_b128 (128 x 128 weight blocks, activations per row and 128
columns of K) and fp8e4m3_channel (weights per column, activations per row or per tensor), against a float64
reference of the contract: x quantized as the format says, both operands dequantized, multiplied exactly."""
import dataclasses

import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st

import ogsgen
from ogsgen import PrecisionConfig, matmul_ogs, matmul_ogs_torch
from ogsgen.numerics import FP8_BLOCK, dequantize_fp8_torch, quantize_fp8, quantize_fp8_torch
from ogsgen.testing import assert_close

from cases import fp8_dot_bound

FORMATS = ["fp8e4m3_b128", "fp8e4m3_channel"]
SWIGLU = ogsgen.FusedActivation(ogsgen.swiglu, (1.702, 7.0))
# bf16 outputs round to 2**-9 of their magnitude; the kernel's fp32 sums of exact fp8 products add little
BF16_OUT = dict(maxtol=8e-3, rmstol=4e-3)


def _act_block(fmt: str) -> tuple[int, int]:
    return (1, FP8_BLOCK) if fmt == "fp8e4m3_b128" else (1, 0)


def _x_as_the_kernel_sees_it(x, fmt):
    """x quantized as the format says, dequantized, float64."""
    block = _act_block(fmt)
    return dequantize_fp8_torch(*quantize_fp8_torch(x.float(), block), block).double()


def _weights(fmt, experts, k, n, device, gate_up=None):
    return ogsgen.prepare_expert_weights(torch.randn(experts, n, k, device=device) / k ** 0.5, format=fmt,
                                         gate_up=gate_up)


def _reference(x, prepared, fmt, *args, **kwargs):
    kwargs["precision_config"] = PrecisionConfig(out_dtype=torch.float64)
    return matmul_ogs_torch(_x_as_the_kernel_sees_it(x, fmt), prepared.dequantize().double(), *args, **kwargs)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("k", [256, 200, 96])   # whole groups, a partial last group, less than one group
def test_dense(fmt, k, device):
    x = torch.randn(37, k, device=device).bfloat16()
    prepared = _weights(fmt, 1, k, 160, device)
    bias = torch.randn(160, device=device)
    y = matmul_ogs(x, prepared.w[0], bias, precision_config=PrecisionConfig(weight_scale=prepared.weight_scale[0]))
    assert y.dtype == torch.bfloat16
    want = _x_as_the_kernel_sees_it(x, fmt) @ prepared.dequantize()[0].double() + bias.double()
    assert_close(want, y, **BF16_OUT)


@pytest.mark.usefixtures("kernels_on_demand")  # (fp16 outputs are not in the default catalog)
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("x_dtype,out_dtype,want_dtype", [
    (torch.float32, None, torch.bfloat16), (torch.float16, None, torch.float16), (torch.bfloat16, None, torch.bfloat16),
    (torch.float8_e4m3fn, None, torch.bfloat16), (torch.float32, torch.float32, torch.float32)])
def test_output_dtype(fmt, x_dtype, out_dtype, want_dtype, device):
    """docs/formats.md: bf16 by default (x's dtype for a 16-bit x), or out_dtype's; an fp32 x is quantized to e4m3
    like any other, so its output is bf16 too."""
    x = torch.randn(12, 256, device=device)
    prepared = _weights(fmt, 1, 256, 64, device)
    pc = PrecisionConfig(weight_scale=prepared.weight_scale[0], out_dtype=out_dtype)
    x_arg = x.to(x_dtype)
    if x_dtype == torch.float8_e4m3fn:
        x_arg, act_scale = quantize_fp8(x, _act_block(fmt))
        pc = dataclasses.replace(pc, act_scale=act_scale)
    y = matmul_ogs(x_arg, prepared.w[0], None, precision_config=pc)
    assert y.dtype == want_dtype
    assert_close(_x_as_the_kernel_sees_it(x.to(x_dtype) if x_dtype.itemsize > 1 else x, fmt)
                 @ prepared.dequantize()[0].double(), y, **BF16_OUT)


_DECODE_TILE, _PREFILL_TILE = dict(block_m=16, block_n=32, block_k=64, swap_ab=False), dict(block_m=64, block_n=64, block_k=128)


@pytest.mark.parametrize("fmt,tile", [
    pytest.param(FORMATS[0], _DECODE_TILE, id="b128-decode-tile"),
    pytest.param(FORMATS[0], dict(_DECODE_TILE, block_n=64, swap_ab=True), id="b128-decode-tile-swapped"),
    pytest.param(FORMATS[1], _DECODE_TILE, id="channel-decode-tile", marks=pytest.mark.slow),
    *(pytest.param(fmt, _PREFILL_TILE, id=f"{fmt[7:]}-prefill-tile", marks=pytest.mark.slow) for fmt in FORMATS)])
def test_moe_layer(fmt, tile, device):
    """A DeepSeek-style layer in small: w1 gathered with bias and SwiGLU (gate/up concatenated in the checkpoint,
    so b128 scales are per column after interleaving), w2 scattered with the gates, top-2."""
    tokens, hidden, inter, experts, top_k = 24, 256, 64, 8, 2
    rd, gi, si = ogsgen.routing(torch.randn(tokens, experts, device=device), top_k)
    x = torch.randn(tokens, hidden, device=device).bfloat16()
    w1 = _weights(fmt, experts, hidden, 2 * inter, device, gate_up="concatenated")
    w2 = _weights(fmt, experts, inter, hidden, device)
    b1 = torch.randn(experts, 2 * inter, device=device) / 4
    with ogsgen.opt_flags_constraints(**tile):
        h = matmul_ogs(x, w1.w, b1, rd, gather_indx=gi, fused_activation=SWIGLU,
                       precision_config=w1.precision_config())
        y = matmul_ogs(h, w2.w, None, rd, scatter_indx=si, gammas=rd.gate_scal, precision_config=w2.precision_config())
    h_want = _reference(x, w1, fmt, b1, rd, gi, fused_activation=SWIGLU)
    assert_close(h_want, h, **BF16_OUT)
    y_want = _reference(h, w2, fmt, None, rd, None, si, gammas=rd.gate_scal)   # from the kernel's own h
    assert_close(y_want, y, **BF16_OUT)


@pytest.mark.usefixtures("kernels_on_demand")  # (the float32 h it is checked against is not in the default catalog)
@pytest.mark.parametrize("split_k", [1, pytest.param(2, marks=pytest.mark.slow)])
def test_w1_writes_e4m3_h_and_its_scales(split_k, device):
    """A float32 out_scale makes w1's output fp8e4m3_b128: the epilogue quantizes the SwiGLU rows as quantize_fp8(h,
    (1, 128)) quantizes the float32 h of the same kernel, bit for bit (a partial last group of 64 columns included),
    and w2 takes them as its x and act_scale."""
    tokens, hidden, inter, experts, top_k = 12, 256, 192, 4, 2
    rd, gi, si = ogsgen.routing(torch.randn(tokens, experts, device=device), top_k)
    x = torch.randn(tokens, hidden, device=device).bfloat16()
    w1 = _weights("fp8e4m3_b128", experts, hidden, 2 * inter, device, gate_up="concatenated")
    w2 = _weights("fp8e4m3_b128", experts, inter, hidden, device)
    h_scales = torch.full((tokens * top_k, 2), float("nan"), device=device)
    with ogsgen.opt_flags_constraints(block_m=16, block_n=256, block_k=128, split_k=split_k):
        h32 = matmul_ogs(x, w1.w, None, rd, gather_indx=gi, fused_activation=SWIGLU,
                         precision_config=w1.precision_config(out_dtype=torch.float32))
        h = matmul_ogs(x, w1.w, None, rd, gather_indx=gi, fused_activation=SWIGLU,
                       precision_config=w1.precision_config(out_scale=h_scales))
    assert h.dtype == torch.float8_e4m3fn and h.shape == (tokens * top_k, inter)
    values, scales = quantize_fp8_torch(h32, (1, FP8_BLOCK))
    assert torch.equal(h.view(torch.uint8), values.view(torch.uint8))
    assert torch.equal(h_scales.view(torch.int32), scales.view(torch.int32))
    y = matmul_ogs(h, w2.w, None, rd, scatter_indx=si, gammas=rd.gate_scal,
                   precision_config=w2.precision_config(act_scale=h_scales))
    h_dequantized = dequantize_fp8_torch(h, h_scales, (1, FP8_BLOCK)).double()
    y_want = matmul_ogs_torch(h_dequantized, w2.dequantize().double(), None, rd, None, si, gammas=rd.gate_scal,
                              precision_config=PrecisionConfig(out_dtype=torch.float64))
    assert_close(y_want, y, **BF16_OUT)


def test_the_reference_quantizes_an_output_with_block_scales(device):
    """matmul_ogs_torch with out_scale returns what matmul_ogs does: the quantized float32 result, its scales
    written into out_scale (float32: fp8e4m3_b128; uint8: mxfp8)."""
    x, w = torch.randn(5, 64, device=device), torch.randn(64, 160, device=device)
    for scales, quantize in ((torch.empty(5, 2, device=device), lambda t: quantize_fp8_torch(t, (1, FP8_BLOCK))),
                             (torch.empty(5, 5, dtype=torch.uint8, device=device),
                              lambda t: ogsgen.numerics.quantize_mx_torch(t, "e4m3"))):
        y = matmul_ogs_torch(x, w, None, precision_config=PrecisionConfig(out_scale=scales))
        want_values, want_scales = quantize(x @ w)
        assert torch.equal(y.view(torch.uint8), want_values.view(torch.uint8)) and torch.equal(scales, want_scales)
    with pytest.raises(ogsgen.SpecError, match=r"out_scale must have shape \(5, 2\)"):
        matmul_ogs_torch(x, w, None, precision_config=PrecisionConfig(out_scale=torch.empty(5, 1, device=device)))
    # The format comes from matmul_ogs's door: a float16 out_scale, or an mxfp8 output asked in bf16, is refused
    # there and here alike (the reference took any dtype but float32 for mxfp8 scales before).
    for config, message in ((PrecisionConfig(out_scale=torch.empty(5, 2, dtype=torch.float16, device=device)),
                             r"out_scale must be uint8 .* or float32 .* got torch\.float16"),
                            (PrecisionConfig(out_scale=torch.empty(5, 5, dtype=torch.uint8, device=device),
                                             out_dtype=torch.bfloat16), r"out_dtype must be a float8 dtype")):
        with pytest.raises(ogsgen.SpecError, match=message):
            matmul_ogs_torch(x, w, None, precision_config=config)


@pytest.mark.usefixtures("kernels_on_demand")  # (a float32 output)
@pytest.mark.parametrize("swap_ab", [False, True])
def test_one_w_scale_per_tile_promotes_as_a_scale_per_column(swap_ab, device):
    """A tile inside one 128-column block of b128 weights multiplies each K group's products by one product of scales
    per row; with a scale per column (the same scales, expanded) by one per element. Both are x's row scale times
    w's block scale: the same bits (with the product's operands swapped too: W^T X^T)."""
    x = torch.randn(40, 384, device=device).bfloat16()
    prepared = _weights("fp8e4m3_b128", 1, 384, 256, device)
    outputs = []
    for scales in (prepared.weight_scale[0], prepared.weight_scale[0].repeat_interleave(FP8_BLOCK, -1)):
        with ogsgen.opt_flags_constraints(block_m=16, block_n=128, block_k=128, swap_ab=swap_ab):
            outputs.append(matmul_ogs(x, prepared.w[0], None, precision_config=PrecisionConfig(
                weight_scale=scales, out_dtype=torch.float32)))
    assert torch.equal(outputs[0], outputs[1])
    x_ref, w_ref = _x_as_the_kernel_sees_it(x, "fp8e4m3_b128"), prepared.dequantize()[0].double()
    if swap_ab and device == "cuda":  # a 64x16 wgmma: Hopper's fp8 sums (docs/formats.md, "fp8 dots on Hopper")
        assert ((outputs[0] - x_ref @ w_ref).abs() <= fp8_dot_bound(x_ref.abs() @ w_ref.abs())).all()
    else:  # mma.sync (a 16-row tile's X @ W) and the interpreter sum in fp32
        assert_close(x_ref @ w_ref, outputs[0], maxtol=1e-5, rmstol=1e-5)


@pytest.mark.parametrize("fmt", FORMATS)
def test_split_k(fmt, device):
    x = torch.randn(8, 512, device=device).bfloat16()
    prepared = _weights(fmt, 1, 512, 64, device)
    pc = PrecisionConfig(weight_scale=prepared.weight_scale[0], out_dtype=torch.float32)
    with ogsgen.opt_flags_constraints(block_m=16, block_n=32, block_k=64, split_k=3):
        y = matmul_ogs(x, prepared.w[0], None, precision_config=pc)
    want = _x_as_the_kernel_sees_it(x, fmt) @ prepared.dequantize()[0].double()
    assert_close(want, y, maxtol=1e-5, rmstol=1e-5)   # fp32 output: only the sums' roundings


@pytest.mark.parametrize("fmt", FORMATS)
def test_n_contiguous_weights_and_a_quantized_x(fmt, device):
    """The checkpoint's K-contiguous w or an N-contiguous copy; x quantized by the caller (act_scale)."""
    x = torch.randn(20, 384, device=device).bfloat16()
    prepared = _weights(fmt, 1, 384, 96, device)
    values, scales = quantize_fp8(x, _act_block(fmt))
    want = _x_as_the_kernel_sees_it(x, fmt) @ prepared.dequantize()[0].double()
    for w in (prepared.w[0], prepared.w[0].contiguous()):
        y = matmul_ogs(values, w, None, precision_config=PrecisionConfig(weight_scale=prepared.weight_scale[0],
                                                                           act_scale=scales))
        assert_close(want, y, **BF16_OUT)


@pytest.mark.parametrize("scale_shape", [(1,), ()], ids=["1", "0-d"])
def test_channel_weights_with_a_static_activation_scale(scale_shape, device):
    """fp8e4m3_channel's other activation form: one scale for the whole x (a checkpoint's static input scale), of
    shape (1,) or 0-d (checkpoints store input_scale as a scalar)."""
    x = torch.randn(12, 160, device=device)
    scale = (x.abs().amax() / 448).reshape(scale_shape)
    values = (x / scale).clamp(-448, 448).to(torch.float8_e4m3fn)
    prepared = _weights("fp8e4m3_channel", 1, 160, 64, device)
    y = matmul_ogs(values, prepared.w[0], None, precision_config=PrecisionConfig(
        weight_scale=prepared.weight_scale[0], act_scale=scale))
    want = matmul_ogs_torch(values.double() * scale.double(), prepared.dequantize()[0].double(), None,
                            precision_config=PrecisionConfig(out_dtype=torch.float64))
    assert_close(want, y, **BF16_OUT)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("quantized", [False, True], ids=["bf16-x", "e4m3-x"])
def test_k_zero_gives_the_epilogue_of_zeros(fmt, quantized, device):
    """K = 0: the products are zeros, so y is the epilogue of zeros (the bias, through SwiGLU here). The kernel's one
    masked K step must read no scales: a b128 call's x and w scales are empty then."""
    experts, n = 3, 64
    w = torch.zeros(experts, 0, n, dtype=torch.float8_e4m3fn, device=device)
    w_scale = torch.ones(experts, *((0, 1) if fmt == "fp8e4m3_b128" else (1, n)), device=device)
    bias = torch.randn(experts, n, device=device)
    rd, gi, _ = ogsgen.routing(torch.randn(5, experts, device=device), 2)
    x = torch.randn(5, 0, device=device).bfloat16()
    pc = PrecisionConfig(weight_scale=w_scale)
    if quantized:
        x, act_scale = quantize_fp8(x, _act_block(fmt))
        pc = PrecisionConfig(weight_scale=w_scale, act_scale=act_scale)
    y = matmul_ogs(x, w, bias, rd, gather_indx=gi, fused_activation=SWIGLU, precision_config=pc)
    want = matmul_ogs_torch(x.double(), w.double(), bias, rd, gi, fused_activation=SWIGLU,
                            precision_config=PrecisionConfig(out_dtype=torch.float64))
    assert_close(want, y, **BF16_OUT)
    dense = matmul_ogs(x, w[0], None, precision_config=dataclasses.replace(pc, weight_scale=w_scale[0]))
    assert dense.shape == (5, n) and not dense.any()


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_nan_in_x_makes_its_row_nan(fmt, device):
    x = torch.randn(6, 256, device=device).bfloat16()
    x[2, 5] = float("nan")
    prepared = _weights(fmt, 1, 256, 64, device)
    y = matmul_ogs(x, prepared.w[0], None, precision_config=PrecisionConfig(weight_scale=prepared.weight_scale[0]))
    assert y[2].isnan().all() and not y[[0, 1, 3, 4, 5]].isnan().any()


def test_errors(device):
    x = torch.randn(4, 256, device=device).bfloat16()
    b128 = _weights("fp8e4m3_b128", 1, 256, 64, device)
    w, scales = b128.w[0], b128.weight_scale[0]
    with pytest.raises(ogsgen.SpecError, match=r"weight_scale for w of shape \(256, 64\) .* got \(3, 1\)"):
        matmul_ogs(x, w, None, precision_config=PrecisionConfig(weight_scale=scales[:, :1].repeat(3, 1)[:3]))
    with pytest.raises(ogsgen.SpecError, match=r"w must be uint8 .* or e4m3 with float32 scales.*got torch.bfloat16"):
        matmul_ogs(x, w.bfloat16(), None, precision_config=PrecisionConfig(weight_scale=scales))
    for wrong in (torch.float64, torch.bfloat16):  # (float scales: .to(torch.uint8), mxfp8's advice, would ruin them)
        with pytest.raises(ogsgen.SpecError, match=rf"weight_scale of e4m3 w must be float32 .* convert it with "
                                                   rf"\.float\(\)\) or uint8 .* got {wrong}"):
            matmul_ogs(x, w, None, precision_config=PrecisionConfig(weight_scale=scales.to(wrong)))
    with pytest.raises(ogsgen.SpecError, match=r"x is e4m3 but precision_config.act_scale is None"):
        matmul_ogs(x.to(torch.float8_e4m3fn), w, None, precision_config=PrecisionConfig(weight_scale=scales))
    with pytest.raises(ogsgen.SpecError, match=r"act_scale .* must have shape \(M, cdiv\(K, 128\)\) = \(4, 2\), got"):
        matmul_ogs(x.to(torch.float8_e4m3fn), w, None,
                   precision_config=PrecisionConfig(weight_scale=scales, act_scale=torch.ones(4, 1, device=device)))
    with pytest.raises(ogsgen.SpecError, match=r"act_scale is the scale of an e4m3 x, but x is torch.bfloat16"):
        matmul_ogs(x, w, None, precision_config=PrecisionConfig(weight_scale=scales, act_scale=torch.ones(4, 2)))
    with pytest.raises(ogsgen.SpecError, match=r"act_scale of float32 .* need their precision_config.weight_scale as well"):
        matmul_ogs(x.to(torch.float8_e4m3fn), w, None, precision_config=PrecisionConfig(act_scale=torch.ones(4, 2)))
    with pytest.raises(ogsgen.SpecError, match=r"take 2-D x .* flatten the batch"):
        matmul_ogs(x[None], b128.w, None, precision_config=b128.precision_config())
    with pytest.raises(ogsgen.InapplicableConstraintError, match=r"block_k=256: fp8 block scales cover 128 rows"):
        with ogsgen.opt_flags_constraints(block_k=256):
            matmul_ogs(x, w, None, precision_config=PrecisionConfig(weight_scale=scales))
    channel = _weights("fp8e4m3_channel", 1, 256, 64, device)
    with pytest.raises(ogsgen.InapplicableConstraintError, match=r"swap_ab=True applies to fp8 weights with 128 x 128 "
                                                                 r"block scales \(fp8e4m3_b128\) only; drop it"):
        with ogsgen.opt_flags_constraints(swap_ab=True):
            matmul_ogs(x, channel.w[0], None, precision_config=PrecisionConfig(weight_scale=channel.weight_scale[0]))
    with pytest.raises(ogsgen.UnsupportedError, match=r"under autograd .* without precision_config's scales"):
        matmul_ogs(x.float().requires_grad_(), w, None, precision_config=PrecisionConfig(weight_scale=scales))


@pytest.mark.slow
@settings(max_examples=12, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_fuzz_moe_calls(data, device):
    """Random MoE calls of both formats: K block-aligned or ragged, top-k, gather or scatter, bias, extreme scales
    (weights and activations spanning many binades)."""
    fmt = data.draw(st.sampled_from(FORMATS))
    experts = data.draw(st.integers(1, 6))
    top_k = data.draw(st.integers(1, min(experts, 3)))
    tokens = data.draw(st.integers(1, 20))
    k = data.draw(st.sampled_from([64, 128, 200, 256, 300]))
    n = data.draw(st.sampled_from([32, 96, 160]))
    spread = data.draw(st.sampled_from([0.0, 8.0]))   # log2 range of the magnitudes
    gather = data.draw(st.booleans())
    torch.manual_seed(data.draw(st.integers(0, 2 ** 16)))
    magnitude = lambda *shape: torch.exp2(torch.rand(*shape, device=device) * spread - spread / 2)  # noqa: E731
    prepared = ogsgen.prepare_expert_weights(torch.randn(experts, n, k, device=device) * magnitude(experts, 1, k), format=fmt)
    rd, gi, si = ogsgen.routing(torch.randn(tokens, experts, device=device), top_k)
    bias = torch.randn(experts, n, device=device) if data.draw(st.booleans()) else None
    if gather:
        x = (torch.randn(tokens, k, device=device) * magnitude(tokens, 1)).bfloat16()
        y = matmul_ogs(x, prepared.w, bias, rd, gather_indx=gi, precision_config=prepared.precision_config())
        want = _reference(x, prepared, fmt, bias, rd, gi)
    else:
        x = (torch.randn(tokens * top_k, k, device=device) * magnitude(tokens * top_k, 1)).bfloat16()
        y = matmul_ogs(x, prepared.w, bias, rd, None, si, gammas=rd.gate_scal,
                       precision_config=prepared.precision_config())
        want = _reference(x, prepared, fmt, bias, rd, None, si, gammas=rd.gate_scal)
    assert_close(want, y, maxtol=1e-2, rmstol=5e-3)


@pytest.mark.parametrize("fmt", FORMATS)
def test_max_num_imprecise_acc_past_one_k_step(fmt, device):
    """precision_config.max_num_imprecise_acc larger than the tile's K step (Triton refuses a dot that would sum more
    than its K imprecisely): each K step is promoted, which is what the value asks for and more."""
    x = torch.randn(16, 256, device=device).bfloat16()
    prepared = _weights(fmt, 1, 256, 64, device)
    pc = PrecisionConfig(weight_scale=prepared.weight_scale[0], out_dtype=torch.float32, max_num_imprecise_acc=256)
    with ogsgen.opt_flags_constraints(block_m=16, block_n=32, block_k=64):
        y = matmul_ogs(x, prepared.w[0], None, precision_config=pc)
    want = _x_as_the_kernel_sees_it(x, fmt) @ prepared.dequantize()[0].double()
    assert_close(want, y, maxtol=1e-5, rmstol=1e-5)
