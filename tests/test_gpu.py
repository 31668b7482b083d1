"""Numeric cases at realistic sizes, on a CUDA GPU only (results recorded in docs/gpu_runs.md)."""
import sys
from pathlib import Path

import pytest
import torch
import triton
import triton.language as tl

import ogsgen
from ogsgen import devices
from ogsgen.codegen import build
from ogsgen.moe import routing, routing_torch
from ogsgen.runtime.opt_flags import TILE_KEYS
from ogsgen.spec import default_catalog, load_catalog_file
from cases import run_case, run_moe_case

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))

# Realistic sizes, up to tens of GiB: they take turns with other large tests on the card (tests/conftest.py).
pytestmark = [pytest.mark.gpu, pytest.mark.large_gpu_memory]
DEFAULT = default_catalog().by_name()


@pytest.mark.parametrize("name,m,n,k", [
    ("ogs_matmul_xbf16_wbf16_ybf16", 8192, 8192, 8192),
    ("ogs_matmul_xbf16_wbf16_ybf16_bias", 4096, 5760, 2880),
    ("ogs_matmul_xbf16_wbf16_ybf16_bias", 768, 5760, 2880),  # the persistent 128x128 tile fills its waves better
    ("ogs_matmul_xbf16_wbf16_ybf16_bias_act_swiglu", 4096, 5760, 2880),
    ("ogs_matmul_xbf16_wbf16_ybf16_bias_gammas", 64, 5760, 2880),
    ("ogs_matmul_xbf16_wbf16_yfp32", 2048, 128, 2880),  # router-style: E=128 logits in fp32
    ("ogs_matmul_xfp16_wfp16_yfp16_bias_gammas_act_swiglu", 1000, 4096, 7168),
    ("ogs_matmul_xfp32_wfp32_yfp32_bias", 2048, 2000, 1999),
    ("ogs_matmul_xfp16_wfp16_yfp32", 1, 2880, 2880),
])
def test_dense_realistic(name, m, n, k):
    run_case(DEFAULT[name], m, n, k, "cuda")


def test_fp32_without_tf32():
    run_case(DEFAULT["ogs_matmul_xfp32_wfp32_yfp32"], 1024, 1000, 2048, "cuda", allow_tf32=False, maxtol=1e-4,
             rmstol=1e-5)


@pytest.mark.parametrize("x_t,w_t,y_t", [(True, False, False), (False, True, False), (False, False, True)])
def test_major_orders_realistic(x_t, w_t, y_t):
    run_case(DEFAULT["ogs_matmul_xbf16_wbf16_ybf16_bias"], 320, 400, 400, "cuda", x_transposed=x_t,
             w_transposed=w_t, y_transposed=y_t)


def test_batched_realistic():
    run_case(DEFAULT["ogs_matmul_xbf16_wbf16_ybf16_bias_act_swiglu"], 300, 400, 400, "cuda", batch=5)
    run_case(DEFAULT["ogs_matmul_xfp16_wfp16_yfp16"], 16, 16, 1000, "cuda", batch=5)
    run_case(DEFAULT["ogs_matmul_xfp16_wfp16_yfp16"], 8, 8, 8, "cuda", batch=10000)


def test_custom_functions_realistic(tmp_path):
    catalog = load_catalog_file(Path(__file__).parent / "catalogs" / "custom_catalog.py")
    build(catalog, tmp_path)
    ogsgen.add_search_path(tmp_path)
    for variant in catalog.variants:
        if variant.ragged:
            run_moe_case(variant, 1000, 704, 608, 16, 2, "cuda")
        elif variant.family == "matmul":
            run_case(variant, 1000, 704, 608, "cuda")


# ---------------------------------------------------------------- mixture of experts

@pytest.mark.parametrize("n_tokens,n_expts,k", [(4096, 256, 8), (8192, 128, 4), (1, 128, 4), (3000, 1500, 8)])
def test_routing_at_scale(n_tokens, n_expts, k):
    from test_moe import _routing_equal
    logits = torch.randn(n_tokens, n_expts, device="cuda")
    _routing_equal(routing(logits, k), routing_torch(logits, k))


