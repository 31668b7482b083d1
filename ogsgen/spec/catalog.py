"""Catalogs: the lists of kernel variants that ``ogsgen build`` renders.

The embedded default catalog holds the variants real users need. A user catalog is a Python
file that registers its own functions and defines ``VARIANTS``, an iterable of
:class:`KernelVariant`::

    # my_kernels.py
    import triton, triton.language as tl
    import ogsgen
    from ogsgen.spec import BF16, KernelVariant

    @ogsgen.register_activation(arg_names=("beta",))
    @triton.jit
    def scaled_relu(tile, beta):
        return tl.maximum(tile, 0.0) * beta

    VARIANTS = [KernelVariant(BF16, BF16, BF16, bias=True, activation=scaled_relu)]

Build it with ``ogsgen build --spec my_kernels.py --out my_build``.
"""
from __future__ import annotations

import importlib.util
import itertools
import os
import sys
from dataclasses import dataclass, replace
from pathlib import Path

from ..errors import CatalogError, OgsgenError, SpecTypeError
from .builtins import silu_and_mul, swiglu
from .formats import (BF16, FP8_E4M3, FP8_E4M3_B128, FP8_E4M3_CHANNEL, FP16, FP32, MXFP4, MXFP4_HOPPER, MXFP4_HOPPER_FP8,
                      MXFP8_E4M3, NVFP4)
from .variant import FEATURES, KernelVariant, canonical_name, companions

DEFAULT_CATALOG_NAME = "ogsgen:default"
# Activations whose default-catalog variants have training twins (preact: the forward also stores the rows before
# the activation, where the backward takes its gradient); ogsgen.ops.gradients saves them for these only.
PREACT_ACTIVATIONS = ("swiglu", "silu_and_mul")
USER_CATALOG_PACKAGE = "ogsgen.user_catalogs"  # a catalog file imports as <this>.<file stem>; only a name prefix


@dataclass(frozen=True)
class Catalog:
    name: str
    variants: tuple[KernelVariant, ...]

    def __post_init__(self):
        self.by_name()  # two variants of one name would share one file: refused now, not at build time

    def by_name(self) -> dict[str, KernelVariant]:
        variants = {}
        for variant in self.variants:
            other = variants.setdefault(canonical_name(variant), variant)
            if other != variant:
                raise CatalogError(
                    f"catalog {self.name}: {other.as_code()} and {variant.as_code()} have one canonical name, "
                    f"{canonical_name(variant)} (a function name with '_epi_' in it reads as an activation and an "
                    f"epilogue); rename one of their functions (register_activation(name=...))")
        return variants


def variant_product(formats, activations=(None,), epilogues=(None,), family="matmul", **feature_choices):
    """Every combination of (x, w, y) formats, activations, epilogues and feature values.

    ``feature_choices`` maps a feature name to the values to combine, e.g. ``bias=(False, True)``.
    Combinations the spec rejects (betas without bias) are skipped.
    """
    unknown = set(feature_choices) - set(FEATURES)
    if unknown:
        raise CatalogError(f"variant_product: unknown features {sorted(unknown)}; known: {FEATURES}")
    try:
        formats = list(formats)
    except TypeError:
        raise SpecTypeError(f"variant_product: formats must be a list of (x, w, y) format triples, got "
                            f"{type(formats).__name__}") from None
    for i, triple in enumerate(formats):
        if not (isinstance(triple, (tuple, list)) and len(triple) == 3):
            got = (f"a {type(triple).__name__} of {len(triple)}" if isinstance(triple, (tuple, list))
                   else type(triple).__name__)
            raise SpecTypeError(f"variant_product: formats[{i}] must be an (x, w, y) triple of NumericFormat, e.g. "
                                f"(BF16, BF16, BF16), got {got}")
    names = sorted(feature_choices)
    variants = []
    for (x, w, y), act, epi, values in itertools.product(
            formats, activations, epilogues, itertools.product(*(feature_choices[n] for n in names))):
        features = dict(zip(names, values))
        if features.get("betas") and not features.get("bias"):
            continue
        variants.append(KernelVariant(x, w, y, family=family, activation=act, epilogue=epi, **features))
    return variants


