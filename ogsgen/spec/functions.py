"""Triton functions that generated kernels call: fused activations and epilogues.

A function reaches a kernel as a *closure argument*: the generated kernel has a constexpr
parameter (``ACTIVATION_FN`` / ``EPILOGUE_FN``) and the runtime passes the registered
``@triton.jit`` function there at launch. The generated file records the function's name and
source hash; the loader refuses a file whose recorded hash differs from the function it is
given today.

Calling conventions (the leading parameters are fixed, the rest are ``fn_arg_names``):

* activation: ``fn(tile, *args) -> tile`` where ``tile`` is the fp32 accumulator tile
  ``(BLOCK_M, BLOCK_N)`` and the result has ``BLOCK_N // reduction_n`` columns;
* epilogue: ``fn(tile, offs_m, offs_n, mask, *args) -> tile``, applied last, on fp32 values,
  just before the cast to the output dtype.
"""
from __future__ import annotations

import ast
import hashlib
import inspect
import keyword
import textwrap
import threading
from dataclasses import dataclass, field
from typing import Callable

import triton
from triton.runtime.interpreter import InterpretedFunction
from triton.runtime.jit import JITFunction

from ..errors import SpecError, SpecTypeError

LEADING_PARAMS = {
    "activation": ("tile",),
    "epilogue": ("tile", "offs_m", "offs_n", "mask"),
}


def check_identifier(value, what: str) -> str:
    """Everything that reaches generated source must be a plain Python identifier, and an ASCII one: Python reads a
    non-ASCII identifier in source as its NFKC form ('ﬁ' as 'fi'), so the generated module would not define the
    name the runtime looks up."""
    if not isinstance(value, str) or not value.isascii() or not value.isidentifier() or keyword.iskeyword(value):
        raise SpecError(f"{what} must be a valid Python identifier of ASCII letters, digits and '_', got {value!r}")
    return value


# --------------------------------------------------------------------------------------------
# Content hashing: a function is identified by its source and by the sources of the Triton
# functions it calls, never by its name. Triton's own library functions are excluded so that a
# hash is the same under every Triton release.
# --------------------------------------------------------------------------------------------

def _is_jit_function(obj) -> bool:
    # Under TRITON_INTERPRET=1, @triton.jit makes an InterpretedFunction instead of a JITFunction.
    return isinstance(obj, (JITFunction, InterpretedFunction))


def _plain_source(jit_fn) -> str:
    try:
        src = textwrap.dedent(inspect.getsource(jit_fn.fn))
    except (OSError, TypeError) as exc:
        raise SpecError(f"the source of {getattr(jit_fn, '__name__', jit_fn)!r} cannot be read ({exc}); ogsgen "
                        f"identifies and renders functions by their source: define it in a .py file, not in an "
                        f"interactive session or through exec") from None
    lines = src.splitlines()
    start = next(i for i, line in enumerate(lines) if line.lstrip().startswith("def "))
    return "\n".join(line.rstrip() for line in lines[start:]) + "\n"


def _capture_scope(jit_fn) -> dict:
    fn = jit_fn.fn
    scope = dict(fn.__globals__)
    if fn.__closure__:
        scope.update({n: c.cell_contents for n, c in zip(fn.__code__.co_freevars, fn.__closure__)})
    return scope


def _resolve(node, scope):
    if isinstance(node, ast.Name):
        return scope.get(node.id, None)
    if isinstance(node, ast.Attribute):
        base = _resolve(node.value, scope)
        return getattr(base, node.attr, None) if base is not None else None
    return None


def _references(jit_fn):
    """(node, object) for each name and attribute in the function's source, resolved in its scope."""
    scope = _capture_scope(jit_fn)
    for node in ast.walk(ast.parse(_plain_source(jit_fn))):
        if isinstance(node, (ast.Name, ast.Attribute)):
            yield node, _resolve(node, scope)


