"""matmul_ogs with NVFP4 weights (e2m1 values, an e4m3 scale per 16 values of K, a float32 global scale per tensor
or per expert) and bf16 x, dense and MoE with every epilogue the default catalog builds for them, against a float64
reference from ogsgen.numerics.nvfp4.dequantize_nvfp4; prepare_expert_weights from float weights and from a
ModelOpt checkpoint; the errors of wrong shapes and dtypes."""
import dataclasses

import pytest
import torch

import ogsgen
from ogsgen import PrecisionConfig, matmul_ogs, matmul_ogs_torch
from ogsgen.errors import SpecError
from ogsgen.numerics.nvfp4 import dequantize_nvfp4, quantize_nvfp4
from ogsgen.spec import NumericFormat
from ogsgen.spec.formats import NVFP4
from ogsgen.testing import assert_close
from ogsgen.types import FlexCtx, InFlexData

SWIGLU = ogsgen.FusedActivation(ogsgen.swiglu, (1.702, 7.0))
# bf16 outputs round to 2**-9 of their magnitude; the fp32 sums of exact bf16 products add little
BF16_OUT = dict(maxtol=8e-3, rmstol=4e-3)


def _checkpoint(experts, out, k, device, per_expert=True):
    """A ModelOpt-style checkpoint (weight, weight_scale, weight_scale_2); expert e's weights e + 1 times larger, so
    that each expert has its own global scale."""
    dense = torch.randn(experts, out, k, device=device) * torch.arange(1, experts + 1, device=device)[:, None, None]
    return quantize_nvfp4(dense, per_expert=per_expert)


def _reference(x, prepared, *args, **kwargs):
    kwargs["precision_config"] = PrecisionConfig(out_dtype=torch.float64)
    return matmul_ogs_torch(x.double(), prepared.dequantize().double(), *args, **kwargs)


def test_the_format_is_declared_by_its_properties():
    assert (NVFP4.name, NVFP4.scale_element, NVFP4.block_size, NVFP4.layout) == ("nvfp4", "e4m3", 16, "strided")
    assert NVFP4.scales_apply == "operand" and NVFP4.has_block_scales and NVFP4.has_global_scale
    assert ogsgen.spec.formats.format_named("nvfp4") == NVFP4
    with pytest.raises(SpecError, match="block_size 16"):
        NumericFormat("e2m1", "block_e4m3", 32)


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("k", [64, 96, 80])  # whole K steps, a last step of half a tile, an odd count of blocks
def test_dense(bias, k, device):
    codes, scales, global_scale = _checkpoint(1, 48, k, device, per_expert=False)
    prepared = ogsgen.prepare_expert_weights((codes, scales), format="nvfp4", global_scale=global_scale)
    x = torch.randn(13, k, device=device).bfloat16()
    b = torch.randn(48, device=device) if bias else None
    pc = PrecisionConfig(weight_scale=prepared.weight_scale[0],
                         flex_ctx=FlexCtx(rhs_data=InFlexData(scale=prepared.scale)))
    y = matmul_ogs(x, prepared.w[0], b, precision_config=pc)
    assert y.dtype == torch.bfloat16
    want = x.double() @ dequantize_nvfp4(codes[0], scales[0], global_scale).double().T
    assert_close(want + (b.double() if bias else 0), y, **BF16_OUT)


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("epilogue", ["gather", "gather_swiglu", "scatter_gammas", "sorted_rows"])
def test_moe(epilogue, bias, device):
    """Each MoE variant the catalog builds: w1 gathered (with SwiGLU), w2 scattered with the gates, sorted rows."""
    tokens, k, n, experts, top_k = 12, 64, 32, 4, 2
    rd, gi, si = ogsgen.routing(torch.randn(tokens, experts, device=device), top_k)
    gate_up = "concatenated" if epilogue == "gather_swiglu" else None
    prepared = ogsgen.prepare_expert_weights(torch.randn(experts, n, k, device=device)
                                             * torch.arange(1, experts + 1, device=device)[:, None, None],
                                             format="nvfp4", gate_up=gate_up)
    assert prepared.scale.shape == (experts,) and len(set(prepared.scale.tolist())) == experts
    b = torch.randn(experts, n, device=device) if bias else None
    kwargs = dict(fused_activation=SWIGLU) if gate_up else {}
    if epilogue.startswith("gather"):
        x, routing_args = torch.randn(tokens, k, device=device).bfloat16(), (rd, gi)
    elif epilogue == "scatter_gammas":
        x, routing_args = torch.randn(tokens * top_k, k, device=device).bfloat16(), (rd, None, si)
        kwargs["gammas"] = rd.gate_scal
    else:
        x, routing_args = torch.randn(tokens * top_k, k, device=device).bfloat16(), (rd,)
    y = matmul_ogs(x, prepared.w, b, *routing_args, precision_config=prepared.precision_config(), **kwargs)
    assert_close(_reference(x, prepared, b, *routing_args, **kwargs), y, **BF16_OUT)


