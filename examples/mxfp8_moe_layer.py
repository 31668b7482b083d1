"""A gpt-oss-style MoE MLP with MX activations: mxfp8 x, mxfp4 weights, and no bf16 intermediate in memory,
through generated kernels, checked against a float64 torch layer.

    python examples/mxfp8_moe_layer.py                      # on a CUDA GPU (gpt-oss-120b's expert shapes)
    TRITON_INTERPRET=1 python examples/mxfp8_moe_layer.py   # on the CPU (small sizes)

x (bf16) -> quantize_mx(x, "e4m3"): e4m3 values and one e8m0 scale per 32 columns
-> w1 (gather tokens to experts, + bias, fused SwiGLU), written as mxfp8: e4m3 values and precision_config.out_scale
-> w2 (x: those values, act_scale: those scales; + bias, times the gate weights, scattered back and summed).
"""
import argparse

import torch

import ogsgen
from ogsgen.numerics import dequantize_mx_torch, quantize_mx, quantize_mx_torch
from ogsgen.testing import assert_close

SWIGLU_ARGS = (1.702, 7.0)


def moe_mlp(x, logits, w1, w2, top_k):
    """The layer's two matmuls; x is bf16, the hidden rows between them mxfp8 (1 byte a value, plus a scale byte
    per 32)."""
    routing_data, gather_indx, scatter_indx = ogsgen.routing(logits, top_k)
    x_values, x_scales = quantize_mx(x, "e4m3")                 # (T, H) e4m3, (T, H / 32) e8m0
    inter = w1.w.shape[-1] // 2
    h_scales = torch.empty(gather_indx.src_indx.numel(), -(-inter // 32), dtype=torch.uint8, device=x.device)
    h = ogsgen.matmul_ogs(x_values, w1.w, w1.bias, routing_data, gather_indx=gather_indx,
                          fused_activation=ogsgen.FusedActivation(ogsgen.swiglu, SWIGLU_ARGS),
                          precision_config=w1.precision_config(act_scale=x_scales, out_scale=h_scales))
    out = ogsgen.matmul_ogs(h, w2.w, w2.bias, routing_data, scatter_indx=scatter_indx,
                            gammas=routing_data.gate_scal, precision_config=w2.precision_config(act_scale=h_scales))
    return out, h


def moe_mlp_torch(x, logits, w1, w2, top_k):
    """The same layer token by expert in float64 from the dequantized weights, x and the hidden rows quantized to
    mxfp8 as the kernels' inputs are."""
    weights, experts = torch.topk(logits, top_k, dim=-1)
    weights = torch.softmax(weights, dim=-1).double()
    mxfp8 = lambda t: dequantize_mx_torch(*quantize_mx_torch(t.float(), "e4m3"), "e4m3").double()  # noqa: E731
    x_q, w1_k, w2_k = mxfp8(x), w1.dequantize().double(), w2.dequantize().double()   # (E, K, N), kernel order
    out = torch.zeros(x.shape[0], w2_k.shape[-1], dtype=torch.float64, device=x.device)
    for expert in range(w1_k.shape[0]):
        token, slot = torch.nonzero(experts == expert, as_tuple=True)
        if token.numel():
            h = ogsgen.swiglu_torch(x_q[token] @ w1_k[expert] + w1.bias[expert].double(), *SWIGLU_ARGS)
            out.index_add_(0, token, (mxfp8(h) @ w2_k[expert] + w2.bias[expert].double()) * weights[token, slot, None])
    return out


def main():
    parser = argparse.ArgumentParser()
    on_gpu = torch.cuda.is_available()
    parser.add_argument("--tokens", type=int, default=512 if on_gpu else 24)
    parser.add_argument("--hidden", type=int, default=2880 if on_gpu else 64)
    parser.add_argument("--intermediate", type=int, default=2880 if on_gpu else 64)
    parser.add_argument("--experts", type=int, default=32 if on_gpu else 8)   # gpt-oss-120b: 128 (memory)
    parser.add_argument("--top-k", type=int, default=4 if on_gpu else 2)
    args = parser.parse_args()
    device = "cuda" if on_gpu else "cpu"
    torch.manual_seed(0)
    t, hid, inter, e = args.tokens, args.hidden, args.intermediate, args.experts
    # Checkpoint-shaped weights (E, out, in): gate and up projections concatenated in w1, as gpt-oss's loaders
    # hand them over; prepare_expert_weights interleaves them for the fused SwiGLU and quantizes to mxfp4.
    w1 = ogsgen.prepare_expert_weights(torch.randn(e, 2 * inter, hid, device=device) / hid ** 0.5,
                                       torch.randn(e, 2 * inter, device=device) * 0.1, gate_up="concatenated",
                                       format="mxfp4")
    w2 = ogsgen.prepare_expert_weights(torch.randn(e, hid, inter, device=device) / inter ** 0.5,
                                       torch.randn(e, hid, device=device) * 0.1, format="mxfp4")
    x = torch.randn(t, hid, device=device).bfloat16()
    logits = torch.randn(t, e, device=device)

    out, h = moe_mlp(x, logits, w1, w2, args.top_k)
    assert h.dtype == torch.float8_e4m3fn, "the hidden rows are mxfp8 values"
    assert_close(moe_mlp_torch(x, logits, w1, w2, args.top_k), out, maxtol=2e-2, rmstol=5e-3,
                 what="the layer's output")
    print(f"mxfp8 x mxfp4 MoE layer ({t} tokens, {e} experts, top-{args.top_k}, hidden {hid}, intermediate "
          f"{inter}; hidden rows in mxfp8) matches torch")


if __name__ == "__main__":
    main()
