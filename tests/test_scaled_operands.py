"""Weights declared as ScaledOperands: ``matmul_ogs(x, prepared.operand, ...)`` computes what the plain tensors with
their PrecisionConfig compute, nothing is inferred from a declared operand's dtypes, and bad declarations are errors
that name the argument."""
import pytest
import torch

import ogsgen
from ogsgen import PrecisionConfig, ScaledOperand, matmul_ogs
from ogsgen.errors import SpecError, SpecTypeError
from ogsgen.numerics import dequantize_fp8_torch, quantize_fp8_torch
from ogsgen.numerics.nvfp4 import quantize_nvfp4
from ogsgen.testing import assert_close

EXPERTS, OUT, IN, TOKENS = 4, 64, 256, 12


@pytest.mark.parametrize("fmt", ["nvfp4", "fp8e4m3_b128", *(pytest.param(f, marks=pytest.mark.slow)
                                                   for f in ("mxfp4", "fp8e4m3_channel", "fp8e4m3", "mxfp8e4m3"))])
def test_a_prepared_operand_computes_what_its_precision_config_does(fmt, device):
    if fmt.startswith("fp8") and device == "cuda" and torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("fp8 needs compute capability 8.9")
    torch.manual_seed(0)
    prepared = ogsgen.prepare_expert_weights(torch.randn(EXPERTS, OUT, IN, device=device) / 16,
                                             torch.randn(EXPERTS, OUT, device=device), format=fmt)
    x = torch.randn(TOKENS, IN, device=device).bfloat16()
    rd, gi, _ = ogsgen.routing(torch.randn(TOKENS, EXPERTS, device=device), 2)
    declared = prepared.operand
    assert isinstance(declared, ScaledOperand) and declared.format.name.startswith(fmt)
    y = matmul_ogs(x, declared, prepared.bias, rd, gather_indx=gi)
    expected = matmul_ogs(x, prepared.w, prepared.bias, rd, gather_indx=gi,
                          precision_config=prepared.precision_config())
    assert y.isfinite().all() and y.abs().max() > 0
    assert torch.equal(y, expected)
    assert torch.equal(declared.dequantize(), prepared.dequantize())
    reference = ogsgen.matmul_ogs_torch(x, declared, prepared.bias, rd, gather_indx=gi)
    assert torch.equal(reference, ogsgen.matmul_ogs_torch(x, prepared.dequantize(), prepared.bias, rd,
                                                          gather_indx=gi))


def test_a_prepared_operand_is_built_once_and_follows_its_tensors():
    prepared = ogsgen.prepare_expert_weights(torch.randn(2, 32, 64), format="nvfp4")
    declared = prepared.operand
    assert prepared.operand is declared   # (its checks are not paid again on every call)
    prepared.scale = prepared.scale * 2
    assert prepared.operand is not declared and prepared.operand.global_scale is prepared.scale


def test_an_unscaled_prepared_operand_is_its_tensor():
    prepared = ogsgen.prepare_expert_weights(torch.randn(2, 32, 64), format="bf16")
    assert prepared.operand is prepared.w


def _nvfp4(k=64, device="cpu"):
    codes, scales, global_scale = quantize_nvfp4(torch.randn(2, 32, k, device=device), per_expert=True)
    return codes.mT, scales.mT, global_scale   # (E, K // 2, N), (E, K // 16, N)


def test_a_declared_format_is_taken_not_inferred(device):
    # NVFP4's e4m3 block scales as their uint8 bits: a plain-tensor call reads uint8 scales as mxfp4's e8m0 ones and
    # can only refuse the global scale; declared NVFP4, the call names the scales' dtype.
    codes, scales, global_scale = _nvfp4(device=device)
    x = torch.randn(2, 5, 64, device=device).bfloat16()
    w = ScaledOperand.of(codes, "nvfp4", block_scales=scales.view(torch.uint8), global_scale=global_scale)
    with pytest.raises(SpecError, match=r"w\.block_scales must be torch\.float8_e4m3fn"):
        matmul_ogs(x, w, None)
    declared = ScaledOperand.of(codes, "nvfp4", block_scales=scales, global_scale=global_scale)
    y = matmul_ogs(x, declared, None)
    assert y.shape == (2, 5, 32)
    assert_close(ogsgen.matmul_ogs_torch(x.double(), declared.dequantize().double(), None), y, maxtol=8e-3,
                 rmstol=4e-3)


