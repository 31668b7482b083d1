"""matmul_ogs with MX activations: x of e4m3 or e5m2 values with one e8m0 scale per 32 values of K
(``precision_config.act_scale``, (..., M, cdiv(K, 32)) uint8), against a float64 reference of the contract: each
operand's values times their scale, rounded once to bf16 (exact unless the product leaves bf16's range or falls
below its smallest subnormal), multiplied exactly and summed in fp32."""
import pytest
import torch

import ogsgen
from ogsgen import FlexCtx, InFlexData, PrecisionConfig, matmul_ogs, matmul_ogs_torch
from ogsgen.numerics import dequantize_mx_torch, quantize_mx, swizzle_mx_values
from ogsgen.testing import assert_close
from cases import assert_fp32_sums, check_mx_output, fp32_bound, quick_few

pytestmark = pytest.mark.usefixtures("kernels_on_demand")  # e5m2 x and fp32 outputs beside the default catalog

FP8 = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}
W_FORMATS = ["bf16", "mxfp4", "mxfp4_hopper", "mxfp8e4m3"]
SWIGLU = ogsgen.FusedActivation(ogsgen.swiglu, (1.702, 7.0))
FP32 = PrecisionConfig(out_dtype=torch.float32)
# fp32 sums of products exact in fp32, in the kernel's order, against their float64 sum
TIGHT = dict(maxtol=1e-5, rmstol=1e-5)


def upcast(values, scales, element, axis=-1):
    """What the kernel multiplies: MX values times their block's scale, rounded once to bf16, as float64."""
    return dequantize_mx_torch(values, scales, element, axis=axis, dtype=torch.bfloat16).double()


def mx_x(shape, element, device, spread=8):
    """(values, act_scale, reference) of an mxfp8 x whose rows span ``spread`` binades (so that each row has scales
    of its own: a row read with another's scales is off by powers of two)."""
    x = torch.randn(shape, device=device) * torch.exp2(torch.randint(-spread, spread + 1, (*shape[:-1], 1),
                                                                      device=device).float())
    values, scales = quantize_mx(x, element)
    return values, scales, upcast(values, scales, element)


def weights(w_format, k, n, device, lead=()):
    """(w argument, its PrecisionConfig fields, the float64 (..., K, N) values the kernel multiplies)."""
    dense = torch.randn(*lead, n, k, device=device) / k ** 0.5
    if w_format == "bf16":
        w = dense.mT.contiguous().bfloat16()
        return w, {}, w.double()
    if w_format == "fp8e4m3":  # fp8 flexpoint: one scale for the tensor, applied after the dot
        w, scale = (dense * 8).to(torch.float8_e4m3fn).mT, torch.tensor([0.375], device=device)
        return w, {"flex_ctx": FlexCtx(rhs_data=InFlexData(scale=scale))}, w.double() * 0.375
    element = "e2m1" if w_format.startswith("mxfp4") else "e4m3"
    values, scales = quantize_mx(dense, element)
    w = swizzle_mx_values(values.mT) if w_format == "mxfp4_hopper" else values.mT
    return w, {"weight_scale": scales.mT}, upcast(values, scales, element).mT


def k_tile(w_format):
    return dict(block_k=64) if w_format == "mxfp4_hopper" else dict(block_k=32)


# Block scale codes of the edge test, one per block of K (K = 200: the last block holds 8 values): the smallest (0,
# 2**-127, whose products are bf16 subnormals, rounded), 1, around 1.0 (126, 127), the largest (254, 2**127), and two
# ordinary ones. Code 255 (e8m0's NaN) goes into single blocks below.
EDGE_CODES = (0, 1, 126, 127, 254, 120, 3)


