"""The gradient through a fused activation and gammas, in one kernel: the backward's elementwise part.

Per matmul row p with z_p the rows before the activation (stored by the forward, or recomputed):
    g_p = dy[token of p] (a scatter) or dy_p;  d gammas_p = <g_p, act(z_p)>;
    dz_p = out_alpha * backward(z_p, gammas_p g_p)
where ``backward`` is the activation's registered gradient function (FnSpecs.backward); without an activation
act is the identity (dz_p = out_alpha gammas_p g_p, and z is read only for d gammas). Rows at or past the routed
count (a ragged call's dropped gates) get dz = 0 and d gammas = 0. A batched call's gammas hold one value per row
of a batch entry, shared by the entries. As torch ops the same is several passes over
fp32 copies of the rows (SwiGLU's: 1.6 ms of gpt-oss-120b's training step at T=2048, 2026-12-03f-train); here it
is one read of z and dy and one write of dz.
"""
from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

from ..devices import check_kernel_device
from ..errors import SpecError
from ..spec.functions import registered

Tensor = torch.Tensor

_BLOCK_M, _BLOCK_N, _NUM_WARPS = 8, 256, 4


# The row count varies from call to call: not specialized on.
@triton.jit(do_not_specialize=["n_rows"])
def _activation_backward(Z, DY, DYRows, Gammas, RoutedRows, DZ, DGammas, n_rows, N, stride_z, stride_dy, stride_dz,
                         n_expts_act, n_gammas, out_alpha, act_args, ACTIVATION_FN: tl.constexpr,
                         ACTIVATION_BACKWARD_FN: tl.constexpr, REDUCTION_N: tl.constexpr, HAS_ACTIVATION: tl.constexpr,
                         HAS_DY_ROWS: tl.constexpr, HAS_GAMMAS: tl.constexpr, HAS_ROUTED_ROWS: tl.constexpr,
                         HAS_D_GAMMAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    live = rows < n_rows
    if HAS_ROUTED_ROWS:
        live = live & (rows < tl.load(RoutedRows))
    if HAS_DY_ROWS:  # a scatter: each row's gradient is its token's row of dy
        dst = tl.load(DYRows + rows, mask=live, other=-1)
        live = live & (dst >= 0)
        dy_rows = (tl.maximum(dst, 0) // n_expts_act).to(tl.int64)
    else:
        dy_rows = rows.to(tl.int64)
    scale = tl.where(live, out_alpha, 0.0)
    if HAS_GAMMAS:  # (a batched call's gammas are one per row of a batch entry, n_gammas of them)
        gammas = tl.load(Gammas + rows % n_gammas, mask=live, other=0.0).to(tl.float32)
    d_gammas = tl.zeros((BLOCK_M,), dtype=tl.float32)
    rows_64 = rows.to(tl.int64)
    for start in range(0, N, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        out_cols = start // REDUCTION_N + tl.arange(0, BLOCK_N // REDUCTION_N)
        if HAS_ACTIVATION or HAS_D_GAMMAS:
            z = tl.load(Z + rows_64[:, None] * stride_z + cols[None, :], mask=live[:, None] & (cols < N)[None, :],
                        other=0.0).to(tl.float32)
        g = tl.load(DY + dy_rows[:, None] * stride_dy + out_cols[None, :],
                    mask=live[:, None] & (out_cols < N // REDUCTION_N)[None, :], other=0.0).to(tl.float32)
        if HAS_D_GAMMAS:
            if HAS_ACTIVATION:
                d_gammas += tl.sum(g * ACTIVATION_FN(z, *act_args), axis=1)
            else:
                d_gammas += tl.sum(g * z, axis=1)
        if HAS_GAMMAS:
            g = g * gammas[:, None]
        if HAS_ACTIVATION:
            dz = ACTIVATION_BACKWARD_FN(z, g, *act_args) * scale[:, None]
        else:
            dz = g * scale[:, None]
        tl.store(DZ + rows_64[:, None] * stride_dz + cols[None, :], dz.to(DZ.dtype.element_ty),
                 mask=(rows < n_rows)[:, None] & (cols < N)[None, :])
    if HAS_D_GAMMAS:
        tl.store(DGammas + rows, tl.where(live, d_gammas, 0.0), mask=rows < n_rows)


def activation_backward(activation: Optional[str], activation_args: list[float], z: Optional[Tensor], dy: Tensor,
                        dy_rows: Optional[Tensor], n_expts_act: int, gammas: Optional[Tensor],
                        routed_rows: Optional[Tensor], out_alpha: Optional[float], d_gammas: bool,
                        out_dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """(dz in ``out_dtype``, d gammas in fp32 per row where ``d_gammas`` (a batched call's: per row of each batch
    entry, for the caller to sum over the batch), else an empty tensor) of the matmul rows before
    the registered activation named ``activation`` (None: no activation), ``z`` (…, N) (needed for an activation
    or d gammas, else None), whose results' gradient is ``dy`` (rows of N / reduction_n columns; a scatter's rows
    read through ``dy_rows``, the forward's scatter destinations, divided by ``n_expts_act``). ``routed_rows``: a
    one-element int32 tensor, the count of rows that hold routed gates (the rest get zeros), or None when all do. Run
    by the custom op ``ogsgen::activation_backward`` (ogsgen.ops.custom_ops), so that AOTAutograd can trace the
    backward that calls it. Internal: the backward passes consistent tensors (one device, unit column stride)."""
    spec = None if activation is None else registered("activation", activation)
    if z is None and (spec is not None or d_gammas):
        raise SpecError("activation_backward needs z, the rows before the activation, for an activation or d gammas")
    check_kernel_device(dy, "dy")
    shape = _dz_shape(spec, z, dy, dy_rows)
    n = shape[-1]
    dy2 = dy.reshape(-1, dy.shape[-1])
    z2 = None if z is None else z.reshape(-1, n)
    n_rows = dy_rows.shape[0] if dy_rows is not None else dy2.shape[0]
    dz = torch.empty(n_rows, n, dtype=out_dtype, device=dy.device)
    out_gammas = torch.empty(n_rows if d_gammas else 0, dtype=torch.float32, device=dy.device)
    if n_rows:
        grid = (triton.cdiv(n_rows, _BLOCK_M),)
        _activation_backward[grid](
            z2, dy2, dy_rows, gammas, routed_rows, dz, out_gammas if d_gammas else None, n_rows, n,
            0 if z2 is None else z2.stride(0), dy2.stride(0), dz.stride(0), n_expts_act,
            1 if gammas is None else gammas.shape[0], 1.0 if out_alpha is None else float(out_alpha),
            tuple(activation_args), spec and spec.fn, spec and spec.backward, 1 if spec is None else spec.reduction_n,
            spec is not None, dy_rows is not None, gammas is not None, routed_rows is not None, d_gammas,
            BLOCK_M=_BLOCK_M, BLOCK_N=_BLOCK_N, num_warps=_NUM_WARPS)
    return dz.reshape(shape), out_gammas


def _dz_shape(spec, z, dy, dy_rows) -> tuple:
    if z is not None:
        return tuple(z.shape)
    n = dy.shape[-1] * (1 if spec is None else spec.reduction_n)
    return (dy_rows.shape[0], n) if dy_rows is not None else (*dy.shape[:-1], n)


def activation_backward_fake(activation, activation_args, z, dy, dy_rows, n_expts_act, gammas, routed_rows,
                             out_alpha, d_gammas, out_dtype):
    spec = None if activation is None else registered("activation", activation)
    shape = _dz_shape(spec, z, dy, dy_rows)
    n_rows = (dy_rows.shape[0] if dy_rows is not None else dy.numel() // dy.shape[-1]) if d_gammas else 0
    return dy.new_empty(shape, dtype=out_dtype), dy.new_empty(n_rows, dtype=torch.float32)
