"""``ogsgen warmup``: compile the built kernel variants for this GPU ahead of time.

Triton compiles one binary per kernel, constexpr values, launch options and specialization of the
integer and pointer arguments (1, a multiple of 16, other; 16-byte aligned or not), and keeps it in its
on-disk cache (``TRITON_CACHE_DIR``): a later process that launches the same specialization loads the
binary instead of compiling. Warm-up launches every built matmul variant once per launch configuration
the opt-flags heuristic can choose (``reachable_flags``) and per K tail case (``EVEN_K``), through
``matmul_ogs`` itself on small inputs whose integers fall in the classes real models give: sizes and
strides multiples of 16, unit inner strides, aligned buffers, the operand layouts
``prepare_expert_weights`` makes. Row counts are runtime arguments the kernels do not specialize on, so no
batch size compiles anything afterwards. Top-k is one: a scatter with k = 1 runs the matmul variant itself, with
k > 1 its rows go through the top-k reduce, which takes k as a constant (its k rows per token load together);
warm-up covers k = 1, 2, 4 and 8.

The routing kernels (histogram, ragged metadata) are warmed for up to 1024 experts. Ragged-K (``inner``) variants
are warmed as training's backward calls them: block_k 32, unpadded operands, x the transposed token (or sorted)
rows.

Fused-communication variants are warmed as all-gathers over 1, 2, 4 and 8 ranks (the rank count is a constant of
the kernel) and as rows sent to shards; so is the top-k reduce that sends a scatter's token rows (top-k 1, 2, 4, 8).

The warp-specialized fp8e4m3_b128 kernel (Gluon, sm_90 prefill) is warmed at its heuristic's launch, K a multiple
of 128, w's scales per 128 columns (as the tiled kernels: per-column scales of interleaved gate/up weights are a
binary of their own).

Not covered, compiled on first use: N or K not a multiple of 16, ragged-K calls with padded operands or another
block_k, fused communication over other rank counts, operands with other strides (MX scales K-contiguous among
them: Hopper gives them tiles of their own), enforce_bitwise_invariance, top-k other than 1, 2, 4 and 8, and custom
functions whose runtime arguments are not floats (such calls are reported as failed, the rest goes on). Triton's
cache key of a kernel depends on which kernels sharing its helpers were compiled before it in
the process unless the helpers' keys exist first; ogsgen.numerics.jit keys its helpers at import
(``settle_triton_cache_keys``), so a binary warmed here is found whatever a later process calls first.
"""
from __future__ import annotations

import itertools
import multiprocessing
import time
from dataclasses import asdict, dataclass, field, replace
from queue import Empty

import torch

from ..devices import target
from ..errors import OgsgenError
from ..moe.routing import routing, routing_from_topk
from ..moe.weights import prepare_expert_weights
from ..numerics.fp8_blocks import quantize_fp8
from ..numerics.kernels import quantize_mx
from ..numerics.layouts import swizzle_mx_values
from ..spec.catalog import default_catalog, load_catalog_file
from ..spec.variant import KernelVariant, canonical_name
from ..types import (INNER_BLOCK_K, Epilogue, FlexCtx, FusedActivation, FusedComm, InFlexData, InnerRoutingData,
                     OutFlexData, PrecisionConfig)
from . import wgmma_hazards
from .inner import inner_flags
from .matmul import launch, matmul_ogs
from .opt_flags import OptFlags, TileProblem, format_facts, make_opt_flags, opt_flags_constraints

# Problem sizes whose heuristic choices span every configuration real calls reach: rows (tokens per
# expert when ragged), N (narrow ones only for dense calls with plain weights: routers), K, and expert
# counts (few experts leave SMs idle where many fill them, which flips the wide-tile and split-K rules).
_ROWS = (1, 8, 16, 32, 64, 128, 512, 4096, 65536)
_SPARSE_ROWS = 0.25  # ragged: a quarter row per expert (decode, fewer rows than experts), an extra rows class
_NS, _NARROW_NS = (512, 8192), (16, 32, 64)
_KS = (128, 512, 2880, 8192)  # 2880 (gpt-oss): no multiple of 128, which hopper mxfp4 decode tiles look at
_EXPERTS = (8, 128)
# Warm-up call sizes: multiples of 16; K_EVEN is a multiple of every block_k, K_TAIL of none above 16.
_N, _K_EVEN, _K_TAIL, _TOKENS, _CALL_EXPERTS, _TOP_K = 256, 256, 272, 16, 8, 2
_COMM_RANKS = (1, 2, 4, 8)  # fused_comm: the all-gathers warmed (n_reduce_shards is a constant of the kernel)
_SCATTER_TOP_KS = (1, _TOP_K)  # scatters: the direct one, and the top-k reduce's matmul, under every flag set
_REDUCE_TOP_KS = (4, 8)        # further top-k reduce binaries (the matmul is the same for every k > 1)


