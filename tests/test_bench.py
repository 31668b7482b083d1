"""The benchmark's results table (bench/bench_moe.py), from rows as results.csv holds them, and the peers it measures
(bench/fetch_peers.py)."""
import shutil
import sys
import zipfile
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import torch  # noqa: E402
from bench_moe import markdown_table, relative_errors  # noqa: E402
from ceilings import Ceilings, ImpossibleRate, exit_if_impossible  # noqa: E402

CEILINGS = Ceilings(dense_tflops=700.0, hbm_tbps=4.8, dense_fp8_tflops=1200.0)


def _row(case, impl, graph_us, tflops="", tbps="", rms_err=""):
    return dict(case=case, impl=impl, eager_us="", graph_us=graph_us, tflops=tflops, tbps=tbps, error="",
                rms_err=rms_err)


def test_markdown_table_ratios_and_geometric_means():
    rows = [_row("gpt-oss w1 bf16 T=1", "ogsgen", "40.0", "3.3", "3.32"),
            _row("gpt-oss w1 bf16 T=1", "triton_kernels", "60.0"),
            _row("gpt-oss w1 bf16 T=1", "torch._grouped_mm", "20.0"),
            _row("gpt-oss w1 bf16 T=1", "vLLM fused_moe", "50.0"),
            _row("gpt-oss w1 bf16 T=8", "ogsgen", "100.0", "4.5", "4.26"),
            _row("gpt-oss w1 bf16 T=8", "triton_kernels", "200.0"),
            _row("gpt-oss w1 mxfp4 T=1", "ogsgen", "50.0", "3.6", "0.90"),
            _row("gpt-oss w1 mxfp4 T=1", "triton_kernels", "", "", ""),  # a peer's failed row: no ratio
            _row("dense bf16 64x64x64", "ogsgen", "10.0", "1.0", "1.00"),
            _row("dense bf16 64x64x64", "torch.matmul", "5.0"),
            _row("host overhead T=1 gather", "ogsgen", "")]
    table = markdown_table(rows)
    assert "| gpt-oss w1 bf16 T=1 | 40.0 | 3.3 | 3.32 | 60.0 | 1.50 | 50.0 | 1.25 | 20.0 | 0.50 | n/a | n/a |" in table
    assert "| gpt-oss w1 mxfp4 T=1 | 50.0 | 3.6 | 0.90 | n/a | n/a | n/a | n/a | n/a | n/a | n/a | n/a |" in table
    assert "| dense bf16 64x64x64 | 10.0 | 1.0 | 1.00 | n/a | n/a | n/a | n/a | 5.0 | 0.50 | n/a | n/a |" in table
    assert "host overhead" not in table
    # bf16: ratios 1.5 and 2.0, geometric mean sqrt(3); the mxfp4 case has no triton_kernels time, so no mean.
    assert "- bf16 MoE, 2 cases: triton_kernels / ogsgen geometric mean 1.73, minimum 1.50" in table
    assert "- bf16 MoE, 1 cases: vLLM fused_moe / ogsgen geometric mean 1.25, minimum 1.25" in table
    assert "mxfp4 MoE" not in table


def test_fp8_means_against_the_gemm_alone_too():
    """The peers take x quantized beforehand: beside the means against ogsgen's call (which quantizes x), the means
    against its GEMM alone on such x ("ogsgen, e4m3 x"), as like for like."""
    rows = [_row("DeepSeek-V3 w1 fp8e4m3_b128 T=2048", "ogsgen", "100.0", "300", "1.0"),
            _row("DeepSeek-V3 w1 fp8e4m3_b128 T=2048", "ogsgen, e4m3 x", "80.0"),
            _row("DeepSeek-V3 w1 fp8e4m3_b128 T=2048", "vLLM fused_moe", "120.0"),
            _row("DeepSeek-V3 w1 fp8e4m3_b128 T=2048", "DeepGEMM contiguous", "60.0"),
            _row("DeepSeek-V3 w1 fp8e4m3_b128 T=8192", "ogsgen", "400.0", "300", "1.0"),
            _row("DeepSeek-V3 w1 fp8e4m3_b128 T=8192", "ogsgen, e4m3 x", "360.0"),
            _row("DeepSeek-V3 w1 fp8e4m3_b128 T=8192", "vLLM fused_moe", "480.0")]
    table = markdown_table(rows)
    assert "- fp8e4m3_b128 MoE, 2 cases: vLLM fused_moe / ogsgen geometric mean 1.20, minimum 1.20" in table
    assert ("- fp8e4m3_b128 MoE, 2 cases: vLLM fused_moe / ogsgen's GEMM alone (x quantized beforehand, as the peer "
            "takes it) geometric mean 1.41, minimum 1.33") in table
    assert ("- fp8e4m3_b128 MoE, 1 cases: DeepGEMM contiguous / ogsgen's GEMM alone (x quantized beforehand, as the "
            "peer takes it) geometric mean 0.75, minimum 0.75") in table
    assert "GEMM alone" not in markdown_table([r for r in rows if r["impl"] != "ogsgen, e4m3 x"])


