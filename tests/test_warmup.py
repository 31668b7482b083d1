"""``ogsgen warmup``: which launches it makes, that each is a valid call, and (GPU) that afterwards a fresh
process compiles nothing."""
import json
import os
import re
import subprocess
import sys
import textwrap
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from ogsgen.runtime import loader
from ogsgen.spec import KernelVariant, canonical_name
from ogsgen.runtime.opt_flags import TileProblem, make_opt_flags
from ogsgen.runtime.warmup import RoutingWarmup, WarmupCall, reachable_flags, warmup_calls
from ogsgen.spec.catalog import default_catalog

DEFAULT = default_catalog().by_name()
H200_SMS = 132


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message shown without a GPU")
def test_warmup_without_a_gpu_says_so():
    done = subprocess.run([sys.executable, "-m", "ogsgen", "warmup", "--only", "ogs_matmul_xbf16_wbf16_ybf16"],
                          capture_output=True, text=True, env={**os.environ, "TRITON_INTERPRET": "0"})
    assert done.returncode == 2
    assert "warmup compiles for the current CUDA GPU, and there is none here" in done.stderr


@pytest.mark.parametrize("name,shapes", [
    # (rows, N, K, experts, tokens per expert): gpt-oss w1/w2 and DeepSeek-V3 w1 at T = 1 .. 8192, dense.
    ("ogs_matmul_xbf16_wbf16_ybf16_ragged_gather_bias_act_swiglu",
     [(4 * t, 5760, 2880, 128, max(1, 4 * t // 128)) for t in (1, 8, 32, 256, 2048, 8192)]),
    ("ogs_matmul_xbf16_wmxfp4hopper_ybf16_ragged_scatter_bias_gammas",
     [(4 * t, 2880, 2880, 128, max(1, 4 * t // 128)) for t in (1, 8, 32, 256, 2048, 8192)]),
    # mxfp4 w1: at T=1 the 16x256 tiles fit in one wave (92 and 128 tiles), which keeps its wgmmas in flight
    ("ogs_matmul_xbf16_wmxfp4hopper_ybf16_ragged_gather_bias_act_swiglu",
     [(4 * t, 5760, 2880, 128, max(1, 4 * t // 128)) for t in (1, 8, 32, 256, 2048, 8192)]
     + [(8 * t, 4096, 7168, 256, max(1, 8 * t // 256)) for t in (1, 8, 32, 256, 2048, 8192)]
     # 64 experts, top-6, T=1: 66 tiles, half the SMs, so split K doubles them
     + [(6, 2816, 2880, 64, 1)]),
    ("ogs_matmul_xbf16_wbf16_ybf16_ragged_scatter_gammas",  # gpt-oss w2 bf16: persistent at T=8 and from T=2048
     [(4 * t, 2880, 2880, 128, max(1, 4 * t // 128)) for t in (1, 8, 32, 256, 2048, 8192)]),
    ("ogs_matmul_xbf16_wbf16_ybf16_ragged_gather_act_swiglu",
     [(8 * t, 4096, 7168, 256, max(1, 8 * t // 256)) for t in (1, 8, 32, 256, 2048, 8192)]),
    ("ogs_matmul_xbf16_wbf16_ybf16", [(m, n, k, None, 0) for m, n, k in
                                       [(8192, 8192, 8192), (4096, 5760, 2880), (64, 5760, 2880), (1, 4096, 4096),
                                        (3, 128, 16384)]]),
])
def test_reachable_flags_include_what_real_calls_choose(name, shapes):
    variant = DEFAULT[name]
    reachable = reachable_flags(variant, H200_SMS)
    w_mx_layout = variant.w.layout if variant.w.scaling == "block_e8m0" else None
    for rows, n, k, n_expts, per_expert in shapes:
        # top-k calls: a scatter splits K through its k-row combine, unless an activation comes between
        flags = make_opt_flags(TileProblem(variant.x.torch_dtype.itemsize, 1, rows, n, k, variant.reduction_n, n_expts,
                               per_expert, not (variant.scatter and variant.activation), H200_SMS, w_mx_layout,
                               persistent_blocker=None if variant.has_persistent_kernel else "none",
                               mx_scales_n_contiguous=w_mx_layout is not None,  # prepare_expert_weights' scales
                               x_gathered=variant.gather, split_is_free=variant.scatter))
        assert replace(flags, split_k=min(flags.split_k, 2)) in reachable, (rows, n, k, flags)


def test_warmup_covers_every_matmul_variant_and_the_routing_kernels(device):
    calls = warmup_calls(list(DEFAULT.values()), H200_SMS)
    calls[0].run(device)  # the routing warm-up is a valid routing call
    warmed = {c.variant for c in calls if isinstance(c, WarmupCall)}
    # the scatter calls whose top-k reduce sends their token rows to the ranks, for each such reduce variant
    senders = {KernelVariant(v.x, v.x, v.y, ragged=True, scatter=True, gammas=v.gammas, fused_comm=True)
               for v in DEFAULT.values() if v.family == "reduce" and v.fused_comm}
    assert senders and warmed == {v for v in DEFAULT.values() if v.family == "matmul"} | senders
    assert [c.n_experts for c in calls if isinstance(c, RoutingWarmup)] == [16, 32, 64, 128, 256, 512, 1024]
    for call in calls:
        if isinstance(call, WarmupCall):  # both K tail cases of each configuration
            assert call.k % call.flags.block_k == 0 or call.k % 16 == 0


def test_warmup_of_the_sending_top_k_reduce_is_a_valid_call(device, monkeypatch):
    """A scatter call with fused communication, whose top-k reduce sends each token's row to the ranks' buffers: it
    launches that reduce variant (for every rank count warmed)."""
    if device == "cuda":
        pytest.skip("checked through the interpreter (the GPU warm-up test compiles for real)")
    reduce = next(v for v in DEFAULT.values() if v.family == "reduce" and v.fused_comm and v.gammas)
    launched = []
    original = loader.kernel_for
    monkeypatch.setattr(loader, "kernel_for", lambda variant, kernel="tiled": launched.append(variant) or
                        original(variant, kernel))
    (call,) = [c for c in warmup_calls([reduce], H200_SMS) if c.top_k == 2]
    call.run(device)
    assert launched.count(reduce) == 5  # all-gathers over 1, 2, 4 and 8 ranks, and rows sent to shards


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(n for n, v in DEFAULT.items() if v.family == "matmul"))
def test_warmup_call_is_a_valid_matmul_ogs_call(name, device, monkeypatch):
    """Each variant's warm-up call goes through matmul_ogs's checks and launches that variant (smallest
    configuration). (e4m3 x with a scale per row was warmed as bf16 x, another variant, until 2026-12-07.)"""
    if device == "cuda":
        pytest.skip("a compile per variant; checked through the interpreter (the GPU warm-up test compiles for real)")
    launched, original = [], loader.kernel_for
    monkeypatch.setattr(loader, "kernel_for", lambda variant, kernel="tiled": launched.append(variant) or
                        original(variant, kernel))
    calls = [c for c in warmup_calls([DEFAULT[name]], H200_SMS) if isinstance(c, WarmupCall)]
    smallest = min(calls, key=lambda c: (c.flags.block_m * c.flags.block_n, c.flags.split_k, c.k))
    smallest.run(device)
    assert DEFAULT[name] in launched, [canonical_name(v) for v in launched]


@pytest.mark.slow
def test_a_kernels_triton_cache_key_does_not_depend_on_what_compiled_first():
    """Triton folds a helper's constexpr globals into a kernel's cache key only once the helper's own key exists;
    ogsgen.numerics.jit keys its helpers at import, so a kernel gets one key in every process, and its warmed
    binaries are found: the top-1 scatter kernel shares the upcast with the plain ragged kernel of top-k > 1
    calls, and the strided mxfp4 kernels share theirs with the dequantization kernel."""
    script = textwrap.dedent("""
        import sys
        from ogsgen.numerics import kernels
        from ogsgen.runtime import loader
        from ogsgen.spec.catalog import default_catalog
        variants = default_catalog().by_name()
        plain = variants["ogs_matmul_xbf16_wmxfp4hopper_ybf16_ragged_bias"]
        first = {"nothing": [], "plain": [loader.kernel_for(plain)],
                 "dequantize": [kernels._dequantize_rows, kernels._quantize_rows]}[sys.argv[1]]
        for kernel in first:
            kernel.cache_key
        print([loader.kernel_for(variants[name]).cache_key
               for name in ("ogs_matmul_xbf16_wmxfp4hopper_ybf16_ragged_scatter_bias_gammas",
                            "ogs_matmul_xbf16_wmxfp4_ybf16_ragged_gather_bias_act_swiglu")])
    """)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}   # real JITFunctions, as on a GPU
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).parents[1]), env.get("PYTHONPATH", "")])
    keys = []
    for first in ("nothing", "plain", "dequantize"):
        done = subprocess.run([sys.executable, "-c", script, first], capture_output=True, text=True, env=env)
        assert done.returncode == 0, done.stderr
        keys.append(done.stdout.strip())
    assert keys[0] == keys[1] == keys[2]


@pytest.mark.gpu
def test_after_warmup_a_fresh_process_compiles_nothing(tmp_path):
    """Warm two MoE variants and a dense one into an empty Triton cache; a second process then makes calls of
    other sizes (tokens, experts, top-k, N, K) and must add nothing to the cache."""
    env = {**os.environ, "TRITON_CACHE_DIR": str(tmp_path / "triton-cache"),
           "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[1]), os.environ.get("PYTHONPATH", "")])}
    names = ["ogs_matmul_xbf16_wbf16_ybf16_ragged_gather_bias_act_swiglu",
             "ogs_matmul_xbf16_wmxfp4hopper_ybf16_ragged_scatter_bias_gammas", "ogs_matmul_xbf16_wbf16_ybf16"]
    for name in names:
        done = subprocess.run([sys.executable, "-m", "ogsgen", "warmup", "--only", name, "--jobs", "8"],
                              capture_output=True, text=True, env=env)
        assert done.returncode == 0, done.stdout + done.stderr
    before = sorted(p.name for p in (tmp_path / "triton-cache").iterdir())
    # Weights are quantized with the torch reference: weight preparation (at model load) is not what is checked.
    script = textwrap.dedent("""
        import torch, ogsgen
        from ogsgen.numerics import quantize_mx_torch
        act = ogsgen.FusedActivation(ogsgen.swiglu, (1.702, 7.0))
        # (1, 8, 4, 1024, 4608): the scatter's 16x256 tiles fit in one wave (4 experts x 18 tiles on 132 SMs)
        for tokens, experts, k_act, n, k in [(1, 128, 4, 1024, 512), (37, 64, 2, 768, 1024), (300, 32, 8, 512, 256),
                                             (2500, 128, 4, 1024, 512), (50, 16, 1, 512, 256), (1, 8, 4, 1024, 4608)]:
            rd, gi, si = ogsgen.routing(torch.randn(tokens, experts, device="cuda"), k_act)
            x = torch.randn(tokens, k, device="cuda").bfloat16()
            w = torch.randn(experts, k, n, device="cuda").bfloat16()
            b = torch.randn(experts, n, device="cuda")
            h = ogsgen.matmul_ogs(x, w, b, rd, gather_indx=gi, fused_activation=act)
            values, scales = quantize_mx_torch(torch.randn(experts, k, n // 2, device="cuda"), "e2m1", axis=-1)
            pc = ogsgen.PrecisionConfig(weight_scale=scales.mT.contiguous())
            ogsgen.matmul_ogs(h, ogsgen.swizzle_mx_values(values.mT), torch.randn(experts, k, device="cuda"),
                              rd, scatter_indx=si, gammas=rd.gate_scal.float(), precision_config=pc)
        for m, n, k in [(1, 512, 512), (100, 4096, 1024), (5000, 2048, 4096), (64, 5760, 2880)]:
            x, w = torch.randn(m, k, device="cuda").bfloat16(), torch.randn(k, n, device="cuda").bfloat16()
            ogsgen.matmul_ogs(x, w, None)
        torch.cuda.synchronize()
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr
    after = sorted(p.name for p in (tmp_path / "triton-cache").iterdir())
    new = sorted(set(after) - set(before))
    assert not new, "compiled after warm-up:\n" + "\n".join(_signature(tmp_path / "triton-cache" / e) for e in new)


def _signature(entry: Path) -> str:
    """A cache entry's kernel, launch options and argument specialization (its TTIR function line, locations
    dropped), for the failure message. (Constexprs are not in it: an entry whose line equals a warm one's
    differs in a constexpr or an option.)"""
    options = next((json.loads(f.read_text()) for f in entry.glob("*.json") if not f.name.startswith("__grp__")), {})
    header = " ".join(f"{key}={options.get(key)}" for key in ("num_warps", "num_stages", "maxnreg"))
    for ttir in entry.glob("*.ttir"):
        line = next((line.strip() for line in ttir.read_text().splitlines() if "tt.func" in line), ttir.name)
        return header + " " + re.sub(r' loc\([^)]*\)\)?', '', line)[:2000]
    return ", ".join(f.name for f in entry.iterdir())


def test_warmup_progress_in_a_log_prints_a_line_per_tenth(capsys):
    from ogsgen.cli import _progress_bar

    for done in range(1, 41):
        _progress_bar(done, 40, f"call {done}")
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 10 and lines[-1].startswith("[" + "#" * 30 + "] 40/40 call 40")
