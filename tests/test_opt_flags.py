"""The launch-parameter heuristic's choices that measurements on the H200 fixed (bench/results/*-probes)."""
from ogsgen.runtime.opt_flags import make_opt_flags


def _gpt_oss_w1(itemsize, rows_per_expert, w_mx_layout=None):
    # gpt-oss w1: 128 experts, N=5760, K=2880, on 132 SMs
    return make_opt_flags(itemsize, 1, rows_per_expert * 128, 5760, 2880, 1, 128, rows_per_expert, True, 132,
                          w_mx_layout)


def test_decode_tiles_of_16_bit_weights_take_two_warpgroups():
    # 16x128 tiles of bf16/fp16 weights stream W faster with 8 warps (T=1 15% faster on gpt-oss).
    assert (lambda f: (f.block_m, f.block_n, f.block_k, f.num_warps))(_gpt_oss_w1(2, 1)) == (16, 128, 64, 8)
    assert _gpt_oss_w1(4, 1).num_warps == 4  # fp32: not measured, unchanged
    assert _gpt_oss_w1(2, 32).num_warps == 4  # 32-row tiles: unchanged


def _tile(flags):
    return flags.block_m, flags.block_n, flags.block_k, flags.num_warps, flags.num_stages, flags.wait_mma


def test_hopper_mxfp4_decode_tiles_follow_k():
    # K=2880 (gpt-oss) has a 64-row tail at 128-row K steps: with about one row per expert, 64-row steps, 8
    # warps, waiting (bench/results/2026-12-01j-probes); more rows, or K=7168 (DeepSeek-V3), keep 16x128x128.
    assert _tile(_gpt_oss_w1(2, 1, "hopper")) == (16, 128, 64, 8, 4, True)
    assert _tile(_gpt_oss_w1(2, 8, "hopper")) == (16, 128, 128, 4, 3, False)
    deepseek = make_opt_flags(2, 1, 64, 4096, 7168, 1, 256, 1, True, 132, "hopper")
    assert _tile(deepseek) == (16, 128, 128, 4, 3, False)
    assert _tile(_gpt_oss_w1(2, 32, "hopper")) == (32, 128, 128, 4, 3, False)  # 32-row tiles: unchanged