def test_outputs_off_the_reference_are_listed_under_the_table():
    rows = [_row("gpt-oss w1 mxfp4 T=8192", "ogsgen", "3000.0", "300", "0.4", rms_err="4.00e-03"),
            _row("gpt-oss w1 mxfp4 T=8192", "triton_kernels", "2500.0", rms_err="9.40e-02"),
            _row("gpt-oss w2 bf16 T=1", "torch._grouped_mm", "10.0", rms_err="n/a")]
    table = markdown_table(rows)
    assert ("- outputs off the float32 reference (relative rms error above 0.01, 0.03 for e4m3 outputs): gpt-oss "
            "w1 mxfp4 T=8192 triton_kernels (9.4e-02)") in table
    assert "ogsgen (" not in table.split("outputs off")[1]
    assert "wgmma register hazard" not in table
    rows[0]["replaced_by"] = "16x128x128x8x3"
    assert ("- ogsgen MX binaries with the wgmma register hazard, run instead as (fallback tile, or wait): "
            "gpt-oss w1 mxfp4 T=8192 (16x128x128x8x3)") in markdown_table(rows)
    # Results written before the check have no error columns: no such line.
    assert "outputs off" not in markdown_table([{k: v for k, v in r.items() if k != "rms_err"} for r in rows])


def test_relative_errors():
    reference = torch.tensor([[1.0, -2.0], [3.0, 4.0]])
    rms, largest = relative_errors(reference + torch.tensor([[0.0, 0.0], [0.0, 0.4]]), reference)
    assert abs(rms - 0.2 / reference.pow(2).mean().sqrt().item()) < 1e-6 and abs(largest - 0.1) < 1e-6
    assert relative_errors(reference[:1], reference) is None  # rows that do not match: not comparable


def test_hazard_replacements_name_what_ran_instead(monkeypatch):
    from bench_moe import hazard_replacements
    from ogsgen.runtime import wgmma_hazards
    from ogsgen.runtime.opt_flags import OptFlags
    tile = OptFlags(16, 128, 128, group_m=8, num_warps=4, num_stages=3, fallback_tiles=((128, 128, 8, 3, False),))
    monkeypatch.setattr(wgmma_hazards, "_REPLACED", {})
    assert hazard_replacements() == ""
    wgmma_hazards._REPLACED.update({(tile, "a"): OptFlags(16, 128, 128, group_m=8, num_warps=8, num_stages=3),
                             (tile, "b"): OptFlags(16, 128, 128, group_m=8, num_warps=4, num_stages=3, wait_mma=True)})
    assert hazard_replacements() == "16x128x128x8x3 wait"
    # A fallback tile that waits for each wgmma: named with its tile.
    wgmma_hazards._REPLACED[(tile, "c")] = OptFlags(16, 256, 128, group_m=8, num_warps=8, num_stages=4, wait_mma=True)
    assert hazard_replacements() == "16x128x128x8x3 16x256x128x8x4-wait wait"


