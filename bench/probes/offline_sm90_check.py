"""Probe, no GPU needed: which launch parameters give an MX kernel ptxas's in-flight wgmma register hazard.

    PYTHONPATH=. python bench/probes/offline_sm90_check.py --out DIR --cases "gpt-oss w1:8192" ... \
        --tiles 128x256x64x16x3 128x256x64x16x3w ... [--format mxfp4|mxfp4-kscales|bf16] [--x mxfp8|e4m3] \
        [--layout hopper_fp8] [--sass]

Run it with the GPU machine's Triton: each case's call runs on CPU tensors of the real shapes, launch captured, bound
for sm_90, compiled, disassembled and checked by wgmma_hazards; DIR/offline_sm90_check.csv: per case and tile, each
kernel's hazards, registers/stack bytes, K loop instructions and shared memory. A tile ending in ``w`` is its waiting
kernel. Use a fresh TRITON_CACHE_DIR (kernels choose sm_90's PTX here; Triton's cache key does not record it).
"""
from __future__ import annotations

import argparse
import os
import re
from collections import Counter
import subprocess
import sys
import tempfile
from pathlib import Path

if os.environ.get("TRITON_INTERPRET") == "1":
    sys.exit("run without TRITON_INTERPRET: the probe compiles the real kernels")

import torch  # noqa: E402
from triton import knobs  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource, compile as triton_compile, make_backend  # noqa: E402
from triton.runtime.jit import create_function_from_signature  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench_moe import MOE_SHAPES, write_csv  # noqa: E402
from tile_sweep import parse_tile, tile_name  # noqa: E402

import ogsgen  # noqa: E402
from ogsgen import devices  # noqa: E402
from ogsgen.moe.reference import routing_torch  # noqa: E402
from ogsgen.numerics.jit import compiling_for  # noqa: E402
from ogsgen.numerics.layouts import swizzle_mx_values  # noqa: E402
from ogsgen.runtime import launcher, wgmma_hazards  # noqa: E402

SM90 = GPUTarget("cuda", 90, 32)
H200_SHARED_LIMIT = 232448  # bytes a block may use on sm_90


