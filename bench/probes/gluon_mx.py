"""Probe: an mxfp4 (hopper word layout) x bf16 batched matmul in Gluon, W loaded straight into the wgmma's
register-operand layout (no shared-memory staging), x by TMA through an mbarrier ring."""
import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma, warpgroup_mma, warpgroup_mma_wait
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from ogsgen.numerics.jit import E2M1_WORD_TO_BF16, E8M0_PAIR_TO_BF16X2


@gluon.constexpr_function
def words_layout(slabs, kwords, num_warps):
    """Word (s, kw = 128 g + 16 r + 4 t + j) of slab s goes to lane 4 r + t, warp s % 8 (slab bits 0-2), and
    registers j, g and s // 8: the thread's words are its wgmma A fragments."""
    reg = [[0, 1], [0, 2]] + [[0, 128 << i] for i in range((kwords // 128).bit_length() - 1)]
    warp_bits = (num_warps).bit_length() - 1
    reg += [[1 << i, 0] for i in range(warp_bits, (slabs).bit_length() - 1)]
    lane = [[0, 4], [0, 8], [0, 16], [0, 32], [0, 64]]
    warp = [[1 << i, 0] for i in range(warp_bits)]
    return gl.DistributedLinearLayout(reg, lane, warp, [], [slabs, kwords])


@gluon.constexpr_function
def pair_layout(slabs, kwords, num_warps):
    """words_layout over (slabs, kwords // 2): index kw // 2, the word's j bit 0 dropped (a scale pair serves
    words j and j + 1 of a 32-row block)."""
    reg = [[0, 1]] + [[0, 64 << i] for i in range((kwords // 128).bit_length() - 1)]
    warp_bits = (num_warps).bit_length() - 1
    reg += [[1 << i, 0] for i in range(warp_bits, (slabs).bit_length() - 1)]
    lane = [[0, 2], [0, 4], [0, 8], [0, 16], [0, 32]]
    warp = [[1 << i, 0] for i in range(warp_bits)]
    return gl.DistributedLinearLayout(reg, lane, warp, [], [slabs, kwords // 2])


@gluon.jit
def upcast_words(words, factors, BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr):
    SLABS: gl.constexpr = BLOCK_N // 16
    GROUPS: gl.constexpr = BLOCK_K // 64
    v = gl.inline_asm_elementwise(E2M1_WORD_TO_BF16, "=h,=h,=h,=h,=h,=h,=h,=h,r,r", [words, factors],
                                  dtype=(gl.bfloat16,) * 8, is_pure=True, pack=1)
    w = gl.join(gl.join(gl.join(v[0], v[1]), gl.join(v[2], v[3])),
                gl.join(gl.join(v[4], v[5]), gl.join(v[6], v[7])))                 # [s, kw, lane, q, h]
    w = gl.reshape(w, (SLABS, GROUPS, 8, 4, 4, 2, 2, 2))                            # [s, g, r, t, j, lane, q, h]
    w = gl.permute(w, (0, 6, 2, 1, 4, 7, 3, 5))                                     # [s, q, r, g, j, h, t, lane]
    return gl.reshape(w, (BLOCK_N, BLOCK_K))


@gluon.jit
def mx_gluon_kernel(Y, x_desc, W, stride_w_b, stride_w_n, S, stride_s_b, stride_s_k, M, N, K,
                    BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr, STAGES: gl.constexpr,
                    num_warps: gl.constexpr):
    pid_m = gl.program_id(0)
    pid_n = gl.program_id(1)
    expert = gl.program_id(2)
    SLABS: gl.constexpr = BLOCK_N // 16
    KW: gl.constexpr = BLOCK_K * 2
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                  instr_shape=[16, BLOCK_M, 16])
    a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=2)
    wl: gl.constexpr = words_layout(SLABS, KW, num_warps)
    s_idx = gl.arange(0, SLABS, layout=gl.SliceLayout(1, wl))[:, None]
    kw_idx = gl.arange(0, KW, layout=gl.SliceLayout(0, wl))[None, :]
    slab = pid_n * SLABS + s_idx
    WPtrs = W + expert.to(gl.int64) * stride_w_b + slab * stride_w_n + kw_idx
    # the scales of each word's two rows (r, r + 8) at its 32-row block of K
    pl: gl.constexpr = pair_layout(SLABS, KW, num_warps)
    kw2 = gl.arange(0, KW // 2, layout=gl.SliceLayout(0, pl))[None, :]
    row = (pid_n * SLABS + gl.arange(0, SLABS, layout=gl.SliceLayout(1, pl))[:, None]) * 16 + ((kw2 >> 3) & 7)
    kblock = 2 * (kw2 >> 6) + (kw2 & 1)
    SPtrs = S + expert.to(gl.int64) * stride_s_b + kblock * stride_s_k + row
    row_ok = row < N
    x_smem = gl.allocate_shared_memory(gl.bfloat16, [STAGES, BLOCK_M, BLOCK_K], x_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
    n_k = gl.cdiv(K, BLOCK_K)
    row0 = expert * M + pid_m * BLOCK_M
    for i in gl.static_range(STAGES - 1):
        mbarrier.expect(ready.index(i), x_desc.block_type.nbytes, pred=i < n_k)
        tma.async_copy_global_to_shared(x_desc, [row0, i * BLOCK_K], ready.index(i), x_smem.index(i), pred=i < n_k)
    acc = gl.zeros((BLOCK_N, BLOCK_M), dtype=gl.float32, layout=mma)
    kw_total = (K + 63) // 64 * 128
    words = gl.load(WPtrs, mask=kw_idx < kw_total, other=0)
    lo = gl.load(SPtrs, mask=row_ok & (kblock < K // 32), other=0)
    hi = gl.load(SPtrs + 8, mask=row_ok & (kblock < K // 32), other=0)
    for k in range(n_k):
        s = k % STAGES
        # prefetch: the next step's words and scales, and the x tile STAGES - 1 steps ahead
        kw_left = kw_total - (k + 1) * KW
        kb_left = K // 32 - (k + 1) * (BLOCK_K // 32)
        words_next = gl.load(WPtrs + KW, mask=kw_idx < kw_left, other=0)
        lo_next = gl.load(SPtrs + (BLOCK_K // 32) * stride_s_k, mask=row_ok & (kblock < kb_left), other=0)
        hi_next = gl.load(SPtrs + (BLOCK_K // 32) * stride_s_k + 8, mask=row_ok & (kblock < kb_left), other=0)
        pair = lo.to(gl.int32) | (hi.to(gl.int32) << 16)
        factors = gl.inline_asm_elementwise(E8M0_PAIR_TO_BF16X2, "=r,r", [pair], dtype=gl.int32, is_pure=True,
                                            pack=1)
        factors = gl.convert_layout(gl.reshape(gl.join(factors, factors), (SLABS, KW)), wl, assert_trivial=True)
        a = gl.convert_layout(upcast_words(words, factors, BLOCK_N, BLOCK_K), a_layout, assert_trivial=True)
        mbarrier.wait(ready.index(s), (k // STAGES) & 1)
        acc = warpgroup_mma(a, x_smem.index(s).permute((1, 0)), acc, is_async=True)
        acc = warpgroup_mma_wait(num_outstanding=0, deps=[acc])
        gl.thread_barrier()  # every warpgroup is done with slot (k - 1) % STAGES before it is refilled
        kn = k + STAGES - 1
        sn = kn % STAGES
        mbarrier.expect(ready.index(sn), x_desc.block_type.nbytes, pred=kn < n_k)
        tma.async_copy_global_to_shared(x_desc, [row0, kn * BLOCK_K], ready.index(sn), x_smem.index(sn),
                                        pred=kn < n_k)
        words, lo, hi = words_next, lo_next, hi_next
        WPtrs += KW
        SPtrs += (BLOCK_K // 32) * stride_s_k
    for i in gl.static_range(STAGES):
        mbarrier.invalidate(ready.index(i))
    out_layout: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [num_warps, 1], [1, 0])
    out = gl.convert_layout(gl.permute(acc.to(gl.bfloat16), (1, 0)), out_layout)
    offs_m = pid_m * BLOCK_M + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, out_layout))
    offs_n = pid_n * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, out_layout))
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    gl.store(Y + (expert.to(gl.int64) * M + offs_m[:, None]) * N + offs_n[None, :], out, mask=mask)


def mx_gluon(x, words, scales, n, block_m=128, block_n=256, block_k=128, stages=3, num_warps=8):
    """x (E, M, K) bf16; words (E, N/16, Kw) int32 (hopper layout); scales (E, K/32, N) uint8 N-contiguous."""
    e, m, k = x.shape
    y = torch.empty(e, m, n, dtype=torch.bfloat16, device=x.device)
    x2 = x.reshape(e * m, k)
    layout = gl.NVMMASharedLayout.get_default_for([block_m, block_k], gl.bfloat16)
    x_desc = TensorDescriptor.from_tensor(x2, [block_m, block_k], layout)
    grid = (triton.cdiv(m, block_m), triton.cdiv(n, block_n), e)
    mx_gluon_kernel[grid](y, x_desc, words, words.stride(0), words.stride(1), scales, scales.stride(0),
                          scales.stride(1), m, n, k, block_m, block_n, block_k, stages, num_warps=num_warps)
    return y
