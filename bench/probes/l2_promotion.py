"""Probe (GPU, Triton 3.6): what the TMA descriptors' L2 promotion is worth. Triton 3.6 encodes every descriptor
with a 128-byte promotion; ogsgen re-encodes a K-contiguous w's with 256 bytes (ogsgen.runtime.descriptors). This
times each case's call with and without it, in turn, beside a second instance without it (an A/A control).

    PYTHONPATH=.:bench python bench/probes/l2_promotion.py --out DIR [--cases "gpt-oss w1:2048" ...]
        [--formats bf16-kmajor bf16] [--promoted-first]

Writes DIR/l2_promotion.csv: case, encoding, µs (CUDA-graph median), TB/s, each instance's relative rms error.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import bench_moe  # noqa: E402

from ogsgen.runtime import descriptors, launcher  # noqa: E402

CASES = ["gpt-oss w1:2048", "DeepSeek-V3 w1:2048", "Qwen3-30B-A3B w1:2048", "gpt-oss w2:2048", "gpt-oss w1:8192",
         "DeepSeek-V3 w1:8192", "gpt-oss w2:8", "gpt-oss w2:32"]


def _triton_encoding(encoding, descriptor, meta) -> bool:
    return False


def instance(name, tokens, weight_format, promote):
    """The ogsgen call of one fresh instance of a case, its descriptors encoded with (``promote``) or without
    ogsgen's L2 promotion."""
    cases = bench_moe.moe_cases(name, tokens, weight_format, None)
    _, call, flops, bytes_moved = next(cases)
    reference = dict((impl, fn) for impl, fn, *_ in cases)["reference"]

    def run():
        launcher.apply_l2_promotion = descriptors.apply_l2_promotion if promote else _triton_encoding
        return call()
    return run, reference, bytes_moved


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--cases", nargs="+", default=CASES)
    parser.add_argument("--formats", nargs="+", default=["bf16-kmajor", "bf16"])
    parser.add_argument("--promoted-first", action="store_true",
                        help="build and time the promoted instance first (the first instance tends to be the "
                             "fastest: the A/A control)")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    settings = [("Triton's 128 B", False), ("Triton's 128 B again", False)]
    settings.insert(0 if args.promoted_first else 2, ("ogsgen (256 B for K-contiguous w)", True))
    rows = []
    for text in args.cases:
        name, _, tokens = text.rpartition(":")
        for weight_format in args.formats:
            runs = []
            for label, promote in settings:
                run, reference, bytes_moved = instance(name, int(tokens), weight_format, promote)
                errors = bench_moe.relative_errors(run(), reference())
                runs.append((label, run, bytes_moved, "n/a" if errors is None else f"{errors[0]:.1e}"))
            medians = bench_moe.graph_medians([run for _, run, _, _ in runs])
            launcher.apply_l2_promotion = descriptors.apply_l2_promotion
            for (label, _, bytes_moved, rel_err), ms in zip(runs, medians):
                row = dict(case=f"{name} {weight_format} T={tokens}", encoding=label, rel_rms_err=rel_err)
                if isinstance(ms, Exception):
                    row["error"] = f"{type(ms).__name__}: {str(ms).splitlines()[0][:200]}"
                else:
                    row.update(us=round(ms * 1e3, 1), tbps=round(bytes_moved / ms / 1e9, 2))
                rows.append(row)
                print(row, flush=True)
    bench_moe.write_csv(rows, args.out / "l2_promotion.csv")


if __name__ == "__main__":
    os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    main()
