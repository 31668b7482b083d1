"""ogsgen.compat.triton_kernels' tensor wrappers and layouts: vLLM's gpt-oss mxfp4 path (its weight preparation,
triton_kernel_moe_forward with both routings, the unfused experts) and gpt-oss's reference moe.py, written here
from their call patterns, run on ogsgen against the torch reference; what ogsgen cannot read is refused. On a GPU with
triton_kernels importable (PYTHONPATH=third_party, bench/fetch_peers.py) the same code runs on both libraries."""
import pytest
import torch

import ogsgen
import ogsgen.compat._tensor as compat_tensor
from compat_layers import (ALPHA, LIMIT, checkpoint_moe, library, pack_bitmatrix, reference_layer, vllm_fused_experts,
                           vllm_prepare)
from ogsgen.errors import SpecError, SpecTypeError, UnsupportedError
from ogsgen.numerics import quantize_mx_torch, swizzle_mx_values
from ogsgen.testing import assert_close
from cases import assert_fp32_sums, fp8_dot_bound

OURS = "ogsgen.compat.triton_kernels"


# ------------------------------------------------------------------ vLLM's gpt_oss_triton_kernels_moe.py, 3.5.1 branch

def vllm_make_routing_data(prefix, topk_ids, topk_weights, num_local_experts):
    """vLLM's make_routing_data on triton_kernels <= 3.5: a packed bitmatrix and routing_from_bitmatrix."""
    tensor, routing = library(prefix, "tensor", "routing")
    topk_ids, topk_weights = topk_ids.to(torch.int16), topk_weights.to(torch.bfloat16)
    n_rows = topk_ids.shape[0]
    words = pack_bitmatrix(topk_ids, num_local_experts)
    bitmatrix = tensor.Bitmatrix(words, shape=[n_rows, words.shape[1] * 32], shape_max=[n_rows, None],
                                 scratchpad=None)
    topk_weights = torch.where(topk_ids == -1, -1.0, topk_weights)  # vLLM marks invalid weights -1
    return routing.routing_from_bitmatrix(bitmatrix, topk_weights, topk_ids, num_local_experts, topk_ids.shape[1])


def vllm_moe_forward(prefix, hidden_states, w1, w2, gating_output, topk, quant, expert_map=None):
    """vLLM's triton_kernel_moe_forward (renormalize=True): the fused routing() without an expert map, topk ->
    make_routing_data with one."""
    if expert_map is None:
        (routing,) = library(prefix, "routing")
        routing_data, gather_idx, scatter_idx = routing.routing(gating_output, topk, sm_first=False)
    else:
        (topk_module,) = library(prefix, "topk")
        topk_weights, topk_ids_raw, _ = topk_module.topk(gating_output, topk, apply_softmax=True)
        topk_ids = expert_map[topk_ids_raw.to(torch.long)]
        routing_data, gather_idx, scatter_idx = vllm_make_routing_data(prefix, topk_ids, topk_weights, w1.shape[0])
    return vllm_fused_experts(prefix, hidden_states, w1, w2, routing_data, gather_idx, scatter_idx, topk, quant)


@pytest.mark.parametrize("routing_path", ["fused_routing", pytest.param("expert_map", marks=pytest.mark.slow)])
def test_vllm_gpt_oss_mxfp4_path(routing_path, default_layout, device):
    t = checkpoint_moe(device)
    w13, w2, quant = vllm_prepare(OURS, t, sm90=default_layout == "hopper")
    (opt_flags,) = library(OURS, "matmul_ogs_details.opt_flags")
    layouts = (compat_tensor.HopperMXValueLayout, compat_tensor.HopperMXScaleLayout) if default_layout == "hopper" \
        else (compat_tensor.StridedLayout, compat_tensor.StridedLayout)
    assert isinstance(w13.storage.layout, layouts[0])
    assert isinstance(quant["w1_precision"].weight_scale, torch.Tensor)  # read once, where the config is made
    assert w13.shape == [4, 64, 64] and w2.shape == [4, 32, 64]  # logical (E, K, N)
    # scales (E, K groups, N): on Hopper, vLLM pads K's 2 and 1 groups to 4
    k_groups = (4, 4) if default_layout == "hopper" else (2, 1)
    assert [quant[f"w{i}_precision"].weight_scale.shape[1] for i in (1, 2)] == list(k_groups)
    gating_output = (t["x"] @ t["wg"]).float() + t["bg"]
    expert_map = torch.arange(4, device=device) if routing_path == "expert_map" else None
    try:
        opt_flags.update_opt_flags_constraints({"split_k": 1})  # what vLLM sets on Hopper
        out = vllm_moe_forward(OURS, t["x"], w13, w2, gating_output, 2, quant, expert_map)
    finally:
        opt_flags.reset_opt_flags_constraints()
    assert out.shape == t["x"].shape and out.dtype == torch.bfloat16
    assert_close(reference_layer(t, ogsgen.routing(gating_output, 2)), out.float(), maxtol=3e-2)