MOE_SHAPES = [  # name, tokens, n, k, E, k_act
    ("gpt-oss w1", "ogs_matmul_xbf16_wbf16_ybf16_ragged_gather_bias_act_swiglu", 2048, 5760, 2880, 128, 4),
    ("gpt-oss w2", "ogs_matmul_xbf16_wbf16_ybf16_ragged_scatter_bias_gammas", 2048, 2880, 2880, 128, 4),
    ("gpt-oss w1 decode", "ogs_matmul_xbf16_wbf16_ybf16_ragged_gather_bias_act_swiglu", 8, 5760, 2880, 128, 4),
    ("DeepSeek-V3 w1", "ogs_matmul_xbf16_wbf16_ybf16_ragged_gather_act_swiglu", 512, 4096, 7168, 256, 8),
    ("DeepSeek-V3 w2", "ogs_matmul_xbf16_wbf16_ybf16_ragged_scatter_gammas", 512, 7168, 2048, 256, 8),
    ("Mixtral w2 fp16", "ogs_matmul_xfp16_wfp16_yfp16_ragged_scatter_gammas", 1000, 4096, 1024, 8, 2),
]


@pytest.mark.parametrize("label,name,tokens,n,k,n_expts,k_act", MOE_SHAPES, ids=[s[0] for s in MOE_SHAPES])
def test_moe_realistic(label, name, tokens, n, k, n_expts, k_act):
    run_moe_case(DEFAULT[name], tokens, n, k, n_expts, k_act, "cuda")


def test_moe_dropped_gates_realistic():
    run_moe_case(DEFAULT["ogs_matmul_xbf16_wbf16_ybf16_ragged_scatter_bias_gammas"], 777, 2880, 2880, 64, 4,
                 "cuda", drop=0.3)


@pytest.mark.parametrize("split_k", [None, 4])
def test_split_k_realistic(split_k):
    run_case(DEFAULT["ogs_matmul_xbf16_wbf16_ybf16_bias_gammas_act_swiglu"], 64, 5760, 2880, "cuda")
    with ogsgen.opt_flags_constraints(**({"split_k": split_k} if split_k else {})):
        run_moe_case(DEFAULT["ogs_matmul_xbf16_wbf16_ybf16_ragged_gather_bias_act_swiglu"], 16, 5760, 2880, 128,
                     4, "cuda")
        # a top-k scatter: the split partials summed by the k-row combine
        run_moe_case(DEFAULT["ogs_matmul_xbf16_wbf16_ybf16_ragged_scatter_bias_gammas"], 16, 2880, 2880, 128, 4,
                     "cuda", split_k=split_k, drop=0.2)


def test_moe_layer_makes_no_host_synchronization():
    # Anything that copies device data to the host (or otherwise synchronizes) raises in this mode.
    from moe_layer import moe_layer
    t, h, i, e = 512, 1024, 512, 64
    x = torch.randn(t, h, device="cuda").bfloat16()
    w_router = torch.randn(h, e, device="cuda").bfloat16()
    w1, b1 = torch.randn(e, h, 2 * i, device="cuda").bfloat16(), torch.randn(e, 2 * i, device="cuda")
    w2, b2 = torch.randn(e, i, h, device="cuda").bfloat16(), torch.randn(e, h, device="cuda")
    moe_layer(x, w_router, w1, b1, w2, b2, 4)  # compile and load first
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        logits, out = moe_layer(x, w_router, w1, b1, w2, b2, 4)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert torch.isfinite(out).all()
    with pytest.raises(RuntimeError):  # the detector itself works
        torch.cuda.set_sync_debug_mode("error")
        try:
            out.sum().item()
        finally:
            torch.cuda.set_sync_debug_mode("default")


# ---------------------------------------------------------------- scaled formats

FORMAT_SHAPES = [  # name, m, n, k
    ("ogs_matmul_xbf16_wmxfp4_ybf16_bias", 4096, 5760, 2880),
    ("ogs_matmul_xbf16_wmxfp4_ybf16", 8, 5760, 2880),
    ("ogs_matmul_xbf16_wmxfp4hopper_ybf16_bias", 4096, 5760, 2880),
    ("ogs_matmul_xbf16_wmxfp4hopper_ybf16", 8, 5760, 2900),   # K = 2900: a padded last group
    ("ogs_matmul_xbf16_wmxfp8e4m3_ybf16", 1024, 4096, 4096),
    ("ogs_matmul_xbf16_wfp8e4m3_ybf16_bias", 1024, 4096, 4096),
    ("ogs_matmul_xfp8e4m3_wfp8e4m3_yfp8e4m3_bias", 4096, 4096, 4096),
    ("ogs_matmul_xfp8e4m3_wfp8e4m3_ybf16", 300, 400, 400),
]


