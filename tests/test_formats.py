"""Scaled formats: MX quantization, MX and fp8 weights, fp8 flexpoint activations and outputs."""
import pytest
import torch

import ogsgen
from ogsgen import FlexCtx, InFlexData, OutFlexData, PrecisionConfig, matmul_ogs, matmul_ogs_torch
from ogsgen.codegen import build
from ogsgen.numerics import (actual_scale_torch, dequantize_mx, dequantize_mx_torch, max_finite, quantize_mx,
                             quantize_mx_torch)
from ogsgen.numerics.mx import ELEMENT_MAX, FP8_DTYPES, MX_BLOCK
from ogsgen.numerics.layouts import SwizzledMxValues, swizzle_mx_values, unswizzle_mx_values
from ogsgen.numerics.layouts.hopper import WORD_BITS
from ogsgen.spec import (BF16, FP8_E4M3, FP8_E5M2, FP16, MXFP4, MXFP4_HOPPER, MXFP8_E4M3, MXFP8_E5M2, Catalog,
                         variant_product)
from ogsgen.spec.catalog import _expand
from ogsgen.testing import assert_close
from cases import check_mx_output

ELEMENTS = ["e2m1", "e4m3", "e5m2"]


@pytest.fixture(scope="module", autouse=True)
def format_test_kernels(tmp_path_factory):
    variants = [
        *variant_product([(BF16, MXFP4, BF16), (BF16, MXFP4_HOPPER, BF16), (FP16, MXFP4, FP16),
                          (BF16, MXFP8_E4M3, BF16), (BF16, MXFP8_E5M2, BF16)], activations=(None, ogsgen.swiglu),
                         bias=(False, True)),
        *variant_product([(BF16, MXFP4, BF16), (BF16, MXFP4_HOPPER, BF16)], activations=(None, ogsgen.swiglu),
                         ragged=(True,),
                         gather=(False, True), scatter=(False, True), bias=(True,), gammas=(False, True)),
        *variant_product([(FP8_E4M3, FP8_E4M3, FP8_E4M3), (FP8_E5M2, FP8_E5M2, FP8_E5M2),
                          (FP8_E4M3, FP8_E4M3, BF16), (BF16, FP8_E4M3, BF16), (FP16, FP8_E5M2, FP16)],
                         bias=(False, True)),
        *variant_product([(FP8_E5M2, FP8_E5M2, FP8_E5M2), (FP8_E4M3, FP8_E4M3, BF16)], ragged=(True,),
                         gather=(False, True), scatter=(False, True)),
        *variant_product([(BF16, BF16, MXFP8_E4M3), (BF16, MXFP4, MXFP8_E5M2)], activations=(None, ogsgen.swiglu)),
        *variant_product([(BF16, MXFP4, MXFP8_E4M3)], ragged=(True,), scatter=(True,), gammas=(True,)),
    ]
    out = tmp_path_factory.mktemp("format_kernels")
    build(Catalog("format_tests", _expand(variants, "format_tests")), out)
    ogsgen.add_search_path(out)


# ---------------------------------------------------------------- MX quantization

@pytest.mark.parametrize("element", ELEMENTS)
@pytest.mark.parametrize("rounding", ["up", "down"])
@pytest.mark.parametrize("shape,axis", [((7, 100), -1), pytest.param((3, 64, 10), 1, marks=pytest.mark.slow),
                                        pytest.param((2, 5, 96), 0, marks=pytest.mark.slow)])
def test_quantize_mx_triton_matches_torch_bit_for_bit(element, rounding, shape, axis, device):
    x = torch.randn(shape, device=device) * torch.exp(3 * torch.randn(shape[:-1] + (1,), device=device))
    x.view(-1)[:40] = 0.0  # an all-zero block
    v_tri, s_tri = quantize_mx(x, element, axis=axis, rounding=rounding)
    v_ref, s_ref = quantize_mx_torch(x, element, axis=axis, rounding=rounding)
    assert torch.equal(s_tri, s_ref)
    assert torch.equal(v_tri.view(torch.uint8), v_ref.view(torch.uint8))
    d_tri, d_ref = dequantize_mx(v_tri, s_tri, element, axis=axis), dequantize_mx_torch(v_ref, s_ref, element, axis=axis)
    assert torch.equal(d_tri, d_ref) and d_tri.shape == x.shape
    # MX values survive another round trip unchanged.
    assert torch.equal(dequantize_mx_torch(*quantize_mx_torch(d_ref, element, axis=axis, rounding=rounding),
                                           element, axis=axis), d_ref)


@pytest.mark.parametrize("dtype", [torch.float32, pytest.param(torch.bfloat16, marks=pytest.mark.slow),
                                   pytest.param(torch.float16, marks=pytest.mark.slow)])
