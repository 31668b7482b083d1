"""Probe: how should an MX-weight kernel wait for its wgmmas? (needs a Hopper GPU)

    PYTHONPATH=.:third_party python bench/probes/mma_wait_modes.py --out DIR [--cases "gpt-oss w1:8192" ...]

The hopper mxfp4 kernels must not let the next K step's upcast overwrite registers a wgmma still reads
(ogsgen.runtime.wgmma_hazards). This times, per shape and tile, the ways a K step can wait, each checked
against the float32 reference (bench_moe's), and writes DIR/mma_wait_modes.csv:

- ``each-wgmma``: what the generated kernels do with WAIT_MMA (since 2026-12-01): the K loop as Triton
  pipelines it, with every ``wgmma.wait_group`` of its PTX made to wait for all (ogsgen.runtime.wgmma_hazards);
- ``k64-select``: what they did before: one dot per K step, made synchronous by a select on its result;
- ``k16-pieces``: K=16 dots on register slices of the upcast W, x loaded in K=16 pieces;
- ``k16-registers``, ``k32-registers``: a chain of K=16 (K=32) dots, x loaded whole and split in registers;
- ``async``: no wait (Triton's pipelined dot), SASS check off: the speed the hazard costs, and its errors.

The variants other than ``each-wgmma`` and ``async`` are rewritten from the generated source into DIR/kernels
(without the waiting compile's marker).
"""
from __future__ import annotations

import argparse
import importlib.util
import inspect
import sys
from pathlib import Path

import torch
from triton.testing import do_bench_cudagraph

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import bench_moe  # noqa: E402

import ogsgen  # noqa: E402
from ogsgen.runtime import loader, matmul, wgmma_hazards  # noqa: E402
from ogsgen.runtime.opt_flags import TILE_KEYS  # noqa: E402

CASES = [("gpt-oss w1", 2048), ("gpt-oss w1", 8192), ("gpt-oss w2", 8192), ("DeepSeek-V3 w1", 8192)]
TILES = [None, (128, 256, 64, 16, 3), (128, 128, 64, 8, 4)]
MODES = ["each-wgmma", "k64-select", "k16-pieces", "k16-registers", "k32-registers", "async"]

WAITING_DOT = """        acc = tl.dot(w, tl.trans(x), acc)
"""
MARKER_CALL = "        request_wgmma_waits()\n"
REWRITES = {
    "k64-select": """        if WAIT_MMA:
            acc = _completed(acc, k)
        acc = tl.dot(w, tl.trans(x), acc)
""",
    "k16-pieces": """        if WAIT_MMA:
            x_mask = offs_k[None, :] < (BLOCK_K if EVEN_K else K - k * BLOCK_K)
            acc = _dot_in_k16_pieces(w, tl.trans(XPtrs), tl.trans(x_mask), acc, not EVEN_K)
        else:
            acc = tl.dot(w, tl.trans(x), acc)
""",
    "k16-registers": """        if WAIT_MMA:
            acc = _dot_in_steps(w, tl.trans(x), acc, 16)
        else:
            acc = tl.dot(w, tl.trans(x), acc)
""",
    "k32-registers": """        if WAIT_MMA:
            acc = _dot_in_steps(w, tl.trans(x), acc, 32)
        else:
            acc = tl.dot(w, tl.trans(x), acc)
""",
}
HELPERS = '''

@triton.jit
def _completed(acc, k):
    return tl.where(k >= 0, acc, 0.0)  # k >= 0 always: a select the compiler cannot drop

@triton.jit
def _halves(t, AXIS: tl.constexpr):
    if AXIS == 1:
        h = tl.permute(tl.reshape(t, (t.shape[0], 2, t.shape[1] // 2)), (0, 2, 1))
    else:
        h = tl.permute(tl.reshape(t, (2, t.shape[0] // 2, t.shape[1])), (1, 2, 0))
    return tl.split(h)


@triton.jit
def _dot_in_steps(a, b, acc, STEP: tl.constexpr):
    if a.shape[1] == STEP:
        acc = tl.dot(a, b, acc)
    else:
        a0, a1 = _halves(a, 1)
        b0, b1 = _halves(b, 0)
        acc = _dot_in_steps(a1, b1, _dot_in_steps(a0, b0, acc, STEP), STEP)
    return acc


@triton.jit
def _dot_in_k16_pieces(a, b_ptrs, b_mask, acc, MASKED: tl.constexpr):
    if a.shape[1] == 16:
        if MASKED:
            b = tl.load(b_ptrs, mask=b_mask, other=0.0)
        else:
            b = tl.load(b_ptrs)
        acc = tl.dot(a, b, acc)
    else:
        a0, a1 = _halves(a, 1)
        p0, p1 = _halves(b_ptrs, 0)
        m0, m1 = _halves(b_mask, 0)
        acc = _dot_in_k16_pieces(a1, p1, m1, _dot_in_k16_pieces(a0, p0, m0, acc, MASKED), MASKED)
    return acc
'''


