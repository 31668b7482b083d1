"""Register a custom epilogue, build its kernels, and check them against torch: a dense call, and a top-2 MoE
call (each token's rows gathered to its two experts and scattered back) whose epilogue runs on each token's sum.

    ogsgen build --spec examples/custom_epilogue.py --out my_epilogue_kernels
    python examples/custom_epilogue.py my_epilogue_kernels         # on a CUDA GPU
    TRITON_INTERPRET=1 python examples/custom_epilogue.py my_epilogue_kernels   # on the CPU
"""
import sys

import torch
import triton
import triton.language as tl

import ogsgen
from ogsgen.spec import BF16, KernelVariant
from ogsgen.testing import assert_close


def scale_and_clamp_torch(tile, rows, cols, col_scale, limit):
    """The torch reference: ``tile`` (rows, N) fp32, ``rows`` and ``cols`` the output indices of its elements."""
    return (tile * col_scale[cols].float()[None, :]).clamp(-limit, limit)


@ogsgen.register_epilogue(arg_names=("ColScale", "limit"), reference=scale_and_clamp_torch)
@triton.jit
def scale_and_clamp(tile, offs_m, offs_n, mask, ColScale, limit):
    # tile: fp32 (BLOCK_M, BLOCK_N); offs_m, offs_n: its output rows and columns; mask: the elements inside y.
    scale = tl.load(ColScale + offs_n[None, :], mask=mask, other=1.0)
    return tl.minimum(tl.maximum(tile * scale, -limit), limit)


# The variants `ogsgen build --spec` renders from this file (with the top-k reduce that runs the MoE epilogue).
VARIANTS = [
    KernelVariant(BF16, BF16, BF16, bias=True, epilogue=scale_and_clamp),
    KernelVariant(BF16, BF16, BF16, ragged=True, gather=True, scatter=True, gammas=True, epilogue=scale_and_clamp),
]

if __name__ == "__main__":
    ogsgen.add_search_path(sys.argv[1] if len(sys.argv) > 1 else "my_epilogue_kernels")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    tokens, k_dim, n_dim, experts, top_k = 48, 128, 96, 4, 2
    x = torch.randn(tokens, k_dim, device=device, dtype=torch.bfloat16)
    col_scale = torch.rand(n_dim, device=device) + 0.5
    epilogue = ogsgen.Epilogue(scale_and_clamp, (col_scale, 2.0))
    fp32_out = ogsgen.PrecisionConfig(out_dtype=torch.float32)

    w = torch.randn(k_dim, n_dim, device=device, dtype=torch.bfloat16) / 16
    bias = torch.randn(n_dim, device=device)
    y = ogsgen.matmul_ogs(x, w, bias, epilogue=epilogue)
    ref = ogsgen.matmul_ogs_torch(x.float(), w.float(), bias, epilogue=epilogue, precision_config=fp32_out)
    assert_close(ref, y.float(), what="dense")

    logits = torch.randn(tokens, experts, device=device)
    routing_data, gather_indx, scatter_indx = ogsgen.routing(logits, top_k)
    w_experts = torch.randn(experts, k_dim, n_dim, device=device, dtype=torch.bfloat16) / 16
    y = ogsgen.matmul_ogs(x, w_experts, None, routing_data, gather_indx, scatter_indx,
                          gammas=routing_data.gate_scal, epilogue=epilogue)
    ref = ogsgen.matmul_ogs_torch(x.float(), w_experts.float(), None, routing_data, gather_indx, scatter_indx,
                                  gammas=routing_data.gate_scal, epilogue=epilogue, precision_config=fp32_out)
    assert_close(ref, y.float(), what="MoE")
    print(f"scale_and_clamp fused into matmul_ogs matches torch (dense and top-{top_k} MoE) on {device}")
