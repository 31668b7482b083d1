"""Ragged (expert-sorted) row metadata, computed on the device without host synchronization.

For a histogram ``hist`` (rows per expert) and each block size ``bs`` in ``BLOCK_SIZES``:

* ``slice_offs``  = ``[0, cumsum(hist)]``: where each expert's rows start;
* ``block_offs(bs)`` = ``[0, cumsum(cdiv(hist, bs))]``: where each expert's row tiles start;
* ``block_schedule(bs)``: for tile ``j < block_offs(bs)[E]`` the packed int64 entry ``(block << 16) | expert``
  (expert-major, block-minor), and -1 for the idle tiles after it. Its length is a host-side upper
  bound of the tile count, so a kernel grid can be sized without reading ``hist`` back.

Limits: at most 65,536 experts (16 bits of the entry) and fewer than 2**31 rows (int32 histograms and indices).
The kernels assert on the device that the histogram has no negative count and sums to at most the rows bound
given (a histogram that does not describe the call's rows would otherwise send tiles past them).

Example: hist [15, 17, 0, 127], bs 16: slice_offs [0, 15, 32, 32, 159], block_offs [0, 1, 3, 3, 11],
schedule (e0,b0) (e1,b0) (e1,b1) (e3,b0) ... (e3,b7), then -1.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ..devices import check_kernel_device
from ..errors import SpecError

BLOCK_SIZES = (16, 32, 64, 128)
MAX_EXPERTS = 1 << 16  # the packed entry keeps the expert in 16 bits (and the block index in the 47 above them)
MAX_ROWS = (1 << 31) - 1  # histograms, offsets and the gather/scatter indices are int32
_ENTRY_BYTES = 8  # int64 schedule entries


def max_n_tiles(n_expts_tot: int, n_rows: int) -> int:
    """Upper bound of the row tiles over all experts for the smallest block size, rounded up to a multiple of
    16 bytes' entries: each block size's schedule row then starts 16-byte aligned, as the matmul kernels are compiled to
    expect (an unaligned row would make Triton compile another specialization)."""
    bound = n_rows if n_rows <= n_expts_tot else triton.cdiv(n_rows - n_expts_tot + 1, BLOCK_SIZES[0]) + n_expts_tot - 1
    per_16_bytes = 16 // _ENTRY_BYTES
    return triton.cdiv(bound, per_16_bytes) * per_16_bytes


@dataclass
class RaggedTensorMetadata:
    slice_sizes: torch.Tensor          # (E,) int32, the histogram
    slice_offs: torch.Tensor           # (E + 1,) int32
    block_offs_data: torch.Tensor      # (len(BLOCK_SIZES), E + 1) int32
    block_schedule_data: torch.Tensor  # (len(BLOCK_SIZES), max_n_tiles) int64

    @staticmethod
    def _row(block_size: int) -> int:
        if block_size not in BLOCK_SIZES:
            raise SpecError(f"block_size must be one of {BLOCK_SIZES}, got {block_size}")
        return BLOCK_SIZES.index(block_size)

    def block_offs(self, block_size: int) -> torch.Tensor:
        return self.offs_rows()[self._row(block_size)]

    def block_schedule(self, block_size: int) -> torch.Tensor:
        return self.schedule_rows()[self._row(block_size)]

    def offs_rows(self) -> tuple[torch.Tensor, ...]:
        """``block_offs`` of every block size (see ``_rows_of``)."""
        return self._rows_of("block_offs_data")

    def schedule_rows(self) -> tuple[torch.Tensor, ...]:
        """``block_schedule`` of every block size (see ``_rows_of``)."""
        return self._rows_of("block_schedule_data")

    def _rows_of(self, field: str) -> tuple[torch.Tensor, ...]:
        """The rows of a per-block-size tensor, as views made once per tensor: indexing costs microseconds on
        every call, and launch plans find a call's views by identity."""
        data = getattr(self, field)
        cached = self.__dict__.get("_rows_" + field)
        if cached is None or cached[0] is not data:
            cached = (data, data.unbind(0))
            self.__dict__["_rows_" + field] = cached
        return cached[1]