def _dependencies(jit_fn):
    """(name, object) pairs the function refers to that affect what it computes."""
    found = {}
    for node, value in _references(jit_fn):
        name = ast.unparse(node)
        if _is_jit_function(value):
            if not (value.fn.__module__ or "").startswith("triton."):
                found[name] = value
        elif isinstance(node, ast.Name) and isinstance(value, (bool, int, float, str, triton.language.constexpr)):
            found[name] = value
    return sorted(found.items())


def function_source_hash(jit_fn, _seen: frozenset = frozenset()) -> str:
    """sha256 of a ``@triton.jit`` function's source and of everything it calls."""
    digest = hashlib.sha256(_plain_source(jit_fn).encode())
    for name, value in _dependencies(jit_fn):
        if _is_jit_function(value):
            if id(value) in _seen:
                continue
            digest.update(f"|{name}={function_source_hash(value, _seen | {id(jit_fn)})}".encode())
        else:
            digest.update(f"|{name}={value!r}".encode())
    return digest.hexdigest()


def settle_triton_cache_keys(jit_fn, _settled: set | None = None) -> None:
    """Compute the Triton cache keys of the ``@triton.jit`` functions ``jit_fn`` calls, callees first, then its
    own. Triton (3.6) folds a callee's constexpr globals into its caller's key only if the callee's key was
    computed before: without this, a kernel's key depends on whether another kernel sharing a helper was
    compiled first in the process, and a binary warmed in one process is compiled again in the next."""
    settled = set() if _settled is None else _settled
    if not isinstance(jit_fn, JITFunction) or id(jit_fn) in settled:
        return
    settled.add(id(jit_fn))
    for _, value in _references(jit_fn):
        settle_triton_cache_keys(value, settled)
    jit_fn.cache_key  # noqa: B018 (computed and kept by Triton)


# --------------------------------------------------------------------------------------------
# FnSpecs
# --------------------------------------------------------------------------------------------

def _names(value, what: str) -> tuple:
    """A tuple of names given as a tuple (or another iterable), never a str split into its letters."""
    if isinstance(value, (str, bytes)):
        raise SpecTypeError(f"{what} must be a tuple of names, not a str; pass a tuple: ({value!r},)")
    try:
        return tuple(value)
    except TypeError:
        raise SpecTypeError(f"{what} must be a tuple of names, got {type(value).__name__}") from None


