"""What the tests of ogsgen.compat's three triton_kernels generations share: checkpoint-style mxfp4 MoE weights (as
gpt-oss's checkpoint and vLLM's loader hold them), vLLM's mxfp4 weight preparation and the torch reference of the
layer. Caller code is written here from the callers' documented call patterns (docs/compat.md names them)."""
import importlib
import importlib.util

import torch

import ogsgen
from ogsgen.numerics import dequantize_mx_torch, quantize_mx_torch
from ogsgen.types import PrecisionConfig

ALPHA, LIMIT = 1.702, 7.0


def library(prefix: str, *names: str):
    """The modules ``prefix.name`` of one library generation (triton_kernels or an ogsgen.compat package)."""
    return [importlib.import_module(f"{prefix}.{name}") for name in names]


def checkpoint_moe(device, tokens=16, hidden=64, inter=32, experts=4):
    """A gpt-oss-style MoE layer's tensors: x, the router (hidden, experts) and its bias, and the experts' mxfp4
    weights as the checkpoint stores them, (E, out, in // 2) uint8 values with (E, out, in // 32) e8m0 scales, gate
    and up interleaved along w13's out; float32 biases; and the weights they decode to, (E, in, out), for the
    reference."""
    def mxfp4(shape, scale):
        values, scales = quantize_mx_torch(torch.randn(*shape, device=device) * scale, "e2m1", axis=-1)
        return values, scales, dequantize_mx_torch(values, scales, "e2m1", axis=-1).mT
    w13, w13_scale, w13_ref = mxfp4((experts, 2 * inter, hidden), hidden ** -0.5)
    w2, w2_scale, w2_ref = mxfp4((experts, hidden, inter), inter ** -0.5)
    return dict(x=torch.randn(tokens, hidden, device=device).bfloat16(),
                wg=(torch.randn(hidden, experts, device=device) * hidden ** -0.5).bfloat16(),
                bg=torch.randn(experts, device=device),
                w13=w13, w13_scale=w13_scale, w13_bias=torch.randn(experts, 2 * inter, device=device),
                w2=w2, w2_scale=w2_scale, w2_bias=torch.randn(experts, hidden, device=device),
                w13_ref=w13_ref, w2_ref=w2_ref)


def reference_layer(t, routing):
    """The layer in float32 on the decoded weights for ogsgen's ``routing`` (routing data, gather and scatter
    indices): SwiGLU, the top-k sum of rows rounded to bf16 (as the kernels store them before summing)."""
    routing_data, gather_indx, scatter_indx = routing
    fp32 = PrecisionConfig(out_dtype=torch.float32)
    act = ogsgen.FusedActivation(ogsgen.swiglu, (ALPHA, LIMIT))
    h = ogsgen.matmul_ogs_torch(t["x"], t["w13_ref"], t["w13_bias"], routing_data, gather_indx, fused_activation=act)
    return ogsgen.matmul_ogs_torch(h, t["w2_ref"], t["w2_bias"], routing_data, scatter_indx=scatter_indx,
                                   gammas=routing_data.gate_scal, precision_config=fp32,
                                   round_y=lambda rows: rows.bfloat16().float())


def swizzle_mxfp4(prefix, quant_tensor, scale, num_warps=4, sm90=False):
    """vLLM's mxfp4 weight preparation for the OAI Triton MoE (its mxfp4_utils' _swizzle_mxfp4): checkpoint (E, out,
    in // 2) values and (E, out, in // 32) scales, transposed to put the quantized axis at dim 1, wrapped, and
    converted to the default layouts of the GPU. ``sm90``: as on compute capability 9.0, where vLLM pads the scales'
    K groups with zeros to a multiple of 4 (gpt-oss: 90 -> 92)."""
    tensor, layout, numerics = library(prefix, "tensor", "tensor_details.layout", "numerics")
    value_layout, value_layout_opts = layout.make_default_matmul_mxfp4_w_layout(mx_axis=1)
    scale_layout, scale_layout_opts = layout.make_default_matmul_mxfp4_w_scale_layout(mx_axis=1, num_warps=num_warps)
    if sm90:
        scale = torch.nn.functional.pad(scale, (0, -scale.shape[-1] % 4))
    quant_tensor, scale = quant_tensor.transpose(-2, -1), scale.transpose(-2, -1)
    quant_tensor = tensor.convert_layout(tensor.wrap_torch_tensor(quant_tensor, dtype=tensor.FP4), value_layout,
                                         **value_layout_opts)
    scale = tensor.convert_layout(tensor.wrap_torch_tensor(scale), scale_layout, **scale_layout_opts)
    return quant_tensor, numerics.InFlexData(), scale


