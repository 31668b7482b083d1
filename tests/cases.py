"""Build matmul_ogs calls for a kernel variant and check them against matmul_ogs_torch."""
from __future__ import annotations

import math

import pytest
import torch

from ogsgen import (Epilogue, FlexCtx, FusedActivation, InFlexData, OutFlexData, PrecisionConfig, matmul_ogs,
                    matmul_ogs_torch)
from ogsgen.numerics import (FP8_BLOCK, actual_scale_torch, dequantize_fp8_torch, dequantize_mx_torch, quantize_fp8_torch,
                             quantize_mx, quantize_mx_torch, swizzle_mx_values)
from ogsgen.numerics.mx import ELEMENT_MAX, FP8_DTYPES, MX_BLOCK
from ogsgen.numerics.nvfp4 import NVFP4_BLOCK, dequantize_nvfp4, quantize_nvfp4
from ogsgen.spec import KernelVariant
from ogsgen.testing import assert_close

def quick_few(values, keep):
    """``values`` as parameters, all but those in ``keep`` marked slow: the quick subset runs a few representatives,
    the whole suite every one."""
    return [value if value in keep else pytest.param(value, marks=pytest.mark.slow) for value in values]


# Runtime argument values for the functions the test catalogs use.
FN_ARG_VALUES = {
    "swiglu": lambda n_out, device: (1.702, 7.0),
    "silu_and_mul": lambda n_out, device: (),
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


def exact_fp8(shape, dtype, device):
    """Powers of two 2**-4 .. 2**-7 with random signs: exact in fp8, and so are their fp32 dot products."""
    values = 2.0 ** -torch.randint(4, 8, shape, device=device).float()
    return (values * torch.where(torch.rand(shape, device=device) < 0.5, -1.0, 1.0)).to(dtype)


def check_mx_output(ref, values, scales, element, rtol=1e-6):
    """The kernel's MX output against the float32 reference: each scale the reference's, or (where summation order
    moved a block's largest value across a power of two) one code from it, and each value within half an element
    ulp of the reference under its block's scale (the kernel rounds to nearest), plus ``rtol`` of it for what the
    reference rounds elsewhere (summation order; an intermediate rounding)."""
    ref_scales = quantize_mx_torch(ref, element, axis=-1)[1]
    assert ((scales.int() - ref_scales.int()).abs() <= 1).all()
    assert (scales == ref_scales).float().mean() > 0.95
    _, emax, _ = ELEMENT_MAX[element]
    half_ulp = 2.0 ** emax * torch.finfo(FP8_DTYPES[element]).eps / 2  # in the largest values' binade, unscaled
    bound = (half_ulp * torch.exp2(scales.float() - 127)).repeat_interleave(MX_BLOCK, -1)[..., :ref.shape[-1]]
    error = (dequantize_mx_torch(values, scales, element) - ref).abs()
    assert (error <= bound + rtol * ref.abs()).all(), \
        f"largest error {(error / bound).max().item():.3g} of half an ulp"


def check_fp8_block_output(ref, values, scales, element, rtol=1e-6):
    """The kernel's fp8e4m3_b128 output against the float32 reference: each scale the reference's (amax / 448) within
    ``rtol``, each value within half an e4m3 ulp of the reference under its block's scale (the kernel rounds to
    nearest), plus ``rtol`` of it for what the reference rounds elsewhere."""
    assert element == "e4m3"
    ref_scales = quantize_fp8_torch(ref, (1, FP8_BLOCK))[1]
    assert torch.allclose(scales, ref_scales, rtol=rtol, atol=0), (scales, ref_scales)
    block_scales = scales.repeat_interleave(FP8_BLOCK, -1)[..., :ref.shape[-1]]
    # half an ulp: 2**-4 of a normal value, 2**-10 of the scale below e4m3's smallest normal (2**-6)
    bound = torch.maximum(ref.abs() * 2.0 ** -4, block_scales * 2.0 ** -10) + rtol * ref.abs()
    error = (dequantize_fp8_torch(values, scales, (1, FP8_BLOCK)) - ref).abs()
    assert (error <= bound).all(), f"largest error {(error / bound).max().item():.3g} of its bound"


def assert_fp32_sums(want, bound, got):
    """got within ``bound`` of the float64 ``want`` where want is finite, and of its kind (NaN, or the same inf)
    where it is not."""
    got = got.double()
    finite = want.isfinite()
    assert torch.equal(got[~finite].isnan(), want[~finite].isnan()), "NaN where the reference is not, or not"
    assert torch.equal(got[want.isinf()], want[want.isinf()]), "an infinity of the wrong sign, or a finite value"
    error = (got - want).abs()[finite]
    assert got[finite].isfinite().all() and (error <= bound[finite]).all(), \
        f"largest error {(error / bound[finite]).max().item():.3g} of the fp32 sums' bound"


# Hopper's fp8 tensor cores (wgmma) sum an fp8 dot with fewer bits than fp32: measured on an H100 (2026-12-06,
# Triton 3.6, random e4m3 operands, K from 128 to 4096), each output within 2**-12 of the sum of its products'
# magnitudes (docs/formats.md, "fp8 dots on Hopper"). Tests of fp32 outputs of wgmma fp8 dots allow 4 times that.
FP8_DOT_ERROR = 2.0 ** -10


def fp8_dot_bound(abs_sums):
    """What an fp8 dot on Hopper's tensor cores may add to exact sums: FP8_DOT_ERROR times each output's sum of
    |products| (``abs_sums``, e.g. |x| @ |w|), plus the smallest subnormal."""
    return FP8_DOT_ERROR * abs_sums + 2.0 ** -149


def fp32_bound(x_ref, w_ref):
    """The rounding fp32 sums of K exact products may add: K * 2**-23 * sum |products| per output (plus the
    smallest subnormal, for sums of tiny products)."""
    k = x_ref.shape[-1]
    return k * 2.0 ** -23 * (x_ref.abs().nan_to_num() @ w_ref.abs().nan_to_num()) + 2.0 ** -149


class Operands:
    """x and w for a variant's formats, their float32 reference values and the precision config."""

    def __init__(self, variant: KernelVariant, x_shape, w_shape, device, x_transposed=False, w_transposed=False,
                 scales_n_contiguous=False):
        self.variant, self.pc_fields = variant, {}
        flex = {}
        if variant.x.scaling == "block_f32" and variant.folds_mx_scales:
            # e4m3 x with one scale per row, as quantize_fp8 makes them (matmul_ogs quantizes bf16 x only for fp8 w)
            self.x, self.pc_fields["act_scale"] = quantize_fp8_torch(torch.randn(x_shape, device=device), (1, 0))
            self.x_ref = dequantize_fp8_torch(self.x, self.pc_fields["act_scale"], (1, 0))
        elif variant.x.scaling == "block_f32":
            # bf16 x, which the call quantizes as its format says: the reference takes it as the call computes it
            self.x = _operand(x_shape, torch.bfloat16, device, x_transposed)
            block = (1, FP8_BLOCK) if variant.x.block_size else (1, 0)
            self.x_ref = dequantize_fp8_torch(*quantize_fp8_torch(self.x.float(), block), block)
        elif variant.x.scaling == "block_e8m0":
            # mxfp8 x: quantize_mx's values and e8m0 scales along K; the kernel multiplies their bf16 upcast
            values, self.pc_fields["act_scale"] = quantize_mx(torch.randn(x_shape, device=device), variant.x.element)
            self.x = values
            self.x_ref = dequantize_mx_torch(values, self.pc_fields["act_scale"], variant.x.element,
                                             dtype=torch.bfloat16).float()
        elif variant.x.scaling == "flexpoint":
            self.x = exact_fp8(x_shape, variant.x.torch_dtype, device)
            x_scale = torch.tensor([1.25], device=device)
            flex["lhs_data"] = InFlexData(scale=x_scale)
            self.x_ref = self.x.float() * x_scale
        else:
            self.x = _operand(x_shape, variant.x.torch_dtype, device, x_transposed)
            self.x_ref = self.x.float()
        if variant.w.scaling == "flexpoint":
            # Hopper's fp8 dot wants w K-contiguous; one scale per expert or batch entry.
            self.w = exact_fp8(w_shape, variant.w.torch_dtype, device).mT.contiguous().mT
            lead = w_shape[:-2]
            w_scale = 1.0 + torch.arange(lead[0] if lead else 1, device=device).float() / 4
            flex["rhs_data"] = InFlexData(scale=w_scale)
            self.w_ref = self.w.float() * (w_scale.view(-1, 1, 1) if lead else w_scale)
        elif variant.w.scaling == "block_f32":
            # float32 scales per 128 x 128 block of (K, N), or per column (N-contiguous w here)
            block = (FP8_BLOCK, FP8_BLOCK) if variant.w.block_size else (0, 1)
            self.w, self.pc_fields["weight_scale"] = quantize_fp8_torch(torch.randn(w_shape, device=device), block)
            self.w_ref = dequantize_fp8_torch(self.w, self.pc_fields["weight_scale"], block)
        elif variant.w.scaling == "block_e8m0":
            dense = torch.randn(w_shape, device=device)
            values, scales = quantize_mx(dense.mT.contiguous(), variant.w.element, axis=-1)
            # MX scales K-contiguous as quantize_mx makes them, or N-contiguous as prepare_expert_weights stores them
            self.w, self.pc_fields["weight_scale"] = values.mT, scales.mT.contiguous() if scales_n_contiguous \
                else scales.mT
            if variant.w.layout != "strided":
                self.w = swizzle_mx_values(values.mT, variant.w.layout)
            self.w_ref = dequantize_mx_torch(values, scales, variant.w.element).mT
        elif variant.w.scaling == "block_e4m3":
            # NVFP4: quantized per expert over K in whole blocks of 16, then cut to K's bytes and blocks
            *lead, k, n = w_shape
            whole_k = -(-k // NVFP4_BLOCK) * NVFP4_BLOCK
            dense = torch.zeros(math.prod(lead), n, whole_k, device=device)
            dense[..., :k] = torch.randn(math.prod(lead), n, k, device=device)
            codes, scales, global_scale = quantize_nvfp4(dense, per_expert=True)
            self.w_ref = dequantize_nvfp4(codes, scales, global_scale)[..., :k].mT.reshape(w_shape)
            self.w = codes[..., :k // 2].mT.reshape(*w_shape[:-2], k // 2, n)
            self.pc_fields["weight_scale"] = scales[..., :-(-k // NVFP4_BLOCK)].mT.reshape(
                *w_shape[:-2], -(-k // NVFP4_BLOCK), n)
            flex["rhs_data"] = InFlexData(scale=global_scale)
        else:
            self.w = _operand(w_shape, variant.w.torch_dtype, device, w_transposed)
            self.w_ref = self.w.float()
        self.flex = flex

    def precision_config(self, ref, allow_tf32=True, out_shape=None) -> PrecisionConfig:
        """The call's config; a flexpoint output gets an expected scale that maps max |ref| to 100, an MX output
        (of ``out_shape``, else ref's) NaN-poisoned scales."""
        flex, fields = dict(self.flex), dict(self.pc_fields)
        if self.variant.y.has_block_scales:  # (NaN scales: e8m0's code 255)
            shape, y = tuple(out_shape or ref.shape), self.variant.y
            self.out_scale = torch.full((*shape[:-1], -(-shape[-1] // y.block_size)),
                                        255 if y.scale_dtype == torch.uint8 else float("nan"), dtype=y.scale_dtype,
                                        device=ref.device)
            fields["out_scale"] = self.out_scale
        if self.variant.y.scaling == "flexpoint":
            self.expected = (ref.abs().max().clamp_min(1e-6) / 100).reshape(1)
            self.actual = torch.full((1,), float("nan"), device=ref.device)
            flex["out_data"] = OutFlexData(expected_scale=self.expected, actual_scale=self.actual)
        return PrecisionConfig(out_dtype=self.variant.y.torch_dtype, allow_tf32=allow_tf32,
                               flex_ctx=FlexCtx(**flex), **fields)

    def check(self, ref, result, maxtol, rmstol, what):
        if self.variant.w.element == "e2m1":
            maxtol = max(maxtol, 3e-2)  # upstream's mxfp4 tolerance
        if self.variant.y.has_block_scales:
            check_output = check_mx_output if self.variant.y.scaling == "block_e8m0" else check_fp8_block_output
            check_output(ref, result, self.out_scale[..., :ref.shape[-2], :], self.variant.y.element, rtol=1e-5)
            return
        if self.variant.y.scaling == "flexpoint":
            dtype = self.variant.y.torch_dtype
            scale = actual_scale_torch(ref, dtype)
            assert abs(self.actual.item() - scale.item()) <= 1e-5 * scale.item(), (self.actual, scale)
            ref = (ref / self.expected).to(dtype)
            # Both sides are rounded to fp8: an accumulation-order difference may flip one value by an ulp.
            maxtol = max(maxtol, 2.0 ** -(3 if dtype == torch.float8_e4m3fn else 2))
        assert_close(ref.float(), result.float(), maxtol, rmstol, what=what)


def run_case(variant: KernelVariant, m: int, n: int, k: int, device, batch: int | None = None,
             x_transposed=False, w_transposed=False, y_transposed=False, out_alpha=None, allow_tf32=True,
             maxtol=2e-2, rmstol=4e-3):
    """Run ``variant`` on fresh random inputs and compare with the reference; returns the output."""
    out_dtype = variant.y.torch_dtype
    lead = (batch,) if batch else ()
    ops = Operands(variant, lead + (m, k), lead + (k, n), device, x_transposed, w_transposed)
    x, w = ops.x, ops.w
    n_out = n // variant.reduction_n
    bias = torch.randn(lead + (n,), device=device) if variant.bias else None
    betas = torch.rand(m, device=device) + 0.5 if variant.betas else None
    # Exact powers of two, as upstream: the gammas multiply adds no rounding of its own.
    gammas = 2.0 ** torch.randint(-5, 1, (m,), device=device).float() if variant.gammas else None
    act = (FusedActivation(variant.activation, FN_ARG_VALUES[variant.activation.name](n_out, device))
           if variant.activation else None)
    epi = (Epilogue(variant.epilogue, FN_ARG_VALUES[variant.epilogue.name](n_out, device))
           if variant.epilogue else None)
    ref = matmul_ogs_torch(ops.x_ref, ops.w_ref, bias, precision_config=PrecisionConfig(out_dtype=torch.float32),
                           betas=betas, gammas=gammas, out_alpha=out_alpha, fused_activation=act, epilogue=epi)
    y = _empty(lead + (m, n_out), out_dtype, device, y_transposed)
    result = matmul_ogs(x, w, bias, precision_config=ops.precision_config(ref, allow_tf32), betas=betas,
                        gammas=gammas, out_alpha=out_alpha, y=y, fused_activation=act, epilogue=epi)
    assert result.data_ptr() == y.data_ptr() and result.shape == y.shape and result.stride() == y.stride()
    ops.check(ref, result, maxtol, rmstol, what=f"{variant} m={m} n={n} k={k} batch={batch}")
    return result


def run_moe_case(variant: KernelVariant, n_tokens: int, n: int, k: int, n_expts: int, n_expts_act: int, device,
                 drop: float = 0.0, split_k: int | None = None, maxtol=2e-2, rmstol=4e-3,
                 scales_n_contiguous=False, w_k_major=False):
    """A ragged matmul of ``variant`` on fresh random routing and inputs, checked against the reference.

    ``drop``: the fraction of gates routed to no local expert (-1), as with expert parallelism.
    ``scales_n_contiguous``: MX scales stored N-contiguous (else K-contiguous).
    ``w_k_major``: plain w stored K-contiguous, (E, N, K) viewed as (E, K, N), as nn.Linear and vLLM hold it.
    """
    from ogsgen import opt_flags_constraints
    from ogsgen.moe import routing_from_topk

    out_dtype = variant.y.torch_dtype
    logits = torch.randn(n_tokens, n_expts, device=device)
    weights, ids = torch.topk(torch.softmax(logits, -1), n_expts_act, dim=-1)
    if drop:
        ids = torch.where(torch.rand(ids.shape, device=device) < drop, -1, ids)
    routing_data, gather_indx, scatter_indx = routing_from_topk(ids, weights, n_expts)
    n_rows = n_tokens * n_expts_act
    ops = Operands(variant, ((n_tokens if variant.gather else n_rows), k), (n_expts, k, n), device,
                   w_transposed=w_k_major, scales_n_contiguous=scales_n_contiguous)
    x, w = ops.x, ops.w
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
    y = torch.full((out_rows, n_out), float("nan"), device=device).to(out_dtype)
    kwargs = dict(gather_indx=gather_indx if variant.gather else None,
                  scatter_indx=scatter_indx if variant.scatter else None, betas=betas, gammas=gammas,
                  fused_activation=act, epilogue=epi, y_acc_in=y_acc_in)
    # With k > 1 the scattered rows pass through a scratch buffer (the output dtype, bf16 for fp8) before the sum,
    # unless K is split (fp32 partials).
    scratch_dtype = out_dtype if variant.y.scaling == "none" else torch.bfloat16
    rounds_rows = variant.scatter and n_expts_act > 1 and not (split_k or 1) > 1
    ref = matmul_ogs_torch(ops.x_ref, ops.w_ref, bias, routing_data,
                           precision_config=PrecisionConfig(out_dtype=torch.float32),
                           round_y=(lambda t: t.to(scratch_dtype).float()) if rounds_rows else None, **kwargs)
    n_routed = out_rows if variant.scatter else int(routing_data.expt_hist.sum())
    with opt_flags_constraints(**({"split_k": split_k} if split_k else {})):
        result = matmul_ogs(x, w, bias, routing_data, y=y,
                            precision_config=ops.precision_config(ref[:n_routed], out_shape=y.shape), **kwargs)
    assert result.data_ptr() == y.data_ptr()
    # Rows past the routed ones (dropped gates, no scatter) are left unwritten.
    ops.check(ref[:n_routed], result[:n_routed], maxtol, rmstol,
              what=f"{variant} tokens={n_tokens} n={n} k={k} E={n_expts} k_act={n_expts_act} split={split_k}")
    return result
