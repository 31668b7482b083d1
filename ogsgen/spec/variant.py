"""A kernel variant: everything that changes the source of a generated kernel.

``canonical_name(variant)`` is the one name of a variant: the kernel function name, the file name
(``<name>.py``), the manifest key, the target of ``ogsgen build --only`` and the name a profiler
shows. It reads left to right as: family, formats, structural features, activation, epilogue, e.g.
``ogs_matmul_xbf16_wbf16_ybf16_ragged_gather_bias_act_swiglu``.

Families:

* ``matmul``: ``Y = epilogue(y_acc_in + gammas * act(out_alpha * (X @ W + betas * bias)))`` for
  dense, batched or ragged (expert-sorted, optionally gathered and scattered) rows; with ``inner``, the ragged
  axis is K instead (the expert weights' gradient): ``Y[e] = y_acc_in[e] + X[:, segment e] @ W[segment e, :]``,
  X's columns optionally gathered (``gather``: column p reads x column ``gather_indx[p] // n_expts_act``); with
  ``preact``, the matmul also stores ``out_alpha * (X @ W + betas * bias)`` (its rows, before the activation) for
  the backward;
* ``reduce``: sums partial results (split K, or the k expert outputs of each token after a scatter)
  and applies what the matmul could not: activation, gammas, epilogue.

A call may need a matmul *and* a reduce kernel; :func:`split_k_plan` and :func:`topk_plan` name
them, and catalogs include them automatically (:func:`companions`).
"""
from __future__ import annotations

from dataclasses import dataclass, fields, replace
from functools import cached_property, lru_cache

from ..errors import SpecError, SpecTypeError, UnsupportedError
from .formats import BF16, FP8_BLOCK, FP32, NumericFormat, constant_name
from .functions import FnSpecs

FAMILIES = {
    # family -> template file
    "matmul": "triton_matmul_ogs.py.jinja",
    "reduce": "triton_reduce.py.jinja",
}

# Structural features in the order they appear in canonical names.
FEATURES = ("ragged", "inner", "gather", "scatter", "bias", "betas", "gammas", "y_acc_in", "fused_comm", "preact")
_REDUCE_FEATURES = ("scatter", "gammas", "fused_comm")


