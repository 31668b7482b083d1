"""The launch-parameter heuristic's choices that measurements on the H200 fixed (bench/results/*-probes)."""
import itertools

import pytest

from ogsgen.errors import InapplicableConstraintError
from ogsgen.runtime.opt_flags import TileProblem, make_opt_flags


def _gpt_oss_w1(itemsize, rows_per_expert, w_mx_layout=None):
    # gpt-oss w1: 128 experts, N=5760, K=2880, on 132 SMs
    return make_opt_flags(TileProblem(itemsize, 1, rows_per_expert * 128, 5760, 2880, 1, 128, rows_per_expert, True, 132,
                          w_mx_layout))


def test_decode_tiles_of_16_bit_weights_take_two_warpgroups():
    # 16x128 tiles of bf16/fp16 weights stream W faster with 8 warps (T=1 15% faster on gpt-oss).
    assert (lambda f: (f.block_m, f.block_n, f.block_k, f.num_warps))(_gpt_oss_w1(2, 1)) == (16, 128, 64, 8)
    assert _gpt_oss_w1(4, 1).num_warps == 4  # fp32: not measured, unchanged
    assert _gpt_oss_w1(2, 32).num_warps == 4  # 32-row tiles: unchanged


def _qwen3_w1(tokens, k_major=False):
    # Qwen3-30B-A3B w1: 128 experts, top-8, N=1536, K=2048, gathered x
    rows = 8 * tokens
    return make_opt_flags(TileProblem(2, 1, rows, 1536, 2048, 1, 128, max(1, rows // 128), True, 132, x_gathered=True,
                          w_k_major=k_major))


def test_decode_tiles_of_n_contiguous_moe_weights_step_128_deep_where_k_divides_or_one_wave_holds_them():
    # bench/results/2026-12-03i-decode (after the x-row mask): Qwen3-30B-A3B w1 T=1 14.0 -> 11.7 us, T=8 87.9 -> 80.0
    # (K = 2048); gpt-oss w2 T=1 (92 tiles on 132 SMs) 22.9 -> 20.8; gpt-oss w1 T=1 (K = 2880, 180 tiles) keeps two
    # warpgroups 64 deep (33.5 against 36.5 us)
    def tile(flags):
        return flags.block_m, flags.block_n, flags.block_k, flags.num_warps, flags.num_stages
    assert tile(_qwen3_w1(1)) == tile(_qwen3_w1(8)) == (16, 128, 128, 4, 4)
    assert tile(_gpt_oss_w1(2, 1)) == (16, 128, 64, 8, 4)
    dense = make_opt_flags(TileProblem(2, 1, 8, 1536, 2048, 1, None, 0, True, 132))
    assert (dense.block_k, dense.num_warps) == (64, 8)  # dense calls: not measured, unchanged


def test_sixteen_to_31_rows_per_expert_take_32_row_tiles():
    # Qwen3-30B-A3B w1 T=256 (16 rows per expert): 205.7 us in 16-row tiles, 186.2 in 32x128x64x4x4
    # (bench/results/2026-12-03i-decode); about half the experts spill into a second 16-row tile
    assert _tile(_qwen3_w1(256))[:5] == (32, 128, 64, 4, 4)
    assert _qwen3_w1(128).block_m == 16  # 8 rows per expert
    assert _gpt_oss_w1(2, 32).block_m == 32
    assert _gpt_oss_w1(2, 16, "hopper").block_m == 16  # mxfp4: not measured, unchanged


def test_decode_tiles_of_k_contiguous_16_bit_moe_weights_take_128_deep_k_steps():
    # bench/results/2026-12-03c-kmajor: K-contiguous W at T=32, 16x128x128 with 4 warps 618 against 645 us
    # (gpt-oss w1) and 2193 against 2376 (DeepSeek-V3 w1) for the N-contiguous tile.
    k_major = make_opt_flags(TileProblem(2, 1, 128, 5760, 2880, 1, 128, 1, True, 132, w_k_major=True))
    assert (k_major.block_m, k_major.block_n, k_major.block_k, k_major.num_warps, k_major.num_stages) == \
        (16, 128, 128, 4, 4)
    assert _tile(_gpt_oss_w1(2, 1))[:4] == (16, 128, 64, 8)  # N-contiguous: unchanged
    dense = make_opt_flags(TileProblem(2, 1, 8, 5760, 2880, 1, None, 0, True, 132, w_k_major=True))
    assert (dense.block_k, dense.num_warps) == (64, 8)  # dense calls: not measured, unchanged


def test_32_row_tiles_of_k_contiguous_16_bit_moe_weights_take_128_deep_k_steps():
    # K-contiguous, 16-32 rows per expert (bench/results/2026-12-04d-tiles, in turn): 32x128x128x4x3 against
    # 32x128x64x4x4 Qwen3-30B-A3B w1 T=256 194.1 / 202.4 us, gpt-oss w1 T=512 1008.0 / 1037.6, gpt-oss w2 T=512
    # 514.9 / 542.8, DeepSeek-V3 w1 T=512 3424.2 / 3671.0 (4 stages: 2-5% slower than 3). N-contiguous keeps 64 deep
    # (the 128-deep tile 1-2% slower on four of five cases).
    assert _tile(_qwen3_w1(256, k_major=True))[:5] == (32, 128, 128, 4, 3)
    assert _tile(_qwen3_w1(256))[:5] == (32, 128, 64, 4, 4)
    dense = make_opt_flags(TileProblem(2, 1, 32, 1536, 2048, 1, None, 0, True, 132, w_k_major=True))
    assert dense.block_k == 64  # dense calls: not measured, unchanged


def test_k_contiguous_decode_tiles_take_64_columns_where_128_leave_the_last_wave_mostly_idle():
    # gpt-oss w1 T=1 K-contiguous (4 rows: 180 tiles of 128 columns on 132 SMs, wave fill 0.68; 360 of 64, 0.91):
    # 16x64x128x4x4 35.1-36.1 us against 38.1-38.5 for 16x128x128x4x4, in two sweeps; at T=8 and 32 (1440 and 5760
    # tiles) the two within 1%; gpt-oss w2 T=8 (736 tiles, fill 0.93) 114.8 against 108.9 and Qwen3-30B-A3B w1 T=1
    # (96 tiles, one wave either way) 13.3 against 12.7 keep 128 (bench/results/2026-12-03i-decode and
    # 2026-12-03k-train)
    def k_major(m, n, k, n_expts):
        return make_opt_flags(TileProblem(2, 1, m, n, k, 1, n_expts, 1, True, 132, x_gathered=True, w_k_major=True))
    assert _tile(k_major(4, 5760, 2880, 128))[:5] == (16, 64, 128, 4, 4)
    assert k_major(32, 5760, 2880, 128).block_n == 128  # gpt-oss w1 T=8
    assert k_major(32, 2880, 2880, 128).block_n == 128  # gpt-oss w2 T=8
    assert k_major(4, 2880, 2880, 128).block_n == 128  # gpt-oss w2 T=1
    assert k_major(8, 1536, 2048, 128).block_n == 128  # Qwen3-30B-A3B w1 T=1
    assert _tile(_gpt_oss_w1(2, 1))[:4] == (16, 128, 64, 8)  # N-contiguous: unchanged


def _tile(flags):
    return flags.block_m, flags.block_n, flags.block_k, flags.num_warps, flags.num_stages, flags.wait_mma


def test_hopper_mxfp4_decode_tiles_follow_k():
    # K=2880 (gpt-oss) has a 64-row tail at 128-row K steps: with about one row per expert, 64-row steps, 8
    # warps, waiting (bench/results/2026-12-01j-probes); more rows, or K=7168 (DeepSeek-V3), keep 16x128x128.
    assert _tile(_gpt_oss_w1(2, 1, "hopper")) == (16, 128, 64, 8, 4, True)
    assert _tile(_gpt_oss_w1(2, 8, "hopper")) == (16, 128, 128, 4, 3, False)
    deepseek = make_opt_flags(TileProblem(2, 1, 64, 4096, 7168, 1, 256, 1, True, 132, "hopper"))
    assert _tile(deepseek) == (16, 128, 128, 4, 3, False)
    assert _tile(_gpt_oss_w1(2, 32, "hopper")) == (32, 128, 128, 4, 3, False)  # 32-row tiles: unchanged


def _dense_bf16(m, n, k, tma=True):
    return make_opt_flags(TileProblem(2, 1, m, n, k, 1, None, 0, True, 132,
                          persistent_blocker=None if tma else "the persistent kernel needs TMA"))


def test_dense_16_bit_calls_that_leave_sms_idle_take_persistent_64_row_tiles():
    # bench/results/2026-12-02c-probes/tile_sweep_bf16_dense_small_m.csv
    def tile(flags):
        return flags.block_m, flags.block_n, flags.block_k, flags.num_warps, flags.num_stages, flags.split_k
    narrow, wide = (64, 64, 128, 4, 4, 1), (64, 128, 128, 4, 4, 1)
    assert tile(_dense_bf16(64, 5760, 2880)) == narrow      # 45 tiles of 64x128: under half of 132 SMs
    assert tile(_dense_bf16(128, 5760, 2880)) == wide       # 90
    assert tile(_dense_bf16(128, 2880, 5760)) == narrow     # 45
    assert tile(_dense_bf16(64, 4096, 7168)) == narrow      # 32
    assert tile(_dense_bf16(100, 8192, 2880)) == wide       # 128
    assert tile(_dense_bf16(512, 5760, 2880)) == wide       # 360
    # 16 and 32 rows keep their tiles; calls whose wide tiles fill the GPU take 128-row tiles (below)
    for m, n, k in ((16, 5760, 2880), (32, 5760, 2880)):
        assert not _dense_bf16(m, n, k).persistent
    assert tile(_dense_bf16(512, 16384, 2880))[:2] == (128, 256)
    # Without TMA, the tiled kernel, split in K as before
    assert not _dense_bf16(64, 5760, 2880, tma=False).persistent
    assert _dense_bf16(64, 5760, 2880, tma=False).split_k == 2


def test_dense_16_bit_calls_of_128_row_tiles_take_the_persistent_tile_that_fills_its_waves():
    # bench/results/2026-12-02g-probes/tile_sweep_bf16_dense_waves*.csv: 128x256 tiles, unless 128x128 tiles
    # fill their last wave of 132 SMs over 1.15 times better
    def tile(m, n, k):
        flags = _dense_bf16(m, n, k)
        assert flags.persistent
        return flags.block_m, flags.block_n, flags.block_k, flags.num_warps, flags.num_stages
    wide, narrow = (128, 256, 64, 8, 3), (128, 128, 64, 8, 4)
    assert tile(640, 4096, 7168) == wide      # 80 wide tiles, under a wave (was tiled 128x128: 93.6 -> 73.6 us)
    assert tile(1000, 4096, 7168) == wide     # 128, one wave
    assert tile(640, 5760, 2880) == wide      # 115 (87% of a wave) against 225 (85% of two)
    assert tile(768, 5760, 2880) == narrow    # 138 (52% of two waves) against 270 (68% of three): 60.2 -> 53.4
    assert tile(1024, 5760, 2880) == narrow   # 184 (70%) against 360 (91%)
    assert tile(1280, 5760, 2880) == wide     # 230 (87%) against 450 (85%)
    assert tile(1280, 4096, 7168) == narrow   # 160 (61%) against 320 (81%)
    assert tile(1536, 5760, 2880) == narrow   # 276 (70%) against 540 (82%): 1.17 times
    assert tile(2560, 5760, 2880) == wide     # 460 (87%) against 900 (97%): 1.12 times (144.6 against 150.6 us)
    for m, n, k in ((2048, 4096, 7168), (4096, 5760, 2880), (8192, 8192, 8192)):
        assert tile(m, n, k) == wide
    # Without TMA: the tiled kernel
    assert not _dense_bf16(768, 5760, 2880, tma=False).persistent


@pytest.mark.slow
def test_the_heuristic_never_picks_a_tile_its_own_checks_refuse():
    # Every combination of operands and shapes below gets flags without an InapplicableConstraintError (the checks
    # that tell a caller why a constrained tile cannot run).
    for itemsize, batch, m, n, reduction_n, n_expts, layout, y_scale_block, bitwise, persistent, n_sms in itertools.product(
            (1, 2, 4), (1, 3), (1, 16, 33, 64, 512, 768, 4096), (16, 200, 2880, 5760), (1, 2, 4, 8), (None, 128),
            (None, "strided", "hopper"), (0, 32, 128), (False, True), (False, True), (None, 132)):
        if n % reduction_n == 0 and not (layout and itemsize == 4):
            make_opt_flags(TileProblem(itemsize, batch, m, n, 2880, reduction_n, n_expts, max(1, m // (n_expts or m)), True,
                           n_sms, layout, bitwise, y_scale_block, persistent_blocker=None if persistent else "no TMA",
                           mx_scales_n_contiguous=layout is not None))


def test_the_heuristic_picks_block_k_of_32_for_fp8_dots_and_mx_weights_at_small_k():
    # A K under 32 (K=16 of a small MX or fp8 call) once gave block_k=16, which the heuristic's own checks refuse
    # (mx weights: one scale per 32 rows of K; an fp8 dot: block_k >= 32), for a call that constrained nothing.
    for itemsize, layout, k, m, n_expts in itertools.product((1, 2), (None, "strided", "hopper"), (1, 16, 17, 32, 2880),
                                                             (1, 16, 64), (None, 128)):
        if itemsize == 1 and layout is not None:
            continue
        flags = make_opt_flags(TileProblem(itemsize, 1, m, 32, k, 1, n_expts, max(1, m // (n_expts or m)), True, 132, layout,
                               mx_scales_n_contiguous=layout is not None))
        assert flags.block_k >= (16 if itemsize == 2 and layout is None else 32)


@pytest.mark.parametrize("m,reduction_n", [(64, 2), (768, 4), (128, 4), (4096, 8), (64, 1), (768, 2)])
def test_mx_outputs_get_a_tile_whose_stores_hold_whole_scale_groups(m, reduction_n):
    # An MX output keeps one scale per 32 columns; the persistent kernel stores half tiles, so its heuristic tiles
    # (64x64, 128x128, 128x256) suit some activations' reductions only. Where one would not, the heuristic
    # takes the tiled kernel (it was an InapplicableConstraintError error for a call that constrained nothing).
    flags = make_opt_flags(TileProblem(2, 1, m, 5760, 2880, reduction_n, None, 0, True, 132, y_scale_block=32,
                                       persistent_blocker=None))
    columns = flags.block_n // 2 if flags.persistent else flags.block_n
    assert (columns // reduction_n) % 32 == 0
    assert flags.persistent == (make_opt_flags(TileProblem(2, 1, m, 5760, 2880, 1, None, 0, True, 132,
                                               persistent_blocker=None)).block_n // 2 // reduction_n % 32 == 0)


def _gpt_oss_w2_bf16(tokens, x_gathered=False, tma=True):
    # gpt-oss w2 shapes: 128 experts, top-4, N=K=2880 (tokens_per_expt as matmul_ogs computes it: at least 1)
    rows = 4 * tokens
    return make_opt_flags(TileProblem(2, 1, rows, 2880, 2880, 1, 128, max(1, rows // 128), True, 132,
                          persistent_blocker=None if tma else "the persistent kernel needs TMA",
                          x_gathered=x_gathered))


def test_decode_rows_read_in_place_take_the_persistent_kernel():
    # Fewer rows than experts, x not gathered, at least 300 MB of W: 16x128x128 persistent, 4 warps, 4 stages
    # (bench/results/2026-12-02c-probes/tile_sweep_bf16_w2_decode_in_turn.csv)
    def tile(flags):
        return flags.block_m, flags.block_n, flags.block_k, flags.num_warps, flags.num_stages, flags.persistent
    assert tile(_gpt_oss_w2_bf16(8)) == (16, 128, 128, 4, 4, True)  # 32 rows: 531 MB of W at most
    # Less W than the eager call's host time hides (T=1, T=4), a row per expert or more, a gather (its copy comes
    # first), or no TMA: the tiled kernel's decode tile (at T=1 its 92 tiles fit in one wave: 128 deep in K)
    assert tile(_gpt_oss_w2_bf16(1)) == (16, 128, 128, 4, 4, False)
    for flags in (_gpt_oss_w2_bf16(4), _gpt_oss_w2_bf16(32), _gpt_oss_w2_bf16(8, x_gathered=True),
                  _gpt_oss_w2_bf16(8, tma=False)):
        assert tile(flags) == (16, 128, 64, 8, 4, False)


def test_asking_for_the_persistent_kernel_drops_the_heuristic_split_of_k():
    # 16 rows: the heuristic splits K in two (45 tiles); the persistent kernel does not split
    assert _dense_bf16(16, 5760, 2880).split_k == 2
    flags = make_opt_flags(TileProblem(2, 1, 16, 5760, 2880, 1, None, 0, True, 132, constraints=(("persistent", True),),
                           persistent_blocker=None))
    assert flags.persistent and flags.split_k == 1
    with pytest.raises(InapplicableConstraintError, match="does not split K"):
        make_opt_flags(TileProblem(2, 1, 16, 5760, 2880, 1, None, 0, True, 132, persistent_blocker=None,
                       constraints=(("persistent", True), ("split_k", 2))))


def test_asking_for_a_split_of_k_drops_the_heuristic_persistent_kernel():
    # gpt-oss w2 bf16 T=16 (64 rows on 128 experts, 1 GB of W): the persistent decode kernel, which does not split
    assert _gpt_oss_w2_bf16(16).persistent
    flags = make_opt_flags(TileProblem(2, 1, 64, 2880, 2880, 1, 128, 1, True, 132, constraints=(("split_k", 4),),
                           persistent_blocker=None))
    assert (flags.persistent, flags.split_k, flags.block_m) == (False, 4, 16)


def test_a_constrained_tile_the_persistent_kernel_cannot_store_drops_it():
    # Found by the GPU fuzzing: 33 x 130 x 256 bf16 with SwiGLU takes the persistent kernel; a forced 16x16x16 tile
    # leaves it half tiles of 4 output columns, under TMA's 16 bytes. Without persistent=True the tile runs tiled.
    assert make_opt_flags(TileProblem(2, 1, 33, 130, 256, 2, None, 0, True, 132, persistent_blocker=None)).persistent
    tile = (("block_k", 16), ("block_m", 16), ("block_n", 16))
    flags = make_opt_flags(TileProblem(2, 1, 33, 130, 256, 2, None, 0, True, 132, constraints=tile, persistent_blocker=None))
    assert (flags.persistent, flags.block_m, flags.block_n, flags.block_k) == (False, 16, 16, 16)
    with pytest.raises(InapplicableConstraintError, match="half tiles of at least 8 output columns"):
        make_opt_flags(TileProblem(2, 1, 33, 130, 256, 2, None, 0, True, 132, constraints=tile + (("persistent", True),),
                       persistent_blocker=None))


def _hopper_mxfp4(n, k, tokens, n_expts, top_k, scales_n_contiguous=True, constraints=(), split_is_free=False):
    rows = tokens * top_k
    return make_opt_flags(TileProblem(2, 1, rows, n, k, 1, n_expts, max(1, rows // n_expts), True, 132, "hopper",
                          constraints=constraints, mx_scales_n_contiguous=scales_n_contiguous,
                          split_is_free=split_is_free))


def test_hopper_mxfp4_tiles_with_n_contiguous_scales():
    # bench/results/2026-12-01k-probes: measured with scales N-contiguous (prepare_expert_weights' layout).
    def tile(flags):
        return _tile(flags)[:5] + (flags.maxnreg,)
    w1, w2, deepseek = (5760, 2880, 128, 4), (2880, 2880, 128, 4), (4096, 7168, 256, 8)
    narrow = (16, 128, 128, 4, 3, None)
    # Up to 16 rows per expert: 16x256 (bench/results/2026-12-02a-probes). In one wave of tiles it keeps its
    # wgmmas in flight with 128 registers; with more tiles than SMs it waits for each wgmma at 80 registers (3
    # CTAs per SM). Unless its tiles leave half the SMs idle.
    def waits_and_cap(flags):
        return tile(flags), flags.wait_mma
    pipelined, waiting = ((16, 256, 128, 8, 3, 128), False), ((16, 256, 128, 8, 3, 80), True)
    # One wave of 16x256 tiles (T=1): K split two ways, so that they fill two CTAs per SM (2026-12-02h-probes),
    # with 16 K steps of 128 or more where a top-k combine sums the splits anyway (w2), else 32 (w1).
    def split(flags):
        return waits_and_cap(flags), flags.split_k
    assert split(_hopper_mxfp4(w2[0], w2[1], 1, *w2[2:], split_is_free=True)) == (pipelined, 2)  # 4 x 12 tiles
    assert split(_hopper_mxfp4(deepseek[0], deepseek[1], 1, *deepseek[2:])) == (pipelined, 2)  # 8 x 16 tiles
    assert split(_hopper_mxfp4(w1[0], w1[1], 1, *w1[2:])) == (pipelined, 1)  # 4 x 23 tiles, 23 K steps
    # where K cannot split (one gate per token, an activation after a scatter, y_acc_in), the tiles of before
    unsplit = make_opt_flags(TileProblem(2, 1, 4, 2880, 2880, 1, 128, 1, False, 132, "hopper", mx_scales_n_contiguous=True,
                             split_is_free=True))
    assert (tile(unsplit), unsplit.split_k) == (narrow, 1)  # 4 experts x 12 tiles < 132 / 2
    assert _hopper_mxfp4(deepseek[0], deepseek[1], 1, *deepseek[2:], constraints=(("split_k", 1),)).split_k == 1
    # K of under 16 steps of 128 keeps one split; so does a tile per SM or more
    assert _hopper_mxfp4(w2[0], 1920, 1, *w2[2:], split_is_free=True).split_k == 1
    assert _hopper_mxfp4(w2[0], w2[1], 8, *w2[2:], split_is_free=True).split_k == 1
    for tokens in (8, 32, 64, 256):  # up to 8 rows per expert
        for shape in (w1, w2, deepseek):
            assert waits_and_cap(_hopper_mxfp4(shape[0], shape[1], tokens, *shape[2:])) == waiting, (shape, tokens)
    assert tile(_hopper_mxfp4(w1[0], w1[1], 1024, *w1[2:])) == (32, 128, 128, 4, 3, None)  # 32 rows per expert
    assert tile(_hopper_mxfp4(w1[0], w1[1], 2048, *w1[2:])) == (64, 256, 128, 8, 3, 120)
    assert tile(_hopper_mxfp4(w1[0], w1[1], 8192, *w1[2:])) == (128, 256, 128, 8, 4, None)
    # K-contiguous scales keep their own tiles
    assert _tile(_hopper_mxfp4(w1[0], w1[1], 8, *w1[2:], scales_n_contiguous=False)) == (16, 128, 64, 8, 4, True)
    assert _tile(_hopper_mxfp4(w1[0], w1[1], 2048, *w1[2:], scales_n_contiguous=False)) == (64, 256, 64, 8, 3,
                                                                                              False)


def test_a_constrained_tile_drops_the_heuristic_register_cap():
    def flags(constraints):
        return _hopper_mxfp4(5760, 2880, 2048, 128, 4, constraints=tuple(sorted(constraints.items())))
    assert flags({}).maxnreg == 120
    assert flags({"block_k": 64}).maxnreg is None  # the cap was measured for the heuristic's tile only
    assert flags({"block_k": 64, "maxnreg": 128}).maxnreg == 128
    assert flags({"split_k": 1}).maxnreg == 120  # not a tile key
    invariant = make_opt_flags(TileProblem(2, 1, 8192, 5760, 2880, 1, 128, 64, True, 132, "hopper", bitwise_invariant=True,
                               mx_scales_n_contiguous=True))
    assert (invariant.block_m, invariant.maxnreg) == (128, None)  # enforce_bitwise_invariance's 128-row tile


def test_a_constrained_tile_drops_the_heuristic_wait_for_each_wgmma():
    # gpt-oss w2 T=8: the heuristic's 16x256 tile waits at 80 registers; another tile asked for runs its own
    # binary (replaced by its waiting kernel only where that binary has the hazard) unless wait_mma is given.
    def flags(constraints):
        return _hopper_mxfp4(2880, 2880, 8, 128, 4, constraints=tuple(sorted(constraints.items())))
    assert (flags({}).wait_mma, flags({}).maxnreg) == (True, 80)
    assert (flags({"block_n": 128}).wait_mma, flags({"block_n": 128}).maxnreg) == (False, None)
    assert flags({"block_n": 128, "wait_mma": True}).wait_mma
    assert flags({"maxnreg": 96}).wait_mma  # not a tile key


def test_matmul_picks_hopper_tiles_by_the_scales_layout(monkeypatch, device):
    # 256 dense rows of hopper-layout mxfp4: 128x256x128 with N-contiguous scales, 64x256x64 with K-contiguous.
    import torch

    import ogsgen
    from ogsgen.numerics import quantize_mx_torch
    from ogsgen.numerics.layouts import swizzle_mx_values
    from ogsgen import devices
    from ogsgen.runtime import launcher

    launches = []
    monkeypatch.setattr(launcher, "launch", lambda kernel, grid, args, verify=None, compiling=None, **options:
                        launches.append((args["BLOCK_M"], args["BLOCK_N"], args["BLOCK_K"], options)))
    if device == "cpu":
        monkeypatch.setattr(devices, "interpreting", lambda: True)  # CPU tensors accepted; nothing runs
    values, scales = quantize_mx_torch(torch.randn(256, 256, device=device).mT.contiguous(), "e2m1", axis=-1)
    w = swizzle_mx_values(values.mT, capability=(9, 0))  # (scales: (N, K // 32))
    x = torch.randn(256, 256, device=device).bfloat16()
    for weight_scale in (scales.mT.contiguous(), scales.mT):
        ogsgen.matmul_ogs(x, w, None, precision_config=ogsgen.PrecisionConfig(weight_scale=weight_scale))
    assert launches[0][:3] == (128, 256, 128) and launches[0][3]["num_warps"] == 8
    assert launches[1][:3] == (64, 256, 64) and "maxnreg" not in launches[1][3]


def test_weight_gradient_products_take_wide_tiles():
    """Ragged-K products of 16-bit operands at weight-gradient sizes (measured on the H200:
    bench/results/2026-12-03m-inner): 32-row K steps take 128x128 tiles of one warpgroup, one program per tile;
    64- and 128-row ones 128x256 tiles, one program per SM looping over them. fp32 ones (bias gradients) and small
    ones keep the batched heuristic's, and constraints win."""
    from ogsgen.runtime.inner import inner_flags

    def tile(flags):
        return flags.block_m, flags.block_n, flags.block_k, flags.num_warps, flags.num_stages, flags.persistent
    assert tile(inner_flags(2, 128, 2880, 5760, 64, 32, 132)) == (128, 128, 32, 4, 3, False)
    assert tile(inner_flags(2, 128, 2880, 5760, 64, 64, 132)) == (128, 256, 64, 8, 3, True)
    assert tile(inner_flags(2, 128, 2880, 5760, 64, 128, 132)) == (128, 256, 128, 8, 2, True)  # two stages fit
    assert inner_flags(4, 128, 1, 5760, 64, 32, 132).block_m == 16
    assert not inner_flags(4, 128, 1, 5760, 64, 32, 132).persistent
    assert inner_flags(2, 8, 256, 256, 16, 32, 132).block_n == 128
    forced = inner_flags(2, 128, 2880, 5760, 64, 32, 132, constraints=(("block_n", 64),))
    assert forced.block_n == 64
    assert inner_flags(2, 128, 2880, 5760, 64, 32, 132, constraints=(("persistent", True),)).persistent
    assert not inner_flags(2, 128, 2880, 5760, 64, 64, 132, constraints=(("persistent", False),)).persistent


def test_fp8_x_with_mxfp4_weights_takes_64_deep_k_steps_of_at_most_64_rows():
    # 64-deep K steps of at most 64 rows (128-deep steps with gpt-oss's K and 128-row tiles spill: offline,
    # bench/NOTES.md "fp8 x with mxfp4 w"); 64-row tiles 128 columns wide on 4 warps, 0.82-0.86x the time of
    # 64x256x64 on 8 warps on an H100 (gpt-oss w1/w2, T=2048 and 8192, 2026-12-07: bench/results/2026-12-07a-gate).
    def fp8_x(tokens, n, k, layout="hopper"):
        rows = tokens * 4
        return make_opt_flags(TileProblem(1, 1, rows, n, k, 1, 128, max(1, rows // 128), True, 132, layout,
                              mx_scales_n_contiguous=True))
    for layout in ("hopper", "strided"):
        assert _tile(fp8_x(8192, 5760, 2880, layout))[:5] == (64, 128, 64, 4, 3)
        assert _tile(fp8_x(2048, 5760, 2880, layout))[:5] == (64, 128, 64, 4, 3)
        assert _tile(fp8_x(64, 2880, 2880, layout))[:5] == (16, 256, 64, 8, 3)
    assert _tile(fp8_x(8, 96, 256))[:5] == (16, 128, 64, 8, 3)  # N of one 128-column tile keeps it
    # hopper_fp8 words: 64-row tiles capped at 128 registers, 16 rows on 4 warps; 4 stages (0.60-0.69x the time of
    # the tiles above on an H100, gpt-oss w1/w2, 2026-12-07: bench/results/2026-12-07h-fp8words)
    for tokens, rows_tile, maxnreg in ((8192, 64, 128), (2048, 64, 128), (2, 16, None)):
        flags = fp8_x(tokens, 5760, 2880, "hopper_fp8")
        assert (*_tile(flags)[:5], flags.maxnreg) == (rows_tile, 128, 64, 4, 4, maxnreg)
    # mxfp8 x (upcast to bf16) keeps the hopper tiles of bf16 x
    mxfp8_x = make_opt_flags(TileProblem(1, 1, 8192 * 4, 5760, 2880, 1, 128, 256, True, 132, "hopper", mx_scales_n_contiguous=True,
                             x_mx=True))
    assert _tile(mxfp8_x)[:5] == (128, 256, 128, 8, 4)


@pytest.mark.parametrize("n,k,tokens", [(1536, 2048, 1), (2048, 768, 1), (1536, 2048, 8), (4096, 7168, 1),
                                         (7168, 2048, 1)])
def test_fp8_block_decode_tiles_take_64_columns_in_six_stages(n, k, tokens):
    # Qwen3-30B-A3B and DeepSeek-V3 w1/w2 at T=1 and 8: 16x64x128 on 4 warps in 6 stages was 1-9% faster than the
    # 16x128x128 tile in 4 stages in all five cases on an H100 (cold L2, 2026-12-07: bench/results/2026-12-07e-fp8tiles)
    rows = 8 * tokens
    flags = make_opt_flags(TileProblem(1, 1, rows, n, k, 1, 128, max(1, rows // 128), True, 132, k_group=128))
    assert _tile(flags)[:5] == (16, 64, 128, 4, 6) and flags.split_k == 1


@pytest.mark.parametrize("n,k,tile", [(1536, 2048, (128, 128, 128, 8, 4)), (4096, 7168, (128, 128, 128, 8, 4)),
                                      (7168, 2048, (128, 128, 128, 8, 4)), (2048, 768, (64, 128, 128, 4, 4))])
@pytest.mark.parametrize("tokens", [2048, 8192])
def test_fp8_block_prefill_tiles_of_short_k_take_64_rows_on_4_warps(n, k, tile, tokens):
    # 128x128x128 on 8 warps was fastest at K >= 2048 (64x128 on 4 warps: 1.03-1.07x its time); at Qwen3-30B-A3B
    # w2's K = 768, 64x128 on 4 warps took 0.85-0.91x its time (H100, cold L2, bench/results/2026-12-07e-fp8tiles)
    rows = 8 * tokens
    flags = make_opt_flags(TileProblem(1, 1, rows, n, k, 1, 128, rows // 128, True, 132, k_group=128))
    assert _tile(flags)[:5] == tile


@pytest.mark.parametrize("tokens", [8, 2048, 8192])
def test_an_fp8_b128_output_widens_the_tile_without_more_accumulator_registers(tokens):
    # DeepSeek-V3 w1 (SwiGLU) writing e4m3 h with a scale per 128 columns: its tiles hold 256 columns, and a thread
    # holds no more accumulator elements than the heuristic's tile gave it or 64 (more warps, then fewer rows).
    rows = 8 * tokens

    def flags(y_scale_block):
        return make_opt_flags(TileProblem(1, 1, rows, 4096, 7168, 2, 256, rows // 256 or 1, True, 132,
                                          y_scale_block=y_scale_block, k_group=128, x_gathered=True))
    plain, quantized = flags(0), flags(128)
    assert quantized.block_n == 256 and plain.block_n < 256
    per_thread = lambda f: f.block_m * f.block_n // (32 * f.num_warps)  # noqa: E731
    assert per_thread(quantized) <= max(64, per_thread(plain))
    assert quantized.block_m >= min(64, plain.block_m)
