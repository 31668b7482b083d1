"""Property-based fuzzing of ``matmul_ogs``'s gradients against torch autograd through ``matmul_ogs_torch``.

Random dense, batched and mixture-of-experts calls (sorted rows, gathered tokens, rows scattered back with top-k
sums), sizes from 1 up, bf16 / fp16 / fp32, E experts and top-k k with dropped gates, bias (per expert or batch
entry, or shared) with or without betas, gammas, out_alpha and the fused SwiGLU (whose forward stores its
pre-activation under autograd), launch constraints on every matmul of the step (split K, small tiles, the
persistent kernel); every differentiable input a leaf. Each gradient is compared with the float32 reference's on the same values,
relative to its largest magnitude, within the format's rounding. Kernels are rendered on demand into a temporary
folder (combinations the default catalog lacks, e.g. a gather with gammas).

CI: fixed, derandomized examples on the interpreter (about a minute); ``OGSGEN_FUZZ_EXAMPLES=N`` for more.
"""
from __future__ import annotations

import os

import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings, strategies as st  # noqa: E402

import torch  # noqa: E402

import ogsgen  # noqa: E402
from ogsgen import FusedActivation, PrecisionConfig, matmul_ogs, matmul_ogs_torch  # noqa: E402
from ogsgen.errors import InapplicableConstraintError  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
TOLERANCE = {"bf16": 6e-2, "fp16": 1.5e-2, "fp32": 2e-3}  # of the largest gradient magnitude
SWIGLU = FusedActivation(ogsgen.swiglu, (1.702, 7.0))
EXAMPLES = int(os.environ.get("OGSGEN_FUZZ_EXAMPLES", 0)) or 40


pytestmark = pytest.mark.usefixtures("kernels_on_demand")


@st.composite
def cases(draw):
    mode = draw(st.sampled_from(["dense", "batched", "sorted", "gather", "scatter"]))
    case = dict(mode=mode, dtype=draw(st.sampled_from(sorted(DTYPES))), seed=draw(st.integers(0, 2**31 - 1)),
                m=draw(st.integers(1, 24)), k=draw(st.integers(1, 48)), n=2 * draw(st.integers(1, 20)),
                out_alpha=draw(st.sampled_from([None, 0.5, 1.75])), gammas=draw(st.booleans()),
                activation=mode != "scatter" and draw(st.booleans()))
    if mode in ("sorted", "gather", "scatter"):
        case.update(n_expts=draw(st.integers(1, 8)), dropped=draw(st.booleans()))
        case["k_act"] = draw(st.integers(1, min(4, case["n_expts"])))
    if mode == "batched":
        case["batch"] = draw(st.integers(1, 3))
    case["bias"] = draw(st.sampled_from([None, "shared"] + ([] if mode == "dense" else ["per"])))
    case["betas"] = case["bias"] is not None and draw(st.booleans())
    case["constraints"] = draw(st.sampled_from([(), (("split_k", 2),), (("block_m", 16), ("block_n", 32)),
                                                (("persistent", True),)]))
    return case


def _routing(case, gen):
    tokens, n_expts, k_act = case["m"], case["n_expts"], case["k_act"]
    ids = torch.stack([torch.randperm(n_expts, generator=gen)[:k_act] for _ in range(tokens)]).to(DEVICE)
    if case["dropped"]:
        ids[torch.rand(tokens, k_act, generator=gen).to(DEVICE) < 0.3] = -1
    return ogsgen.routing_from_topk(ids, torch.rand(tokens, k_act, generator=gen).to(DEVICE), n_expts)


def _inputs(case):
    """(leaves, the call of matmul_ogs or matmul_ogs_torch on them) for a case."""
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
    tensors = [x.to(dtype), w.to(dtype), bias, gammas]
    kwargs = dict(routing_data=rd, betas=betas, gather_indx=gi if mode == "gather" else None,
                  scatter_indx=si if mode == "scatter" else None, out_alpha=case["out_alpha"],
                  fused_activation=SWIGLU if case["activation"] else None,
                  precision_config=PrecisionConfig(allow_tf32=False))

    def call(mm, x, w, bias, gammas):
        return mm(x, w, bias, gammas=gammas, **kwargs)
    return tensors, call


@pytest.mark.slow
@settings(max_examples=EXAMPLES, derandomize=True, deadline=None, database=None, print_blob=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(cases())
def test_fuzz_gradients(case):
    tensors, call = _inputs(case)
    ours = [None if t is None else t.detach().clone().requires_grad_() for t in tensors]
    theirs = [None if t is None else t.detach().float().requires_grad_() for t in tensors]
    y_ref = call(matmul_ogs_torch, *theirs)
    grad = torch.randn(y_ref.shape, generator=torch.Generator().manual_seed(case["seed"] + 1)).to(DEVICE)
    y_ref.backward(grad)
    try:  # the forward's and the backward's matmuls under the drawn launch constraints
        with ogsgen.opt_flags_constraints(**dict(case["constraints"])):
            y = call(matmul_ogs, *ours)
            assert y.shape == y_ref.shape
            y.backward(grad.to(y.dtype))
    except InapplicableConstraintError:
        hypothesis.assume(False)  # a constraint that some matmul of the step cannot take (its error is tested)
    for name, a, b in zip(("x", "w", "bias", "gammas"), ours, theirs):
        if a is None:
            continue
        assert a.grad is not None and a.grad.dtype == a.dtype and a.grad.shape == a.shape, name
        assert torch.isfinite(a.grad).all(), f"{name}: non-finite gradient"
        scale = b.grad.abs().max().clamp_min(1e-6)
        err = ((a.grad.float() - b.grad).abs().max() / scale).item()
        assert err < TOLERANCE[case["dtype"]], f"{name}: gradient off by {err:.3g} of its largest magnitude"
