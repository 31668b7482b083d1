"""The warp-specialized fp8e4m3_b128 kernel (Gluon, sm_90): which calls take it, its errors, its offline sm_90
compile (no GPU needed), and on a Hopper GPU its outputs, bit for bit those of the tiled kernel it replaces at
prefill (the same K steps, products and promotions)."""
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch

import ogsgen
from ogsgen import PrecisionConfig, matmul_ogs
from ogsgen.errors import InapplicableConstraintError
from ogsgen.runtime.descriptors import ws_blocker
from ogsgen.runtime.opt_flags import (WS_MIN_K, WS_MIN_ROWS_PER_EXPERT, TileProblem, current_constraints,
                                      make_opt_flags)
from ogsgen.spec import default_catalog
from ogsgen.spec.kernel_abi import parameters
from ogsgen.spec.variant import canonical_name

SWIGLU = ogsgen.FusedActivation(ogsgen.swiglu, (1.702, 7.0))
WS_VARIANTS = {canonical_name(v): v for v in default_catalog().by_name().values() if v.has_warp_specialized_kernel}
HOPPER = torch.cuda.is_available() and ogsgen.devices.target().wgmma
needs_hopper = pytest.mark.skipif(not HOPPER, reason="the warp-specialized kernel runs on sm_90 GPUs only")


def _ws_variant(suffix: str):
    return next(v for name, v in WS_VARIANTS.items() if name.endswith(suffix))


def test_the_catalog_gives_the_layer_calls_the_kernel():
    """w1 (gathered, with or without bias and SwiGLU) and w2's sorted rows (a top-k scatter's matmul) have it; a
    scatter itself, mxfp8 or per-channel formats and e4m3 outputs do not."""
    names = set(WS_VARIANTS)
    assert "ogs_matmul_xfp8e4m3_b128_wfp8e4m3_b128_ybf16_ragged" in names
    assert "ogs_matmul_xfp8e4m3_b128_wfp8e4m3_b128_ybf16_ragged_gather_bias_act_swiglu" in names
    assert not any("scatter" in n or "channel" in n or "yfp8" in n for n in names)


