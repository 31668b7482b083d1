"""Render one kernel variant to Triton source."""
from __future__ import annotations

import ast
import hashlib
import threading
from dataclasses import dataclass
from functools import lru_cache

import jinja2
import jinja2.meta

from .._resources import data_dir
from .._version import __version__
from ..numerics import jit
from ..numerics.codecs import codec_of
from ..spec.formats import ELEMENTS, FP8_ELEMENTS
from ..spec.functions import function_source_hash
from ..spec.kernel_abi import ARG_PREFIX, RAGGED_ROWS_BOUND, kernel_of, parameters, per_call_names, signature_lines
from ..spec.variant import KernelVariant, canonical_name

# CPython 3.11's ast module keeps its recursion counter per interpreter, so parses in two threads at once
# fail with "AST constructor recursion depth mismatch" (python/cpython#106905); builds in threads serialize here.
_PARSE_LOCK = threading.Lock()

_TL_DTYPE = {name: e.tl_dtype for name, e in ELEMENTS.items()}
_MAX_FINITE = {name: repr(ELEMENTS[name].max_finite) for name in FP8_ELEMENTS}  # saturating fp8 outputs

def pyliteral(value, indent: int = 0) -> str:
    """A Python literal for nested dicts/lists of scalars, with stable key order and 4-space indents."""
    pad, inner = " " * indent, " " * (indent + 4)
    if isinstance(value, dict) and value:
        items = [f"{inner}{k!r}: {pyliteral(value[k], indent + 4)}," for k in sorted(value)]
        return "{\n" + "\n".join(items) + f"\n{pad}}}"
    if isinstance(value, (list, tuple)) and value:
        return "[" + ", ".join(pyliteral(v, indent) for v in value) + "]"
    return repr(value)


@lru_cache(maxsize=None)
def environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(data_dir("templates"))),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        autoescape=False,
    )
    env.filters["pyliteral"] = pyliteral
    return env


def _template_closure(name: str) -> set[str]:
    """A template and every template it imports or includes, transitively."""
    env, todo, seen = environment(), [name], set()
    while todo:
        current = todo.pop()
        if current in seen:
            continue
        seen.add(current)
        source = env.loader.get_source(env, current)[0]
        todo.extend(t for t in jinja2.meta.find_referenced_templates(env.parse(source)) if t)
    return seen


@lru_cache(maxsize=None)
def template_sha256(name: str) -> str:
    env, digest = environment(), hashlib.sha256()
    for template in sorted(_template_closure(name)):
        digest.update(f"{template}\0{env.loader.get_source(env, template)[0]}\0".encode())
    return digest.hexdigest()


def helpers_used(variant: KernelVariant) -> dict:
    """The @triton.jit helpers a variant's kernel imports (``ogsgen.numerics``), by name."""
    helpers = {}
    if variant.folds_mx_scales:  # (they call the upcasts)
        helpers.update(mxfp4_fold_reference=jit.mxfp4_fold_reference, dot_mxfp4_folded=jit.dot_mxfp4_folded,
                       unfold_mxfp4_scales=jit.unfold_mxfp4_scales, dot_mxfp4_blocks=jit.dot_mxfp4_blocks)
    elif variant.w.layout == "hopper":
        helpers["upcast_mxfp4_hopper_words"] = jit.upcast_mxfp4_hopper_words
    for reader in (_reader(variant, "x"), _reader(variant, "w")):
        if reader is not None:
            helpers[reader.__name__] = reader
    if variant.upcasts_in_registers:
        helpers["request_wgmma_waits"] = jit.request_wgmma_waits
    if variant.y.has_block_scales:
        writer = codec_of(variant.y).writer
        helpers[writer.__name__] = writer
    return helpers


def _reader(variant: KernelVariant, operand: str):
    """The in-kernel reader of an operand whose scales apply to its strided values (its codec's), or None."""
    fmt = getattr(variant, operand)
    if fmt.scales_apply != "operand" or fmt.layout != "strided" or (operand == "w" and variant.folds_mx_scales):
        return None
    return codec_of(fmt).reader


def _y_writer_call(variant: KernelVariant) -> str | None:
    """The call that quantizes the output tile ``acc`` under ``mask`` for an output with block scales, or None."""
    if not variant.y.has_block_scales:
        return None
    codec = codec_of(variant.y)
    return f"{codec.writer.__name__}({', '.join(('tl.where(mask, acc, 0.0)', *codec.writer_args(variant.y)))})"


def _helper_imports(helpers: dict) -> list[tuple[str, list[str]]]:
    """(module, names) of the helpers, one import per module."""
    modules = {}
    for name, fn in sorted(helpers.items()):
        modules.setdefault(fn.fn.__module__, []).append(name)  # (the Python function's: jit and interpreted alike)
    return sorted(modules.items())


def expected_provenance(variant: KernelVariant) -> dict:
    """What a current build of ``variant`` records about its inputs (checked by the loader)."""
    return {
        "template": variant.template,
        "template_sha256": template_sha256(variant.template),
        "functions": {kind: spec.source_hash for kind, spec in variant.functions().items()},
        "helpers": {name: function_source_hash(fn) for name, fn in helpers_used(variant).items()},
    }


@dataclass(frozen=True)
class RenderedKernel:
    name: str
    variant: KernelVariant
    source: str
    provenance: dict

    @property
    def filename(self) -> str:
        return f"{self.name}.py"

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.source.encode()).hexdigest()

    def manifest_entry(self) -> dict:
        return {"path": self.filename, "sha256": self.sha256, "spec": self.variant.describe(), **self.provenance}


def render_variant(variant: KernelVariant, catalog_name: str) -> RenderedKernel:
    variant.check_supported()
    name = canonical_name(variant)
    provenance = {"ogsgen_version": __version__, "catalog": catalog_name, "variant": name,
                  **expected_provenance(variant)}
    fn_args = {kind: [ARG_PREFIX[kind] + a for a in spec.fn_arg_names] for kind, spec in variant.functions().items()}
    source = environment().get_template(variant.template).render(
        variant=variant,
        name=name,
        provenance=provenance,
        act_args=fn_args.get("activation", []),
        epi_args=fn_args.get("epilogue", []),
        signature=signature_lines(variant, kernel_of(variant)),
        do_not_specialize=per_call_names(variant, kernel_of(variant)),
        persistent_signature=signature_lines(variant, "persistent") if variant.has_persistent_kernel else [],
        persistent_do_not_specialize=per_call_names(variant, "persistent") if variant.has_persistent_kernel else [],
        ws_signature=signature_lines(variant, "warp_specialized") if variant.has_warp_specialized_kernel else [],
        ws_arg_names=[p.name for p in parameters(variant, "warp_specialized")]
        if variant.has_warp_specialized_kernel else [],
        ws_do_not_specialize=per_call_names(variant, "warp_specialized") if variant.has_warp_specialized_kernel else [],
        dot_tl_dtype=_TL_DTYPE[variant.dot_element],
        y_tl_dtype=_TL_DTYPE[variant.y.element],
        y_max_finite=_MAX_FINITE.get(variant.y.element, ""),
        fp8_dot=variant.fp8_dot,
        helper_imports=_helper_imports(helpers_used(variant)),
        x_reader=getattr(_reader(variant, "x"), "__name__", None),
        w_reader=getattr(_reader(variant, "w"), "__name__", None),
        y_writer=_y_writer_call(variant),
        ragged_rows_bound=hex(RAGGED_ROWS_BOUND),
    )
    with _PARSE_LOCK:
        ast.parse(source, filename=f"{name}.py")  # a template bug must fail here, not at import time
    return RenderedKernel(name, variant, source, provenance)
