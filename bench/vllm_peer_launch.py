"""Standalone launch of vLLM 0.33.0's bf16 fused_moe_kernel (the w1/w2 GEMM of its TritonExperts path), for
side-by-side benchmarks only: alignment in torch, vLLM's default bf16 config, one kernel launch per call.
Needs the kernel module that `python bench/fetch_peers.py DIR` places in DIR/vllm (PYTHONPATH=DIR/vllm). W is
(E, N, K), K-contiguous."""
import torch
import triton
import triton.language as tl
from vllm_fused_moe_kernel import fused_moe_kernel

# H100 tuned config shipped in the wheel as E=128,N=2880,device_name=NVIDIA_H100_80GB_HBM3.json (keys = M).
# There is no E=128,N=2880 or E=256,N=2048 NVIDIA_H200 file, so on an H200 vLLM takes get_default_config.
H100_E128_N2880 = {
    1: dict(BLOCK_SIZE_M=16, BLOCK_SIZE_N=32, BLOCK_SIZE_K=64, GROUP_SIZE_M=1, num_warps=4, num_stages=4),
    32: dict(BLOCK_SIZE_M=16, BLOCK_SIZE_N=32, BLOCK_SIZE_K=256, GROUP_SIZE_M=1, num_warps=8, num_stages=4),
    256: dict(BLOCK_SIZE_M=16, BLOCK_SIZE_N=32, BLOCK_SIZE_K=256, GROUP_SIZE_M=1, num_warps=4, num_stages=5),
    2048: dict(BLOCK_SIZE_M=128, BLOCK_SIZE_N=128, BLOCK_SIZE_K=64, GROUP_SIZE_M=1, num_warps=8, num_stages=5),
    4096: dict(BLOCK_SIZE_M=128, BLOCK_SIZE_N=256, BLOCK_SIZE_K=64, GROUP_SIZE_M=1, num_warps=8, num_stages=4),
}


def get_default_config(M, E):
    """vLLM 0.33.0 get_default_config, dtype=None (bf16) branch, CUDA (not ROCm), not batch-invariant."""
    block_m = 16 if M <= 32 else 32 if M <= 96 else 64 if M <= 512 else 128
    block_n = 64 if M <= 64 else 128
    block_k = 128 if M <= 64 else 64
    group_m = 16 if M // max(E, 1) > 128 else 1
    num_warps = 4 if M <= 128 else 8
    num_stages = 4 if M <= 32 else 3
    return dict(BLOCK_SIZE_M=block_m, BLOCK_SIZE_N=block_n, BLOCK_SIZE_K=block_k, GROUP_SIZE_M=group_m,
                SPLIT_K=1, num_warps=num_warps, num_stages=num_stages)