@dataclass(frozen=True)
class KernelVariant:
    x: NumericFormat
    w: NumericFormat
    y: NumericFormat
    family: str = "matmul"
    ragged: bool = False
    inner: bool = False
    gather: bool = False
    scatter: bool = False
    bias: bool = False
    betas: bool = False
    gammas: bool = False
    y_acc_in: bool = False
    fused_comm: bool = False
    preact: bool = False
    activation: FnSpecs | None = None
    epilogue: FnSpecs | None = None

    def __post_init__(self):
        for fmt_name in ("x", "w", "y"):
            if not isinstance(getattr(self, fmt_name), NumericFormat):
                raise SpecError(f"KernelVariant.{fmt_name} must be a NumericFormat, got {getattr(self, fmt_name)!r}")
        if self.family not in FAMILIES:
            raise SpecError(f"KernelVariant.family must be one of {sorted(FAMILIES)}, got {self.family!r}")
        for feature in FEATURES:  # a truthy non-bool would name the variant as True does but compare unequal
            if not isinstance(getattr(self, feature), bool):
                raise SpecTypeError(f"KernelVariant.{feature} must be True or False, got {getattr(self, feature)!r}")
        for fn_kind in ("activation", "epilogue"):
            spec = getattr(self, fn_kind)
            if spec is not None and not isinstance(spec, FnSpecs):
                raise SpecError(f"KernelVariant.{fn_kind} must be an FnSpecs, got {type(spec).__name__}")
            if spec is not None and spec.is_default:
                object.__setattr__(self, fn_kind, None)
            elif spec is not None:
                spec.check_signature(fn_kind)
        if self.betas and not self.bias:
            raise SpecError("KernelVariant: betas scale the bias, so betas=True needs bias=True")
        if self.inner:
            mixed = [f for f in ("ragged", "scatter", "bias", "betas", "gammas") if getattr(self, f)]
            mixed += [kind for kind in ("activation", "epilogue") if getattr(self, kind) is not None]
            if mixed:
                raise SpecError(f"KernelVariant: inner=True (ragged K, an expert weights' gradient) computes plain "
                                f"per-expert products; it takes gather and y_acc_in, not {mixed}")
        elif (self.gather or self.scatter) and not self.ragged and self.family == "matmul":
            raise SpecError("KernelVariant: gather and scatter index expert-sorted rows, so they need ragged=True "
                            "(or inner=True, where gather reads X's columns)")
        if self.fused_comm and (self.inner or self.y_acc_in or self.y.scaling != "none" or self.epilogue
                                or (self.family == "reduce" and not self.scatter)):
            raise SpecError("KernelVariant: fused_comm writes a plain output's rows to the ranks' buffers; it takes "
                            "neither inner, y_acc_in, an epilogue nor a scaled output (and a reduce kernel's only "
                            "after a scatter)")
        if self.preact and (self.family != "matmul" or self.activation is None or self.inner or self.scatter
                            or self.fused_comm or self.y.scaling != "none"):
            raise SpecError("KernelVariant: preact stores a matmul's rows before its activation (for the backward); "
                            "it needs an activation and a plain output, and takes neither inner, scatter nor "
                            "fused_comm")
        if self.y_acc_in and self.scatter:
            raise SpecError("KernelVariant: y_acc_in accumulates into unscattered rows; it cannot be combined "
                            "with scatter")
        if self.family == "reduce":
            extra = [f for f in self.features if f not in _REDUCE_FEATURES]
            if extra:
                raise SpecError(f"KernelVariant: a reduce kernel takes only features {_REDUCE_FEATURES}, got {extra}")
            if self.w != self.x:
                raise SpecError("KernelVariant: a reduce kernel has no w; set w to x's format")

    def __hash__(self) -> int:
        # Variants key the loader's and the launch path's caches on every call: hash the fields once.
        cached = self.__dict__.get("_hash")
        if cached is None:
            cached = hash(tuple(getattr(self, f.name) for f in fields(self)))
            self.__dict__["_hash"] = cached
        return cached

    def __getstate__(self) -> dict:
        # String hashes differ between processes: a pickled variant rehashes where it is loaded.
        return {k: v for k, v in self.__dict__.items() if k != "_hash"}

    @property
    def features(self) -> tuple[str, ...]:
        return tuple(f for f in FEATURES if getattr(self, f))

    @property
    def reduction_n(self) -> int:
        return self.activation.reduction_n if self.activation else 1

    @property
    def template(self) -> str:
        return FAMILIES[self.family]

    @property
    def can_split_k(self) -> bool:
        """Whether this matmul can write split-K partials: fp32 out and nothing nonlinear after the dot."""
        return (self.family == "matmul" and self.y == FP32 and not self.scatter and not self.y_acc_in
                and not self.inner and not self.fused_comm and not self.gammas and self.activation is None
                and self.epilogue is None)

    @property
    def fp8_dot(self) -> bool:
        """Whether the dot multiplies fp8 x by fp8 w as they are (scaled after it, per tensor or per block), not
        upcast."""
        return (self.x.bits == 8 and self.w.bits == 8 and self.w.scaling in ("flexpoint", "block_f32")
                and self.x.scales_apply != "operand")

    @property
    def folds_mx_scales(self) -> bool:
        """Whether the dot multiplies e4m3 x (one scale per tensor or per row) by mxfp4 w converted to e4m3 in
        registers, each block's e8m0 scale folded into its values relative to the largest of its column's blocks in
        the K step; the rest of that scale and x's scale multiply the step's product (fp8 tensor cores for mxfp4
        weights without block-scaled MMA: docs/formats.md, "fp8 activations with mxfp4 weights")."""
        return self.w.scale_element == "e8m0" and self.w.element == "e2m1" and self.x.element == "e4m3" \
            and self.x.scales_apply == "epilogue"

    @property
    def dot_element(self) -> str:
        """The element type the dot multiplies: x's, or bf16 where x's scales apply to its values (MX activations,
        upcast to bf16 in registers: an fp8 value times a power of two is exact in bf16 within its range)."""
        return "bf16" if self.x.scales_apply == "operand" else self.x.element

    @property
    def upcasts_in_registers(self) -> bool:
        """Whether the kernel scales an operand's values in registers before the dot (MX x or w): Hopper's wgmma
        then reads a register operand, which ptxas may overwrite in flight (``ogsgen.runtime.wgmma_hazards``), so
        the kernel takes ``WAIT_MMA`` and its binaries are checked."""
        return "operand" in (self.x.scales_apply, self.w.scales_apply)

    @cached_property  # read on every matmul_ogs call
    def has_persistent_kernel(self) -> bool:
        """Whether the variant also has a persistent kernel fed by TMA (``<name>_persistent``, for Hopper and
        later): plain 16-bit x and w of one format, whose tiles go to the MMA as loaded. With a gather, that
        kernel reads x's rows by pointer loads (Hopper's TMA cannot gather rows)."""
        return (self.family == "matmul" and not self.inner and not self.fused_comm and self.x == self.w
                and self.x.bits == 16 and self.x.scaling == "none")

    @cached_property  # read on every matmul_ogs call
    def has_warp_specialized_kernel(self) -> bool:
        """Whether the variant also has a warp-specialized kernel (``<name>_warp_specialized``, Gluon, sm_90): e4m3
        x and w with 128 x 128 block scales (fp8e4m3_b128), expert-sorted rows (gathered or not), an epilogue of
        bias, activation and gammas into a 16- or 32-bit Y written in the sorted rows' order (a top-k scatter's
        rows, which the reduce sums)."""
        return (self.family == "matmul" and self.ragged and not self.inner and not self.fused_comm
                and self.x.bits == 8 and self.w.bits == 8 and self.x.block_size == 128
                and self.w.scales_apply == "k_group" and self.w.block_size == 128 and self.y.scaling == "none"
                and not self.scatter and not self.y_acc_in and not self.preact and not self.betas
                and self.epilogue is None)

    @cached_property
    def persistent_stores_y_by_tma(self) -> bool:
        """Whether the persistent kernel stores its Y tiles by TMA (a descriptor of Y): plain Y written in the
        sorted rows' order. Scattered rows and scaled outputs (flexpoint, MX) take pointer stores."""
        return self.has_persistent_kernel and not self.scatter and self.y.scaling == "none"

    def functions(self) -> dict[str, FnSpecs]:
        return {kind: spec for kind in ("activation", "epilogue") if (spec := getattr(self, kind)) is not None}

    def check_supported(self) -> None:
        """Raise UnsupportedError when the spec is valid but no template path renders it yet.

        Paths: x, w and y plain (bf16, fp16, fp32) with x == w; fp8 flexpoint w with fp8 x (an fp8
        dot) or with bf16/fp16 x (w upcast in the kernel); MX weights (mxfp4, mxfp8) with bf16/fp16
        x, dequantized in the kernel; NVFP4 weights with bf16/fp16 x, likewise (their global scale in the
        epilogue); fp8 flexpoint x with fp8 w; mxfp8 x (MX activations) with bf16, MX or fp8
        flexpoint w, every operand upcast to bf16 in the kernel; e4m3 x scaled per tensor (flexpoint) or per row
        (fp8e4m3_channel) with mxfp4 w, converted to e4m3 in the kernel (``folds_mx_scales``); fp8 flexpoint y;
        e4m3 x and w with float32 block scales of one format (fp8e4m3_b128, fp8e4m3_channel) and a plain y or one
        with block scales. Outputs with block scales along N (quantized in the epilogue): mxfp8 and fp8e4m3_b128.
        """
        name = canonical_name(self)
        for fmt_name in ("x", "y"):
            if getattr(self, fmt_name).layout != "strided":
                raise UnsupportedError(f"{name}: only w has swizzled layouts; {fmt_name} must be 'strided'")
        if self.w.layout == "hopper" and self.dot_element != "bf16" and not self.folds_mx_scales:
            raise UnsupportedError(f"{name}: hopper-layout mxfp4 weights are upcast in registers, so x must be bf16, "
                                   f"mxfp8 or e4m3 (got {self.x.name}); use strided mxfp4 weights")
        if self.w.layout == "hopper_fp8" and not self.folds_mx_scales:
            raise UnsupportedError(f"{name}: hopper_fp8-layout mxfp4 weights become e4m3 operands, so x must be e4m3 "
                                   f"with one scale per tensor or per row (got {self.x.name}); use the hopper layout "
                                   f"for bf16 or mxfp8 x")
        if self.x.scaling == "block_e8m0" and self.x.element == "e2m1":
            raise UnsupportedError(f"{name}: mx activations are mxfp8 (e4m3 or e5m2 values), not mxfp4")
        if self.y.scaling == "block_f32" and (self.y.element, self.y.block_size) != ("e4m3", FP8_BLOCK):
            raise UnsupportedError(f"{name}: an fp8 output with float32 scales is e4m3 with one scale per "
                                   f"{FP8_BLOCK} columns of a row (fp8e4m3_b128), not {self.y.name}")
        if self.family == "reduce":
            if self.x.scaling != "none":
                raise UnsupportedError(f"{name}: a reduce kernel reads plain partials")
            if self.y.scaling == "block_e8m0" and self.y.element == "e2m1":
                raise UnsupportedError(f"{name}: MX outputs are mxfp8 (e4m3 or e5m2), not mxfp4")
            return
        if self.y.scaling == "block_e8m0" and self.y.element == "e2m1":
            raise UnsupportedError(f"{name}: MX outputs are mxfp8 (e4m3 or e5m2), not mxfp4")
        if self.inner and not (self.x == self.w and self.x.scaling == "none" and self.y.scaling == "none"):
            raise UnsupportedError(f"{name}: inner (ragged-K) products take plain bf16, fp16 or fp32 x and w of one "
                                   f"format and a plain y")
        if self.folds_mx_scales:
            return
        x_upcast = self.x.scales_apply == "operand"
        if x_upcast and not (self.w == BF16 or self.w.scaling in ("block_e8m0", "flexpoint")):
            raise UnsupportedError(f"{name}: mxfp8 activations are upcast to bf16 in the kernel, so w must be bf16, "
                                   f"mx (mxfp4, mxfp8) or fp8 with a flexpoint scale, got {self.w.name}")
        if "block_f32" in (self.x.scaling, self.w.scaling):
            if self.x != self.w or self.x.element != "e4m3":
                raise UnsupportedError(f"{name}: fp8 block-scaled products take x and w of one format, e4m3 "
                                       f"(fp8e4m3_b128 or fp8e4m3_channel); matmul_ogs quantizes bf16 x to w's")
            if self.y.scaling != "none" and not self.y.has_block_scales:
                raise UnsupportedError(f"{name}: fp8 block-scaled products write a plain output (bf16, fp16, fp32) "
                                       f"or one with block scales (fp8e4m3_b128, mxfp8), not {self.y.name}")
            return
        x_plain = self.x.scaling == "none"
        # (weights upcast in registers take 16-bit x; MX weights have more pairings, checked below)
        w_upcast = self.w.scales_apply == "operand"
        if w_upcast and self.w.scale_element != "e8m0" and not (x_plain and self.x.bits == 16):
            raise UnsupportedError(f"{name}: {self.w.name} weights are upcast to x's bf16 or fp16 in the kernel, so x "
                                   f"must be bf16 or fp16, not {self.x.name}")
        if self.w.scaling == "block_e8m0" and not (x_upcast or (x_plain and self.x.bits == 16)):
            raise UnsupportedError(f"{name}: MX weights need bf16, fp16 or mxfp8 x (dequantized in the kernel), or "
                                   f"e4m3 x scaled per tensor or per row with mxfp4 weights; not {self.x.name} x "
                                   f"with {self.w.name} weights")
        if self.w.scaling == "flexpoint" and not (self.x.bits == 8 or (x_plain and self.x.bits == 16)):
            raise UnsupportedError(f"{name}: fp8 weights need fp8, bf16 or fp16 x")
        if self.x.scaling == "flexpoint" and self.w.scaling != "flexpoint":
            raise UnsupportedError(f"{name}: fp8 x needs fp8 weights")
        if x_plain and self.w.scaling == "none" and self.x != self.w:
            raise UnsupportedError(f"{name}: x ({self.x.name}) and w ({self.w.name}) must share a format; cast one "
                                   f"operand to the other's dtype")

    def as_code(self) -> str:
        """The expression that builds this variant in a catalog file, e.g. ``KernelVariant(BF16, BF16, BF16,
        ragged=True, activation=ogsgen.swiglu)``."""
        args = [constant_name(fmt) for fmt in (self.x, self.w, self.y)]
        if self.family != "matmul":
            args.append(f"family={self.family!r}")
        args += [f"{feature}=True" for feature in self.features]
        args += [f"{kind}={spec.python_name}" for kind, spec in self.functions().items()]
        return f"KernelVariant({', '.join(args)})"

    def describe(self) -> dict:
        """Normalized, JSON-ready spec (manifest entry)."""
        return {
            "family": self.family,
            "x": self.x.describe(), "w": self.w.describe(), "y": self.y.describe(),
            "features": list(self.features),
            "activation": self.activation.describe() if self.activation else None,
            "epilogue": self.epilogue.describe() if self.epilogue else None,
        }


