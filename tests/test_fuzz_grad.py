"""Property-based fuzzing of ``matmul_ogs``'s gradients against torch autograd through ``matmul_ogs_torch``.

Random dense, batched and mixture-of-experts calls (sorted rows, gathered tokens, rows scattered back with top-k
sums), sizes from 1 up, bf16 / fp16 / fp32, w as (K, N) rows or K-contiguous, E experts and top-k k with dropped
gates, bias (per expert or batch entry, or shared) with or without betas, gammas, out_alpha, y_acc_in and the fused
SwiGLU (whose forward stores its pre-activation under autograd), launch constraints on every matmul of the step
(split K, small tiles, the persistent kernel); every differentiable input a leaf. The forward (the rows it writes)
and each gradient are compared with the float32 reference's on the same values, relative to the largest magnitude
(d gammas: of the products it sums), within the format's rounding. Kernels are rendered on demand into a temporary
folder (combinations the default catalog lacks, e.g. a gather with gammas).

CI: fixed, derandomized examples on the interpreter (about a minute); ``OGSGEN_FUZZ_EXAMPLES=N`` for more,
``OGSGEN_FUZZ_SEED=N`` for the draws of seed N instead. On a CUDA GPU, ``OGSGEN_FUZZ_PROFILE=gpu`` draws sizes past
the kernels' tiles (rows, K and N to a few hundred, up to 32 experts and top-8), as tests/test_fuzz.py's GPU run
does, so that the backward's matmuls take their heuristic tiles, split K and the persistent kernel on their own::

    OGSGEN_FUZZ_PROFILE=gpu OGSGEN_FUZZ_EXAMPLES=300 OGSGEN_FUZZ_SEED=1 python -m pytest -q tests/test_fuzz_grad.py
"""
from __future__ import annotations

import dataclasses
import os

import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings, strategies as st  # noqa: E402

import torch  # noqa: E402
import triton  # noqa: E402

import ogsgen  # noqa: E402
from ogsgen import FnSpecs, FusedActivation, PrecisionConfig, matmul_ogs, matmul_ogs_torch  # noqa: E402
from ogsgen.errors import InapplicableConstraintError  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
TOLERANCE = {"bf16": 6e-2, "fp16": 1.5e-2, "fp32": 2e-3}  # of the largest gradient magnitude
SWIGLU = FusedActivation(ogsgen.swiglu, (1.702, 7.0))
LEAVES = ("x", "w", "bias", "gammas", "y_acc_in")  # a case's differentiable inputs, in call order
EXAMPLES = int(os.environ.get("OGSGEN_FUZZ_EXAMPLES", 0)) or 40
SEED = os.environ.get("OGSGEN_FUZZ_SEED")
PROFILE = os.environ.get("OGSGEN_FUZZ_PROFILE", "ci")
if PROFILE not in ("ci", "gpu"):
    raise ValueError(f"OGSGEN_FUZZ_PROFILE must be 'ci' or 'gpu', got {PROFILE!r}")
if PROFILE == "gpu" and DEVICE != "cuda":
    pytest.skip("OGSGEN_FUZZ_PROFILE=gpu needs a CUDA GPU", allow_module_level=True)
# (rows or tokens, K, N / 2, experts, top-k): the interpreter runs each program in Python, so CI keeps them small
MAX_M, MAX_K, MAX_HALF_N, MAX_EXPERTS, MAX_K_ACT = (300, 400, 200, 32, 8) if PROFILE == "gpu" else (24, 48, 20, 8, 4)


pytestmark = pytest.mark.usefixtures("kernels_on_demand")


