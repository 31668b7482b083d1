"""Probe: which launch parameters the matmul_ogs kernels want on this GPU, per shape and weight format.

    PYTHONPATH=. python bench/probes/tile_sweep.py --out OUT [--format bf16|mxfp4|mxfp4-e4m3x|fp8e4m3_b128|...]
        [--cases "gpt-oss w1:256" "dense:64x5760x2880" ...] [--tiles 16x256x128x8x3 16x256x128x8x3w ...] [--in-turn]

Runs matmul_ogs under opt_flags_constraints for each tile; writes OUT/tile_sweep_FORMAT.csv: CUDA-graph medians, each
tile's largest difference from the heuristic's output (relative to its largest magnitude), ``regs`` (registers/spills
per thread) and ``replaced_by`` (an MX binary with ptxas's wgmma register hazard ran this instead: "wait", or a
fallback tile; ogsgen.runtime.wgmma_hazards). Tiles run one after another, or with ``--in-turn`` in turns (three
rounds of 40 ms, median), which spreads the clock drift. A tile's suffixes: "w" its waiting kernel (wait_mma), "p" the
persistent TMA kernel, "t" W^T X^T (swap_ab), "s2" split K in two, "r128" at most 128 registers (maxnreg), "g" the
warp-specialized kernel (fp8e4m3_b128)."""
from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import torch
from triton import knobs
from triton.testing import do_bench_cudagraph

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import bench_moe  # noqa: E402  (the benchmark's case builders)

import ogsgen  # noqa: E402
from ogsgen.runtime import launcher, wgmma_hazards  # noqa: E402
from ogsgen.runtime.opt_flags import TILE_KEYS  # noqa: E402

TILES = [  # block_m, block_n, block_k, num_warps, num_stages
    (128, 128, 64, 8, 3), (128, 128, 64, 8, 4), (128, 256, 64, 8, 3), (128, 256, 64, 8, 4),
    (256, 128, 64, 8, 3), (128, 128, 128, 8, 3), (128, 256, 32, 8, 5), (128, 128, 64, 4, 4), (64, 256, 64, 4, 4),
]
CASES = [("gpt-oss w1", 8192), ("gpt-oss w2", 8192), ("gpt-oss w1", 2048), ("DeepSeek-V3 w1", 8192),
         ("dense", (8192, 8192, 8192)), ("dense", (4096, 5760, 2880))]
# mxfp4: decode-sized row tiles (16) for T <= 256, 128-row tiles at T = 8192; hopper-layout tiles take whole
# 64-row K groups.
MX_DECODE_TILES = [(16, 128, 128, 4, 3), (16, 128, 64, 8, 4), (16, 64, 64, 4, 4), (16, 64, 128, 4, 4),
                   (16, 128, 128, 8, 3), (16, 256, 64, 16, 4), (16, 128, 128, 4, 4)]
MX_LARGE_TILES = [(128, 128, 64, 8, 4), (128, 128, 128, 8, 3), (128, 256, 64, 16, 3), (64, 128, 64, 8, 4),
                  (128, 64, 64, 4, 4), (128, 128, 64, 8, 3), (128, 256, 128, 16, 2)]
MX_CASES = [("gpt-oss w1", 1), ("gpt-oss w1", 256), ("gpt-oss w2", 256), ("gpt-oss w1", 8192),
            ("gpt-oss w2", 8192)]


def sweep(weight_format, cases=None, tiles=None):
    """(case, size, tiles) to time for a weight format (``cases``, ``tiles``: replace the built-in lists)."""
    def builtin(tile_list):
        return [dict(zip(TILE_KEYS, tile), split_k=1) for tile in tile_list]
    if weight_format.startswith("bf16"):
        return [(name, size, tiles or builtin(TILES)) for name, size in cases or CASES]
    return [(name, size, tiles or builtin(MX_DECODE_TILES if size <= 256 else MX_LARGE_TILES))
            for name, size in cases or MX_CASES]


def parse_tile(text):
    """"16x128x128x8x3" -> its opt_flags_constraints; "w" adds wait_mma=True, "p" persistent=True, "t" swap_ab
    (else False, as split_k else 1: no tile keys, so the heuristic's would stay), "s2" split_k=2, "r128" maxnreg=128,
    "g" the warp-specialized kernel (fp8e4m3_b128: 128x128x128x4xSTAGES; else False) (in that order)."""
    match = re.fullmatch(r"(\d+)x(\d+)x(\d+)x(\d+)x(\d+)(w?)(p?)(t?)(?:s(\d+))?(?:r(\d+))?(g?)", text)
    if match is None:
        raise SystemExit(f"--tiles: cannot read {text!r}; write BMxBNxBKxWARPSxSTAGES[w][p][sSPLIT][rMAXNREG][g]")
    *tile, waits, persistent, swap_ab, split_k, maxnreg, warp_specialized = match.groups()
    constraints = dict(zip(TILE_KEYS, map(int, tile)), split_k=int(split_k or 1), swap_ab=bool(swap_ab),
                       warp_specialized=bool(warp_specialized))
    if waits:
        constraints["wait_mma"] = True
    if persistent:
        constraints["persistent"] = True
    if maxnreg:
        constraints["maxnreg"] = int(maxnreg)
    return constraints