def test_declaration_errors_name_the_argument():
    codes, scales, global_scale = _nvfp4()
    cases = [
        (dict(values=codes, format="nvfp8"), SpecError, "unknown format 'nvfp8'"),
        (dict(values=codes, format=3), SpecTypeError, "format must be a format name or a NumericFormat"),
        (dict(values=codes.float(), format="bf16"), SpecError, "'bf16' has no scales: pass the tensor itself"),
        (dict(values=codes.float(), format="nvfp4"), SpecError, r"nvfp4 values must be torch\.uint8"),
        (dict(values=[1], format="nvfp4"), SpecTypeError, "values must be a torch.Tensor or SwizzledMxValues"),
        (dict(values=codes, format="nvfp4", global_scale=global_scale), SpecError,
         "nvfp4 weights need their block_scales"),
        (dict(values=codes, format="nvfp4", block_scales=scales), SpecError, "nvfp4 weights need their global_scale"),
        (dict(values=codes, format="mxfp4", block_scales=scales.view(torch.uint8), global_scale=global_scale),
         SpecError, "mxfp4 has no per-tensor scale: drop global_scale"),
        (dict(values=codes, format="mxfp4hopper", block_scales=scales), SpecError,
         "a SwizzledMxValues .* of mxfp4 values"),
    ]
    for kwargs, error, message in cases:
        with pytest.raises(error, match=message):
            ScaledOperand.of(kwargs.pop("values"), kwargs.pop("format"), **kwargs)


def test_a_call_with_a_declared_w_checks_its_scales_under_their_names():
    codes, scales, global_scale = _nvfp4()
    x = torch.randn(2, 5, 64).bfloat16()
    w = ScaledOperand.of(codes, "nvfp4", block_scales=scales, global_scale=global_scale)
    with pytest.raises(SpecError, match="w is a ScaledOperand, which carries its own scales"):
        matmul_ogs(x, w, None, precision_config=PrecisionConfig(weight_scale=scales))
    short = ScaledOperand.of(codes, "nvfp4", block_scales=scales[:, :2], global_scale=global_scale)
    with pytest.raises(SpecError, match=r"w\.block_scales must hold one e4m3 scale per 16 values of K"):
        matmul_ogs(x, short, None)
    three = ScaledOperand.of(codes, "nvfp4", block_scales=scales, global_scale=torch.ones(3))
    with pytest.raises(SpecError, match=r"w\.global_scale must be a contiguous float32 tensor of 1 or 2"):
        matmul_ogs(x, three, None)


def test_declared_fp8_block_scales_must_be_the_declared_blocks(device):
    if device == "cuda" and torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("fp8 needs compute capability 8.9")
    w = torch.randn(256, 64, device=device).to(torch.float8_e4m3fn)
    per_column = torch.rand(1, 64, device=device) + 0.5
    x = torch.randn(3, 256, device=device).bfloat16()
    with pytest.raises(SpecError, match=r"w\.block_scales of shape \(1, 64\) holds fp8e4m3_channel scales, but w "
                                        r"was declared fp8e4m3_b128"):
        matmul_ogs(x, ScaledOperand.of(w, "fp8e4m3_b128", block_scales=per_column), None)
    with pytest.raises(SpecError, match=r"w\.block_scales must be torch\.float32"):
        matmul_ogs(x, ScaledOperand.of(w, "fp8e4m3_channel", block_scales=per_column.double()), None)
    declared = ScaledOperand.of(w, "fp8e4m3_channel", block_scales=per_column)
    y = matmul_ogs(x, declared, None)
    x_as_the_kernel_sees_it = dequantize_fp8_torch(*quantize_fp8_torch(x.float(), (1, 0)), (1, 0)).double()
    assert_close(x_as_the_kernel_sees_it @ declared.dequantize().double(), y, maxtol=8e-3, rmstol=4e-3)


