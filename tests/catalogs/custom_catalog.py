"""A user catalog used by the tests: a custom activation that calls a helper, and a custom epilogue
that reads a per-column tensor."""
import torch
import triton
import triton.language as tl

import ogsgen
from ogsgen.spec import BF16, FP16, FP32, variant_product


def leaky_gelu_torch(tile, slope, scale):
    return torch.where(tile > 0, tile, slope * tile) * scale


@triton.jit
def _leaky(tile, slope):
    return tl.where(tile > 0, tile, slope * tile)


@ogsgen.register_activation(arg_names=("slope", "scale"), do_not_specialize=("scale",), reference=leaky_gelu_torch)
@triton.jit
def leaky_scaled(tile, slope, scale):
    return _leaky(tile, slope) * scale


def column_scale_torch(tile, rows, cols, col_scale):
    return tile * col_scale[cols].float()[None, :]


@ogsgen.register_epilogue(arg_names=("ColScale",), reference=column_scale_torch)
@triton.jit
def column_scale(tile, offs_m, offs_n, mask, ColScale):
    # The 2-D mask bounds the per-column load: the pointer row broadcasts over the tile's rows.
    return tile * tl.load(ColScale + offs_n[None, :], mask=mask, other=1.0)


VARIANTS = [
    *variant_product([(BF16, BF16, BF16), (FP32, FP32, FP32)], activations=(leaky_scaled,), bias=(True,),
                     betas=(False, True)),
    *variant_product([(FP16, FP16, FP16), (BF16, BF16, FP32)], epilogues=(column_scale,), gammas=(False, True)),
    *variant_product([(BF16, BF16, BF16)], activations=(leaky_scaled, ogsgen.swiglu), epilogues=(column_scale,),
                     bias=(True,), betas=(True,), gammas=(True,)),
    # Mixture of experts: the epilogue runs in the matmul, or in the top-k reduce after a scatter.
    *variant_product([(BF16, BF16, BF16)], activations=(None, leaky_scaled), epilogues=(column_scale,),
                     ragged=(True,), gather=(False, True), scatter=(False, True), gammas=(True,)),
]
