"""Probe (GPU, Triton 3.6): does the L2 promotion of the TMA descriptors matter? Triton 3.6 encodes every host-side
descriptor with ``CU_TENSOR_MAP_L2_PROMOTION_L2_128B``; a K-contiguous w's tile rows are 128 bytes (64 bf16 along
K), so each K step fetches 128-byte pieces of 256 rows, where an N-contiguous tile's rows are 512 bytes. This
compiles a second copy of Triton's ``cuda_utils`` whose encoder asks for another promotion, and times each case's
ogsgen call with its descriptors encoded each way, in turn (``bench_moe.graph_medians``), beside a second 128-byte
instance of the same case (an A/A control: every instance has its own tensors).

    PYTHONPATH=.:bench python bench/probes/l2_promotion.py --out DIR [--cases "gpt-oss w1:2048" ...]
        [--formats bf16 bf16-kmajor] [--promotions 256B]

Writes DIR/l2_promotion.csv: case, promotion, µs (CUDA-graph median), TB/s, and each instance's relative rms
error against its own float32 reference (the instances multiply different random tensors). A y allocated at an
address an earlier instance's y had keeps that instance's encoding (ogsgen caches encodings per address): only
the store descriptor (y, written once per tile).
"""
from __future__ import annotations

import argparse
import ctypes
import os
import sys
from pathlib import Path


sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import bench_moe  # noqa: E402

import triton  # noqa: E402
from triton.backends.nvidia import driver as nvidia_driver  # noqa: E402
from triton.runtime.build import compile_module_from_src  # noqa: E402

ENCODINGS = {}  # (promotion, "same"/"differ" from the 128-byte encoding): descriptors encoded
CASES = ["gpt-oss w1:2048", "DeepSeek-V3 w1:2048", "Qwen3-30B-A3B w1:2048", "gpt-oss w2:2048", "gpt-oss w1:8192",
         "DeepSeek-V3 w1:8192", "gpt-oss w2:8", "gpt-oss w2:32"]


def encoder(promotion: str):
    """Triton 3.6's fill_tma_descriptor, compiled with CU_TENSOR_MAP_L2_PROMOTION_<promotion>."""
    source = Path(nvidia_driver.dirname, "driver.c").read_text()
    default = "CU_TENSOR_MAP_L2_PROMOTION_L2_128B"
    assert source.count(default) == 1, "this Triton's driver.c is not the one this probe was written for"
    source = source.replace(default, f"CU_TENSOR_MAP_L2_PROMOTION_{promotion}")
    # A module of its own name (Python keeps one extension module per name: the same name loads the original)
    name = f"cuda_utils_{promotion.lower()}"
    source = source.replace("PyInit_cuda_utils(", f"PyInit_{name}(").replace('"cuda_utils",', f'"{name}",')
    module = compile_module_from_src(src=source, name=name,
                                     library_dirs=nvidia_driver.library_dirs(),
                                     include_dirs=nvidia_driver.include_dirs, libraries=nvidia_driver.libraries)
    original, patched = nvidia_driver.CudaUtils().fill_tma_descriptor, module.fill_tma_descriptor
    offset = 128  # of the CUtensorMap in its Python object: PyObject_HEAD, then 128-byte alignment (driver.c)

    def fill(*args):
        # The launcher takes only the original module's PyCUtensorMap type: the patched map's bytes go into one.
        target, source = original(*args), patched(*args)
        same = ctypes.string_at(id(target) + offset, 128) == ctypes.string_at(id(source) + offset, 128)
        key = (promotion, "same" if same else "differ")
        ENCODINGS[key] = ENCODINGS.get(key, 0) + 1
        ctypes.memmove(id(target) + offset, id(source) + offset, 128)
        return target
    return fill


def instance(name, tokens, weight_format, fill, utils):
    """The ogsgen call of one fresh instance of a case, its descriptors encoded by ``fill`` on every launch that
    encodes (ogsgen keeps encodings per address, so each instance's own tensors are encoded by its own fill)."""
    cases = bench_moe.moe_cases(name, tokens, weight_format, None)
    _, call, flops, bytes_moved = next(cases)
    reference = dict((impl, fn) for impl, fn, *_ in cases)["reference"]

    def run():
        utils.fill_tma_descriptor = fill
        return call()
    return run, reference, flops, bytes_moved


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--cases", nargs="+", default=CASES)
    parser.add_argument("--formats", nargs="+", default=["bf16", "bf16-kmajor"])
    parser.add_argument("--promotions", nargs="+", default=["L2_256B"],
                        help="CUtensorMapL2promotion suffixes: NONE, L2_64B, L2_128B, L2_256B")
    parser.add_argument("--patched-first", action="store_true",
                        help="build and time the other promotions' instances first (the first instance tends to be "
                             "the fastest: the A/A control)")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    utils = triton.runtime.driver.active.utils
    original_fill = utils.fill_tma_descriptor
    fills = [("L2_128B", utils.fill_tma_descriptor), ("L2_128B again", utils.fill_tma_descriptor)]
    patched = [(promotion, encoder(promotion)) for promotion in args.promotions]
    fills = patched + fills if args.patched_first else fills + patched
    rows = []
    for text in args.cases:
        name, _, tokens = text.rpartition(":")
        for weight_format in args.formats:
            runs = []
            for label, fill in fills:
                run, reference, flops, bytes_moved = instance(name, int(tokens), weight_format, fill, utils)
                errors = bench_moe.relative_errors(run(), reference())
                runs.append((label, run, bytes_moved, "n/a" if errors is None else f"{errors[0]:.1e}"))
            medians = bench_moe.graph_medians([run for _, run, _, _ in runs])
            utils.fill_tma_descriptor = original_fill
            for (label, _, bytes_moved, rel_err), ms in zip(runs, medians):
                row = dict(case=f"{name} {weight_format} T={tokens}", promotion=label, rel_rms_err=rel_err)
                if isinstance(ms, Exception):
                    row["error"] = f"{type(ms).__name__}: {str(ms).splitlines()[0][:200]}"
                else:
                    row.update(us=round(ms * 1e3, 1), tbps=round(bytes_moved / ms / 1e9, 2))
                rows.append(row)
                print(row, ENCODINGS, flush=True)
    bench_moe.write_csv(rows, args.out / "l2_promotion.csv")
    print("encodings against the 128-byte one:", ENCODINGS, flush=True)


if __name__ == "__main__":
    os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    main()
