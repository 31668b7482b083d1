"""Build matmul_ogs calls for a kernel variant and check them against matmul_ogs_torch."""
from __future__ import annotations

import torch

from ogsgen import Epilogue, FusedActivation, PrecisionConfig, matmul_ogs, matmul_ogs_torch
from ogsgen.spec import KernelVariant
from ogsgen.testing import assert_close

# Runtime argument values for the functions the test catalogs use.
FN_ARG_VALUES = {
    "swiglu": lambda n_out, device: (1.702, 7.0),
    "leaky_scaled": lambda n_out, device: (0.125, 1.5),
    "column_scale": lambda n_out, device: (torch.rand(n_out, device=device) + 0.5,),
}


def _empty(shape, dtype, device, transposed):
    """A NaN-poisoned output buffer, column-major when ``transposed``."""
    if transposed:
        return torch.full(shape[:-2] + (shape[-1], shape[-2]), float("nan"), dtype=dtype, device=device).mT
    return torch.full(shape, float("nan"), dtype=dtype, device=device)


def _operand(shape, dtype, device, transposed):
    t = torch.randn(shape[:-2] + (shape[-1], shape[-2]) if transposed else shape, device=device)
    return (t.mT if transposed else t).to(dtype)


def run_case(variant: KernelVariant, m: int, n: int, k: int, device, batch: int | None = None,
             x_transposed=False, w_transposed=False, y_transposed=False, out_alpha=None, allow_tf32=True,
             maxtol=2e-2, rmstol=4e-3):
    """Run ``variant`` on fresh random inputs and compare with the reference; returns the output."""
    dtype, out_dtype = variant.x.torch_dtype, variant.y.torch_dtype
    lead = (batch,) if batch else ()
    x = _operand(lead + (m, k), dtype, device, x_transposed)
    w = _operand(lead + (k, n), dtype, device, w_transposed)
    n_out = n // variant.reduction_n
    bias = torch.randn(lead + (n,), device=device) if variant.bias else None
    betas = torch.rand(m, device=device) + 0.5 if variant.betas else None
    # Exact powers of two, as upstream: the gammas multiply adds no rounding of its own.
    gammas = 2.0 ** torch.randint(-5, 1, (m,), device=device).float() if variant.gammas else None
    act = (FusedActivation(variant.activation, FN_ARG_VALUES[variant.activation.name](n_out, device))
           if variant.activation else None)
    epi = (Epilogue(variant.epilogue, FN_ARG_VALUES[variant.epilogue.name](n_out, device))
           if variant.epilogue else None)
    pc = PrecisionConfig(out_dtype=out_dtype, allow_tf32=allow_tf32)
    y = _empty(lead + (m, n_out), out_dtype, device, y_transposed)
    result = matmul_ogs(x, w, bias, precision_config=pc, betas=betas, gammas=gammas, out_alpha=out_alpha, y=y,
                        fused_activation=act, epilogue=epi)
    assert result.data_ptr() == y.data_ptr() and result.shape == y.shape and result.stride() == y.stride()
    ref = matmul_ogs_torch(x.float(), w.float(), bias, precision_config=PrecisionConfig(out_dtype=torch.float32),
                           betas=betas, gammas=gammas, out_alpha=out_alpha, fused_activation=act, epilogue=epi)
    assert_close(ref, result.float(), maxtol, rmstol, what=f"{variant} m={m} n={n} k={k} batch={batch}")
    return result


def run_moe_case(variant: KernelVariant, n_tokens: int, n: int, k: int, n_expts: int, n_expts_act: int, device,
                 drop: float = 0.0, split_k: int | None = None, maxtol=2e-2, rmstol=4e-3):
    """A ragged matmul of ``variant`` on fresh random routing and inputs, checked against the reference.

    ``drop``: the fraction of gates routed to no local expert (-1), as with expert parallelism.
    """
    from ogsgen import opt_flags_constraints
    from ogsgen.moe import routing_from_topk

    dtype, out_dtype = variant.x.torch_dtype, variant.y.torch_dtype
    logits = torch.randn(n_tokens, n_expts, device=device)
    weights, ids = torch.topk(torch.softmax(logits, -1), n_expts_act, dim=-1)
    if drop:
        ids = torch.where(torch.rand(ids.shape, device=device) < drop, -1, ids)
    routing_data, gather_indx, scatter_indx = routing_from_topk(ids, weights, n_expts)
    n_rows = n_tokens * n_expts_act
    x = torch.randn((n_tokens if variant.gather else n_rows), k, device=device).to(dtype)
    w = torch.randn(n_expts, k, n, device=device).to(dtype)
    n_out = n // variant.reduction_n
    bias = torch.randn(n_expts, n, device=device) if variant.bias else None
    betas = torch.rand(n_rows, device=device) + 0.5 if variant.betas else None
    gammas = 2.0 ** torch.randint(-5, 1, (n_rows,), device=device).float() if variant.gammas else None
    act = (FusedActivation(variant.activation, FN_ARG_VALUES[variant.activation.name](n_out, device))
           if variant.activation else None)
    epi = (Epilogue(variant.epilogue, FN_ARG_VALUES[variant.epilogue.name](n_out, device))
           if variant.epilogue else None)
    out_rows = n_tokens if variant.scatter else n_rows
    y_acc_in = torch.randn(out_rows, n_out, device=device).to(out_dtype) if variant.y_acc_in else None
    y = torch.full((out_rows, n_out), float("nan"), dtype=out_dtype, device=device)
    kwargs = dict(gather_indx=gather_indx if variant.gather else None,
                  scatter_indx=scatter_indx if variant.scatter else None, betas=betas, gammas=gammas,
                  fused_activation=act, epilogue=epi, y_acc_in=y_acc_in)
    with opt_flags_constraints(**({"split_k": split_k} if split_k else {})):
        result = matmul_ogs(x, w, bias, routing_data, y=y, precision_config=PrecisionConfig(out_dtype=out_dtype),
                            **kwargs)
    assert result.data_ptr() == y.data_ptr()
    # With k > 1 the scattered rows pass through a scratch buffer in the output dtype before the sum.
    rounds_rows = variant.scatter and n_expts_act > 1
    ref = matmul_ogs_torch(x, w, bias, routing_data, precision_config=PrecisionConfig(out_dtype=torch.float32),
                           round_y=(lambda t: t.to(out_dtype).float()) if rounds_rows else None, **kwargs)
    if not variant.scatter:  # rows past the routed ones (dropped gates) are left unwritten
        n_routed = int(routing_data.expt_hist.sum())
        ref, result = ref[:n_routed], result[:n_routed]
    assert_close(ref, result.float(), maxtol, rmstol,
                 what=f"{variant} tokens={n_tokens} n={n} k={k} E={n_expts} k_act={n_expts_act} split={split_k}")
    return result
