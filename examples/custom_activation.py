"""Register a custom fused activation, build its kernels, and check them against torch.

    ogsgen build --spec examples/custom_activation.py --out my_kernels
    python examples/custom_activation.py my_kernels         # on a CUDA GPU
    TRITON_INTERPRET=1 python examples/custom_activation.py my_kernels   # on the CPU
"""
import sys

import torch
import triton
import triton.language as tl

import ogsgen
from ogsgen.spec import BF16, FP16, KernelVariant
from ogsgen.testing import assert_close


def relu_squared_torch(tile, scale):
    return torch.relu(tile).square() * scale


# Its gradient, for training: the backward runs it in one fused kernel (without it, torch's autograd of the
# reference).
@triton.jit
def relu_squared_backward(tile, grad, scale):
    return 2.0 * tl.maximum(tile, 0.0) * scale * grad


@ogsgen.register_activation(arg_names=("scale",), reference=relu_squared_torch, backward=relu_squared_backward)
@triton.jit
def relu_squared(tile, scale):
    positive = tl.maximum(tile, 0.0)
    return positive * positive * scale


# The variants `ogsgen build --spec` renders from this file.
VARIANTS = [KernelVariant(fmt, fmt, fmt, bias=True, activation=relu_squared) for fmt in (BF16, FP16)]

if __name__ == "__main__":
    ogsgen.add_search_path(sys.argv[1] if len(sys.argv) > 1 else "my_kernels")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    x = torch.randn(100, 256, device=device, dtype=torch.bfloat16)
    w = torch.randn(256, 192, device=device, dtype=torch.bfloat16) / 16
    bias = torch.randn(192, device=device)
    act = ogsgen.FusedActivation(relu_squared, (0.5,))
    y = ogsgen.matmul_ogs(x, w, bias, fused_activation=act)
    ref = ogsgen.matmul_ogs_torch(x.float(), w.float(), bias, fused_activation=act,
                                  precision_config=ogsgen.PrecisionConfig(out_dtype=torch.float32))
    assert_close(ref, y.float())
    # Training through it: gradients against torch autograd of the reference.
    ours = [t.detach().clone().requires_grad_() for t in (x, w)]
    theirs = [t.detach().float().requires_grad_() for t in (x, w)]
    ogsgen.matmul_ogs(*ours, bias, fused_activation=act).float().sum().backward()
    ogsgen.matmul_ogs_torch(*theirs, bias, fused_activation=act).sum().backward()
    for a, b in zip(ours, theirs):
        assert_close(b.grad, a.grad.float())
    print(f"relu_squared fused into matmul_ogs matches torch: {tuple(y.shape)} {y.dtype} on {device}, "
          f"with gradients")