def edge_x(m, element, device):
    """(values, scales) of an mxfp8 x of K = 200 whose blocks take EDGE_CODES in turn, values random finite codes
    (below 2 under the scale 2**127); row 1 has a NaN scale in one block, row 2 a NaN value, row 3 the element's
    largest value under 2**127 (past bf16's range: inf), and for e5m2 row 4 an infinity."""
    k, dtype = 200, FP8[element]
    codes = torch.randint(0, 256, (m, k), device=device, dtype=torch.int32).to(torch.uint8)
    big = (torch.arange(k, device=device) // 32 == EDGE_CODES.index(254))[None, :]
    codes = torch.where(big, codes & 0xBF, codes)  # (both elements: a clear top exponent bit is a value below 2)
    values = codes.view(dtype)
    values = torch.where(values.float().isfinite(), values.float(), 1.0).to(dtype)  # NaN and inf codes: below
    scales = torch.tensor(EDGE_CODES, device=device, dtype=torch.uint8).repeat(m, 1)
    scales[1, 2] = 255
    values[2, 40] = float("nan")
    values[3, EDGE_CODES.index(254) * 32 + 3] = torch.finfo(dtype).max
    if element == "e5m2":
        values[4, 70] = float("-inf")
    return values, scales


def mx_w_codes(w_format, k, n, x_codes, device):
    """(values, scales) along K of (N, K) MX weights whose block b has the scale that brings x's block scale back to
    around 1 (products of ordinary size), within the element's range, and a NaN scale in column 5's block 1."""
    element, top = ("e2m1", 123) if w_format.startswith("mxfp4") else ("e4m3", 118)
    if element == "e2m1":
        values = torch.randint(0, 256, (n, k // 2), device=device, dtype=torch.int32).to(torch.uint8)
    else:
        values = (torch.randn(n, k, device=device) * 64).clamp(-448, 448).to(torch.float8_e4m3fn)
    shift = torch.tensor([c - 127 for c in x_codes], device=device)
    scales = (top - shift).clamp(0, 254).to(torch.uint8).repeat(n, 1)
    scales[5, 1] = 255
    return element, values, scales


@pytest.mark.parametrize("element", ["e4m3", pytest.param("e5m2", marks=pytest.mark.slow)])
@pytest.mark.parametrize("w_format", W_FORMATS)
def test_edge_scale_codes_exactly(element, w_format, device):
    """Every block scale code at its edges: w is block-diagonal (output columns 8b .. 8b + 7 read only K block b),
    so that each output is one block's sum, checked against float64 within the fp32 sums' rounding: a block read
    with a wrong scale, a value rounded otherwise, or a NaN or inf lost shows."""
    m, k, n_blocks = 6, 200, len(EDGE_CODES)
    n = 8 * n_blocks
    xv, xs = edge_x(m, element, device)
    x_ref = upcast(xv, xs, element)
    block_of_k = torch.arange(k, device=device) // 32
    diagonal = block_of_k[:, None] == torch.arange(n, device=device)[None, :] // 8          # (K, N)
    if w_format == "bf16":
        # each block's rows times the inverse of x's scale there (a bf16 power of two, subnormal for 2**-127)
        inverse = torch.exp2(-3 - torch.tensor([c - 127.0 for c in EDGE_CODES], device=device))[block_of_k]
        w = (torch.randn(k, n, device=device).clamp(-4, 4) * inverse[:, None] * diagonal).bfloat16()
        w_arg, fields, w_ref = w, {}, w.double()
    else:
        element_w, values, scales = mx_w_codes(w_format, k, n, EDGE_CODES, device)
        if element_w == "e2m1":  # zero the values outside the block-diagonal (e2m1 code 0 is 0.0)
            keep = diagonal.T.reshape(n, k // 2, 2).all(-1)
            values = torch.where(keep, values, 0)
        else:
            values = torch.where(diagonal.T, values.float(), 0.0).to(torch.float8_e4m3fn)
        w_ref = upcast(values, scales, element_w).mT
        w_arg = swizzle_mx_values(values.mT) if w_format == "mxfp4_hopper" else values.mT
        fields = {"weight_scale": scales.mT}
    with ogsgen.opt_flags_constraints(block_m=16, block_n=16, **k_tile(w_format)):
        y = matmul_ogs(xv, w_arg, None, precision_config=PrecisionConfig(act_scale=xs, out_dtype=torch.float32,
                                                                          **fields))
    want = x_ref @ w_ref
    assert want[1].isnan().all() and want[3].isinf().any()
    finite = want[0].isfinite()   # (but for mx w, column 5: a NaN scale)
    assert finite.sum() >= n - 1 and (want[0][finite] != 0).all()  # every block's products count
    assert_fp32_sums(want, fp32_bound(x_ref, w_ref), y)


@pytest.mark.parametrize("w_format", W_FORMATS + ["fp8e4m3"])
# K: whole K steps; a partial last block; less than one block
@pytest.mark.parametrize("k", quick_few([256, 200, 16], {200}))
def test_dense(w_format, k, device):
    if w_format.startswith("mxfp4") and k % 2:
        pytest.skip("mxfp4 packs two values per byte")
    m, n = 37, 48
    xv, xs, x_ref = mx_x((m, k), "e4m3", device)
    w, fields, w_ref = weights(w_format, k, n, device)
    bias = torch.randn(n, device=device)
    with ogsgen.opt_flags_constraints(block_m=16, block_n=32, **k_tile(w_format)):
        y = matmul_ogs(xv, w, bias, precision_config=PrecisionConfig(act_scale=xs, out_dtype=torch.float32,
                                                                      **fields))
    want = x_ref @ w_ref + bias.double()
    assert_fp32_sums(want, fp32_bound(x_ref, w_ref) + 2.0 ** -23 * want.abs(), y)


def test_bf16_output_and_the_heuristics_tiles(device):
    """The default output dtype (bf16 for fp8 x) and launch parameters, with e5m2 values."""
    xv, xs, x_ref = mx_x((70, 300), "e5m2", device)
    w, fields, w_ref = weights("mxfp4", 300, 96, device)
    y = matmul_ogs(xv, w, None, precision_config=PrecisionConfig(act_scale=xs, **fields))
    assert y.dtype == torch.bfloat16
    assert_close(x_ref @ w_ref, y, maxtol=8e-3, rmstol=4e-3)


@pytest.mark.parametrize("w_format", ["bf16", "mxfp4"])
def test_batched(w_format, device):
    b, m, k, n = 3, 10, 72, 40
    xv, xs, x_ref = mx_x((b, m, k), "e4m3", device)
    w, fields, w_ref = weights(w_format, k, n, device, lead=(b,))
    with ogsgen.opt_flags_constraints(block_m=16, block_n=32, block_k=32):
        y = matmul_ogs(xv, w, None, precision_config=PrecisionConfig(act_scale=xs, out_dtype=torch.float32,
                                                                      **fields))
    want = x_ref @ w_ref
    assert_fp32_sums(want, fp32_bound(x_ref, w_ref), y)


@pytest.mark.parametrize("w_format", ["bf16", "mxfp8e4m3"])
def test_split_k(w_format, device):
    xv, xs, x_ref = mx_x((8, 512), "e4m3", device)
    w, fields, w_ref = weights(w_format, 512, 64, device)
    with ogsgen.opt_flags_constraints(block_m=16, block_n=32, block_k=64, split_k=3):
        y = matmul_ogs(xv, w, None, precision_config=PrecisionConfig(act_scale=xs, out_dtype=torch.float32,
                                                                      **fields))
    want = x_ref @ w_ref
    assert_fp32_sums(want, fp32_bound(x_ref, w_ref), y)


@pytest.mark.parametrize("w_format", [w if w == "bf16" else pytest.param(w, marks=pytest.mark.slow) for w in W_FORMATS])
@pytest.mark.parametrize("top_k,split_k", [(2, 1), pytest.param(1, 1, marks=pytest.mark.slow),
                                           pytest.param(2, 2, marks=pytest.mark.slow)])
def test_moe_gather_then_scatter(w_format, top_k, split_k, device):
    """gpt-oss's two matmuls in small: w1 gathers token rows (each row's scales its token's) with bias and SwiGLU,
    w2 takes the sorted rows, scatters them with the gates and sums each token's top-k (through fp32 split-K
    partials with split_k 2)."""
    tokens, hidden, inter, n_expts = 20, 80, 48, 4
    rd, gi, si = ogsgen.routing(torch.randn(tokens, n_expts, device=device), top_k)
    xv, xs, x_ref = mx_x((tokens, hidden), "e4m3", device)
    w1, f1, w1_ref = weights(w_format, hidden, 2 * inter, device, lead=(n_expts,))
    w2, f2, w2_ref = weights(w_format, inter, hidden, device, lead=(n_expts,))
    b1, b2 = torch.randn(n_expts, 2 * inter, device=device), torch.randn(n_expts, hidden, device=device)
    gammas = rd.gate_scal.float()
    with ogsgen.opt_flags_constraints(block_m=16, block_n=32, **k_tile(w_format)):
        h = matmul_ogs(xv, w1, b1, rd, gather_indx=gi, fused_activation=SWIGLU,
                       precision_config=PrecisionConfig(act_scale=xs, out_dtype=torch.float32, **f1))
        hv, hs = quantize_mx(h, "e4m3")
        with ogsgen.opt_flags_constraints(split_k=split_k):
            y = matmul_ogs(hv, w2, b2, rd, scatter_indx=si, gammas=gammas,
                           precision_config=PrecisionConfig(act_scale=hs, out_dtype=torch.float32, **f2))
    h_want = matmul_ogs_torch(x_ref.float(), w1_ref.float(), b1, rd, gi, fused_activation=SWIGLU,
                              precision_config=FP32)
    assert_close(h_want, h, **TIGHT)
    y_want = matmul_ogs_torch(upcast(hv, hs, "e4m3").float(), w2_ref.float(), b2, rd, scatter_indx=si,
                              gammas=gammas, precision_config=FP32)
    assert_close(y_want, y, **TIGHT)


@pytest.mark.parametrize("value_layout", [pytest.param("strided", marks=pytest.mark.slow), "hopper"])
def test_mxfp8_output_feeds_the_next_matmul(value_layout, device):
    """The MLP without a bf16 intermediate: w1 writes its SwiGLU output as mxfp8 (values and out_scale), which w2
    takes as x and act_scale; each against the reference of its own inputs."""
    tokens, hidden, inter, n_expts, top_k = 24, 64, 64, 4, 2
    rd, gi, si = ogsgen.routing(torch.randn(tokens, n_expts, device=device), top_k)
    xv, xs, x_ref = mx_x((tokens, hidden), "e4m3", device)
    w_format = "mxfp4_hopper" if value_layout == "hopper" else "mxfp4"
    w1, f1, w1_ref = weights(w_format, hidden, 2 * inter, device, lead=(n_expts,))
    w2, f2, w2_ref = weights(w_format, inter, hidden, device, lead=(n_expts,))
    h_scales = torch.full((tokens * top_k, inter // 32), 255, dtype=torch.uint8, device=device)
    with ogsgen.opt_flags_constraints(block_m=16, block_n=64, **k_tile(w_format)):
        h = matmul_ogs(xv, w1, None, rd, gather_indx=gi, fused_activation=SWIGLU,
                       precision_config=PrecisionConfig(act_scale=xs, out_scale=h_scales, **f1))
        y = matmul_ogs(h, w2, None, rd, scatter_indx=si, gammas=rd.gate_scal.float(),
                       precision_config=PrecisionConfig(act_scale=h_scales, out_dtype=torch.float32, **f2))
    assert h.dtype == torch.float8_e4m3fn and h.shape == (tokens * top_k, inter)
    h_want = matmul_ogs_torch(x_ref.float(), w1_ref.float(), None, rd, gi, fused_activation=SWIGLU,
                              precision_config=FP32)
    check_mx_output(h_want, h, h_scales, "e4m3", rtol=1e-5)
    y_want = matmul_ogs_torch(upcast(h, h_scales, "e4m3").float(), w2_ref.float(), None, rd, scatter_indx=si,
                              gammas=rd.gate_scal.float(), precision_config=FP32)
    assert_close(y_want, y, **TIGHT)


def test_errors(device):
    x = torch.randn(8, 96, device=device)
    xv, xs = quantize_mx(x, "e4m3")
    w = torch.randn(96, 32, device=device).bfloat16()
    bad = [
        (dict(x=xv, pc=PrecisionConfig(act_scale=xs.int())), ogsgen.SpecError,
         r"act_scale must be uint8 \(the e8m0 scales of an mxfp8 x.* got torch.int32"),
        (dict(x=x.bfloat16(), pc=PrecisionConfig(act_scale=xs)), ogsgen.SpecError,
         r"act_scale of uint8 \(e8m0 scales\) makes x mxfp8: x must be torch.float8_e4m3fn or torch.float8_e5m2, "
         r"got torch.bfloat16"),
        (dict(x=xv, pc=PrecisionConfig(act_scale=xs[:, :2])), ogsgen.SpecError,
         r"act_scale must hold one e8m0 byte per 32 values of K of each row of x: shape \(8, 3\) for x of shape "
         r"\(8, 96\), got \(8, 2\)"),
        (dict(x=xv[None], w=w[None], pc=PrecisionConfig(act_scale=xs)), ogsgen.SpecError,
         r"shape \(1, 8, 3\) for x of shape \(1, 8, 96\), got \(8, 3\)"),
        (dict(x=xv, w=w.half()), ogsgen.SpecError,
         r"mxfp8 activations are upcast to bf16 in the kernel, so w must be bf16, mx \(mxfp4, mxfp8\) or fp8 with a "
         r"flexpoint scale, got fp16"),
        (dict(x=xv, w=w.float()), ogsgen.SpecError, r"so w must be bf16, .* got fp32"),
        (dict(x=xv, pc=PrecisionConfig(act_scale=xs, flex_ctx=FlexCtx(lhs_data=InFlexData(scale=torch.ones(
            1, device=device))))), ogsgen.SpecError, r"lhs_data.scale is set but the operand is mxfp8e4m3"),
        (dict(x=xv, pc=PrecisionConfig(act_scale=list(xs))), ogsgen.SpecTypeError,
         r"precision_config.act_scale must be a torch.Tensor"),
    ]
    for call, exc, message in bad:
        pc = call.get("pc", PrecisionConfig(act_scale=xs))
        with pytest.raises(exc, match=message):
            matmul_ogs(call["x"], call.get("w", w), None, precision_config=pc)
    with pytest.raises(ogsgen.InapplicableConstraintError,
                       match=r"block_k=16: mx activations carry one scale per 32 values of K"):
        with ogsgen.opt_flags_constraints(block_k=16):
            matmul_ogs(xv, w, None, precision_config=PrecisionConfig(act_scale=xs))
    b128 = ogsgen.prepare_expert_weights(torch.randn(1, 32, 96, device=device), format="fp8e4m3_b128")
    with pytest.raises(ogsgen.SpecError, match=r"act_scale of uint8 makes x mxfp8, which fp8e4m3_b128 weights do "
                                               r"not take"):
        matmul_ogs(xv.to(torch.float8_e4m3fn), b128.w[0], None,
                   precision_config=PrecisionConfig(weight_scale=b128.weight_scale[0], act_scale=xs))
    rd, _, _ = ogsgen.routing(torch.randn(8, 2, device=device), 1)
    with pytest.raises(ogsgen.SpecError, match=r"inner_routing_data takes unscaled operands .* scales None"):
        matmul_ogs(x.bfloat16().mT, torch.randn(8, 16, device=device).bfloat16(), None,
                   precision_config=PrecisionConfig(act_scale=xs), inner_routing_data=ogsgen.InnerRoutingData(rd, 16))


def test_gathered_rows_scales_must_be_the_tokens(device):
    """A gather reads token rows: act_scale has a row per token, not per gathered (sorted) row."""
    rd, gi, _ = ogsgen.routing(torch.randn(6, 4, device=device), 2)
    xv, xs = quantize_mx(torch.randn(6, 64, device=device), "e4m3")
    w, fields, _ = weights("mxfp4", 64, 32, device, lead=(4,))
    with pytest.raises(ogsgen.SpecError, match=r"shape \(6, 2\) for x of shape \(6, 64\), got \(12, 2\)"):
        matmul_ogs(xv, w, None, rd, gather_indx=gi,
                   precision_config=PrecisionConfig(act_scale=xs.repeat(2, 1), **fields))


@pytest.mark.slow
def test_quantize_mx_as_a_processs_first_launch_is_right(tmp_path):
    """quantize_mx, the way to make an mxfp8 x, corrects Triton's CPU interpreter before its launch as matmul_ogs
    does (uncorrected, fp32 -> e4m3 casts drop the carry of a round-up: 1.97 became 1.0); and dequantize_mx."""
    import os
    import subprocess
    import sys
    from pathlib import Path
    if torch.cuda.is_available():
        pytest.skip("the interpreter's corrections: CPU only")
    script = ("import torch\n"
              "from ogsgen.numerics import dequantize_mx, quantize_mx, quantize_mx_torch\n"
              "x = torch.linspace(-30, 30, 4 * 96).reshape(4, 96) * 1.0001\n"
              "values, scales = quantize_mx(x, 'e4m3')\n"
              "want = quantize_mx_torch(x, 'e4m3')\n"
              "assert torch.equal(values.view(torch.uint8), want[0].view(torch.uint8)), 'values'\n"
              "assert torch.equal(scales, want[1]), 'scales'\n"
              "nan = torch.full((1, 32), 0x7F, dtype=torch.uint8).view(torch.float8_e4m3fn)\n"
              "assert dequantize_mx(nan, torch.full((1, 1), 127, dtype=torch.uint8), 'e4m3').isnan().all(), 'NaN'\n"
              "print('first launch ok')\n")
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(Path(__file__).parents[1])}
    done = subprocess.run([sys.executable, "-c", script], env=env, cwd=tmp_path, capture_output=True, text=True)
    assert done.returncode == 0 and "first launch ok" in done.stdout, done.stderr[-2000:]


@pytest.mark.parametrize("w_format", ["bf16", "mxfp4"])
def test_a_replayed_call_reads_its_own_scales(w_format, device):
    """A repeated call replays the first one's launch plan: with other scales (each code one more: x doubled) and
    another x, it computes with them."""
    xv, xs, x_ref = mx_x((24, 96), "e4m3", device)
    w, fields, w_ref = weights(w_format, 96, 64, device)
    outputs = []
    for values, scales in ((xv, xs), (xv.clone(), xs + 1), (-xv.float(), xs)):
        outputs.append(matmul_ogs(values.to(torch.float8_e4m3fn), w, None, precision_config=PrecisionConfig(
            act_scale=scales, out_dtype=torch.float32, **fields)))
    assert_fp32_sums(x_ref @ w_ref, fp32_bound(x_ref, w_ref), outputs[0])
    assert torch.equal(outputs[1], 2 * outputs[0]) and torch.equal(outputs[2], -outputs[0])
