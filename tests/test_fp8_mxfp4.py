"""matmul_ogs with e4m3 activations and mxfp4 weights: x scaled per tensor (``flex_ctx.lhs_data.scale``) or per row
(a float32 ``precision_config.act_scale`` of (M, 1) or (1,)), w packed e2m1 with e8m0 scales per 32 values of K, in
every value layout. The contract, checked against float64: the products of the dequantized operands (x's values
times x's scale, w's values times 2 ** (code - 127)), exact, summed in fp32; a NaN scale makes its column NaN."""
import pytest
import torch

import ogsgen
from ogsgen import FlexCtx, InFlexData, PrecisionConfig, matmul_ogs, matmul_ogs_torch
from ogsgen.numerics import quantize_fp8_torch, quantize_mx, swizzle_mx_values
from ogsgen.numerics.mx import decode_e2m1
from ogsgen.testing import assert_close
from cases import assert_fp32_sums, fp32_bound

pytestmark = pytest.mark.usefixtures("kernels_on_demand")  # fp32 outputs beside the default catalog's

SWIGLU = ogsgen.FusedActivation(ogsgen.swiglu, (1.702, 7.0))
FP32 = PrecisionConfig(out_dtype=torch.float32)


def dequantized_w(values, scales):
    """float64 (..., K, N) of mxfp4 values (..., N, K // 2) and scales (..., N, K // 32): exact, even where the
    product leaves fp32's range."""
    codes = torch.stack([values & 15, values >> 4], -1).flatten(-2).long()
    factors = torch.exp2(scales.double() - 127).masked_fill(scales == 255, float("nan"))
    return (decode_e2m1(codes).double() * factors.repeat_interleave(32, -1)[..., :codes.shape[-1]]).mT