@pytest.mark.parametrize("name,m,n,k", FORMAT_SHAPES)
def test_formats_realistic(name, m, n, k):
    run_case(DEFAULT[name], m, n, k, "cuda")


FORMAT_MOE_SHAPES = [  # label, name, tokens, n, k, E, k_act
    ("gpt-oss w1 mxfp4", "ogs_matmul_xbf16_wmxfp4_ybf16_ragged_gather_bias_act_swiglu", 2048, 5760, 2880, 128, 4),
    ("gpt-oss w2 mxfp4", "ogs_matmul_xbf16_wmxfp4_ybf16_ragged_scatter_bias_gammas", 2048, 2880, 2880, 128, 4),
    ("gpt-oss w1 mxfp4 decode", "ogs_matmul_xbf16_wmxfp4_ybf16_ragged_gather_bias_act_swiglu", 4, 5760, 2880, 128, 4),
    ("gpt-oss w1 mxfp4 hopper", "ogs_matmul_xbf16_wmxfp4hopper_ybf16_ragged_gather_bias_act_swiglu", 2048, 5760, 2880,
     128, 4),
    ("gpt-oss w2 mxfp4 hopper", "ogs_matmul_xbf16_wmxfp4hopper_ybf16_ragged_scatter_bias_gammas", 2048, 2880, 2880,
     128, 4),
    ("gpt-oss w1 mxfp4 hopper decode", "ogs_matmul_xbf16_wmxfp4hopper_ybf16_ragged_gather_bias_act_swiglu", 4, 5760,
     2880, 128, 4),
    # e4m3 x (per row, per tensor) with mxfp4 w: fp8 tensor cores, W converted to e4m3 in registers
    ("gpt-oss w1 e4m3 x mxfp4 hopper", "ogs_matmul_xfp8e4m3_channel_wmxfp4hopper_ybf16_ragged_gather_bias_act_swiglu",
     2048, 5760, 2880, 128, 4),
    ("gpt-oss w2 e4m3 x mxfp4 hopper", "ogs_matmul_xfp8e4m3_channel_wmxfp4hopper_ybf16_ragged_scatter_bias_gammas",
     2048, 2880, 2880, 128, 4),
    ("gpt-oss w1 e4m3 x mxfp4 decode", "ogs_matmul_xfp8e4m3_wmxfp4_ybf16_ragged_gather_bias_act_swiglu", 4, 5760, 2880,
     128, 4),
    # DeepSeek-V3's expert shapes with 64 of its 256 experts (no kernel specializes on the count): all 256 need
    # about 67 GB in one process (the float32 weights twice while drawn, 30 GB each, and the fp8 copy), and the case
    # failed beside the suite's other processes (-n 8) while it passed alone
    ("DeepSeek-V3 w1 fp8", "ogs_matmul_xfp8e4m3_wfp8e4m3_ybf16_ragged_gather_act_swiglu", 512, 4096, 7168, 64, 8),
    ("DeepSeek-V3 w2 fp8", "ogs_matmul_xfp8e4m3_wfp8e4m3_ybf16_ragged_scatter_gammas", 512, 7168, 2048, 64, 8),
    ("weight-only fp8 w1", "ogs_matmul_xbf16_wfp8e4m3_ybf16_ragged_gather_bias_act_swiglu", 1000, 4096, 1024, 8, 2),
]


@pytest.mark.parametrize("label,name,tokens,n,k,n_expts,k_act", FORMAT_MOE_SHAPES,
                         ids=[s[0] for s in FORMAT_MOE_SHAPES])
def test_format_moe_realistic(label, name, tokens, n, k, n_expts, k_act):
    run_moe_case(DEFAULT[name], tokens, n, k, n_expts, k_act, "cuda")


# Tiles of the hopper-layout mxfp4 kernel: the heuristic's, what opt_flags_constraints and
# enforce_bitwise_invariance (block_m=128, 8 warps) reach, and neighbours.
MX_HOPPER_TILES = [(16, 128, 128, 4, 3), (32, 128, 128, 4, 3), (64, 128, 64, 8, 4), (64, 128, 64, 4, 4),
                   (64, 256, 64, 16, 3), (128, 256, 64, 16, 3), (128, 256, 64, 16, 4), (128, 128, 64, 8, 4),
                   (128, 128, 64, 8, 3), (128, 128, 128, 8, 3), (128, 128, 64, 4, 3)]


