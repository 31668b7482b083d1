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
    assert _gpt_oss_w1(2, 1, "hopper").num_warps == 4  # hopper mxfp4 has its own tiles
    assert _gpt_oss_w1(2, 32).num_warps == 4  # 32-row tiles: unchanged