_BLOCK_F32 = [(FP8_E4M3_B128, FP8_E4M3_B128, BF16), (FP8_E4M3_CHANNEL, FP8_E4M3_CHANNEL, BF16)]
_E4M3_X_MXFP4_W = [(x, w, BF16) for x in (FP8_E4M3, FP8_E4M3_CHANNEL) for w in (MXFP4, MXFP4_HOPPER, MXFP4_HOPPER_FP8)]


def default_catalog() -> Catalog:
    """Dense and batched matmuls (the router too), the MoE shapes of gpt-oss, DeepSeek, Qwen, Mixtral, and the ragged-K
    products of their weight gradients."""
    dense_formats = [(BF16, BF16, BF16), (FP16, FP16, FP16), (FP32, FP32, FP32),
                     (BF16, BF16, FP32), (FP16, FP16, FP32)]
    moe_formats = [(BF16, BF16, BF16), (FP16, FP16, FP16)]
    variants = [
        *variant_product(dense_formats, activations=(None, swiglu), bias=(False, True), gammas=(False, True)),
        # First MoE matmul: gather tokens to experts, fused SwiGLU (gpt-oss, with bias) or SiLU-and-mul (DeepSeek,
        # Qwen, Mixtral: no bias), as the dense MLPs of those models.
        *variant_product(moe_formats, activations=(None, swiglu), ragged=(True,), gather=(True,),
                         bias=(False, True)),
        *variant_product(moe_formats, activations=(silu_and_mul,), ragged=(True,), gather=(True,)),
        *variant_product(moe_formats, activations=(silu_and_mul,)),
        # Second MoE matmul: scatter back, weighted by the router's gammas, summed over the top-k.
        *variant_product(moe_formats, ragged=(True,), scatter=(True,), bias=(False, True), gammas=(False, True)),
        # Rows already sorted by expert (no gather/scatter).
        *variant_product(moe_formats, activations=(None, swiglu), ragged=(True,), bias=(False, True),
                         gammas=(False, True)),
        # Fused communication of the output rows to other GPUs' buffers (FusedComm): dense rows (tensor parallelism)
        # and expert-sorted rows, optionally gathered and weighted (expert parallelism's combine, each row sent to
        # its token's rank).
        *variant_product(moe_formats, bias=(False, True), fused_comm=(True,)),
        *variant_product(moe_formats, ragged=(True,), gather=(False, True), gammas=(False, True), fused_comm=(True,)),
        # ... and the second MoE matmul's token rows, summed over the top-k, each rank's partial in its slot: such a
        # call is the plain ragged matmul and a top-k reduce that sends (the only kernel of its own)
        *[KernelVariant(fmt, fmt, fmt, family="reduce", scatter=True, gammas=gammas, fused_comm=True)
          for (fmt, _, _), gammas in itertools.product(moe_formats, (False, True))],
        # Ragged K, the expert weights' gradient in training (dW[e] = X[seg e]^T @ dY[seg e]): X sorted, or the first
        # MoE matmul's tokens read through its gather; fp32 gradients accumulated in place with y_acc_in.
        *variant_product([*moe_formats, (BF16, BF16, FP32), (FP16, FP16, FP32), (FP32, FP32, FP32)], inner=(True,),
                         gather=(False, True)),
        *variant_product([(BF16, BF16, FP32), (FP16, FP16, FP32), (FP32, FP32, FP32)], inner=(True,),
                         gather=(False, True), y_acc_in=(True,)),
        # gpt-oss ships mxfp4 expert weights (bf16 activations); fp8 weights with per-tensor or per-expert
        # scales, with fp8 or bf16 activations (DeepSeek-style and weight-only serving).
        # mxfp4 in both value layouts: strided (any GPU) and hopper (what prepare_expert_weights makes on Hopper).
        # NVFP4: ModelOpt's FP4 checkpoints (DeepSeek-R1-FP4, Qwen3 FP4), bf16 activations.
        # The fp8 checkpoints most MoE models ship: DeepSeek-style 128 x 128 block scales and per-channel scales,
        # with activations quantized to match at the call.
        *variant_product([(BF16, MXFP4, BF16), (BF16, MXFP4_HOPPER, BF16), (BF16, NVFP4, BF16),
                          (BF16, FP8_E4M3, BF16), (FP8_E4M3, FP8_E4M3, BF16), *_BLOCK_F32],
                         activations=(None, swiglu), ragged=(True,), gather=(True,), bias=(False, True)),
        *variant_product([(BF16, MXFP4, BF16), (BF16, MXFP4_HOPPER, BF16), (BF16, NVFP4, BF16),
                          (BF16, FP8_E4M3, BF16), (FP8_E4M3, FP8_E4M3, BF16), *_BLOCK_F32],
                         ragged=(True,), scatter=(True,), bias=(False, True), gammas=(True,)),
        # ... and with SiLU-and-mul, the activation of the models that ship those checkpoints.
        *variant_product([(BF16, NVFP4, BF16), (BF16, FP8_E4M3, BF16), (FP8_E4M3, FP8_E4M3, BF16), *_BLOCK_F32],
                         activations=(silu_and_mul,), ragged=(True,), gather=(True,)),
        # DeepSeek-style fp8 MLPs with no bf16 intermediate: w1 writes its activation's output (or its rows, for an
        # activation applied apart) as e4m3 with a scale per row and 128 columns, the activations w2 takes.
        *variant_product([(FP8_E4M3_B128, FP8_E4M3_B128, FP8_E4M3_B128)], activations=(None, swiglu), ragged=(True,),
                         gather=(True,), bias=(False, True)),
        *variant_product([(FP8_E4M3_B128, FP8_E4M3_B128, FP8_E4M3_B128)], activations=(silu_and_mul,), ragged=(True,),
                         gather=(True,)),
        *variant_product([(BF16, MXFP4, BF16), (BF16, MXFP4_HOPPER, BF16), (BF16, NVFP4, BF16),
                          (BF16, MXFP8_E4M3, BF16), (BF16, FP8_E4M3, BF16),
                          (FP8_E4M3, FP8_E4M3, BF16), (FP8_E4M3, FP8_E4M3, FP8_E4M3), *_BLOCK_F32],
                         bias=(False, True)),
        # MX activations (mxfp8 x, upcast to bf16 in the kernel): gpt-oss's MLP with mxfp4 weights and no bf16
        # intermediate (w1 writes its SwiGLU output as mxfp8, w2 reads it), and dense calls with every weight
        # format they take.
        *variant_product([(MXFP8_E4M3, w, y) for w in (MXFP4, MXFP4_HOPPER) for y in (BF16, MXFP8_E4M3)],
                         activations=(swiglu,), ragged=(True,), gather=(True,), bias=(False, True)),
        *variant_product([(MXFP8_E4M3, MXFP4, BF16), (MXFP8_E4M3, MXFP4_HOPPER, BF16)],
                         ragged=(True,), gather=(True,), bias=(False, True)),  # (w1 with its activation apart)
        *variant_product([(MXFP8_E4M3, MXFP4, BF16), (MXFP8_E4M3, MXFP4_HOPPER, BF16)],
                         ragged=(True,), scatter=(True,), bias=(False, True), gammas=(True,)),
        *variant_product([(MXFP8_E4M3, w, BF16) for w in (BF16, MXFP4, MXFP4_HOPPER, MXFP8_E4M3, FP8_E4M3)],
                         bias=(False, True)),
        # fp8 activations with mxfp4 weights (fp8 tensor cores, the weights converted to e4m3 in the kernel): e4m3 x
        # with a static scale per tensor or a dynamic one per row, gpt-oss's two MoE matmuls and dense calls, in
        # every value layout (hopper_fp8: the one for this x on Hopper).
        *variant_product(_E4M3_X_MXFP4_W, activations=(None, swiglu), ragged=(True,), gather=(True,),
                         bias=(False, True)),
        *variant_product(_E4M3_X_MXFP4_W, ragged=(True,), scatter=(True,), bias=(False, True), gammas=(True,)),
        *variant_product(_E4M3_X_MXFP4_W, bias=(False, True)),
    ]
    # Training: each differentiable variant of those activations (plain operands, rows not scattered nor sent) has a
    # twin whose forward also stores the rows before the activation, for the backward.
    variants += [replace(v, preact=True) for v in variants
                 if v.activation is not None and v.activation.name in PREACT_ACTIVATIONS and v.x == v.w
                 and v.x.scaling == "none" and v.y.scaling == "none" and not v.scatter and not v.fused_comm]
    return Catalog(DEFAULT_CATALOG_NAME, _expand(variants, DEFAULT_CATALOG_NAME))