def test_a_case_times_its_implementations_in_turn_and_checks_them_against_their_references(monkeypatch):
    import bench_moe
    timed = []
    graph_ms = {"ogsgen": iter([1.0, 3.0, 2.0]), "triton_kernels": iter([4.0, 6.0, 5.0])}

    def fake_graph(fn, rep, l2):
        assert l2 == "cold"  # the bench's default
        timed.append(fn.__name__)
        return next(graph_ms[fn.__name__])
    monkeypatch.setattr(bench_moe, "graph_ms", fake_graph)
    monkeypatch.setattr(bench_moe, "do_bench", lambda fn, warmup, rep, return_mode: 10.0)
    reference = torch.ones(2, 2)

    def ogsgen():
        return reference * 1.001

    def triton_kernels():
        return reference.flip(0) * 1.5  # its own row order: checked against its own reference only

    def broken():
        raise RuntimeError("no kernel for this shape\nmore")
    items = [("ogsgen", ogsgen, 8e9, 4e9), ("triton_kernels", triton_kernels, 8e9, 4e9),
             ("reference triton_kernels", lambda: reference.flip(0) * 1.5, None, None),
             ("torch._grouped_mm", broken, 8e9, 4e9), ("reference", lambda: reference, None, None)]
    rows = {row["impl"]: row for row in bench_moe.measure_case("gpt-oss w1 bf16 T=1", items, CEILINGS)}
    assert timed == ["ogsgen", "triton_kernels"] * bench_moe.GRAPH_ROUNDS
    assert rows["ogsgen"]["graph_us"] == 2000.0 and rows["triton_kernels"]["graph_us"] == 5000.0  # medians
    assert rows["ogsgen"]["eager_us"] == 10000.0 and rows["ogsgen"]["tflops"] == 4.0
    assert rows["ogsgen"]["rms_err"] == "1.00e-03" and rows["triton_kernels"]["rms_err"] == "0.00e+00"
    assert rows["torch._grouped_mm"]["error"] == "RuntimeError: no kernel for this shape"
    assert rows["torch._grouped_mm"]["graph_us"] == ""


def test_e4m3_outputs_are_held_to_their_own_limit(monkeypatch):
    """An e4m3 output is compared with the reference quantized alike, where a bf16 rounding before the quantization
    moves some values a step of e4m3 (rms 1.2e-2 on 2026-12-07's GPU run): within its limit, off bf16's. A wrong
    scale is off either."""
    import bench_moe
    monkeypatch.setattr(bench_moe, "graph_ms", lambda fn, rep, l2: 1.0)
    monkeypatch.setattr(bench_moe, "do_bench", lambda fn, warmup, rep, return_mode: 1.0)
    reference = (1 + 0.125 * (torch.arange(256) % 7)).reshape(16, 16)  # exact in e4m3 and bf16
    bumped = reference.clone()
    bumped[0, :4] += 0.125  # one e4m3 step on 4 of 256 values: a relative rms of about 1.1e-2
    items = [("e4m3", lambda: bumped.to(torch.float8_e4m3fn), 1.0, 1.0),
             ("e4m3, scale twice", lambda: (2 * reference).to(torch.float8_e4m3fn), 1.0, 1.0),
             ("bf16", lambda: bumped.bfloat16(), 1.0, 1.0),
             ("reference", lambda: reference.to(torch.float8_e4m3fn), None, None)]
    rows = bench_moe.measure_case("DeepSeek-V3 w1 fp8e4m3_b128 T=8", items, CEILINGS)
    table = markdown_table(rows)
    assert [row["rms_limit"] for row in rows] == [3e-2, 3e-2, 1e-2]
    assert 1e-2 < float(rows[0]["rms_err"]) < 3e-2 and float(rows[2]["rms_err"]) == float(rows[0]["rms_err"])
    off = table.split("outputs off")[1]
    assert "T=8 bf16 (" in off and "T=8 e4m3, scale twice (" in off and "T=8 e4m3 (" not in off


@pytest.mark.gpu
def test_cold_graph_times_read_from_memory_and_warm_ones_from_l2(device):
    """A read of 24 MB, under the L2's 50 MB: back to back (warm) it comes from L2; with L2 emptied before each call
    (cold, the bench's default) it comes from memory, below the memory's peak and slower."""
    import bench_moe
    from ceilings import hbm_peak_tbps
    data = torch.ones(6 << 20, device=device)  # 24 MiB of float32
    cold, warm = (bench_moe.graph_ms(data.sum, 20, l2) for l2 in ("cold", "warm"))
    assert data.nbytes / (cold * 1e-3) / 1e12 < hbm_peak_tbps() and warm < 0.8 * cold, (cold, warm)


