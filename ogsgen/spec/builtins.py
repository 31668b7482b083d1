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


# A NaN stays NaN through the clamps (min.NaN / max.NaN on the GPU), as through torch's clamp: training relies on NaN
# to show a divergence, which the default tl.minimum / tl.maximum would turn into the limit.
@triton.jit
def _clamp_keeping_nan(x, limit):
    return tl.minimum(tl.maximum(x, -limit, propagate_nan=tl.PropagateNan.ALL), limit,
                      propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def swiglu_backward(tile, grad, alpha, limit):
    # d/d gate of gate * sigmoid(alpha * gate) * (linear + 1), and d/d linear; zero where a clamp holds the value
    # (past limit) and at a NaN, as torch's clamp passes no gradient there (its mask compares the input with the
    # bounds, and a NaN is within none); the other column of a NaN's pair gets NaN, as in torch.
    gate, linear = tl.split(tl.reshape(tile, (tile.shape[0], tile.shape[1] // 2, 2)))
    gate_c = tl.minimum(gate, limit, propagate_nan=tl.PropagateNan.ALL)
    linear_c = _clamp_keeping_nan(linear, limit)
    sig = 1.0 / (1.0 + tl.exp(-alpha * gate_c))
    d_gate = grad * (linear_c + 1.0) * sig * (1.0 + alpha * gate_c * (1.0 - sig))
    d_linear = grad * gate_c * sig
    d_gate = tl.where(gate <= limit, d_gate, 0.0)
    d_linear = tl.where((linear >= -limit) & (linear <= limit), d_linear, 0.0)
    return tl.reshape(tl.join(d_gate, d_linear), (tile.shape[0], tile.shape[1]))


@register_activation(arg_names=("alpha", "limit"), reduction_n=2, reference=swiglu_torch, backward=swiglu_backward)
@triton.jit
def swiglu(tile, alpha, limit):
    # Columns arrive interleaved (gate, linear, gate, linear, ...): fold each pair.
    gate, linear = tl.split(tl.reshape(tile, (tile.shape[0], tile.shape[1] // 2, 2)))
    gate = tl.minimum(gate, limit, propagate_nan=tl.PropagateNan.ALL)
    linear = _clamp_keeping_nan(linear, limit)
    return gate / (1.0 + tl.exp(-alpha * gate)) * (linear + 1.0)


def silu_and_mul_torch(tile: torch.Tensor) -> torch.Tensor:
    """The SiLU-gated unit of DeepSeek, Qwen, Mixtral and Llama's MLPs on interleaved columns: silu(gate) * up,
    even columns the gate, odd columns the up projection."""
    return torch.nn.functional.silu(tile[..., 0::2]) * tile[..., 1::2]


@triton.jit
def silu_and_mul_backward(tile, grad):
    # d/d gate of gate * sigmoid(gate) * up, and d/d up
    gate, up = tl.split(tl.reshape(tile, (tile.shape[0], tile.shape[1] // 2, 2)))
    sig = 1.0 / (1.0 + tl.exp(-gate))
    d_gate = grad * up * sig * (1.0 + gate * (1.0 - sig))
    d_up = grad * gate * sig
    return tl.reshape(tl.join(d_gate, d_up), (tile.shape[0], tile.shape[1]))


@register_activation(reduction_n=2, reference=silu_and_mul_torch, backward=silu_and_mul_backward)
@triton.jit
def silu_and_mul(tile):
    # Columns arrive interleaved (gate, up, gate, up, ...): fold each pair.
    gate, up = tl.split(tl.reshape(tile, (tile.shape[0], tile.shape[1] // 2, 2)))
    return gate / (1.0 + tl.exp(-gate)) * up
