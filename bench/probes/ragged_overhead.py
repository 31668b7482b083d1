"""Probe (GPU): where a large-batch mxfp4 MoE call spends its time beyond the K loop, for ogsgen and triton_kernels
on the same inputs: the bench's call (random routing, scatter + gammas + the top-k reduce, or the gather), the same
routing without scatter/gather (the matmul kernel alone), a balanced routing (every expert exactly the mean row
count: no partial row tiles), and the batched problem (experts as batch entries, rows per expert = that mean).

    PYTHONPATH=.:bench:third_party python bench/probes/ragged_overhead.py --out DIR [--cases "gpt-oss w2:8192" ...]
"""
import argparse
import sys
from pathlib import Path

import torch
from triton.testing import do_bench_cudagraph

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench_moe import MOE_SHAPES, triton_kernels_mxfp4, triton_kernels_or_none, write_csv  # noqa: E402

import ogsgen  # noqa: E402
from ogsgen.numerics import quantize_mx, swizzle_mx_values  # noqa: E402


def median_us(fn):
    return round(do_bench_cudagraph(fn, rep=200, return_mode="median") * 1e3, 1)


def balanced_logits(tokens, n_expts, top_k, device):
    """Logits whose top-k gives every expert tokens * top_k / n_expts rows: token t picks experts t*k .. t*k+k-1."""
    ids = (torch.arange(tokens, device=device)[:, None] * top_k + torch.arange(top_k, device=device)) % n_expts
    return torch.zeros(tokens, n_expts, device=device).scatter_(1, ids, 10.0) + torch.rand(tokens, n_expts,
                                                                                            device=device)


def mxfp4_case(case):
    """"gpt-oss w2:8192" -> (tokens, the shape's (n_expts, top_k, k, n, mode), bf16 weights (E, K, N), and their
    mxfp4 values and scales quantized along K), the weights seeded alike for every probe."""
    name, tokens = case.rsplit(":", 1)
    shape = MOE_SHAPES[name]
    n_expts, _, k, n, _ = shape
    torch.manual_seed(0)
    dense_w = torch.randn(n_expts, k, n, device="cuda").bfloat16()
    return int(tokens), shape, dense_w, *quantize_mx(dense_w.mT.contiguous(), "e2m1", axis=-1)


def peer_routing(tk_routing, logits, top_k, mode):
    """triton_kernels' routing of the logits and its call's gather, or scatter and gammas, keywords."""
    t_rd, t_gi, t_si = tk_routing.routing(logits, top_k)
    return t_rd, (dict(gather_indx=t_gi) if mode == "gather" else dict(scatter_indx=t_si,
                                                                     gammas=t_rd.gate_scal.float()))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--cases", nargs="+", default=["gpt-oss w2:8192", "gpt-oss w1:8192", "DeepSeek-V3 w1:8192"])
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    tk = triton_kernels_or_none()
    rows = []
    for case in args.cases:
        tokens, (n_expts, top_k, k, n, mode), dense_w, values, scales = mxfp4_case(case)
        w, pc = swizzle_mx_values(values.mT), ogsgen.PrecisionConfig(weight_scale=scales.mT.contiguous())
        t_w, t_pc, _ = triton_kernels_mxfp4(dense_w) if tk else (None, None, None)
        x_tokens = torch.randn(tokens, k, device="cuda").bfloat16()
        per_expert = tokens * top_k // n_expts
        for routing_name, logits in (("random", torch.randn(tokens, n_expts, device="cuda")),
                                     ("balanced", balanced_logits(tokens, n_expts, top_k, "cuda"))):
            rd, gi, si = ogsgen.routing(logits, top_k)
            x = x_tokens if mode == "gather" else torch.randn(tokens * top_k, k, device="cuda").bfloat16()
            full = dict(gather_indx=gi) if mode == "gather" else dict(scatter_indx=si, gammas=rd.gate_scal.float())
            row_tiles = int(((rd.expt_hist + 127) // 128).sum())
            row = dict(case=case, routing=routing_name, row_tiles_128=row_tiles, max_rows=int(rd.expt_hist.max()))
            x_plain = x if mode != "gather" else x_tokens[gi.src_indx.long() // top_k].contiguous()
            row["ogsgen_full_us"] = median_us(lambda: ogsgen.matmul_ogs(x, w, None, rd, precision_config=pc, **full))
            row["ogsgen_kernel_us"] = median_us(lambda: ogsgen.matmul_ogs(x_plain, w, None, rd, precision_config=pc))
            if tk:
                tk_matmul, tk_routing = tk
                t_rd, t_full = peer_routing(tk_routing, logits, top_k, mode)
                row["tk_full_us"] = median_us(lambda: tk_matmul.matmul_ogs(x, t_w, None, t_rd, precision_config=t_pc,
                                                                           **t_full))
                row["tk_kernel_us"] = median_us(lambda: tk_matmul.matmul_ogs(x_plain, t_w, None, t_rd,
                                                                             precision_config=t_pc))
            print(row, flush=True)
            rows.append(row)
        x3 = torch.randn(n_expts, per_expert, k, device="cuda").bfloat16()
        row = dict(case=case, routing="batched", row_tiles_128=n_expts * -(-per_expert // 128), max_rows=per_expert)
        row["ogsgen_kernel_us"] = median_us(lambda: ogsgen.matmul_ogs(x3, w, None, precision_config=pc))
        if tk:
            try:
                row["tk_kernel_us"] = median_us(lambda: tk[0].matmul_ogs(x3, t_w, None, precision_config=t_pc))
            except Exception as exc:
                row["tk_error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
        print(row, flush=True)
        rows.append(row)
        write_csv(rows, args.out / "ragged_overhead.csv")
        del dense_w, values, scales, w, t_w, x3
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