def test_a_rate_above_the_ceilings_is_an_error_not_a_rate(monkeypatch):
    import bench_moe
    monkeypatch.setattr(bench_moe, "graph_ms", lambda fn, rep, l2: 1.0)   # 1 ms
    monkeypatch.setattr(bench_moe, "do_bench", lambda fn, warmup, rep, return_mode: 1.0)
    out = torch.ones(2, 2)
    items = [("ogsgen", lambda: out, 7.0e11, 4.0e9),              # 700 TF/s, 4 TB/s: at the ceilings
             ("counted twice", lambda: out, 1.4e12, 4.0e9),       # 1400 TF/s
             ("bytes counted twice", lambda: out, 1.0e9, 9.6e9)]  # 9.6 TB/s
    rows = {row["impl"]: row for row in bench_moe.measure_case("dense bf16 64x64x64", items, CEILINGS)}
    assert rows["ogsgen"]["tflops"] == 700.0 and rows["ogsgen"]["error"] == ""
    assert rows["counted twice"]["tflops"] == "" and rows["counted twice"]["graph_us"] == ""
    assert "1400.0 TF/s is above the dense bf16 cuBLAS rate of this run (700.0 TF/s, +3%)" in rows["counted twice"]["error"]
    assert "9.60 TB/s is above the memory's peak (4.80 TB/s)" in rows["bytes counted twice"]["error"]
    with pytest.raises(SystemExit, match="dense bf16 64x64x64 counted twice, dense bf16 64x64x64 bytes counted"):
        exit_if_impossible(list(rows.values()))
    exit_if_impossible([rows["ogsgen"]])                          # nothing impossible: returns


