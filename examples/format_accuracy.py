"""The accuracy of each format path of a gpt-oss-shaped MoE MLP, against the same layer in float64.

    python examples/format_accuracy.py                          # the table of docs/formats.md, on a GPU
    python examples/format_accuracy.py --write docs/formats.md  # ... and rewrite it there
    TRITON_INTERPRET=1 python examples/format_accuracy.py       # on the CPU (a few minutes)

The layer: top-k routing -> w1 (gather, + bias, SwiGLU(1.702, 7.0)) -> h -> w2 (+ bias, times the gates, scattered
and summed), gpt-oss's structure at a width the CPU runs in minutes (the errors are relative ones of sums over K,
which change little with the width: see --hidden). Every path starts from the same float32 weights and bf16 x; its
error is the output's against the float64 layer of those weights and x ("layer"), and against the float64 layer of
the weights as the path stores them ("own weights": what the activation and intermediate formats add).

Weights (E, out, in): per output channel a scale 0.02 * 2**N(0, 0.5**2), times Student-t values of 5 degrees of
freedom (trained weights' heavier-than-Gaussian tails): mxfp4's e8m0 block codes 119-124, three quarters of them
120-122 (--codes prints the histogram). x: Gaussian values, per hidden channel a gain 2**N(0, 0.5**2), one channel in
256 eight times larger (the outlier features of LLM hidden states, a fifth of the squared norm at any width).
"""
import argparse
import re
from pathlib import Path

import torch

import ogsgen
from ogsgen.numerics import quantize_fp8, quantize_mx

SWIGLU_ARGS = (1.702, 7.0)
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# (name, weights format, x format): x "mxfp8" makes h mxfp8 too (w1 writes it, w2 reads it), x "e4m3 per row" makes
# h e4m3 per row too (quantize_fp8 before each matmul), else h is bf16
PATHS = [("bf16 x, bf16 w", "bf16", "bf16"), ("bf16 x, mxfp8 w", "mxfp8e4m3", "bf16"),
         ("bf16 x, mxfp4 w", "mxfp4", "bf16"), ("bf16 x, fp8e4m3 w (per-expert scale)", "fp8e4m3", "bf16"),
         ("fp8e4m3_b128 (x quantized per row and 128 columns)", "fp8e4m3_b128", "bf16"),
         ("mxfp8 x, bf16 w", "bf16", "mxfp8"), ("mxfp8 x, mxfp8 w", "mxfp8e4m3", "mxfp8"),
         ("mxfp8 x, mxfp4 w", "mxfp4", "mxfp8"), ("e4m3 x (per row), mxfp4 w", "mxfp4", "e4m3 per row")]
START, END = "<!-- format accuracy table: examples/format_accuracy.py -->", "<!-- end of the format accuracy table -->"


def checkpoint_weights(experts, out, inp, generator):
    channel = 0.02 * torch.exp2(torch.randn(experts, out, 1, generator=generator) * 0.5)
    chi2 = sum(torch.randn(experts, out, inp, generator=generator) ** 2 for _ in range(5))
    return channel * torch.randn(experts, out, inp, generator=generator) / (chi2 / 5).sqrt()   # Student-t, 5 dof