@pytest.mark.parametrize("tile", MX_HOPPER_TILES, ids=["x".join(map(str, t)) for t in MX_HOPPER_TILES])
def test_mxfp4_hopper_tiles_realistic(tile):
    constraints = dict(zip(TILE_KEYS, tile))
    with ogsgen.opt_flags_constraints(**constraints):
        run_moe_case(DEFAULT["ogs_matmul_xbf16_wmxfp4hopper_ybf16_ragged_gather_bias_act_swiglu"], 2048, 5760, 2880,
                     128, 4, "cuda")


# The heuristic's hopper mxfp4 tiles for N-contiguous scales (prepare_expert_weights' layout), across the token
# counts that reach each of them on gpt-oss: 16x128 and 16x256 (96 registers) decode tiles, 64x256x128 (120
# registers) and 128x256x128.
@pytest.mark.parametrize("tokens", [1, 8, 32, 256, 2048, 8192])
@pytest.mark.parametrize("label,name,n,k", [
    ("w1", "ogs_matmul_xbf16_wmxfp4hopper_ybf16_ragged_gather_bias_act_swiglu", 5760, 2880),
    ("w2", "ogs_matmul_xbf16_wmxfp4hopper_ybf16_ragged_scatter_bias_gammas", 2880, 2880)])
def test_mxfp4_hopper_n_contiguous_scales_realistic(tokens, label, name, n, k):
    run_moe_case(DEFAULT[name], tokens, n, k, 128, 4, "cuda", scales_n_contiguous=True)


# Waiting kernels (wait_mma: each wgmma completes before the next instruction, made so in the PTX by ogsgen's
# compile) at the tiles that run them on Triton 3.6: the heuristic's (16-row tiles of K=2880 wait by choice).
MX_WAITING_TILES = [(16, 128, 128, 4, 3), (16, 128, 128, 8, 3), (16, 128, 64, 8, 4), (64, 128, 64, 8, 4),
                    (128, 256, 64, 16, 3), (128, 256, 128, 8, 4)]


@pytest.mark.parametrize("tile", MX_WAITING_TILES, ids=["x".join(map(str, t)) for t in MX_WAITING_TILES])
@pytest.mark.parametrize("label,name,n,k", [
    ("w1", "ogs_matmul_xbf16_wmxfp4hopper_ybf16_ragged_gather_bias_act_swiglu", 5760, 2880),
    ("w2", "ogs_matmul_xbf16_wmxfp4hopper_ybf16_ragged_scatter_bias_gammas", 2880, 2880)])
def test_mxfp4_hopper_waiting_kernels_realistic(tile, label, name, n, k):
    constraints = dict(zip(TILE_KEYS, tile))
    with ogsgen.opt_flags_constraints(**constraints, wait_mma=True):
        run_moe_case(DEFAULT[name], 2048, n, k, 128, 4, "cuda")


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() < (9, 0),
                    reason="the packed scale PTX is for sm_90 and newer")
def test_mxfp4_hopper_scales_take_the_packed_ptx():
    """``bf16_pair_of_scales`` picks its PTX with ``cuda_capability_geq``: on sm_90 the launched binary must
    hold the packed 16-bit max, not the portable path's per-scale arithmetic."""
    from ogsgen.runtime import launcher
    launcher._compiled.clear()
    run_moe_case(DEFAULT["ogs_matmul_xbf16_wmxfp4hopper_ybf16_ragged_gather_bias_act_swiglu"], 8, 256, 256, 4, 2,
                 "cuda")
    ptx = [compiled.asm["ptx"] for compiled in launcher._compiled.values() if "wmxfp4hopper" in compiled.name]
    assert ptx, "no hopper mxfp4 kernel went through the cached launcher"
    assert all("max.u16x2" in text for text in ptx)  # (E8M0_PAIR_TO_BF16X2's clamp of code 0; code 255 needs no min)


