"""Launch parameters (block sizes, warps, stages, split K) chosen per shape and dtype.

Users steer them with :func:`opt_flags_constraints`, a context manager whose constraints hold
for the calls made inside it, in that thread or task only; nothing is process-wide.
"""
from __future__ import annotations

import contextlib
import contextvars
from dataclasses import dataclass, fields, replace
from functools import lru_cache

import triton

from ..errors import InapplicableConstraintError
from ..moe.metadata import BLOCK_SIZES
from ..spec.formats import MX_BLOCK


@dataclass(frozen=True)
class OptFlags:
    block_m: int
    block_n: int
    block_k: int
    group_m: int
    num_warps: int
    num_stages: int
    split_k: int = 1
    persistent: bool = False  # the variant's persistent TMA kernel (one program per SM) instead of one per tile
    wait_mma: bool = False    # MX weights: each K step's wgmma completes before the next (see wgmma_hazards)
    # ptxas's register cap per thread (Triton's maxnreg), None for its own choice: fewer registers, more
    # resident warps per SM (65536 registers each)
    maxnreg: int | None = None
    # fp8 block-scaled W (fp8e4m3_b128): each K step's product as W^T X^T, so that a decode tile's few rows are the
    # wgmma's N and its columns the wgmma's 64 rows (a 16-row tile's X @ W is an mma.sync otherwise)
    swap_ab: bool = False
    # fp8 block-scaled w (fp8e4m3_b128): the variant's warp-specialized kernel (a producer and two consumer
    # warpgroups, persistent; 128 x BLOCK_N tiles, 128-deep K steps, num_stages slots)
    warp_specialized: bool = False
    # MX weights: tiles (block_n, block_k, num_warps, num_stages, wait_mma), same block_m, tried in this order
    # when this tile's binary has the wgmma register hazard; the first whose binary is clean and fits runs, else
    # this tile's waiting kernel.
    fallback_tiles: tuple = ()

    def waiting(self) -> "OptFlags":
        """This tile's waiting kernel: what runs when no fallback tile is clean."""
        return replace(self, wait_mma=True, fallback_tiles=())

    def fallback(self, tile: tuple) -> "OptFlags":
        """These flags with one of their fallback tiles."""
        block_n, block_k, num_warps, num_stages, wait_mma = tile
        return replace(self, block_n=block_n, block_k=block_k, num_warps=num_warps, num_stages=num_stages,
                       wait_mma=wait_mma, fallback_tiles=())


CONSTRAINT_KEYS = tuple(f.name for f in fields(OptFlags))
# The heuristic's choices that hold for its own tile only: another tile gets ptxas's register count and its own
# binary (its waiting kernel only where that binary has the wgmma hazard), unless the constraints name them.
_MEASURED_FOR_ITS_TILE = {"maxnreg": None, "wait_mma": False}
_POWER_OF_TWO_KEYS = ("block_m", "block_n", "block_k", "num_warps")
_BOOLEAN_KEYS = ("persistent", "wait_mma", "swap_ab", "warp_specialized")
TILE_KEYS = ("block_m", "block_n", "block_k", "num_warps", "num_stages")  # a tile, as constraints name it
_FALLBACK_TILE_KEYS = ("block_n", "block_k", "num_warps", "num_stages", "wait_mma")
# The warp-specialized kernel's fixed tile and K step, and its launch's register cap (ptxas's per thread of the 12
# warps, which the partitions redistribute: 232 each consumer warpgroup's, 40 the producer's). Wider tiles took
# longer (2026-12-07): 256 columns 1.4x the time in a probe on an H200, 192 columns (a 128- and a 64-column piece)
# 1.07-1.23x at prefill on an H100 (docs/heuristics.md).
WS_BLOCK_M, WS_BLOCK_N, WS_BLOCK_K, WS_MAXNREG = 128, 128, 128, 168
# Rows per expert and K from which it runs: on an H200 it took 0.86-0.95x the tiled kernel's time with 128 or more
# rows per expert and K >= 2048 (DeepSeek-V3 w1 at T=8192 1.00x), 1.08x on DeepSeek-V3 w1 at 64 rows per expert
# (T=2048), and its probe 1.02x at K = 768 on an H100 (2026-12-07, docs/heuristics.md)
WS_MIN_ROWS_PER_EXPERT, WS_MIN_K = 128, 2048
# Constraints that name the tiled and persistent kernels' launches: given without warp_specialized, they mean those
_TILED_KEYS = (*TILE_KEYS, "group_m", "split_k", "persistent", "wait_mma", "maxnreg", "swap_ab", "fallback_tiles")
_constraints: contextvars.ContextVar[tuple] = contextvars.ContextVar("ogsgen_opt_flags_constraints", default=())
_process_constraints: tuple = ()  # set_process_constraints