def test_the_training_bench_counts_each_product_once():
    """Forward and backward of w1 (N1) and w2 (N1 / 2): per weight y, dX and dW, each 2 * rows * K * N."""
    import bench_train
    tokens, k, width, n1 = 2048, 4, 2880, 5760
    rows = tokens * k
    products = [(rows, width, n1), (rows, n1 // 2, width)]       # (M, K, N) of w1's and w2's forward
    assert bench_train.layer_flops(tokens, k, width, n1) == sum(3 * 2 * m * kk * n for m, kk, n in products)
    assert bench_train.layer_flops(tokens, k, width, n1) == 9 * rows * width * n1
    with pytest.raises(ImpossibleRate, match="728.0 TF/s"):
        CEILINGS.check("gpt-oss-120b T=8192 ogsgen", tflops=728.0)


def test_fp8_products_are_held_to_the_fp8_ceiling():
    CEILINGS.check("DeepSeek-V3 w1 fp8e4m3_b128 T=8192 ogsgen", tflops=900.0, fp8=True)   # below fp8's 1200
    with pytest.raises(ImpossibleRate, match=r"above the dense fp8 cuBLAS rate of this run \(1200\.0 TF/s"):
        CEILINGS.check("DeepSeek-V3 w1 fp8e4m3_b128 T=8192 ogsgen", tflops=1300.0, fp8=True)
    with pytest.raises(ImpossibleRate, match="bf16"):
        CEILINGS.check("a bf16 case", tflops=900.0)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["gather", "scatter"])
def test_the_moe_reference_dequantizes_one_expert_at_a_time_and_equals_the_direct_one(mode, device):
    """bench_moe's reference asks for an expert's weights only when the routing gave it rows, once, after the
    previous expert's are freed; its result is bitwise the direct reference's (matmul_ogs_torch on all experts'
    weights dequantized at once, as the bench computed it before), for bf16 and two scaled formats."""
    import weakref

    import ogsgen
    from bench_moe import dequantized_expert, moe_reference
    from ogsgen.numerics import dequantize_mx_torch
    n_expts, top_k, tokens, k, n = 8, 2, 3, 256, 128  # 6 gates over 8 experts: some experts get no rows
    rd, gi, si = ogsgen.routing(torch.randn(tokens, n_expts, device=device), top_k)
    x = torch.randn(tokens if mode == "gather" else tokens * top_k, k, device=device).bfloat16()
    kwargs = dict(gather_indx=gi) if mode == "gather" else dict(scatter_indx=si, gammas=rd.gate_scal.float())
    dense_w = torch.randn(n_expts, k, n, device=device).bfloat16()
    fp8 = ogsgen.prepare_expert_weights(dense_w.mT, format="fp8e4m3_b128")
    values, scales = ogsgen.numerics.quantize_mx(dense_w.mT.contiguous(), "e2m1", axis=-1)
    formats = {  # (all experts dequantized at once, expert e's alone) as bench_moe's reference took them
        "bf16": (dense_w, dense_w.__getitem__),
        "fp8e4m3_b128": (fp8.dequantize(), lambda e: dequantized_expert(fp8, e)),
        "mxfp4": (dequantize_mx_torch(values, scales, "e2m1", dtype=torch.bfloat16).mT,
                  lambda e: dequantize_mx_torch(values[e], scales[e], "e2m1").mT)}
    hit = (rd.expt_hist > 0).nonzero().flatten().tolist()
    assert 0 < len(hit) < n_expts
    for name, (all_w, expert_w) in formats.items():
        asked, held = [], []

        def one_expert(e):
            assert all(earlier() is None for earlier in held), f"{name}: an earlier expert's weights still held"
            asked.append(e)
            w_e = expert_w(e).float()  # (a float32 copy of bf16 weights, as the reference makes)
            held.append(weakref.ref(w_e))
            return w_e
        got = moe_reference(x, one_expert, n, rd, **kwargs)
        assert asked == hit, name
        direct = ogsgen.matmul_ogs_torch(x, all_w, None, rd, precision_config=ogsgen.PrecisionConfig(
            out_dtype=torch.float32), **kwargs)
        assert got.dtype == torch.float32 and got.abs().max() > 1 and torch.equal(got, direct), name


@pytest.mark.parametrize("mode", ["gather", "scatter"])
def test_the_vllm_peers_reference_is_its_products_with_the_chosen_experts(mode, device):
    """vLLM fused_moe's reference (one expert's weights at a time): y[t, j] = x[t] @ w[topk_ids[t, j]] for w1;
    for w2, x's rows are the gates t * top_k + j, weighted by their gates and summed per token."""
    import bench_moe
    import vllm_peer_launch  # (the launcher only: the kernel is not needed for the reference)
    n_expts, top_k, tokens, k, n = 8, 2, 5, 64, 32
    logits = torch.randn(tokens, n_expts, device=device)
    x = torch.randn(tokens if mode == "gather" else tokens * top_k, k, device=device).bfloat16()
    w = torch.randn(n_expts, k, n, device=device).bfloat16()
    _, reference = bench_moe.vllm_fused_moe(vllm_peer_launch, x, w, logits, top_k, mode)
    chosen = torch.topk(logits, top_k, dim=1)
    chosen_w = w.float()[chosen.indices]  # (T, top_k, K, N): every gate's expert, all at once
    if mode == "gather":
        want = torch.einsum("tk,tjkn->tjn", x.float(), chosen_w)
    else:
        per_gate = torch.einsum("tjk,tjkn->tjn", x.float().view(tokens, top_k, k), chosen_w)
        want = (per_gate * torch.softmax(chosen.values, dim=1)[:, :, None]).sum(1)
    torch.testing.assert_close(reference(), want, rtol=1e-5, atol=1e-4)


VLLM_KERNEL = Path(__file__).resolve().parents[1] / "third_party" / "vllm" / "vllm_fused_moe_kernel.py"


@pytest.mark.slow
@pytest.mark.skipif(not VLLM_KERNEL.is_file(), reason="vLLM's kernel is not fetched: python bench/fetch_peers.py "
                                                      "third_party")
@pytest.mark.parametrize("mode", ["gather", "scatter"])
def test_the_vllm_peers_fp8_block_launch_computes_its_reference(mode, device, monkeypatch):
    """vLLM's fused_moe kernel in its fp8 w8a8 block mode, launched as the bench launches it (e4m3 x with a scale per
    row and 128 columns, ogsgen's fp8e4m3_b128 weights and their scales), against its float32 reference."""
    monkeypatch.syspath_prepend(str(VLLM_KERNEL.parent))
    monkeypatch.delitem(sys.modules, "vllm_peer_launch", raising=False)  # (imported before without the kernel)
    import bench_moe
    import ogsgen
    from ogsgen.numerics import FP8_BLOCK
    vllm = bench_moe.vllm_or_none()
    n_expts, top_k, tokens, k, n = 8, 2, 12, 256, 256
    prepared = ogsgen.prepare_expert_weights(torch.randn(n_expts, n, k, device=device), format="fp8e4m3_b128")
    x = torch.randn(tokens if mode == "gather" else tokens * top_k, k, device=device).bfloat16()
    x8, x_scale = ogsgen.numerics.quantize_fp8(x, (1, FP8_BLOCK))
    fp8 = (x_scale, prepared.weight_scale, bench_moe.fp8_as_computed(x, "fp8e4m3_b128"),
           lambda e: bench_moe.dequantized_expert(prepared, e))
    run, reference = bench_moe.vllm_fused_moe(vllm, x8, prepared.w, torch.randn(tokens, n_expts, device=device),
                                              top_k, mode, fp8)
    rms, largest = bench_moe.relative_errors(run(), reference())
    assert rms < 4e-3 and largest < 1e-2  # its bf16 output's rounding


BENCH_FORMATS = ("bf16", "bf16-kmajor", "mxfp4", "mxfp4-e4m3x", "mxfp4-e4m3x-hopper", "mxfp4-mxfp8x", "fp8e4m3_b128",
                 "fp8e4m3_channel", "fp8e4m3")  # (not the probes' mxfp4-strided and mxfp4-kscales)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["gather", "scatter"])
@pytest.mark.parametrize("weight_format", BENCH_FORMATS)
def test_the_benchs_calls_run_on_the_default_catalogs_kernels(weight_format, mode, device, monkeypatch):
    """Each weight format's MoE calls as the bench makes them (w1's gathered rows, w2's rows scattered with gammas;
    the layouts a Hopper GPU takes) find their variants built in the default catalog (strict mode: a missing one
    raises VariantNotBuiltError), and each output is within the bench's limit of its float32 reference."""
    import bench_moe
    from ogsgen.runtime import loader
    monkeypatch.setattr(loader, "_on_demand", False)  # strict mode: only built kernels run
    items = {impl: fn for impl, fn, _, _ in bench_moe.moe_cases("gpt-oss w1", 4, weight_format, None,
                                                                dims=(4, 2, 128, 128, mode), device=device)}
    ours = [impl for impl in items if impl.startswith("ogsgen")]
    assert ours and ours[0] == "ogsgen"
    for impl in ours:
        output = items[impl]()
        reference = items.get(f"reference {impl}", items["reference"])().float()
        assert reference.abs().max() > 0.1
        rms, _ = bench_moe.relative_errors(output, reference)
        limit = bench_moe.FP8_OUTPUT_ERROR_LIMIT if output.dtype == torch.float8_e4m3fn else bench_moe.ERROR_LIMIT
        assert rms < limit, impl


@pytest.mark.slow
@pytest.mark.skipif(not VLLM_KERNEL.is_file(), reason="vLLM's kernel is not fetched: python bench/fetch_peers.py "
                                                      "third_party")
def test_the_fp8_layer_and_vllms_pieces_compute_their_references(device, monkeypatch):
    """The whole fp8e4m3_b128 layer, as ogsgen runs it and as vLLM's pieces do, each within the bench's error limit
    of its float32 reference (h quantized from float32, or from bf16 as vLLM's pieces do); the two references differ
    only where h's bf16 rounding crosses an e4m3 step."""
    monkeypatch.syspath_prepend(str(VLLM_KERNEL.parent))
    monkeypatch.delitem(sys.modules, "vllm_peer_launch", raising=False)  # (imported before without the kernel)
    import bench_moe
    items = {impl: fn for impl, fn, _, _ in bench_moe.layer_cases("Qwen3-30B-A3B", 6, bench_moe.vllm_or_none(),
                                                                   dims=(4, 2, 256, 256), device=device)}
    assert set(items) == {"ogsgen", "reference ogsgen", "vLLM fused_moe", "reference vLLM fused_moe"}
    for impl in ("ogsgen", "vLLM fused_moe"):
        output, reference = items[impl](), items[f"reference {impl}"]()
        assert output.shape == reference.shape == (6, 256) and reference.abs().max() > 0.1
        rms, _ = bench_moe.relative_errors(output, reference)
        assert rms < 5e-3, impl  # the bf16 output's rounding (about 2.4e-3)
    rms, _ = bench_moe.relative_errors(items["reference ogsgen"](), items["reference vLLM fused_moe"]())
    assert 5e-3 < rms < 5e-2  # (1.2e-2 here: so each implementation is held to its own)


BENCH = Path(__file__).resolve().parents[1] / "bench"
SCRIPTS = sorted(p.relative_to(BENCH).as_posix() for p in [*BENCH.glob("*.py"), *BENCH.glob("probes/*.py")])


@pytest.mark.parametrize("script", SCRIPTS)
def test_each_benchmark_and_probe_imports_and_answers_help(script, monkeypatch, capsys):
    """Every script under bench/ imports without a GPU, and one run as a command prints its usage for --help."""
    import importlib.util
    path = BENCH / script
    spec = importlib.util.spec_from_file_location(f"bench_smoke_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)  # (dataclasses look their module up)
    # Gluon wraps triton.language's functions when first imported, as the interpreter setting that imported them
    # says: import it before that setting changes (the warp-specialized kernels are Gluon's).
    import triton.experimental.gluon.language  # noqa: F401
    # As run from a shell, whether or not conftest.py set it (it does only without a GPU): offline_sm90_check.py
    # refuses the interpreter.
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.syspath_prepend(str(path.parent))  # as run as a script: its folder first on the path
    spec.loader.exec_module(module)
    if 'if __name__ == "__main__":' not in path.read_text():
        return  # a helper module of the benches (ceilings.py)
    monkeypatch.setattr(sys, "argv", [str(path), "--help"])
    with pytest.raises(SystemExit) as exit_:
        module.main()
    assert exit_.value.code == 0 and "usage:" in capsys.readouterr().out


FUSED_MOE_SOURCE = '''from vllm.triton_utils import tl, triton


def helper_the_bench_does_not_take():
    pass


@triton.jit
def write_zeros_to_output(c_ptr):
    pass


@triton.jit(do_not_specialize=["n"])
def fused_moe_kernel(a_ptr, n):
    write_zeros_to_output(a_ptr)
'''


def test_fetch_peers_places_vllms_kernels_from_its_wheel_and_deepgemms_wheels(tmp_path, monkeypatch):
    # What the bench measures against comes into the ignored folder, nothing from outside the repository: from
    # vLLM's wheel the vendored triton_kernels and vLLM's fused_moe kernel, which bench/vllm_peer_launch.py
    # launches; DeepGEMM's wheels for the GPU machine's Python, which bench/deepgemm_peer.py unpacks there.
    import fetch_peers
    wheel = tmp_path / "vllm-0.33.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr("vllm/third_party/triton_kernels/matmul_ogs.py", "MATMUL = 1\n")
        archive.writestr("vllm/third_party/triton_kernels/tensor_details/layout.py", "LAYOUT = 1\n")
        archive.writestr("vllm/model_executor/layers/fused_moe/fused_moe.py", FUSED_MOE_SOURCE)
    downloads = []

    def pip_download(command, check):
        downloads.append(command)
        folder = Path(command[command.index("--dest") + 1])
        if "sgl-deep-gemm==0.1.0" in command:
            assert "--python-version=3.12" in command and "apache-tvm-ffi==0.1.9" in command
            for name in ("sgl_deep_gemm-0.1.0-py3-none-any.whl", "apache_tvm_ffi-0.1.9-cp312-abi3-any.whl"):
                (folder / name).write_bytes(b"")
        else:
            shutil.copy(wheel, folder)
    monkeypatch.setattr(fetch_peers.subprocess, "run", pip_download)
    dest = tmp_path / "third_party"
    wheels = dest / "deep_gemm_wheels"
    assert fetch_peers.fetch(dest) == [dest / "triton_kernels" / "matmul_ogs.py", dest / "vllm" /
                                       "vllm_fused_moe_kernel.py", wheels / "apache_tvm_ffi-0.1.9-cp312-abi3-any.whl",
                                       wheels / "sgl_deep_gemm-0.1.0-py3-none-any.whl"]
    assert (dest / "triton_kernels" / "tensor_details" / "layout.py").read_text() == "LAYOUT = 1\n"
    kernel = (dest / "vllm" / "vllm_fused_moe_kernel.py").read_text()
    assert kernel.startswith(fetch_peers.HEADER) and "helper_the_bench_does_not_take" not in kernel
    assert kernel.index("def write_zeros_to_output") < kernel.index('@triton.jit(do_not_specialize=["n"])')
    monkeypatch.syspath_prepend(str(dest / "vllm"))
    monkeypatch.delitem(sys.modules, "vllm_peer_launch", raising=False)  # imported earlier without the kernel placed
    import vllm_peer_launch
    assert vllm_peer_launch.fused_moe_kernel.fn.__name__ == "fused_moe_kernel"
    assert fetch_peers.fetch(dest) and len(downloads) == 2  # placed: not downloaded again


class _DeepGEMMContract:
    """DeepGEMM 0.1.0's grouped fp8 GEMMs on the CPU, from its documented contract (layouts, scales, row groups),
    not its kernels: what the bench lays out for it must mean the products its reference computes."""

    @staticmethod
    def get_mk_alignment_for_contiguous_layout():
        return 128

    @staticmethod
    def get_mn_major_tma_aligned_tensor(scales):  # MN-major: each K block's scales of all rows contiguous
        return scales.transpose(-1, -2).contiguous().transpose(-1, -2)

    @staticmethod
    def _check(a_scales, b, b_scales):
        """x's scales MN-major, B (E, N, K) K-contiguous with (E, N / 128, K / 128) scales."""
        assert a_scales.stride(-2) == 1 and b.stride(-1) == 1
        assert b_scales.shape == (b.shape[0], b.shape[1] // 128, b.shape[2] // 128)

    @staticmethod
    def _products(a, a_scales, b, b_scales):
        """Rows a (R, K) e4m3 times expert b (N, K) e4m3, both dequantized by their 128-wide scale blocks."""
        x = a.float() * a_scales.repeat_interleave(128, -1)
        w = b.float() * b_scales.repeat_interleave(128, 0).repeat_interleave(128, 1)
        return x @ w.T

    def m_grouped_fp8_gemm_nt_contiguous(self, a, b, d, m_indices):
        (rows, rows_scales), (w, w_scales) = a, b
        self._check(rows_scales, w, w_scales)
        assert rows.shape[0] % 128 == 0 and m_indices.dtype == torch.int32
        for block in range(0, rows.shape[0], 128):  # one expert's rows per 128-row block, then padding (-1)
            picked = (m_indices[block:block + 128] >= 0).nonzero().squeeze(1) + block
            expert = int(m_indices[block])
            assert (m_indices[picked] == expert).all() and (picked == torch.arange(len(picked)) + block).all()
            if len(picked):
                d[picked] = self._products(rows[picked], rows_scales[picked], w[expert], w_scales[expert]).to(d.dtype)

    def fp8_m_grouped_gemm_nt_masked(self, a, b, d, masked_m, expected_m):
        (rows, rows_scales), (w, w_scales) = a, b
        self._check(rows_scales, w, w_scales)
        assert masked_m.dtype == torch.int32 and expected_m >= 1
        for expert, count in enumerate(masked_m.tolist()):
            d[expert, :count] = self._products(rows[expert, :count], rows_scales[expert, :count], w[expert],
                                               w_scales[expert]).to(d.dtype)


@pytest.mark.parametrize("gather", [True, False], ids=["w1-gather", "w2-scatter"])
@pytest.mark.parametrize("layout", ["contiguous", "masked"])
def test_deepgemm_inputs_mean_the_products_of_its_reference(layout, gather):
    import deepgemm_peer
    import ogsgen
    from bench_moe import expert_products
    from ogsgen.numerics import dequantize_fp8_torch, quantize_fp8_torch
    tokens, experts, top_k, k, n = 9, 4, 2, 256, 384
    topk_ids = torch.topk(torch.randn(tokens, experts, generator=torch.Generator().manual_seed(3)), top_k).indices
    x = torch.randn(tokens if gather else tokens * top_k, k)
    x8, x_scale = quantize_fp8_torch(x, (1, 128))
    prepared = ogsgen.prepare_expert_weights(torch.randn(experts, n, k) / k ** 0.5, format="fp8e4m3_b128")
    x_ref, w_ref = dequantize_fp8_torch(x8, x_scale, (1, 128)), prepared.dequantize()
    run, reference = getattr(deepgemm_peer, layout)(
        _DeepGEMMContract(), x8, x_scale, prepared.w, prepared.weight_scale, topk_ids, gather,
        lambda src, rows_experts: expert_products(x_ref, src, rows_experts, w_ref.__getitem__, n))
    out, want = run().float(), reference()
    assert out.shape == want.shape and (want != 0).sum() == tokens * top_k * n  # every gate's row, once
    assert relative_errors(out, want)[0] < 4e-3  # bf16 rounding
