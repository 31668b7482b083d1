"""NaN and infinities through every path, against the torch reference: a NaN stays NaN (training relies on it to
show a divergence) through the built-in activation and its backward, split-K reduces, the top-k combine, flexpoint
saturation and MX quantization (whose e8m0 scale has a NaN code, 0xFF)."""
import pytest
import torch
import triton
import triton.language as tl

import ogsgen
from ogsgen import FusedActivation, PrecisionConfig, matmul_ogs, matmul_ogs_torch
from ogsgen.numerics import dequantize_mx, dequantize_mx_torch, quantize_mx, quantize_mx_torch
from ogsgen.numerics.mx import ELEMENTS
from ogsgen.testing import assert_close

NAN, INF = float("nan"), float("inf")
SWIGLU = FusedActivation(ogsgen.swiglu, (1.702, 7.0))


def assert_close_nonfinite(ref: torch.Tensor, actual: torch.Tensor, what: str = "result") -> None:
    """NaN exactly where the reference has NaN, the same infinities, and the finite values close."""
    ref, actual = ref.double(), actual.double()
    for name, of in (("NaN", torch.isnan), ("+inf", lambda t: t == INF), ("-inf", lambda t: t == -INF)):
        differ = of(ref) != of(actual)
        assert not differ.any(), (f"{what}: {name} at {int(differ.sum())} places where the reference differs, first "
                                  f"at {tuple(differ.nonzero()[0].tolist())}")
    finite = torch.isfinite(ref)
    assert_close(ref.where(finite, 0.0), actual.where(finite, 0.0), what=what)


def _swiglu_operands(device, m=6, k=64, n=32):
    """x, w and bias whose products meet each case of SwiGLU's clamps: a NaN row (x's row 2), and (bias) a NaN gate,
    a NaN linear part, an infinite gate and linear part on both sides of the clamps."""
    x = torch.randn(m, k, device=device).bfloat16()
    x[2, 5] = NAN
    w = (torch.randn(k, n, device=device) / 8).bfloat16()
    bias = torch.randn(n, device=device)
    # (gate, linear) pairs: 0 gate NaN, 1 linear NaN, 2 gate +inf (held at the limit), 3 linear -inf (held at
    # -limit), 4 linear +inf, 5 gate -inf (-inf * sigmoid(-inf): NaN)
    bias[torch.tensor([0, 3, 4, 7, 9, 10])] = torch.tensor([NAN, NAN, INF, -INF, INF, -INF], device=device)
    return x, w, bias


@pytest.mark.parametrize("constraints", [{}, {"split_k": 2}, {"persistent": True}],
                         ids=["tiled", "split_k", "persistent"])
def test_swiglu_keeps_nan(constraints, device):
    x, w, bias = _swiglu_operands(device)
    with ogsgen.opt_flags_constraints(**constraints):
        y = matmul_ogs(x, w, bias, fused_activation=SWIGLU)
    ref = matmul_ogs_torch(x, w, bias, fused_activation=SWIGLU)
    rows = torch.arange(6, device=device) != 2
    assert ref[2].isnan().all() and ref[:, [0, 1, 5]].isnan().all() and ref[rows][:, [2, 3, 4, 6]].isfinite().all()
    assert_close_nonfinite(ref.float(), y.float(), what="SwiGLU")


def test_swiglu_backward_keeps_nan_as_torch(device):
    # The fused backward against torch's autograd of the reference: a NaN's own column gets no gradient (torch's
    # clamp mask), the other column of its pair gets NaN; infinities held by a clamp pass none.
    from ogsgen.ops.activation_backward import activation_backward

    z = torch.randn(4, 16, device=device) * 4
    z[0, 0], z[1, 3], z[2, 4], z[2, 7], z[3, 8], z[3, 11] = NAN, NAN, INF, -INF, -INF, INF
    dy = torch.randn(4, 8, device=device)
    dz, _ = activation_backward("swiglu", [1.702, 7.0], z, dy, None, 1, None, None, None, False, torch.float32)
    leaf = z.clone().requires_grad_()
    ogsgen.swiglu.reference(leaf, 1.702, 7.0).backward(dy)
    assert leaf.grad.isnan().any() and (leaf.grad[:, [0, 3]] == 0).any()  # the cases the inputs are made for
    assert_close_nonfinite(leaf.grad, dz, what="SwiGLU backward")