def case_call(name: str, tokens: int, weight_format: str, max_experts: int, x_format: str = "bf16", layout="hopper"):
    """The case's matmul_ogs call on CPU tensors of its shapes; past ``max_experts``, fewer experts and tokens with
    the same rows per expert (the same launch parameters and binaries, a fraction of the memory)."""
    if weight_format not in ("mxfp4", "mxfp4-kscales") and x_format != "mxfp8":
        raise SystemExit("only register operands are checked (--format mxfp4 or mxfp4-kscales, or --x mxfp8): the "
                         "other kernels read W and x from shared memory")
    n_expts, top_k, k, n, mode = MOE_SHAPES[name]
    if n_expts > max_experts:
        tokens, n_expts = max(1, tokens * max_experts // n_expts), max_experts
    rd, gi, si = routing_torch(torch.randn(tokens, n_expts), top_k)
    rows = tokens if mode == "gather" else tokens * top_k
    x = torch.empty(rows, k, dtype=torch.bfloat16 if x_format == "bf16" else torch.float8_e4m3fn)
    # x's scales as quantize_fp8 (per row) and quantize_mx make them, w's as bench_moe stores them (strides count)
    fields = {"bf16": {}, "e4m3": dict(act_scale=torch.ones(rows, 1)),
              "mxfp8": dict(act_scale=torch.zeros(rows, k // 32, dtype=torch.uint8))}[x_format]
    if weight_format == "bf16":
        w = torch.empty(n_expts, k, n, dtype=torch.bfloat16)
    else:
        w = swizzle_mx_values(torch.zeros(n_expts, n, k // 2, dtype=torch.uint8).mT, layout, capability=(9, 0))
        scales = torch.zeros(n_expts, n, k // 32, dtype=torch.uint8).mT
        fields["weight_scale"] = scales if weight_format == "mxfp4-kscales" else scales.contiguous()
    pc = ogsgen.PrecisionConfig(**fields)
    kwargs = dict(gather_indx=gi) if mode == "gather" else dict(scatter_indx=si, gammas=rd.gate_scal.float())
    return lambda: ogsgen.matmul_ogs(x, w, None, rd, precision_config=pc, **kwargs)


def captured_launches(call, tile):
    """(kernel, grid, args, options) of each launch ``call`` makes under the tile's constraints (none runs)."""
    launches = []
    real = launcher.launch, devices.interpreting, devices.check_interpreter_mode
    launcher.launch = lambda kernel, grid, args, verify=None, compiling=None, **options: launches.append(
        (kernel, grid, args, options))
    devices.interpreting, devices.check_interpreter_mode = (lambda: True), (lambda: None)  # CPU tensors, GPU kernels
    try:
        with ogsgen.opt_flags_constraints(**(tile or {})):
            call()
    finally:
        launcher.launch, devices.interpreting, devices.check_interpreter_mode = real
    return launches


def k_loop_mix(sass: str) -> str:
    """The K loop (the longest issuing wgmmas, or 16-row tiles' HMMA): its instruction count and opcode counts."""
    body = max((b for b in wgmma_hazards.loops(sass) if any(re.search(r"\b[HQ]G?MMA", text) for _, text in b)), key=len)
    opcodes = Counter(re.sub(r"^@!?U?P[T0-9]+\s+", "", text).split()[0].split(".")[0] for _, text in body)
    return f"{len(body)}: " + " ".join(f"{op} {n}" for op, n in opcodes.most_common())


def registers_of(cubin: bytes) -> str:
    """"registers/stack bytes" per thread of a cubin's kernel (cuobjdump's resource usage; no GPU needed)."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        usage = subprocess.run([knobs.nvidia.cuobjdump.path, "-res-usage", f.name], check=True, capture_output=True,
                               text=True).stdout
    registers, stack = re.search(r"REG:(\d+)", usage)[1], re.search(r"STACK:(\d+)", usage)[1]
    return f"{registers}/{stack}"


def compile_for_sm90(kernel, args: dict, options: dict):
    """The binary a launch with these arguments compiles on an sm_90 GPU (Triton's binder and compile)."""
    backend = make_backend(SM90)
    binder = create_function_from_signature(kernel.signature, kernel.params, backend)
    kwargs = dict(args, **options, debug=False, instrumentation_mode=knobs.compilation.instrumentation_mode)
    bound_args, specialization, parsed = binder(**kwargs)
    parsed, signature, constexprs, attrs = kernel._pack_args(backend, kwargs, bound_args, specialization, parsed)
    source = ASTSource(kernel, signature, constexprs, attrs)
    # as matmul_ogs compiles waiting kernels, with the PTX an H200 would choose
    with wgmma_hazards.waiting_for_each_wgmma_compiles(), compiling_for(SM90):
        return triton_compile(source, target=SM90, options=parsed.__dict__)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--format", default="mxfp4", choices=["mxfp4", "mxfp4-kscales", "bf16"])
    parser.add_argument("--x", default="bf16", choices=["bf16", "mxfp8", "e4m3"], help="mxfp8: MX; e4m3: per row")
    parser.add_argument("--layout", default="hopper", choices=["hopper", "hopper_fp8"], help="of mxfp4 w")
    parser.add_argument("--sass", action="store_true", help="also write each kernel's SASS listing to DIR")
    parser.add_argument("--cases", nargs="+", required=True, help='"shape:tokens", shapes as in bench_moe')
    parser.add_argument("--tiles", nargs="+", default=[],
                        help="BMxBNxBKxWARPSxSTAGES[w][rMAXNREG] as in tile_sweep.py (and the heuristic's)")
    parser.add_argument("--max-experts", type=int, default=32)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    tiles = [None, *(parse_tile(t) for t in args.tiles)]
    rows = []
    for case in args.cases:
        name, tokens = case.rsplit(":", 1)
        call = case_call(name, int(tokens), args.format, args.max_experts, args.x, args.layout)
        for tile in tiles:
            row = dict(case=case, tile="heuristic" if tile is None else tile_name(tile))
            try:
                for kernel, grid, kernel_args, options in captured_launches(call, tile):
                    if "WAIT_MMA" not in kernel.arg_names:
                        continue  # the scatter's reduce kernel: no wgmma
                    compiled = compile_for_sm90(kernel, kernel_args, options)
                    sass = wgmma_hazards.sass_of(compiled.asm["cubin"])
                    hazards = wgmma_hazards.find_hazards(sass)
                    if args.sass:
                        (args.out / f"{case.replace(' ', '_').replace(':', '_')}_{row['tile']}.sass").write_text(sass)
                    shared, tile_keys = compiled.metadata.shared, ("BLOCK_M", "BLOCK_N", "BLOCK_K")
                    row.update(kernel=kernel.__name__, launch_tile="x".join(str(kernel_args[p]) for p in tile_keys)
                               + f"x{options['num_warps']}x{options['num_stages']}", even_k=kernel_args["EVEN_K"],
                               hazards=len(hazards), regs=registers_of(compiled.asm["cubin"]), shared=shared,
                               k_loop=k_loop_mix(sass), fits=shared <= H200_SHARED_LIMIT)
            except Exception as exc:
                row["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
            rows.append(row)
            print(row, flush=True)
            write_csv(rows, args.out / "offline_sm90_check.csv")  # kept if cut short


if __name__ == "__main__":
    sys.exit(main())
