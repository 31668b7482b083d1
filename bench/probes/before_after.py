"""Probe (CUDA GPU): the bench's ogsgen cases on this tree against an earlier tree, in one process.

    git worktree add /tmp/base <commit> && bench/probes/stage_base.sh /tmp/base .base   # here, before the run
    PYTHONPATH=.:.base python bench/probes/before_after.py --out DIR [--base-name ogsgen_base] [--only LABEL...]
        [--this-name PACKAGE] [--both-orders]

The earlier tree runs as another package (stage_base.sh copies it as ``ogsgen_base``), so both libraries share
one machine start and clock state: every bench_moe case builds its inputs once per library, checks the outputs
are bitwise equal and times both in turns (the bench's CUDA-graph rounds, each library first in half), then the
host time of a replayed eager gpt-oss w1 T=1 call, with and without a preallocated y. Writes DIR/before_after.csv
and .md. Bias: the library built first timed 2.4-4.9% slower on prefill and mxfp4 in an A/A control (2026-12-03,
b811032; about 3% swapped, e43e107); ``--both-orders`` builds each case in both orders and reports the geometric
mean of the two ratios, in which the bias cancels."""
from __future__ import annotations

import argparse
import gc
import importlib
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench_moe import (DENSE_SHAPES, MOE_SHAPES, case_logits, dense_cases, graph_medians,  # noqa: E402
                       host_overhead_us, moe_cases, write_csv)

SLOWER_LIMIT = 1.02  # a change may leave no case more than 2% slower than before


def ogsgen_call(cases):
    return next(fn for impl, fn, _, _ in cases if impl == "ogsgen")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--base-name", default="ogsgen_base")
    parser.add_argument("--this-name", default="ogsgen",
                        help="the package timed as 'this tree' (an A/A control: a second staged copy of the base)")
    parser.add_argument("--tokens", type=int, nargs="+", default=[1, 8, 32, 256, 2048, 8192])
    parser.add_argument("--formats", nargs="+", default=["bf16", "mxfp4"], help="bench_moe's weight formats")
    parser.add_argument("--host-rounds", type=int, default=5)
    parser.add_argument("--only", nargs="+", help="the cases whose label contains one of these strings")
    parser.add_argument("--both-orders", action="store_true",
                        help="time each case built in both orders (this tree first, then the base first) and report "
                             "the geometric mean of the two ratios, which cancels the build-order bias")
    args = parser.parse_args()
    base = importlib.import_module(args.base_name)
    args.out.mkdir(parents=True, exist_ok=True)
    libraries = {"this tree": importlib.import_module(args.this_name), "base": base}
    cases = [(f"{name} {fmt} T={tokens}", lambda lib, n=name, f=fmt, t=tokens: moe_cases(n, t, f, None, lib=lib))
             for name in MOE_SHAPES for fmt in args.formats for tokens in args.tokens]
    cases += [(f"dense bf16 {m}x{n}x{k}", lambda lib, m=m, n=n, k=k: dense_cases(m, n, k, None, lib=lib))
              for m, n, k in DENSE_SHAPES]
    if args.only:
        cases = [(label, make) for label, make in cases if any(part in label for part in args.only)]
    rows = []
    for label, make in cases:
        orders = [list(libraries.values())] + ([list(libraries.values())[::-1]] if args.both_orders else [])
        timed, equal = [], True
        for order in orders:
            built = [ogsgen_call(make(lib)) for lib in order]  # cases built in this order
            fns = built if order[0] is libraries["this tree"] else built[::-1]  # (this tree, base)
            outputs = [fn() for fn in fns]
            equal = equal and torch.equal(outputs[0], outputs[1])
            del outputs, built
            # Each library first in half of the rounds: at the GPU's power limit the first of a round can run at
            # other clocks than the second.
            forward, backward = graph_medians(fns), graph_medians(fns[::-1])[::-1]
            timed.append([(a + b) / 2 for a, b in zip(forward, backward)])
            del fns
            gc.collect()  # a case's closures and generator frames hold its tensors in reference cycles; the
            torch.cuda.empty_cache()  # second order's build needs the memory (DeepSeek-V3 T=8192: 15 GB of W each)
        times = [statistics.geometric_mean(t[i] for t in timed) for i in range(2)]
        row = dict(case=label, this_us=f"{times[0] * 1e3:.2f}", base_us=f"{times[1] * 1e3:.2f}",
                   ratio=f"{times[0] / times[1]:.4f}", bitwise_equal=equal)
        if args.both_orders:
            row["ratios_by_order"] = " ".join(f"{t[0] / t[1]:.4f}" for t in timed)
        rows.append(row)
        print(f"{label:36s} this {row['this_us']:>10s} us  base {row['base_us']:>10s} us  ratio {row['ratio']}  "
              f"equal {equal}", flush=True)
        write_csv(rows, args.out / "before_after.csv")  # what is measured so far survives a later failure
    host = {lib: [] for lib in libraries}
    host_y = {lib: [] for lib in libraries}
    calls = {lib: ogsgen_call(moe_cases("gpt-oss w1", 1, "bf16", None, lib=module)) for lib, module in libraries.items()}
    with_y = {lib: _with_y(module) for lib, module in libraries.items()}
    for _ in range(args.host_rounds):
        for lib in libraries:
            host[lib].append(host_overhead_us(calls[lib], calls=2000))
            host_y[lib].append(host_overhead_us(with_y[lib], calls=2000))
    for label, samples in (("host us per eager call, gpt-oss w1 T=1 bf16", host),
                           ("same with a preallocated y", host_y)):
        this, before = statistics.median(samples["this tree"]), statistics.median(samples["base"])
        rows.append(dict(case=label, this_us=f"{this:.2f}", base_us=f"{before:.2f}", ratio=f"{this / before:.4f}",
                         bitwise_equal=""))
        print(f"{label}: this {this:.2f} us, base {before:.2f} us (medians of {args.host_rounds} rounds: "
              f"{samples})", flush=True)
    write_csv(rows, args.out / "before_after.csv")
    (args.out / "before_after.md").write_text(table(rows))


def _with_y(lib):
    """gpt-oss w1 T=1 bf16 into a preallocated y (inputs drawn as the bench's case draws them)."""
    name, tokens = "gpt-oss w1", 1
    n_expts, top_k, k, n, _ = MOE_SHAPES[name]
    rd, gi, _ = lib.routing(case_logits(name, tokens), top_k)
    x = torch.randn(tokens, k, device="cuda").bfloat16()
    w = torch.randn(n_expts, k, n, device="cuda").bfloat16()
    y = torch.empty(tokens * top_k, n, device="cuda").bfloat16()
    return lambda: lib.matmul_ogs(x, w, None, rd, gather_indx=gi, y=y)


def table(rows) -> str:
    lines = ["| case | this tree (µs) | base (µs) | this / base | outputs bitwise equal |", "|---|---|---|---|---|"]
    lines += [f"| {r['case']} | {r['this_us']} | {r['base_us']} | {r['ratio']} | {r['bitwise_equal']} |" for r in rows]
    slower = [r for r in rows if r["bitwise_equal"] != "" and float(r["ratio"]) > SLOWER_LIMIT]
    unequal = [r["case"] for r in rows if r["bitwise_equal"] is False]
    lines += ["", f"Cases slower than {SLOWER_LIMIT}x the base: "
              + (", ".join(f"{r['case']} ({r['ratio']})" for r in slower) or "none") + ".",
              "Cases whose outputs differ from the base's: " + (", ".join(unequal) or "none") + "."]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
