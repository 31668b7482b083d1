"""Launch parameters (block sizes, warps, stages) chosen per shape and dtype.

Users steer them with :func:`opt_flags_constraints`, a context manager whose constraints hold
for the calls made inside it, in that thread or task only; nothing is process-wide.
"""
from __future__ import annotations

import contextlib
import contextvars
from dataclasses import dataclass, fields, replace
from functools import lru_cache

import triton

from ..errors import InapplicableConstraint


@dataclass(frozen=True)
class OptFlags:
    block_m: int
    block_n: int
    block_k: int
    group_m: int
    num_warps: int
    num_stages: int
    split_k: int = 1


CONSTRAINT_KEYS = tuple(f.name for f in fields(OptFlags))
_POWER_OF_TWO_KEYS = ("block_m", "block_n", "block_k", "num_warps")
_constraints: contextvars.ContextVar[tuple] = contextvars.ContextVar("ogsgen_opt_flags_constraints", default=())


@contextlib.contextmanager
def opt_flags_constraints(**constraints):
    """Force some opt flags for the ``matmul_ogs`` calls made inside the ``with`` block.

    Example: ``with ogsgen.opt_flags_constraints(block_m=64, num_warps=4): matmul_ogs(...)``.
    Blocks nest; inner values win.
    """
    for key, value in constraints.items():
        if key not in CONSTRAINT_KEYS:
            raise InapplicableConstraint(f"opt_flags_constraints: unknown key {key!r}; known keys: {CONSTRAINT_KEYS}")
        if not isinstance(value, int) or value < 1:
            raise InapplicableConstraint(f"opt_flags_constraints: {key} must be a positive int, got {value!r}")
        if key in _POWER_OF_TWO_KEYS and value & (value - 1):
            raise InapplicableConstraint(f"opt_flags_constraints: {key} must be a power of two, got {value}")
        if key.startswith("block_") and value < 16:
            raise InapplicableConstraint(f"opt_flags_constraints: {key} must be at least 16 (tl.dot), got {value}")
    token = _constraints.set(tuple(sorted({**dict(_constraints.get()), **constraints}.items())))
    try:
        yield
    finally:
        _constraints.reset(token)


def current_constraints() -> tuple:
    return _constraints.get()


def _heuristic(itemsize: int, batch: int, m: int, n: int, k: int) -> OptFlags:
    block_m = max(16, min(128, triton.next_power_of_2(max(m, 1))))
    block_n = 128 if n > 64 else max(16, triton.next_power_of_2(max(n, 1)))
    # 128 bytes of K per row of a tile: 64 for 16-bit operands, 32 for fp32.
    block_k = max(16, min(128 // itemsize, triton.next_power_of_2(max(k, 1))))
    num_warps = 8 if block_m * block_n >= 128 * 128 else 4
    stage_bytes = (block_m + block_n) * block_k * itemsize
    num_stages = max(2, min(4, (160 * 1024) // stage_bytes))
    return OptFlags(block_m, block_n, block_k, group_m=8, num_warps=num_warps, num_stages=num_stages)


@lru_cache(maxsize=4096)
def make_opt_flags(itemsize: int, batch: int, m: int, n: int, k: int, reduction_n: int,
                   constraints: tuple = ()) -> OptFlags:
    """Launch parameters for one call; cached, so repeated shapes cost a dict lookup."""
    flags = replace(_heuristic(itemsize, batch, m, n, k), **dict(constraints))
    if flags.split_k != 1:
        raise InapplicableConstraint(f"split_k={flags.split_k}: split-K needs the reduce kernel, which arrives "
                                     f"with the mixture-of-experts work; use split_k=1")
    if flags.block_n % reduction_n:
        raise InapplicableConstraint(f"block_n={flags.block_n} must be a multiple of the activation's "
                                     f"reduction_n ({reduction_n})")
    return flags