def _expand(variants, source) -> tuple[KernelVariant, ...]:
    """The variants and, transitively, their companions (split-K and top-k reduce kernels: a top-k scatter's
    matmul is a variant of its own, which may split K), sorted by name, once each."""
    seen = {}  # (a dict: in their order, so that Catalog's error names two variants of one name in this order)
    for i, variant in enumerate(variants):
        if not isinstance(variant, KernelVariant):
            raise CatalogError(f"{source}: VARIANTS[{i}] is {_a(type(variant).__name__)}, not a KernelVariant")
        pending = [variant]
        while pending:
            needed = pending.pop()
            if needed not in seen:
                seen[needed] = None
                pending += companions(needed)
    return tuple(sorted(seen, key=canonical_name))


def load_catalog_file(path: str | os.PathLike) -> Catalog:
    """Import a user catalog file and return the variants it declares."""
    path = Path(path)
    if not path.is_file():
        raise CatalogError(f"--spec {path}: no such file; give the path of a Python file that defines VARIANTS")
    if path.suffix != ".py":
        raise CatalogError(f"--spec {path}: a catalog is a Python file (*.py) that defines VARIANTS")
    # In ogsgen's namespace, so that a catalog named json.py cannot replace sys.modules["json"]; free of folders and
    # random parts, as generated files record it (a function's origin is module:name).
    module_name = f"{USER_CATALOG_PACKAGE}.{path.stem}"
    existing = sys.modules.get(module_name)
    if existing is not None and Path(getattr(existing, "__file__", "") or "").resolve() == path.resolve():
        module = existing
    else:
        spec = importlib.util.spec_from_file_location(module_name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module
        try:
            spec.loader.exec_module(module)
        except OgsgenError as exc:
            sys.modules.pop(module_name, None)
            raise CatalogError(f"--spec {path}: {exc}") from exc
        except Exception as exc:
            sys.modules.pop(module_name, None)
            raise CatalogError(f"--spec {path}: importing the catalog failed with "
                               f"{type(exc).__name__}: {exc}") from exc
    variants = getattr(module, "VARIANTS", None)
    if variants is None:
        raise CatalogError(f"--spec {path}: the file defines no VARIANTS; add VARIANTS = [KernelVariant(...), ...]")
    try:
        if isinstance(variants, (str, bytes)):  # iterable, but of characters
            raise TypeError
        variants = list(variants)
    except TypeError:
        raise CatalogError(f"--spec {path}: VARIANTS must be a list of KernelVariant, "
                           f"got {_a(type(variants).__name__)}") from None
    if not variants:
        raise CatalogError(f"--spec {path}: VARIANTS is empty, so there is nothing to build; add the variants your "
                           f"calls need, e.g. VARIANTS = [KernelVariant(BF16, BF16, BF16, bias=True)]")
    return Catalog(path.name, _expand(variants, f"--spec {path}"))


def _a(noun: str) -> str:
    """``noun`` with its indefinite article: "a list", "an int"."""
    return f"{'an' if noun[:1].lower() in 'aeiou' else 'a'} {noun}"
