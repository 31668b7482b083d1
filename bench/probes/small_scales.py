"""Probe (GPU): the hopper mxfp4 upcast with one multiply per register (scales recorded <= 2 by bound_mx_scales)
against two (the same scales, unrecorded), on the bench's calls: both outputs must be bit-identical; times with
CUDA graphs, and triton_kernels' on the same routing when importable.

    PYTHONPATH=.:bench:third_party python bench/probes/small_scales.py --out DIR [--cases "gpt-oss w2:8192" ...]
"""
import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench_moe import triton_kernels_mxfp4, triton_kernels_or_none, write_csv  # noqa: E402
from ragged_overhead import median_us, mxfp4_case, peer_routing  # noqa: E402

import ogsgen  # noqa: E402
from ogsgen.numerics import bound_mx_scales, swizzle_mx_values  # noqa: E402

DEFAULT_CASES = [f"{shape}:{tokens}" for shape in ("gpt-oss w2", "gpt-oss w1", "DeepSeek-V3 w1")
                 for tokens in (1, 32, 256, 2048, 8192)]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--cases", nargs="+", default=DEFAULT_CASES)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    tk = triton_kernels_or_none()
    rows = []
    for case in args.cases:
        tokens, (n_expts, top_k, k, n, mode), dense_w, values, scales = mxfp4_case(case)
        w = swizzle_mx_values(values.mT)
        unrecorded = scales.mT.contiguous()
        recorded = unrecorded.clone()
        row = dict(case=case, largest_code=bound_mx_scales(recorded))
        logits = torch.randn(tokens, n_expts, device="cuda")
        rd, gi, si = ogsgen.routing(logits, top_k)
        x = torch.randn(tokens if mode == "gather" else tokens * top_k, k, device="cuda").bfloat16()
        extra = dict(gather_indx=gi) if mode == "gather" else dict(scatter_indx=si, gammas=rd.gate_scal.float())
        calls = {label: (lambda s=s: ogsgen.matmul_ogs(x, w, None, rd, precision_config=ogsgen.PrecisionConfig(
            weight_scale=s), **extra)) for label, s in (("two", unrecorded), ("one", recorded))}
        row["bit_identical"] = bool(torch.equal(calls["two"](), calls["one"]()))
        for label, call in calls.items():
            row[f"{label}_multiply_us"] = median_us(call)
        row["one_vs_two"] = round(row["two_multiply_us"] / row["one_multiply_us"], 3)
        if tk:
            tk_matmul, tk_routing = tk
            t_w, t_pc, _ = triton_kernels_mxfp4(dense_w)
            t_rd, t_extra = peer_routing(tk_routing, logits, top_k, mode)
            row["tk_us"] = median_us(lambda: tk_matmul.matmul_ogs(x, t_w, None, t_rd, precision_config=t_pc,
                                                                  **t_extra))
            row["one_vs_tk"] = round(row["tk_us"] / row["one_multiply_us"], 3)
            del t_w
        print(row, flush=True)
        rows.append(row)
        write_csv(rows, args.out / "small_scales.csv")
        del dense_w, values, scales, w, unrecorded, recorded
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