@pytest.mark.parametrize("per_expert", [True, False])
def test_a_checkpoint_means_its_dequantized_weight(per_expert, device):
    """(weight, weight_scale) with global_scale=weight_scale_2, gate and up concatenated: the weights it prepares
    are the checkpoint's dequantized weights, exactly, and a gathered SwiGLU layer computes with them."""
    tokens, hidden, inter, experts = 10, 64, 16, 3
    codes, scales, global_scale = _checkpoint(experts, 2 * inter, hidden, device, per_expert)
    prepared = ogsgen.prepare_expert_weights((codes, scales), format="nvfp4", global_scale=global_scale,
                                             gate_up="concatenated")
    assert prepared.w.dtype == torch.uint8 and prepared.weight_scale.dtype == torch.float8_e4m3fn
    assert torch.equal(prepared.dequantize(checkpoint_order=True), dequantize_nvfp4(codes, scales, global_scale))
    rd, gi, _ = ogsgen.routing(torch.randn(tokens, experts, device=device), 2)
    x = torch.randn(tokens, hidden, device=device).bfloat16()
    h = matmul_ogs(x, prepared.w, None, rd, gather_indx=gi, fused_activation=SWIGLU,
                   precision_config=prepared.precision_config())
    assert_close(_reference(x, prepared, None, rd, gi, fused_activation=SWIGLU), h, **BF16_OUT)


def test_float_weights_are_quantized_per_expert(device):
    weight = torch.randn(2, 32, 64, device=device)
    prepared = ogsgen.prepare_expert_weights(weight, format="nvfp4")
    codes, scales, global_scale = quantize_nvfp4(weight, per_expert=True)
    assert torch.equal(prepared.dequantize(checkpoint_order=True), dequantize_nvfp4(codes, scales, global_scale))
    fixed = ogsgen.prepare_expert_weights(weight, format="nvfp4", global_scale=torch.tensor(0.01, device=device))
    assert torch.equal(fixed.scale, torch.full((1,), 0.01, device=device))


def test_errors(device):
    codes, scales, global_scale = _checkpoint(2, 32, 64, device)
    prepared = ogsgen.prepare_expert_weights((codes, scales), format="nvfp4", global_scale=global_scale)
    x = torch.randn(4, 64, device=device).bfloat16()
    dense = PrecisionConfig(weight_scale=prepared.weight_scale[0],
                            flex_ctx=FlexCtx(rhs_data=InFlexData(scale=prepared.scale[:1])))
    assert matmul_ogs(x, prepared.w[0], None, precision_config=dense).isfinite().all()
    with pytest.raises(SpecError, match=r"precision_config\.flex_ctx\.rhs_data\.scale"):
        matmul_ogs(x, prepared.w[0], None, precision_config=PrecisionConfig(weight_scale=prepared.weight_scale[0]))
    with pytest.raises(SpecError, match=r"precision_config\.weight_scale must hold one e4m3 scale per 16"):
        matmul_ogs(x, prepared.w[0], None, precision_config=dataclasses.replace(
            dense, weight_scale=prepared.weight_scale[0, :2]))
    with pytest.raises(SpecError, match=r"precision_config\.flex_ctx\.rhs_data\.scale must be"):
        matmul_ogs(x, prepared.w[0], None, precision_config=PrecisionConfig(
            weight_scale=prepared.weight_scale[0], flex_ctx=FlexCtx(rhs_data=InFlexData(scale=torch.ones(3)))))
    with pytest.raises(ogsgen.OgsgenError, match="nvfp4 weights are upcast"):
        matmul_ogs(x.to(torch.float8_e4m3fn), prepared.w[0], None,
                   precision_config=PrecisionConfig(weight_scale=prepared.weight_scale[0],
                                                    flex_ctx=FlexCtx(InFlexData(scale=torch.ones(1)),
                                                                     InFlexData(scale=prepared.scale[:1]))))
    # 16-deep K steps (one scale block each) computed wrong results on an H100 (block_m=16, block_n=32): refused
    with ogsgen.opt_flags_constraints(block_m=16, block_n=32, block_k=16), \
            pytest.raises(ogsgen.errors.InapplicableConstraintError, match="block_k=16: .* need block_k >= 32"):
        matmul_ogs(x, prepared.w[0], None, precision_config=dense)
    with pytest.raises(SpecError, match="global_scale=weight_scale_2"):
        ogsgen.prepare_expert_weights((codes, scales), format="nvfp4")
    with pytest.raises(SpecError, match="global_scale must be a scalar"):
        ogsgen.prepare_expert_weights((codes, scales), format="nvfp4", global_scale=torch.ones(3))
    with pytest.raises(SpecError, match="global_scale must be torch.float32"):
        ogsgen.prepare_expert_weights((codes, scales), format="nvfp4", global_scale=global_scale.double())
    with pytest.raises(SpecError, match=r"checkpoint scales must be torch.float8_e4m3fn \(e4m3 scales\)"):
        ogsgen.prepare_expert_weights((codes, scales.float()), format="nvfp4", global_scale=global_scale)
    with pytest.raises(SpecError, match=r"checkpoint scales must be \(E, out, in // 16\)"):
        ogsgen.prepare_expert_weights((codes, scales[..., :2]), format="nvfp4", global_scale=global_scale)
    with pytest.raises(SpecError, match="layout='out_in'"):
        ogsgen.prepare_expert_weights((codes, scales), format="nvfp4", global_scale=global_scale, layout="in_out")
    with pytest.raises(SpecError, match="global_scale applies to format='nvfp4'"):
        ogsgen.prepare_expert_weights(torch.randn(2, 32, 64, device=device), format="mxfp4", global_scale=global_scale)


def test_warmup_makes_nvfp4_weights_for_a_k_tail(device):
    """ogsgen warmup's K tail (272: 17 blocks of 16, an odd count) is a valid call."""
    from ogsgen.runtime.warmup import WarmupCall, warmup_calls
    from ogsgen.spec.catalog import default_catalog
    variant = default_catalog().by_name()["ogs_matmul_xbf16_wnvfp4_ybf16_bias"]
    calls = [c for c in warmup_calls([variant], 132) if isinstance(c, WarmupCall) and c.k % 32]
    assert calls
    min(calls, key=lambda c: c.flags.block_m * c.flags.block_n).run(device)
