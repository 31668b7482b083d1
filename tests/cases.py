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
