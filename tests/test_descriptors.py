"""Ragged TMA descriptors: accesses clipped at a slice's end, wherever the slice starts."""
import pytest
import torch
import triton
import triton.language as tl

from ogsgen.runtime.descriptors import RAGGED_ROWS_BOUND, ragged_rows_descriptor


@triton.jit
def _copy_block(Src, Dst, Loaded, slice_end, row, col, BOUND: tl.constexpr, ROWS: tl.constexpr,
                COLS: tl.constexpr):
    # The kernels' coordinates (templates/_matmul_persistent.py.jinja): rows row.. of the slice ending at slice_end.
    block = Src.load([BOUND, slice_end, BOUND - slice_end + row, col]).reshape(ROWS, COLS)
    offs = tl.arange(0, ROWS)[:, None] * COLS + tl.arange(0, COLS)[None, :]
    tl.store(Loaded + offs, block)
    Dst.store([BOUND, slice_end, BOUND - slice_end + row, col], (block + 1.0).reshape(1, 1, ROWS, COLS))


@pytest.mark.parametrize("slice_end,row", [(13, 8), (16, 0), (40, 33), (5, 0)])
def test_a_ragged_block_stops_at_its_slice_end(slice_end, row, device):
    if device == "cuda" and torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("TMA needs compute capability 9.0")
    rows, cols = 41, 24
    src = torch.randn(rows, cols, device=device)
    dst = torch.full((rows, cols), float("nan"), device=device)
    loaded = torch.empty(8, 16, device=device)
    _copy_block[(1,)](ragged_rows_descriptor(src, 8, 16), ragged_rows_descriptor(dst, 8, 16), loaded, slice_end, row,
                      8, BOUND=RAGGED_ROWS_BOUND, ROWS=8, COLS=16)
    inside = max(0, min(8, slice_end - row))  # block rows before the slice's end
    expected = torch.zeros(8, 16, device=device)
    expected[:inside] = src[row:row + inside, 8:24]
    assert torch.equal(loaded, expected), "rows past the slice's end load as zeros, the others as stored"
    written = torch.full((rows, cols), float("nan"), device=device)
    written[row:row + inside, 8:24] = src[row:row + inside, 8:24] + 1.0
    assert torch.equal(dst.nan_to_num(-7.0), written.nan_to_num(-7.0)), "only the slice's rows are stored"


def test_a_ragged_descriptor_names_its_row_limit():
    huge = torch.empty(1, 8).expand(RAGGED_ROWS_BOUND, 8)
    with pytest.raises(ValueError, match="fewer than 1073741824 rows"):
        ragged_rows_descriptor(huge, 8, 8)
