"""What a call's tensors span in memory: whether outputs overlap inputs or themselves, whether offsets need 64
bits, and lazily negated or conjugated views (whose memory holds other values than they read as)."""
from __future__ import annotations

import dataclasses

import torch

from ..errors import SpecError

# Triton computes an offset `index * stride` in 32 bits when both fit in 32 bits (the kernels widen row, batch and
# expert indices themselves); a span of 2**31 elements or more needs the kernels' 64-bit-offset specialization.
OFFSET_LIMIT = 1 << 31


def span(t: torch.Tensor | None, dims: tuple[int, ...]) -> int:
    """Elements between the first and the last element of ``t`` along ``dims`` (0 for an empty or absent tensor, and
    for a 0-d one: a scalar scale, whose one element the kernels read as a (1,) tensor's)."""
    if t is None or t.numel() == 0 or t.ndim == 0:
        return 0
    return sum((t.shape[d] - 1) * abs(t.stride(d)) for d in dims)


def needs_64bit_offsets(*tensor_dims) -> bool:
    """Whether any (tensor, dims) pair spans 2**31 elements or more along the dims a kernel indexes in 32 bits."""
    return any(span(t, dims) >= OFFSET_LIMIT for t, dims in tensor_dims)


def byte_extent(t: torch.Tensor) -> tuple[int, int] | None:
    """(lowest, highest + 1) byte offset of ``t``'s elements relative to ``t.data_ptr()``; None when empty."""
    if t.numel() == 0:
        return None
    low = high = 0
    for size, stride in zip(t.shape, t.stride()):
        reach = (size - 1) * stride
        if reach < 0:
            low += reach
        else:
            high += reach
    size = t.element_size()
    return low * size, (high + 1) * size


def _overlap(a_start: int, a_extent, b_start: int, b_extent) -> bool:
    return a_extent is not None and b_extent is not None and \
        a_start + a_extent[0] < b_start + b_extent[1] and b_start + b_extent[0] < a_start + a_extent[1]


def same_elements(a: torch.Tensor, b: torch.Tensor) -> bool:
    """``a`` and ``b`` address exactly the same elements in the same order (in-place accumulation: y_acc_in is y)."""
    return a.data_ptr() == b.data_ptr() and a.shape == b.shape and a.stride() == b.stride() and a.dtype == b.dtype


def check_outputs_disjoint(written: dict, read: dict, same_allowed: tuple = ()) -> None:
    """Raise SpecError when a written tensor shares memory with another argument of the call (a kernel would read
    what it, or another program, already overwrote). ``same_allowed``: (written name, read name) pairs that may
    address exactly the same elements (each element is read before the same program writes it)."""
    written = {name: t for name, t in written.items() if isinstance(t, torch.Tensor)}
    others = {**read, **written}
    for name, out in written.items():
        extent = byte_extent(out)
        for other_name, other in others.items():
            if other_name == name or not isinstance(other, torch.Tensor):
                continue
            if (name, other_name) in same_allowed and same_elements(out, other):
                continue
            if _overlap(out.data_ptr(), extent, other.data_ptr(), byte_extent(other)):
                raise SpecError(f"{name} overlaps {other_name} in memory: the kernels would overwrite what they "
                                f"still read; pass a separate {name} (or {other_name}.clone())")


class DisjointGuard:
    """The check of :func:`check_outputs_disjoint` for calls of one signature, on the positions of the call's
    tensor list. Extents are the signature's, so a replay only reads addresses: tensor j overlaps written tensor i
    when ``low < start_j - start_i < high``, bounds computed here once. ``__call__(tensors)`` is True when the
    written tensors overlap nothing (beyond the allowed identical pairs)."""
    __slots__ = ("checks",)

    def __init__(self, tensors: list, written: tuple[int, ...], same_allowed: tuple = ()):
        extents = [byte_extent(t) if isinstance(t, torch.Tensor) else None for t in tensors]
        checks = []
        for i in written:
            if extents[i] is None:
                continue
            bounds = []
            for j, extent in enumerate(extents):
                if j == i or extent is None:
                    continue
                low, high = extents[i][0] - extent[1], extents[i][1] - extent[0]
                if (i, j) in same_allowed and same_elements(tensors[i], tensors[j]):
                    # the same elements at one address are allowed: overlaps on either side of 0 are not
                    bounds += [(j, low, 0), (j, 0, high)]
                else:
                    bounds.append((j, low, high))
            checks.append((i, tuple(bounds)))
        self.checks = tuple(checks)

    def __call__(self, tensors: list) -> bool:
        for i, bounds in self.checks:  # ~17 bounds for a routed call, on the hot path: a minimal loop body
            start = tensors[i].data_ptr()
            for j, low, high in bounds:
                if low < tensors[j].data_ptr() - start < high:
                    return False
        return True


def check_distinct_elements(tensors: dict) -> None:
    """Written tensors whose elements do not overlap each other (an expanded tensor's do, and rows closer together
    than their length: programs would store to the same memory). Taken by increasing stride, each dimension must
    step past the span of the ones before it; that also refuses the few layouts whose dimensions interleave
    without overlapping (strides (2, 3) for shape (3, 2)), which no allocation makes."""
    for name, t in tensors.items():
        if t.numel() == 0:
            continue
        span = 0  # the elements the dimensions of smaller strides reach past the first one
        for stride, size in sorted((abs(stride), size) for size, stride in zip(t.shape, t.stride()) if size > 1):
            if stride <= span:
                raise SpecError(f"{name} (shape {tuple(t.shape)}, strides {t.stride()}) has elements that overlap "
                                f"each other in memory{' (an expanded tensor)' if stride == 0 else ''}: the kernels "
                                f"would store several results to one address; pass a tensor with distinct elements, "
                                f"such as torch.empty's")
            span += (size - 1) * stride


def is_lazy_view(t: torch.Tensor) -> bool:
    """Whether torch keeps ``t``'s negation or conjugation as a flag (``torch._neg_view``, the imaginary part of a
    ``conj()`` view) and not in its memory, which is what a kernel reads and writes."""
    return t.is_neg() or t.is_conj()


def resolve_lazy_views(written: dict, arguments: tuple) -> tuple:
    """``arguments`` (a call's) with each lazily negated or conjugated tensor in them (themselves, their tuples'
    items and their dataclasses' fields, at any depth) replaced by a copy holding its values; the very same
    objects where there is none. A written tensor (``written``: by argument name) with the flag is refused: the
    kernels would write a copy, not it."""
    for name, t in written.items():
        if is_lazy_view(t):
            raise SpecError(f"{name} is a lazily negated or conjugated view ({name}.is_neg() or {name}.is_conj() is "
                            f"set): torch negates the values in its memory when it reads them, so what the kernels "
                            f"write there would read back negated; pass a tensor without the flag (and negate or "
                            f"conjugate the result afterwards)")
    return _resolved(arguments)


def _resolved(value):
    if isinstance(value, torch.Tensor):
        return value.resolve_neg().resolve_conj() if is_lazy_view(value) else value
    if isinstance(value, tuple):
        items = tuple(_resolved(item) for item in value)
        return value if all(new is old for new, old in zip(items, value)) else items
    fields = getattr(value, "__dataclass_fields__", None)
    if fields is None or isinstance(value, type):
        return value
    changed = {}
    for name, field in fields.items():
        if field.init and (new := _resolved(old := getattr(value, name))) is not old:
            changed[name] = new
    return dataclasses.replace(value, **changed) if changed else value
