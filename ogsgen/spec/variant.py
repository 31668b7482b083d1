"""A kernel variant: everything that changes the source of a generated kernel.

``canonical_name(variant)`` is the one name of a variant: the kernel function name, the file
name (``<name>.py``), the manifest key, the target of ``ogsgen build --only`` and the name a
profiler shows. It reads left to right as: family, x/w/y formats, structural features,
activation, epilogue, e.g. ``ogs_matmul_xbf16_wbf16_ybf16_bias_act_swiglu``.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..errors import SpecError, UnsupportedError
from .formats import NumericFormat
from .functions import FnSpecs

FAMILIES = {
    # family -> template file
    "matmul": "triton_matmul_ogs.py.jinja",
}

# Structural features in the order they appear in canonical names.
FEATURES = ("bias", "betas", "gammas", "gather", "scatter", "ragged")
# Features of the spec whose code paths arrive with the mixture-of-experts work.
_NOT_YET = ("gather", "scatter", "ragged")


@dataclass(frozen=True)
class KernelVariant:
    x: NumericFormat
    w: NumericFormat
    y: NumericFormat
    family: str = "matmul"
    bias: bool = False
    betas: bool = False
    gammas: bool = False
    gather: bool = False
    scatter: bool = False
    ragged: bool = False
    activation: FnSpecs | None = None
    epilogue: FnSpecs | None = None

    def __post_init__(self):
        for fmt_name in ("x", "w", "y"):
            if not isinstance(getattr(self, fmt_name), NumericFormat):
                raise SpecError(f"KernelVariant.{fmt_name} must be a NumericFormat, got {getattr(self, fmt_name)!r}")
        if self.family not in FAMILIES:
            raise SpecError(f"KernelVariant.family must be one of {sorted(FAMILIES)}, got {self.family!r}")
        for fn_kind in ("activation", "epilogue"):
            spec = getattr(self, fn_kind)
            if spec is not None and spec.is_default:
                object.__setattr__(self, fn_kind, None)
            elif spec is not None:
                if not isinstance(spec, FnSpecs):
                    raise SpecError(f"KernelVariant.{fn_kind} must be an FnSpecs, got {type(spec).__name__}")
                spec.check_signature(fn_kind)
        if self.betas and not self.bias:
            raise SpecError("KernelVariant: betas scale the bias, so betas=True needs bias=True")

    @property
    def features(self) -> tuple[str, ...]:
        return tuple(f for f in FEATURES if getattr(self, f))

    @property
    def reduction_n(self) -> int:
        return self.activation.reduction_n if self.activation else 1

    @property
    def template(self) -> str:
        return FAMILIES[self.family]

    def functions(self) -> dict[str, FnSpecs]:
        return {kind: spec for kind in ("activation", "epilogue") if (spec := getattr(self, kind)) is not None}

    def check_supported(self) -> None:
        """Raise UnsupportedError when the spec is valid but no template path renders it yet."""
        missing = [f for f in _NOT_YET if getattr(self, f)]
        if missing:
            raise UnsupportedError(f"{canonical_name(self)}: features {missing} have no code path yet "
                                   f"(they arrive with the mixture-of-experts kernels)")
        for fmt_name in ("x", "w", "y"):
            fmt = getattr(self, fmt_name)
            if fmt.scaling != "none":
                raise UnsupportedError(f"{canonical_name(self)}: {fmt_name} format {fmt.name} has no code path yet; "
                                       f"supported now: bf16, fp16, fp32")
        if self.x != self.w:
            raise UnsupportedError(f"{canonical_name(self)}: x ({self.x.name}) and w ({self.w.name}) must share a "
                                   f"format; cast one operand to the other's dtype")

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
    parts = ["ogs", variant.family, f"x{variant.x.name}", f"w{variant.w.name}", f"y{variant.y.name}"]
    parts += variant.features
    if variant.activation:
        parts += ["act", variant.activation.name]
    if variant.epilogue:
        parts += ["epi", variant.epilogue.name]
    return "_".join(parts)