def canonical_name(variant: KernelVariant) -> str:
    if not isinstance(variant, KernelVariant):
        raise SpecTypeError(f"canonical_name takes a KernelVariant, got {type(variant).__name__}")
    parts = ["ogs", variant.family, f"x{variant.x.name}"]
    if variant.family != "reduce":
        parts.append(f"w{variant.w.name}")
    parts += [f"y{variant.y.name}", *variant.features]
    if variant.activation:
        parts += ["act", variant.activation.name]
    if variant.epilogue:
        parts += ["epi", variant.epilogue.name]
    return "_".join(parts)


@lru_cache(maxsize=None)
def split_k_plan(variant: KernelVariant) -> tuple[KernelVariant, KernelVariant]:
    """(partials matmul, reduce) computing ``variant`` with K split: fp32 partials of the linear part
    (dot, bias, betas, out_alpha), then the sum, activation, gammas and epilogue."""
    partials = replace(variant, y=FP32, gammas=False, activation=None, epilogue=None)
    reduce = KernelVariant(FP32, FP32, variant.y, family="reduce", gammas=variant.gammas,
                           activation=variant.activation, epilogue=variant.epilogue)
    return partials, reduce


@lru_cache(maxsize=None)
def topk_plan(variant: KernelVariant) -> tuple[KernelVariant, KernelVariant]:
    """(matmul, reduce) computing a scatter with k > 1 experts per token (or any k with fused communication, which
    the reduce does, so that every token's row reaches the ranks): the matmul writes its rows in their
    expert-sorted order to a scratch buffer in the output dtype (bf16 for an fp8 output); the reduce gathers
    each token's k rows from it, weights each by its gamma, sums them and applies the epilogue and the output's
    scaling once. (Row indices and gammas in the matmul's epilogue cost about a tenth of its time at large
    batches, measured on the H200: per-row loads in the transposed MMA layout. The reduce reads them per row.)"""
    scratch = variant.y if variant.y.scaling == "none" else BF16
    matmul = replace(variant, y=scratch, scatter=False, gammas=False, epilogue=None, fused_comm=False)
    reduce = KernelVariant(scratch, scratch, variant.y, family="reduce", scatter=True, gammas=variant.gammas,
                           epilogue=variant.epilogue, fused_comm=variant.fused_comm)
    return matmul, reduce