@st.composite
def cases(draw):
    mode = draw(st.sampled_from(["dense", "batched", "sorted", "gather", "scatter"]))
    case = dict(mode=mode, dtype=draw(st.sampled_from(sorted(DTYPES))), seed=draw(st.integers(0, 2**31 - 1)),
                m=draw(st.integers(1, MAX_M)), k=draw(st.integers(1, MAX_K)), n=2 * draw(st.integers(1, MAX_HALF_N)),
                out_alpha=draw(st.sampled_from([None, 0.5, 1.75])), gammas=draw(st.booleans()),
                activation=draw(st.booleans()),
                # w as stored (K, N) rows, or K-contiguous: the transposed view of nn.Linear's and vLLM's (N, K)
                w_k_contiguous=draw(st.booleans()))
    if mode in ("sorted", "gather", "scatter"):
        case.update(n_expts=draw(st.integers(1, MAX_EXPERTS)), dropped=draw(st.booleans()))
        case["k_act"] = draw(st.integers(1, min(MAX_K_ACT, case["n_expts"])))
    if mode == "batched":
        case["batch"] = draw(st.integers(1, 3))
    case["bias"] = draw(st.sampled_from([None, "shared"] + ([] if mode == "dense" else ["per"])))
    case["betas"] = case["bias"] is not None and draw(st.booleans())
    case["constraints"] = draw(st.sampled_from([(), (("split_k", 2),), (("block_m", 16), ("block_n", 32)),
                                                (("persistent", True),)]))
    # y_acc_in (a leaf too), which neither a scatter nor split K takes
    case["y_acc_in"] = mode != "scatter" and ("split_k", 2) not in case["constraints"] and draw(st.booleans())
    return case


def _routing(case, gen):
    tokens, n_expts, k_act = case["m"], case["n_expts"], case["k_act"]
    ids = torch.stack([torch.randperm(n_expts, generator=gen)[:k_act] for _ in range(tokens)]).to(DEVICE)
    if case["dropped"]:
        ids[torch.rand(tokens, k_act, generator=gen).to(DEVICE) < 0.3] = -1
    return ogsgen.routing_from_topk(ids, torch.rand(tokens, k_act, generator=gen).to(DEVICE), n_expts)


def _inputs(case):
    """(leaves, the call of matmul_ogs or matmul_ogs_torch on them, how many output rows matmul_ogs writes: None
    for all) for a case."""
    gen = torch.Generator().manual_seed(case["seed"])

    def randn(*shape, scale=1.0):
        return (torch.randn(*shape, generator=gen) * scale).to(DEVICE)
    dtype, mode, m, k, n = DTYPES[case["dtype"]], case["mode"], case["m"], case["k"], case["n"]
    rd = gi = si = None
    if mode in ("sorted", "gather", "scatter"):
        rd, gi, si = _routing(case, gen)
        rows = m * case["k_act"]
        x = randn(m if mode == "gather" else rows, k)
        w = randn(case["n_expts"], k, n, scale=k ** -0.5)
        per = case["n_expts"]
    elif mode == "batched":
        rows, per = m, case["batch"]
        x, w = randn(per, m, k), randn(per, k, n, scale=k ** -0.5)
    else:
        rows, per = m, None
        x, w = randn(m, k), randn(k, n, scale=k ** -0.5)
    bias = {None: None, "shared": randn(n), "per": randn(per or 1, n)}[case["bias"]]
    gammas = torch.rand(rows, generator=gen).to(DEVICE) + 0.5 if case["gammas"] else None
    betas = torch.rand(rows, generator=gen).to(DEVICE) if case["betas"] else None  # (a constant)
    w = w.to(dtype)
    if case["w_k_contiguous"]:
        w = w.mT.contiguous().mT
    n_out = n // 2 if case["activation"] else n
    y_acc_in = randn(*x.shape[:-2], rows, n_out).to(dtype) if case["y_acc_in"] else None
    tensors = [x.to(dtype), w, bias, gammas, y_acc_in]
    kwargs = dict(routing_data=rd, betas=betas, gather_indx=gi if mode == "gather" else None,
                  scatter_indx=si if mode == "scatter" else None, out_alpha=case["out_alpha"],
                  fused_activation=SWIGLU if case["activation"] else None,
                  precision_config=PrecisionConfig(allow_tf32=False))

    def call(mm, x, w, bias, gammas, y_acc_in, **replaced):
        return mm(x, w, bias, gammas=gammas, y_acc_in=y_acc_in, **{**kwargs, **replaced})
    written = int(rd.expt_hist.sum()) if mode in ("sorted", "gather") else None  # output rows matmul_ogs writes
    return tensors, call, written


