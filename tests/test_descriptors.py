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


@pytest.mark.parametrize("k_contiguous", [True, False])
def test_a_k_contiguous_w_asks_for_256_byte_l2_promotion(k_contiguous, device, monkeypatch):
    """Its tile rows are 128 bytes along K, the next K step's in the next 128: the persistent kernel's W descriptor
    asks for 256-byte L2 promotion (honoured where ogsgen encodes descriptors: Triton 3.6 on the GPU)."""
    import ogsgen
    from ogsgen.runtime import descriptors, launcher

    seen = []
    launch = launcher.launch

    def spy(kernel, grid, args, *rest, **options):
        seen.extend(value for name, value in args.items() if name == "WDesc")
        return launch(kernel, grid, args, *rest, **options)
    monkeypatch.setattr(launcher, "launch", spy)
    torch.manual_seed(0)
    if device == "cuda" and torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("the persistent kernel needs TMA")
    x = torch.randn(20, 64, device=device).bfloat16()
    w = (torch.randn(2, 48, 64, device=device).bfloat16().mT if k_contiguous
         else torch.randn(2, 64, 48, device=device).bfloat16())
    rd, gi, _ = ogsgen.routing(torch.randn(20, 2, device=device), 2)
    with ogsgen.opt_flags_constraints(persistent=True, block_m=16, block_n=32, block_k=32, num_warps=4,
                                      num_stages=2):
        y = ogsgen.matmul_ogs(x, w, None, rd, gather_indx=gi)
    torch.testing.assert_close(y.float(), ogsgen.matmul_ogs_torch(x, w, None, rd, gather_indx=gi).float(),
                               atol=2e-2, rtol=2e-2)
    assert len(seen) == 1
    expected = descriptors._L2_PROMOTION_256B if k_contiguous else None
    assert getattr(seen[0], "l2_promotion", None) == expected


def test_without_a_reachable_driver_library_triton_s_maps_stand(monkeypatch):
    """The L2 promotion is a hint: where libcuda cannot be opened by its name, the map Triton encoded is used as
    it is, and the launch goes on."""
    import ctypes

    from ogsgen.runtime import descriptors

    def unreachable(name, *args, **kwargs):
        raise OSError(f"{name}: cannot open shared object file")
    monkeypatch.setattr(ctypes, "CDLL", unreachable)
    encoder = descriptors._TensorMapEncoder()
    meta = dict(elem_size=2, block_size=[1, 256, 64], swizzle=3)
    assert not encoder.promote(object(), 0, 10, meta, [8, 1024, 512], [524288, 512, 1], False,
                               descriptors._L2_PROMOTION_256B)