def vllm_prepare(prefix, t, sm90=False):
    """vLLM's Mxfp4MoEMethod.process_weights_after_loading for the Triton backend: (w13, w2, its quant config's
    precisions and biases); the scales in ``weight_scale``, or in the matmul generation (no ``matmul_ogs``, vLLM's
    "3.8") in ``b_mx_scale``. ``sm90``: as on compute capability 9.0 (swizzle_mxfp4)."""
    matmul_generation = importlib.util.find_spec(f"{prefix}.matmul_ogs") is None
    (mo,) = library(prefix, "matmul" if matmul_generation else "matmul_ogs")

    def precision(scale, flex):
        scales = {"b_mx_scale": scale, "b_microblock_size": 32} if matmul_generation else {"weight_scale": scale}
        return mo.PrecisionConfig(**scales, flex_ctx=mo.FlexCtx(rhs_data=flex))
    w13, w13_flex, w13_scale = swizzle_mxfp4(prefix, t["w13"], t["w13_scale"], sm90=sm90)
    w2, w2_flex, w2_scale = swizzle_mxfp4(prefix, t["w2"], t["w2_scale"], sm90=sm90)
    return w13, w2, {"w1_precision": precision(w13_scale, w13_flex), "w2_precision": precision(w2_scale, w2_flex),
                     "w1_bias": t["w13_bias"], "w2_bias": t["w2_bias"]}


def vllm_fused_experts(prefix, hidden_states, w1, w2, routing_data, gather_indx, scatter_indx, topk, quant):
    """vLLM's triton_kernel_fused_experts: SwiGLU fused into the first matmul, written into 3-D buffers; the
    activation's reduction_n in FnSpecs where the library has SparseMatrix (>= 3.6), in FusedActivation before."""
    mo, swiglu, tensor = library(prefix, "matmul_ogs", "swiglu", "tensor")
    M, K = hidden_states.shape
    E, _, N = w1.shape
    intermediate_cache = torch.empty((1, M * topk, N // 2), device=hidden_states.device, dtype=hidden_states.dtype)
    output_tensor = torch.empty((1, M, K), device=hidden_states.device, dtype=hidden_states.dtype)
    if hasattr(tensor, "SparseMatrix"):
        act = mo.FusedActivation(mo.FnSpecs("swiglu", swiglu.swiglu_fn, ("alpha", "limit"), reduction_n=2),
                                 (ALPHA, LIMIT))
    else:
        act = mo.FusedActivation(mo.FnSpecs("swiglu", swiglu.swiglu_fn, ("alpha", "limit")), (ALPHA, LIMIT), 2)
    mo.matmul_ogs(hidden_states, w1, quant["w1_bias"], routing_data, gather_indx=gather_indx,
                  precision_config=quant["w1_precision"], gammas=None, fused_activation=act, y=intermediate_cache)
    mo.matmul_ogs(intermediate_cache.view(M * topk, N // 2), w2, quant["w2_bias"], routing_data,
                  scatter_indx=scatter_indx, precision_config=quant["w2_precision"], gammas=routing_data.gate_scal,
                  y=output_tensor)
    return output_tensor.view(M, K)


def pack_bitmatrix(topk_ids, n_experts):
    """vLLM's packing of top-k ids into bitmatrix words (its Triton kernel, in torch): bit e % 32 of word e // 32
    for each expert e of a row, -1 ids left out; uint32 (n_rows, cdiv(n_experts, 32))."""
    n_words = -(-n_experts // 32)
    words = torch.zeros(topk_ids.shape[0], n_words, dtype=torch.int64, device=topk_ids.device)
    for slot in range(topk_ids.shape[1]):
        ids = topk_ids[:, slot].long()
        bit = torch.where(ids >= 0, torch.ones_like(ids) << (ids.clamp_min(0) % 32), 0)
        words.scatter_add_(1, (ids.clamp_min(0) // 32)[:, None], bit[:, None])
    return words.to(torch.int32).view(torch.uint32)