def fuzz_settings(fn):
    """Fixed, derandomized draws, or those of OGSGEN_FUZZ_SEED."""
    applied = settings(max_examples=EXAMPLES, derandomize=SEED is None, deadline=None, database=None,
                       print_blob=True, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    return applied(fn) if SEED is None else hypothesis.seed(int(SEED))(applied(fn))


def _reference_activation(case, magnitude=False):
    """The reference's activation: SwiGLU of the pre-activation rounded to the operands' dtype, or with ``magnitude``
    its absolute value (the identity's, without an activation).

    A differentiated call with a built-in activation and no scatter stores its pre-activation in the output dtype,
    as torch's autograd of a 16-bit layer keeps it, and differentiates there (with a scatter it recomputes it in
    fp32); SwiGLU's clamps make the gradient jump where that rounding moves a value across the limit (7.006 is
    past 7.0; its bf16 rounding, 7.0, is not)."""
    stored = DTYPES[case["dtype"]] if case["mode"] != "scatter" else torch.float32  # (a scatter's z is recomputed)

    def reference(z, alpha, limit):
        out = ogsgen.swiglu_torch(z.to(stored).float(), alpha, limit) if case["activation"] else z
        return out.abs() if magnitude else out
    if case["activation"]:
        specs = dataclasses.replace(SWIGLU.specs, reference=reference)
    else:  # (a function of its own: the registered SwiGLU always folds two columns into one)
        specs = FnSpecs("fuzz_reference_identity", _identity, ("alpha", "limit"), reference=reference)
    return FusedActivation(specs, SWIGLU.fn_args)


@triton.jit
def _identity(tile, alpha, limit):
    return tile


def _close(name, ours, reference, dtype, scale=None):
    """``ours`` within the dtype's tolerance of ``reference``, relative to its largest magnitude (or ``scale``)."""
    if reference.numel() == 0:
        return
    scale = (reference.abs().max() if scale is None else scale).clamp_min(1e-6)
    err = ((ours.float() - reference).abs().max() / scale).item()
    assert err < TOLERANCE[dtype], f"{name} off by {err:.3g} of its largest magnitude"


def _gammas_scale(call, case, theirs, grad):
    """The largest sum of the magnitudes of the products d gammas adds up (over a row's columns): the scale of its
    rounding errors, which cancellation can leave far above the sum itself (one routed row, few columns)."""
    gammas = LEAVES.index("gammas")
    leaves = [None if t is None else t.detach().requires_grad_(i == gammas) for i, t in enumerate(theirs)]
    call(matmul_ogs_torch, *leaves, fused_activation=_reference_activation(case, magnitude=True)).backward(grad.abs())
    return leaves[gammas].grad.abs().max()


@pytest.mark.slow
@fuzz_settings
@given(cases())
def test_fuzz_gradients(case):
    tensors, call, written = _inputs(case)
    ours = [None if t is None else t.detach().clone().requires_grad_() for t in tensors]
    theirs = [None if t is None else t.detach().float().requires_grad_() for t in tensors]
    y_ref = call(matmul_ogs_torch, *theirs, fused_activation=_reference_activation(case))
    grad = torch.randn(y_ref.shape, generator=torch.Generator().manual_seed(case["seed"] + 1)).to(DEVICE)
    y_ref.backward(grad)
    try:  # the forward's and the backward's matmuls under the drawn launch constraints
        with ogsgen.opt_flags_constraints(**dict(case["constraints"])):
            y = call(matmul_ogs, *ours)
            assert y.shape == y_ref.shape
            y.backward(grad.to(y.dtype))
    except InapplicableConstraintError:
        hypothesis.assume(False)  # a constraint that some matmul of the step cannot take (its error is tested)
    # the forward under autograd (the custom op; with a built-in activation, the variant that stores preact), on
    # the rows it writes: without a scatter, the rows past the routed ones (dropped gates) are left unwritten
    _close("the forward", y.detach()[..., :written, :], y_ref.detach()[..., :written, :], case["dtype"])
    for name, a, b in zip(LEAVES, ours, theirs):
        if a is None:
            continue
        assert a.grad is not None and a.grad.dtype == a.dtype and a.grad.shape == a.shape, name
        assert torch.isfinite(a.grad).all(), f"{name}: non-finite gradient"
        scale = _gammas_scale(call, case, theirs, grad) if name == "gammas" else None
        _close(f"{name}'s gradient", a.grad, b.grad, case["dtype"], scale)