@lru_cache(maxsize=None)
def topk_split_k_plan(variant: KernelVariant) -> tuple[KernelVariant, KernelVariant]:
    """(partials matmul, reduce) computing a scatter with k > 1 experts per token and K split: the top-k matmul's
    fp32 split-K partials, then one reduce that sums each token's k rows over the splits. The k-row combine
    is a launch of its own anyway, so the split costs no extra launch. Only without an activation, which would
    have to come between the two sums."""
    if variant.activation is not None:
        raise SpecError(f"{canonical_name(variant)}: a top-k scatter with an activation cannot split K")
    partials, _ = split_k_plan(topk_plan(variant)[0])
    reduce = KernelVariant(FP32, FP32, variant.y, family="reduce", scatter=True, gammas=variant.gammas,
                           epilogue=variant.epilogue)
    return partials, reduce


def companions(variant: KernelVariant) -> list[KernelVariant]:
    """The other variants a call of ``variant`` may launch (split K, top-k combine)."""
    if variant.family != "matmul" or variant.inner or (variant.fused_comm and not variant.scatter):
        return []
    if variant.scatter and variant.fused_comm:  # its rows reach the ranks through the top-k reduce, unsplit
        return list(topk_plan(variant))
    if variant.scatter:
        return list(topk_plan(variant)) + (list(topk_split_k_plan(variant)) if variant.activation is None else [])
    if variant.y_acc_in or variant.preact:  # (never split: the runtime keeps their K whole)
        return []
    return list(split_k_plan(variant))
