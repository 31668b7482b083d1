"""``matmul_ogs_torch``: the plain-torch definition of what ``matmul_ogs`` computes."""
from __future__ import annotations

import torch
import torch.distributed as dist

from ..errors import SpecError
from ..numerics.fp8_blocks import quantize_fp8_torch
from ..numerics.mx import quantize_mx_torch
from ..spec.operands import ScaledOperand
from ..types import Epilogue, FusedActivation, PrecisionConfig
from .operands import scaled_output_format


def _reference_of(specs, argument: str):
    if specs.reference is None:
        raise SpecError(f"{argument}: {specs.name} has no torch reference; register it with reference=<torch fn> "
                        f"to use it in matmul_ogs_torch")
    return specs.reference


def matmul_ogs_torch(x, w, bias, routing_data=None, gather_indx=None, scatter_indx=None, precision_config=None,
                     betas=None, gammas=None, inner_routing_data=None, round_x=None, round_y=None, *,
                     out_alpha=None, fused_activation=None, epilogue=None, y_acc_in=None):
    """Reference result in float32 arithmetic, returned in ``precision_config.out_dtype`` or x.dtype.

    Per batch entry or expert, in the kernel's order: X @ W, + bias * betas, * out_alpha, activation,
    * gammas; then ``round_y`` (what a kernel's intermediate storage rounds), the top-k sum of a
    scatter (dropped gates add nothing), + y_acc_in, and the epilogue; with ``precision_config.out_scale``, the
    result quantized (mxfp8 or fp8e4m3_b128, as matmul_ogs) and its scales written into out_scale.
    ``round_x(rows, positions)`` may round the (gathered) x rows first. An epilogue's torch reference is called as
    ``reference(tile, rows, cols, *values)`` with the output row and column indices.

    In MoE mode without a scatter, output rows past the routed ones (present only when gates are
    dropped) are zero here and left unwritten by ``matmul_ogs``. With ``inner_routing_data`` (ragged K):
    y[e] = x[:, segment e] @ w[segment e, :] (+ y_acc_in[e]), x's columns gathered through ``gather_indx``.
    """
    pc = precision_config if precision_config is not None else PrecisionConfig()
    if isinstance(w, ScaledOperand):  # declared weights: their float32 values (the scales applied)
        w = w.dequantize()
    if isinstance(x, ScaledOperand):  # declared activations, likewise
        x = x.dequantize_rows()
    if inner_routing_data is not None:
        return _inner_reference(x, w, gather_indx, inner_routing_data, y_acc_in).to(pc.out_dtype or x.dtype)
    act = fused_activation if fused_activation is not None else FusedActivation()
    epi = epilogue if epilogue is not None else Epilogue()
    round_x = round_x or (lambda t, rows: t)
    round_y = round_y or (lambda t: t)

    def segment(rows_x, positions, w_e, bias_e):
        out = torch.matmul(round_x(rows_x, positions).float(), w_e.float())
        if bias_e is not None:
            out = out + (bias_e[None, :] if betas is None else bias_e[None, :] * betas[positions, None])
        if out_alpha is not None:
            out = out * out_alpha
        if not act.specs.is_default:
            out = _reference_of(act.specs, "fused_activation")(out, *act.fn_args)
        if gammas is not None:
            out = out * gammas[positions, None]
        return round_y(out)

    def bias_of(index):
        if bias is None:
            return None
        return bias if bias.ndim == 1 else bias[index if bias.shape[0] > 1 else 0]

    device, n_out = x.device, w.shape[-1] // act.specs.reduction_n
    if routing_data is not None and routing_data.expt_hist is not None:
        k = routing_data.n_expts_act
        n_rows = gather_indx.src_indx.shape[0] if gather_indx is not None else x.shape[0]
        ends = torch.cumsum(routing_data.expt_hist.long(), 0).tolist()
        out = torch.zeros((n_rows, n_out), device=device)
        for expert, (lo, hi) in enumerate(zip([0] + ends[:-1], ends)):
            positions = torch.arange(lo, hi, device=device)
            rows = gather_indx.src_indx[lo:hi].long() // k if gather_indx is not None else positions
            out[lo:hi] = segment(x[rows], positions, w[expert], bias_of(expert))
        if scatter_indx is not None:
            routed = scatter_indx.dst_indx >= 0
            summed = torch.zeros((n_rows // k, out.shape[1]), device=device)
            summed.index_add_(0, scatter_indx.dst_indx[routed].long() // k, out[routed])
            out = summed
        outs = out[None]
    else:
        xs = x if x.ndim == 3 else x.unsqueeze(0)
        ws = w if w.ndim == 3 else w.unsqueeze(0)
        positions = torch.arange(xs.shape[1], device=device)
        outs = torch.stack([segment(xs[b], positions, ws[b if ws.shape[0] > 1 else 0], bias_of(b))
                            for b in range(xs.shape[0])]) if xs.shape[0] else torch.zeros(0, xs.shape[1], n_out,
                                                                                          device=device)
    if y_acc_in is not None:
        outs = outs + (y_acc_in if y_acc_in.ndim == 3 else y_acc_in[None]).float()
    if not epi.specs.is_default:
        rows, cols = torch.arange(outs.shape[1], device=device), torch.arange(outs.shape[2], device=device)
        outs = torch.stack([_reference_of(epi.specs, "epilogue")(o, rows, cols, *epi.fn_arg_values_matmul)
                            for o in outs]) if len(outs) else outs
    outs = _quantized_output(outs, pc) if pc.out_scale is not None else outs.to(pc.out_dtype or x.dtype)
    return outs if x.ndim == 3 else outs[0]


def _quantized_output(outs: torch.Tensor, pc: PrecisionConfig) -> torch.Tensor:
    """The float32 result quantized along its rows as a kernel's epilogue quantizes an output with block scales, in
    the format ``out_scale`` chooses (as matmul_ogs's, ``scaled_output_format``); the scales are written into
    ``out_scale``, as matmul_ogs writes them."""
    _, y_fmt = scaled_output_format(pc.out_scale, pc.out_dtype)
    if y_fmt.scaling == "block_f32":
        values, scales = quantize_fp8_torch(outs, (1, y_fmt.block_size))
    else:
        values, scales = quantize_mx_torch(outs, y_fmt.element)
    if scales.numel() != pc.out_scale.numel() or scales.shape[-1] != pc.out_scale.shape[-1]:
        raise SpecError(f"precision_config.out_scale must have shape {tuple(scales.shape[-2:])} (one scale per "
                        f"block of a row of the output), got {tuple(pc.out_scale.shape)}")
    pc.out_scale.copy_(scales.reshape(pc.out_scale.shape))
    return values


def _inner_reference(x, w, gather_indx, inner, y_acc_in) -> torch.Tensor:
    """Ragged K in float32: each expert's segment of x's columns (or gathered columns) and w's rows."""
    counts = inner.base.expt_hist.long().tolist()
    k = inner.base.n_expts_act
    out = torch.zeros((len(counts), x.shape[0], w.shape[1]), device=x.device)
    start = padded_start = 0
    for expert, count in enumerate(counts):
        x_start = padded_start if inner.x_is_padded else start
        w_start = padded_start if inner.w_is_padded else start
        if gather_indx is not None:
            columns = x[:, gather_indx.src_indx[start:start + count].long() // k]
        else:
            columns = x[:, x_start:x_start + count]
        out[expert] = columns.float() @ w[w_start:w_start + count].float()
        start += count
        padded_start += -(-count // inner.block_k) * inner.block_k
    if y_acc_in is not None:
        out += y_acc_in.float()
    return out


def fused_comm_reference(outputs, rank: int, n_reduce_shards: int, scatter_shard_indx=None) -> torch.Tensor:
    """Rank ``rank``'s buffer after every rank r wrote its local output ``outputs[r]`` (rows, N) through
    ``FusedComm(reduce_rank=r % n_reduce_shards, n_reduce_shards, scatter_shard_indx[r])``: row m of rank r lands at
    row ``m * n_reduce_shards + r % n_reduce_shards`` of every rank (``scatter_shard_indx`` None, an all-gather) or
    of the ranks of shard ``scatter_shard_indx[r][m]``. Rows no rank writes are zero here."""
    rows, n = outputs[0].shape
    out = torch.zeros(rows * n_reduce_shards, n, dtype=outputs[0].dtype, device=outputs[0].device)
    for source, y in enumerate(outputs):
        interleaved = out[source % n_reduce_shards::n_reduce_shards]
        if scatter_shard_indx is None:
            interleaved.copy_(y)
        else:
            mine = scatter_shard_indx[source] == rank // n_reduce_shards
            interleaved[mine] = y[mine]
    return out


def post_matmul_comm_torch(y: torch.Tensor, rank: int, n_reduce_shards: int, world_size: int,
                           scatter_shard_indx: torch.Tensor | None = None) -> torch.Tensor:
    """What ``FusedComm`` leaves in this rank's buffer, by torch.distributed: the local outputs (and shard indices)
    all-gathered, then ``fused_comm_reference``. Call it on every rank of the default process group."""
    outputs = [torch.empty_like(y) for _ in range(world_size)]
    dist.all_gather(outputs, y.contiguous())
    shards = None
    if scatter_shard_indx is not None:
        shards = [torch.empty_like(scatter_shard_indx) for _ in range(world_size)]
        dist.all_gather(shards, scatter_shard_indx.contiguous())
    return fused_comm_reference(outputs, rank, n_reduce_shards, shards)