def tile_name(tile):
    return ("x".join(str(tile[key]) for key in TILE_KEYS) + ("w" if tile.get("wait_mma") else "")
            + ("p" if tile.get("persistent") else "") + ("t" if tile.get("swap_ab") else "")
            + (f"s{tile['split_k']}" if tile.get("split_k", 1) != 1 else "")
            + (f"r{tile['maxnreg']}" if "maxnreg" in tile else "") + ("g" if tile.get("warp_specialized") else ""))


def parse_case(text):
    """"gpt-oss w2:8" -> ("gpt-oss w2", 8); "dense:64x5760x2880" -> ("dense", (64, 5760, 2880))."""
    name, _, size = text.rpartition(":")
    return (name, tuple(map(int, size.split("x")))) if name == "dense" else (name, int(size))


def case_fn(name, size, weight_format):
    cases = (bench_moe.dense_cases(*size, None) if name == "dense"
             else bench_moe.moe_cases(name, size, weight_format, None))
    impl, fn, flops, _ = next(cases)
    assert impl == "ogsgen"
    return fn, flops


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--format", default="bf16",
                        choices=["bf16", "bf16-kmajor", "mxfp4", "mxfp4-strided", "mxfp4-kscales", "mxfp4-e4m3x",
                                 *bench_moe.FP8_FORMATS])
    parser.add_argument("--cases", nargs="+",
                        help='cases as "shape:tokens" or "dense:MxNxK" (default: the built-in list)')
    parser.add_argument("--tiles", nargs="+",
                        help="tiles as BMxBNxBKxWARPSxSTAGES[w][p][sSPLIT][rMAXNREG][g] (default: the built-in list)")
    parser.add_argument("--in-turn", action="store_true",
                        help="time a case's tiles in turn, rounds of CUDA-graph replays as the bench does "
                             "(bench_moe.graph_medians), instead of one after another")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    cases = [parse_case(c) for c in args.cases] if args.cases else None
    tiles = [parse_tile(t) for t in args.tiles] if args.tiles else None
    rows = []
    for name, size, tiles in sweep(args.format, cases, tiles):
        fn, flops = case_fn(name, size, args.format)
        reference = fn().float()
        timed = []  # (row, run) of the tiles that ran
        for tile in [None, *tiles]:
            row = dict(case=f"{name} {args.format} {size}",
                       tile="heuristic" if tile is None else tile_name(tile))
            rows.append(row)
            try:
                if tile is None:
                    run = fn
                else:
                    if name != "dense" and tile["block_m"] > 128:
                        raise ValueError("ragged rows take block_m <= 128")

                    def run(constraints=tile):
                        with ogsgen.opt_flags_constraints(**constraints):
                            return fn()
                wgmma_hazards.forget_hazard_replacements()
                diff = (run().float() - reference).abs().max() / reference.abs().max()
                row["replaced_by"] = bench_moe.hazard_replacements()
                row["regs"] = matmul_registers(run)
                row["diff_vs_heuristic"] = f"{diff.item():.1e}"
                if args.in_turn:
                    timed.append((row, run))
                else:
                    time_row(row, do_bench_cudagraph(run, rep=100, return_mode="median"), flops)
            except Exception as exc:
                row["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
            if not args.in_turn or "error" in row:
                print(row, flush=True)
            torch.cuda.empty_cache()
        if args.in_turn:
            for (row, _), ms in zip(timed, bench_moe.graph_medians([run for _, run in timed])):
                if isinstance(ms, Exception):
                    row["error"] = f"{type(ms).__name__}: {str(ms).splitlines()[0][:160]}"
                else:
                    time_row(row, ms, flops)
                print(row, flush=True)
        bench_moe.write_csv(rows, args.out / f"tile_sweep_{args.format}.csv")  # kept if cut short


def matmul_registers(run) -> str:
    """Registers/spills per thread of the matmul binaries one call of ``run`` launches (its occupancy), whether
    this row compiled them or an earlier one did: a launch hook notes each launch's function (hooks send
    launches through Triton's own path; the binaries are those ogsgen's launcher cached on an earlier call)."""
    functions = set()

    def note(metadata):
        functions.add(metadata.get()["function"])
    knobs.runtime.launch_enter_hook.add(note)
    try:
        run()
    finally:
        knobs.runtime.launch_enter_hook.remove(note)
    return " ".join(f"{c.n_regs}/{c.n_spills}" for c in launcher._compiled.values()
                    if c.function in functions and "matmul" in c.name)


def time_row(row, ms, flops):
    row.update(us=round(ms * 1e3, 1), tflops=round(flops / ms / 1e9, 1))

if __name__ == "__main__":
    sys.exit(main())