def test_fp8_activations_with_mxfp4_weights_through_the_seed_api(default_layout, device):
    """The seed's fp8 x (flex_ctx.lhs_data: e4m3 values and one scale) with vLLM's mxfp4 weights, which triton_kernels
    refuses below Blackwell: ogsgen multiplies on fp8 tensor cores, the weights converted to e4m3 in the kernel."""
    mo, routing = library(OURS, "matmul_ogs", "routing")
    t = checkpoint_moe(device)
    w13, _, quant = vllm_prepare(OURS, t)
    routing_data, gather_indx, _ = routing.routing((t["x"] @ t["wg"]).float() + t["bg"], 2)
    scale = (t["x"].float().abs().amax() / 448).reshape(1)
    x = (t["x"].float() / scale).to(torch.float8_e4m3fn)
    pc = mo.PrecisionConfig(weight_scale=quant["w1_precision"].weight_scale, out_dtype=torch.float32,
                            flex_ctx=mo.FlexCtx(lhs_data=mo.InFlexData(dtype=torch.float8_e4m3fn, scale=scale)))
    out = mo.matmul_ogs(x, w13, quant["w1_bias"], routing_data, gather_indx=gather_indx, precision_config=pc)
    ours = ogsgen.routing((t["x"] @ t["wg"]).float() + t["bg"], 2)[:2]
    fp32 = ogsgen.PrecisionConfig(out_dtype=torch.float32)
    want = ogsgen.matmul_ogs_torch(x.float() * scale, t["w13_ref"], t["w13_bias"], *ours, precision_config=fp32)
    abs_sums = ogsgen.matmul_ogs_torch((x.float() * scale).abs(), t["w13_ref"].abs(), None, *ours, precision_config=fp32)
    # the exact products of the dequantized operands, summed by the fp8 tensor cores (and fp32's last bit)
    assert_fp32_sums(want.double(), fp8_dot_bound(abs_sums.double()) + 2.0 ** -22 * want.double().abs(), out)


def test_vllm_expert_parallel_map_drops_other_ranks_experts(device):
    # Rank 1 of 2: experts 2 and 3 are local (ids 0, 1), the others' gates are -1, dropped.
    t = checkpoint_moe(device)
    local = {name: t[name][2:] for name in ("w13", "w13_scale", "w13_bias", "w2", "w2_scale", "w2_bias", "w13_ref",
                                             "w2_ref")}
    w13, w2, quant = vllm_prepare(OURS, {**t, **local})
    gating_output = (t["x"] @ t["wg"]).float() + t["bg"]
    expert_map = torch.tensor([-1, -1, 0, 1], device=device)
    out = vllm_moe_forward(OURS, t["x"], w13, w2, gating_output, 2, quant, expert_map)
    ids, weights = ogsgen.moe.select_experts(gating_output, 2)
    weights = torch.softmax(weights, -1).bfloat16().float()  # vLLM passes bf16 gate weights
    routing = ogsgen.routing_from_topk(expert_map[ids.long()], weights, 2)
    assert_close(reference_layer({**t, **local}, routing), out.float(), maxtol=3e-2)


def test_vllm_unfused_experts(default_layout, device):
    """vLLM's UnfusedOAITritonExperts (the LoRA injection points): the first matmul without its activation, rows
    taken to gate order and activated there, the second matmul with n_expts_act set to 1 (one output row per gate),
    then the top-k sum."""
    mo, routing = library(OURS, "matmul_ogs", "routing")
    t = checkpoint_moe(device)
    w13, w2, quant = vllm_prepare(OURS, t)
    gating_output = (t["x"] @ t["wg"]).float() + t["bg"]
    routing_data, gather_indx, scatter_indx = routing.routing(gating_output, 2)
    M, K = t["x"].shape
    N, topk = w13.shape[-1], 2
    cache1 = torch.empty((1, M * topk, N), device=device, dtype=torch.bfloat16)
    cache3 = torch.empty((1, M * topk, K), device=device, dtype=torch.bfloat16)
    mo.matmul_ogs(t["x"], w13, quant["w1_bias"], routing_data, gather_indx=gather_indx,
                  precision_config=quant["w1_precision"], fused_activation=None, y=cache1)
    act_input = cache1.view(-1, N)[gather_indx.dst_indx.long()]
    cache2 = ogsgen.swiglu_torch(act_input.float(), ALPHA, LIMIT).bfloat16()
    routing_data.n_expts_act = 1
    mo.matmul_ogs(cache2[gather_indx.src_indx.long()], w2, quant["w2_bias"], routing_data, scatter_indx=scatter_indx,
                  precision_config=quant["w2_precision"], gammas=routing_data.gate_scal, y=cache3)
    out = cache3.view(-1, topk, K).float().sum(1)
    assert_close(reference_layer(t, ogsgen.routing(gating_output, 2)), out, maxtol=3e-2)


