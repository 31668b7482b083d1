"""Property-based fuzzing of ``matmul_ogs`` against ``matmul_ogs_torch``.

Random dense, batched and mixture-of-experts calls: sizes from 0 up (M, N, K, tokens, batch entries), x, w, y and
y_acc_in in any major order and as strided, offset (unaligned) views, E experts and top-k k routed by
``ogsgen.routing`` or ``ogsgen.routing_from_topk`` (int16/32/64 ids, dropped gates as -1, with or without the ragged
metadata), gather and/or scatter, bias (1-D, or 2-D per expert or batch entry, or shared), betas, gammas (the
routing's gate weights among them), out_alpha, the fused SwiGLU, y_acc_in (3-D too, in another dtype too), forced
tiles, split K, the persistent kernel and enforce_bitwise_invariance; formats bf16, fp16 and fp32, fp8 flexpoint
(x and w, in one format or mixed, 16-bit x with fp8 w, fp8 outputs with or without an expected scale), and
mxfp4 / mxfp8 weights (strided in any layout, mxfp4 in a hopper layout, or made by ``prepare_expert_weights``)
with 16-bit x, and mxfp4 with e4m3 x scaled per tensor or per row. Each call is checked against the
float32 reference on the same (dequantized) operands within its output format's rounding (an fp8 output value by
value, to an ulp, with its actual_scale), and for what a kernel must not do: write outside y's view or into the rows
past the routed ones, read outside an input's view (the gaps of every input's storage hold NaN), modify an input,
or give other bits when its launch plan is replayed. Left out: custom activations and epilogues (their own tests)
and MX outputs (out_scale; compared only statistically upstream). The tests at the end of this file reduce the
defects the fuzzing found (all fixed) to one call each.

Tensor values come from a seed drawn with the case, so a falsifying example printed by hypothesis is the whole
recipe of the failing call.

CI (the CPU interpreter, or any GPU; fixed, derandomized examples; about 1.5 minutes of CPU without a GPU)::

    python -m pytest -q tests/test_fuzz.py

Long run on a CUDA GPU (larger shapes, new random draws each run; OGSGEN_FUZZ_EXAMPLES examples for each of the 3
fuzz tests; needs ``pip install hypothesis``; about 0.3-0.7 s per example on an H200 with Triton compiling most of
them, so about an hour for 3 x 2000)::

    OGSGEN_FUZZ_PROFILE=gpu OGSGEN_FUZZ_EXAMPLES=2000 python -m pytest -q tests/test_fuzz.py \
        --hypothesis-show-statistics

``OGSGEN_FUZZ_EXAMPLES`` also sets the examples per test of the CI profile; ``OGSGEN_FUZZ_SEED=N`` replaces either
profile's draws with those of seed N (reproducible). Without CUDA the GPU profile skips; without hypothesis the file
skips. Hypothesis keeps no example database (nothing is written into the repository), and kernels are rendered on
demand into a temporary folder.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass, field

import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings, strategies as st  # noqa: E402

import torch  # noqa: E402

import ogsgen  # noqa: E402
from ogsgen import (FlexCtx, FusedActivation, InFlexData, OutFlexData, PrecisionConfig, matmul_ogs,  # noqa: E402
                    matmul_ogs_torch)
from ogsgen.numerics import (actual_scale_torch, dequantize_mx, dequantize_mx_torch,  # noqa: E402
                             max_finite, quantize_fp8_torch, quantize_mx, swizzle_mx_values, unswizzle_mx_values)
from ogsgen.testing import assert_close  # noqa: E402

HAS_CUDA = torch.cuda.is_available()
DEVICE = "cuda" if HAS_CUDA else "cpu"
HAS_TMA = not HAS_CUDA or torch.cuda.get_device_capability()[0] >= 9  # the interpreter runs the TMA kernels too
PROFILE = os.environ.get("OGSGEN_FUZZ_PROFILE", "ci")
if PROFILE not in ("ci", "gpu"):
    raise ValueError(f"OGSGEN_FUZZ_PROFILE must be 'ci' or 'gpu', got {PROFILE!r}")
GPU_RUN = PROFILE == "gpu"
if GPU_RUN and not HAS_CUDA:
    pytest.skip("OGSGEN_FUZZ_PROFILE=gpu needs a CUDA GPU", allow_module_level=True)

_COMMON = dict(deadline=None, database=None, print_blob=True,
               suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example])
# Examples per test function: the CI profile's three tests take about 1.5 minutes of CPU on the interpreter.
CI_EXAMPLES = {"plain": 300, "moe": 250, "scaled": 250}
settings.register_profile("ogsgen-fuzz-ci", derandomize=True, **_COMMON)
settings.register_profile("ogsgen-fuzz-gpu", **_COMMON)


def fuzz_settings(test: str):
    """The profile's settings for one test (applied per test: the profile is not loaded globally), and the seed
    of OGSGEN_FUZZ_SEED."""
    examples = int(os.environ.get("OGSGEN_FUZZ_EXAMPLES", 0)) or (2000 if GPU_RUN else CI_EXAMPLES[test])
    applied = settings(settings.get_profile(f"ogsgen-fuzz-{PROFILE}"), max_examples=examples)
    if "OGSGEN_FUZZ_SEED" not in os.environ:
        return applied
    seeded = settings(applied, derandomize=False)
    return lambda fn: hypothesis.seed(int(os.environ["OGSGEN_FUZZ_SEED"]))(seeded(fn))


# Sizes: the interpreter runs each program instance in Python, so CI keeps every dimension small; the GPU run
# goes past the tile sizes the heuristic picks (and into split K and the persistent kernel on its own).
MAX_DIM = 400 if GPU_RUN else 64
MAX_TOKENS = 300 if GPU_RUN else 40
MAX_EXPERTS = 32 if GPU_RUN else 8
MAX_BATCH = 5 if GPU_RUN else 3

FP8 = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}
PLAIN = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}
DTYPES = {**PLAIN, **FP8}
PREPARE_FORMATS = {"fp8-e4m3": "fp8e4m3", "fp8-e5m2": "fp8e5m2", "mxfp4": "mxfp4", "mxfp4-hopper": "mxfp4",
                   "mxfp4-hopper-fp8": "mxfp4", "mxfp8-e4m3": "mxfp8e4m3", "mxfp8-e5m2": "mxfp8e5m2"}
SWIZZLED = {"mxfp4-hopper": "hopper", "mxfp4-hopper-fp8": "hopper_fp8"}  # w formats in a swizzled value layout


pytestmark = pytest.mark.usefixtures("kernels_on_demand")  # every variant a fuzzed call needs


# ---------------------------------------------------------------- layouts

@dataclass(frozen=True)
class Layout:
    """Where a tensor's elements sit: ``perm`` lists its dimensions from the outermost in memory to the innermost,
    ``steps`` spaces the elements of each (logical) dimension, ``offset`` (elements) shifts the view's start."""
    perm: tuple
    steps: tuple
    offset: int = 0

    @staticmethod
    def contiguous(ndim: int) -> "Layout":
        return Layout(tuple(range(ndim)), (1,) * ndim)