def test_moe_keeps_nan_through_gather_swiglu_and_top_k_combine(device):
    # One token's NaN reaches its k experts' rows and comes back, through the top-k sum, to that token's row only.
    tokens, n_expts, k_act, hidden, inter = 12, 4, 2, 32, 16
    rd, gi, si = ogsgen.routing(torch.randn(tokens, n_expts, device=device), k_act)
    x = torch.randn(tokens, hidden, device=device).bfloat16()
    x[5, 3] = NAN
    w1 = (torch.randn(n_expts, hidden, 2 * inter, device=device) / 4).bfloat16()
    w2 = (torch.randn(n_expts, inter, hidden, device=device) / 4).bfloat16()
    for split_k in (1, 2):
        with ogsgen.opt_flags_constraints(split_k=split_k):
            h = matmul_ogs(x, w1, None, rd, gather_indx=gi, fused_activation=SWIGLU)
            y = matmul_ogs(h, w2, None, rd, scatter_indx=si, gammas=rd.gate_scal)
        ref_h = matmul_ogs_torch(x, w1, None, rd, gi, fused_activation=SWIGLU)
        ref = matmul_ogs_torch(ref_h, w2, None, rd, scatter_indx=si, gammas=rd.gate_scal)
        assert ref[5].isnan().all() and ref[torch.arange(tokens) != 5].isfinite().all()
        assert_close_nonfinite(ref.float(), y.float(), what=f"MoE layer, split_k={split_k}")


def test_flexpoint_saturation_keeps_nan(device):
    # Saturation clamps the infinities of an fp8 output to its largest value; a NaN stays NaN.
    x = torch.full((16, 32), 2.0, device=device).to(torch.float8_e4m3fn)
    x[3, 0] = NAN
    w = torch.full((32, 16), 8.0, device=device).to(torch.float8_e4m3fn).mT.contiguous().mT
    out = ogsgen.OutFlexData(expected_scale=torch.tensor([1.0], device=device),
                             actual_scale=torch.zeros(1, device=device))
    pc = ogsgen.PrecisionConfig(out_dtype=torch.float8_e4m3fn, flexpoint_saturate_inf=True,
                                flex_ctx=ogsgen.FlexCtx(out_data=out))
    y = matmul_ogs(x, w, None, precision_config=pc).float()  # 512 > 448 everywhere but row 3
    assert y[3].isnan().all() and (y[torch.arange(16) != 3] == 448.0).all()
    assert out.actual_scale.item() == INF  # (NaN counts as inf in the recorded scale)


@triton.jit
def _min_max_clamp(X, Out):
    i = tl.arange(0, 4)
    x = tl.load(X + i)
    tl.store(Out + i, tl.minimum(x, 1.0))
    tl.store(Out + 4 + i, tl.maximum(x, 1.0))
    tl.store(Out + 8 + i, tl.clamp(x, -1.0, 1.0))
    tl.store(Out + 12 + i, tl.minimum(x, 1.0, propagate_nan=tl.PropagateNan.ALL))
    tl.store(Out + 16 + i, tl.maximum(x, 1.0, propagate_nan=tl.PropagateNan.ALL))
    tl.store(Out + 20 + i, tl.clamp(x, -1.0, 1.0, propagate_nan=tl.PropagateNan.ALL))


def test_min_max_treat_nan_as_the_gpu(device):
    # min.f32 / max.f32 return the other operand of a NaN, min.NaN / max.NaN return NaN (PTX ISA), and tl.clamp takes
    # the min first, so a NaN clamps to the upper bound (seen on an H100, Triton 3.6, 2026-12-06); Triton 3.6's
    # interpreter returned NaN for all three (ogsgen.numerics.interpreter corrects it).
    x = torch.tensor([NAN, 0.5, 3.0, -3.0], device=device)
    out = torch.empty(24, device=device)
    _min_max_clamp[(1,)](x, out)
    expected = [1.0, 0.5, 1.0, -3.0, 1.0, 1.0, 3.0, 1.0, 1.0, 0.5, 1.0, -1.0,
                NAN, 0.5, 1.0, -3.0, NAN, 1.0, 3.0, 1.0, NAN, 0.5, 1.0, -1.0]
    torch.testing.assert_close(out.cpu(), torch.tensor(expected), equal_nan=True, rtol=0, atol=0)


