"""Benchmark ogsgen's matmul_ogs against its peers on one GPU, in one run.

    PYTHONPATH=.:third_party:third_party/vllm python bench/bench_moe.py --out bench/results/DATE
    python bench/bench_moe.py --table-from bench/results/DATE    # table.md again from results.csv (no GPU)

`python bench/fetch_peers.py third_party` places the peers (triton_kernels; vLLM's fused_moe kernel in
third_party/vllm, launched by bench/vllm_peer_launch.py; DeepGEMM's wheels, loaded by bench/deepgemm_peer.py); one
that is not importable is left out, with a message.
Shapes: MOE_SHAPES, T in --tokens; dense 8192^3, 4096x5760x2880, 64x5760x2880. Weights bf16 (bf16-kmajor:
K-contiguous), mxfp4 (the layout prepare_expert_weights picks, hopper on an H200, N-contiguous scales; mxfp4-strided,
mxfp4-kscales for probes; mxfp4-e4m3x: x in e4m3 per row, w in the hopper_fp8 layout (-hopper: the hopper layout),
mxfp4-mxfp8x: x in mxfp8 (e8m0 scales per 32 of K), each quantized before the timed call, no triton_kernels),
fp8e4m3_b128 and fp8e4m3_channel (opt in: a checkpoint's fp8 weights, x quantized by the call, and the GEMM alone on x
quantized beforehand, "ogsgen, e4m3 x"; fp8e4m3: one scale per
expert and one for x, quantized beforehand; fp8 cuBLAS as yardstick and ceiling; b128's w1 also writes its rows
as e4m3 for w2, fused or by a quantize_fp8 pass); --layers: whole fp8e4m3_b128 layers (layer_cases: w1 with
SiLU-and-mul, h in e4m3, w2 summed over the top k) against vLLM's pieces. Peers, in the same
process: triton_kernels' matmul_ogs (its Hopper mxfp4 layouts), vLLM's fused_moe Triton kernel (bf16, and fp8 w8a8
with 128 x 128 blocks on x quantized beforehand; vLLM's default config, the expert alignment precomputed; w2 weights
each row by its gate, then a sum over the top-k), DeepGEMM's grouped fp8 GEMMs (fp8e4m3_b128: contiguous, and
masked at T <= 256, on x quantized and laid out per expert beforehand), torch._grouped_mm (bf16) and torch.matmul
(dense).

Timing: do_bench (eager, L2 emptied before each call) and CUDA-graph medians, a case's implementations in turns;
graph calls run with L2 emptied before each (--l2 cold, the default from 2026-12-07: a layer's weights come from
memory, as in a model) or back to back (--l2 warm, do_bench_cudagraph: the earlier runs' method). Bytes: x, the
weights of experts with a row, y; TFLOP/s = 2 * rows * K * N / time. Each case draws its inputs from a seed of its own
(every run and probe times the same routing). Writes results.csv, a plot, table.md (ratios to the peers, geometric
means) and env.json. Each output is compared with a float32 reference (moe_reference: matmul_ogs_torch's arithmetic,
one dequantized expert at a time; torch.matmul for dense): results.csv records the errors and table.md lists every
output further than ERROR_LIMIT (rms; FP8_OUTPUT_ERROR_LIMIT for e4m3 outputs) from it, so that no time is quoted
for a wrong result."""
from __future__ import annotations

import argparse
import csv
import datetime
import importlib
import json
import math
import os
import platform
import statistics
import sys
import time
import zlib
from dataclasses import replace
from pathlib import Path

import torch
import triton
from triton.testing import do_bench, do_bench_cudagraph

import ogsgen
from ogsgen.numerics import FP8_BLOCK, dequantize_fp8_torch, dequantize_mx_torch, quantize_fp8_torch
from ogsgen.runtime import wgmma_hazards  # its _REPLACED: what the wgmma hazard check replaced

import deepgemm_peer
from ceilings import Ceilings, ImpossibleRate, exit_if_impossible, measure as measure_ceilings
from fetch_peers import DEEP_GEMM_DIR

MOE_SHAPES = {  # name: (E, top_k, K, N, mode)
    "gpt-oss w1": (128, 4, 2880, 5760, "gather"),
    "gpt-oss w2": (128, 4, 2880, 2880, "scatter"),
    "DeepSeek-V3 w1": (256, 8, 7168, 4096, "gather"),
    # other models' prefill shapes: many experts with top-8 and small K and N, few experts with a very wide N
    "Qwen3-30B-A3B w1": (128, 8, 2048, 1536, "gather"),
    "Mixtral-8x7B w1": (8, 2, 4096, 28672, "gather"),
    # the second matmuls of the fp8 checkpoints' models
    "DeepSeek-V3 w2": (256, 8, 2048, 7168, "scatter"),
    "Qwen3-30B-A3B w2": (128, 8, 768, 2048, "scatter"),
}
FP8_FORMATS = ("fp8e4m3_b128", "fp8e4m3_channel")  # checkpoint fp8 formats (x quantized by the call)
FP8_DOTS = (*FP8_FORMATS, "fp8e4m3", "mxfp4-e4m3x", "mxfp4-e4m3x-hopper")  # their yardstick and ceiling: fp8 cuBLAS
DENSE_YARDSTICK_TOKENS = 2048  # MoE cases from this many tokens also time a dense matmul of the same M·N·K
DENSE_SHAPES = [(8192, 8192, 8192), (4096, 5760, 2880), (64, 5760, 2880)]
GRAPH_ROUNDS, GRAPH_REP_MS = 3, 40


L2_FLUSH_BYTES = 256 << 20  # read before each cold call: five times an H100's or H200's L2 (50 MB)
COLD_CALLS_PER_GRAPH = 10
_flush_buffer = None