@pytest.mark.parametrize("name,n,k", [
    ("ogs_matmul_xbf16_wbf16_ybf16_ragged_gather_bias_act_swiglu", 5760, 2880),
    ("ogs_matmul_xbf16_wbf16_ybf16_ragged_scatter_bias_gammas", 2880, 2880),
    ("ogs_matmul_xbf16_wmxfp4hopper_ybf16_ragged_gather_bias_act_swiglu", 5760, 2880),
    ("ogs_matmul_xbf16_wmxfp4hopper_ybf16_ragged_scatter_bias_gammas", 2880, 2880)])
def test_launch_plans_replay_with_direct_launches(name, n, k):
    """Decode calls of one signature on fresh routing, inputs and weights: the first builds a plan, the rest
    replay it, launching the binaries directly; each result is checked against the reference."""
    from ogsgen.runtime import plans
    plans.clear()
    for _ in range(3):
        run_moe_case(DEFAULT[name], 8, n, k, 128, 4, "cuda")
    launches = [step for plan in plans._plans.values() for step in plan.steps if isinstance(step, plans._Launch)]
    assert len(plans._plans) == 1 and launches and all(step.direct is not None for step in launches)


def test_bitwise_invariance_realistic():
    x = torch.randn(4096, 2880, device="cuda").bfloat16()
    w = torch.randn(2880, 5760, device="cuda").bfloat16()
    pc = ogsgen.PrecisionConfig(enforce_bitwise_invariance=True)
    full = ogsgen.matmul_ogs(x, w, None, precision_config=pc)
    for rows in (slice(0, 1), slice(1000, 1007), slice(4000, 4096)):
        assert torch.equal(ogsgen.matmul_ogs(x[rows], w, None, precision_config=pc), full[rows])


def test_fp8_rejected_on_gpus_without_fp8(monkeypatch):
    # The device's Target is read once per process: stand in an Ampere GPU's (faking torch's capability query
    # left this test passing on a GPU only when no earlier test had read the real Target).
    monkeypatch.setattr(devices, "_target", lambda index: devices.Target("an Ampere GPU", (8, 0), 108))
    x = torch.randn(8, 32, device="cuda").to(torch.float8_e4m3fn)
    with pytest.raises(ogsgen.SpecError, match="fp8 tensors need a GPU of compute capability 8.9"):
        ogsgen.matmul_ogs(x, x.mT.contiguous().mT.mT, None)


# ---------------------------------------------------------------- large offsets, routing limits and checks

def _free_gib() -> float:
    return torch.cuda.mem_get_info()[0] / 2**30


@pytest.mark.large_gpu_memory(whole_card=True)
@pytest.mark.parametrize("case", ["w K-contiguous", "y column-major", "split-K partials"])
def test_offsets_past_2_31_realistic(case):
    # The sizes at which 32-bit column and split offsets failed: an illegal memory access, or (column-major y) wrong
    # values and stores outside y with no error.
    import gc
    gc.collect()
    torch.cuda.empty_cache()  # the other cases' tensors
    if _free_gib() < 20:
        pytest.skip("needs about 20 GiB of free GPU memory")
    from ogsgen.testing import assert_close
    torch.manual_seed(0)
    y = None
    constraints = {}
    if case == "w K-contiguous":  # an nn.Linear weight (vocab x hidden) as w = linear.weight.T: N*K >= 2**31
        x = torch.randn(16, 32768, device="cuda").bfloat16()
        w = torch.randn(65664, 32768, device="cuda", dtype=torch.bfloat16).T
    elif case == "y column-major":
        x = torch.randn(65536, 64, device="cuda").bfloat16()
        w = torch.randn(64, 32800, device="cuda").bfloat16()
        y = torch.full((32800, 65536), float("nan"), device="cuda", dtype=torch.bfloat16).T
    else:  # (split - 1) * M * N >= 2**31 in the fp32 partials
        x = torch.randn(16384, 4096, device="cuda").bfloat16()
        w = torch.randn(4096, 20480, device="cuda").bfloat16()
        constraints = dict(split_k=8)
    with ogsgen.opt_flags_constraints(**constraints):
        out = ogsgen.matmul_ogs(x, w, None, y=y)
    for start in range(0, out.shape[1], 4096):  # (in column blocks: the whole float64 comparison takes 67 GiB)
        columns = slice(start, start + 4096)
        assert_close(x.float() @ w[:, columns].float(), out[:, columns].float(), what=f"{case}, columns {start}+")
    if y is not None:
        assert out.data_ptr() == y.data_ptr()