@triton.jit
def _fp8_reads(X, Out, N: tl.constexpr):
    i = tl.arange(0, N)
    x = tl.load(X + i)
    tl.store(Out + i, x.to(tl.float32))
    tl.store(Out + N + i, x.to(tl.bfloat16).to(tl.float32))
    ones = tl.full((32, 16), 1.0, tl.float32).to(X.dtype.element_ty)  # (an fp8 dot takes K >= 32 on the GPU)
    tl.store(Out + 2 * N + i, tl.sum(tl.dot(tl.broadcast_to(x[:, None], (N, 32)), ones), 1) / 512)  # (exact)


def _e5m2_as_triton_reads_it_in_bf16(values: torch.Tensor) -> torch.Tensor:
    """e5m2 codes through Triton 3.6's e5m2 -> bf16 cast on sm_90: infinities and NaNs (exponent 31) read as the
    finite 2**16 * (1 + m / 4) with their sign; every other code exactly."""
    codes = values.view(torch.uint8).long()
    special = (codes & 0x7C) == 0x7C
    finite = 2.0 ** 16 * (1 + (codes & 3) / 4) * torch.where(codes >= 0x80, -1.0, 1.0)
    return torch.where(special, finite.float(), values.float())


@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.float8_e5m2])
def test_fp8_codes_read_as_the_gpu(dtype, device):
    # Every code, through a cast to fp32, a cast to bf16 and an fp8 dot: e4m3's 0x7F and e5m2's 0x7D-0x7F are NaN and
    # e5m2's 0x7C infinity, except that Triton's e5m2 -> bf16 cast reads exponent 31 as a finite number (seen on an
    # H100, Triton 3.6, 2026-12-06; Triton's interpreter read them all as finite values; ogsgen.numerics.interpreter
    # corrects it to the GPU's reading).
    x = torch.arange(256, dtype=torch.uint8).view(dtype).to(device)
    out = torch.empty(3 * 256, device=device)
    _fp8_reads[(1,)](x, out, N=256)
    f32, bf16, dot = out.cpu().view(3, 256)
    want = x.cpu().float()
    torch.testing.assert_close(f32, want, equal_nan=True, rtol=0, atol=0)
    torch.testing.assert_close(dot, want, equal_nan=True, rtol=0, atol=0)
    want_bf16 = _e5m2_as_triton_reads_it_in_bf16(x.cpu()) if dtype == torch.float8_e5m2 else want
    torch.testing.assert_close(bf16, want_bf16, equal_nan=True, rtol=0, atol=0)


# ---------------------------------------------------------------- MX: a block with a NaN or an infinity has scale 0xFF

def _with_nonfinite_blocks(x: torch.Tensor) -> torch.Tensor:
    """x (rows of 96 along the last axis) with a NaN in block 0 of row 0, +inf in block 1 of row 1, -inf in block 2
    of row 2 and both in row 3's last block."""
    x = x.clone()
    x[0, 3], x[1, 40], x[2, 95], x[3, 64], x[3, 70] = NAN, INF, -INF, NAN, INF
    return x


NONFINITE_BLOCKS = [(0, 0), (1, 1), (2, 2), (3, 2)]


@pytest.mark.parametrize("element", ELEMENTS)
@pytest.mark.parametrize("rounding", ["up", "down"])
def test_quantize_mx_gives_nonfinite_blocks_the_nan_scale(element, rounding, device):
    x = _with_nonfinite_blocks(torch.randn(5, 96, device=device) * 3)
    v_tri, s_tri = quantize_mx(x, element, rounding=rounding)
    v_ref, s_ref = quantize_mx_torch(x, element, rounding=rounding)
    assert torch.equal(s_tri, s_ref) and torch.equal(v_tri.view(torch.uint8), v_ref.view(torch.uint8))
    nan_blocks = torch.zeros_like(s_ref, dtype=torch.bool)
    nan_blocks[tuple(zip(*NONFINITE_BLOCKS))] = True
    assert torch.equal(s_ref == 0xFF, nan_blocks)
    codes = v_ref.view(torch.uint8).view(5, 3, -1)
    assert not codes[nan_blocks].any()  # the elements of a NaN-scaled block are 0
    for got in (dequantize_mx(v_tri, s_tri, element), dequantize_mx_torch(v_ref, s_ref, element)):
        nan = nan_blocks.repeat_interleave(32, dim=1)
        assert torch.equal(got.isnan(), nan)
        assert_close(x.where(~nan, 0.0), got.where(~nan, 0.0), maxtol=0.25, rmstol=0.15, what=element)