def layouts(ndim: int, inner_contiguous: bool = False, tma: bool = False):
    """Any major order, gaps and offset; ``inner_contiguous``: the last dimension stays the innermost with unit
    steps (bias); ``tma``: row-major, no offset, gaps only outside a row (what TMA descriptors need, given row
    lengths of a multiple of 16 bytes)."""
    if tma:
        return st.tuples(*[st.sampled_from([1, 1, 2]) for _ in range(ndim - 1)]).map(
            lambda steps: Layout(tuple(range(ndim)), (*steps, 1)))
    perms = (st.permutations(range(ndim - 1)).map(lambda p: (*p, ndim - 1)) if inner_contiguous
             else st.permutations(range(ndim)).map(tuple))
    steps = st.tuples(*[st.sampled_from([1, 1, 2]) for _ in range(ndim - (1 if inner_contiguous else 0))])
    if inner_contiguous:
        steps = steps.map(lambda s: (*s, 1))
    return st.builds(Layout, perms, steps, st.sampled_from([0, 0, 1, 3]))


def _sentinel(dtype):
    return 255 if dtype == torch.uint8 else float("nan")


def place(values: torch.Tensor, layout: Layout, fill=None):
    """(view, storage): ``values`` copied into a view of ``layout`` over a flat storage whose other elements hold
    ``fill`` (NaN, or 255 for uint8: an e8m0 NaN scale), so that a read outside the view poisons the result."""
    shape, ndim = values.shape, values.ndim
    fill = _sentinel(values.dtype) if fill is None else fill
    storage_shape = [shape[d] * layout.steps[d] for d in layout.perm]
    storage = torch.full((math.prod(storage_shape) + layout.offset,), fill, dtype=values.dtype, device=values.device)
    view = storage[layout.offset:].view(storage_shape)
    view = view[tuple(slice(None, None, layout.steps[d]) for d in layout.perm)]
    view = view.permute([layout.perm.index(d) for d in range(ndim)])
    view.copy_(values)
    return view, storage


def _bits(t: torch.Tensor) -> torch.Tensor:
    """The bytes of ``t``'s elements (NaN payloads and signs of zero included), in logical order."""
    # (a contiguous copy: .contiguous() keeps the stride of a one-element tensor, which .view(uint8) refuses)
    return t.detach().flatten().clone(memory_format=torch.contiguous_format).view(torch.uint8)


# ---------------------------------------------------------------- cases

@dataclass(frozen=True)
class Case:
    """One matmul_ogs call; tensors are drawn from ``seed``."""
    seed: int
    mode: str                    # "dense" | "batched" | "moe"
    x: str                       # x format: fp16, bf16, fp32, e4m3, e5m2
    w: str                       # w format: "plain" (x's), "fp8-e4m3", "mxfp4", "mxfp4-hopper(-fp8)", "mxfp8-e5m2", ...
    out: str | None              # precision_config.out_dtype (None: the default)
    m: int                       # dense/batched rows; MoE: tokens
    n: int
    k: int
    batch: int | None = None     # batched entries, or 1 for a dense call with a 3-D (1, K, N) w
    n_expts: int = 0
    k_act: int = 0
    routing: str = ""            # "logits", "logits-sm-first", "topk"
    drop: float = 0.0            # routing_from_topk: share of dropped gates
    ids_dtype: str = "int32"
    no_metadata: bool = False    # RoutingData without its ragged metadata (matmul_ogs computes it)
    gather: bool = False
    scatter: bool = False
    bias: str | None = None      # None, "1d", "2d" (per batch entry/expert), "2d-shared" ((1, N))
    betas: bool = False
    gammas: str | None = None    # None, "pow2", "uniform", "gates" (the routing's gate weights)
    out_alpha: float | None = None
    swiglu: tuple | None = None  # (alpha, limit)
    y_acc_in: str | None = None  # None, or its dtype name
    y_acc_3d: bool = False
    y: str | None = None         # None (allocated by matmul_ogs), "2d", "3d" ((1, M, N) for a single matmul)
    layouts: dict = field(default_factory=dict, compare=False)
    w_scale: str = ""            # fp8 w: one scale ("tensor") or one per expert or batch entry ("per-batch")
    prepared: str | None = None  # w (and a per-expert bias) made by prepare_expert_weights from this checkpoint layout
    gate_up: str | None = None   # prepare_expert_weights' gate_up
    flex_expected: bool = False  # fp8 output: an expected scale (else unscaled)
    saturate: bool = False
    allow_tf32: bool = True
    bitwise: bool = False
    constraints: tuple = ()
    replay: bool = False         # call twice: the second replays the first's launch plan
    x_scale: str = ""            # e4m3 x with mxfp4 w: "row" (a float32 act_scale per row), else flexpoint

    def __repr__(self):
        fields_ = {k: v for k, v in self.__dict__.items() if v not in (None, False, "", 0, (), {}) or k in (
            "seed", "m", "n", "k")}
        return "Case(" + ", ".join(f"{k}={v!r}" for k, v in fields_.items()) + ")"


