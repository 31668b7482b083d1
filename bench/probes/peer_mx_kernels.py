"""Probe: triton_kernels' Hopper mxfp4 kernels against ogsgen's (needs a Hopper GPU and triton_kernels).

    PYTHONPATH=.:third_party python bench/probes/peer_mx_kernels.py --out DIR

triton_kernels feeds its upcast mxfp4 W to wgmma from registers as ogsgen does, yet its outputs were right on
the H200 (bench/results/2026-11-30f). Per case this records triton_kernels' launch parameters and time; then
ogsgen's kernel at those parameters, asynchronous (SASS check off) and as shipped (checked, waiting where the
check finds the hazard), with errors against the float32 reference; and finally every triton_kernels matmul
binary this process compiled, disassembled and checked by ogsgen.runtime.wgmma_hazards. Writes
DIR/peer_mx_kernels.csv and DIR/peer_mx_binaries.csv.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import sys
import tempfile
from pathlib import Path

os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="peer-mx-cache-")  # only this run's binaries

import torch  # noqa: E402
from triton.testing import do_bench_cudagraph  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import bench_moe  # noqa: E402

import ogsgen  # noqa: E402
from ogsgen.runtime import matmul, wgmma_hazards  # noqa: E402
from ogsgen.runtime.opt_flags import TILE_KEYS  # noqa: E402

CASES = [("gpt-oss w1", 256), ("gpt-oss w1", 8192), ("gpt-oss w2", 8192)]



def timed(fn, reference, flops):
    rms, largest = bench_moe.relative_errors(fn(), reference)
    ms = do_bench_cudagraph(fn, rep=100, return_mode="median")
    return dict(us=round(ms * 1e3, 1), tflops=round(flops / ms / 1e9, 1), rms_error=f"{rms:.1e}",
                max_error=f"{largest:.1e}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    tk = bench_moe.triton_kernels_or_none()
    tk_matmul = tk[0]
    chosen = []
    tk_make_opt_flags = tk_matmul.make_opt_flags

    def recording_make_opt_flags(*a, **k):
        chosen.append(tk_make_opt_flags(*a, **k))
        return chosen[-1]
    tk_matmul.make_opt_flags = recording_make_opt_flags
    checked = wgmma_hazards.check_compiled
    rows = []
    for name, tokens in CASES:
        runs = {}
        for impl, fn, flops, _ in bench_moe.moe_cases(name, tokens, "mxfp4", tk):
            runs[impl] = (fn, flops)
        chosen.clear()
        tk_row = dict(case=f"{name} {tokens}", impl="triton_kernels",
                      **timed(runs["triton_kernels"][0], runs["reference triton_kernels"][0]().float(),
                              runs["triton_kernels"][1]))
        flags = chosen[-1]
        tile = (flags.block_m, flags.block_n, flags.block_k, flags.num_warps, flags.num_stages)
        tk_row.update(tile="x".join(map(str, tile)), tk_flags=json.dumps(dataclasses.asdict(flags), default=str))
        rows.append(tk_row)
        print(tk_row, flush=True)
        reference = runs["reference"][0]().float()
        fn, flops = runs["ogsgen"]
        for mode, tile_or_none in (("shipped", None), ("shipped", tile), ("async", None), ("async", tile)):
            row = dict(case=f"{name} {tokens}", impl=f"ogsgen {mode}",
                       tile="heuristic" if tile_or_none is None else "x".join(map(str, tile_or_none)))
            constraints = dict(zip(TILE_KEYS, tile_or_none or ()))
            wgmma_hazards.check_compiled = (lambda compiled: None) if mode == "async" else checked
            matmul.forget_hazard_replacements()

            def run(constraints=constraints):
                with ogsgen.opt_flags_constraints(**constraints):
                    return fn()
            try:
                row.update(timed(run, reference, flops), replaced_by=bench_moe.hazard_replacements())
            except Exception as exc:
                row["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
            rows.append(row)
            print(row, flush=True)
        wgmma_hazards.check_compiled = checked
        bench_moe.write_csv(rows, args.out / "peer_mx_kernels.csv")
        torch.cuda.empty_cache()
    binaries = []
    for meta_path in Path(os.environ["TRITON_CACHE_DIR"]).rglob("*.json"):
        cubin = meta_path.with_suffix(".cubin")
        if not cubin.exists():
            continue
        meta = json.loads(meta_path.read_text())
        if "matmul" not in meta.get("name", "") or meta["name"].startswith("ogs_"):
            continue
        sass = wgmma_hazards.sass_of(cubin.read_bytes())
        binaries.append(dict(kernel=meta["name"], num_warps=meta.get("num_warps"), num_stages=meta.get("num_stages"),
                             shared=meta.get("shared"),
                             register_sourced_hgmma=len(re.findall(r"HGMMA\.\S+\s+R\d+,\s*R\d+,", sass)),
                             hazards=len(wgmma_hazards.find_hazards(sass))))
        print(binaries[-1], flush=True)
    bench_moe.write_csv(binaries, args.out / "peer_mx_binaries.csv")


if __name__ == "__main__":
    sys.exit(main())
