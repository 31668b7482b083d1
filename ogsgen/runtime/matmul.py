"""``matmul_ogs``: validate a call, map it to its kernel variant, launch the generated kernel."""
from __future__ import annotations

import os
from functools import lru_cache

import torch
import triton

from ..codegen.render import ARG_PREFIX
from ..errors import SpecError, UnsupportedError
from ..spec.formats import plain_format_of
from ..spec.variant import KernelVariant
from . import loader
from .opt_flags import current_constraints, make_opt_flags
from .types import Epilogue, FusedActivation, PrecisionConfig

_MAX_GRID_Y = 65535


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def _check_tensor(value, name: str, ndims=None, dtype=None):
    if value is None:
        return
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    if ndims is not None and value.ndim not in ndims:
        raise SpecError(f"{name} must have {' or '.join(map(str, ndims))} dimensions, got shape {tuple(value.shape)}")
    if dtype is not None and value.dtype != dtype:
        raise SpecError(f"{name} must be {dtype}, got {value.dtype}; convert it with .to({dtype})")


def _check_devices(**tensors):
    present = {name: t.device for name, t in tensors.items() if isinstance(t, torch.Tensor)}
    first_name, device = next(iter(present.items()))
    for name, other in present.items():
        if other != device:
            raise SpecError(f"{name} is on {other} but {first_name} is on {device}; move all tensors to one device")
    if device.type != "cuda" and not _interpreting():
        raise SpecError(f"x is on {device}; matmul_ogs runs on a CUDA device "
                        f"(on the CPU only through Triton's interpreter, TRITON_INTERPRET=1)")


def _reject_unsupported(routing_data, gather_indx, scatter_indx, fused_comm, y_acc_in, inner_routing_data,
                        pc: PrecisionConfig):
    moe = {"routing_data": routing_data is not None and routing_data.expt_hist is not None,
           "gather_indx": gather_indx is not None, "scatter_indx": scatter_indx is not None,
           "y_acc_in": y_acc_in is not None, "inner_routing_data": inner_routing_data is not None,
           "fused_comm": fused_comm is not None}
    formats = {"precision_config.act_scale": pc.act_scale is not None,
               "precision_config.weight_scale": pc.weight_scale is not None,
               "precision_config.out_scale": pc.out_scale is not None,
               "precision_config.flex_ctx": any(d.scale is not None for d in (pc.flex_ctx.lhs_data,
                                                                            pc.flex_ctx.rhs_data,
                                                                            pc.flex_ctx.acc_data))
               or pc.flex_ctx.out_data.expected_scale is not None or pc.flex_ctx.out_data.actual_scale is not None,
               "precision_config.max_num_imprecise_acc": pc.max_num_imprecise_acc is not None,
               "precision_config.enforce_bitwise_invariance": pc.enforce_bitwise_invariance}
    for name, used in {**moe, **formats}.items():
        if used:
            raise UnsupportedError(f"{name} is not supported by this ogsgen build yet; leave it None/False "
                                   f"(dense and batched matmul only)")


@lru_cache(maxsize=1024)
def _variant(x_dtype, y_dtype, bias, betas, gammas, activation, epilogue) -> KernelVariant:
    fmt = plain_format_of(x_dtype, "x")
    return KernelVariant(fmt, fmt, plain_format_of(y_dtype, "precision_config.out_dtype"), bias=bias, betas=betas,
                         gammas=gammas, activation=activation, epilogue=epilogue)


