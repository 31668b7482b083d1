"""vLLM 0.33.0's fused_moe_kernel (its TritonExperts path's GEMM) launched on its own, for side-by-side
benchmarks: the expert alignment in torch, vLLM's default configs (bf16: no H200 file covers these shapes; fp8
w8a8 with 128 x 128 blocks: its tuned files cover only Qwen3-30B-A3B on an H200), one launch per call. The kernel
comes from `python bench/fetch_peers.py DIR` (PYTHONPATH=DIR/vllm); w is (E, N, K), K-contiguous."""
import torch
import triton
import triton.language as tl

try:
    from vllm_fused_moe_kernel import fused_moe_kernel
except ImportError:  # not fetched: bench_moe leaves this peer out
    fused_moe_kernel = None


def get_default_config(M, E):
    """vLLM's get_default_config for bf16 on CUDA."""
    return dict(BLOCK_SIZE_M=16 if M <= 32 else 32 if M <= 96 else 64 if M <= 512 else 128,
                BLOCK_SIZE_N=64 if M <= 64 else 128, BLOCK_SIZE_K=128 if M <= 64 else 64,
                GROUP_SIZE_M=16 if M // max(E, 1) > 128 else 1, SPLIT_K=1, num_warps=4 if M <= 128 else 8,
                num_stages=4 if M <= 32 else 3)


def get_fp8_block_config(M):
    """vLLM's get_default_config for fp8 w8a8 with block_shape [128, 128] on CUDA."""
    return dict(BLOCK_SIZE_M=16 if M <= 64 else 64, BLOCK_SIZE_N=64 if M <= 8 else 128, BLOCK_SIZE_K=128,
                GROUP_SIZE_M=1 if M <= 16 else 32, SPLIT_K=1, num_warps=4, num_stages=4 if M <= 4 else 3)


def moe_align_block_size(topk_ids, block_size, num_experts):
    """The gates (t * top_k + j) sorted by expert, token order kept, each expert's segment padded to whole blocks
    with the sentinel topk_ids.numel(); each block's expert; the padded row count."""
    flat = topk_ids.reshape(-1).long()
    numel, dev = flat.numel(), flat.device
    rows = numel + num_experts * (block_size - 1) if numel >= num_experts else \
        min(numel * block_size, numel + num_experts * (block_size - 1))
    counts = torch.bincount(flat, minlength=num_experts)
    padded = (counts + block_size - 1) // block_size * block_size
    seg_end = torch.cumsum(padded, 0)
    order = torch.argsort(flat, stable=True)
    rank = torch.arange(numel, device=dev) - (torch.cumsum(counts, 0) - counts)[flat[order]]
    sorted_ids = torch.full((rows,), numel, dtype=torch.int32, device=dev)
    sorted_ids[(seg_end - padded)[flat[order]] + rank] = order.to(torch.int32)
    blocks = torch.repeat_interleave(torch.arange(num_experts, device=dev), padded // block_size)
    expert_ids = torch.full((triton.cdiv(rows, block_size),), -1, dtype=torch.int32, device=dev)
    expert_ids[:blocks.numel()] = blocks.to(torch.int32)
    return sorted_ids, expert_ids, seg_end[-1:].to(torch.int32)


def prepare_expert_assignment(topk_ids, config, num_tokens, top_k, E):
    """vLLM's choice: one token per block when num_tokens * top_k * 4 <= E, else the aligned segments."""
    if num_tokens * top_k * 4 <= E:
        return None, topk_ids.view(-1), torch.full((1,), topk_ids.numel() * config["BLOCK_SIZE_M"],
                                                   dtype=torch.int32, device=topk_ids.device)
    return moe_align_block_size(topk_ids, config["BLOCK_SIZE_M"], E)


def invoke_fused_moe_kernel(A, B, C, topk_weights, sorted_token_ids, expert_ids, num_tokens_post_padded,
                            mul_routed_weight, top_k, config, a_scale=None, b_scale=None):
    """One launch for A (M, K), B (E, N, K) into C (M, top_k, N): bf16, or e4m3 with float32 scales a_scale (M,
    cdiv(K, 128)) and b_scale (E, cdiv(N, 128), cdiv(K, 128)) (vLLM's fp8 block path: SWAP_AB where vLLM takes it,
    on sm_90 for BLOCK_SIZE_M < 64 and BLOCK_SIZE_N >= 64)."""
    M, num_tokens, bm = A.size(0), A.size(0) * top_k, config["BLOCK_SIZE_M"]
    if sorted_token_ids is None:
        EM = num_tokens * bm
    else:
        EM = sorted_token_ids.size(0) if M >= bm else min(sorted_token_ids.size(0), num_tokens * bm)
    config = dict(config)
    block_k = config.pop("BLOCK_SIZE_K")
    grid = (triton.cdiv(EM, bm) * triton.cdiv(B.size(1), config["BLOCK_SIZE_N"]),)
    fp8 = a_scale is not None
    scales = ((a_scale.stride(0), a_scale.stride(1), b_scale.stride(0), b_scale.stride(2),
               b_scale.stride(1) if b_scale.size(1) > 1 else 0, 0, 0, 128, 128) if fp8 else (0,) * 9)
    swap_ab = fp8 and A.is_cuda and torch.cuda.get_device_capability(A.device) == (9, 0) and bm < 64 \
        and config["BLOCK_SIZE_N"] >= 64
    fused_moe_kernel[grid](
        A, B, C, None, a_scale, b_scale, topk_weights, sorted_token_ids, expert_ids, num_tokens_post_padded,
        B.size(1), B.size(2), EM, num_tokens, A.stride(0), A.stride(1), B.stride(0), B.stride(2), B.stride(1),
        C.stride(1), C.stride(2), *scales, MUL_ROUTED_WEIGHT=mul_routed_weight, top_k=top_k,
        compute_type=tl.bfloat16, use_fp8_w8a8=fp8, use_int8_w8a8=False, use_int8_w8a16=False,
        per_channel_quant=False, naive_block_assignment=sorted_token_ids is None, HAS_BIAS=False,
        BLOCK_SIZE_K=block_k, SWAP_AB=swap_ab, USE_TD=False, **config)