# Gate, expert and tile counts vary from call to call (and model to model): not specialized on, so that
# one binary per BLOCK_E serves them all (and ogsgen warmup covers them). debug=True keeps the device asserts, which
# check the routing on the GPU without a host synchronization (a failed one is a CUDA error at the next
# synchronization, with the message printed on stderr).
@triton.jit(do_not_specialize=["n_gates", "n_expts_tot"], debug=True)
def _expert_histogram(ExptIndx, Hist, n_gates, n_expts_tot, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    expert = tl.load(ExptIndx + offs, mask=offs < n_gates, other=-1)
    tl.device_assert((expert >= -1) & (expert < n_expts_tot),
                     "ogsgen routing: an expert id is outside [-1, n_expts_tot) (-1 marks a dropped gate)")
    # -1 marks a dropped (or non-local) gate: it belongs to no expert. (The bound also keeps an id that failed the
    # assert from counting outside Hist.)
    valid = (expert >= 0) & (expert < n_expts_tot)
    tl.atomic_add(Hist + tl.where(valid, expert, 0), 1, mask=valid, sem="relaxed")


@triton.jit(do_not_specialize=["n_expts_tot", "n_tiles", "n_rows"], debug=True)
def _ragged_metadata(Hist, SliceOffs, BlockOffs, BlockSchedule, n_expts_tot, n_tiles, n_rows,
                     BLOCK_E: tl.constexpr, BLOCK_T: tl.constexpr, SMALLEST_BLOCK: tl.constexpr):
    # Program (j, i): schedule entries [j * BLOCK_T, (j + 1) * BLOCK_T) of block size SMALLEST_BLOCK << i. The
    # experts are read BLOCK_E at a time (running sums carried over), so that the compiled kernel's size does not grow
    # with the expert count (a tile of every expert at once took minutes to compile at 65,536 experts).
    size_row = tl.program_id(1)
    block_size = SMALLEST_BLOCK << size_row
    writes_offsets = tl.program_id(0) == 0
    offs_row = BlockOffs + size_row * (n_expts_tot + 1)
    tiles = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    # The expert of tile t is the number of experts whose tiles all end at or before t; its first tile is the
    # largest of those ends (0 if none).
    expert = tl.zeros([BLOCK_T], dtype=tl.int32)
    start = tl.zeros([BLOCK_T], dtype=tl.int32)
    rows_before = tl.zeros([], dtype=tl.int64)
    blocks_before = tl.zeros([], dtype=tl.int32)
    for first in range(0, n_expts_tot, BLOCK_E):
        experts = first + tl.arange(0, BLOCK_E)
        hist = tl.load(Hist + experts, mask=experts < n_expts_tot, other=0)
        tl.device_assert(hist >= 0, "ogsgen routing: the expert histogram has a negative count")
        n_blocks = (hist + block_size - 1) // block_size
        blocks_end = blocks_before + tl.cumsum(n_blocks, 0)
        if writes_offsets:
            tl.store(offs_row + experts + 1, blocks_end, mask=experts < n_expts_tot)
            if size_row == 0:
                tl.store(SliceOffs + experts + 1, rows_before.to(tl.int32) + tl.cumsum(hist, 0),
                         mask=experts < n_expts_tot)
        ends_before = (blocks_end[None, :] <= tiles[:, None]) & (experts < n_expts_tot)[None, :]
        expert += tl.sum(ends_before.to(tl.int32), axis=1)
        start = tl.maximum(start, tl.max(tl.where(ends_before, blocks_end[None, :], 0), axis=1))
        rows_before += tl.sum(hist.to(tl.int64), 0)
        blocks_before += tl.sum(n_blocks, 0)
    tl.device_assert(rows_before <= n_rows, "ogsgen routing: the expert histogram sums to more rows than the call has")
    if writes_offsets:
        tl.store(offs_row, 0)
        if size_row == 0:
            tl.store(SliceOffs, 0)
    entry = tl.where(expert < n_expts_tot, ((tiles - start).to(tl.int64) << 16) | expert, -1)
    tl.store(BlockSchedule + size_row.to(tl.int64) * n_tiles + tiles, entry, mask=tiles < n_tiles)


def expert_histogram(expt_indx: torch.Tensor, n_expts_tot: int) -> torch.Tensor:
    """Rows per expert of a flat integer expert-id tensor (-1 = dropped), on the device, without a sync. An id
    outside [-1, n_expts_tot) fails a device assert (the caller checks ids on the host where that is free)."""
    check_kernel_device(expt_indx, "the expert ids")
    hist = torch.zeros(n_expts_tot, dtype=torch.int32, device=expt_indx.device)
    n_gates = expt_indx.numel()
    if n_gates:
        block = 1024
        _expert_histogram[(triton.cdiv(n_gates, block),)](expt_indx, hist, n_gates, n_expts_tot, BLOCK=block)
    return hist


def check_row_count(n_rows: int, what: str) -> None:
    """Refuse a call of more rows than the int32 histograms and indices hold."""
    if n_rows > MAX_ROWS:
        raise SpecError(f"{what} is {n_rows} rows (gates); ogsgen's routing holds at most {MAX_ROWS} (int32 "
                        f"histograms and indices): split the call into fewer tokens")


def metadata_blocks(n_expts_tot: int) -> dict[str, int]:
    """The metadata kernel's tile: up to 1024 experts at a time, and as many schedule entries as keep the
    (entries x experts) comparison at 16K elements."""
    block_e = max(16, min(1024, triton.next_power_of_2(n_expts_tot)))
    return dict(BLOCK_E=block_e, BLOCK_T=max(16, min(128, 16384 // block_e)))


def make_ragged_tensor_metadata(hist: torch.Tensor, n_rows: int) -> RaggedTensorMetadata:
    """Device metadata of ``hist`` (int32, (E,)) for ``n_rows`` rows at most (the host-side bound)."""
    check_kernel_device(hist, "hist")
    n_expts_tot = hist.shape[0]
    if n_expts_tot > MAX_EXPERTS:
        raise SpecError(f"hist has {n_expts_tot} experts; the packed block schedule holds at most {MAX_EXPERTS}")
    check_row_count(n_rows, "n_rows")
    n_tiles = max_n_tiles(n_expts_tot, n_rows)
    device = hist.device
    slice_offs = torch.empty(n_expts_tot + 1, dtype=torch.int32, device=device)
    block_offs = torch.empty(len(BLOCK_SIZES), n_expts_tot + 1, dtype=torch.int32, device=device)
    schedule = torch.empty(len(BLOCK_SIZES), n_tiles, dtype=torch.int64, device=device)
    blocks = metadata_blocks(n_expts_tot)
    grid = (max(1, triton.cdiv(n_tiles, blocks["BLOCK_T"])), len(BLOCK_SIZES))
    _ragged_metadata[grid](hist, slice_offs, block_offs, schedule, n_expts_tot, n_tiles, n_rows, **blocks,
                           SMALLEST_BLOCK=BLOCK_SIZES[0])
    return RaggedTensorMetadata(hist, slice_offs, block_offs, schedule)


def make_ragged_tensor_metadata_torch(hist: torch.Tensor, n_rows: int) -> RaggedTensorMetadata:
    """Reference implementation (synchronizes; for tests)."""
    n_expts_tot = hist.shape[0]
    n_tiles = max_n_tiles(n_expts_tot, n_rows)
    zero = torch.zeros(1, dtype=torch.int32, device=hist.device)
    slice_offs = torch.cat([zero, torch.cumsum(hist, 0).int()])
    offs_rows, schedule_rows = [], []
    for block_size in BLOCK_SIZES:
        n_blocks = (hist + block_size - 1) // block_size
        offs_rows.append(torch.cat([zero, torch.cumsum(n_blocks, 0).int()]))
        experts = torch.repeat_interleave(torch.arange(n_expts_tot, device=hist.device), n_blocks.long())
        blocks = torch.cat([torch.arange(int(n), device=hist.device) for n in n_blocks.tolist()] or [zero[:0]])
        schedule = torch.full((n_tiles,), -1, dtype=torch.int64, device=hist.device)
        schedule[:experts.numel()] = (blocks.long() << 16) | experts
        schedule_rows.append(schedule)
    return RaggedTensorMetadata(hist, slice_offs, torch.stack(offs_rows), torch.stack(schedule_rows))


def routing_metadata(expt_indx: torch.Tensor, n_expts_tot: int, n_rows: int) -> tuple[torch.Tensor, torch.Tensor,
                                                                                      torch.Tensor, torch.Tensor]:
    """(histogram, slice_offs, block_offs_data, block_schedule_data) of flat expert ids (-1: dropped): routing's
    kernels, which the custom op ``ogsgen::routing_metadata`` (ogsgen.ops.custom_ops) runs, so that torch.compile
    traces them as one node (routing's other steps are torch's)."""
    hist = expert_histogram(expt_indx, n_expts_tot)
    meta = make_ragged_tensor_metadata(hist, n_rows)
    return hist, meta.slice_offs, meta.block_offs_data, meta.block_schedule_data


def routing_metadata_fake(expt_indx, n_expts_tot, n_rows):
    new = expt_indx.new_empty
    return (new(n_expts_tot, dtype=torch.int32), new(n_expts_tot + 1, dtype=torch.int32),
            new((len(BLOCK_SIZES), n_expts_tot + 1), dtype=torch.int32),
            new((len(BLOCK_SIZES), max_n_tiles(n_expts_tot, n_rows)), dtype=torch.int64))