@dataclass(frozen=True)
class FnSpecs:
    """A Triton function compiled into a kernel, with the names of its runtime arguments.

    Two specs are equal when their names, argument lists, ``reduction_n`` and source hashes are
    equal; the function object itself does not take part. ``reference`` is an optional torch
    function with the same arguments, used by :func:`ogsgen.matmul_ogs_torch`. ``backward`` (activations
    only, optional) is a ``@triton.jit`` function ``backward(tile, grad, *fn_arg_names)`` returning the gradient
    with respect to the fp32 tile before the activation, given the gradient ``grad`` of its result; the backward
    of a differentiated call runs it in one fused kernel (without it, torch's autograd of ``reference``).
    """

    name: str
    fn: object = field(compare=False)
    fn_arg_names: tuple = ()
    fn_arg_do_not_specialize: tuple = ()
    reduction_n: int = 1
    reference: Callable | None = field(default=None, compare=False, repr=False)
    backward: object = field(default=None, compare=False, repr=False)
    source_hash: str = field(init=False, default="")

    def __post_init__(self):
        object.__setattr__(self, "fn_arg_names", _names(self.fn_arg_names, f"FnSpecs {self.name!r}: fn_arg_names"))
        object.__setattr__(self, "fn_arg_do_not_specialize",
                           _names(self.fn_arg_do_not_specialize, f"FnSpecs {self.name!r}: fn_arg_do_not_specialize"))
        if self.reference is not None and not callable(self.reference):
            raise SpecTypeError(f"FnSpecs {self.name!r}: reference must be a callable (a torch function taking the "
                                f"same arguments) or None, got {type(self.reference).__name__} {self.reference!r}")
        if self.is_default:
            if self.fn_arg_names or self.reduction_n != 1:
                raise SpecError("FnSpecs.default() takes no fn_arg_names and reduction_n=1")
            return
        check_identifier(self.name, "FnSpecs name")
        if not _is_jit_function(self.fn):
            raise SpecError(f"FnSpecs {self.name!r}: fn must be a @triton.jit function, got {type(self.fn).__name__}")
        if self.backward is not None and not _is_jit_function(self.backward):
            raise SpecError(f"FnSpecs {self.name!r}: backward must be a @triton.jit function "
                            f"backward(tile, grad, {', '.join(self.fn_arg_names)}) or None, got "
                            f"{type(self.backward).__name__}")
        for arg in self.fn_arg_names:
            check_identifier(arg, f"FnSpecs {self.name!r}: fn_arg_names entry")
        if len(set(self.fn_arg_names)) != len(self.fn_arg_names):
            raise SpecError(f"FnSpecs {self.name!r}: fn_arg_names {self.fn_arg_names} has duplicates")
        unknown = set(self.fn_arg_do_not_specialize) - set(self.fn_arg_names)
        if unknown:
            raise SpecError(f"FnSpecs {self.name!r}: fn_arg_do_not_specialize names {sorted(unknown)}, "
                            f"which are not in fn_arg_names {self.fn_arg_names}")
        if not isinstance(self.reduction_n, int) or self.reduction_n < 1 or self.reduction_n & (self.reduction_n - 1):
            raise SpecError(f"FnSpecs {self.name!r}: reduction_n must be a power of two (1, 2, 4, ...), "
                            f"got {self.reduction_n!r}")
        object.__setattr__(self, "source_hash", function_source_hash(self.fn))
        _check_registered_width(self)
        settle_triton_cache_keys(self.fn)
        _claim_name(self)

    @staticmethod
    def default() -> "FnSpecs":
        return _DEFAULT

    @property
    def is_default(self) -> bool:
        return self.fn is None and self.name == ""

    def check_signature(self, kind: str) -> "FnSpecs":
        """Raise unless the function's parameters are the kind's leading ones plus fn_arg_names."""
        params = tuple(self.fn.arg_names)
        lead = LEADING_PARAMS[kind]
        expected = f"({', '.join(lead + self.fn_arg_names)})"
        if len(params) != len(lead) + len(self.fn_arg_names) or params[len(lead):] != self.fn_arg_names:
            raise SpecError(
                f"{kind} {self.name!r}: the function's parameters ({', '.join(params)}) do not match "
                f"fn_arg_names {self.fn_arg_names}; {'an' if kind[0] in 'aeiou' else 'a'} {kind} function must be "
                f"declared as "
                f"def {self.fn.__name__}{expected}")
        if self.backward is not None:
            if kind != "activation":
                raise SpecError(f"{kind} {self.name!r}: only an activation takes a backward function")
            params = tuple(self.backward.arg_names)
            if len(params) != 2 + len(self.fn_arg_names) or params[2:] != self.fn_arg_names:
                raise SpecError(f"activation {self.name!r}: its backward's parameters ({', '.join(params)}) do not "
                                f"match; declare it as def {self.backward.__name__}"
                                f"({', '.join(('tile', 'grad') + self.fn_arg_names)})")
        return self

    @property
    def python_name(self) -> str:
        """How a catalog file names the function: ``ogsgen.<name>`` for a built-in, else its Python name."""
        fn = self.fn.fn
        return f"ogsgen.{fn.__name__}" if fn.__module__ == "ogsgen.spec.builtins" else fn.__name__

    def describe(self) -> dict:
        """The normalized, JSON-ready form stored in manifests and banners."""
        return {
            "name": self.name,
            "origin": f"{self.fn.fn.__module__}:{self.fn.fn.__qualname__}",
            "fn_arg_names": list(self.fn_arg_names),
            "fn_arg_do_not_specialize": list(self.fn_arg_do_not_specialize),
            "reduction_n": self.reduction_n,
            "source_sha256": self.source_hash,
        }


_DEFAULT = FnSpecs("", None)

