"""Probe: are the hopper-layout mxfp4 tiles correct, every time? (needs a GPU)

    PYTHONPATH=.:third_party python bench/probes/mx_tile_check.py --out DIR [--reps 3]

Runs the gpt-oss w1 (gather, bias, swiglu) and w2 (scatter, gammas) mxfp4 shapes under each candidate tile,
several times with fresh routing and data, against matmul_ogs_torch (tests/cases.py), and writes each run's
max / rms error relative to the reference to DIR/mx_tile_check.csv. A tile that fails only sometimes points at
a race rather than at the arithmetic.
"""
from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench_moe import write_csv  # noqa: E402
from cases import run_moe_case  # noqa: E402

import ogsgen  # noqa: E402
from ogsgen.spec import default_catalog  # noqa: E402
from ogsgen.runtime.opt_flags import TILE_KEYS  # noqa: E402

TILES = [(64, 128, 64, 8, 4), (128, 256, 64, 16, 3), (128, 256, 64, 16, 2), (128, 128, 64, 8, 4),
         (64, 256, 64, 16, 3), (64, 128, 64, 4, 4)]
CASES = [  # label, variant, tokens, n, k, experts, top-k
    ("gpt-oss w1 T=2048", "ogs_matmul_xbf16_wmxfp4hopper_ybf16_ragged_gather_bias_act_swiglu", 2048, 5760, 2880, 128, 4),
    ("gpt-oss w1 T=8192", "ogs_matmul_xbf16_wmxfp4hopper_ybf16_ragged_gather", 8192, 5760, 2880, 128, 4),
    ("gpt-oss w2 T=8192", "ogs_matmul_xbf16_wmxfp4hopper_ybf16_ragged_scatter_gammas", 8192, 2880, 2880, 128, 4),
]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    catalog = default_catalog().by_name()
    rows = []
    for label, name, tokens, n, k, n_expts, k_act in CASES:
        for tile in TILES:
            constraints = dict(zip(TILE_KEYS, tile))
            for rep in range(args.reps):
                row = dict(case=label, tile="x".join(map(str, tile)), rep=rep)
                try:
                    with ogsgen.opt_flags_constraints(**constraints):
                        run_moe_case(catalog[name], tokens, n, k, n_expts, k_act, "cuda")
                    row["result"] = "ok"
                except AssertionError as exc:
                    errors = re.search(r"max error (\S+) .*rms error (\S+)", str(exc))
                    row.update(result="WRONG", max_error=errors and errors[1], rms_error=errors and errors[2])
                except Exception as exc:
                    row["result"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:120]}"
                rows.append(row)
                print(row, flush=True)
            torch.cuda.empty_cache()
            write_csv(rows, args.out / "mx_tile_check.csv")


if __name__ == "__main__":
    sys.exit(main())