# ------------------------------------------------------------------ gpt-oss's gpt_oss/triton/moe.py

def gpt_oss_quantize_mx4(prefix, w):
    """gpt-oss's quantize_mx4: (E, K, N) weights to mxfp4 along K, values in the Hopper layout."""
    mxfp, tensor, layout = library(prefix, "numerics_details.mxfp", "tensor", "tensor_details.layout")
    w, w_scale = mxfp.downcast_to_mxfp(w.to(torch.bfloat16), torch.uint8, axis=1)
    w = tensor.convert_layout(tensor.wrap_torch_tensor(w, dtype=tensor.FP4), layout.HopperMXValueLayout, mx_axis=1)
    w_scale = tensor.convert_layout(tensor.wrap_torch_tensor(w_scale), layout.StridedLayout)
    return w, w_scale


def gpt_oss_moe(prefix, x, wg, w1, w1_mx, w2, w2_mx, bg, b1, b2, experts_per_token, swiglu_limit=LIMIT):
    """gpt-oss's moe (fused_act=True)."""
    mo, numerics, routing, swiglu = library(prefix, "matmul_ogs", "numerics", "routing", "swiglu")
    pc1 = mo.PrecisionConfig(weight_scale=w1_mx, flex_ctx=mo.FlexCtx(rhs_data=numerics.InFlexData()))
    pc2 = mo.PrecisionConfig(weight_scale=w2_mx, flex_ctx=mo.FlexCtx(rhs_data=numerics.InFlexData()))
    pcg = mo.PrecisionConfig(flex_ctx=mo.FlexCtx(rhs_data=numerics.InFlexData()))
    logits = mo.matmul_ogs(x, wg, bg, precision_config=pcg)
    rdata, gather_indx, scatter_indx = routing.routing(logits, experts_per_token, simulated_ep=1)
    act = mo.FusedActivation(mo.FnSpecs("swiglu", swiglu.swiglu_fn, ("alpha", "limit")), (ALPHA, swiglu_limit), 2)
    x = mo.matmul_ogs(x, w1, b1, rdata, gather_indx=gather_indx, precision_config=pc1, fused_activation=act)
    x = mo.matmul_ogs(x, w2, b2, rdata, scatter_indx=scatter_indx, precision_config=pc2, gammas=rdata.gate_scal)
    return logits, x


def test_gpt_oss_reference_moe(device):
    tokens, hidden, inter, experts = 16, 64, 32, 4
    x = torch.randn(tokens, hidden, device=device).bfloat16()
    wg = (torch.randn(hidden, experts, device=device) * hidden ** -0.5).bfloat16()
    bg = torch.randn(experts, device=device)
    w1_dense = torch.randn(experts, hidden, 2 * inter, device=device) * hidden ** -0.5
    w2_dense = torch.randn(experts, inter, hidden, device=device) * inter ** -0.5
    b1, b2 = torch.randn(experts, 2 * inter, device=device), torch.randn(experts, hidden, device=device)
    w1, w1_mx = gpt_oss_quantize_mx4(OURS, w1_dense)
    w2, w2_mx = gpt_oss_quantize_mx4(OURS, w2_dense)
    assert w1.storage.data.dtype == torch.int32  # ogsgen's hopper words
    logits, out = gpt_oss_moe(OURS, x, wg, w1, w1_mx, w2, w2_mx, bg, b1, b2, experts_per_token=2)
    assert_close(x.float() @ wg.float() + bg, logits.float(), what="router logits")
    # downcast_to_mxfp is ogsgen's rounding-up quantization, bit for bit
    values, scales = quantize_mx_torch(w1_dense.bfloat16(), "e2m1", axis=1)
    assert torch.equal(ogsgen.unswizzle_mx_values(w1.storage.layout.as_swizzled(w1.storage.data)), values)
    assert torch.equal(w1_mx.storage.data, scales)
    decoded = {"w13_ref": ogsgen.numerics.dequantize_mx_torch(values, scales, "e2m1", axis=1),
               "w2_ref": ogsgen.numerics.dequantize_mx_torch(*quantize_mx_torch(w2_dense.bfloat16(), "e2m1", axis=1),
                                                             "e2m1", axis=1)}
    t = {"x": x, "w13_bias": b1, "w2_bias": b2, **decoded}
    assert_close(reference_layer(t, ogsgen.routing(logits.float(), 2)), out.float(), maxtol=3e-2)