def moe_align_block_size(topk_ids, block_size, num_experts):
    """Torch version of vLLM's moe_align_block_size (no expert_map, pad_sorted_ids=False): flat gate ids
    (t*top_k+j) sorted by expert (stable: token order inside an expert), each expert's segment padded to a
    multiple of block_size with the sentinel topk_ids.numel(); expert_ids per block; num_tokens_post_padded."""
    flat = topk_ids.reshape(-1).long()
    numel = flat.numel()
    dev = flat.device
    maxp = numel + num_experts * (block_size - 1)
    if numel < num_experts:
        maxp = min(numel * block_size, maxp)
    counts = torch.bincount(flat, minlength=num_experts)
    padded = (counts + block_size - 1) // block_size * block_size
    seg_end = torch.cumsum(padded, 0)
    seg_start = seg_end - padded
    cnt_start = torch.cumsum(counts, 0) - counts
    order = torch.argsort(flat, stable=True)
    e_sorted = flat[order]
    rank = torch.arange(numel, device=dev) - cnt_start[e_sorted]
    sorted_ids = torch.full((maxp,), numel, dtype=torch.int32, device=dev)
    sorted_ids[seg_start[e_sorted] + rank] = order.to(torch.int32)
    n_blocks = triton.cdiv(maxp, block_size)
    blk_expert = torch.repeat_interleave(torch.arange(num_experts, device=dev), padded // block_size)
    expert_ids = torch.full((n_blocks,), -1, dtype=torch.int32, device=dev)  # blocks past the end are never read
    expert_ids[:blk_expert.numel()] = blk_expert.to(torch.int32)
    ntpp = seg_end[-1:].to(torch.int32)
    return sorted_ids, expert_ids, ntpp


def prepare_expert_assignment(topk_ids, config, num_tokens, top_k, E):
    """vLLM _prepare_expert_assignment: the 'naive' one-token-per-block path when num_tokens*top_k*4 <= E."""
    if num_tokens * top_k * 4 <= E:
        return (None, topk_ids.view(-1),
                torch.full((1,), topk_ids.numel() * config["BLOCK_SIZE_M"], dtype=torch.int32, device=topk_ids.device))
    return moe_align_block_size(topk_ids, config["BLOCK_SIZE_M"], E)


def invoke_fused_moe_kernel(A, B, C, topk_weights, sorted_token_ids, expert_ids, num_tokens_post_padded,
                            mul_routed_weight, top_k, config, compute_type=tl.bfloat16):
    """invoke_fused_moe_triton_kernel for unquantized inputs. A (M, K); B (E, N, K) K-contiguous;
    C (M, top_k, N)."""
    M = A.size(0)
    num_tokens = M * top_k
    if sorted_token_ids is not None:
        EM = sorted_token_ids.size(0)
        if A.size(0) < config["BLOCK_SIZE_M"]:
            EM = min(sorted_token_ids.size(0), A.size(0) * top_k * config["BLOCK_SIZE_M"])
    else:
        EM = num_tokens * config["BLOCK_SIZE_M"]
    grid = lambda META: (triton.cdiv(EM, META["BLOCK_SIZE_M"]) * triton.cdiv(B.size(1), META["BLOCK_SIZE_N"]),)
    config = dict(config)
    config["SPLIT_K"] = 1
    BLOCK_SIZE_K = config.pop("BLOCK_SIZE_K")
    fused_moe_kernel[grid](
        A, B, C, None, None, None, topk_weights, sorted_token_ids, expert_ids, num_tokens_post_padded,
        B.size(1), B.size(2), EM, num_tokens,
        A.stride(0), A.stride(1), B.stride(0), B.stride(2), B.stride(1), C.stride(1), C.stride(2),
        0, 0, 0, 0, 0, 0, 0,
        0, 0,
        MUL_ROUTED_WEIGHT=mul_routed_weight, top_k=top_k, compute_type=compute_type,
        use_fp8_w8a8=False, use_int8_w8a8=False, use_int8_w8a16=False, per_channel_quant=False,
        naive_block_assignment=(sorted_token_ids is None), HAS_BIAS=False, BLOCK_SIZE_K=BLOCK_SIZE_K,
        SWAP_AB=False, USE_TD=False, **config)


class VllmW1:
    """The w1 step of vLLM TritonExperts for fixed topk_ids: routing/alignment precomputed, __call__ = one launch."""

    def __init__(self, x, w_enk, topk_ids, config):
        self.x, self.w, self.config = x, w_enk, config
        T, self.k = topk_ids.shape
        E, N, _ = w_enk.shape
        self.sorted_ids, self.expert_ids, self.ntpp = prepare_expert_assignment(topk_ids, config, T, self.k, E)
        self.naive = self.sorted_ids is None
        BM, BN = config["BLOCK_SIZE_M"], config["BLOCK_SIZE_N"]
        EM = T * self.k * BM if self.naive else (min(self.sorted_ids.numel(), T * self.k * BM) if T < BM
                                                 else self.sorted_ids.numel())
        self.grid_programs = triton.cdiv(EM, BM) * triton.cdiv(N, BN)
        self.C = torch.empty(T, self.k, N, device=x.device, dtype=x.dtype)

    def __call__(self):
        invoke_fused_moe_kernel(self.x, self.w, self.C, None, self.sorted_ids, self.expert_ids, self.ntpp,
                                False, self.k, self.config)
        return self.C


def torch_reference(x, w_ekn, topk_ids):
    """fp32 reference: y[t, j] = x[t] @ w[topk_ids[t, j]], shape (T, k, N)."""
    T, k = topk_ids.shape
    N = w_ekn.shape[2]
    y = torch.zeros(T * k, N, device=x.device, dtype=torch.float32)
    flat = topk_ids.reshape(-1).long()
    for e in torch.unique(flat).tolist():
        gates = (flat == e).nonzero().squeeze(1)
        y[gates] = x[gates // k].float() @ w_ekn[e].float()
    return y.view(T, k, N)