@dataclass(frozen=True)
class WarmupCall:
    """One matmul_ogs call that launches ``variant`` with ``flags`` (and the companions the flags imply)."""
    variant: KernelVariant
    flags: OptFlags
    k: int
    top_k: int = _TOP_K

    def describe(self) -> str:
        f = self.flags
        return (f"{canonical_name(self.variant)} {f.block_m}x{f.block_n}x{f.block_k} w{f.num_warps} s{f.num_stages}"
                f"{f' split{f.split_k}' if f.split_k > 1 else ''}{' persistent' if f.persistent else ''}"
                f"{f' maxnreg{f.maxnreg}' if f.maxnreg else ''} K={self.k}"
                f"{f' top-{self.top_k}' if self.variant.scatter else ''}")

    def run(self, device) -> None:
        v, n, k = self.variant, _N, self.k
        if v.inner:
            self._run_inner(device)
            return
        n_out = n // v.reduction_n
        if v.ragged:
            rd, gi, si = routing(torch.randn(_TOKENS, _CALL_EXPERTS, device=device), self.top_k)
            rows = _TOKENS * self.top_k
            x_rows, out_rows = (_TOKENS if v.gather else rows), (_TOKENS if v.scatter else rows)
        else:
            rd = gi = si = None
            rows = x_rows = out_rows = 64
        w, fields = _weights(v, _CALL_EXPERTS if v.ragged else None, k, n, device)
        x = torch.randn(x_rows, k, device=device)
        if v.x.scales_apply == "operand":  # mxfp8 x: its values and e8m0 scales, as quantize_mx makes them
            x, fields["act_scale"] = quantize_mx(x, v.x.element)
        elif v.folds_mx_scales and v.x.has_block_scales:  # e4m3 x with mxfp4 w: x comes with a scale per row
            x, fields["act_scale"] = quantize_fp8(x, (1, 0))
        else:  # (block-scaled fp8 x: bf16, quantized by the call, as a serving process's first layer passes it)
            x = x.to(torch.bfloat16 if v.x.has_block_scales else v.x.torch_dtype)
        flex = fields.pop("flex_ctx", FlexCtx())
        ones = torch.ones(1, device=device)
        if v.x.has_global_scale:
            flex = FlexCtx(InFlexData(scale=ones), flex.rhs_data)
        if v.y.scaling == "flexpoint":
            flex = FlexCtx(flex.lhs_data, flex.rhs_data, OutFlexData(expected_scale=ones, actual_scale=ones.clone()))
        if v.y.has_block_scales:  # (one per y.block_size output columns of a row)
            fields["out_scale"] = torch.empty(out_rows, -(-n_out // v.y.block_size), dtype=v.y.scale_dtype,
                                              device=device)
        lead = (_CALL_EXPERTS,) if v.ragged else ()
        for comm, buffers in self._comms(v, out_rows, n_out, device):
            with opt_flags_constraints(**asdict(self.flags)):
                # (the launch path, which also takes the rows before the activation of a preact variant)
                launch(x, w, torch.randn(*lead, n, device=device) if v.bias else None, rd,
                           gather_indx=gi if v.gather else None, scatter_indx=si if v.scatter else None,
                           precision_config=PrecisionConfig(out_dtype=v.y.torch_dtype, flex_ctx=flex, **fields),
                           betas=torch.rand(rows, device=device) if v.betas else None,
                           gammas=torch.rand(rows, device=device) if v.gammas else None,
                           y=buffers[0] if buffers else None, fused_comm=comm,
                           y_acc_in=torch.zeros(out_rows, n_out, device=device).to(v.y.torch_dtype)
                           if v.y_acc_in else None,
                           fused_activation=FusedActivation(v.activation, (1.0,) * len(v.activation.fn_arg_names))
                           if v.activation else None,
                           epilogue=Epilogue(v.epilogue, (1.0,) * len(v.epilogue.fn_arg_names)) if v.epilogue else None,
                           preact=torch.empty(rows, n, device=device).to(v.y.torch_dtype) if v.preact else None)

    def _comms(self, v, out_rows, n_out, device):
        """(FusedComm, the ranks' buffers) of each call to make: (None, ()) for a variant without fused_comm; for
        one with, each specialization a deployment compiles: every rank count of _COMM_RANKS as an all-gather (the
        count is a constant of the kernel), and rows sent to shards."""
        if not v.fused_comm:
            return [(None, ())]
        calls = []
        for world, shards in [(ranks, False) for ranks in _COMM_RANKS] + [(2, True)]:
            reduce_shards = 1 if shards else world
            buffers = [torch.zeros(out_rows * reduce_shards, n_out, device=device).to(v.y.torch_dtype)
                       for _ in range(world)]
            handles = torch.tensor([b.data_ptr() for b in buffers], dtype=torch.int64, device=device)
            shard_of_rows = torch.zeros(out_rows, dtype=torch.int32, device=device) if shards else None
            calls.append((FusedComm(handles, shard_of_rows, 0, reduce_shards), buffers))
        return calls


    def _run_inner(self, device) -> None:
        """A weight gradient's ragged-K call: x^T of the token rows (gathered) or sorted rows, w the rows' dY."""
        v = self.variant
        rd, gi, _ = routing(torch.randn(_TOKENS, _CALL_EXPERTS, device=device), self.top_k)
        rows = _TOKENS * self.top_k
        x = torch.randn(_TOKENS if v.gather else rows, self.k, device=device).to(v.x.torch_dtype)
        dy = torch.randn(rows, _N, device=device).to(v.x.torch_dtype)
        acc = torch.zeros(_CALL_EXPERTS, self.k, _N, device=device).to(v.y.torch_dtype) if v.y_acc_in else None
        with opt_flags_constraints(**asdict(self.flags)):
            matmul_ogs(x.mT, dy, None, gather_indx=gi if v.gather else None, y_acc_in=acc,
                       precision_config=PrecisionConfig(out_dtype=v.y.torch_dtype),
                       inner_routing_data=InnerRoutingData(rd, self.flags.block_k))


@dataclass(frozen=True)
class RoutingWarmup:
    """The MoE helper kernels (expert histogram, ragged metadata) for expert counts in (n_experts / 2,
    n_experts]: they compile one binary per power of two."""
    n_experts: int

    def describe(self) -> str:
        return f"routing kernels, {self.n_experts} experts"

    def run(self, device) -> None:
        logits = torch.randn(_TOKENS, self.n_experts, device=device)
        routing(logits, 2)
        weights, ids = torch.topk(logits, 2)  # int64 ids, as torch.topk gives them: a histogram binary of their own
        routing_from_topk(ids, weights, self.n_experts)


@dataclass
class WarmupReport:
    done: int = 0
    failures: list[tuple[str, str]] = field(default_factory=list)
    seconds: float = 0.0
    hazard_replaced: int = 0  # binaries with ptxas's wgmma register hazard, replaced by safe ones (wgmma_hazards.py)


def reachable_flags(variant: KernelVariant, n_sms: int, tma: bool = True, wgmma: bool = False) -> list[OptFlags]:
    """The launch configurations ``matmul_ogs`` may pick for ``variant`` (at batch 1) on a GPU of ``n_sms`` SMs
    (``tma``: with TMA, i.e. Hopper or later, where persistent kernels run; ``wgmma``: sm_90, where the
    warp-specialized kernels run)."""
    itemsize = variant.x.torch_dtype.itemsize
    if variant.inner:  # x rows (a model's width), N, an expert's tokens, experts
        return list(dict.fromkeys(inner_flags(itemsize, experts, m, n, k, INNER_BLOCK_K, n_sms)
                                  for m, n, k, experts in itertools.product(_NS, _NS, (16, 64, 512, 4096), _EXPERTS)))
    formats = format_facts(variant.x, variant.w, variant.y)
    # A scatter splits K only in its top-k calls (without an activation); one gate per token writes y directly.
    can_splits = {not variant.y_acc_in and not variant.preact and not variant.scatter,
                  not variant.y_acc_in and not variant.preact and not (variant.scatter and variant.activation)}
    persistent_blocker = None if tma and variant.has_persistent_kernel else "no persistent kernel here"
    seen = {}
    router_like = not variant.ragged and variant.w.scaling == "none"
    ns = _NS + _NARROW_NS if router_like else _NS
    if variant.ragged:  # per expert count, an N whose 256-column tiles just fill the SMs at a row per expert
        # (the one-wave regime of the hopper mxfp4 decode tile, which the fixed sizes miss)
        ns += tuple(256 * max(1, n_sms // experts) for experts in _EXPERTS)
    row_classes = (_SPARSE_ROWS, *_ROWS) if variant.ragged else _ROWS
    sizes = list(itertools.product(row_classes, ns, _KS, _EXPERTS if variant.ragged else (None,)))
    if variant.ragged:  # a single row whose 256-column tiles fill exactly half the SMs, where split K doubles
        # that one-wave tile (rows per expert 1 / experts: one row in all)
        sizes += [(1 / experts, 256 * (n_sms // 2), k, experts) for k in _KS for experts in _EXPERTS]
    for rows, n, k, experts in sizes:
        if n % variant.reduction_n or n // variant.reduction_n < formats["y_scale_block"]:
            continue
        if variant.ragged:
            args = (int(rows * experts), n, k, variant.reduction_n, experts, max(1, int(rows)))
        else:
            args = (rows, n, k, variant.reduction_n, None, 0)
        # MX scales as prepare_expert_weights stores them: N-contiguous
        for can_split in can_splits:
            flags = make_opt_flags(TileProblem(itemsize, 1, *args, can_split, n_sms, **formats,
                                               persistent_blocker=persistent_blocker,
                                               mx_scales_n_contiguous=formats["w_mx_layout"] is not None,
                                               x_gathered=variant.gather, split_is_free=variant.scatter))
            # Every split count 2..8 runs one binary (split_k is a runtime argument; only 1 is specialized).
            seen.setdefault(replace(flags, split_k=min(flags.split_k, 2)), None)
    if wgmma and variant.has_warp_specialized_kernel:  # (prefill: 128 rows per expert, K of 16 steps)
        seen.setdefault(make_opt_flags(TileProblem(itemsize, 1, 128 * 128, 1024, 2048, variant.reduction_n, 128, 128,
                                                   False, n_sms, **formats, ws_blocker=None)), None)
    return list(seen)


def warmup_calls(variants, n_sms: int, tma: bool = True, wgmma: bool = False) -> list:
    """What warm-up runs: the routing kernels when any variant is ragged, then every matmul variant's calls."""
    calls = [RoutingWarmup(1 << i) for i in range(4, 11)] if any(v.ragged or v.inner for v in variants) else []
    for v in variants:
        if v.family == "reduce" and v.fused_comm:
            # The top-k reduce that sends a scatter's token rows to the ranks: launched by a scatter call with
            # fused_comm (any k; its plain ragged matmul is a variant warmed on its own), unsplit.
            sender = KernelVariant(v.x, v.x, v.y, ragged=True, scatter=True, gammas=v.gammas, fused_comm=True)
            flags = next(f for f in reachable_flags(sender, n_sms, tma, wgmma) if f.split_k == 1)
            calls += [WarmupCall(sender, flags, _K_EVEN, top_k) for top_k in (1, _TOP_K, *_REDUCE_TOP_KS)]
            continue
        if v.family != "matmul":
            continue
        flag_sets = reachable_flags(v, n_sms, tma, wgmma)
        # (the warp-specialized kernel takes whole 128-deep K steps only)
        calls += [WarmupCall(v, flags, k, top_k) for flags in flag_sets
                  for k in ((_K_EVEN,) if flags.warp_specialized else (_K_EVEN, _K_TAIL))
                  for top_k in (_SCATTER_TOP_KS if v.scatter and flags.split_k == 1 else (_TOP_K,))]
        if v.scatter:  # the top-k reduce for more gates: unsplit, and after a split K (a binary of its own)
            splitting = [flags for flags in flag_sets if flags.split_k > 1][:1]
            calls += [WarmupCall(v, flags, _K_EVEN, top_k) for flags in dict.fromkeys([flag_sets[0], *splitting])
                      for top_k in _REDUCE_TOP_KS]
    return calls


def _gpu(device_index: int) -> tuple[int, bool, bool]:
    """(SM count, TMA available, sm_90's wgmma) of a CUDA device: what the opt-flags heuristic decides on."""
    gpu = target(device_index)
    return gpu.sm_count, gpu.tma, gpu.wgmma


def _weights(variant: KernelVariant, n_experts: int | None, k: int, n: int, device):
    """w and the PrecisionConfig fields of its format, laid out as prepare_expert_weights lays them out."""
    fmt = variant.w
    prepared = prepare_expert_weights(torch.randn(n_experts or 1, n, k, device=device),
                                      format="mxfp4" if fmt.layout != "strided" else fmt.name, value_layout="strided")
    w, weight_scale, scale = prepared.w, prepared.weight_scale, prepared.scale
    if n_experts is None:  # a dense call: one (K, N) matrix
        w, weight_scale = w[0], weight_scale[0] if weight_scale is not None else None
    fields = {"weight_scale": weight_scale} if weight_scale is not None else {}
    if scale is not None:
        fields["flex_ctx"] = FlexCtx(rhs_data=InFlexData(scale=scale))
    return (swizzle_mx_values(w, fmt.layout) if fmt.layout != "strided" else w), fields


def _catalog_variants(spec: str | None, names: list[str]):
    by_name = (load_catalog_file(spec) if spec else default_catalog()).by_name()
    return [by_name[name] for name in names]


def warm(wc, device) -> tuple[str, str, int]:
    """Make one warm-up call: (its description, its error or '', how many binaries it replaced for the wgmma
    hazard)."""
    replaced = wgmma_hazards.hazard_replacements()
    try:
        wc.run(device)
        if device.type == "cuda":
            torch.cuda.synchronize()
        error = ""
    except Exception as exc:  # reported, not fatal: the other variants still warm up
        error = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
    return wc.describe(), error, wgmma_hazards.hazard_replacements() - replaced


def _run_share(spec, names, share, jobs, device_index, queue) -> None:
    """Worker: make every ``jobs``-th warm-up call from ``share`` on, reporting what ``warm`` returns."""
    torch.cuda.set_device(device_index)
    device = torch.device("cuda", device_index)
    # The variants are rebuilt here from the catalog (their Triton functions do not pickle).
    for wc in warmup_calls(_catalog_variants(spec, names), *_gpu(device_index))[share::jobs]:
        queue.put(warm(wc, device))


def warmup(spec: str | None, names: list[str], jobs: int = 1, progress=None) -> WarmupReport:
    """Compile the named variants of a catalog (``spec``: a catalog file, None for the default one) for the
    current CUDA GPU into Triton's cache, in ``jobs`` processes."""
    if not torch.cuda.is_available():
        raise OgsgenError("ogsgen warmup compiles for the current CUDA GPU, and there is none here (binaries are "
                          "per GPU model: run it on the machine that will serve)")
    device_index = torch.cuda.current_device()
    total = len(warmup_calls(_catalog_variants(spec, names), *_gpu(device_index)))
    report, start = WarmupReport(), time.monotonic()
    jobs = max(1, min(jobs, total))
    context = multiprocessing.get_context("spawn")  # CUDA does not survive a fork
    queue = context.Queue()
    workers = [context.Process(target=_run_share, args=(spec, names, i, jobs, device_index, queue))
               for i in range(jobs)]
    for worker in workers:
        worker.start()
    try:
        while report.done < total:
            try:
                description, error, replaced = queue.get(timeout=1.0)
            except Empty:
                if any(worker.is_alive() for worker in workers):
                    continue
                # A compiler abort kills its process (LLVM errors raise nothing): its unreported calls failed.
                report.failures.append((f"{total - report.done} call(s)",
                                        "a warm-up process died; rerun with --jobs 1 to see which"))
                report.done = total
                break
            report.done += 1
            report.hazard_replaced += replaced
            if error:
                report.failures.append((description, error))
            if progress:
                progress(report.done, total, description)
    finally:
        for worker in workers:
            worker.join(timeout=5)
            if worker.is_alive():
                worker.terminate()
    report.seconds = time.monotonic() - start
    return report