def test_layouts_convert_back_to_the_strided_values(device):
    tensor, layout = library(OURS, "tensor", "tensor_details.layout")
    values = torch.randint(0, 256, (2, 48, 40), dtype=torch.uint8, device=device).mT.contiguous().mT
    scales = torch.randint(100, 140, (2, 3, 40), dtype=torch.uint8, device=device).mT.contiguous().mT
    w = tensor.convert_layout(tensor.wrap_torch_tensor(values, dtype=tensor.FP4), layout.HopperMXValueLayout, mx_axis=1)
    s = tensor.convert_layout(tensor.wrap_torch_tensor(scales), layout.HopperMXScaleLayout, mx_axis=1, num_warps=8)
    assert w.shape == [2, 96, 40] and w.ndim == 3 and w.dtype == tensor.FP4
    assert torch.equal(w.storage.data, swizzle_mx_values(values).data)
    assert s.storage.data.is_contiguous() and torch.equal(s.storage.data, scales)  # N-contiguous
    assert torch.equal(tensor.convert_layout(w, layout.StridedLayout).storage.data, values)
    # The newest triton_kernels' form: a layout instance, reused for tensors of other shapes
    hopper = layout.HopperMXValueLayout(mx_axis=-2, mma_version=3)
    for shape in ((2, 48, 40), (64, 16)):
        other = torch.randint(0, 256, shape, dtype=torch.uint8, device=device)
        wrapped = tensor.convert_layout(tensor.wrap_torch_tensor(other.mT.contiguous().mT, dtype=tensor.FP4), hopper)
        assert torch.equal(tensor.convert_layout(wrapped, layout.StridedLayout).storage.data, other)


# ------------------------------------------------------------------ what ogsgen cannot read

def test_layouts_ogsgen_cannot_read_are_refused(device):
    tensor, layout, mo = library(OURS, "tensor", "tensor_details.layout", "matmul_ogs")
    values = torch.randint(0, 256, (2, 32, 64), dtype=torch.uint8, device=device).mT.contiguous().mT  # (E, K/2, N)
    fp4 = tensor.wrap_torch_tensor(values, dtype=tensor.FP4)
    for blackwell in (layout.BlackwellMXValueLayout, layout.BlackwellMXScaleLayout, layout.CDNA4MXScaleLayout):
        with pytest.raises(UnsupportedError, match=f"{blackwell.__name__}: ogsgen's kernels read mxfp4 values "
                                                   f"strided or in HopperMXValueLayout"):
            tensor.convert_layout(fp4, blackwell)
    with pytest.raises(UnsupportedError, match=r"HopperMXValueLayout\(mx_axis=2\).*pass mx_axis=1"):
        tensor.convert_layout(fp4, layout.HopperMXValueLayout, mx_axis=2)
    x = torch.randn(8, 64, device=device).bfloat16()
    scales = torch.full((2, 2, 64), 127, dtype=torch.uint8, device=device)
    pc = mo.PrecisionConfig(weight_scale=scales)
    # Bytes swizzled by triton_kernels' own Hopper layout (uint8 (E, N / 4, K * 2)): not ogsgen's words
    foreign = tensor.Tensor(tensor.Storage(torch.zeros(2, 16, 128, dtype=torch.uint8, device=device),
                                           layout.HopperMXValueLayout((2, 32, 64), mx_axis=1)),
                            dtype=tensor.FP4, shape=[2, 64, 64])
    with pytest.raises(UnsupportedError, match="must hold ogsgen's hopper words .* swizzled by triton_kernels' own"):
        mo.matmul_ogs(x, foreign, None, precision_config=pc)
    # mxfp4 packed along N: wrap_torch_tensor doubles the dimension of unit stride
    along_n = tensor.wrap_torch_tensor(torch.zeros(2, 64, 32, dtype=torch.uint8, device=device), dtype=tensor.FP4)
    assert along_n.shape == [2, 64, 64]
    with pytest.raises(UnsupportedError, match="w: ogsgen reads mxfp4 weights .* packed two values a byte along K"):
        mo.matmul_ogs(x, along_n, None, precision_config=pc)
    with pytest.raises(UnsupportedError, match="convert_layout: tensor: ogsgen reads mxfp4 weights .* along K"):
        tensor.convert_layout(along_n, layout.HopperMXValueLayout, mx_axis=1)
    swizzled_scales = tensor.Tensor(tensor.Storage(torch.zeros(2, 2, 128, dtype=torch.uint8, device=device),
                                                   layout.HopperMXScaleLayout((2, 2, 64), mx_axis=1)),
                                    shape=[2, 2, 64])
    with pytest.raises(UnsupportedError, match="precision_config.weight_scale: the storage of a HopperMXScaleLayout"):
        mo.PrecisionConfig(weight_scale=swizzled_scales)

    class OtherLibrarysTensor:  # triton_kernels' own Tensor, say
        storage, shape_max = None, None
    with pytest.raises(SpecTypeError, match="w is a .*OtherLibrarysTensor, another library's tensor wrapper"):
        mo.matmul_ogs(x, OtherLibrarysTensor(), None, precision_config=pc)