def mxfp4_w(k, n, device, lead=(), spread=6, layout="strided"):
    """(w argument, weight_scale, float64 reference) of random mxfp4 weights whose block scales spread over
    ``spread`` binades either side of 2**-3."""
    dense = torch.randn(*lead, n, k, device=device)
    dense = dense * torch.exp2(torch.randint(-spread, spread + 1, (*lead, n, -(-k // 32)), device=device).float()
                               - 3).repeat_interleave(32, -1)[..., :k]
    values, scales = quantize_mx(dense, "e2m1")
    w = in_layout(values.mT, layout)
    return w, scales.mT, dequantized_w(values, scales)


def e4m3_x(shape, device, scaling):
    """(x, precision config fields, float64 reference): e4m3 values with one scale per row (quantize_fp8_torch's),
    or one per tensor (flexpoint)."""
    x = torch.randn(shape, device=device) * torch.exp2(torch.randint(-4, 5, (*shape[:-1], 1), device=device).float())
    if scaling == "row":
        values, scales = quantize_fp8_torch(x, (1, 0))
        return values, {"act_scale": scales}, values.double() * scales.double()
    scale = torch.tensor([0.03125], device=device)
    values = (x / scale).clamp(-448, 448).to(torch.float8_e4m3fn)
    return values, {"flex_ctx": FlexCtx(lhs_data=InFlexData(scale=scale))}, values.double() * scale.double()


def in_layout(values, layout):
    return values if layout == "strided" else swizzle_mx_values(values, layout)


def k_tile(layout, block_k=None):
    return {"block_k": block_k or (32 if layout == "strided" else 64)}


def run(x, w, bias, fields, scales, **kwargs):
    return matmul_ogs(x, w, bias, precision_config=PrecisionConfig(weight_scale=scales, out_dtype=torch.float32,
                                                                   **fields), **kwargs)


@pytest.mark.parametrize("layout", ["strided", "hopper", "hopper_fp8"])
@pytest.mark.parametrize("scaling", ["row", "tensor"])
@pytest.mark.parametrize("k,block_k,spread", [(256, 128, 6), pytest.param(256, 64, 40, marks=pytest.mark.slow),
                                               pytest.param(192, 64, 6, marks=pytest.mark.slow),
                                               pytest.param(200, 32, 20, marks=pytest.mark.slow)])
def test_dense(layout, scaling, k, block_k, spread, device):
    """Scales within the fold window of each K step (spread 6) and past it (spread 20, 40: steps taken block by
    block), whole and partial K steps, a partial last block (K = 200)."""
    if layout != "strided" and block_k % 64:
        pytest.skip("swizzled values come in groups of 64 rows of K")
    m, n = 37, 48
    x, fields, x_ref = e4m3_x((m, k), device, scaling)
    w, scales, w_ref = mxfp4_w(k, n, device, spread=spread, layout=layout)
    bias = torch.randn(n, device=device)
    with ogsgen.opt_flags_constraints(block_m=16, block_n=32, block_k=block_k):
        y = run(x, w, bias, fields, scales)
    want = x_ref @ w_ref + bias.double()
    assert_fp32_sums(want, fp32_bound(x_ref, w_ref) + 2.0 ** -23 * want.abs(), y)


def test_batched_with_a_scale_per_tensor(device):
    b, m, k, n = 3, 10, 128, 40
    x, fields, x_ref = e4m3_x((b, m, k), device, "tensor")
    w, scales, w_ref = mxfp4_w(k, n, device, lead=(b,))
    with ogsgen.opt_flags_constraints(block_m=16, block_n=32, block_k=64):
        y = run(x, w, None, fields, scales)
    want = x_ref @ w_ref
    assert_fp32_sums(want, fp32_bound(x_ref, w_ref) + 2.0 ** -23 * want.abs(), y)


# The scale codes of the edge test's K steps (BLOCK_K = 64: two blocks per step): e8m0's smallest and largest codes (0
# is 2**-127; 254 is 2**127, whose products leave fp32's range for large x), codes around 1.0, e8m0's NaN, and pairs
# 14 and 15 codes apart. Every column spans them all, so the kernel takes each step's blocks alone
# (test_the_fold_window tests the folded path at its edges).
EDGE_STEPS = ((120, 106), (120, 105), (0, 1), (126, 127), (254, 240), (255, 250), (3, 255))


@pytest.mark.parametrize("layout", [pytest.param("strided", marks=pytest.mark.slow), "hopper", "hopper_fp8"])
def test_edge_scale_codes(layout, device):
    """w is block-diagonal (output columns 8b .. 8b + 7 read only K block b), so that each output is one block's
    sum: a block read with a wrong scale, a value rounded to e4m3 (past the window), or a NaN lost shows. Rows have
    x scales from 2**-20 to 2**20 (code 254 with the largest overflows fp32, as the reference does)."""
    codes = [c for step in EDGE_STEPS for c in step]
    n_blocks = len(codes)
    m, k, n = 5, 32 * n_blocks, 8 * n_blocks
    values = torch.randint(0, 256, (n, k // 2), device=device, dtype=torch.int32).to(torch.uint8)
    diagonal = (torch.arange(k, device=device) // 32)[None, :] == (torch.arange(n, device=device) // 8)[:, None]
    values = torch.where(diagonal.reshape(n, k // 2, 2).all(-1), values, 0)
    for b in range(1, n_blocks, 2):  # the first two values of each step's second block: 0.5 and 1.5
        values[8 * b:8 * b + 8, 16 * b] = 0x31
    scales = torch.tensor(codes, device=device, dtype=torch.uint8).repeat(n, 1)
    for b in (i for i, c in enumerate(codes) if c == 255):  # NaN in its own columns; elsewhere its step partner's
        others = torch.arange(n, device=device) // 8 != b
        scales[others, b] = codes[b ^ 1]
    w_ref = dequantized_w(values, scales)
    x = (torch.randn(m, k, device=device) * 64).clamp(-448, 448).to(torch.float8_e4m3fn)
    x_scale = torch.tensor([2.0 ** -20, 2.0 ** -7, 1.0, 2.0 ** 7, 2.0 ** 20], device=device)[:, None]
    x_ref = x.double() * x_scale.double()
    w = in_layout(values.mT, layout)
    with ogsgen.opt_flags_constraints(block_m=16, block_n=16, block_k=64, num_warps=4):
        y = run(x, w, None, {"act_scale": x_scale}, scales.mT)
    want = (x_ref @ w_ref).float().double()  # float64's products, in fp32's range (inf past it)
    nan_columns = (scales == 255).any(-1)
    assert want[:, nan_columns].isnan().all() and not want[:, ~nan_columns].isnan().any()
    assert want[4].isinf().any() and not want[0].isinf().any()  # code 254: finite only under a small x scale
    assert (want[:, 8:16] != 0).all() and (want[:, 24:32] != 0).all()  # the window's edge counts, and past it
    assert_fp32_sums(want, fp32_bound(x_ref, w_ref), y)


@pytest.mark.parametrize("layout", ["strided", "hopper", "hopper_fp8"])
@pytest.mark.parametrize("codes", [(120, 106), (120, 105), (106, 120), (255, 241), (120, 109), (120, 108)])
def test_the_fold_window(layout, codes, device):
    """Each column's two K blocks have the codes ``codes``: 14 apart, the tile folds into e4m3 values (the lower
    block's 0.5 and 1.5 become e4m3's smallest subnormals, 2**-9 and 3 * 2**-9); 15 apart, its blocks go alone; the
    hopper_fp8 layout's window is 11 (12 apart: alone; 11: 0.5 becomes 2**-6, e4m3's smallest normal); e8m0's
    NaN (in columns 0-7; the others 250) folds too, with its columns NaN. w is block-diagonal (columns 0-15 read block
    0, 16-31 block 1), so that a value lost or rounded shows against its own block's sum."""
    m, k, n = 6, 64, 32
    values = torch.randint(0, 256, (n, k // 2), device=device, dtype=torch.int32).to(torch.uint8)
    diagonal = (torch.arange(k, device=device) // 32)[None, :] == (torch.arange(n, device=device) // 16)[:, None]
    values = torch.where(diagonal.reshape(n, k // 2, 2).all(-1), values, 0)
    values[16:, 16] = 0x31  # the first two values of block 1 in its columns: 0.5 and 1.5
    scales = torch.tensor(codes, device=device, dtype=torch.uint8).repeat(n, 1)
    if 255 in codes:
        scales[8:, 0] = 250
    w_ref = dequantized_w(values, scales)
    x = (torch.randn(m, k, device=device) * 64).clamp(-448, 448).to(torch.float8_e4m3fn)
    x_scale = torch.exp2(torch.arange(m, device=device).float() - 3)[:, None]
    x_ref = x.double() * x_scale.double()
    w = in_layout(values.mT, layout)
    with ogsgen.opt_flags_constraints(block_m=16, block_n=32, block_k=64):
        y = run(x, w, None, {"act_scale": x_scale}, scales.mT)
    want = (x_ref @ w_ref).float().double()
    assert want[:, :8].isnan().all() == (255 in codes) and not want[:, 8:].isnan().any()
    assert_fp32_sums(want, fp32_bound(x_ref, w_ref), y)


@pytest.mark.parametrize("layout", ["hopper", "hopper_fp8", pytest.param("strided", marks=pytest.mark.slow)])
@pytest.mark.parametrize("top_k,split_k", [pytest.param(1, 1, marks=pytest.mark.slow), (2, 1),
                                           pytest.param(2, 2, marks=pytest.mark.slow)])
def test_moe_gather_then_scatter(layout, top_k, split_k, device):
    """gpt-oss's two matmuls in small: w1 gathers token rows (a gathered row's scale is its token's) with bias and
    SwiGLU, w2 takes the sorted rows quantized per row, scatters them with the gates and sums each token's top-k
    (through fp32 split-K partials with split_k 2)."""
    tokens, hidden, inter, n_expts = 20, 128, 64, 4
    rd, gi, si = ogsgen.routing(torch.randn(tokens, n_expts, device=device), top_k)
    x, fields, x_ref = e4m3_x((tokens, hidden), device, "row")
    w1, s1, w1_ref = mxfp4_w(hidden, 2 * inter, device, lead=(n_expts,), layout=layout)
    w2, s2, w2_ref = mxfp4_w(inter, hidden, device, lead=(n_expts,), layout=layout)
    b1, b2 = torch.randn(n_expts, 2 * inter, device=device), torch.randn(n_expts, hidden, device=device)
    gammas = rd.gate_scal.float()
    with ogsgen.opt_flags_constraints(block_m=16, block_n=32, **k_tile(layout)):
        h = run(x, w1, b1, fields, s1, routing_data=rd, gather_indx=gi, fused_activation=SWIGLU)
        hv, hs = quantize_fp8_torch(h, (1, 0))
        with ogsgen.opt_flags_constraints(split_k=split_k):
            y = run(hv, w2, b2, {"act_scale": hs}, s2, routing_data=rd, scatter_indx=si, gammas=gammas)
    h_want = matmul_ogs_torch(x_ref.float(), w1_ref.float(), b1, rd, gi, fused_activation=SWIGLU,
                              precision_config=FP32)
    assert_close(h_want, h, maxtol=5e-5, rmstol=1e-5)  # (float32 references: their own rounding)
    y_want = matmul_ogs_torch((hv.float() * hs), w2_ref.float(), b2, rd, scatter_indx=si, gammas=gammas,
                              precision_config=FP32)
    assert_close(y_want, y, maxtol=5e-5, rmstol=1e-5)


@pytest.mark.parametrize("scale_shape", [(1,), ()], ids=["1", "0-d"])
def test_a_static_act_scale_per_tensor(scale_shape, device):
    """One float32 act_scale for the whole x, (1,) or 0-d (a checkpoint's scalar input_scale), in a MoE call."""
    tokens, k, n, n_expts = 12, 128, 48, 4
    rd, gi, _ = ogsgen.routing(torch.randn(tokens, n_expts, device=device), 2)
    x = torch.randn(tokens, k, device=device)
    scale = (x.abs().amax() / 448).reshape(scale_shape)
    xv = (x / scale).clamp(-448, 448).to(torch.float8_e4m3fn)
    w, scales, w_ref = mxfp4_w(k, n, device, lead=(n_expts,))
    bias = torch.randn(n_expts, n, device=device)
    with ogsgen.opt_flags_constraints(block_m=16, block_n=32, block_k=64):
        y = run(xv, w, bias, {"act_scale": scale}, scales, routing_data=rd, gather_indx=gi)
    want = matmul_ogs_torch(xv.float() * scale, w_ref.float(), bias, rd, gi, precision_config=FP32)
    assert_close(want, y, maxtol=5e-5, rmstol=1e-5)  # (a float32 reference: its own rounding)


def test_prepared_weights_bf16_output_and_the_heuristics_tiles(device):
    """What a caller writes: prepare_expert_weights' mxfp4 weights, x quantized per row by quantize_fp8, the default
    (bf16) output and launch parameters."""
    tokens, hidden, n_out, n_expts = 40, 256, 96, 4
    rd, gi, _ = ogsgen.routing(torch.randn(tokens, n_expts, device=device), 2)
    prepared = ogsgen.prepare_expert_weights(torch.randn(n_expts, n_out, hidden, device=device) / 16, format="mxfp4")
    x = torch.randn(tokens, hidden, device=device)
    xv, xs = ogsgen.numerics.quantize_fp8(x, (1, 0))
    y = matmul_ogs(xv, prepared.w, None, rd, gather_indx=gi, precision_config=prepared.precision_config(act_scale=xs))
    assert y.dtype == torch.bfloat16
    want = matmul_ogs_torch(xv.float() * xs, prepared.dequantize(), None, rd, gi, precision_config=FP32)
    assert_close(want, y, maxtol=8e-3, rmstol=4e-3)


def test_errors(device):
    w, scales, _ = mxfp4_w(64, 32, device)
    x = torch.randn(8, 64, device=device)
    xv, xs = quantize_fp8_torch(x, (1, 0))
    flex = FlexCtx(lhs_data=InFlexData(scale=torch.ones(1, device=device)))
    bad = [
        (x.bfloat16(), PrecisionConfig(weight_scale=scales, act_scale=xs),
         r"act_scale of float32 is the scale of an e4m3 x, but x is torch.bfloat16.*quantize_fp8\(x, \(1, 0\)\)"),
        (xv, PrecisionConfig(weight_scale=scales, act_scale=xs, flex_ctx=flex),
         r"x has two scales, precision_config.act_scale and precision_config.flex_ctx.lhs_data.scale"),
        (xv, PrecisionConfig(weight_scale=scales, act_scale=xs[:4]),
         r"act_scale for e4m3 x of 8 rows .* must have shape \(M, 1\) per row, or \(1,\) for the tensor"),
        (x.to(torch.float8_e5m2), PrecisionConfig(weight_scale=scales, flex_ctx=flex),
         r"or e4m3 x scaled per tensor or per row with mxfp4 weights; not fp8e5m2 x with mxfp4 weights"),
    ]
    for x_arg, pc, message in bad:
        with pytest.raises(ogsgen.SpecError, match=message):
            matmul_ogs(x_arg, w, None, precision_config=pc)


def test_hopper_fp8_tiles_give_each_thread_whole_words(device):
    """A 16 x 64 W tile on 8 warps has fewer hopper_fp8 words than threads: it computed wrong values on an H100
    (Triton 3.6, 2026-12-07), so it is refused with the rule; on 4 warps it runs."""
    x, fields, x_ref = e4m3_x((8, 128), device, "row")
    w, scales, w_ref = mxfp4_w(128, 16, device, layout="hopper_fp8")
    with ogsgen.opt_flags_constraints(block_m=16, block_n=16, block_k=64, num_warps=8):
        with pytest.raises(ogsgen.InapplicableConstraintError, match=r"hopper_fp8-layout mxfp4 weights give each "
                                                                    r"thread whole 4-byte words, so block_n \* block_k "
                                                                    r"must be at least 2048"):
            run(x, w, None, fields, scales)
    with ogsgen.opt_flags_constraints(block_m=16, block_n=16, block_k=64, num_warps=4):
        y = run(x, w, None, fields, scales)
    want = x_ref @ w_ref
    assert_fp32_sums(want, fp32_bound(x_ref, w_ref) + 2.0 ** -23 * want.abs(), y)