@contextlib.contextmanager
def opt_flags_constraints(**constraints):
    """Force some opt flags for the ``matmul_ogs`` calls made inside the ``with`` block.

    Example: ``with ogsgen.opt_flags_constraints(block_m=64, num_warps=4): matmul_ogs(...)``.
    Blocks nest; inner values win. A constrained tile (block sizes, warps, stages) drops the heuristic's
    register cap (``maxnreg``) and its waiting for each wgmma (``wait_mma``), which were measured for the
    heuristic's tile, unless they are given too; ``persistent=True`` drops its split of K (``split_k``), and
    ``split_k`` > 1 its persistent kernel.
    """
    check_constraints(constraints)
    token = _constraints.set(tuple(sorted({**dict(_constraints.get()), **constraints}.items())))
    try:
        yield
    finally:
        _constraints.reset(token)


def set_process_constraints(constraints: dict) -> None:
    """Constraints for every call of the process, from every thread (``opt_flags_constraints`` blocks override them;
    an empty dict removes them): what a serving process sets once at start-up."""
    global _process_constraints
    check_constraints(constraints)
    _process_constraints = tuple(sorted(constraints.items()))


def check_constraints(constraints: dict) -> None:
    """Raise InapplicableConstraintError naming a key or value that no launch can take."""
    for key, value in constraints.items():
        if key not in CONSTRAINT_KEYS:
            raise InapplicableConstraintError(f"opt_flags_constraints: unknown key {key!r}; known keys: {CONSTRAINT_KEYS}")
        if key == "fallback_tiles":
            if not (isinstance(value, tuple) and all(isinstance(t, tuple) and len(t) == 5 for t in value)):
                raise InapplicableConstraintError(f"opt_flags_constraints: fallback_tiles must be a tuple of (block_n, "
                                             f"block_k, num_warps, num_stages, wait_mma) tuples, got {value!r}")
            for tile in value:
                for tile_key, tile_value in zip(_FALLBACK_TILE_KEYS, tile):
                    _check_constraint(f"fallback_tiles {tile}: {tile_key}", tile_key, tile_value)
        else:
            _check_constraint(key, key, value)


def _check_constraint(name: str, key: str, value) -> None:
    if key in _BOOLEAN_KEYS:
        if not isinstance(value, bool):
            raise InapplicableConstraintError(f"opt_flags_constraints: {name} must be True or False, got {value!r}")
        return
    if key == "maxnreg" and value is None:
        return
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise InapplicableConstraintError(f"opt_flags_constraints: {name} must be a positive int, got {value!r}")
    if key in _POWER_OF_TWO_KEYS and value & (value - 1):
        raise InapplicableConstraintError(f"opt_flags_constraints: {name} must be a power of two, got {value}")
    if key.startswith("block_") and value < 16:
        raise InapplicableConstraintError(f"opt_flags_constraints: {name} must be at least 16 (tl.dot), got {value}")
    if key == "maxnreg" and not 24 <= value <= 255:
        raise InapplicableConstraintError(f"opt_flags_constraints: {name} must be a register count from 24 to 255 "
                                     f"(ptxas's range), got {value}")


def current_constraints() -> tuple:
    scoped = _constraints.get()
    if not _process_constraints:
        return scoped
    return tuple(sorted({**dict(_process_constraints), **dict(scoped)}.items()))