def rewritten_kernel(variant, mode, folder: Path, generated_kernel):
    name = loader.canonical_name(variant)
    source = Path(inspect.getsourcefile(generated_kernel.fn)).read_text()
    assert WAITING_DOT in source and MARKER_CALL in source, "the generated K loop changed: update this probe"
    source = source.replace(WAITING_DOT, REWRITES[mode]).replace(MARKER_CALL, "        pass\n")
    source = source.replace("\nPROVENANCE", HELPERS + "\n\nPROVENANCE", 1)
    path = folder / f"{mode.replace('-', '_')}_{name}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return getattr(module, name)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--cases", nargs="+", help='"shape:tokens" (default: the built-in list)')
    args = parser.parse_args()
    (args.out / "kernels").mkdir(parents=True, exist_ok=True)
    cases = [(c.rsplit(":", 1)[0], int(c.rsplit(":", 1)[1])) for c in args.cases] if args.cases else CASES
    generated_kernel_for, generated_check = loader.kernel_for, wgmma_hazards.check_compiled
    kernels = {}
    rows = []
    for name, tokens in cases:
        runs = {impl: (fn, flops) for impl, fn, flops, _ in bench_moe.moe_cases(name, tokens, "mxfp4", None)}
        fn, flops = runs["ogsgen"]
        reference = runs["reference"][0]()
        for mode in MODES:
            def kernel_for(variant, persistent=False, mode=mode):
                if mode in REWRITES and variant.w.scaling == "block_e8m0":  # not the scatter's reduce kernel
                    if (variant, mode) not in kernels:
                        kernels[variant, mode] = rewritten_kernel(variant, mode, args.out / "kernels",
                                                                   generated_kernel_for(variant))
                    return kernels[variant, mode]
                return generated_kernel_for(variant, persistent)
            loader.kernel_for = kernel_for
            wgmma_hazards.check_compiled = (lambda compiled: None) if mode == "async" else generated_check
            for tile in TILES:
                row = dict(case=f"{name} {tokens}", mode=mode,
                           tile="heuristic" if tile is None else "x".join(map(str, tile)))
                constraints = dict(zip(TILE_KEYS, tile or ()))
                if mode != "async":
                    constraints["wait_mma"] = True

                def run(constraints=constraints):
                    with ogsgen.opt_flags_constraints(**constraints):
                        return fn()
                try:
                    matmul.forget_hazard_replacements()
                    rms, largest = bench_moe.relative_errors(run(), reference)
                    ms = do_bench_cudagraph(run, rep=100, return_mode="median")
                    row.update(us=round(ms * 1e3, 1), tflops=round(flops / ms / 1e9, 1), rms_error=f"{rms:.1e}",
                               max_error=f"{largest:.1e}")
                except Exception as exc:
                    row["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
                rows.append(row)
                print(row, flush=True)
        loader.kernel_for, wgmma_hazards.check_compiled = generated_kernel_for, generated_check
        torch.cuda.empty_cache()
        bench_moe.write_csv(rows, args.out / "mma_wait_modes.csv")


if __name__ == "__main__":
    sys.exit(main())