@pytest.mark.parametrize("element", ["e2m1", "e4m3", "e5m2"])
def test_dequantize_mx_every_code_and_scale_bit_for_bit(element, dtype, device):
    """The kernels' upcast equals the torch reference on every value code times every e8m0 scale, including
    the products that are subnormal or overflow in the output dtype, and the NaN scale 255 (every value NaN) and
    fp8's NaN and infinity codes. For e2m1 to bf16 on the GPU this is the packed-PTX route (bf16x2 arithmetic),
    elsewhere the portable one (fp16 subnormals for 0.5)."""
    scale_codes = torch.arange(0, 256, dtype=torch.int32, device=device).to(torch.uint8)
    if element == "e2m1":
        values = torch.arange(256, dtype=torch.int32, device=device).to(torch.uint8)[None, :].expand(256, 256)
    else:
        codes = torch.arange(256, dtype=torch.int32, device=device).to(torch.uint8)
        values = codes.view(FP8_DTYPES[element])[None, :].expand(256, 256)
    values = values.contiguous()
    scales = scale_codes[:, None].expand(256, values.shape[1] * (2 if element == "e2m1" else 1) // 32).contiguous()
    got, want = dequantize_mx(values, scales, element, dtype=dtype), dequantize_mx_torch(values, scales, element,
                                                                                         dtype=dtype)
    assert bool(want[255].isnan().all())
    same = (got == want) | (got.isnan() & want.isnan())
    assert bool(same.all()), f"first mismatch at {same.logical_not().nonzero()[0].tolist()}"


@pytest.mark.parametrize("element", ["e2m1", "e4m3"])
def test_dequantize_mx_torch_in_slabs_equals_in_one_go(element, monkeypatch):
    """Model-sized weights are decoded a slab of rows at a time (bounded temporaries); the slabs, a row count
    that does not divide evenly, and a quantized axis in the middle give the same values."""
    from ogsgen.numerics import mx
    dense = torch.randn(3, 96, 10, generator=torch.Generator().manual_seed(0)) * 4
    values, scales = quantize_mx_torch(dense, element, axis=1)
    whole = dequantize_mx_torch(values, scales, element, axis=1, dtype=torch.bfloat16)
    monkeypatch.setattr(mx, "DEQUANTIZE_SLAB", 96 * 7)  # 7 rows of 96 per slab: 30 rows in 5 slabs
    slabs = dequantize_mx_torch(values, scales, element, axis=1, dtype=torch.bfloat16)
    assert slabs.shape == dense.shape and torch.equal(slabs, whole)
    assert (slabs.float() - dense).abs().max() <= dense.abs().max() * (0.25 if element == "e2m1" else 0.07)


def test_e2m1_rounds_to_nearest_even(device):
    # Scale 1 (block max 6): the ties 0.25, 0.75, 1.25, 1.75, 2.5, 3.5 and 5 go to the even code.
    x = torch.tensor([6.0, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -0.26, -5.01, 0.0, -0.0] + [0.0] * 20,
                     device=device)
    values, scales = quantize_mx(x, "e2m1")
    assert scales.tolist() == [127]
    decoded = dequantize_mx(values, scales, "e2m1")
    assert decoded[:10].tolist() == [6.0, 0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0, -0.5, -6.0]


@pytest.mark.parametrize("element,largest,emax", [("e2m1", 6.0, 2), ("e4m3", 448.0, 8), ("e5m2", 57344.0, 15)])
def test_scale_rounding_modes(element, largest, emax, device):
    x = torch.full((32,), 1.0, device=device)
    x[0] = 1.9 * 2.0 ** emax  # above the largest value of that binade
    _, up = quantize_mx(x, element, rounding="up")
    _, down = quantize_mx(x, element, rounding="down")
    assert up.item() == 128 and down.item() == 127  # "up" never saturates; "down" (OCP) saturates x[0]
    assert dequantize_mx(*quantize_mx(x, element, rounding="down"), element)[0].item() == largest


def test_quantize_errors(device):
    # (on the device the kernels run on: quantize_mx checks x's device before its shape)
    with pytest.raises(ogsgen.SpecError, match="its size must be even"):
        quantize_mx(torch.randn(3, 33, device=device), "e2m1")
    with pytest.raises(ogsgen.SpecError, match="element must be one of"):
        quantize_mx(torch.randn(3, 32, device=device), "e3m2")
    with pytest.raises(ogsgen.SpecError, match="rounding must be one of"):
        quantize_mx_torch(torch.randn(3, 32, device=device), "e4m3", rounding="nearest")


# ---------------------------------------------------------------- MX weights in matmul_ogs

def _mx_weights(w_float, element):
    """(values, scales) along K of (E, K, N) weights, both K-contiguous (quantize_mx's scales; Hopper reads values
    so)."""
    values, scales = quantize_mx(w_float.mT.contiguous(), element, axis=-1)
    return values.mT, scales.mT


@pytest.mark.parametrize("element,maxtol", [("e2m1", 3e-2), ("e4m3", 2e-2), ("e5m2", 2e-2)])
@pytest.mark.parametrize("bias", [False, True])
def test_dense_mx_weights(element, maxtol, bias, device):
    x = torch.randn(37, 96, device=device).bfloat16()
    w_values, w_scales = _mx_weights(torch.randn(1, 96, 80, device=device), element)
    w_values, w_scales = w_values[0], w_scales[0]
    b = torch.randn(80, device=device) if bias else None
    pc = PrecisionConfig(weight_scale=w_scales)
    y = torch.full((37, 80), float("nan"), device=device, dtype=torch.bfloat16)
    with ogsgen.opt_flags_constraints(block_m=16, block_n=32, block_k=32):
        matmul_ogs(x, w_values, b, precision_config=pc, y=y)
    w_ref = dequantize_mx_torch(w_values.mT, w_scales.mT, element).mT
    ref = matmul_ogs_torch(x.float(), w_ref, b, precision_config=PrecisionConfig(out_dtype=torch.float32))
    assert_close(ref, y.float(), maxtol=maxtol)


@pytest.mark.usefixtures("kernels_on_demand")
@pytest.mark.parametrize("element", ["e2m1", "e4m3"])
@pytest.mark.parametrize("moe", [False, True])
def test_mx_weights_whose_k_is_not_whole_scale_blocks(element, moe, device):
    # K = 72: the last scale block of each column holds 8 rows of K (its scale must be read, the rows past K not).
    k, n, n_expts = 72, 48, 3
    values, scales = _mx_weights(torch.randn(n_expts, k, n, device=device), element)
    w_ref = dequantize_mx_torch(values.mT, scales.mT, element).mT
    pc, fp32 = PrecisionConfig(weight_scale=scales), PrecisionConfig(out_dtype=torch.float32)
    with ogsgen.opt_flags_constraints(block_m=16, block_k=32):
        if moe:
            rd, gi, _ = ogsgen.routing(torch.randn(20, n_expts, device=device), 2)
            x = torch.randn(20, k, device=device).bfloat16()
            y = matmul_ogs(x, values, None, rd, gather_indx=gi, precision_config=pc)
            ref = matmul_ogs_torch(x.float(), w_ref, None, rd, gi, precision_config=fp32)
        else:
            x = torch.randn(20, k, device=device).bfloat16()
            y = matmul_ogs(x, values[0], None, precision_config=PrecisionConfig(weight_scale=scales[0]))
            ref = matmul_ogs_torch(x.float(), w_ref[0], None, precision_config=fp32)
    assert_close(ref, y.float(), maxtol=3e-2)


@pytest.mark.parametrize("element", ["e2m1", "e4m3"])
@pytest.mark.parametrize("k", [16, 32])
def test_small_k_mx_weights_without_constraints(element, k, device):
    # K=16 once made the heuristic pick block_k=16, which its own check then refused ("mx weights ... block_k must
    # be a multiple of 32") although the call constrained nothing.
    x = torch.randn(8, k, device=device).bfloat16()
    w_values, w_scales = _mx_weights(torch.randn(1, k, 32, device=device), element)
    w_values, w_scales = w_values[0], w_scales[0]
    y = matmul_ogs(x, w_values, None, precision_config=PrecisionConfig(weight_scale=w_scales))
    w_ref = dequantize_mx_torch(w_values.mT, w_scales.mT, element).mT
    ref = matmul_ogs_torch(x.float(), w_ref, None, precision_config=PrecisionConfig(out_dtype=torch.float32))
    assert_close(ref, y.float(), maxtol=3e-2)


@pytest.mark.parametrize("value_layout,scales_n_contiguous", [pytest.param("strided", False, marks=pytest.mark.slow),
                                                               pytest.param("hopper", False, marks=pytest.mark.slow),
                                                               ("hopper", True)])
@pytest.mark.parametrize("k_act", [4, pytest.param(1, marks=pytest.mark.slow)])
def test_gpt_oss_moe_with_mxfp4_weights(k_act, value_layout, scales_n_contiguous, device):
    """gpt-oss's two MoE matmuls with mxfp4 weights against the bf16-dequantized reference. w2's K (32) is half
    a hopper group: the layout pads it. Scales K-contiguous (quantize_mx's) or N-contiguous
    (prepare_expert_weights')."""
    tokens, hidden, inter, n_expts = 24, 64, 32, 8
    rd, gi, si = ogsgen.routing(torch.randn(tokens, n_expts, device=device), k_act)
    x = torch.randn(tokens, hidden, device=device).bfloat16()
    w1, s1 = _mx_weights(torch.randn(n_expts, hidden, 2 * inter, device=device) / 8, "e2m1")
    w2, s2 = _mx_weights(torch.randn(n_expts, inter, hidden, device=device) / 6, "e2m1")
    b1, b2 = torch.randn(n_expts, 2 * inter, device=device), torch.randn(n_expts, hidden, device=device)
    act = ogsgen.FusedActivation(ogsgen.swiglu, (1.702, 7.0))
    gammas = rd.gate_scal.float()
    w1_arg, w2_arg = (swizzle_mx_values(w1), swizzle_mx_values(w2)) if value_layout == "hopper" else (w1, w2)
    s1_arg, s2_arg = (s1.contiguous(), s2.contiguous()) if scales_n_contiguous else (s1, s2)
    with ogsgen.opt_flags_constraints(block_m=16, block_n=32, block_k=32 if value_layout == "strided" else 64):
        h = matmul_ogs(x, w1_arg, b1, rd, gather_indx=gi, fused_activation=act,
                       precision_config=PrecisionConfig(weight_scale=s1_arg))
        y = matmul_ogs(h, w2_arg, b2, rd, scatter_indx=si, gammas=gammas,
                       precision_config=PrecisionConfig(weight_scale=s2_arg))
    w1_ref = dequantize_mx_torch(w1.mT, s1.mT, "e2m1").mT
    w2_ref = dequantize_mx_torch(w2.mT, s2.mT, "e2m1").mT
    fp32 = PrecisionConfig(out_dtype=torch.float32)
    h_ref = matmul_ogs_torch(x, w1_ref, b1, rd, gather_indx=gi, fused_activation=act, precision_config=fp32)
    assert_close(h_ref, h.float(), maxtol=3e-2)
    rounds = (lambda t: t.bfloat16().float()) if k_act > 1 else None
    y_ref = matmul_ogs_torch(h, w2_ref, b2, rd, scatter_indx=si, gammas=gammas, precision_config=fp32, round_y=rounds)
    assert_close(y_ref, y.float(), maxtol=3e-2)


@pytest.mark.parametrize("value_layout,scales_n_contiguous,block_k", [("strided", False, 32), ("strided", True, 64),
                                                                     ("hopper", True, 64), ("hopper", False, 128)])
def test_padded_weight_scale_groups_are_not_read(value_layout, scales_n_contiguous, block_k, device):
    """vLLM pads the scales' K groups to a multiple of 4 on Hopper (gpt-oss: 90 -> 92): the groups past cdiv(K, 32)
    are accepted and never read; NaN codes there would make the result NaN. K = 160: 5 groups padded to 8, one K
    step per group (block_k 32) or a masked last step (64, 128)."""
    n_expts, k, n = 2, 160, 48
    rd, gi, _ = ogsgen.routing(torch.randn(12, n_expts, device=device), 1)
    x = torch.randn(12, k, device=device).bfloat16()
    w, scales = _mx_weights(torch.randn(n_expts, k, n, device=device) / 8, "e2m1")
    padded = torch.full((n_expts, n, 8), 255, dtype=torch.uint8, device=device)  # K-contiguous, as vLLM's
    padded[..., :5] = scales.mT
    padded = padded.mT.contiguous() if scales_n_contiguous else padded.mT
    w_arg = swizzle_mx_values(w) if value_layout == "hopper" else w
    with ogsgen.opt_flags_constraints(block_k=block_k):
        y = matmul_ogs(x, w_arg, None, rd, gather_indx=gi, precision_config=PrecisionConfig(weight_scale=padded))
    w_ref = dequantize_mx_torch(w.mT, scales.mT, "e2m1").mT
    fp32 = PrecisionConfig(out_dtype=torch.float32)
    assert_close(matmul_ogs_torch(x, w_ref, None, rd, gather_indx=gi, precision_config=fp32), y.float(), maxtol=3e-2)


# ---------------------------------------------------------------- the hopper value layout

@pytest.mark.parametrize("layout,dtype,group", [("hopper", torch.int32, 128), ("hopper_fp8", torch.uint8, 512)])
@pytest.mark.parametrize("shape", [(2, 48, 40), (96, 24), (1, 1440, 8)])
def test_swizzled_layouts_round_trip_bit_for_bit(shape, layout, dtype, group, device):
    values = torch.randint(0, 256, shape, dtype=torch.uint8, device=device)
    for strided in (values, values.mT.contiguous().mT):                      # N- or K-contiguous input
        swizzled = swizzle_mx_values(strided, layout)
        k, n = 2 * shape[-2], shape[-1]
        assert (swizzled.k, swizzled.n) == (k, n) and swizzled.shape == tuple(shape)
        # N padded to whole 16-column slabs, K to whole 64-row groups of 128 words (hopper_fp8: their 512 bytes)
        assert swizzled.data.dtype == dtype and swizzled.data.is_contiguous()
        assert tuple(swizzled.data.shape) == (*shape[:-2], -(-n // 16), -(-k // 64) * group)
        assert torch.equal(unswizzle_mx_values(swizzled), values)


def test_hopper_fp8_layout_puts_each_value_where_documented(device):
    # (N, K) = (16 s + 8 q + r, 64 g + 16 j + 4 t + 2 b + h) is nibble h of byte 2 q + b of word (r, t, j) of slab s,
    # group g: byte 512 g + 4 (4 (4 r + t) + j) + 2 q + b of the slab's row.
    n, k = 32, 128
    codes = torch.randint(0, 16, (n, k), device=device)
    stored = swizzle_mx_values((codes[:, 0::2] | (codes[:, 1::2] << 4)).to(torch.uint8).mT, "hopper_fp8").data.cpu()
    codes = codes.cpu()
    for column in range(n):
        s, q, r = column // 16, column // 8 % 2, column % 8
        for row in range(k):
            g, j, t, b, h = row // 64, row // 16 % 4, row // 4 % 4, row // 2 % 2, row % 2
            byte = int(stored[s, 512 * g + 4 * (4 * (4 * r + t) + j) + 2 * q + b])
            assert (byte >> 4 * h) & 15 == codes[column, row], (column, row)


def test_hopper_fp8_weights_take_e4m3_x_only(device):
    values, scales = quantize_mx(torch.randn(64, 128, device=device), "e2m1")
    w = swizzle_mx_values(values.mT, "hopper_fp8")
    with pytest.raises(ogsgen.SpecError, match="hopper_fp8-layout mxfp4 weights become e4m3 operands, so x "
                                                "must be e4m3 .* use the hopper layout for bf16 or mxfp8 x"):
        matmul_ogs(torch.randn(8, 128, device=device).bfloat16(), w, None,
                   precision_config=PrecisionConfig(weight_scale=scales.mT))


def test_hopper_layout_puts_each_value_where_documented(device):
    # Two slabs and two groups of random codes, read back value by value as the layouts docstring says: (N, K) =
    # (16 s + 8 q + r, 64 g + 16 j + 8 h + 2 t + lane) is in word (r, t, j) of slab s, group g, with its bits at
    # WORD_BITS[q + 2 h][lane].
    n, k = 32, 128
    codes = torch.randint(0, 16, (n, k), device=device)
    strided = (codes[:, 0::2] | (codes[:, 1::2] << 4)).to(torch.uint8).mT   # (K // 2, N)
    words = swizzle_mx_values(strided).data.cpu().long() & 0xFFFFFFFF
    codes = codes.cpu()
    for column in range(n):
        s, q, r = column // 16, column // 8 % 2, column % 8
        for row in range(k):
            g, j, h, t, lane = row // 64, row // 16 % 4, row // 8 % 2, row // 2 % 4, row % 2
            word = int(words[s, g * 128 + (r * 4 + t) * 4 + j])
            stored = sum(((word >> position) & 1) << bit for bit, position in enumerate(WORD_BITS[q + 2 * h][lane]))
            assert stored == codes[column, row], (column, row)


def test_hopper_layout_matmul_reads_every_code_at_every_scale_exactly(device):
    """x = I makes y = W: through the hopper layout's upcast and the MMA, each of the 256 x N values comes back as
    the reference decodes it, bit for bit (fp32 output of one nonzero product per sum). Every e2m1 code sits in
    every 32-row block, blocks take every scale code up to ``largest_code``, and the 8 codes of a word differ (so
    that a swapped place fails). Codes up to 252 (above, 6 times the scale overflows bf16 and the identity's
    zeros would make NaN of it; the PTX emulation in test_ptx_upcast.py covers codes 253-255)."""
    k, n = 256, 512 if device == "cuda" else 128
    rows = torch.arange(k, device=device)[:, None]
    columns = torch.arange(n, device=device)[None, :]
    codes = (rows * 5 + columns * 3 + rows // 16) % 16                       # (K, N), every code per block
    values = (codes[0::2] | (codes[1::2] << 4)).to(torch.uint8)               # (K // 2, N): strided
    scales = ((columns * (k // 32) + torch.arange(k // 32, device=device)[:, None]) % 253).to(torch.uint8)
    x = torch.eye(k, device=device, dtype=torch.bfloat16)
    y = matmul_ogs(x, swizzle_mx_values(values), None,
                   precision_config=PrecisionConfig(weight_scale=scales, out_dtype=torch.float32))
    want = dequantize_mx_torch(values.mT, scales.mT, "e2m1").mT.float()      # (K, N)
    same = y == want
    assert bool(same.all()), f"first mismatch at (k, n) = {same.logical_not().nonzero()[0].tolist()}"


def _write_through_data(scales, new):
    scales.data[...] = new            # what a weight loader's param.data.copy_ does: no version bump


def _copy_into_data(scales, new):
    scales.data.copy_(new)


def _load_state_dict(scales, new):
    holder = torch.nn.Module()
    holder.register_buffer("scales", scales, persistent=True)
    holder.load_state_dict({"scales": new})


@pytest.mark.parametrize("write", [_write_through_data, _copy_into_data, _load_state_dict])
def test_hopper_scales_rewritten_in_place_give_the_product_of_the_new_scales(write, device):
    """Scales a weight loader rewrites in place between two calls, with or without a version bump (a write through
    ``.data`` leaves the version counter as it was), codes above 128 included: the second call multiplies by the
    new scales (no fact about the old ones may outlive them)."""
    x = torch.randn(16, 128, device=device).bfloat16()
    values, scales = quantize_mx(torch.randn(64, 128, device=device), "e2m1", axis=-1)      # (N, K): codes ~127
    w, scales = swizzle_mx_values(values.mT), scales.mT.contiguous()                       # (K // 2, N), (K // 32, N)
    pc = PrecisionConfig(weight_scale=scales, out_dtype=torch.float32)
    matmul_ogs(x, w, None, precision_config=pc)
    new = scales.clone()
    new[1, 3] = 140                                             # a block's scale 2 ** 13
    new[2, 7] = 160                                             # and 2 ** 33 (still finite products)
    write(scales, new)
    assert torch.equal(scales, new)
    y = matmul_ogs(x, w, None, precision_config=pc)
    want = x.double() @ dequantize_mx_torch(values, new.mT, "e2m1").mT.double()              # (M, N)
    assert_close(want, y, maxtol=1e-5)


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("n", [80, 40])
def test_dense_mxfp4_in_the_hopper_layout(n, bias, device):
    """K = 96 is a group and a half: the kernel's K tail reads the padded group. N = 40 ends in half a 16-column
    slab, padded too."""
    x = torch.randn(37, 96, device=device).bfloat16()
    w_values, w_scales = _mx_weights(torch.randn(1, 96, n, device=device), "e2m1")
    w_values, w_scales = w_values[0], w_scales[0]
    b = torch.randn(n, device=device) if bias else None
    y = torch.full((37, n), float("nan"), device=device, dtype=torch.bfloat16)
    with ogsgen.opt_flags_constraints(block_m=16, block_n=32, block_k=64):
        matmul_ogs(x, swizzle_mx_values(w_values), b, precision_config=PrecisionConfig(weight_scale=w_scales), y=y)
    w_ref = dequantize_mx_torch(w_values.mT, w_scales.mT, "e2m1").mT
    ref = matmul_ogs_torch(x.float(), w_ref, b, precision_config=PrecisionConfig(out_dtype=torch.float32))
    assert_close(ref, y.float(), maxtol=3e-2)


def test_hopper_layout_errors(device):
    x = torch.randn(16, 64, device=device).bfloat16()
    values, scales = _mx_weights(torch.randn(1, 64, 32, device=device), "e2m1")
    swizzled, pc = swizzle_mx_values(values[0]), PrecisionConfig(weight_scale=scales[0])
    with pytest.raises(ogsgen.SpecError, match="w holds swizzled mxfp4 values but precision_config.weight_scale"):
        matmul_ogs(x, swizzled, None)
    with pytest.raises(ogsgen.SpecError, match=r"hopper-layout mxfp4 weights are upcast in registers, so x must be "
                                               r"bf16, mxfp8 or e4m3 \(got fp16\)"):
        matmul_ogs(x.half(), swizzled, None, precision_config=pc)
    with pytest.raises(ogsgen.InapplicableConstraintError, match="block_k must be a multiple of 64"):
        with ogsgen.opt_flags_constraints(block_k=32):
            matmul_ogs(x, swizzled, None, precision_config=pc)
    cut = SwizzledMxValues(swizzled.data[:, :-1], swizzled.k, swizzled.n, swizzled.layout, swizzled.capability)
    with pytest.raises(ogsgen.SpecError, match=r"does not hold K=64 x N=32 values in the hopper layout \(int32, "
                                               r"\(\.\.\., 2, 128\)\)"):
        matmul_ogs(x, cut, None, precision_config=pc)
    with pytest.raises(ogsgen.SpecError, match=r"w\.data does not hold K=64 x N=32 values in the hopper layout"):
        unswizzle_mx_values(cut)
    with pytest.raises(ogsgen.SpecError, match="values must be packed mxfp4"):
        swizzle_mx_values(values[0].float())
    with pytest.raises(ogsgen.SpecError, match="capability .7, 5. has none"):
        swizzle_mx_values(values[0], capability=(7, 5))
    with pytest.raises(ogsgen.SpecError, match="layout must be 'hopper'"):
        swizzle_mx_values(values[0], layout="blackwell")
    with pytest.raises(ogsgen.SpecError, match="value_layout='hopper' applies to mxfp4"):
        ogsgen.prepare_expert_weights(torch.randn(2, 32, 64, device=device), format="bf16", value_layout="hopper")


@pytest.mark.gpu
def test_hopper_layout_made_for_another_gpu_is_refused():
    x = torch.randn(16, 64, device="cuda").bfloat16()
    values, scales = _mx_weights(torch.randn(1, 64, 32, device="cuda"), "e2m1")
    major, minor = torch.cuda.get_device_capability()
    other = swizzle_mx_values(values[0], capability=(major + 1, 0))
    with pytest.raises(ogsgen.SpecError, match=f"swizzled .layout 'hopper'. for a compute capability {major + 1}.0 "
                                               f"GPU but x is on a {major}.{minor} GPU"):
        matmul_ogs(x, other, None, precision_config=PrecisionConfig(weight_scale=scales[0]))


# ---------------------------------------------------------------- fp8 flexpoint

def _exact_fp8(shape, dtype, device):
    """Powers of two 2**-4 .. 2**-7 with random signs: exact in fp8, so are their fp32 dot products."""
    values = 2.0 ** -torch.randint(4, 8, shape, device=device).float()
    return (values * torch.where(torch.rand(shape, device=device) < 0.5, -1.0, 1.0)).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.float8_e5m2])
@pytest.mark.parametrize("batch", [None, 3])
def test_fp8_flexpoint_dense(dtype, batch, device):
    lead = (batch,) if batch else ()
    x = _exact_fp8(lead + (40, 64), dtype, device)
    w = _exact_fp8(lead + (64, 48), dtype, device).mT.contiguous().mT  # K-contiguous, as Hopper requires
    x_scale = torch.tensor([1.25], device=device)
    w_scale = torch.tensor([1.5, 1.25, 1.0][:batch or 1], device=device)
    expected = torch.tensor([4.0], device=device)
    actual = torch.full((1,), float("nan"), device=device)
    pc = PrecisionConfig(out_dtype=dtype, flex_ctx=FlexCtx(lhs_data=InFlexData(scale=x_scale),
                                                         rhs_data=InFlexData(scale=w_scale),
                                                         out_data=OutFlexData(expected_scale=expected,
                                                                              actual_scale=actual)))
    with ogsgen.opt_flags_constraints(block_m=16, block_n=16, block_k=32):
        y = matmul_ogs(x, w, None, precision_config=pc)
    assert y.dtype == dtype
    w_scales = w_scale.view(-1, 1, 1) if batch else w_scale
    ref = torch.matmul(x.float() * x_scale, w.float() * w_scales)
    assert abs(actual.item() - actual_scale_torch(ref, dtype).item()) < 1e-10
    assert_close((ref / expected).to(dtype).float(), y.float())


@pytest.mark.parametrize("k", [16, 32])
def test_small_k_fp8_dot_without_constraints(k, device):
    # An fp8 dot needs block_k >= 32: at K=16 the heuristic once picked 16 and refused its own choice.
    dtype = torch.float8_e4m3fn
    x, w = _exact_fp8((8, k), dtype, device), _exact_fp8((k, 32), dtype, device).mT.contiguous().mT
    pc = PrecisionConfig(flex_ctx=FlexCtx(lhs_data=InFlexData(scale=torch.tensor([1.0], device=device)),
                                          rhs_data=InFlexData(scale=torch.tensor([1.0], device=device))))
    y = matmul_ogs(x, w, None, precision_config=pc)
    assert_close(x.float() @ w.float(), y.float())


@pytest.mark.parametrize("x_dtype,w_dtype", [(torch.bfloat16, torch.float8_e4m3fn), (torch.float16, torch.float8_e5m2)])
def test_fp8_weights_with_16_bit_activations(x_dtype, w_dtype, device):
    x = torch.randn(33, 64, device=device).to(x_dtype)
    w = _exact_fp8((64, 40), w_dtype, device)
    bias, w_scale = torch.randn(40, device=device), torch.tensor([3.0], device=device)
    pc = PrecisionConfig(flex_ctx=FlexCtx(rhs_data=InFlexData(scale=w_scale)))
    y = matmul_ogs(x, w, bias, precision_config=pc)
    ref = x.float() @ (w.float() * 3.0) + bias
    assert_close(ref, y.float())


@pytest.mark.parametrize("split_k", [1, pytest.param(2, marks=pytest.mark.slow)])
@pytest.mark.parametrize("gather,scatter", [(False, False), (True, False), (False, True), (True, True)])
def test_fp8_moe_per_expert_scales(gather, scatter, split_k, device):
    n_expts, k_act, tokens = 4, 2, 20
    rd, gi, si = ogsgen.routing(torch.randn(tokens, n_expts, device=device), k_act)
    dtype = torch.float8_e5m2
    x = _exact_fp8((tokens if gather else tokens * k_act, 64), dtype, device)
    w = _exact_fp8((n_expts, 64, 32), dtype, device).mT.contiguous().mT
    w_scale = torch.tensor([1.5, 1.25, 1.0, 0.75], device=device)
    actual = torch.zeros(1, device=device)
    pc = PrecisionConfig(out_dtype=dtype, flex_ctx=FlexCtx(rhs_data=InFlexData(scale=w_scale),
                                                         out_data=OutFlexData(expected_scale=torch.tensor(
                                                             [2.0], device=device), actual_scale=actual)))
    kwargs = dict(gather_indx=gi if gather else None, scatter_indx=si if scatter else None)
    with ogsgen.opt_flags_constraints(block_m=16, block_n=16, block_k=32, split_k=split_k):
        y = matmul_ogs(x, w, None, rd, precision_config=pc, **kwargs)
    w_ref = w.float() * w_scale.view(-1, 1, 1)
    # k > 1 sums through a bf16 scratch, or through fp32 split-K partials
    rounds = (lambda t: t.bfloat16().float()) if scatter and split_k == 1 else None
    ref = matmul_ogs_torch(x.float(), w_ref, None, rd, precision_config=PrecisionConfig(out_dtype=torch.float32),
                           round_y=rounds, **kwargs)
    assert abs(actual.item() - actual_scale_torch(ref, dtype).item()) < 1e-10
    assert_close((ref / 2.0).to(dtype).float(), y.float())


def test_flexpoint_saturation(device):
    x = torch.full((16, 32), 2.0, device=device).to(torch.float8_e4m3fn)
    w = torch.full((32, 16), 8.0, device=device).to(torch.float8_e4m3fn).mT.contiguous().mT
    actual = torch.zeros(1, device=device)
    out = OutFlexData(expected_scale=torch.tensor([1.0], device=device), actual_scale=actual)
    pc = PrecisionConfig(out_dtype=torch.float8_e4m3fn, flexpoint_saturate_inf=True,
                         flex_ctx=FlexCtx(out_data=out))
    y = matmul_ogs(x, w, None, precision_config=pc)  # every value is 512 > 448
    assert (y.float() == 448.0).all()
    assert actual.item() == (torch.tensor([512.0]) / max_finite(torch.float8_e4m3fn)).item()


def test_flexpoint_actual_scale_of_a_call_without_rows(device):
    # A call's actual_scale is its output's absmax / max_finite: 0 for no rows, not the previous call's value.
    dtype = torch.float8_e4m3fn
    w = _exact_fp8((64, 32), dtype, device).mT.contiguous().mT
    actual = torch.zeros(1, device=device)
    pc = PrecisionConfig(out_dtype=dtype, flex_ctx=FlexCtx(out_data=OutFlexData(actual_scale=actual)))
    x = _exact_fp8((16, 64), dtype, device)
    matmul_ogs(x, w, None, precision_config=pc)
    assert actual.item() > 0 and abs(actual.item() - actual_scale_torch(x.float() @ w.float(), dtype).item()) < 1e-10
    for _ in range(2):  # the checked call, then its replayed plan
        actual.fill_(1.0)
        y = matmul_ogs(x[:0], w, None, precision_config=pc)
        assert y.shape == (0, 32) and actual.item() == 0.0


def test_bitwise_invariance(device):
    x = torch.randn(300, 64, device=device).bfloat16()
    w = torch.randn(64, 96, device=device).bfloat16()
    pc = PrecisionConfig(enforce_bitwise_invariance=True)
    full = matmul_ogs(x, w, None, precision_config=pc)
    for rows in (slice(0, 1), slice(130, 133), slice(299, 300)):
        assert torch.equal(matmul_ogs(x[rows], w, None, precision_config=pc), full[rows])
    with ogsgen.opt_flags_constraints(block_m=64):
        with pytest.raises(ogsgen.InapplicableConstraintError, match="enforce_bitwise_invariance fixes block_m=128"):
            matmul_ogs(x, w, None, precision_config=pc)


# ---------------------------------------------------------------- MX outputs

@pytest.mark.parametrize("w_format,element", [("bf16", "e4m3"), ("mxfp4", "e5m2")])
@pytest.mark.parametrize("swiglu", [False, True])
@pytest.mark.parametrize("split_k", [1, 2])
def test_mx_output(w_format, element, swiglu, split_k, device):
    m, k, n = 40, 64, 128
    x = torch.randn(m, k, device=device).bfloat16()
    dense_w = torch.randn(k, n, device=device)
    if w_format == "mxfp4":
        values, scales = quantize_mx(dense_w.T.contiguous(), "e2m1", axis=-1)
        w, pc_fields, w_ref = values.T, {"weight_scale": scales.T}, dequantize_mx_torch(values, scales, "e2m1").T
    else:
        w, pc_fields = dense_w.bfloat16(), {}
        w_ref = w.float()
    n_out = n // 2 if swiglu else n
    out_dtype = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}[element]
    out_scale = torch.full((m, n_out // 32), 255, dtype=torch.uint8, device=device)
    act = ogsgen.FusedActivation(ogsgen.swiglu, (1.1, 7.0)) if swiglu else None
    pc = PrecisionConfig(out_dtype=out_dtype, out_scale=out_scale, **pc_fields)
    with ogsgen.opt_flags_constraints(block_m=16, block_k=32, split_k=split_k):
        y = matmul_ogs(x, w, None, precision_config=pc, fused_activation=act)
    assert y.dtype == out_dtype and y.shape == (m, n_out)
    ref = matmul_ogs_torch(x.float(), w_ref, None, fused_activation=act,
                           precision_config=PrecisionConfig(out_dtype=torch.float32))
    check_mx_output(ref, y, out_scale, element)


@pytest.mark.parametrize("split_k", [1, 2])
def test_mx_output_after_top_k_scatter(split_k, device):
    # k rows per token pass through a bf16 scratch, or fp32 split-K partials, before the combine quantizes them
    tokens, n_expts, k_act, hidden = 24, 4, 2, 64
    rd, _, si = ogsgen.routing(torch.randn(tokens, n_expts, device=device), k_act)
    x = torch.randn(tokens * k_act, hidden, device=device).bfloat16()
    values, scales = quantize_mx(torch.randn(n_expts, 64, hidden, device=device).mT.contiguous(), "e2m1", axis=-1)
    out_scale = torch.zeros((tokens, 2), dtype=torch.uint8, device=device)
    pc = PrecisionConfig(weight_scale=scales.mT, out_scale=out_scale)
    with ogsgen.opt_flags_constraints(block_m=16, block_k=32, split_k=split_k):
        y = matmul_ogs(x, values.mT, None, rd, scatter_indx=si, gammas=rd.gate_scal.float(), precision_config=pc)
    w_ref = dequantize_mx_torch(values, scales, "e2m1").mT
    ref = matmul_ogs_torch(x, w_ref, None, rd, scatter_indx=si, gammas=rd.gate_scal.float(),
                           precision_config=PrecisionConfig(out_dtype=torch.float32),
                           round_y=(lambda t: t.bfloat16().float()) if split_k == 1 else None)
    # (the kernel rounds a row to bf16 before the gammas multiply, the reference after it: a bf16 ulp apart)
    check_mx_output(ref, y, out_scale, "e4m3", rtol=2.0 ** -8 if split_k == 1 else 1e-6)


@pytest.mark.usefixtures("kernels_on_demand")
@pytest.mark.parametrize("path", ["tiled", "persistent", "split_k", "top_k"])
@pytest.mark.parametrize("swiglu", [False, True])
def test_mx_output_of_a_width_that_is_not_whole_scale_blocks(path, swiglu, device):
    # 48 output columns: the last scale block holds 16 of them. Its scale must be written (the scales start
    # poisoned, 255) and its values right, by the matmul's store and by the reduce's (split K, top-k combine).
    m, k, n_out, n_expts = 24, 64, 48, 4
    n = 2 * n_out if swiglu else n_out
    act = ogsgen.FusedActivation(ogsgen.swiglu, (1.1, 7.0)) if swiglu else None
    x = torch.randn(m, k, device=device).bfloat16()
    out_scale = torch.full((m, 2), 255, dtype=torch.uint8, device=device)
    pc = PrecisionConfig(out_dtype=torch.float8_e4m3fn, out_scale=out_scale)
    fp32 = PrecisionConfig(out_dtype=torch.float32)
    constraints = {"tiled": dict(persistent=False), "persistent": dict(persistent=True),
                   "split_k": dict(split_k=2), "top_k": {}}[path]
    if path == "top_k":
        if swiglu:
            pytest.skip("a top-k scatter's activation is its first matmul's (the combine has none)")
        rd, _, si = ogsgen.routing(torch.randn(m // 2, n_expts, device=device), 2)
        w = torch.randn(n_expts, k, n, device=device).bfloat16()
        out_scale = pc.out_scale = torch.full((m // 2, 2), 255, dtype=torch.uint8, device=device)
        y = matmul_ogs(x, w, None, rd, scatter_indx=si, precision_config=pc)
        ref = matmul_ogs_torch(x, w, None, rd, scatter_indx=si, precision_config=fp32,
                               round_y=lambda t: t.bfloat16().float())  # (the k rows pass through bf16)
    else:
        w = torch.randn(k, n, device=device).bfloat16()
        with ogsgen.opt_flags_constraints(**constraints):
            y = matmul_ogs(x, w, None, precision_config=pc, fused_activation=act)
        ref = matmul_ogs_torch(x.float(), w.float(), None, fused_activation=act, precision_config=fp32)
    assert y.shape == ref.shape and y.shape[-1] == n_out
    check_mx_output(ref, y, out_scale, "e4m3", rtol=2.0 ** -8 if path == "top_k" else 1e-6)


def test_mx_output_errors(device):
    x = torch.randn(8, 64, device=device).bfloat16()
    w = torch.randn(64, 64, device=device).bfloat16()
    with pytest.raises(ogsgen.SpecError, match=r"out_scale must hold one e8m0 byte per 32 output columns of each row "
                                             r"\(mxfp8e4m3\): shape \(8, 2\)"):
        matmul_ogs(x, w, None, precision_config=PrecisionConfig(out_scale=torch.zeros(8, 3, dtype=torch.uint8)))
    with pytest.raises(ogsgen.SpecError, match="out_scale makes the output mxfp8: out_dtype must be a float8"):
        matmul_ogs(x, w, None, precision_config=PrecisionConfig(out_dtype=torch.bfloat16,
                                                               out_scale=torch.zeros(8, 2, dtype=torch.uint8)))


# ---------------------------------------------------------------- bad inputs

def test_format_errors(device):
    x = torch.randn(8, 64, device=device).bfloat16()
    values, scales = _mx_weights(torch.randn(1, 64, 32, device=device), "e2m1")
    values, scales = values[0], scales[0]
    with pytest.raises(ogsgen.SpecError, match=r"weight_scale must hold one e8m0 byte per 32 values of K: shape \(2, 32\)"):
        matmul_ogs(x, values, None, precision_config=PrecisionConfig(weight_scale=scales[:1]))
    with pytest.raises(ogsgen.SpecError, match="weight_scale must be torch.uint8"):
        matmul_ogs(x, values, None, precision_config=PrecisionConfig(weight_scale=scales.float()))
    with pytest.raises(ogsgen.SpecError, match="packed mxfp4: 2 values per byte"):
        matmul_ogs(x[:, :63], values, None, precision_config=PrecisionConfig(weight_scale=scales))
    with pytest.raises(ogsgen.SpecError, match="w is uint8 .*weight_scale is None"):
        matmul_ogs(x, values, None)
    with pytest.raises(ogsgen.SpecError, match="MX weights need bf16, fp16 or mxfp8 x"):
        matmul_ogs(x.float(), values, None, precision_config=PrecisionConfig(weight_scale=scales))
    fp8, e5m2 = x.to(torch.float8_e4m3fn), x.to(torch.float8_e5m2)  # (e4m3 x with mxfp4 w: tests/test_fp8_mxfp4.py)
    with pytest.raises(ogsgen.SpecError, match="MX weights need bf16, fp16 or mxfp8 x .* or e4m3 x scaled per tensor "
                                               "or per row with mxfp4 weights; not fp8e5m2 x"):
        matmul_ogs(e5m2, values, None, precision_config=PrecisionConfig(weight_scale=scales))
    with pytest.raises(ogsgen.SpecError, match="act_scale of uint8 .* makes x mxfp8: x must be torch.float8_e4m3fn"):
        matmul_ogs(x, values, None, precision_config=PrecisionConfig(weight_scale=scales, act_scale=scales))
    with pytest.raises(ogsgen.SpecError, match="lhs_data.scale is set but the operand is bf16"):
        matmul_ogs(x, x.mT.contiguous(), None,
                   precision_config=PrecisionConfig(flex_ctx=FlexCtx(lhs_data=InFlexData(scale=torch.ones(1)))))
    with pytest.raises(ogsgen.SpecError, match=r"rhs_data.scale must be a contiguous float32 tensor of 1 element\(s\)"):
        matmul_ogs(fp8, fp8.mT.contiguous().mT.mT, None,
                   precision_config=PrecisionConfig(flex_ctx=FlexCtx(rhs_data=InFlexData(scale=torch.ones(2)))))
    with pytest.raises(ogsgen.SpecError, match="fp8 x needs fp8 weights"):
        matmul_ogs(fp8, x.mT.contiguous(), None)
    with pytest.raises(ogsgen.SpecError, match="max_num_imprecise_acc applies to fp8 dots only"):
        matmul_ogs(x, x.mT.contiguous(), None, precision_config=PrecisionConfig(max_num_imprecise_acc=32))
    with pytest.raises(ogsgen.SpecError, match="expected_scale is set but the output is bf16"):
        matmul_ogs(x, x.mT.contiguous(), None, precision_config=PrecisionConfig(
            flex_ctx=FlexCtx(out_data=OutFlexData(expected_scale=torch.ones(1)))))



@pytest.mark.parametrize("element", ["e4m3", "e5m2"])
def test_mxfp8_weights_refuse_a_float32_act_scale(element, device):
    """A float32 act_scale is the scale of an e4m3 x for fp8e4m3_b128, fp8e4m3_channel or mxfp4 weights; mxfp8 weights
    take none (bf16 or fp16 x) or uint8 e8m0 scales (mxfp8 x): refused, not ignored (here NaN, of no x's shape)."""
    x = torch.randn(8, 64, device=device).bfloat16()
    values, scales = _mx_weights(torch.randn(1, 64, 32, device=device), element)
    nan_scale = torch.full((3, 5), float("nan"), device=device)
    for x_arg in (x, x.to(torch.float8_e4m3fn)):
        with pytest.raises(ogsgen.SpecError, match=r"precision_config\.act_scale of float32 .* mxfp8 weights take "
                                                   r"bf16 or fp16 x .* or an mxfp8 x with uint8 e8m0 act_scale"):
            matmul_ogs(x_arg, values[0], None, precision_config=PrecisionConfig(weight_scale=scales[0],
                                                                                act_scale=nan_scale))

# ---------------------------------------------------------------- weight preparation

@pytest.mark.parametrize("format", ["bf16", "fp8e4m3", "mxfp4", "mxfp8e4m3", "nvfp4"])
def test_prepared_weights_of_no_experts_dequantize_to_nothing(format, device):
    # (found by the fuzzer: fp8e4m3's per-expert scale of no experts was taken for one scale of the whole tensor)
    prepared = ogsgen.prepare_expert_weights(torch.randn(0, 48, 64, device=device), format=format)
    assert prepared.dequantize().shape == (0, 64, 48)


@pytest.mark.parametrize("format,value_layout", [("bf16", "auto"), ("fp8e4m3", "auto"), ("mxfp4", "strided"),
                                                 ("mxfp4", "hopper"), ("mxfp4", "hopper_fp8"), ("mxfp8e4m3", "auto")])
@pytest.mark.parametrize("layout,gate_up", [("out_in", "concatenated"), ("in_out", "interleaved"), ("out_in", None)])
def test_prepare_expert_weights_round_trips(format, value_layout, layout, gate_up, device):
    n_expts, k, n = 3, 64, 48
    dense = torch.randn(n_expts, n, k, device=device) if layout == "out_in" else torch.randn(n_expts, k, n,
                                                                                             device=device)
    bias = torch.randn(n_expts, n, device=device)
    prepared = ogsgen.prepare_expert_weights(dense, bias, layout=layout, gate_up=gate_up, format=format,
                                             value_layout=value_layout)
    assert isinstance(prepared.w, SwizzledMxValues) == (value_layout in ("hopper", "hopper_fp8"))
    back = prepared.dequantize(checkpoint_order=True)
    assert back.shape == dense.shape
    if format == "bf16":
        assert torch.equal(back, dense.bfloat16().float())
    elif format.startswith("mx"):
        element = {"mxfp4": "e2m1", "mxfp8e4m3": "e4m3"}[format]
        along_k = dense if layout == "out_in" else dense.mT
        expected = dequantize_mx_torch(*quantize_mx_torch(along_k, element, axis=-1), element)
        assert torch.equal(back if layout == "out_in" else back.mT, expected)
    else:
        assert_close(dense, back, maxtol=0.07, rmstol=0.05)
    if format in ("fp8e4m3", "mxfp4", "mxfp8e4m3"):
        if value_layout not in ("hopper", "hopper_fp8"):  # (swizzled words are K-contiguous by construction)
            assert prepared.w.stride(-2) == 1  # K-contiguous, as Hopper reads scaled weights
    if format.startswith("mx"):
        assert prepared.weight_scale.stride(-1) == 1  # N-contiguous: whole sectors per K step
    if gate_up == "concatenated":  # the matmul sees gate, up, gate, up, ... columns
        assert torch.equal(prepared.bias[:, 0::2], bias[:, : n // 2])
        torch.testing.assert_close(prepared.dequantize()[:, :, 1::2], prepared.dequantize(True).mT[:, :, n // 2:])


def test_prepared_weights_run_a_swiglu_moe_matmul(device):
    n_expts, hidden, inter, tokens = 4, 64, 32, 16
    gate_up = torch.randn(n_expts, 2 * inter, hidden, device=device) / 8   # HF-style (E, out, in), [gate; up]
    bias = torch.randn(n_expts, 2 * inter, device=device)
    prepared = ogsgen.prepare_expert_weights(gate_up, bias, gate_up="concatenated", format="mxfp4")
    rd, gi, _ = ogsgen.routing(torch.randn(tokens, n_expts, device=device), 2)
    x = torch.randn(tokens, hidden, device=device).bfloat16()
    act = ogsgen.FusedActivation(ogsgen.swiglu, (1.702, 7.0))
    with ogsgen.opt_flags_constraints(block_m=16, block_n=32, block_k=64):  # whole K groups: hopper on an H200
        y = matmul_ogs(x, prepared.w, prepared.bias, rd, gather_indx=gi, fused_activation=act,
                       precision_config=prepared.precision_config())
    # Reference in the checkpoint's own terms: gate and up halves, SwiGLU written out.
    w = prepared.dequantize(checkpoint_order=True)                       # (E, 2I, H), [gate; up]
    xs = x.float()[gi.src_indx.long() // 2]
    ref = torch.empty(tokens * 2, inter, device=device)
    ends = torch.cumsum(rd.expt_hist, 0).tolist()
    for e, (lo, hi) in enumerate(zip([0] + ends[:-1], ends)):
        h = xs[lo:hi] @ w[e].T + bias[e]
        g, u = h[:, :inter].clamp(max=7.0), h[:, inter:].clamp(-7.0, 7.0)
        ref[lo:hi] = g * torch.sigmoid(1.702 * g) * (u + 1)
    assert_close(ref, y.float(), maxtol=3e-2)


def test_prepare_gpt_oss_checkpoint(device):
    # gpt-oss ships mxfp4 blocks (E, out, in // 32, 16) and scales (E, out, in // 32), gate/up interleaved.
    dense = torch.randn(2, 64, 96, device=device)
    values, scales = quantize_mx_torch(dense, "e2m1", axis=-1)
    prepared = ogsgen.prepare_expert_weights((values.unflatten(-1, (-1, 16)), scales), format="mxfp4",
                                             gate_up="interleaved")
    assert prepared.w.shape == (2, 48, 64) and prepared.weight_scale.shape == (2, 3, 64)
    assert torch.equal(prepared.dequantize(checkpoint_order=True), dequantize_mx_torch(values, scales, "e2m1"))
    with pytest.raises(ogsgen.SpecError, match="must be quantized along `in` in 'out_in' layout"):
        ogsgen.prepare_expert_weights((values, scales), format="bf16")
    with pytest.raises(ogsgen.SpecError, match="format must be one of"):
        ogsgen.prepare_expert_weights(dense, format="int4")