def dims(max_value: int, at_least: int = 0, multiple: int = 1):
    """Sizes biased to the edges: 0 and 1, tile boundaries, and anything up to ``max_value``."""
    edges = [v for v in (0, 1, 2, 15, 16, 17, 31, 32, 33, 63, 64, 65, 127, 128, 129) if v <= max_value]
    values = st.one_of(st.sampled_from(edges), st.integers(0, max_value))
    return values.map(lambda v: max(at_least, -(-v // multiple) * multiple))


@st.composite
def cases(draw, modes=("dense", "batched", "moe"), scaled: bool = False):
    """A valid call: every choice is drawn among those the runtime accepts for the choices before it.
    ``scaled``: plain formats (bf16, fp16, fp32) only, or a scaled x, w or output."""
    seed = draw(st.integers(0, 2**31 - 1))
    mode = draw(st.sampled_from(modes))
    # ---- formats
    plain_outs = [None, "fp16", "bf16", "fp32"]
    if not scaled:
        x, w = draw(st.sampled_from(["bf16", "fp16", "fp32"])), "plain"
        out = draw(st.sampled_from(plain_outs))
    else:
        kind = draw(st.sampled_from(["mx w", "fp8 x", "fp8 w", "mx w", "fp8 out", "e4m3 x, mxfp4 w"]))
        if kind == "fp8 x":
            x = draw(st.sampled_from(["e4m3", "e5m2"]))
            w = f"fp8-{draw(st.sampled_from([x, x, 'e4m3', 'e5m2']))}"  # mostly x's format, also the other one
            out = draw(st.sampled_from(plain_outs + ["e4m3", "e5m2"]))
        elif kind == "e4m3 x, mxfp4 w":  # fp8 dots on W converted to e4m3
            x, w = "e4m3", draw(st.sampled_from(["mxfp4", "mxfp4-hopper", "mxfp4-hopper-fp8"]))
            out = draw(st.sampled_from(plain_outs + ["e4m3", "e5m2"]))
        elif kind == "fp8 out":
            x, w = draw(st.sampled_from(["bf16", "fp16", "fp32"])), "plain"
            out = draw(st.sampled_from(["e4m3", "e5m2"]))
        else:
            x = draw(st.sampled_from(["bf16", "fp16"]))
            w = draw(st.sampled_from(["fp8-e4m3", "fp8-e5m2"] if kind == "fp8 w" else
                                     ["mxfp4", "mxfp8-e4m3", "mxfp8-e5m2"] + (["mxfp4-hopper"] * 2 if x == "bf16"
                                                                             else [])))
            out = draw(st.sampled_from(plain_outs + ["e4m3", "e5m2"]))
    mx = w.startswith("mx")
    hopper = w in SWIZZLED
    wide_k = mx or x in FP8  # block_k >= 32 (fp8 dot, one scale per 32 rows)
    swiglu = draw(st.one_of(st.none(), st.tuples(st.sampled_from([1.702, 1.0, 0.5]),
                                                  st.sampled_from([7.0, 1.0, 0.25]))))
    reduction_n = 2 if swiglu else 1
    # ---- shapes and routing
    persistent = (x in ("fp16", "bf16") and w == "plain" and out not in FP8 and HAS_TMA
                  and draw(st.sampled_from([False, False, False, True])))
    if persistent:  # TMA: rows of a multiple of 16 bytes, no empty tensor
        k = draw(dims(MAX_DIM, at_least=8, multiple=8))
        n = draw(dims(MAX_DIM, at_least=8 * reduction_n, multiple=8 * reduction_n))
    else:
        k = draw(dims(MAX_DIM, multiple=2 if w == "mxfp4" or hopper else 1))
        n = draw(dims(MAX_DIM, multiple=reduction_n))
    batch = n_expts = k_act = 0
    routing = ids_dtype = ""
    drop = 0.0
    gather = scatter = no_metadata = False
    if mode == "moe":
        m = draw(dims(MAX_TOKENS, at_least=1 if persistent else 0))
        n_expts = draw(st.integers(1, MAX_EXPERTS))
        k_act = draw(st.integers(1, min(n_expts, 4)))
        routing = draw(st.sampled_from(["logits", "logits-sm-first", "topk", "topk"]))
        if routing == "topk":
            drop = draw(st.sampled_from([0.0, 0.25, 0.5, 1.0]))
            ids_dtype = draw(st.sampled_from(["int32", "int64", "int16"]))
        no_metadata = draw(st.booleans())
        gather, scatter = draw(st.booleans()), draw(st.booleans())
    else:
        m = draw(dims(MAX_DIM, at_least=1 if persistent else 0))
        if mode == "batched":
            batch = draw(st.integers(1 if persistent else 0, MAX_BATCH))
        else:
            batch = draw(st.sampled_from([None, None, 1]))  # 1: w given as (1, K, N)
    # ---- features
    bias = draw(st.sampled_from([None, "1d", "2d", "2d-shared"]))
    betas = bias is not None and draw(st.booleans())
    gammas = draw(st.sampled_from([None, "pow2", "uniform"] + (["gates"] if mode == "moe" else [])))
    out_alpha = draw(st.sampled_from([None, None, 1.0, 0.5, -1.25]))
    y_acc_in = None
    if not scatter:
        y_acc_in = draw(st.sampled_from([None, None, "same", "fp32", "bf16"]))
    y_acc_3d = y_acc_in is not None and mode != "batched" and draw(st.booleans())
    three_d_y = mode != "batched"
    y = draw(st.sampled_from([None, "2d", "2d"] + (["3d"] if three_d_y else [])))
    if mode == "batched":
        y = None if y is None else "3d"
    # ---- layouts
    out_rows_tma = persistent and not scatter
    lay = {}
    xd = 3 if mode == "batched" else 2
    lay["x"] = draw(layouts(xd, tma=persistent and not gather))
    if not hopper:
        wd = 2 if mode == "dense" and batch is None else 3
        lay["w"] = draw(layouts(wd, tma=persistent))
    if mx:
        lay["w_scale"] = draw(layouts(2 if mode == "dense" and batch is None else 3))
    if bias is not None:
        lay["bias"] = draw(layouts(1 if bias == "1d" else 2, inner_contiguous=True))
    if y is not None:
        lay["y"] = draw(layouts(3 if y == "3d" else 2, tma=out_rows_tma))
    if y_acc_in is not None:
        lay["y_acc_in"] = draw(layouts(3 if (y_acc_3d or mode == "batched") else 2))
    # ---- scales
    w_scale = ""
    if w.startswith("fp8"):
        w_scale = draw(st.sampled_from(["tensor", "per-batch"] if (mode != "dense" or batch) else ["tensor"]))
    prepared = gate_up = None
    three_d_w = mode != "dense" or batch is not None
    if w != "plain" and x in ("fp16", "bf16") and three_d_w and draw(st.booleans()):
        prepared = draw(st.sampled_from(["out_in", "in_out"]))
        gate_up = draw(st.sampled_from([None, "concatenated", "interleaved"] if n % 2 == 0 else [None]))
        lay.pop("w", None)  # its own layouts: K-contiguous values, N-contiguous MX scales
        lay.pop("w_scale", None)
    flex_expected = out in FP8 and draw(st.booleans())
    saturate = out in FP8 and draw(st.booleans())
    allow_tf32 = x != "fp32" or draw(st.booleans())
    # ---- launch parameters
    topk = scatter and k_act > 1
    can_split = y_acc_in is None and (not scatter or (topk and swiglu is None))
    constraints = {}
    tiled = draw(st.sampled_from(["heuristic", "tile", "tile"]))
    if persistent:
        constraints.update(persistent=True, block_m=draw(st.sampled_from([16, 32, 64])),
                           block_n=draw(st.sampled_from([32, 64])), block_k=draw(st.sampled_from([16, 32])))
    elif tiled == "tile":
        min_k = 64 if hopper else 32 if wide_k else 16
        constraints.update(block_m=draw(st.sampled_from([16, 32, 64])),
                           block_n=draw(st.sampled_from([16, 32, 64] if not GPU_RUN else [16, 32, 64, 128])),
                           block_k=draw(st.sampled_from([b for b in (16, 32, 64) if b >= min_k])))
        # (split K of a ragged call without scatter writes the rows past the routed ones, which dropped gates
        # leave, and counts them in an fp8 output's actual_scale: test_split_k_leaves_rows_past_the_routed_ones)
        drops = routing == "topk" and drop > 0 and not scatter
        if can_split and not drops and draw(st.booleans()):
            constraints["split_k"] = draw(st.sampled_from([2, 3]))
    bitwise = not constraints and draw(st.sampled_from([False, False, False, True]))
    replay = draw(st.sampled_from([False, False, False, True]))
    x_scale = "row" if x == "e4m3" and mx and mode != "batched" and draw(st.booleans()) else ""
    return Case(seed, mode, x, w, out, m, n, k, batch, n_expts, k_act, routing, drop, ids_dtype, no_metadata,
                gather, scatter, bias, betas, gammas, out_alpha, swiglu, y_acc_in, y_acc_3d, y, lay, w_scale,
                prepared, gate_up, flex_expected, saturate, allow_tf32, bitwise, tuple(sorted(constraints.items())),
                replay, x_scale)


# ---------------------------------------------------------------- building a call

class Rng:
    def __init__(self, seed):
        self.gen = torch.Generator().manual_seed(seed)

    def randn(self, *shape):
        return torch.randn(shape, generator=self.gen).to(DEVICE)

    def rand(self, *shape):
        return torch.rand(shape, generator=self.gen).to(DEVICE)

    def randint(self, low, high, shape):
        return torch.randint(low, high, shape, generator=self.gen).to(DEVICE)


def _routing(case: Case, rng: Rng):
    tokens, n_expts, k_act = case.m, case.n_expts, case.k_act
    if case.routing.startswith("logits"):
        logits = rng.randn(tokens, n_expts)
        rd, gi, si = ogsgen.routing(logits, k_act, sm_first=case.routing == "logits-sm-first")
    else:
        ids = torch.stack([torch.randperm(n_expts, generator=rng.gen)[:k_act] for _ in range(tokens)]) \
            if tokens else torch.zeros(0, k_act, dtype=torch.long)
        ids = ids.to(DEVICE)
        ids = torch.where(rng.rand(tokens, k_act) < case.drop, -1, ids).to(getattr(torch, case.ids_dtype))
        rd, gi, si = ogsgen.routing_from_topk(ids, rng.rand(tokens, k_act) + 0.1, n_expts)
    if case.no_metadata:
        rd = ogsgen.RoutingData(rd.gate_scal, rd.expt_hist, rd.n_expts_tot, rd.n_expts_act)
    return rd, gi, si


def _fp8_values(rng, shape, dtype, scale=1.0):
    return (rng.randn(*shape) / scale).to(dtype)


class Call:
    """The tensors of a case, their float32 reference values, and the call's arguments."""

    def __init__(self, case: Case):
        self.case = c = case
        rng = Rng(c.seed)
        self.storages = {}  # input name -> (storage, bits before the call)
        moe = c.mode == "moe"
        routing = self.routing = _routing(c, rng) if moe else (None, None, None)
        rd, gi, si = routing
        # rows of the matmul and of its output
        if moe:
            n_rows = c.m * c.k_act
            self.rows = n_rows
            x_rows = c.m if c.gather else n_rows
            self.out_rows = c.m if c.scatter else n_rows
            self.n_routed = self.out_rows if c.scatter else int(rd.expt_hist.sum())
        else:
            self.rows = x_rows = self.out_rows = self.n_routed = c.m
        lead_x = (c.batch,) if c.mode == "batched" else ()
        w_lead = (c.n_expts,) if moe else ((c.batch,) if c.batch is not None else ())
        n_w = w_lead[0] if w_lead else 1
        self.n_out = c.n // (2 if c.swiglu else 1)
        # ---- x
        x_shape = lead_x + (x_rows, c.k)
        flex = {}
        pc_fields = {}
        if c.x_scale == "row":
            x_values, pc_fields["act_scale"] = quantize_fp8_torch(rng.randn(*x_shape), (1, 0))
            self.x_ref = x_values.float() * pc_fields["act_scale"]
        elif c.x in FP8:
            x_values = _fp8_values(rng, x_shape, FP8[c.x])
            x_scale = torch.tensor([1.25], device=DEVICE)
            flex["lhs_data"] = InFlexData(scale=x_scale)
            self.x_ref = x_values.float() * 1.25
        else:
            x_values = rng.randn(*x_shape).to(DTYPES[c.x])
            self.x_ref = x_values.float()
        self.x = self._input("x", x_values)
        # ---- w
        w_shape = w_lead + (c.k, c.n)
        dense_w = rng.randn(*w_shape) / math.sqrt(max(c.k, 1))
        prepared_bias = None
        if c.prepared:
            checkpoint = (dense_w.mT if c.prepared == "out_in" else dense_w).contiguous()
            checkpoint_bias = rng.randn(n_w, c.n) if c.bias == "2d" else None
            prepared = ogsgen.prepare_expert_weights(
                checkpoint, checkpoint_bias, layout=c.prepared, gate_up=c.gate_up, format=PREPARE_FORMATS[c.w],
                value_layout=SWIZZLED.get(c.w, "strided"))
            self.w, self.w_ref, prepared_bias = prepared.w, prepared.dequantize(), prepared.bias
            data = self.w.data if c.w in SWIZZLED else self.w
            self.storages["w"] = (data, _bits(data))
            if prepared.scale is not None:
                flex["rhs_data"] = InFlexData(scale=prepared.scale)
            if prepared.weight_scale is not None:
                pc_fields["weight_scale"] = prepared.weight_scale
        elif c.w == "plain":
            w_values = dense_w.to(DTYPES[c.x])
            self.w = self._input("w", w_values)
            self.w_ref = w_values.float()
        elif c.w.startswith("fp8"):
            scales = (torch.tensor([0.5], device=DEVICE) if c.w_scale == "tensor"
                      else 0.25 + torch.arange(n_w, device=DEVICE).float() / 4)
            per = scales.view(-1, 1, 1) if c.w_scale == "per-batch" else scales
            w_values = (dense_w / per).to(FP8[c.w[4:]])
            flex["rhs_data"] = InFlexData(scale=scales)
            self.w = self._input("w", w_values)
            self.w_ref = w_values.float() * per
        else:
            element = "e2m1" if c.w.startswith("mxfp4") else c.w.split("-")[1]
            values, scales = quantize_mx(dense_w.mT.contiguous(), element, axis=-1)  # (.., N, K/2), (.., N, K/32)
            self.w_ref = dequantize_mx_torch(values, scales, element).mT
            values, scales = values.mT, scales.mT  # (..., K/2 or K, N), (..., K/32, N): any layout (drawn)
            pc_fields["weight_scale"] = self._input("w_scale", scales)
            if c.w in SWIZZLED:
                self.w = swizzle_mx_values(values, SWIZZLED[c.w])
                self.storages["w"] = (self.w.data, _bits(self.w.data))
            else:
                self.w = self._input("w", values)
        # ---- bias, betas, gammas
        self.bias = None
        if prepared_bias is not None:
            self.bias = prepared_bias
        elif c.bias is not None:
            bias_shape = (c.n,) if c.bias == "1d" else ((1 if c.bias == "2d-shared" else n_w), c.n)
            self.bias = self._input("bias", rng.randn(*bias_shape))
        self.betas = (rng.rand(self.rows) + 0.5) if c.betas else None
        if c.gammas == "pow2":
            self.gammas = 2.0 ** rng.randint(-3, 2, (self.rows,)).float()
        elif c.gammas == "uniform":
            self.gammas = rng.rand(self.rows) + 0.5
        elif c.gammas == "gates":
            self.gammas = rd.gate_scal.float()
        else:
            self.gammas = None
        self.act = FusedActivation(ogsgen.swiglu, c.swiglu) if c.swiglu else None
        # ---- outputs
        self.out_dtype = DTYPES[c.out] if c.out else (DTYPES[c.x] if c.x not in FP8 else torch.bfloat16)
        out_shape = lead_x + (self.out_rows, self.n_out)
        self.y_acc_in = None
        if c.y_acc_in is not None:
            acc_dtype = self.out_dtype if c.y_acc_in == "same" else DTYPES[c.y_acc_in]
            acc_values = rng.randn(*((1,) if c.y_acc_3d else ()), *out_shape).to(acc_dtype)
            self.y_acc_in = self._input("y_acc_in", acc_values)
        self.out_shape = ((1,) if c.y == "3d" and c.mode != "batched" else ()) + out_shape
        self.flex, self.pc_fields = flex, pc_fields
        self.actual = self.slack = None

    def _input(self, name, values):
        layout = self.case.layouts.get(name)
        if layout is None:
            return values
        view, storage = place(values, layout)
        self.storages[name] = (storage, _bits(storage))
        return view

    def new_y(self):
        """A NaN-poisoned y of the case's layout, in a storage whose gaps hold a sentinel."""
        if self.case.y is None:
            return None, None
        poison = torch.full(self.out_shape, float("nan"), device=DEVICE).to(self.out_dtype)
        sentinel = -96.0  # exact in every output format
        view, storage = place(poison, self.case.layouts["y"], fill=sentinel)
        return view, storage

    def reference(self):
        """float32 reference (before an fp8 output's scaling), and the rows of it the call writes."""
        c = self.case
        rd, gi, si = self.routing
        # A top-k scatter's rows pass through a scratch buffer in the output dtype (bf16 for fp8) before their
        # sum, unless K is split (fp32 partials).
        split = dict(c.constraints).get("split_k", 1)
        scratch = self.out_dtype if self.out_dtype not in FP8.values() else torch.bfloat16
        rounds = c.scatter and c.k_act > 1 and split == 1
        fp32 = PrecisionConfig(out_dtype=torch.float32)
        ref = matmul_ogs_torch(self.x_ref, self.w_ref, self.bias, rd, gi if c.gather else None,
                               si if c.scatter else None, fp32, betas=self.betas, gammas=self.gammas,
                               round_y=(lambda t: t.to(scratch).float()) if rounds else None,
                               out_alpha=c.out_alpha, fused_activation=self.act, y_acc_in=self.y_acc_in)
        self.slack = None
        if rounds and scratch != torch.float32:
            # Where the scratch rounding falls (before or after the gammas multiply) is the kernel's business: the
            # two orders differ by an ulp of the scratch format of each of a token's k terms, which matters where
            # they cancel. Slack per output element: that ulp (relative 2**-7 in bf16, 2**-10 in fp16) of the sum
            # of the terms' magnitudes.
            rows = matmul_ogs_torch(self.x_ref, self.w_ref, self.bias, rd, gi if c.gather else None, None, fp32,
                                    betas=self.betas, gammas=self.gammas, out_alpha=c.out_alpha,
                                    fused_activation=self.act)
            routed = si.dst_indx >= 0
            magnitude = torch.zeros(c.m, self.n_out, device=DEVICE)
            magnitude.index_add_(0, si.dst_indx[routed].long() // c.k_act, rows[routed].abs())
            self.slack = magnitude * (2.0 ** -7 if scratch == torch.bfloat16 else 2.0 ** -10)
        return ref

    def precision_config(self, ref):
        c = self.case
        flex = dict(self.flex)
        if self.out_dtype in FP8.values():
            expected = None
            if c.flex_expected:
                written = ref[..., :self.n_routed, :] if ref.numel() else ref
                expected = (written.abs().max().clamp_min(1e-6) / 100).reshape(1) if written.numel() \
                    else torch.ones(1, device=DEVICE)
            self.expected = expected
            self.actual = torch.full((1,), float("nan"), device=DEVICE)
            flex["out_data"] = OutFlexData(expected_scale=expected, actual_scale=self.actual)
        return PrecisionConfig(out_dtype=c.out and self.out_dtype, allow_tf32=c.allow_tf32, flex_ctx=FlexCtx(**flex),
                               flexpoint_saturate_inf=c.saturate, enforce_bitwise_invariance=c.bitwise,
                               **self.pc_fields)

    def run(self, pc, y):
        c = self.case
        rd, gi, si = self.routing
        with ogsgen.opt_flags_constraints(**dict(c.constraints)):
            return matmul_ogs(self.x, self.w, self.bias, rd, gi if c.gather else None, si if c.scatter else None,
                              pc, betas=self.betas, gammas=self.gammas, out_alpha=c.out_alpha, y=y,
                              fused_activation=self.act, y_acc_in=self.y_acc_in)


# ---------------------------------------------------------------- checking a call

def _fp8_ulp(values: torch.Tensor, dtype) -> torch.Tensor:
    """The spacing of ``dtype``'s values at each magnitude (subnormals included)."""
    mantissa, min_exp = (3, -6) if dtype == torch.float8_e4m3fn else (2, -14)
    exponent = torch.floor(torch.log2(values.abs().clamp_min(2.0 ** min_exp)))
    return 2.0 ** (exponent - mantissa)


def _tf32(call: Call) -> bool:
    """Whether the GPU rounds the call's fp32 operands to tf32 (10 mantissa bits) for the dot."""
    return call.case.x == "fp32" and call.case.allow_tf32 and HAS_CUDA


def _fp8_dot(call: Call) -> bool:
    """Whether the GPU sums fp8 x fp8 products: Hopper's fp8 tensor cores keep about 14 bits of the fp32
    accumulator (DeepSeek-V3 report, section 3.3.2), so sums are off by a few 2**-14 of their magnitude."""
    return call.case.x in FP8 and HAS_CUDA


def tolerances(call: Call):
    """(maxtol, rmstol) of assert_close for a 16/32-bit output: a few roundings of the output format (or of tf32
    operands), relative to the largest reference value (a missing bias, a wrong gamma or a dropped row is a relative
    error of 10% or more)."""
    dtype = call.out_dtype
    if _tf32(call):
        return 2e-2, 4e-3
    if _fp8_dot(call) and dtype == torch.float32:
        return 2.0 ** -10, 2.0 ** -12
    if dtype == torch.float32:
        return 1e-4, 2e-5
    if dtype == torch.float16:
        return 4e-3, 1e-3
    return 2e-2, 4e-3


def check_values(call: Call, ref: torch.Tensor, result: torch.Tensor, what: str):
    ref, got = ref[..., :call.n_routed, :], result.reshape(ref.shape)[..., :call.n_routed, :]
    if call.out_dtype in FP8.values():
        if ref.numel() == 0:
            return
        scaled = ref / call.expected if call.expected is not None else ref
        largest = max_finite(call.out_dtype)
        target = scaled.clamp(-largest, largest)
        err = (got.float() - target).abs()
        # Either neighbour of the float32 value: the kernel's fp32 sums differ from the reference's in their order.
        limit = _fp8_ulp(target, call.out_dtype) * (1 + 1e-3) + 1e-5 * target.abs().max().clamp_min(1e-30)
        slack = call.slack.reshape(ref.shape) if call.slack is not None else torch.zeros_like(ref)
        limit = limit + (slack / call.expected if call.expected is not None else slack)
        if _tf32(call):  # tf32 operands: products off by up to 2**-9, enough to tip a rounding to the next ulp
            limit = limit + 2.0 ** -6 * target.abs() + 2.0 ** -9 * target.abs().max()
        if _fp8_dot(call):  # a short accumulator can tip a rounding to the next ulp too
            limit = limit + 2.0 ** -10 * target.abs().max()
        finite = torch.isfinite(got.float())
        assert bool(finite.all()), f"{what}: non-finite fp8 output at {(~finite).nonzero()[0].tolist()}"
        bad = err > limit
        assert not bool(bad.any()), (f"{what}: {int(bad.sum())} fp8 values off by more than an ulp; first at "
                                     f"{bad.nonzero()[0].tolist()}: {got.float()[bad][0].item()} vs "
                                     f"{target[bad][0].item()}")
        want = actual_scale_torch(ref, call.out_dtype)
        if ref.numel():
            actual = call.actual.item()
            relative = 2.0 ** -8 if _tf32(call) else 2.0 ** -10 if _fp8_dot(call) else 1e-5
            limit = relative * want.item() + slack.max().item() / max_finite(call.out_dtype) + 1e-30
            assert abs(actual - want.item()) <= limit, \
                f"{what}: actual_scale {actual} != {want.item()}"
        return
    maxtol, rmstol = tolerances(call)
    if call.slack is not None and ref.numel():  # (one element's slack is all of the rms error of a tiny output)
        slack = 1.5 * call.slack.max().item() / ref.abs().max().clamp_min(1e-30).item()
        maxtol, rmstol = max(maxtol, slack), max(rmstol, slack)
    assert_close(ref, got.float(), maxtol, rmstol, what=what)


def _events(case: Case, call: "Call") -> None:
    """What the examples covered (pytest --hypothesis-show-statistics)."""
    constraints = dict(case.constraints)
    hypothesis.event(f"mode {case.mode}")
    hypothesis.event(f"x {case.x}, w {case.w}{' (prepared)' if case.prepared else ''}, out {call.out_dtype}")
    if case.mode == "moe":
        hypothesis.event(f"moe gather={case.gather} scatter={case.scatter} top-k {'> 1' if case.k_act > 1 else '1'}")
    hypothesis.event("launch: " + ("persistent" if constraints.get("persistent") else
                                   f"split_k={constraints['split_k']}" if "split_k" in constraints else
                                   "forced tile" if constraints else "heuristic"))
    n_out = math.prod(call.out_shape)
    hypothesis.event("output: empty" if n_out == 0 else "output: 1 element" if n_out == 1 else "output: more")


def run_case(case: Case):
    call = Call(case)
    _events(case, call)
    ref = call.reference()
    pc = call.precision_config(ref)
    y, y_storage = call.new_y()
    result = call.run(pc, y)
    what = repr(case)
    expected_shape = call.out_shape
    assert tuple(result.shape) == expected_shape, f"{what}: shape {tuple(result.shape)} != {expected_shape}"
    assert result.dtype == call.out_dtype, f"{what}: dtype {result.dtype} != {call.out_dtype}"
    if y is not None:
        assert result.data_ptr() == y.data_ptr() and result.stride() == y.stride(), f"{what}: y not returned"
        outside = y_storage.clone()
        torch.as_strided(outside, y.shape, y.stride(), y.storage_offset()).fill_(-96.0)
        assert bool((outside.float() == -96.0).all()), f"{what}: wrote outside y's view"
        if case.mode == "moe" and not case.scatter:  # rows past the routed ones are left unwritten (documented)
            assert bool(result[..., call.n_routed:, :].float().isnan().all()), \
                f"{what}: wrote rows past the {call.n_routed} routed ones"
    for name, (storage, before) in call.storages.items():
        assert torch.equal(_bits(storage), before), f"{what}: modified its input {name}"
    check_values(call, ref, result, what)
    if case.replay:  # the same call again replays the first's launch plan: the same bits
        actual_before = call.actual.clone() if call.actual is not None else None
        y2, _ = call.new_y()
        again = call.run(pc, y2)
        rows = slice(0, call.n_routed)
        assert torch.equal(_bits(again[..., rows, :]), _bits(result[..., rows, :])), \
            f"{what}: a replayed call gave other values"
        if actual_before is not None and result.numel():
            assert torch.equal(call.actual, actual_before), f"{what}: a replayed call recorded another actual_scale"


# ---------------------------------------------------------------- the fuzz tests

@pytest.mark.slow
@fuzz_settings("plain")
@given(cases(modes=("dense", "batched"), scaled=False))
def test_fuzz_dense_and_batched(case):
    run_case(case)


@pytest.mark.slow
@fuzz_settings("moe")
@given(cases(modes=("moe",), scaled=False))
def test_fuzz_moe(case):
    run_case(case)


@pytest.mark.slow
@fuzz_settings("scaled")
@given(cases(modes=("dense", "batched", "moe"), scaled=True))
def test_fuzz_scaled_formats(case):
    run_case(case)


# ---------------------------------------------------------------- defects the fuzzer found (minimal calls)
# The strategies above steer around them; each test here is the reduced call, expected to fail until it is fixed.

def _flex_fp8_out(actual):
    return PrecisionConfig(out_dtype=torch.float8_e4m3fn, flex_ctx=FlexCtx(out_data=OutFlexData(actual_scale=actual)))


@pytest.mark.parametrize("x_dtype,w_dtype,value", [
    (torch.float8_e4m3fn, torch.float8_e5m2, 2.0 ** -12),  # exact in e5m2, below e4m3's smallest 2**-9
    (torch.float8_e5m2, torch.float8_e4m3fn, 448.0 - 32),  # exact in e4m3, between two e5m2 values
])
def test_mixed_fp8_formats_keep_w_values(x_dtype, w_dtype, value):
    # One fp8 dot of both formats (Hopper's tensor cores take e4m3 x e5m2): w keeps its own values.
    x = torch.ones(16, 32, device=DEVICE).to(x_dtype)
    w = torch.full((32, 16), value, device=DEVICE).to(w_dtype)
    y = matmul_ogs(x, w, None, precision_config=PrecisionConfig(out_dtype=torch.float32))
    assert torch.equal(y, torch.full((16, 16), 32 * value, device=DEVICE))


def test_split_k_leaves_rows_past_the_routed_ones():
    ids = torch.zeros(8, 1, dtype=torch.int32, device=DEVICE)
    ids[::2] = -1                                               # 4 gates dropped: sorted rows 4..7 are not routed
    rd, _, _ = ogsgen.routing_from_topk(ids, torch.ones(8, 1, device=DEVICE), 2)
    x = torch.ones(8, 32, device=DEVICE, dtype=torch.float16)
    w = torch.ones(2, 32, 16, device=DEVICE, dtype=torch.float16) / 32
    actual = torch.full((1,), float("nan"), device=DEVICE)
    y = torch.full((8, 16), float("nan"), device=DEVICE).to(torch.float8_e4m3fn)
    with ogsgen.opt_flags_constraints(block_m=16, block_n=16, block_k=16, split_k=2):
        matmul_ogs(x, w, None, rd, precision_config=_flex_fp8_out(actual), y=y)
    assert torch.equal(y[:4].float(), torch.ones(4, 16, device=DEVICE))
    assert actual.item() == torch.tensor(1.0 / 448).item(), f"actual_scale {actual.item()} counts the rows past the routed ones"
    assert bool(y[4:].float().isnan().all()), "rows past the routed ones were written"


@pytest.mark.parametrize("shape", [(4, 0), (0, 64), (2, 0, 64), (2, 64, 0)])
@pytest.mark.parametrize("element", ["e2m1", "e4m3"])
@pytest.mark.parametrize("axis", [-1, -2])
def test_mx_helpers_on_empty_tensors(shape, element, axis):
    values, scales = quantize_mx(torch.zeros(shape, device=DEVICE), element, axis=axis)
    assert values.shape[axis] == (shape[axis] // 2 if element == "e2m1" else shape[axis])
    assert scales.shape[axis] == -(-shape[axis] // 32) and values.numel() == scales.numel() == 0
    assert dequantize_mx(values, scales, element, axis=axis).shape == shape
    assert dequantize_mx_torch(values, scales, element, axis=axis).shape == shape


@pytest.mark.parametrize("shape", [(16, 0), (0, 8), (3, 0, 8), (3, 16, 0)])
def test_swizzle_of_empty_mxfp4_values_round_trips(shape):
    values = torch.zeros(shape, device=DEVICE, dtype=torch.uint8)
    assert torch.equal(unswizzle_mx_values(swizzle_mx_values(values, capability=(9, 0))), values)


def test_prepare_fp8_weights_with_no_output_features():
    prepared = ogsgen.prepare_expert_weights(torch.zeros(2, 0, 32, device=DEVICE), format="fp8e4m3")
    assert prepared.w.shape == (2, 32, 0)


def test_reference_of_zero_batch_entries():
    y = matmul_ogs_torch(torch.zeros(0, 4, 8, device=DEVICE), torch.zeros(0, 8, 5, device=DEVICE), None)
    assert y.shape == (0, 4, 5)


def test_persistent_ragged_3d_y():
    rd, _, _ = ogsgen.routing(torch.zeros(1, 1, device=DEVICE), 1)
    x = torch.ones(1, 8, device=DEVICE, dtype=torch.bfloat16)
    w = torch.ones(1, 8, 8, device=DEVICE, dtype=torch.bfloat16)
    y = torch.empty(1, 1, 8, device=DEVICE, dtype=torch.bfloat16)
    with ogsgen.opt_flags_constraints(persistent=True, block_m=16, block_n=32, block_k=16):
        matmul_ogs(x, w, None, rd, y=y)
    assert torch.equal(y.float(), torch.full((1, 1, 8), 8.0, device=DEVICE))