def cold_l2_graph_ms(fn, rep) -> float:
    """Median time (ms) of ``fn``'s calls replayed in a CUDA graph, each after a read of L2_FLUSH_BYTES that leaves
    none of its inputs in L2 (a read: the lines it leaves are clean, so no write-back is charged to the call) and
    timed by event nodes around it alone: a layer's time in a model, where the other layers' weights pass through
    L2 between two of its calls. Graph replays go on until ``rep`` ms of the calls' own time is measured."""
    global _flush_buffer
    if _flush_buffer is None:
        _flush_buffer = torch.zeros(L2_FLUSH_BYTES // 4, device="cuda")
    fn()  # compiled and its memory allocated before the capture
    starts, ends = ([torch.cuda.Event(enable_timing=True, external=True) for _ in range(COLD_CALLS_PER_GRAPH)]
                    for _ in range(2))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for start, end in zip(starts, ends):
            _flush_buffer.sum()
            start.record()
            fn()
            end.record()
    graph.replay()  # the first replay uploads the graph: not timed
    samples = []
    while sum(samples) < rep or len(samples) < 3 * COLD_CALLS_PER_GRAPH:
        graph.replay()
        torch.cuda.synchronize()
        samples += [start.elapsed_time(end) for start, end in zip(starts, ends)]
    return statistics.median(samples)


def graph_ms(fn, rep, l2) -> float:
    """CUDA-graph median (ms) of ``fn``: with L2 emptied before each call (``l2="cold"``), or back to back with what
    the last call left there (``"warm"``, the bench's method before 2026-12-07: inputs under L2's size stay in it)."""
    if l2 == "cold":
        return cold_l2_graph_ms(fn, rep)
    return do_bench_cudagraph(fn, rep=rep, return_mode="median")


def graph_medians(fns, l2="cold") -> list:
    """CUDA-graph medians (ms) of one case's implementations (``graph_ms``), timed in turn for GRAPH_ROUNDS rounds
    of GRAPH_REP_MS each, each the median of its rounds (an exception for one that fails). Large cases run at the
    GPU's power limit, with clocks that drift as it warms (2026-12-02, 43f4ed6; bench/NOTES.md): taking turns
    spreads the drift over the implementations instead of charging it to whichever runs last."""
    times = [[] for _ in fns]
    for _ in range(GRAPH_ROUNDS):
        for fn, samples in zip(fns, times):
            if samples and isinstance(samples[-1], Exception):
                continue
            try:
                samples.append(graph_ms(fn, GRAPH_REP_MS, l2))
            except Exception as exc:  # recorded as that implementation's error
                samples.append(exc)
    return [samples[-1] if isinstance(samples[-1], Exception) else statistics.median(samples) for samples in times]


def _peer_or_none(name, load):
    try:
        return load()
    except Exception as exc:  # not on PYTHONPATH, or an incompatible copy
        print(f"{name} not importable ({type(exc).__name__}: {exc}); peer left out", file=sys.stderr)


def triton_kernels_or_none():
    return _peer_or_none("triton_kernels", lambda: (importlib.import_module("triton_kernels.matmul_ogs"),
                                                    importlib.import_module("triton_kernels.routing")))


def vllm_or_none():
    def load():
        if importlib.import_module("vllm_peer_launch").fused_moe_kernel is None:
            raise ImportError("no vllm_fused_moe_kernel: python bench/fetch_peers.py third_party places it")
        return sys.modules["vllm_peer_launch"]
    return _peer_or_none("vLLM's fused_moe kernel", load)


def deep_gemm_or_none():
    def load():
        folders = [Path(p) / DEEP_GEMM_DIR for p in sys.path if (Path(p) / DEEP_GEMM_DIR).is_dir()]
        if not folders:
            raise ImportError(f"no {DEEP_GEMM_DIR} in PYTHONPATH's folders: python bench/fetch_peers.py third_party "
                              f"places it")
        return deepgemm_peer.load(folders[0])
    return _peer_or_none("DeepGEMM", load)


def vllm_fused_moe(vllm, x, w, logits, top_k, mode, fp8=None):
    """vLLM's fused_moe kernel on ogsgen's weights (passed as (E, N, K): the same memory, whatever its layout) and
    the same routing (top-k of the logits, gates renormalized by a softmax over the chosen logits), then its
    float32 reference: w1 (gather) gives y (T, top_k, N); w2 (scatter) reads x's rows in gate order (t*top_k+j) and
    gives y (T, N), each gate's row weighted by its gate and summed, as vLLM's fused_experts does. ``fp8``: e4m3 x
    and w of 128 x 128 blocks, (x's scales (rows, K / 128), w's (E, K / 128, N / 128), x dequantized, expert e's
    weights dequantized (K, N))."""
    chosen = torch.topk(logits, top_k, dim=1)
    topk_ids, gates = chosen.indices.to(torch.int32), torch.softmax(chosen.values, dim=1)
    tokens, w_enk = logits.shape[0], w.mT
    config = vllm.get_fp8_block_config(tokens) if fp8 else vllm.get_default_config(tokens, w.shape[0])
    x_scale, w_scale, x_ref, expert_w = fp8 or (None, None, x, w.__getitem__)
    # (the alignment precomputed, as its TritonExperts path does before the GEMM); w2: the same alignment over
    # gates t*top_k+j, A's rows are those gates (top_k 1 in the kernel)
    sorted_ids, expert_ids, padded_rows = vllm.prepare_expert_assignment(topk_ids, config, tokens, top_k, w.shape[0])
    gather = mode == "gather"
    flat_gates = None if gather else gates.reshape(-1).contiguous()
    out = torch.empty(tokens if gather else x.shape[0], top_k if gather else 1, w.shape[2], device=x.device,
                      dtype=torch.bfloat16)

    def run():
        vllm.invoke_fused_moe_kernel(x, w_enk, out, flat_gates, sorted_ids, expert_ids, padded_rows, not gather,
                                     top_k if gather else 1, config, x_scale, None if fp8 is None else w_scale.mT)
        return out if gather else out.view(tokens, top_k, -1).sum(1)
    gate_rows = torch.arange(topk_ids.numel(), device=x.device)  # gate t*top_k+j: token t's j-th expert

    def reference():
        per_gate = expert_products(x_ref, gate_rows // top_k if gather else gate_rows, topk_ids.reshape(-1).long(),
                                   expert_w, w.shape[2]).view(tokens, top_k, -1)
        return per_gate if gather else (per_gate * gates.unsqueeze(2)).sum(1)
    return run, reference


def triton_kernels_mxfp4(dense_w):
    """triton_kernels' own mxfp4 weights for Hopper (its swizzled value and scale layouts), as vLLM prepares them,
    and a function giving expert e's back dequantized (bf16, exact), (K, N), for the reference."""
    from triton_kernels.matmul_ogs import PrecisionConfig
    from triton_kernels.numerics_details.mxfp import downcast_to_mxfp, upcast_from_mxfp
    from triton_kernels.tensor import FP4, convert_layout, wrap_torch_tensor
    from triton_kernels.tensor_details import layout
    values, scales = downcast_to_mxfp(dense_w, torch.uint8, axis=1)
    value_layout, value_opts = layout.make_default_matmul_mxfp4_w_layout(mx_axis=1)
    scale_layout, scale_opts = layout.make_default_matmul_mxfp4_w_scale_layout(mx_axis=1, num_warps=8)
    w = convert_layout(wrap_torch_tensor(values, dtype=FP4), value_layout, **value_opts)
    w_scale = convert_layout(wrap_torch_tensor(scales), scale_layout, **scale_opts)
    return w, PrecisionConfig(weight_scale=w_scale), \
        lambda e: upcast_from_mxfp(values[e:e + 1], scales[e:e + 1], torch.bfloat16, axis=1)[0]


def seed_case(*key) -> None:
    """Seed torch's generators for one case: the same inputs, hence the same routing, in every run."""
    torch.manual_seed(zlib.crc32(repr(key).encode()))


def case_logits(name, tokens, n_expts=None, device="cuda") -> torch.Tensor:
    """The router's logits of a MoE case, the first draw from its seed (so its routing in every run and probe)."""
    seed_case(name, tokens)
    return torch.randn(tokens, n_expts or MOE_SHAPES[name][0], device=device)


def fp8_as_computed(x, weight_format):
    """x quantized as a call with these weights quantizes it, dequantized (float32)."""
    block = (1, FP8_BLOCK) if weight_format == "fp8e4m3_b128" else (1, 0)
    return dequantize_fp8_torch(*quantize_fp8_torch(x.float(), block), block)


def dequantized_expert(prepared, e) -> torch.Tensor:
    """Expert e of PreparedWeights in float32, (K, N): dequantize() of that expert alone."""
    return replace(prepared, w=prepared.w[e:e + 1], weight_scale=prepared.weight_scale[e:e + 1]).dequantize()[0]


def expert_products(x, rows, experts, expert_w, n) -> torch.Tensor:
    """y[i] = x[rows[i]] @ w[experts[i]] in float32 (0 past the end of ``experts``), ``expert_w(e)`` (K, n) asked once
    per expert, one at a time: a reference holds one expert's weights in float32, not all (DeepSeek-V3's: 28 GiB)."""
    y = torch.zeros(len(rows), n, device=x.device)
    for e in torch.unique(experts).tolist():
        picked = (experts == e).nonzero().squeeze(1)
        y[picked] = x[rows[picked]].float() @ expert_w(e).float()
    return y


def moe_reference(x, expert_w, n, routing_data, gather_indx=None, scatter_indx=None, gammas=None):
    """matmul_ogs_torch's float32 result (rows in the routing's order), from one expert's weights at a time."""
    k = routing_data.n_expts_act
    rows = gather_indx.src_indx.long() // k if gather_indx is not None else torch.arange(x.shape[0], device=x.device)
    experts = torch.repeat_interleave(routing_data.expt_hist.long())  # the routing's rows come sorted by expert
    y = expert_products(x, rows, experts, expert_w, n)
    if gammas is not None:
        y *= gammas[:, None]
    if scatter_indx is not None:
        routed, summed = scatter_indx.dst_indx >= 0, torch.zeros(len(rows) // k, n, device=x.device)
        y = summed.index_add_(0, scatter_indx.dst_indx[routed].long() // k, y[routed])
    return y


def moe_cases(name, tokens, weight_format, tk, logits=None, lib=ogsgen, vllm=None, deep_gemm=None, dims=None,
              device="cuda"):
    """(implementation, call, flops, bytes moved) of one MoE case, then its references; ``logits``: the router's
    (tokens, experts) logits, the case's own (``case_logits``) unless given (a probe's chosen routing); ``lib``: the
    ogsgen package whose calls are timed (a probe imports an earlier tree's under another name); ``vllm``: the
    vLLM peer's launcher module (vllm_or_none), timed on the bf16 formats and fp8e4m3_b128; ``deep_gemm``:
    DeepGEMM's module (deep_gemm_or_none), timed on fp8e4m3_b128; ``dims``: (E, top_k, K, N, mode) instead of the
    shape's and ``device`` "cpu" (tests: the operands a Hopper GPU would take, through the interpreter)."""
    n_expts, top_k, k, n, mode = dims or MOE_SHAPES[name]
    drawn = case_logits(name, tokens, n_expts, device)  # drawn either way: x and w stay the case's own
    logits = drawn if logits is None else logits
    rd, gi, si = lib.routing(logits, top_k)
    rows = tokens * top_k
    x = torch.randn((tokens if mode == "gather" else rows), k, device=device).bfloat16()
    dense_w = torch.randn(n_expts, k, n, device=device).bfloat16()
    active = int((rd.expt_hist > 0).sum())
    # The second matmul of a layer weights each row by its gate (gammas) as it scatters.
    kwargs = dict(gather_indx=gi) if mode == "gather" else dict(scatter_indx=si, gammas=rd.gate_scal.float())
    if weight_format.startswith("mxfp4"):
        values, scales = lib.numerics.quantize_mx(dense_w.mT.contiguous(), "e2m1", axis=-1)
        hopper = weight_format != "mxfp4-strided" and (device == "cpu" or torch.cuda.get_device_capability()[0] == 9)
        layout = "hopper_fp8" if weight_format == "mxfp4-e4m3x" else "hopper"
        w = lib.swizzle_mx_values(values.mT, layout) if hopper else values.mT
        # Scales N-contiguous, as prepare_expert_weights stores them; mxfp4-kscales (a probe): K-contiguous.
        pc = lib.PrecisionConfig(weight_scale=scales.mT if weight_format == "mxfp4-kscales"
                                    else scales.mT.contiguous())
        if weight_format.startswith("mxfp4-e4m3x"):  # fp8 tensor cores: x in e4m3, a scale per row (docs/formats.md)
            x, x_scale = lib.numerics.quantize_fp8(x, (1, 0))
            pc.act_scale = x_scale
        elif weight_format == "mxfp4-mxfp8x":  # the seed's MX activations, upcast to bf16 in registers
            x, pc.act_scale = lib.numerics.quantize_mx(x, "e4m3")
        w_bytes = active * k * n // 2
        expert_w = lambda e: dequantize_mx_torch(values[e], scales[e], "e2m1").mT  # noqa: E731  (exact in float32)
    elif weight_format in FP8_FORMATS:
        # A checkpoint's fp8 weights, (E, N, K) as stored, K-contiguous in (E, K, N); x quantized by the call
        prepared = lib.prepare_expert_weights(dense_w.mT, format=weight_format)
        w, pc = prepared.w, prepared.precision_config()
        w_bytes = active * k * n + active * prepared.weight_scale[0].numel() * 4
        expert_w = lambda e: dequantized_expert(prepared, e)  # noqa: E731
    elif weight_format == "fp8e4m3":  # per-tensor fp8: one scale per expert's w and one for x, quantized beforehand
        prepared, x_scale = lib.prepare_expert_weights(dense_w.mT, format="fp8e4m3"), x.abs().amax().float() / 448
        x = (x.float() / x_scale).to(torch.float8_e4m3fn)
        w, pc = prepared.w, prepared.precision_config(flex_ctx=lib.FlexCtx(lib.InFlexData(scale=x_scale[None])))
        w_bytes = active * k * n
        expert_w = lambda e: prepared.w[e].float() * prepared.scale[e]  # noqa: E731
    elif weight_format in ("bf16", "bf16-kmajor"):
        # bf16-kmajor: the same values K-contiguous, as nn.Linear checkpoints and vLLM's (E, N, K) weights hold them
        w, pc = (dense_w if weight_format == "bf16" else dense_w.mT.contiguous().mT), lib.PrecisionConfig()
        w_bytes = active * k * n * 2
        expert_w = dense_w.__getitem__
    else:
        raise ValueError(f"unknown weight format {weight_format!r}: bf16, bf16-kmajor, mxfp4, mxfp4-kscales, "
                         f"mxfp4-strided, mxfp4-e4m3x(-hopper), mxfp4-mxfp8x, {', '.join(FP8_FORMATS)}")
    bytes_moved = x.numel() * x.element_size() + w_bytes + (rows if mode == "gather" else tokens) * n * 2
    flops = 2 * rows * k * n
    # fp8 formats: the reference takes x as the call quantizes it (the contract: docs/formats.md)
    x_ref = fp8_as_computed(x, weight_format) if weight_format in FP8_FORMATS else x
    x_ref = x.float() * pc.act_scale if weight_format.startswith("mxfp4-e4m3x") else x_ref
    x_ref = x.float() * x_scale if weight_format == "fp8e4m3" else x_ref
    x_ref = dequantize_mx_torch(x, pc.act_scale, "e4m3") if weight_format == "mxfp4-mxfp8x" else x_ref
    yield "ogsgen", lambda: lib.matmul_ogs(x, w, None, rd, precision_config=pc, **kwargs), flops, bytes_moved
    x8, x8_scale = x, None  # x as the peers take it
    if weight_format in FP8_FORMATS:  # the GEMM alone too, on x quantized beforehand (per row and 128 columns, or row)
        x8, x8_scale = lib.numerics.quantize_fp8(x, (1, FP8_BLOCK) if weight_format == "fp8e4m3_b128" else (1, 0))
        pre = replace(pc, act_scale=x8_scale)
        yield "ogsgen, e4m3 x", lambda: lib.matmul_ogs(x8, w, None, rd, precision_config=pre, **kwargs), flops, \
            bytes_moved
    if weight_format == "fp8e4m3_b128" and mode == "gather":  # w1's rows as w2's e4m3 input, fused or by a pass
        fused = replace(pc, out_scale=torch.empty(rows, n // FP8_BLOCK, device=device))
        for impl, run in (("ogsgen, e4m3 y", lambda: lib.matmul_ogs(x, w, None, rd, precision_config=fused,
                                                                     **kwargs)),
                          ("ogsgen, bf16 y + quantize_fp8", lambda: lib.numerics.quantize_fp8(
                              lib.matmul_ogs(x, w, None, rd, precision_config=pc, **kwargs), (1, FP8_BLOCK))[0])):
            yield impl, run, flops, bytes_moved  # (e4m3 values checked: their scales, amax / 448, are the reference's)
            yield f"reference {impl}", lambda: quantize_fp8_torch(moe_reference(x_ref, expert_w, n, rd, **kwargs),
                                                                  (1, FP8_BLOCK))[0], None, None
    if tk is not None and weight_format not in (*FP8_DOTS, "mxfp4-mxfp8x"):  # (no such format there)
        tk_matmul, tk_routing = tk
        t_rd, t_gi, t_si = tk_routing.routing(logits, top_k)
        t_kwargs = (dict(gather_indx=t_gi) if mode == "gather"
                    else dict(scatter_indx=t_si, gammas=t_rd.gate_scal.float()))
        t_indices = dict(t_kwargs)
        t_expert_w = dense_w.__getitem__
        if weight_format.startswith("mxfp4"):
            try:
                t_w, t_pc, t_expert_w = triton_kernels_mxfp4(dense_w)
                t_kwargs["precision_config"] = t_pc
            except Exception as exc:  # recorded as this peer's error row
                t_w, t_kwargs = exc, {}
        else:
            t_w = w

        def run_triton_kernels():
            if isinstance(t_w, Exception):
                raise t_w
            return tk_matmul.matmul_ogs(x, t_w, None, t_rd, **t_kwargs)
        yield "triton_kernels", run_triton_kernels, flops, bytes_moved
        # Its own reference: its routing's row order, and for mxfp4 its own quantization of the same weights.
        yield "reference triton_kernels", lambda: moe_reference(x_ref, t_expert_w, n, t_rd, **t_indices), None, None
    # The peers' fp8 GEMMs alone, on x8 (laid out by each peer before the timed call)
    if (weight_format.startswith("bf16") or weight_format == "fp8e4m3_b128") and vllm is not None:
        fp8 = None if x8_scale is None else (x8_scale, prepared.weight_scale, x_ref, expert_w)
        run_vllm, vllm_reference = vllm_fused_moe(vllm, x8, w, logits, top_k, mode, fp8)
        yield "vLLM fused_moe", run_vllm, flops, bytes_moved
        yield "reference vLLM fused_moe", vllm_reference, None, None
    if weight_format == "fp8e4m3_b128" and deep_gemm is not None:  # masked: its decode layout
        topk_ids = torch.topk(logits, top_k, dim=1).indices
        for impl, layout in (("DeepGEMM contiguous", deepgemm_peer.contiguous),
                             ("DeepGEMM masked", deepgemm_peer.masked))[:2 if tokens <= 256 else 1]:
            try:
                run, reference = layout(deep_gemm, x8, x8_scale, w, prepared.weight_scale, topk_ids, mode == "gather",
                                        lambda src, experts: expert_products(x_ref, src, experts, expert_w, n))
            except Exception as exc:  # recorded as this peer's error row
                def run(exc=exc):
                    raise exc
                reference = None
            yield impl, run, flops, bytes_moved
            if reference is not None:
                yield f"reference {impl}", reference, None, None
    if weight_format.startswith("bf16"):
        if hasattr(torch, "_grouped_mm"):
            x_sorted = (x[gi.src_indx.long() // top_k] if mode == "gather" else x).contiguous()
            offs = torch.cumsum(rd.expt_hist, 0).to(torch.int32)
            w_grouped = dense_w.mT.contiguous().mT
            yield "torch._grouped_mm", (lambda: torch._grouped_mm(x_sorted, w_grouped, offs=offs)), flops, \
                bytes_moved
    if tokens >= DENSE_YARDSTICK_TOKENS:  # what the GPU's dense matmul reaches on the same M·N·K, without routing
        x_dense = torch.randn(rows, k, device=device).bfloat16()
        w_dense = dense_w[0]
        if weight_format in FP8_DOTS:  # fp8 cuBLAS (per-tensor scales), the fp8 yardstick
            # (names of their own: the calls above read x8 when they run, after this)
            xd8, wd8, one = x_dense.to(torch.float8_e4m3fn), w_dense.mT.contiguous().mT.to(torch.float8_e4m3fn), \
                torch.ones((), device=device)
            yield "dense cuBLAS", (lambda: torch._scaled_mm(xd8, wd8, one, one, out_dtype=torch.bfloat16)), flops, \
                rows * k + k * n + rows * n * 2
            yield "reference dense cuBLAS", (lambda: xd8.float() @ wd8.float()), None, None
        else:
            yield "dense cuBLAS", (lambda: torch.matmul(x_dense, w_dense)), flops, (rows * k + k * n + rows * n) * 2
            yield "reference dense cuBLAS", (lambda: x_dense.float() @ w_dense.float()), None, None
    yield "reference", lambda: moe_reference(x_ref, expert_w, n, rd, **kwargs), None, None


LAYER_MODELS = ("DeepSeek-V3", "Qwen3-30B-A3B")  # their w1 and w2 in MOE_SHAPES


def layer_cases(model, tokens, vllm, lib=ogsgen, dims=None, device="cuda"):
    """(implementation, call, flops, bytes moved) of a whole fp8e4m3_b128 MoE layer, then its references: x
    quantized per row and 128 columns, w1 on the gathered rows with SiLU-and-mul (silu(gate) * up, the checkpoint's
    gate and up concatenated), h quantized per row and 128 columns, w2 times the gates, summed per token. ogsgen:
    two matmul_ogs calls, w1 writing e4m3 h and its scales. vLLM's pieces: its fused_moe kernel for w1 and for w2
    (times the gates), and for what vLLM runs as kernels of its own, ogsgen's quantize_fp8 (its per-token-group
    quantization), torch.compile's SiLU-and-mul and torch's sum over the top k. The routing is outside both (vLLM's
    alignment computed beforehand). ``dims``: (E, top_k, hidden, intermediate) instead of the model's (tests)."""
    n_expts, top_k, hidden, inter = dims or (*MOE_SHAPES[f"{model} w1"][:3], MOE_SHAPES[f"{model} w2"][2])
    seed_case(model, "layer", tokens)
    logits = torch.randn(tokens, n_expts, device=device)
    x = torch.randn(tokens, hidden, device=device).bfloat16()
    # checkpoint order (E, out, in), gate then up along w1's out, as vLLM reads them (drawn in bf16: DeepSeek-V3's
    # w1 is 15 GB so)
    w1 = lib.prepare_expert_weights(torch.randn(n_expts, 2 * inter, hidden, device=device, dtype=torch.bfloat16)
                                    .div_(hidden ** 0.5), format="fp8e4m3_b128")
    w2 = lib.prepare_expert_weights(torch.randn(n_expts, hidden, inter, device=device, dtype=torch.bfloat16)
                                    .div_(inter ** 0.5), format="fp8e4m3_b128")
    w13 = lib.prepare_expert_weights(w1.w.mT, weight_scale=w1.weight_scale.mT, gate_up="concatenated",
                                     format="fp8e4m3_b128")  # the same values, ordered for the fused activation
    rd, gi, si = lib.routing(logits, top_k)
    h_scales = torch.empty(tokens * top_k, inter // FP8_BLOCK, device=device)
    w13_pc, w2_pc = w13.precision_config(out_scale=h_scales), w2.precision_config(act_scale=h_scales)
    silu_and_mul = lib.FusedActivation(lib.silu_and_mul)

    def ogsgen_layer():
        h = lib.matmul_ogs(x, w13.w, None, rd, gather_indx=gi, fused_activation=silu_and_mul, precision_config=w13_pc)
        return lib.matmul_ogs(h, w2.w, None, rd, scatter_indx=si, gammas=rd.gate_scal, precision_config=w2_pc)

    chosen = torch.topk(logits, top_k, dim=1)
    topk_ids, gates = chosen.indices.to(torch.int32), torch.softmax(chosen.values, dim=1)
    config = vllm.get_fp8_block_config(tokens) if vllm is not None else None
    alignment = vllm.prepare_expert_assignment(topk_ids, config, tokens, top_k, n_expts) if vllm is not None else None
    flat_gates, flat_experts = gates.reshape(-1).contiguous(), topk_ids.reshape(-1).long()
    act = torch.compile(lambda a: torch.nn.functional.silu(a[:, :inter]) * a[:, inter:])
    a1 = torch.empty(tokens, top_k, 2 * inter, device=device, dtype=torch.bfloat16)
    y2 = torch.empty(tokens * top_k, 1, hidden, device=device, dtype=torch.bfloat16)

    def vllm_layer():
        x8, x_scale = lib.numerics.quantize_fp8(x, (1, FP8_BLOCK))
        vllm.invoke_fused_moe_kernel(x8, w1.w.mT, a1, None, *alignment, False, top_k, config, x_scale,
                                     w1.weight_scale.mT)
        h8, h_scale = lib.numerics.quantize_fp8(act(a1.view(-1, 2 * inter)), (1, FP8_BLOCK))
        vllm.invoke_fused_moe_kernel(h8, w2.w.mT, y2, flat_gates, *alignment, True, 1, config, h_scale,
                                     w2.weight_scale.mT)  # (h's rows are the gates t * top_k + j: top_k 1)
        return y2.view(tokens, top_k, hidden).sum(1)

    def reference(h_via_bf16: bool):
        """Float32, one expert at a time; h quantized from float32 (as ogsgen's w1 does) or, ``h_via_bf16``, from
        w1's output rounded to bf16 and SiLU-and-mul's too (as vLLM's pieces do)."""
        gate_rows = torch.arange(tokens * top_k, device=device)  # gate t * top_k + j: token t's j-th expert
        a = expert_products(fp8_as_computed(x, "fp8e4m3_b128"), gate_rows // top_k, flat_experts,
                            lambda e: dequantized_expert(w1, e), 2 * inter)
        a = a.bfloat16().float() if h_via_bf16 else a
        h = torch.nn.functional.silu(a[:, :inter]) * a[:, inter:]
        h = dequantize_fp8_torch(*quantize_fp8_torch(h.bfloat16().float() if h_via_bf16 else h, (1, FP8_BLOCK)),
                                 (1, FP8_BLOCK))
        y = expert_products(h, gate_rows, flat_experts, lambda e: dequantized_expert(w2, e), hidden)
        return (y.view(tokens, top_k, hidden) * gates[:, :, None]).sum(1)

    active = int((rd.expt_hist > 0).sum())
    flops = 2 * tokens * top_k * 3 * hidden * inter
    bytes_moved = tokens * hidden * 2 * 2 + active * 3 * hidden * inter
    yield "ogsgen", ogsgen_layer, flops, bytes_moved
    yield "reference ogsgen", lambda: reference(False), None, None
    if vllm is not None:
        yield "vLLM fused_moe", vllm_layer, flops, bytes_moved
        yield "reference vLLM fused_moe", lambda: reference(True), None, None


def dense_cases(m, n, k, tk, lib=ogsgen):
    seed_case(m, n, k)
    x = torch.randn(m, k, device="cuda").bfloat16()
    w = torch.randn(k, n, device="cuda").bfloat16()
    flops, bytes_moved = 2 * m * n * k, (m * k + k * n + m * n) * 2
    yield "ogsgen", (lambda: lib.matmul_ogs(x, w, None)), flops, bytes_moved
    if tk is not None:
        yield "triton_kernels", (lambda: tk[0].matmul_ogs(x, w, None)), flops, bytes_moved
    yield "torch.matmul", (lambda: torch.matmul(x, w)), flops, bytes_moved
    yield "reference", (lambda: torch.matmul(x.float(), w.float())), None, None


def host_overhead_us(fn, calls=200):
    """Wall time per eager call on the host, the queue kept short by a sync every 20 calls."""
    fn()
    torch.cuda.synchronize()
    total = 0.0
    for _ in range(calls // 20):
        start = time.perf_counter()
        for _ in range(20):
            fn()
        total += time.perf_counter() - start
        torch.cuda.synchronize()
    return total / calls * 1e6


PEERS = (("triton_kernels", "triton_kernels"), ("vLLM fused_moe", "vllm"), ("torch._grouped_mm", "torch"),
         ("torch.matmul", "torch"), ("DeepGEMM contiguous", "deepgemm"), ("DeepGEMM masked", "deepgemm masked"))
ERROR_LIMIT = 1e-2  # relative rms error; bf16 rounding gives ~4e-3, a corrupted result ~1e-1
# e4m3 outputs against the reference quantized alike: a step of e4m3 (6-12%) where a rounding before the
# quantization crosses one of its boundaries (a bf16 output quantized afterwards: ~1.2e-2; in-kernel from float32:
# ~1e-4), a wrong scale or value ~1
FP8_OUTPUT_ERROR_LIMIT = 3e-2


def hazard_replacements() -> str:
    """What matmul_ogs ran instead of MX binaries with the wgmma register hazard since ``_REPLACED`` was last
    cleared (ogsgen.runtime.wgmma_hazards): "" (none), "wait" (the tile's waiting kernel), or fallback tiles
    such as "16x128x128x8x3" ("-wait" appended where the fallback tile waits for each wgmma)."""
    def name(original, ran):
        if ran == original.waiting():
            return "wait"
        tile = "x".join(map(str, (ran.block_m, ran.block_n, ran.block_k, ran.num_warps, ran.num_stages)))
        return tile + "-wait" if ran.wait_mma else tile
    return " ".join(sorted({name(original, ran) for (original, _), ran in wgmma_hazards._REPLACED.items()}))


def relative_errors(output, reference) -> tuple[float, float] | None:
    """(rms, max) of output - reference relative to the reference's rms and max magnitude; None when the output
    does not hold the reference's rows (torch._grouped_mm after a scatter, which it does not do)."""
    if not isinstance(output, torch.Tensor) or output.shape != reference.shape:
        return None
    diff = output.float() - reference
    rms = (diff.pow(2).mean().sqrt() / reference.pow(2).mean().sqrt().clamp_min(1e-30)).item()
    return rms, (diff.abs().max() / reference.abs().max().clamp_min(1e-30)).item()


def markdown_table(rows) -> str:
    """results.csv rows as markdown: per case ogsgen's CUDA-graph time, TF/s and TB/s, each peer's time and
    peer / ogsgen (> 1: ogsgen is faster); then per weight format the geometric mean and the minimum of each
    peer / ogsgen over the MoE cases, and for fp8 formats of each peer / ogsgen's GEMM alone ("ogsgen, e4m3 x": on x
    quantized beforehand, as the peers take it)."""
    graph = {(r["case"], r["impl"]): float(r["graph_us"]) for r in rows if r["graph_us"] not in ("", None)}
    ours = {r["case"]: r for r in rows if r["impl"] == "ogsgen" and (r["case"], "ogsgen") in graph}
    columns = ("triton_kernels", "vllm", "torch", "deepgemm")
    lines = ["| case | ogsgen graph µs | TF/s | TB/s | triton_kernels µs | tk / ogsgen | vLLM fused_moe µs "
             "| vLLM / ogsgen | torch µs | torch / ogsgen | DeepGEMM µs | DeepGEMM / ogsgen | dense cuBLAS TF/s "
             "| ogsgen / dense |", "|---" * 14 + "|"]
    ratios = {}  # (peer, weight format, against): peer / ogsgen (or its GEMM alone) over the MoE cases
    alone = " / ogsgen's GEMM alone (x quantized beforehand, as the peer takes it)"
    for case, row in ours.items():
        t = graph[(case, "ogsgen")]
        cells = {}
        for impl, column in PEERS:
            if (case, impl) in graph:
                cells[column] = f"{graph[(case, impl)]:.1f} | {graph[(case, impl)] / t:.2f}"
                if "T=" in case and column != "torch":
                    ratios.setdefault((impl, case.split()[-2], " / ogsgen"), []).append(graph[(case, impl)] / t)
                    if (case, "ogsgen, e4m3 x") in graph:
                        ratios.setdefault((impl, case.split()[-2], alone), []).append(
                            graph[(case, impl)] / graph[(case, "ogsgen, e4m3 x")])
        dense = graph.get((case, "dense cuBLAS"))  # same flops: the TF/s ratio is the time ratio
        dense_cells = (f"{float(row['tflops']) * t / dense:.1f} | {dense / t:.2f}" if dense else "n/a | n/a")
        lines.append(f"| {case} | {t:.1f} | {float(row['tflops']):.1f} | {float(row['tbps']):.2f} | "
                     + " | ".join(cells.get(column, "n/a | n/a") for column in columns)
                     + f" | {dense_cells} |")
    lines.append("")
    checked = [r for r in rows if r.get("rms_err") not in (None, "", "n/a")]
    off = [f"{r['case']} {r['impl']} ({float(r['rms_err']):.1e})" for r in checked
           if float(r["rms_err"]) > float(r.get("rms_limit") or ERROR_LIMIT)]
    if off:
        lines.append(f"- outputs off the float32 reference (relative rms error above {ERROR_LIMIT:g}, "
                     f"{FP8_OUTPUT_ERROR_LIMIT:g} for e4m3 outputs): {'; '.join(off)}")
    replaced = [f"{r['case']} ({r['replaced_by']})" for r in rows if r.get("replaced_by")]
    if replaced:
        lines.append(f"- ogsgen MX binaries with the wgmma register hazard, run instead as (fallback tile, or wait): "
                     f"{'; '.join(replaced)}")
    for (peer, weight_format, against), values in ratios.items():
        geomean = math.exp(sum(math.log(v) for v in values) / len(values))
        lines.append(f"- {weight_format} MoE, {len(values)} cases: {peer}{against} geometric mean "
                     f"{geomean:.2f}, minimum {min(values):.2f}")
    return "\n".join(lines) + "\n"


def measure_case(case: str, items, ceilings: Ceilings, fp8: bool = False, l2: str = "cold") -> list[dict]:
    """results.csv rows of one case from its (impl, fn, flops, bytes) items (moe_cases, dense_cases): each
    implementation's eager median, its CUDA-graph median (graph_medians, ``l2``: all of them in turn) and its errors
    against the float32 references among the items ("reference IMPL" for IMPL's own, then "reference" for the
    others). A rate above ``ceilings`` (bench/ceilings.py; ``fp8``: fp8 products, the fp8 ceiling) is an error in
    the row, not a rate."""
    items, rows, timed = list(items), [], []  # timed: (row, fn, output, flops, bytes moved)
    for impl, fn, flops, bytes_moved in items:
        if impl.startswith("reference"):
            continue
        row = dict(case=case, impl=impl, eager_us="", graph_us="", tflops="", tbps="", error="", rms_err="",
                   max_err="", rms_limit="", replaced_by="")
        try:
            wgmma_hazards.forget_hazard_replacements()  # the row then says what replaced its MX binaries, if anything
            output = fn()
            if impl == "ogsgen":
                row["replaced_by"] = hazard_replacements()
            row["eager_us"] = do_bench(fn, warmup=25, rep=100, return_mode="median") * 1e3
            timed.append((row, fn, output, flops, bytes_moved))
        except Exception as exc:
            row["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
        rows.append(row)
    for (row, _, _, flops, bytes_moved), ms in zip(timed, graph_medians([fn for _, fn, *_ in timed], l2)):
        if isinstance(ms, Exception):
            row.update(eager_us="", error=f"{type(ms).__name__}: {str(ms).splitlines()[0][:160]}")
        else:
            tflops, tbps = flops / (ms * 1e-3) / 1e12, bytes_moved / (ms * 1e-3) / 1e12
            try:
                # (cuBLAS's dense row is the ceiling's own kind of rate: at a case's shape it may pass the 8192^3 one)
                ceilings.check(f"{case} {row['impl']}", None if "cuBLAS" in row["impl"] else tflops, tbps, fp8=fp8)
                row.update(graph_us=ms * 1e3, tflops=tflops, tbps=tbps)
            except ImpossibleRate as exc:
                row.update(eager_us="", error=f"ImpossibleRate: {exc}")
    for impl, fn, _, _ in items:
        if not impl.startswith("reference"):
            continue
        reference, target = fn().float(), impl[len("reference "):]
        for row, _, output, _, _ in timed:
            if row["rms_err"] or row["error"] or (target and row["impl"] != target):
                continue
            errors = relative_errors(output, reference)
            if errors is None:
                row.update(rms_err="n/a", max_err="n/a")
                continue
            limit = FP8_OUTPUT_ERROR_LIMIT if output.dtype == torch.float8_e4m3fn else ERROR_LIMIT
            row.update(rms_err=f"{errors[0]:.2e}", max_err=f"{errors[1]:.2e}", rms_limit=limit)
            if errors[0] > limit:
                print(f"{case:42s} {row['impl']:18s} OUTPUT OFF THE REFERENCE: rms {errors[0]:.2e}", flush=True)
    for row in rows:
        print(f"{case:42s} {row['impl']:18s} " + (f"graph {row['graph_us']:9.1f} us  eager {row['eager_us']:9.1f} us  "
                                                  f"{row['tflops']:6.1f} TF/s {row['tbps']:5.2f} TB/s"
                                                  if not row["error"] else row["error"]), flush=True)
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path)
    parser.add_argument("--table-from", type=Path, metavar="DIR", help="write DIR/table.md from DIR/results.csv")
    parser.add_argument("--tokens", type=int, nargs="+", default=[1, 8, 32, 256, 2048, 8192])
    parser.add_argument("--shapes", nargs="*", default=list(MOE_SHAPES), help="MoE shapes (none: only --layers)")
    parser.add_argument("--layers", nargs="*", default=[], choices=LAYER_MODELS,
                        help="also the whole fp8e4m3_b128 layer of these models against vLLM's pieces")
    parser.add_argument("--formats", nargs="+", default=["bf16", "bf16-kmajor", "mxfp4"])
    parser.add_argument("--no-dense", action="store_true")
    parser.add_argument("--l2", choices=("cold", "warm"), default="cold",
                        help="graph times with L2 emptied before each call (cold), or back to back (warm: the "
                             "method before 2026-12-07)")
    args = parser.parse_args()
    if args.table_from:
        with open(args.table_from / "results.csv", newline="") as f:
            (args.table_from / "table.md").write_text(markdown_table(list(csv.DictReader(f))))
        return
    if args.out is None:
        parser.error("--out DIR is required (or --table-from DIR)")
    args.out.mkdir(parents=True, exist_ok=True)
    tk, vllm = triton_kernels_or_none(), vllm_or_none()
    deep_gemm = deep_gemm_or_none() if any(f == "fp8e4m3_b128" for f in args.formats) else None
    ceilings = measure_ceilings()
    write_env(args.out, triton_kernels=tk is not None, vllm_fused_moe=vllm is not None,
              deep_gemm=getattr(deep_gemm, "__version__", None), ceilings=ceilings.as_dict(), l2=args.l2)
    rows = []

    for name in args.shapes:
        for weight_format in args.formats:
            for tokens in args.tokens:
                items = moe_cases(name, tokens, weight_format, tk, vllm=vllm, deep_gemm=deep_gemm)
                rows += measure_case(f"{name} {weight_format} T={tokens}", items, ceilings,
                                     fp8=weight_format in FP8_DOTS, l2=args.l2)
                write_csv(rows, args.out / "results.csv")  # what is measured so far survives a later failure
                torch.cuda.empty_cache()
    for model in args.layers:
        for tokens in args.tokens:
            rows += measure_case(f"{model} fp8e4m3_b128-layer T={tokens}", layer_cases(model, tokens, vllm),
                                 ceilings, fp8=True, l2=args.l2)
            write_csv(rows, args.out / "results.csv")
            torch.cuda.empty_cache()
    if not args.no_dense:
        for m, n, k in DENSE_SHAPES:
            rows += measure_case(f"dense bf16 {m}x{n}x{k}", dense_cases(m, n, k, tk), ceilings, l2=args.l2)
    # Host overhead of one eager call of a cached variant (gpt-oss w1, T=1, gather, bf16).
    for impl, fn, _, _ in moe_cases("gpt-oss w1", 1, "bf16", tk, vllm=vllm):
        if impl.startswith("reference"):
            continue
        rows.append(dict(case="host overhead T=1 gather", impl=impl, eager_us=host_overhead_us(fn), graph_us="",
                         tflops="", tbps="", error="", rms_err="", max_err=""))
        print(f"host overhead per eager call      {impl:18s} {rows[-1]['eager_us']:.1f} us")

    write_csv(rows, args.out / "results.csv")
    (args.out / "table.md").write_text(markdown_table(rows))
    plot(rows, args.out / "results.png")
    exit_if_impossible(rows)


def write_env(out: Path, **facts) -> None:
    """out/env.json: the run's date, GPU, versions and command, and ``facts``."""
    env = {"date": datetime.date.today().isoformat(), "gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
           "triton": triton.__version__, "ogsgen": ogsgen.__version__, "python": platform.python_version(),
           "command": " ".join([os.path.basename(sys.executable), *sys.argv]), **facts}
    (out / "env.json").write_text(json.dumps(env, indent=2) + "\n")


def write_csv(rows, path):
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(dict.fromkeys(key for row in rows for key in row)))
        writer.writeheader()
        writer.writerows(rows)


def plot(rows, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    cases = [r["case"] for r in rows if r["graph_us"] != "" and r["impl"] == "ogsgen"]
    impls = sorted({r["impl"] for r in rows if r["graph_us"] != ""})
    fig, ax = plt.subplots(figsize=(12, max(4, 0.3 * len(cases))))
    height = 0.8 / max(1, len(impls))
    for i, impl in enumerate(impls):
        times = {r["case"]: r["graph_us"] for r in rows if r["impl"] == impl and r["graph_us"] != ""}
        ax.barh([j + i * height for j in range(len(cases))], [times.get(c, 0) for c in cases], height=height,
                label=impl)
    ax.set_yticks([j + 0.4 for j in range(len(cases))], cases, fontsize=7)
    ax.set_xscale("log")
    ax.set_xlabel("CUDA-graph median time (us), lower is better")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
