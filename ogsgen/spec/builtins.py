"""Built-in functions for generated kernels, with their torch references (registered when ogsgen.spec is imported;
the default catalog builds with them)."""
import torch
import triton
import triton.language as tl

from .functions import register_activation


def swiglu_torch(tile: torch.Tensor, alpha: float, limit: float) -> torch.Tensor:
    """SwiGLU on interleaved columns: even columns are the gate, odd columns the linear part."""
    gate = tile[..., 0::2].clamp(max=limit)
    linear = tile[..., 1::2].clamp(min=-limit, max=limit)
    return gate * torch.sigmoid(alpha * gate) * (linear + 1)


@register_activation(arg_names=("alpha", "limit"), reduction_n=2, reference=swiglu_torch)
@triton.jit
def swiglu(tile, alpha, limit):
    # Columns arrive interleaved (gate, linear, gate, linear, ...): fold each pair.
    gate, linear = tl.split(tl.reshape(tile, (tile.shape[0], tile.shape[1] // 2, 2)))
    gate = tl.minimum(gate, limit)
    linear = tl.minimum(tl.maximum(linear, -limit), limit)
    return gate / (1.0 + tl.exp(-alpha * gate)) * (linear + 1.0)