@pytest.mark.large_gpu_memory(whole_card=True)
def test_routing_and_matmul_of_8m_gates():
    # 1,048,576 tokens at top-8: 8M gates, 16 times the 524,288 that int32 block-schedule entries allowed.
    from ogsgen.moe import make_ragged_tensor_metadata_torch
    from ogsgen.testing import assert_close
    torch.manual_seed(0)
    tokens, n_expts, k_act = 1 << 20, 128, 8
    logits = torch.randn(tokens, n_expts, device="cuda")
    rd, gi, si = routing(logits, k_act)
    ref_meta = make_ragged_tensor_metadata_torch(rd.expt_hist, tokens * k_act)
    for field in ("slice_offs", "block_offs_data", "block_schedule_data"):
        assert torch.equal(getattr(rd.expt_data, field), getattr(ref_meta, field)), field
    x = torch.randn(tokens, 32, device="cuda").bfloat16()
    w1 = torch.randn(n_expts, 32, 32, device="cuda").bfloat16()
    w2 = torch.randn(n_expts, 32, 16, device="cuda").bfloat16()
    h = ogsgen.matmul_ogs(x, w1, None, rd, gather_indx=gi)
    y = ogsgen.matmul_ogs(h, w2, None, rd, scatter_indx=si, gammas=rd.gate_scal)
    f32 = ogsgen.PrecisionConfig(out_dtype=torch.float32)
    h_ref = ogsgen.matmul_ogs_torch(x, w1, None, rd, gather_indx=gi, precision_config=f32)
    assert_close(h_ref, h.float(), what="w1")
    y_ref = ogsgen.matmul_ogs_torch(h, w2, None, rd, scatter_indx=si, gammas=rd.gate_scal, precision_config=f32)
    assert_close(y_ref, y.float(), what="w2")


_DEVICE_ASSERT = """
import sys, torch, ogsgen
from ogsgen.moe import make_ragged_tensor_metadata
case = sys.argv[1]
if case == "expert id":
    ids = torch.tensor([[0, 1], [2, 4]], device="cuda", dtype=torch.int32)  # 4 experts: id 4 is not one
    ogsgen.routing_from_topk(ids, torch.rand(2, 2, device="cuda"), 4)
elif case == "wrapped int64 id":
    ids = torch.tensor([[0, (1 << 32) + 1]], device="cuda")  # int64: narrowing would wrap it to expert 1
    ogsgen.routing_from_topk(ids, torch.rand(1, 2, device="cuda"), 4)
else:
    make_ragged_tensor_metadata(torch.tensor([10, 7], device="cuda", dtype=torch.int32), 16)  # 17 rows > 16
torch.cuda.synchronize()
print("no error")
"""


@pytest.mark.parametrize("case,message", [("expert id", "an expert id is outside"),
                                          ("wrapped int64 id", "an expert id is outside"),
                                          ("histogram past the rows", "sums to more rows than the call has")])
def test_routing_device_asserts(case, message):
    # On a GPU the routing checks run on the device (no host synchronization): a failed assert is a CUDA error at
    # the next synchronization, with ogsgen's message printed. A fresh process: the error ends its CUDA context.
    import subprocess
    result = subprocess.run([sys.executable, "-c", _DEVICE_ASSERT, case], capture_output=True, text=True,
                            cwd=Path(__file__).resolve().parent.parent, timeout=300)
    output = result.stdout + result.stderr  # the device prints the failed assert (CUDA's printf buffer)
    assert result.returncode != 0 and "no error" not in result.stdout, output
    assert message in output, output[-3000:]


def _tensor_map_bytes(tensor_map) -> bytes:
    import ctypes

    from ogsgen.runtime import descriptors
    return ctypes.string_at(id(tensor_map) + descriptors._TENSOR_MAP_OFFSET, descriptors._TENSOR_MAP_BYTES)