# One name stands for one function source in a process: a second, different function under a
# taken name would otherwise produce the same kernel name with different code.
_names_lock = threading.Lock()
_claimed: dict[str, FnSpecs] = {}
_registered: dict[tuple[str, str], FnSpecs] = {}


def _claim_name(spec: FnSpecs) -> None:
    with _names_lock:
        owner = _claimed.get(spec.name)
        if owner is not None and owner.source_hash != spec.source_hash:
            raise SpecError(
                f"function name {spec.name!r} is already taken by {owner.describe()['origin']} with a different "
                f"source; choose another name, or call ogsgen.unregister({spec.name!r}) first if you are "
                f"replacing it on purpose")
        _claimed.setdefault(spec.name, spec)


def registered_activations() -> list[FnSpecs]:
    return [spec for (kind, _), spec in list(_registered.items()) if kind == "activation"]


def _check_registered_width(spec: FnSpecs) -> None:
    """A registered activation's function returns 1 / reduction_n of its tile's columns: the same function with
    another reduction_n would have the runtime allocate an output of another width than a kernel writes."""
    for owner in registered_activations():
        if owner.source_hash == spec.source_hash and owner.reduction_n != spec.reduction_n:
            raise SpecError(
                f"FnSpecs {spec.name!r} has reduction_n={spec.reduction_n}, but its function {spec.fn.__name__} is "
                f"the registered activation {owner.name!r}, which folds {owner.reduction_n} columns into one "
                f"(reduction_n={owner.reduction_n}); pass reduction_n={owner.reduction_n} (in ogsgen.compat.triton_kernels: "
                f"FusedActivation(specs, fn_args, {owner.reduction_n}))")


def unregister(name: str) -> None:
    """Forget a registered function name so that a new source may take it."""
    with _names_lock:
        _claimed.pop(name, None)
        for key in [k for k in _registered if k[1] == name]:
            del _registered[key]


def _register(kind, fn, name, arg_names, do_not_specialize, reduction_n, reference, backward=None):
    arg_names = _names(arg_names, f"register_{kind}: arg_names")
    do_not_specialize = _names(do_not_specialize, f"register_{kind}: do_not_specialize")
    if reference is not None and not callable(reference):
        raise SpecTypeError(f"register_{kind}: reference must be a callable (a torch function taking the same "
                            f"arguments) or None, got {type(reference).__name__} {reference!r}")

    def wrap(jit_fn):
        spec = FnSpecs(name or getattr(jit_fn, "__name__", ""), jit_fn, arg_names,
                       do_not_specialize, reduction_n, reference, backward).check_signature(kind)
        _registered[(kind, spec.name)] = spec
        return spec
    return wrap(fn) if fn is not None else wrap


def register_activation(fn=None, *, name=None, arg_names=(), do_not_specialize=(), reduction_n=1,
                        reference=None, backward=None):
    """Register a ``@triton.jit`` activation ``fn(tile, *arg_names)``; returns its :class:`FnSpecs`
    (``backward``: its gradient function, see :class:`FnSpecs`).

    Usable as ``register_activation(fn, ...)`` or as a decorator ``@register_activation(...)``
    placed above ``@triton.jit``.
    """
    return _register("activation", fn, name, arg_names, do_not_specialize, reduction_n, reference, backward)


def register_epilogue(fn=None, *, name=None, arg_names=(), do_not_specialize=(), reference=None):
    """Register a ``@triton.jit`` epilogue ``fn(tile, offs_m, offs_n, mask, *arg_names)``."""
    return _register("epilogue", fn, name, arg_names, do_not_specialize, 1, reference)


def registered(kind: str, name: str) -> FnSpecs:
    """Look up a registered function by kind and name (used by catalogs)."""
    try:
        return _registered[(kind, name)]
    except KeyError:
        known = sorted(n for k, n in _registered if k == kind)
        raise SpecError(f"no {kind} named {name!r} is registered (known: {known}); register it with "
                        f"ogsgen.register_{kind}(...) before it is used") from None