def activations(tokens, hidden, generator):
    gain = torch.exp2(torch.randn(hidden, generator=generator) * 0.5)
    gain[torch.randperm(hidden, generator=generator)[:max(1, hidden // 256)]] *= 8
    return (torch.randn(tokens, hidden, generator=generator) * gain).bfloat16()


def layer_float64(x, logits, w1, b1, w2, b2, top_k):
    """The layer in float64, from weights (E, K, N) in the kernels' order (w1's gate/linear columns interleaved)."""
    weights, experts = torch.topk(logits, top_k, dim=-1)
    weights = torch.softmax(weights, dim=-1).double()
    out = torch.zeros(x.shape[0], w2.shape[-1], dtype=torch.float64, device=x.device)
    for expert in range(w1.shape[0]):
        token, slot = torch.nonzero(experts == expert, as_tuple=True)
        if token.numel():
            h = ogsgen.swiglu_torch(x[token].double() @ w1[expert].double() + b1[expert].double(), *SWIGLU_ARGS)
            out.index_add_(0, token, (h @ w2[expert].double() + b2[expert].double()) * weights[token, slot, None])
    return out


def run_path(x, logits, w1, w2, top_k, x_format):
    rd, gi, si = ogsgen.routing(logits, top_k)
    swiglu = ogsgen.FusedActivation(ogsgen.swiglu, SWIGLU_ARGS)
    if x_format == "mxfp8":
        x_values, x_scales = quantize_mx(x, "e4m3")
        h_scales = torch.empty(gi.src_indx.numel(), -(-w1.w.shape[-1] // 64), dtype=torch.uint8, device=x.device)
        h = ogsgen.matmul_ogs(x_values, w1.w, w1.bias, rd, gather_indx=gi, fused_activation=swiglu,
                              precision_config=w1.precision_config(act_scale=x_scales, out_scale=h_scales))
        pc2 = w2.precision_config(act_scale=h_scales)
    elif x_format == "e4m3 per row":
        x_values, x_scales = quantize_fp8(x, (1, 0))
        h = ogsgen.matmul_ogs(x_values, w1.w, w1.bias, rd, gather_indx=gi, fused_activation=swiglu,
                              precision_config=w1.precision_config(act_scale=x_scales))
        h, h_scales = quantize_fp8(h, (1, 0))
        pc2 = w2.precision_config(act_scale=h_scales)
    else:
        h = ogsgen.matmul_ogs(x, w1.w, w1.bias, rd, gather_indx=gi, fused_activation=swiglu,
                              precision_config=w1.precision_config())
        pc2 = w2.precision_config()
    return ogsgen.matmul_ogs(h, w2.w, w2.bias, rd, scatter_indx=si, gammas=rd.gate_scal, precision_config=pc2)


def relative_errors(out, ref):
    diff = out.double() - ref
    return (diff.pow(2).mean().sqrt() / ref.pow(2).mean().sqrt()).item(), (diff.abs().max() / ref.abs().max()).item()


def accuracy_table(tokens=128, hidden=512, intermediate=512, experts=8, top_k=4, seed=0):
    """Markdown rows: path, relative rms and max errors against the float64 layer, rms against its own weights."""
    generator = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    gate_up = checkpoint_weights(experts, 2 * intermediate, hidden, generator)
    down = checkpoint_weights(experts, hidden, intermediate, generator)
    b1, b2 = torch.randn(experts, 2 * intermediate, generator=generator) * 0.1, \
        torch.randn(experts, hidden, generator=generator) * 0.1
    x, logits = activations(tokens, hidden, generator), torch.randn(tokens, experts, generator=generator)
    # (drawn on the CPU, the same numbers on any device)
    gate_up, down, b1, b2, x, logits = (t.to(DEVICE) for t in (gate_up, down, b1, b2, x, logits))
    exact = {}
    rows = ["| path | w1, w2 | x | h | rms error (layer) | max error (layer) | rms error (own weights) |",
            "|---|---|---|---|---|---|---|"]
    for name, w_format, x_format in PATHS:
        w1 = ogsgen.prepare_expert_weights(gate_up, b1, gate_up="concatenated", format=w_format)
        w2 = ogsgen.prepare_expert_weights(down, b2, format=w_format)
        if not exact:  # the float64 layer of the float32 weights (the kernels' column order, as any path's)
            plain = [ogsgen.prepare_expert_weights(w, b, gate_up=g, format="fp32") for w, b, g in
                     ((gate_up, b1, "concatenated"), (down, b2, None))]
            exact["ref"] = layer_float64(x, logits, plain[0].w, plain[0].bias, plain[1].w, plain[1].bias, top_k)
        out = run_path(x, logits, w1, w2, top_k, x_format)
        own = layer_float64(x, logits, w1.dequantize(), w1.bias, w2.dequantize(), w2.bias, top_k)
        rms, largest = relative_errors(out, exact["ref"])
        own_rms, _ = relative_errors(out, own)
        h_format = "bf16" if x_format == "bf16" else x_format
        rows.append(f"| {name} | {w_format} | {x_format} | {h_format} | {rms:.2e} | {largest:.2e} | {own_rms:.2e} |")
    return "\n".join(rows)


def code_histogram(hidden, intermediate, experts, seed=0):
    """The e8m0 codes mxfp4 gives the model's weights: {code: share}."""
    generator = torch.Generator().manual_seed(seed)
    w = checkpoint_weights(experts, 2 * intermediate, hidden, generator)
    codes = ogsgen.numerics.quantize_mx_torch(w, "e2m1", axis=-1)[1].flatten()
    values, counts = codes.unique(return_counts=True)
    return {int(v): c.item() / codes.numel() for v, c in zip(values, counts)}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--hidden", type=int, default=512, help="hidden and intermediate width (gpt-oss: 2880)")
    parser.add_argument("--experts", type=int, default=8)
    parser.add_argument("--top-k", type=int, default=4)
    parser.add_argument("--codes", action="store_true", help="print the weights' e8m0 code histogram")
    parser.add_argument("--write", type=Path, help="replace the table in this markdown file")
    args = parser.parse_args()
    if args.codes:
        print(" ".join(f"{code}: {share:.1%}" for code, share in code_histogram(args.hidden, args.hidden,
                                                                                args.experts).items()))
    table = accuracy_table(args.tokens, args.hidden, args.hidden, args.experts, args.top_k)
    print(table)
    if args.write:
        text = args.write.read_text()
        new = re.sub(re.escape(START) + r".*?" + re.escape(END), lambda _: f"{START}\n{table}\n{END}", text,
                     flags=re.S)
        if new == text and table not in text:
            raise SystemExit(f"{args.write}: no table between {START!r} and {END!r}")
        args.write.write_text(new)


if __name__ == "__main__":
    main()