def matmul_ogs(x, w, bias, routing_data=None, gather_indx=None, scatter_indx=None, precision_config=None,
               betas=None, gammas=None, out_alpha=None, y=None, fused_comm=None, fused_activation=None,
               epilogue=None, y_acc_in=None, inner_routing_data=None):
    """Y = epilogue(gammas * act(out_alpha * (X @ W + betas * bias))), for 2-D or batched 3-D X.

    x: (M, K) or (B, M, K); w: (K, N) or (B, K, N); bias: float32 (N,) or (B, N). The result has
    ``N // reduction_n`` columns (SwiGLU halves them) and dtype ``precision_config.out_dtype`` or
    x.dtype. A preallocated ``y`` (any strides) is written and returned.
    """
    pc = precision_config if precision_config is not None else PrecisionConfig()
    act = fused_activation if fused_activation is not None else FusedActivation()
    epi = epilogue if epilogue is not None else Epilogue()
    _reject_unsupported(routing_data, gather_indx, scatter_indx, fused_comm, y_acc_in, inner_routing_data, pc)
    _check_tensor(x, "x", ndims=(2, 3))
    _check_tensor(w, "w", ndims=(2, 3))
    plain_format_of(x.dtype, "x")
    batched = x.ndim == 3
    if batched and (w.ndim != 3 or w.shape[0] != x.shape[0]):
        raise SpecError(f"batched x of shape {tuple(x.shape)} needs w of shape (B={x.shape[0]}, K, N), "
                        f"got {tuple(w.shape)}")
    if not batched and w.ndim == 3 and w.shape[0] != 1:
        raise SpecError(f"w of shape {tuple(w.shape)} holds {w.shape[0]} experts but there is no routing_data; "
                        f"pass a 2-D w (K, N) or a 3-D x for a batched matmul")
    if w.dtype != x.dtype:
        raise SpecError(f"w.dtype ({w.dtype}) must equal x.dtype ({x.dtype}); convert one with .to()")
    out_dtype = pc.out_dtype or x.dtype
    batch, m, k = (x.shape[0] if batched else 1), x.shape[-2], x.shape[-1]
    n = w.shape[-1]
    if w.shape[-2] != k:
        raise SpecError(f"x has K={k} columns but w has {w.shape[-2]} rows (w is (K, N) = {tuple(w.shape)})")
    reduction_n = act.specs.reduction_n
    if n % reduction_n:
        raise SpecError(f"w has N={n} columns, which the activation {act.specs.name} cannot fold by "
                        f"reduction_n={reduction_n}; N must be a multiple of {reduction_n}")
    n_out = n // reduction_n
    w_batch = w.shape[0] if w.ndim == 3 else 1
    _check_tensor(bias, "bias", ndims=(1, 2), dtype=torch.float32)
    if bias is not None and (bias.shape[-1] != n or (bias.ndim == 2 and bias.shape[0] not in (1, w_batch))):
        raise SpecError(f"bias must have shape ({n},) or ({w_batch}, {n}), got {tuple(bias.shape)}")
    if bias is not None and bias.stride(-1) != 1 and n > 1:
        raise SpecError("bias must be contiguous along N (stride(-1) == 1); pass bias.contiguous()")
    for name, rows in (("betas", betas), ("gammas", gammas)):
        _check_tensor(rows, name, ndims=(1,), dtype=torch.float32)
        if rows is not None and (rows.shape[0] != m or (rows.stride(0) != 1 and m > 1)):
            raise SpecError(f"{name} must be a contiguous float32 vector of length M={m}, got shape "
                            f"{tuple(rows.shape)} and stride {rows.stride()}")
    if betas is not None and bias is None:
        raise SpecError("betas scale the bias, but bias is None; pass a bias or drop betas")
    if out_alpha is not None and not isinstance(out_alpha, (int, float)):
        raise TypeError(f"out_alpha must be a Python float, got {type(out_alpha).__name__}")
    out_shape = (batch, m, n_out) if batched else (m, n_out)
    if y is not None:
        _check_tensor(y, "y", ndims=(2, 3))
        if tuple(y.shape) != out_shape and tuple(y.shape) != (1, m, n_out):
            raise SpecError(f"y must have shape {out_shape}, got {tuple(y.shape)}")
        if y.dtype != out_dtype:
            raise SpecError(f"y has dtype {y.dtype} but the output dtype is {out_dtype}; "
                            f"set precision_config.out_dtype={y.dtype} or pass a {out_dtype} y")
    _check_devices(x=x, w=w, bias=bias, betas=betas, gammas=gammas, y=y)
    if batch > _MAX_GRID_Y:
        raise SpecError(f"batched x has B={batch} > {_MAX_GRID_Y} entries, more than one launch covers; "
                        f"split the batch")
    if y is None:
        y = torch.empty(out_shape, dtype=out_dtype, device=x.device)
    if batch * m * n_out == 0:
        return y

    variant = _variant(x.dtype, out_dtype, bias is not None, betas is not None, gammas is not None,
                       None if act.specs.is_default else act.specs, None if epi.specs.is_default else epi.specs)
    kernel = loader.kernel_for(variant)
    flags = make_opt_flags(x.element_size(), batch, m, n, k, reduction_n, current_constraints())
    args = dict(
        Y=y, stride_y_b=y.stride(0) if y.ndim == 3 else 0, stride_y_m=y.stride(-2), stride_y_n=y.stride(-1),
        X=x, stride_x_b=x.stride(0) if batched else 0, stride_x_m=x.stride(-2), stride_x_k=x.stride(-1),
        W=w, stride_w_b=w.stride(0) if w.ndim == 3 else 0, stride_w_k=w.stride(-2), stride_w_n=w.stride(-1),
        out_alpha=1.0 if out_alpha is None else float(out_alpha), M=m, N=n, K=k,
        BLOCK_M=flags.block_m, BLOCK_N=flags.block_n, BLOCK_K=flags.block_k, GROUP_M=flags.group_m,
        EVEN_K=k % flags.block_k == 0, num_warps=flags.num_warps, num_stages=flags.num_stages,
    )
    if bias is not None:
        args.update(Bias=bias, stride_bias_b=bias.stride(0) if bias.ndim == 2 and bias.shape[0] > 1 else 0)
    if betas is not None:
        args["Betas"] = betas
    if gammas is not None:
        args["Gammas"] = gammas
    if variant.activation:
        args["ACTIVATION_FN"] = act.specs.fn
        args.update({ARG_PREFIX["activation"] + name: value for name, value in zip(act.specs.fn_arg_names, act.fn_args)})
    if variant.epilogue:
        args["EPILOGUE_FN"] = epi.specs.fn
        args.update({ARG_PREFIX["epilogue"] + name: value for name, value in zip(epi.specs.fn_arg_names, epi.fn_arg_values_matmul)})
    if variant.x.element == "fp32":
        args["DOT_PRECISION"] = "tf32" if pc.allow_tf32 else "ieee"
    grid = (triton.cdiv(m, flags.block_m) * triton.cdiv(n, flags.block_n), batch)
    if x.is_cuda and x.device.index != torch.cuda.current_device():
        with torch.cuda.device(x.device):
            kernel[grid](**args)
    else:
        kernel[grid](**args)
    return y
