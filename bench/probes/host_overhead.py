"""Where the host time of one eager matmul_ogs call goes (CUDA GPU).

    PYTHONPATH=.:third_party python bench/probes/host_overhead.py --out DIR

gpt-oss w1 T=1 (gather, bf16: the bench's host-overhead case) and w2 (scatter, k=4), per call with the queue kept
short: the whole call (a replayed launch plan) and its parts (signature, replay), the checked path, its first
launch through the plan and through Triton's launcher, Triton's kernel[grid](**args), and cProfiles; then w2 on
the persistent TMA kernel and gpt-oss w1 T=2048. Writes DIR/host_overhead.txt.
"""
from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench_moe import host_overhead_us  # noqa: E402  (the benchmark's own host-time loop)

import ogsgen  # noqa: E402
from ogsgen.runtime import launcher, matmul as matmul_module, plans  # noqa: E402

# The heuristic's persistent tile for decode calls that stream enough of W (ogsgen/runtime/opt_flags.py).
PERSISTENT_DECODE = dict(block_m=16, block_n=128, block_k=128, num_warps=4, num_stages=4, persistent=True)


def per_call_us(fn):
    return host_overhead_us(fn, calls=2000)


def parts(label, x, w, rd, **kwargs):
    """Lines of one case's timings."""
    pc, act, epi = matmul_module._DEFAULT_PRECISION, matmul_module._NO_ACTIVATION, matmul_module._NO_EPILOGUE

    def call():
        return ogsgen.matmul_ogs(x, w, None, rd, **kwargs)

    def signature():
        return matmul_module._call_signature(x, w, None, rd, kwargs.get("gather_indx"), kwargs.get("scatter_indx"),
                                             pc, None, None, None, None, act, epi, None)

    def checked():
        plans.clear()
        return call()

    lines = [f"{label}: whole call (plan replayed): {per_call_us(call):.1f} us"]
    tensors, key = signature()
    plan = plans.lookup(key, tensors)
    assert plan is not None, "the call was not planned"
    lines.append(f"  its signature: {per_call_us(signature):.1f} us")
    lines.append(f"  its plan replayed: {per_call_us(lambda: plan.run(list(tensors))):.1f} us")
    lines.append(f"  the checked path (building the plan): {per_call_us(checked):.1f} us")
    with_buffers = list(tensors)
    for buffer in (step for step in plan.steps if isinstance(step, plans._Buffer)):
        buffer(with_buffers)
    step = next(step for step in plan.steps if isinstance(step, plans._Launch))
    values = step.values(with_buffers)
    args = dict(zip(step.kernel.arg_names, values))
    compiled = [binary for key, binary in launcher._compiled.items() if key[0] is step.kernel][-1]
    stream = torch.cuda.current_stream().cuda_stream
    call()
    lines.append(f"  its first launch alone, as a plan launches it: "
                 f"{per_call_us(lambda: step.direct(step.grid, values)):.1f} us")
    lines.append(f"  the same through Triton's launcher (compiled.run; encodes each TMA descriptor): "
                 f"{per_call_us(lambda: compiled.run(*step.grid, stream, compiled.function, compiled.packed_metadata, None, None, None, *values)):.1f} us")
    lines.append(f"  Triton's kernel[grid](**args), first kernel alone: "
                 f"{per_call_us(lambda: step.kernel[step.grid](**args, **step.options)):.1f} us")
    return lines


def profiled(label, call, calls=500):
    """A cProfile of ``calls`` calls, the 30 functions of most own time."""
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(calls):
        call()
    profile.disable()
    torch.cuda.synchronize()
    text = io.StringIO()
    pstats.Stats(profile, stream=text).sort_stats("tottime").print_stats(30)
    return [f"cProfile, {label}:", text.getvalue()]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    n_expts, top_k, k, n = 128, 4, 2880, 5760
    rd, gi, si = ogsgen.routing(torch.randn(1, n_expts, device="cuda"), top_k)
    x = torch.randn(1, k, device="cuda").bfloat16()
    w1 = torch.randn(n_expts, k, n, device="cuda").bfloat16()
    w2 = torch.randn(n_expts, k, k, device="cuda").bfloat16()
    x_sorted = torch.randn(top_k, k, device="cuda").bfloat16()
    lines = [f"torch {torch.__version__}, triton {__import__('triton').__version__}, {torch.cuda.get_device_name()}"]
    lines += parts("gpt-oss w1 T=1 (gather)", x, w1, rd, gather_indx=gi)
    lines += parts("gpt-oss w2 T=1 (scatter, k=4)", x_sorted, w2, rd, scatter_indx=si)
    # A prefill-sized call: the persistent kernel, x's rows copied into expert order first (a step of its plan).
    rd_prefill, gi_prefill, _ = ogsgen.routing(torch.randn(2048, n_expts, device="cuda"), top_k)
    x_prefill = torch.randn(2048, k, device="cuda").bfloat16()
    lines += parts("gpt-oss w1 T=2048 (gather; persistent)", x_prefill, w1, rd_prefill,
                   gather_indx=gi_prefill)
    with ogsgen.opt_flags_constraints(**PERSISTENT_DECODE):
        lines += parts("gpt-oss w2 T=1 (scatter, k=4), the persistent TMA kernel", x_sorted, w2, rd,
                       scatter_indx=si)
        lines += profiled("gpt-oss w2 T=1, persistent", lambda: ogsgen.matmul_ogs(x_sorted, w2, None, rd,
                                                                                    scatter_indx=si))
    lines += profiled("gpt-oss w1 T=1", lambda: ogsgen.matmul_ogs(x, w1, None, rd, gather_indx=gi))
    report = "\n".join(lines)
    print(report)
    (args.out / "host_overhead.txt").write_text(report + "\n")


if __name__ == "__main__":
    main()