def row_tiles(m: int, block_m: int, n_expts: int | None) -> int:
    """Row tiles of a launch: cdiv(m, block_m), or for ragged rows over n_expts experts the host-side
    upper bound (each expert wastes at most one partial tile)."""
    if n_expts is None:
        return -(-m // block_m)
    if m <= n_expts:
        return m
    return -(-(m - n_expts + 1) // block_m) + n_expts - 1


# An eager call of the persistent decode kernel costs the host more than a tiled one: it pays only where streaming W
# takes longer than that host time (docs/heuristics.md, "Decode, rows read in place").
_HOST_HIDING_W_BYTES = 300 * 10**6


def _heuristic(itemsize, batch, m, n, k, n_expts, tokens_per_expt, can_split, n_sms, w_mx_layout,
               can_persist, mx_scales_n_contiguous, x_gathered, split_is_free, w_k_major) -> OptFlags:
    rows = tokens_per_expt if n_expts is not None else m
    block_m = max(16, min(128, triton.next_power_of_2(max(rows, 1))))
    if itemsize == 2 and w_mx_layout is None and n_expts is not None and 16 <= rows < 32:
        # 16 to 31 rows per expert on average: about half the experts would spill into a second, nearly empty
        # 16-row tile that streams their W again (docs/heuristics.md, "Decode rows").
        block_m = 32
    if (itemsize == 2 and w_mx_layout is None and n_expts is not None and m < n_expts and not x_gathered
            and n >= 256 and k >= 256 and can_persist and m * n * k * itemsize >= _HOST_HIDING_W_BYTES):
        # Fewer rows than experts (decode), read in place: the persistent TMA kernel streams W faster, where W
        # outlasts the eager call's host time; gathered rows keep the tiled kernel, as fast or faster there
        # (docs/heuristics.md, "Decode, rows read in place").
        return OptFlags(16, 128, 128, group_m=8, num_warps=4, num_stages=4, persistent=True)
    block_n = 128 if n > 64 else max(16, triton.next_power_of_2(max(n, 1)))
    # 128 bytes of K per row of a tile: 64 for 16-bit operands, 32 for fp32. At least 16 (tl.dot), and 32 for an
    # fp8 dot and for MX weights (one scale per 32 rows of K), whatever K (_tile_problem refuses less).
    least_k = 32 if itemsize == 1 else MX_BLOCK if w_mx_layout is not None else 16
    block_k = max(least_k, min(128 // itemsize, triton.next_power_of_2(max(k, 1))))
    num_warps = 8 if block_m * block_n >= 128 * 128 else 4
    wait_mma, maxnreg = False, None
    if itemsize == 2 and w_mx_layout is None and block_m == 16:
        # Decode rows with 16-bit W: 16x128 tiles 128 deep in K with one warpgroup for MoE W stored K-contiguous
        # (docs/heuristics.md, "K-contiguous W"), and for N-contiguous MoE W whose K is a whole number of such steps
        # or whose tiles fit in one wave; else two warpgroups in 64-deep steps (docs/heuristics.md, "Decode rows").
        num_warps = 8
        one_wave = n_sms is not None and row_tiles(m, block_m, n_expts) * triton.cdiv(n, block_n) <= n_sms
        if n_expts is not None and k >= 128 and (w_k_major or k % 128 == 0 or one_wave):
            block_k, num_warps = 128, 4
        if w_k_major and n_expts is not None and n_sms is not None and block_n == 128:
            # K-contiguous W: 64-column tiles where 128-column ones leave much of their last wave idle (gpt-oss w1
            # T=1: 180 tiles on 132 SMs; docs/heuristics.md, "K-contiguous W")
            tiles = row_tiles(m, block_m, n_expts)
            if _wave_fill(tiles * triton.cdiv(n, 64), n_sms) > 1.15 * _wave_fill(tiles * triton.cdiv(n, 128), n_sms):
                block_n = 64
    stage_bytes = (block_m + block_n) * block_k * itemsize
    num_stages = max(2, min(4, (160 * 1024) // stage_bytes))
    if itemsize == 2 and w_mx_layout is None and block_m == 32 and w_k_major and n_expts is not None and k >= 128:
        # 32-row tiles of a K-contiguous MoE W step 128 deep too: 256 bytes of each W row per step, not 128
        # (docs/heuristics.md, "K-contiguous W")
        block_k, num_stages = 128, 3
    wide_tiles = batch * row_tiles(m, block_m, n_expts) * triton.cdiv(n, 256)
    fills_gpu = n_sms is None or wide_tiles >= n_sms
    if (itemsize == 2 and w_mx_layout is None and n_expts is None and block_m == 128 and n > 128 and k >= 256
            and can_persist and (fills_gpu or m > 512)):
        # Dense and batched 16-bit calls of 128-row tiles: the persistent 128x256x64 tile, or its 128x128x64
        # tile where that fills the last wave of tiles clearly better (docs/heuristics.md).
        narrow_tiles = batch * triton.cdiv(m, 128) * triton.cdiv(n, 128)
        if n_sms is not None and _wave_fill(narrow_tiles, n_sms) > 1.15 * _wave_fill(wide_tiles, n_sms):
            return OptFlags(128, 128, 64, group_m=8, num_warps=8, num_stages=4, persistent=True)
        return OptFlags(128, 256, 64, group_m=8, num_warps=8, num_stages=3, persistent=True)
    if itemsize == 2 and w_mx_layout is None and block_m >= 64 and n > 128 and k >= 256 and fills_gpu:
        # Wide N tiles for 16-bit operands with enough rows, when they still fill the GPU (docs/heuristics.md).
        block_n = 256
        block_k, num_warps, num_stages = (32, 8, 5) if block_m == 128 else (64, 4, 4)
        if can_persist:
            # The persistent TMA kernel is faster still, with gathered x too (it gathers the rows by pointer loads).
            return OptFlags(128, 256, 64, group_m=8, num_warps=8, num_stages=3, persistent=True)
    if (itemsize == 2 and w_mx_layout is None and n_expts is None and 64 <= block_m and m <= 512 and n > 128
            and k >= 256 and can_persist and not fills_gpu):
        # Dense and batched 16-bit calls of 33 to 512 rows, whose tiles leave SMs idle: the persistent TMA kernel
        # with 64-row tiles and 256 bytes of K per step, 64 columns wide where 64x128 tiles would leave half the
        # SMs idle (docs/heuristics.md).
        tiles = batch * triton.cdiv(m, 64) * triton.cdiv(n, 128)
        return OptFlags(64, 128 if 2 * tiles >= n_sms else 64, 128, group_m=8, num_warps=4, num_stages=4,
                        persistent=True)
    if w_mx_layout == "hopper":
        # Whole 64-row K groups and 16-column N slabs per tile; the upcast W feeds the MMA from registers (sm_90
        # SASS). Where Triton 3.6's binary of a tile has ptxas's wgmma register hazard, its waiting kernel runs
        # (it waits for each wgmma in its PTX and keeps W in registers; ogsgen.runtime.wgmma_hazards).
        # The tiles below were measured with scales stored K-contiguous; N-contiguous scales (as
        # prepare_expert_weights stores them) have tiles of their own (docs/heuristics.md, "mxfp4 W").
        if mx_scales_n_contiguous and (split_k := _hopper_mxfp4_one_wave_split(m, n, k, n_expts, n_sms, block_m,
                                                                                  can_split, split_is_free)):
            return OptFlags(16, 256, 128, group_m=8, num_warps=8, num_stages=3, split_k=split_k, maxnreg=128)
        if mx_scales_n_contiguous:
            block_m, block_n, block_k, num_warps, num_stages, wait_mma, maxnreg = _hopper_mxfp4_tile(
                m, n, n_expts, n_sms, block_m)
        elif rows <= 1 and k % 128:
            block_m, block_n, block_k, num_warps, num_stages, wait_mma = 16, 128, 64, 8, 4, True
        elif block_m <= 32:
            block_n, block_k, num_warps, num_stages = 128, 128, 4, 3
        else:
            block_m, block_n, block_k, num_warps, num_stages = 64, 256, 64, 8, 3
    split_k = 1
    tiles = batch * row_tiles(m, block_m, n_expts) * triton.cdiv(n, block_n)
    k_tiles = triton.cdiv(k, block_k)
    # Split K only when the tiles leave most SMs idle and each split keeps a long K loop.
    if can_split and n_sms and 2 * tiles <= n_sms and k_tiles >= 16:
        split_k = max(1, min(n_sms // tiles, k_tiles // 8, 8))
    return OptFlags(block_m, block_n, block_k, group_m=8, num_warps=num_warps, num_stages=num_stages,
                    split_k=split_k, wait_mma=wait_mma, maxnreg=maxnreg)


def _hopper_mxfp4_tile(m, n, n_expts, n_sms, block_m):
    """(block_m, block_n, block_k, num_warps, num_stages, wait_mma, maxnreg) of hopper-layout mxfp4 weights whose
    scales are N-contiguous (each K step then reads its scales as whole 32-byte sectors): 16-row tiles 16x256 wide,
    waiting at 80 registers beyond one wave of tiles; 64 and 128 rows 256 wide with K steps of 128. The measurements
    per row count: docs/heuristics.md, "Scales stored N-contiguous".
    """
    if block_m <= 32:
        wide_tiles = min(m, n_expts or m) * triton.cdiv(n, 256)  # at most one row tile per expert
        if n_expts is not None and block_m == 16 and (n_sms is None or 2 * wide_tiles >= n_sms):
            if n_sms is not None and wide_tiles <= n_sms:
                return 16, 256, 128, 8, 3, False, 128
            return 16, 256, 128, 8, 3, True, 80
        return block_m, 128, 128, 4, 3, False, None
    if block_m == 64:
        return 64, 256, 128, 8, 3, False, 120
    return 128, 256, 128, 8, 4, False, None


def _hopper_mxfp4_one_wave_split(m, n, k, n_expts, n_sms, block_m, can_split, split_is_free) -> int:
    """The K split of hopper-layout mxfp4 decode calls (N-contiguous scales) whose 16x256 tiles fit in one wave, or
    0. Such a call leaves SMs idle or runs one CTA per SM, and its upcast loop is bound by instruction issue: K is
    split so that its tiles fill two CTAs per SM, keeping 8 K steps per split, and only with 32 K steps or more
    where the partials need a reduce of their own (docs/heuristics.md, "Decode that fits one wave")."""
    if not (can_split and n_sms and n_expts is not None and block_m == 16):
        return 0
    wide_tiles = min(m, n_expts) * triton.cdiv(n, 256)  # at most one row tile per expert
    k_steps = triton.cdiv(k, 128)
    if wide_tiles > n_sms or k_steps < (16 if split_is_free else 32):
        return 0
    return min(8, k_steps // 8, max(2, 2 * n_sms // wide_tiles))


def _wave_fill(tiles: int, n_sms: int) -> float:
    """The share of the SMs' time a launch of ``tiles`` equal tiles keeps busy: tiles / (waves * SMs)."""
    return tiles / (triton.cdiv(tiles, n_sms) * n_sms)


@lru_cache(maxsize=1024)
def reduce_tile(n: int, reduction_n: int, y_scale_block: int = 0) -> tuple[int, int, int]:
    """(BLOCK_M, BLOCK_N, num_warps) of the reduce kernels (split-K partial sums, top-k combines) for n columns;
    each tile holds whole ``reduction_n`` column groups of the activation and whole ``y_scale_block`` groups of
    output columns that share a scale."""
    return 32, max(max(32, y_scale_block) * reduction_n, min(128, triton.next_power_of_2(n))), 4


@dataclass(frozen=True)
class TileProblem:
    """What the launch heuristic reads of one call; hashable, so that repeated calls cost a dict lookup.

    ``itemsize``: bytes of an x element as the dot reads it. ``n_expts``: None for dense and batched calls, the
    number of experts for ragged rows (``tokens_per_expt`` rows each, as expected). ``reduction_n``: output columns
    the activation folds into one. ``can_split``: K splits would be summed before anything nonlinear.
    ``bitwise_invariant``: fixed row blocks and no split K, so that a row's result does not depend on the rows
    around it. ``persistent_blocker``: None when the call may use the variant's persistent TMA kernel, else why not
    (the error message for a ``persistent=True`` constraint). ``x_gathered``: rows read through a gather index
    (decode keeps its tiled kernel for them, docs/heuristics.md). ``split_is_free``: split partials would be summed
    by a reduce the call launches anyway (a top-k combine). ``w_k_major``: a plain 16-bit w stored K-contiguous.
    The operands' formats decide the rest (:func:`format_facts`).
    """
    itemsize: int
    batch: int
    m: int
    n: int
    k: int
    reduction_n: int = 1
    n_expts: int | None = None
    tokens_per_expt: int = 0
    can_split: bool = True
    n_sms: int | None = None
    w_mx_layout: str | None = None   # the value layout of w whose scales apply to its values (MX), else None
    bitwise_invariant: bool = False
    y_scale_block: int = 0           # output columns per block scale of the output (32: mxfp8, 128: fp8 b128), or 0
    constraints: tuple = ()
    persistent_blocker: str | None = "no persistent kernel was asked for"
    ws_blocker: str | None = "no warp-specialized kernel was asked for"  # (as persistent_blocker)
    mx_scales_n_contiguous: bool = False  # MX scales stored with N contiguous (their tiles differ on Hopper)
    x_gathered: bool = False
    split_is_free: bool = False
    w_k_major: bool = False
    k_group: int = 0                 # K values that share a scale applied per K step (fp8 128 x 128 blocks), or 0
    x_mx: bool = False               # x's scales apply to its values (mxfp8 x, upcast in registers)
    scale_block_k: int = MX_BLOCK    # K values per scale of an operand whose scales apply to its values


def format_facts(x_fmt, w_fmt, y_fmt) -> dict:
    """The fields of a TileProblem that the operands' formats decide: where their scales apply."""
    upcast = [f.block_size for f in (x_fmt, w_fmt) if f.scales_apply == "operand"]
    return dict(w_mx_layout=w_fmt.layout if w_fmt.scales_apply == "operand" else None,
                k_group=w_fmt.block_size if w_fmt.scales_apply == "k_group" else 0,
                x_mx=x_fmt.scales_apply == "operand", y_scale_block=y_fmt.block_size,
                scale_block_k=max(upcast, default=MX_BLOCK))


@lru_cache(maxsize=4096)
def make_opt_flags(p: TileProblem) -> OptFlags:
    """Launch parameters for one call: the heuristic's, adjusted to the operands, then the constraints; raises
    InapplicableConstraintError where the constraints ask for what the call cannot take."""
    constrained = dict(p.constraints)
    by_default = p.ws_blocker is None and not p.bitwise_invariant and p.tokens_per_expt >= WS_MIN_ROWS_PER_EXPERT \
        and p.k >= WS_MIN_K \
        and not any(key in constrained for key in _TILED_KEYS)
    if constrained.get("warp_specialized", by_default):
        return _warp_specialized_flags(p, constrained)
    heuristic_args = (p.itemsize, p.batch, p.m, p.n, p.k, p.n_expts, p.tokens_per_expt,
                      p.can_split and not p.bitwise_invariant, p.n_sms, p.w_mx_layout)
    flags = _heuristic(*heuristic_args, p.persistent_blocker is None and not p.bitwise_invariant,
                       p.mx_scales_n_contiguous, p.x_gathered, p.split_is_free, p.w_k_major)
    if flags.persistent and _tile_problem(flags, p.itemsize, p.reduction_n, p.w_mx_layout, p.y_scale_block) is not None:
        # The persistent kernel stores half tiles, of at least 8 output columns and of whole scale groups for an
        # output with block scales: where its tile's halves would not be, the tiled kernel (widened below).
        flags = _heuristic(*heuristic_args, False, p.mx_scales_n_contiguous, p.x_gathered, p.split_is_free,
                           p.w_k_major)
    # Tiles changed here drop the heuristic's register cap and wait for each wgmma, measured for its own tile.
    if p.itemsize == 1 and p.w_mx_layout is not None and not p.x_mx:
        # e4m3 x with mxfp4 w: 64-deep K steps of at most 64 rows (deeper steps and 128-row tiles spill:
        # bench/NOTES.md, "fp8 x with mxfp4 w"). 64-row tiles: 128 columns on 4 warps (0.82-0.86x the time of
        # 64x256x64 on 8 warps on an H100, gpt-oss w1/w2 at T=2048 and 8192, 2026-12-07, docs/heuristics.md);
        # fewer rows: 256 columns where N has them, on 8 warps (not measured on a GPU).
        block_m = min(flags.block_m, 64)
        if p.w_mx_layout == "hopper_fp8":
            # At 255 registers a 64x128x64 tile runs two 4-warp blocks per SM and its K loop waits on latency (ncu,
            # gpt-oss w1 T=2048: 12% occupancy, no eligible warp 72% of the time). Capped at 128 registers (96 bytes
            # spill) in 4 stages it took 0.68x, 0.60x and 0.69x the time (gpt-oss w1 T=2048 and 8192, w2 T=2048);
            # fewer rows: 16x128x64 on 4 warps in 4 stages, 0.60x the 16x256x64/8-warp tile's (gpt-oss w2 T=8).
            # 128-row tiles on 8 warps were slower. An H100, 2026-12-07 (docs/heuristics.md).
            flags = replace(flags, block_m=block_m, block_n=128, block_k=64, num_warps=4, num_stages=4,
                            maxnreg=128 if block_m == 64 else None, wait_mma=False)
        else:
            wide = p.n > 128 and block_m < 64
            flags = replace(flags, block_m=block_m, block_n=256 if wide else min(flags.block_n, 128), block_k=64,
                            num_warps=8 if wide or block_m < 64 else 4, num_stages=3, **_MEASURED_FOR_ITS_TILE)
    if p.k_group and flags.block_m == 16 and flags.block_n == 128 and flags.split_k == 1:
        # fp8 block-scaled decode rows: 64-column tiles in 6 stages (twice the tiles, each streaming its W with
        # 48 KiB in flight), 1-9% faster than 16x128x128 in 4 stages on an H100 (Qwen3-30B-A3B and DeepSeek-V3
        # w1/w2 at T=1 and 8), and their product as W^T X^T, a 64x16 wgmma (0.5-3.6% faster than mma.sync in 7
        # of 8 decode cases, 2026-12-07, docs/heuristics.md).
        flags = replace(flags, block_n=64, num_stages=6, swap_ab=True, **_MEASURED_FOR_ITS_TILE)
    if p.k_group and flags.block_m == 128 and flags.num_warps == 8 and p.k < 2048:
        # fp8 block-scaled 128-row tiles with fewer than 16 K steps: 64x128 on 4 warps, two blocks per SM, one's
        # promotion and epilogue under the other's wgmmas (Qwen3-30B-A3B w2, K = 768: 0.85-0.91x the time on an
        # H100; at K >= 2048 they were 1.03-1.07x slower, 2026-12-07, docs/heuristics.md).
        flags = replace(flags, block_m=64, num_warps=4, **_MEASURED_FOR_ITS_TILE)
    if p.bitwise_invariant:
        flags = replace(flags, block_m=128, num_warps=8 if flags.block_n >= 128 else 4, **_MEASURED_FOR_ITS_TILE)
    if flags.block_n < p.y_scale_block * p.reduction_n:  # each output tile holds whole scale blocks
        flags = _widened(flags, p.y_scale_block * p.reduction_n, p.bitwise_invariant)
    if any(key in constrained for key in TILE_KEYS):
        constrained = {**_MEASURED_FOR_ITS_TILE, **constrained}
    if constrained.get("persistent"):  # the persistent kernel does not split K: drop the heuristic's split
        constrained = {"split_k": 1, **constrained}
    if constrained.get("split_k", 1) > 1:  # and only the tiled kernel does: drop the heuristic's persistent kernel
        constrained = {"persistent": False, **constrained}
    flags = replace(flags, **constrained)
    operands = (p.itemsize, p.reduction_n, p.w_mx_layout, p.y_scale_block, p.k_group, p.x_mx, p.scale_block_k)
    if flags.persistent and "persistent" not in constrained and _tile_problem(flags, *operands) is not None:
        flags = replace(flags, persistent=False)  # the heuristic's kernel cannot take the asked-for tile: the tiled one
    _check_applicable(flags, p, operands)
    return flags


def _warp_specialized_flags(p: TileProblem, constrained: dict) -> OptFlags:
    """The warp-specialized kernel's launch: 128 x 128 tiles in 4 slots unless constrained; raises
    InapplicableConstraintError where the call or the constraints do not fit it."""
    flags = replace(OptFlags(WS_BLOCK_M, WS_BLOCK_N, WS_BLOCK_K, group_m=1, num_warps=4, num_stages=4,
                             warp_specialized=True), **constrained)
    if p.ws_blocker is not None:
        raise InapplicableConstraintError(f"warp_specialized=True: {p.ws_blocker}")
    if p.bitwise_invariant:
        raise InapplicableConstraintError("warp_specialized=True: precision_config.enforce_bitwise_invariance keeps "
                                          "the tiled kernel's arithmetic for every shape; drop one of the two")
    fixed = dict(block_m=WS_BLOCK_M, block_n=WS_BLOCK_N, block_k=WS_BLOCK_K, group_m=1, num_warps=4, split_k=1,
                 persistent=False, swap_ab=False, wait_mma=False, maxnreg=None, fallback_tiles=())
    for key, value in fixed.items():
        if getattr(flags, key) != value:
            raise InapplicableConstraintError(f"warp_specialized=True fixes {key}={value!r} (the kernel's tile, K "
                                              f"step and launch), got {getattr(flags, key)!r}: drop {key}")
    slot_bytes = (WS_BLOCK_M + WS_BLOCK_N) * WS_BLOCK_K  # (e4m3: a byte a value)
    if not 2 <= flags.num_stages <= _WS_SHARED_BYTES // slot_bytes:
        raise InapplicableConstraintError(f"warp_specialized=True: num_stages={flags.num_stages} slots of {slot_bytes} "
                                          f"bytes must number 2 to {_WS_SHARED_BYTES // slot_bytes} (shared memory)")
    return flags


_WS_SHARED_BYTES = 200 * 1024  # of sm_90's 227 KiB a block may use: the rest for the epilogue's layout changes


def _widened(flags: OptFlags, block_n: int, keep_block_m: bool) -> OptFlags:
    """``flags`` with ``block_n`` columns, and more warps (up to 8), then fewer rows (unless ``keep_block_m``), where
    a thread would hold more accumulator elements than the heuristic's tile gave it and more than 64. (From the
    register count, not measured on a GPU: 2026-12-07.)"""
    budget = max(64, flags.block_m * flags.block_n // (32 * flags.num_warps))
    block_m, num_warps = flags.block_m, flags.num_warps
    while block_m * block_n // (32 * num_warps) > budget and (num_warps < 8 or not keep_block_m and block_m > 16):
        num_warps, block_m = (num_warps * 2, block_m) if num_warps < 8 else (num_warps, block_m // 2)
    return replace(flags, block_m=block_m, block_n=block_n, num_warps=num_warps, **_MEASURED_FOR_ITS_TILE)


def _check_applicable(flags: OptFlags, p: TileProblem, operands: tuple) -> None:
    """Raise InapplicableConstraintError where the (constrained) flags do not fit the call."""
    if (problem := _tile_problem(flags, *operands)) is not None:
        raise InapplicableConstraintError(problem)
    for tile in flags.fallback_tiles:  # only ever asked for: the heuristic's tiles wait instead
        if (problem := _tile_problem(flags.fallback(tile), *operands)) is not None:
            raise InapplicableConstraintError(f"fallback tile {tile}: {problem}")
    if p.bitwise_invariant and flags.fallback_tiles:
        raise InapplicableConstraintError("precision_config.enforce_bitwise_invariance keeps one tile's arithmetic for "
                                     "every shape, and a fallback tile would change it; drop fallback_tiles")
    if p.bitwise_invariant and (flags.block_m != 128 or flags.split_k != 1):
        raise InapplicableConstraintError("precision_config.enforce_bitwise_invariance fixes block_m=128 and split_k=1; "
                                     "drop the conflicting opt_flags_constraints")
    if flags.persistent and p.persistent_blocker is not None:
        raise InapplicableConstraintError(f"persistent=True: {p.persistent_blocker}")
    if flags.wait_mma and p.w_mx_layout is None and not p.x_mx:
        raise InapplicableConstraintError("wait_mma=True applies to mx weights or activations (upcast in registers) "
                                          "only; drop it")
    if flags.swap_ab and not p.k_group:
        raise InapplicableConstraintError("swap_ab=True applies to fp8 weights with 128 x 128 block scales "
                                          "(fp8e4m3_b128) only; drop it")
    if flags.persistent and flags.split_k > 1:
        raise InapplicableConstraintError("the persistent kernel does not split K; use split_k=1 with persistent=True")
    if flags.split_k > 1 and not p.can_split:
        raise InapplicableConstraintError(f"split_k={flags.split_k} cannot be combined with y_acc_in, a scatter of one "
                                     f"expert per token, or a scatter with a fused activation; use split_k=1")
    if p.n_expts is not None and flags.block_m not in BLOCK_SIZES:
        raise InapplicableConstraintError(f"block_m={flags.block_m}: ragged rows need block_m in {BLOCK_SIZES} "
                                     f"(the sizes the routing metadata is computed for)")


def _tile_problem(flags: OptFlags, itemsize: int, reduction_n: int, w_mx_layout: str | None,
                  y_scale_block: int, k_group: int = 0, x_mx: bool = False, scale_block_k: int = MX_BLOCK
                  ) -> str | None:
    """Why the operands cannot take this tile's block sizes, or None."""
    if y_scale_block and (flags.block_n // reduction_n) % y_scale_block:
        return (f"block_n={flags.block_n}: an output with a scale per {y_scale_block} columns needs block_n // "
                f"reduction_n to be a multiple of {y_scale_block}")
    # The persistent kernel's epilogue works on column halves, stored by TMA in boxes of at least 16 bytes.
    if flags.persistent and flags.block_n // 2 // reduction_n < 8:
        return (f"block_n={flags.block_n}: the persistent kernel stores half tiles of at least 8 output columns, "
                f"so block_n must be at least {16 * reduction_n}")
    if flags.persistent and y_scale_block and (flags.block_n // 2 // reduction_n) % y_scale_block:
        return (f"block_n={flags.block_n}: the persistent kernel stores half tiles, and an output with a scale per "
                f"{y_scale_block} columns needs block_n // 2 // reduction_n to be a multiple of {y_scale_block}")
    if x_mx and flags.block_k % scale_block_k:
        return (f"block_k={flags.block_k}: mx activations carry one scale per {scale_block_k} values of K, so "
                f"block_k must be a multiple of {scale_block_k}")
    if itemsize == 1 and flags.block_k < 32:
        return f"block_k={flags.block_k}: an fp8 dot needs block_k >= 32"
    if k_group and k_group % flags.block_k:
        return (f"block_k={flags.block_k}: fp8 block scales cover {k_group} rows of K, which each K step must stay "
                f"inside, so block_k must divide {k_group}")
    swizzled = w_mx_layout not in (None, "strided")
    if swizzled and flags.block_k % 64:
        return (f"block_k={flags.block_k}: {w_mx_layout}-layout mxfp4 weights come in groups of 64 rows of K, so "
                f"block_k must be a multiple of 64")
    if swizzled and flags.block_n % 16:
        return (f"block_n={flags.block_n}: {w_mx_layout}-layout mxfp4 weights come in slabs of 16 columns of N, so "
                f"block_n must be a multiple of 16")
    if w_mx_layout == "hopper_fp8" and flags.block_n * flags.block_k < 256 * flags.num_warps:
        # On an H100 (Triton 3.6, 2026-12-07) 16 x 64 W tiles on 8 warps converted wrong values: with fewer words
        # than threads Triton spreads a word's bytes over several threads, and the packed conversion reads them.
        return (f"block_n={flags.block_n}, block_k={flags.block_k}, num_warps={flags.num_warps}: hopper_fp8-layout "
                f"mxfp4 weights give each thread whole 4-byte words, so block_n * block_k must be at least "
                f"{256 * flags.num_warps} (256 per warp); take a wider tile or fewer warps")
    if w_mx_layout is not None and flags.block_k < MX_BLOCK:  # (scale blocks of 16: NVFP4)
        # On an H100 (Triton 3.6, 2026-12-06) 16-deep K steps of NVFP4 weights gave wrong results at block_m=16,
        # block_n=32 (mma.sync), from an upcast that is exact alone: docs/formats.md, "NVFP4 weights".
        return (f"block_k={flags.block_k}: weights upcast in registers need block_k >= {MX_BLOCK} (a 16-deep K step "
                f"of them computes wrong results on the GPU)")
    if w_mx_layout is not None and flags.block_k % scale_block_k:
        return (f"block_k={flags.block_k}: mx weights carry one scale per {scale_block_k} rows of K, so block_k must "
                f"be a multiple of {scale_block_k}")
    if flags.block_n % reduction_n:
        return f"block_n={flags.block_n} must be a multiple of the activation's reduction_n ({reduction_n})"
    return None
