"""A DeepSeek-V3-shaped MoE layer from an fp8 checkpoint, through generated kernels, checked against plain torch.

    python examples/deepseek_fp8_layer.py                          # on a Hopper GPU (DeepSeek-V3's expert shapes)
    TRITON_INTERPRET=1 python examples/deepseek_fp8_layer.py       # on the CPU (small sizes)
    ... --format fp8e4m3_channel                                    # per-channel weights (llm-compressor's FP8-Dynamic)

The checkpoint stores each expert's weights as DeepSeek-V3 does: e4m3 values (E, out, in), gate and up projections
concatenated along out in w13, and `weight_scale_inv` of one float32 scale per 128 x 128 block (E, out / 128,
in / 128); with --format fp8e4m3_channel, one scale per output column (E, out). `prepare_expert_weights` takes them
as they are (w2 without a copy); matmul_ogs quantizes the bf16 activations per row and 128 columns (per row).
With b128 weights, w13 writes its activation's output already quantized for w2 (e4m3 and a scale per row and 128
columns: its out_scale), so no bf16 intermediate reaches memory.

top-k routing -> w13 (gather tokens to experts, fused SiLU-and-mul: DeepSeek's silu(gate) * up) -> w2 (times the
gates, scattered and summed).
"""
import argparse

import torch

import ogsgen
from ogsgen.numerics import FP8_BLOCK, dequantize_fp8_torch, quantize_fp8_torch
from ogsgen.testing import assert_close

def checkpoint_weights(experts, out, inp, fmt, device):
    """(e4m3 values (E, out, in), their scales) as an fp8 checkpoint stores them."""
    dense = torch.randn(experts, out, inp, device=device) / inp ** 0.5
    block = (FP8_BLOCK, FP8_BLOCK) if fmt == "fp8e4m3_b128" else (1, 0)
    values, scales = quantize_fp8_torch(dense, block)
    return values, (scales if fmt == "fp8e4m3_b128" else scales[..., 0])   # (E, out) per-channel scales


def activation_block(fmt):
    return (1, FP8_BLOCK) if fmt == "fp8e4m3_b128" else (1, 0)


def moe_layer(x, logits, w13, w2, top_k, fmt):
    routing_data, gather_indx, scatter_indx = ogsgen.routing(logits, top_k)
    silu_and_mul = ogsgen.FusedActivation(ogsgen.silu_and_mul)
    h_fields, h_scale = {}, {}
    if fmt == "fp8e4m3_b128":  # h written as w2's e4m3 input: a float32 scale per row and 128 columns
        scales = torch.empty(x.shape[0] * top_k, -(-w2.w.shape[-2] // FP8_BLOCK), device=x.device)
        h_fields, h_scale = dict(out_scale=scales), dict(act_scale=scales)
    h = ogsgen.matmul_ogs(x, w13.w, None, routing_data, gather_indx=gather_indx, fused_activation=silu_and_mul,
                          precision_config=w13.precision_config(**h_fields))
    return ogsgen.matmul_ogs(h, w2.w, None, routing_data, scatter_indx=scatter_indx, gammas=routing_data.gate_scal,
                             precision_config=w2.precision_config(**h_scale))


def moe_layer_torch(x, logits, w13, w2, top_k, fmt):
    """The same layer token by expert in float64 from the checkpoint's dequantized weights, activations quantized as
    the format says (the intermediate from float32 with b128, which w13 quantizes itself; else kept in bf16 first,
    as the layer keeps it)."""
    weights, experts = torch.topk(logits, top_k, dim=-1)
    weights = torch.softmax(weights, dim=-1).double()
    block = activation_block(fmt)
    quantized = lambda t: dequantize_fp8_torch(*quantize_fp8_torch(t.float(), block), block).double()  # noqa: E731
    gate, up = w13.dequantize(checkpoint_order=True).double().chunk(2, dim=1)   # (E, inter, hidden) each
    w2_ck = w2.dequantize(checkpoint_order=True).double()                       # (E, hidden, inter)
    x_q = quantized(x)
    out = torch.zeros(x.shape[0], w2_ck.shape[1], dtype=torch.float64, device=x.device)
    for expert in range(gate.shape[0]):
        token, slot = torch.nonzero(experts == expert, as_tuple=True)
        if token.numel():
            h = torch.nn.functional.silu(x_q[token] @ gate[expert].mT) * (x_q[token] @ up[expert].mT)
            h = h.float() if fmt == "fp8e4m3_b128" else h.bfloat16()
            out.index_add_(0, token, (quantized(h) @ w2_ck[expert].mT) * weights[token, slot, None])
    return out


def main():
    parser = argparse.ArgumentParser()
    on_gpu = torch.cuda.is_available()
    parser.add_argument("--format", default="fp8e4m3_b128", choices=["fp8e4m3_b128", "fp8e4m3_channel"])
    parser.add_argument("--tokens", type=int, default=256 if on_gpu else 24)
    parser.add_argument("--hidden", type=int, default=7168 if on_gpu else 256)
    parser.add_argument("--intermediate", type=int, default=2048 if on_gpu else 128)
    parser.add_argument("--experts", type=int, default=32 if on_gpu else 8)   # DeepSeek-V3: 256 (memory)
    parser.add_argument("--top-k", type=int, default=8 if on_gpu else 2)
    args = parser.parse_args()
    device, fmt = ("cuda" if on_gpu else "cpu"), args.format
    torch.manual_seed(0)
    t, hid, inter, e = args.tokens, args.hidden, args.intermediate, args.experts
    w13_values, w13_scales = checkpoint_weights(e, 2 * inter, hid, fmt, device)   # [gate; up] along out
    w2_values, w2_scales = checkpoint_weights(e, hid, inter, fmt, device)
    w13 = ogsgen.prepare_expert_weights(w13_values, weight_scale=w13_scales, gate_up="concatenated", format=fmt)
    w2 = ogsgen.prepare_expert_weights(w2_values, weight_scale=w2_scales, format=fmt)
    assert w2.w.data_ptr() == w2_values.data_ptr(), "the checkpoint's w2 is read in place"
    x = torch.randn(t, hid, device=device).bfloat16()
    logits = torch.randn(t, e, device=device)

    out = moe_layer(x, logits, w13, w2, args.top_k, fmt)
    # fp8e4m3_b128 promotes the tensor cores' sums into fp32 every 128 K values; fp8e4m3_channel sums all of K in them,
    # within 2**-12 of sum |x * w| (docs/formats.md, "fp8 dots on Hopper"): over K = 7168 that is percents of y.
    # (precision_config(max_num_imprecise_acc=128) would promote it too, at a cost in speed.)
    rmstol = 3e-2 if fmt == "fp8e4m3_channel" and on_gpu else 5e-3
    assert_close(moe_layer_torch(x, logits, w13, w2, args.top_k, fmt), out, maxtol=max(2e-2, rmstol), rmstol=rmstol,
                 what="the layer's output")
    print(f"{fmt} MoE layer ({t} tokens, {e} experts, top-{args.top_k}, hidden {hid}, intermediate {inter}) "
          f"matches torch")


if __name__ == "__main__":
    main()