@pytest.mark.parametrize("layout", ["in_out", "out_in"])
def test_mxfp4_weights_with_nan_give_nan_through_the_matmul(layout, device):
    # A NaN weight makes its K block of 32 NaN (scale 0xFF): each output column it feeds is NaN in every row of its
    # expert, as in the reference on the dequantized weights.
    n_expts, k, n, tokens = 2, 64, 32, 8
    dense = torch.randn(n_expts, k, n, device=device) / 4
    dense[1, 40, 5] = NAN
    dense[0, 3, 17] = INF
    prepared = ogsgen.prepare_expert_weights(dense if layout == "in_out" else dense.mT.contiguous(), layout=layout,
                                             format="mxfp4", value_layout="strided")
    assert prepared.weight_scale[1, 1, 5] == 0xFF and prepared.weight_scale[0, 0, 17] == 0xFF
    w_ref = prepared.dequantize()
    assert w_ref[1, 32:, 5].isnan().all() and w_ref[1, :32, 5].isfinite().all()
    logits = torch.eye(2, device=device).repeat(tokens // 2, 1)  # half the tokens to each expert
    rd, gi, _ = ogsgen.routing(logits, 1)
    x = torch.randn(tokens, k, device=device).bfloat16()
    y = matmul_ogs(x, prepared.w, None, rd, gather_indx=gi, precision_config=prepared.precision_config())
    ref = matmul_ogs_torch(x.float(), w_ref, None, rd, gi)
    half = tokens // 2  # (rows in expert order)
    assert ref[:half, 17].isnan().all() and ref[half:, 5].isnan().all() and ref.isnan().sum() == tokens
    assert_close_nonfinite(ref, y.float(), what=f"mxfp4 weights ({layout})")


@pytest.mark.usefixtures("kernels_on_demand")
@pytest.mark.parametrize("split_k", [1, 2])
def test_mx_output_gives_nonfinite_blocks_the_nan_scale(split_k, device):
    # y = x @ w, quantized to mxfp8 by the kernel (or the split-K reduce): a NaN row and an infinite column make
    # their blocks' scales 0xFF, their values 0.
    m, k, n = 20, 64, 96
    x = torch.randn(m, k, device=device).bfloat16()
    x[7, 0] = NAN
    w = torch.randn(k, n, device=device).bfloat16()
    w[3, 70] = INF
    out_scale = torch.zeros((m, n // 32), dtype=torch.uint8, device=device)
    pc = PrecisionConfig(out_dtype=torch.float8_e4m3fn, out_scale=out_scale)
    with ogsgen.opt_flags_constraints(block_m=16, block_k=32, split_k=split_k):
        y = matmul_ogs(x, w, None, precision_config=pc)
    ref = matmul_ogs_torch(x.float(), w.float(), None, precision_config=PrecisionConfig(out_dtype=torch.float32))
    ref_scales = quantize_mx_torch(ref, "e4m3")[1]
    expected = torch.zeros_like(out_scale, dtype=torch.bool)
    expected[7], expected[:, 2] = True, True
    assert torch.equal(out_scale == 0xFF, expected) and torch.equal(ref_scales == 0xFF, expected)
    assert not y.view(torch.uint8)[expected.repeat_interleave(32, dim=1)].any()
    got = dequantize_mx_torch(y, out_scale, "e4m3")
    assert torch.equal(got.isnan(), expected.repeat_interleave(32, dim=1))


@pytest.mark.usefixtures("kernels_on_demand")
def test_e5m2_weights_keep_their_nan_and_infinities_with_bf16_x(device):
    # bf16 x times e5m2 w (flexpoint): w is upcast to bf16 through fp32, since Triton's direct e5m2 -> bf16 cast reads
    # e5m2's NaN and infinities as finite values (test_fp8_codes_read_as_the_gpu).
    x = torch.randn(8, 64, device=device).bfloat16()
    w = (torch.randn(64, 32, device=device) / 8).to(torch.float8_e5m2)
    w[3, 5], w[10, 9], w[20, 17] = NAN, INF, -INF
    y = matmul_ogs(x, w, None)
    ref = matmul_ogs_torch(x.float(), w.float(), None)
    assert ref[:, 5].isnan().all() and ref[:, 9].isinf().all() and ref[:, 17].isinf().all()
    assert_close_nonfinite(ref, y.float(), what="bf16 x, e5m2 w")