def _activation_cases(device):
    """(x format, quantize bf16 x -> (values, scales), how a reference dequantizes them, (w, its config))."""
    torch.manual_seed(1)
    dense = torch.randn(IN, OUT, device=device) / 16
    b128 = ogsgen.prepare_expert_weights(dense.mT[None].contiguous(), format="fp8e4m3_b128")
    channel = ogsgen.prepare_expert_weights(dense.mT[None].contiguous(), format="fp8e4m3_channel")
    mxfp4 = ogsgen.prepare_expert_weights(dense.mT[None].contiguous(), format="mxfp4", value_layout="strided")
    return {
        "mxfp8e4m3": (lambda x: ogsgen.numerics.quantize_mx(x, "e4m3"),
                      lambda v, s: ogsgen.numerics.dequantize_mx_torch(v, s, "e4m3"), (dense.bfloat16(), None)),
        "fp8e4m3_b128": (lambda x: ogsgen.numerics.quantize_fp8(x, (1, 128)),
                         lambda v, s: dequantize_fp8_torch(v, s, (1, 128)), (b128.w[0], b128.weight_scale[0])),
        "fp8e4m3_channel": (lambda x: ogsgen.numerics.quantize_fp8(x, (1, 0)),
                            lambda v, s: dequantize_fp8_torch(v, s, (1, 0)), (channel.w[0], channel.weight_scale[0])),
        "fp8e4m3_channel with mxfp4 w": (lambda x: ogsgen.numerics.quantize_fp8(x, (1, 0)),
                                         lambda v, s: dequantize_fp8_torch(v, s, (1, 0)),
                                         (mxfp4.w[0], mxfp4.weight_scale[0])),
    }


@pytest.mark.parametrize("case", ["mxfp8e4m3", "fp8e4m3_b128", "fp8e4m3_channel", "fp8e4m3_channel with mxfp4 w"])
def test_declared_activations_compute_what_act_scale_does(case, device):
    if device == "cuda" and torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("fp8 needs compute capability 8.9")
    quantize, dequantize, (w, w_scale) = _activation_cases(device)[case]
    values, scales = quantize(torch.randn(TOKENS, IN, device=device).bfloat16())
    x = ScaledOperand.activations(values, case.split()[0], block_scales=scales)
    assert x.k == IN and torch.equal(x.dequantize_rows(), dequantize(values, scales))
    y = matmul_ogs(x, w, None, precision_config=PrecisionConfig(weight_scale=w_scale))
    expected = matmul_ogs(values, w, None, precision_config=PrecisionConfig(weight_scale=w_scale, act_scale=scales))
    assert y.isfinite().all() and y.abs().max() > 0
    assert torch.equal(y, expected)
    w_dense = w.float() if w_scale is None else ScaledOperand.of(w, "mxfp4" if "mxfp4" in case else case.split()[0],
                                                                 block_scales=w_scale).dequantize()
    assert_close(ogsgen.matmul_ogs_torch(x, w_dense.double(), None), y, maxtol=8e-3, rmstol=4e-3)


def test_declared_activations_errors_name_x(device):
    quantize, _, (w, w_scale) = _activation_cases(device)["fp8e4m3_b128"]
    values, scales = quantize(torch.randn(TOKENS, IN, device=device).bfloat16())
    pc = PrecisionConfig(weight_scale=w_scale)
    x = ScaledOperand.activations(values, "fp8e4m3_b128", block_scales=scales)
    with pytest.raises(SpecError, match=r"x is a ScaledOperand, which carries its own scales: drop "
                                        r"precision_config\.act_scale"):
        matmul_ogs(x, w, None, precision_config=PrecisionConfig(weight_scale=w_scale, act_scale=scales))
    with pytest.raises(SpecError, match=r"x was declared fp8e4m3_channel, but with fp8e4m3_b128 weights its values "
                                        r"and scales are read as fp8e4m3_b128"):
        matmul_ogs(ScaledOperand.activations(values, "fp8e4m3_channel", block_scales=scales), w, None,
                   precision_config=pc)
    with pytest.raises(SpecError, match=r"x\.block_scales") as info:
        matmul_ogs(ScaledOperand.activations(values, "fp8e4m3_b128", block_scales=scales[:-1]), w, None,
                   precision_config=pc)
    assert "precision_config.act_scale" not in str(info.value)
    with pytest.raises(SpecError, match="fp8e4m3_b128 activations need their block_scales"):
        ScaledOperand.activations(values, "fp8e4m3_b128")
    with pytest.raises(SpecError, match=r"fp8e4m3_b128 values must be torch\.float8_e4m3fn of 2 or 3 dimensions "
                                        r"\(\.\.\., M, K\)"):
        ScaledOperand.activations(values.float(), "fp8e4m3_b128", block_scales=scales)