def test_k_contiguous_w_is_encoded_with_256_byte_l2_promotion():
    """From a binary's second launch ogsgen encodes its TMA descriptors (Triton 3.6): a K-contiguous w's map is
    Triton's but for a 256-byte L2 promotion, and the call's result is the first launch's, bit for bit."""
    from triton.backends.nvidia.driver import make_tensordesc_arg
    from triton.tools.tensor_descriptor import TensorDescriptor

    from ogsgen.runtime import descriptors, launcher, plans
    if launcher._RELEASE != (3, 6) or torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("ogsgen encodes TMA descriptors itself on Triton 3.6, for GPUs with TMA")
    torch.manual_seed(0)
    tokens, n_expts, k, n = 512, 8, 512, 1024
    x = torch.randn(tokens, k, device="cuda").bfloat16()
    w = torch.randn(n_expts, n, k, device="cuda").bfloat16().mT  # K-contiguous
    rd, gi, _ = ogsgen.routing(torch.randn(tokens, n_expts, device="cuda"), 2)
    plans.clear()
    launcher._compiled.clear()
    launcher._launch_again.clear()
    with ogsgen.opt_flags_constraints(persistent=True, block_m=128, block_n=256, block_k=64, num_warps=8,
                                      num_stages=3):
        first = ogsgen.matmul_ogs(x, w, None, rd, gather_indx=gi)  # Triton's launch, Triton's encodings
        second = ogsgen.matmul_ogs(x, w, None, rd, gather_indx=gi)  # ogsgen's
    assert torch.equal(first, second)
    (key, compiled), = [(key, c) for key, c in launcher._compiled.items() if c.name.endswith("_persistent")]
    encoded = next(cell.cell_contents.__self__ for cell in launcher._launch_again[key].__closure__
                   if getattr(cell.cell_contents, "__name__", "") == "expand")
    w_position = compiled.src.fn.arg_names.index("WDesc")
    meta = encoded.metas[encoded.positions.index(w_position)]
    assert list(meta["block_size"]) == [1, 256, 64]
    (encoding,) = encoded.cache[encoded.positions.index(w_position)].values()
    tritons = make_tensordesc_arg(TensorDescriptor.from_tensor(w.mT, [1, 256, 64]), meta)
    assert _tensor_map_bytes(encoding[0]) != _tensor_map_bytes(tritons[0]), "the map kept Triton's promotion"
    # Triton's map re-encoded by ogsgen with the promotion asked for gives the map the call used
    assert descriptors.apply_l2_promotion(tritons, descriptors.prefetch_rows(
        TensorDescriptor.from_tensor(w.mT, [1, 256, 64])), meta)
    assert _tensor_map_bytes(tritons[0]) == _tensor_map_bytes(encoding[0])


@triton.jit
def _fp8_dot_over_k(X, W, Y, K, IMPRECISE: tl.constexpr):
    rows, k_step = tl.arange(0, 64), tl.arange(0, 128)
    acc = tl.zeros((64, 64), tl.float32)
    for k in range(0, K, 128):
        x = tl.load(X + rows[:, None] * K + (k + k_step)[None, :])
        w = tl.load(W + (k + k_step)[:, None] + rows[None, :] * K)  # (K-contiguous, as Hopper's fp8 wgmma reads it)
        acc = tl.dot(x, w, acc, max_num_imprecise_acc=IMPRECISE)
    tl.store(Y + rows[:, None] * 64 + rows[None, :], acc)


@pytest.mark.parametrize("k", [128, 1024, 4096])
def test_fp8_dots_sum_within_the_documented_bound(k):
    """docs/formats.md, "fp8 dots on Hopper": wgmma's fp8 sums stay within 2**-12 of |x| @ |w| with Triton's default
    (measured; the tests allow cases.FP8_DOT_ERROR), within 2**-14 when every wgmma is promoted (32)."""
    from cases import FP8_DOT_ERROR
    x = (torch.randn(64, k, device="cuda") * 30).to(torch.float8_e4m3fn)
    w = (torch.randn(64, k, device="cuda") * 30).to(torch.float8_e4m3fn)  # (N, K)
    exact, magnitudes = x.double() @ w.double().T, x.double().abs() @ w.double().abs().T
    for imprecise, bound in ((None, FP8_DOT_ERROR), (32, 2.0 ** -13)):
        y = torch.empty(64, 64, device="cuda")
        _fp8_dot_over_k[(1,)](x, w, y, k, IMPRECISE=imprecise)
        ratio = ((y.double() - exact).abs() / magnitudes).max().item()
        assert ratio <= bound, f"K={k}, max_num_imprecise_acc={imprecise}: error {ratio:.3g} of |x| @ |w|"