def _problem(m=65536, k=2048, n=1536, blocker=None, constraints=(), **kw):
    return TileProblem(1, 1, m, n, k, n_expts=128, tokens_per_expt=max(1, m // 128), n_sms=132, k_group=128,
                       persistent_blocker="no persistent kernel", ws_blocker=blocker, constraints=constraints, **kw)


def test_the_heuristic_takes_it_at_prefill_from_the_measured_sizes():
    flags = make_opt_flags(_problem())
    assert flags.warp_specialized and (flags.block_m, flags.block_n, flags.block_k, flags.num_stages) == (128, 128,
                                                                                                       128, 4)
    assert make_opt_flags(_problem(m=128 * WS_MIN_ROWS_PER_EXPERT)).warp_specialized
    assert not make_opt_flags(_problem(m=128 * WS_MIN_ROWS_PER_EXPERT // 2)).warp_specialized  # decode, small prefill
    assert not make_opt_flags(_problem(k=WS_MIN_K // 2)).warp_specialized   # few K steps (Qwen3-30B-A3B w2)
    assert not make_opt_flags(_problem(blocker="no GPU")).warp_specialized
    assert not make_opt_flags(_problem(bitwise_invariant=True)).warp_specialized
    # constraints that name the tiled kernels' launch mean those kernels
    assert not make_opt_flags(_problem(constraints=(("block_m", 64),))).warp_specialized
    assert not make_opt_flags(_problem(constraints=(("warp_specialized", False),))).warp_specialized


def test_constraints_ask_for_it_and_its_tiles():
    with ogsgen.opt_flags_constraints(warp_specialized=True, num_stages=3):  # (through the public check)
        flags = make_opt_flags(_problem(m=64, constraints=current_constraints()))
    assert flags.warp_specialized and (flags.block_m, flags.block_n, flags.num_stages) == (128, 128, 3)
    for constraints, words in [((("warp_specialized", True),), "no GPU"),
                               ((("warp_specialized", True), ("block_m", 64)), "fixes block_m=128"),
                               ((("warp_specialized", True), ("split_k", 2)), "fixes split_k=1"),
                               ((("warp_specialized", True), ("block_n", 256)), "fixes block_n=128"),
                               ((("warp_specialized", True), ("num_stages", 7)), "number 2 to 6")]:
        with pytest.raises(InapplicableConstraintError, match=words):
            make_opt_flags(_problem(blocker="no GPU" if words == "no GPU" else None, constraints=constraints))


def test_blockers_name_what_to_change():
    variant = _ws_variant("ybf16_ragged")
    w = torch.empty(4, 256, 256, dtype=torch.float8_e4m3fn).mT  # (E, K, N) viewed, K-contiguous
    x = torch.empty(64, 256, dtype=torch.float8_e4m3fn)
    assert "interpreter" in ws_blocker(variant, x, w, 256, 256)  # (CPU tensors)
    plain = next(v for v in default_catalog().by_name().values() if v.x.bits == 16 and v.ragged)
    assert "no warp-specialized kernel" in ws_blocker(plain, x, w, 256, 256)
    if HOPPER:
        assert ws_blocker(variant, x.cuda(), w.cuda(), 256, 256) is None
        assert "multiples of 128" in ws_blocker(variant, x.cuda(), w.cuda(), 256, 200)
        assert "K-contiguous" in ws_blocker(variant, x.cuda(), w.contiguous().cuda(), 256, 256)


def offline_sm90(suffix: str, w_scale_block_n: int) -> str:
    """JSON: whether the variant's warp-specialized kernel, compiled for sm_90 with Triton's own compiler and ptxas
    (no GPU; in a process without TRITON_INTERPRET, which replaces @triton.jit), has fp8 wgmmas, and its bytes of local
    memory (spilled registers). Its arguments are typed as a launch types them."""
    from triton import knobs
    from triton.backends.compiler import GPUTarget
    from triton.compiler import compile as triton_compile
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon._runtime import GluonASTSource
    from ogsgen.numerics.gluon_hopper import as_gluon
    from ogsgen.runtime import loader, wgmma_hazards

    variant = _ws_variant(suffix)
    layout = gl.NVMMASharedLayout.get_default_for([128, 128], gl.float8e4nv)
    pointers = {"Y": f"*{'bf16' if variant.y.element == 'bf16' else 'fp32'}", "X": "*fp8e4nv",
                **dict.fromkeys(("XDesc", "WDesc"), f"tensordesc<fp8e4nv[128, 128],{layout!r}>"),
                **dict.fromkeys(("XBlockScales", "WBlockScales", "Bias", "Gammas"), "*fp32"),
                **dict.fromkeys(("SliceSizes", "SliceOffs", "BlockOffs", "GatherIndx"), "*i32"),
                "BlockSchedule": "*i64"}
    constants = {"W_SCALE_BLOCK_N": w_scale_block_n, "BLOCK_N": 128, "STAGES": 4,
                 "ACTIVATION_FN": as_gluon(variant.activation.fn) if variant.activation else None}
    signature = {p.name: "constexpr" if p.constexpr else pointers.get(p.name, "fp32" if p.name == "out_alpha"
                                                                     or p.name.startswith("act_") else "i32")
                 for p in parameters(variant, "warp_specialized")}
    names = list(signature)
    aligned = {(names.index(n),): [["tt.divisibility", 16]] for n in names
               if signature[n].startswith("*") or n in ("stride_x_m", "stride_y_m", "N", "K")}
    source = GluonASTSource(loader.kernel_for(variant, "warp_specialized"), signature,
                            {n: v for n, v in constants.items() if n in signature}, aligned)
    compiled = triton_compile(source, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=4, maxnreg=168))
    with tempfile.NamedTemporaryFile(suffix=".cubin") as cubin:
        cubin.write(compiled.asm["cubin"])
        cubin.flush()
        usage = subprocess.run([knobs.nvidia.cuobjdump.path, "-res-usage", cubin.name], check=True,
                               capture_output=True, text=True).stdout
    return json.dumps({"fp8 wgmmas": "QGMMA" in wgmma_hazards.sass_of(compiled.asm["cubin"]),
                       "stack bytes": int(re.search(r"STACK:(\d+)", usage)[1])})


# (stack bytes on Triton 3.9, 2026-12-07: 32 with bias, SwiGLU and per-column scales at 128 columns, reloaded 3
# times a K step from L1; none for plain rows)
@pytest.mark.parametrize("suffix,w_scale_block_n,most_stack_bytes", [
    ("ybf16_ragged_gather_bias_act_swiglu", 1, 32),  # w1 of a layer: per-column scales of interleaved gate/up
    pytest.param("ybf16_ragged", 128, 0, marks=pytest.mark.slow)])  # w2's sorted rows
def test_it_compiles_for_sm90(suffix, w_scale_block_n, most_stack_bytes, tmp_path):
    here = Path(__file__).resolve().parent
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    call = f"import test_warp_specialized as t; print(t.offline_sm90({suffix!r}, {w_scale_block_n}))"
    done = subprocess.run([sys.executable, "-c", call], cwd=here, capture_output=True, text=True, timeout=600,
                          env=dict(env, PYTHONPATH=os.pathsep.join([str(here), str(here.parent),
                                                                    env.get("PYTHONPATH", "")]),
                                   TRITON_CACHE_DIR=str(tmp_path)))
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["fp8 wgmmas"]
    if most_stack_bytes is not None:
        assert report["stack bytes"] <= most_stack_bytes


def _layer(device, tokens=700, hidden=512, inter=256, experts=8, top_k=2):
    logits = torch.randn(tokens, experts, device=device)
    logits[:, -1] = -1e4  # an expert without rows
    rd, gi, si = ogsgen.routing(logits, top_k)
    x = torch.randn(tokens, hidden, device=device).bfloat16()
    w1 = ogsgen.prepare_expert_weights(torch.randn(experts, 2 * inter, hidden, device=device) / hidden ** 0.5,
                                       format="fp8e4m3_b128", gate_up="concatenated")
    w2 = ogsgen.prepare_expert_weights(torch.randn(experts, hidden, inter, device=device) / inter ** 0.5,
                                       format="fp8e4m3_b128")
    return rd, gi, si, x, w1, w2


@needs_hopper
def test_the_layer_equals_the_tiled_kernels_bit_for_bit():
    """w1 gathered with bias and SwiGLU (per-column w scales), w2 scattered with the gates through its sorted rows:
    the warp-specialized kernel's outputs equal the tiled kernel's; a second call (its launch plan) too."""
    rd, gi, si, x, w1, w2 = _layer("cuda")
    b1 = torch.randn(w1.w.shape[0], w1.w.shape[-1], device="cuda") / 4

    def layer(ws: bool):
        with ogsgen.opt_flags_constraints(warp_specialized=ws):
            h = matmul_ogs(x, w1.w, b1, rd, gather_indx=gi, fused_activation=SWIGLU,
                           precision_config=w1.precision_config())
            return h, matmul_ogs(h, w2.w, None, rd, scatter_indx=si, gammas=rd.gate_scal,
                                 precision_config=w2.precision_config())
    (h_tiled, y_tiled), (h_ws, y_ws) = layer(False), layer(True)
    assert torch.equal(h_ws, h_tiled) and torch.equal(y_ws, y_tiled)
    h_again, y_again = layer(True)
    assert torch.equal(h_again, h_tiled) and torch.equal(y_again, y_tiled)


@needs_hopper
def test_128_column_scales_a_float32_output_and_a_quantized_x():
    """w's scales per 128 x 128 block (no gate/up interleaving), fp32 y, x quantized before the call (act_scale),
    N = 640 (five tiles); and w2's sorted rows (bf16 y, the gates)."""
    rd, gi, si, x, _, _ = _layer("cuda", hidden=384)
    w = ogsgen.prepare_expert_weights(torch.randn(8, 640, 384, device="cuda") / 384 ** 0.5, format="fp8e4m3_b128")
    x8, x_scale = ogsgen.numerics.quantize_fp8(x, (1, 128))
    pc = PrecisionConfig(weight_scale=w.weight_scale, act_scale=x_scale, out_dtype=torch.float32)
    w2 = ogsgen.prepare_expert_weights(torch.randn(8, 384, 640, device="cuda") / 640 ** 0.5, format="fp8e4m3_b128")
    h = torch.randn(x.shape[0] * 2, 640, device="cuda").bfloat16()
    outs = []
    for ws in (False, True):
        with ogsgen.opt_flags_constraints(warp_specialized=ws):
            outs.append((matmul_ogs(x8, w.w, None, rd, gather_indx=gi, precision_config=pc),
                         matmul_ogs(h, w2.w, None, rd, scatter_indx=si, gammas=rd.gate_scal,
                                    precision_config=w2.precision_config())))
    (y_tiled, y2_tiled), (y_ws, y2_ws) = outs
    assert y_tiled.dtype == torch.float32 and torch.equal(y_tiled, y_ws) and torch.equal(y2_tiled, y2_ws)
    assert y_tiled.abs().max() > 0 and y2_tiled.abs().max() > 0


@needs_hopper
def test_prefill_calls_take_it_by_default():
    from ogsgen.runtime import launcher
    rd, gi, _, x, w1, _ = _layer("cuda", tokens=4 * WS_MIN_ROWS_PER_EXPERT, hidden=WS_MIN_K, experts=8)
    launcher._compiled.clear()
    matmul_ogs(x, w1.w, None, rd, gather_indx=gi, precision_config=w1.precision_config())
    assert any(getattr(key[0], "__name__", "").endswith("_warp_specialized") for key in launcher._compiled)


def test_warmup_compiles_it_on_hopper_for_whole_k_steps():
    from ogsgen.runtime.warmup import WarmupCall, reachable_flags, warmup_calls
    variant = _ws_variant("ybf16_ragged_gather_bias_act_swiglu")
    assert not any(f.warp_specialized for f in reachable_flags(variant, 132, tma=True))  # (not sm_90: none)
    (flags,) = [f for f in reachable_flags(variant, 132, tma=True, wgmma=True) if f.warp_specialized]
    assert (flags.block_m, flags.block_n, flags.block_k, flags.num_stages) == (128, 128, 128, 4)
    calls = [c for c in warmup_calls([variant], 132, tma=True, wgmma=True)
             if isinstance(c, WarmupCall) and c.flags.warp_specialized]
    assert [c.k % 128 for c in calls] == [0]
