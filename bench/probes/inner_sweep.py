"""Probe: launch parameters for the ragged-K (weight gradient) kernel, then a training step with the best.

    PYTHONPATH=. python bench/probes/inner_sweep.py --out OUT [--case gpt-oss-120b:2048] \
        [--tiles 128x256x32x8x3 128x256x32x8x3p ...]

bench_train's two weight gradients (dW1: gathered tokens; dW2: sorted rows), each timed (CUDA-graph medians)
under the heuristic and each tile (BMxBNxBKxWARPSxSTAGES, ``p``: one program per SM looping over the tiles;
block_k is the ragged-K tile), outputs compared with the heuristic's; then bench_train's whole step with the
heuristic and with the best tile of each gradient. Writes OUT/inner_sweep.txt.
"""
from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

import torch
from triton.testing import do_bench, do_bench_cudagraph

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import bench_train  # noqa: E402

import ogsgen  # noqa: E402
from ogsgen.runtime import inner  # noqa: E402

TILES = ["128x256x32x8x3", "128x256x32x8x3p", "128x256x64x8x3", "128x256x64x8x3p", "128x128x32x4x3",
         "128x128x32x4x3p", "128x128x64x4x4", "128x128x64x8x3", "64x256x32x4x3", "256x128x32x8x3"]
_TILE_KEYS = ("block_m", "block_n", "block_k", "num_warps", "num_stages", "persistent")


def parse_tile(tile: str) -> tuple:
    """"128x256x32x8x3p" -> (128, 256, 32, 8, 3, True)."""
    return (*map(int, tile.rstrip("p").split("x")), tile.endswith("p"))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--tiles", nargs="+", default=TILES)
    parser.add_argument("--case", default="gpt-oss-120b:2048", help="bench_train's shape:tokens")
    args = parser.parse_args()
    torch.manual_seed(0)
    shape, tokens = args.case.rsplit(":", 1)
    tokens = int(tokens)
    n_expts, k_act, width, n1 = bench_train.SHAPES[shape]
    rd, gi, _ = ogsgen.routing(torch.randn(tokens, n_expts, device="cuda"), k_act)
    rows = tokens * k_act
    x = torch.randn(tokens, width, device="cuda").bfloat16()
    x_sorted = torch.randn(rows, n1 // 2, device="cuda").bfloat16()
    dz1 = torch.randn(rows, n1, device="cuda").bfloat16()
    dz2 = torch.randn(rows, width, device="cuda").bfloat16()
    cases = {"dW1 (gathered tokens)": (x.mT, dz1, gi), "dW2 (sorted rows)": (x_sorted.mT, dz2, None)}
    lines, best = [], {}
    original_flags = inner.inner_flags
    for name, (xt, dz, gather) in cases.items():
        def call(block_k):
            return ogsgen.matmul_ogs(xt, dz, None, gather_indx=gather,
                                     inner_routing_data=ogsgen.InnerRoutingData(rd, block_k))
        reference = call(32)
        heuristic = original_flags(2, n_expts, xt.shape[0], dz.shape[1], rows // n_expts, 32, 132)
        timings = [("heuristic " + str(heuristic), do_bench_cudagraph(lambda: call(32), rep=100), 0.0, None)]
        for tile in args.tiles:
            flags = parse_tile(tile)
            bk = flags[2]
            try:
                with ogsgen.opt_flags_constraints(**dict(zip(_TILE_KEYS, flags))):
                    out = call(bk)
                    ms = do_bench_cudagraph(lambda: call(bk), rep=100)
                diff = ((out.float() - reference.float()).abs().max() / reference.float().abs().max()).item()
                timings.append((tile, ms, diff, flags))
                del out
            except Exception as exc:
                lines.append(f"{name} {tile}: {type(exc).__name__}: {str(exc).splitlines()[0][:150]}")
        for tile, ms, diff, _ in timings:
            lines.append(f"{name:24s} {tile:60s} {ms * 1e3:9.1f} us  max diff {diff:.1e}")
        fastest = min((t for t in timings if t[3] is not None and t[2] < 1e-2), key=lambda t: t[1], default=None)
        if fastest is not None and fastest[1] < timings[0][1]:
            best[gather is not None] = fastest[3]
    print("\n".join(lines), flush=True)

    for label in ("heuristic", "best tiles"):
        for impl, params, layer, grad_out, _ in bench_train.steps(shape, tokens):
            if impl != "ogsgen":
                params.clear()
                continue

            def step():
                layer(params).backward(grad_out)
            step()
            ms = do_bench(step, warmup=5, rep=200, grad_to_none=params, return_mode="median")
            lines.append(f"training step {args.case}, {label}: {ms:.3f} ms")
            params.clear()
        if not best:
            break
        # the ragged-K calls of the step (block_k 32, its INNER_BLOCK_K) take the best tile for their operands
        tiles = dict(best)
        inner.inner_flags = lambda itemsize, n_expts, m, n, k_per_expert, block_k, n_sms, bitwise_invariant=False, \
            constraints=(): replace(original_flags(itemsize, n_expts, m, n, k_per_expert, block_k, n_sms),
                                    **dict(zip(_TILE_KEYS, tiles.get(n == n1, tiles.get(True, tiles.get(False))))))
        lines.append(f"best tiles: {best}")
    inner.inner_flags = original_flags
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "inner_sweep.txt").write_text("\n".join(lines) + "\n")
    print("\n".join(lines[-3:]))


if __name__ == "__main__":
    main()
