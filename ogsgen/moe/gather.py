"""x's rows in the expert-sorted order of a routing (``ogsgen.moe.gather_rows``): a public utility for code that
wants the gathered copy itself. (ogsgen's own kernels read gathered rows in place; the persistent kernel read this
copy until 2026-12-03, docs/heuristics.md, "Gather copy".)"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..devices import check_kernel_device
from ..errors import SpecError

# The fastest of ten tiles, within 2%, on the bench's prefill cases (docs/heuristics.md, "Gather copy").
_BLOCK_ROWS, _BLOCK_K, _NUM_WARPS = 8, 256, 4


# Row counts and top-k vary from call to call: not specialized on, so that ogsgen warmup's binary serves them all.
@triton.jit(do_not_specialize=["n_rows", "n_expts_act"])
def _gather_rows(X, Y, GateIndx, n_rows, K, stride_x_m, stride_x_k, stride_y, n_expts_act,
                 BLOCK_ROWS: tl.constexpr, BLOCK_K: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    cols = tl.program_id(1) * BLOCK_K + tl.arange(0, BLOCK_K)
    gates = tl.load(GateIndx + rows, mask=rows < n_rows, other=-1)
    live = gates >= 0
    tokens = (gates // n_expts_act).to(tl.int64)
    mask = live[:, None] & (cols < K)[None, :]
    # 64-bit column offsets: a K-major x of 2**31 elements or more would overflow 32-bit ones, and the copy is
    # bound by memory, not by the address arithmetic
    row = tl.load(X + tokens[:, None] * stride_x_m + cols.to(tl.int64)[None, :] * stride_x_k, mask=mask)
    tl.store(Y + rows.to(tl.int64)[:, None] * stride_y + cols[None, :], row, mask=mask)


def gather_rows(x: torch.Tensor, gate_indx: torch.Tensor, n_expts_act: int) -> torch.Tensor:
    """Row p of the result is ``x[gate_indx[p] // n_expts_act]`` (``gate_indx``: a GatherIndx's ``src_indx``, the
    gate each sorted row holds). A dropped gate's row (-1) is left unwritten: no tile stores a result for it,
    and a matmul's output row depends on its own x row only."""
    if not isinstance(x, torch.Tensor) or x.ndim != 2:
        raise SpecError(f"x must be a (n_tokens, K) tensor, got "
                        f"{tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__}")
    if not isinstance(gate_indx, torch.Tensor) or gate_indx.ndim != 1 or gate_indx.dtype != torch.int32:
        raise SpecError("gate_indx must be a 1-D int32 tensor (a GatherIndx's src_indx), got "
                        + (f"{gate_indx.dtype} of shape {tuple(gate_indx.shape)}" if isinstance(gate_indx, torch.Tensor)
                           else type(gate_indx).__name__))
    if gate_indx.device != x.device:
        raise SpecError(f"gate_indx is on {gate_indx.device} but x is on {x.device}; pass both on one device")
    if not isinstance(n_expts_act, int) or n_expts_act < 1:
        raise SpecError(f"n_expts_act must be a positive int (the routing's top-k), got {n_expts_act!r}")
    check_kernel_device(x, "x")
    out = torch.empty(gate_indx.numel(), x.shape[1], device=x.device, dtype=x.dtype)
    gate_indx = gate_indx.contiguous()  # the kernel reads it with unit stride
    n_rows, k = gate_indx.numel(), x.shape[1]
    if n_rows and k:
        grid = (triton.cdiv(n_rows, _BLOCK_ROWS), triton.cdiv(k, _BLOCK_K))
        _gather_rows[grid](x, out, gate_indx, n_rows, k, x.stride(0), x.stride(1), out.stride(0), n_expts_act,
                           BLOCK_ROWS=_BLOCK_ROWS, BLOCK_K=_BLOCK_K, num_warps=_NUM_WARPS)
    return out