def test_a_dtype_its_storage_cannot_hold_is_refused(device):
    """wrap_torch_tensor(uint8 tensor, dtype=torch.bfloat16) would count 0 values per byte (a logical shape [32, 0])
    and the matmul would run the bytes as mxfp4: refused where it is made."""
    tensor = library(OURS, "tensor")[0]
    values = torch.zeros(32, 16, dtype=torch.uint8, device=device)
    with pytest.raises(SpecError, match=r"wrap_torch_tensor\(dtype=torch.bfloat16\): a torch.uint8 tensor cannot "
                                        r"hold torch.bfloat16 values .*\.view\(torch.bfloat16\)"):
        tensor.wrap_torch_tensor(values, dtype=torch.bfloat16)
    assert tensor.wrap_torch_tensor(values, dtype=tensor.FP4).shape == [32, 32]  # (two values a byte)


@pytest.mark.usefixtures("host_checks")
def test_bitmatrix_that_disagrees_with_its_ids_is_refused(device):
    tensor, routing = library(OURS, "tensor", "routing")
    ids = torch.tensor([[0, 2], [1, 3]], dtype=torch.int16, device=device)
    words = pack_bitmatrix(ids, 4)
    weights = torch.full((2, 2), 0.5, device=device)
    good = tensor.Bitmatrix(words, shape=[2, 32], shape_max=[2, None])
    routing_data, _, _ = routing.routing_from_bitmatrix(good, weights, ids, 4, 2)
    assert routing_data.expt_hist.tolist() == [1, 1, 1, 1]
    bad = tensor.Bitmatrix(pack_bitmatrix(ids.flip(0)[[0, 0]], 4), shape=[2, 32], shape_max=[2, None])
    with pytest.raises(SpecError, match="bitmatrix does not hold the experts of the ids it comes with"):
        routing.routing_from_bitmatrix(bad, weights, ids, 4, 2)
    with pytest.raises(SpecError, match=r"expt_indx must be \(n_tokens, n_expts_act=3\)"):
        routing.routing_from_bitmatrix(good, weights, ids, 4, 3)


# ------------------------------------------------------------------ on the GPU, against triton_kernels <= 3.5

@pytest.mark.gpu
def test_vllm_mxfp4_path_on_triton_kernels_and_ogsgen():
    pytest.importorskip("triton_kernels.routing", reason="triton_kernels <= 3.5 is not importable: "
                                                         "bench/fetch_peers.py")
    t = checkpoint_moe("cuda", tokens=256, hidden=512, inter=256, experts=8)
    gating_output = (t["x"] @ t["wg"]).float() + t["bg"]
    outputs = {}
    for prefix in ("triton_kernels", OURS):
        w13, w2, quant = vllm_prepare(prefix, t)
        outputs[prefix] = vllm_moe_forward(prefix, t["x"], w13, w2, gating_output, 4, quant)
    reference = reference_layer(t, ogsgen.routing(gating_output, 4))
    assert_close(reference, outputs["triton_kernels"].float(), maxtol=3e-2, what="triton_kernels")
    assert_close(reference, outputs[OURS].float(), maxtol=3e-2, what="ogsgen")
