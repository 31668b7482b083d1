"""Probe (GPU): the Gluon mxfp4 kernel of gluon_mx.py against ogsgen's generated kernel on batched problems of the
MoE shapes (rows per expert as at T=8192), same inputs: agreement and time (CUDA graphs, median).

    PYTHONPATH=.:bench python bench/probes/gluon_mx_probe.py --out DIR [--stages 2 3 4]
"""
import argparse
import csv
import sys
from pathlib import Path

import torch
import triton

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gluon_mx import mx_gluon  # noqa: E402

import ogsgen  # noqa: E402
from ogsgen.numerics.layouts import swizzle_mx_values  # noqa: E402

CASES = {  # name: (experts, rows per expert, K, N)
    "gpt-oss w2 T=8192": (128, 256, 2880, 2880),
    "gpt-oss w1 T=8192": (128, 256, 2880, 5760),
    "DeepSeek-V3 w1 T=8192": (256, 256, 7168, 4096),
    "gpt-oss w2 T=2048": (128, 64, 2880, 2880),
}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--stages", type=int, nargs="+", default=[3])
    parser.add_argument("--cases", nargs="+", default=list(CASES))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for name in args.cases:
        e, m, k, n = CASES[name]
        torch.manual_seed(0)
        values = torch.randint(0, 256, (e, k // 2, n), dtype=torch.uint8, device="cuda")
        w = swizzle_mx_values(values)
        scales = torch.randint(119, 127, (e, n, k // 32), dtype=torch.uint8, device="cuda").mT.contiguous()
        x = torch.randn(e, m, k, device="cuda").to(torch.bfloat16)
        pc = ogsgen.PrecisionConfig(weight_scale=scales)
        flops = 2 * e * m * n * k
        with ogsgen.opt_flags_constraints(block_m=128, block_n=256, block_k=128, num_warps=8, num_stages=4):
            def ours():
                return ogsgen.matmul_ogs(x, w, None, precision_config=pc)
            ref = ours()
            t_ours = triton.testing.do_bench_cudagraph(ours, rep=200, return_mode="median")
        row = dict(case=name, ogsgen_us=round(t_ours * 1e3, 1), ogsgen_tflops=round(flops / t_ours / 1e9, 1))
        for stages in args.stages:
            try:
                y = mx_gluon(x, w.data, scales, n, stages=stages)
                err = ((y.float() - ref.float()).abs().max() / ref.float().abs().max()).item()
                t = triton.testing.do_bench_cudagraph(lambda: mx_gluon(x, w.data, scales, n, stages=stages), rep=200, return_mode="median")
                row.update({f"gluon_s{stages}_us": round(t * 1e3, 1), f"gluon_s{stages}_tflops": round(flops / t / 1e9, 1),
                            f"gluon_s{stages}_speedup": round(t_ours / t, 3), f"gluon_s{stages}_maxrelerr": f"{err:.2e}"})
            except Exception as exc:  # a config that does not compile or fit
                row[f"gluon_s{stages}_error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
        print(row, flush=True)
        rows.append(row)
        del values, w, scales, x, ref
        torch.cuda.empty_cache()
    keys = sorted({key for row in rows for key in row}, key=lambda key: (key != "case", key))
    with open(args.out / "gluon_mx_probe.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=keys)
        writer.writeheader()
        writer.writerows(rows)


if __name__ == "__main__":
    main()
