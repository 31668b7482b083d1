"""``matmul_ogs_torch``: the plain-torch definition of what ``matmul_ogs`` computes."""
from __future__ import annotations

import torch

from ..errors import SpecError, UnsupportedError
from .types import Epilogue, FusedActivation, PrecisionConfig


def _reference_of(specs, argument: str):
    if specs.reference is None:
        raise SpecError(f"{argument}: {specs.name} has no torch reference; register it with reference=<torch fn> "
                        f"to use it in matmul_ogs_torch")
    return specs.reference


def matmul_ogs_torch(x, w, bias, routing_data=None, gather_indx=None, scatter_indx=None, precision_config=None,
                     betas=None, gammas=None, inner_routing_data=None, round_x=None, round_y=None, *,
                     out_alpha=None, fused_activation=None, epilogue=None):
    """Reference result in float32 arithmetic, returned in ``precision_config.out_dtype`` or x.dtype.

    Order (as in the kernel): X @ W, + bias * betas, * out_alpha, activation, * gammas, epilogue.
    An epilogue's torch reference is called as ``reference(tile, rows, cols, *fn_arg_values_matmul)``
    with the output row and column indices of the tile.
    """
    if any(a is not None for a in (gather_indx, scatter_indx, inner_routing_data)) or (
            routing_data is not None and routing_data.expt_hist is not None):
        raise UnsupportedError("matmul_ogs_torch: routing, gather, scatter and inner routing are not supported yet")
    pc = precision_config if precision_config is not None else PrecisionConfig()
    act = fused_activation if fused_activation is not None else FusedActivation()
    epi = epilogue if epilogue is not None else Epilogue()
    round_x = round_x or (lambda t, rows: t)
    round_y = round_y or (lambda t: t)
    batched = x.ndim == 3
    xs = x if batched else x.unsqueeze(0)
    ws = w if w.ndim == 3 else w.unsqueeze(0)
    m = xs.shape[1]
    rows = torch.arange(m, device=x.device)
    outs = []
    for b in range(xs.shape[0]):
        out = torch.matmul(round_x(xs[b], rows).float(), ws[b if ws.shape[0] > 1 else 0].float())
        if bias is not None:
            bias_row = bias if bias.ndim == 1 else bias[b if bias.shape[0] > 1 else 0]
            out = out + (bias_row[None, :] if betas is None else bias_row[None, :] * betas[:, None])
        if out_alpha is not None:
            out = out * out_alpha
        if not act.specs.is_default:
            out = _reference_of(act.specs, "fused_activation")(out, *act.fn_args)
        if gammas is not None:
            out = out * gammas[:, None]
        if not epi.specs.is_default:
            cols = torch.arange(out.shape[1], device=x.device)
            out = _reference_of(epi.specs, "epilogue")(out, rows, cols, *epi.fn_arg_values_matmul)
        outs.append(round_y(out))
    y = torch.stack(outs).to(pc.out_dtype or x.dtype)
    return y if batched else y[0]
