"""The argument types of ``matmul_ogs``, with triton_kernels' names and fields."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
import triton

from .errors import SpecError, SpecTypeError
from .spec.functions import FnSpecs


@dataclass
class GatherIndx:
    """Rows gathered into expert-sorted order: sorted row p reads x row ``src_indx[p] // n_expts_act``."""
    src_indx: torch.Tensor
    dst_indx: torch.Tensor


@dataclass
class ScatterIndx:
    """Rows scattered back: sorted row p writes token ``dst_indx[p] // n_expts_act`` (-1: nowhere)."""
    src_indx: torch.Tensor
    dst_indx: torch.Tensor


@dataclass
class RoutingData:
    gate_scal: torch.Tensor | None
    expt_hist: torch.Tensor | None
    n_expts_tot: int
    n_expts_act: int
    expt_data: object = None
    expected_tokens_per_expt: int | None = None

    def n_blocks(self, n_rows: int, block_m: int) -> int:
        """Host-side upper bound of the number of BLOCK_M row tiles over all experts."""
        if n_rows <= self.n_expts_tot:
            return n_rows
        return triton.cdiv(max(n_rows - self.n_expts_tot + 1, 0), block_m) + self.n_expts_tot - 1


@dataclass(frozen=True)
class FusedComm:
    """The output rows written straight into other GPUs' buffers (expert parallelism, tensor parallelism): with
    ``out_handles`` the int64 addresses of every rank's output buffer (one per rank, all of one shape, e.g. the
    ``buffer_ptrs`` of a ``torch.distributed._symmetric_memory`` rendezvous), local row m goes to row
    ``m * n_reduce_shards + reduce_rank`` of each destination buffer: every rank's (all-gather, ``scatter_shard_indx``
    None, world size = n_reduce_shards), or those of the shard ``s = scatter_shard_indx[m]``, ranks
    ``[s * n_reduce_shards, (s + 1) * n_reduce_shards)``. ``y`` is this rank's own buffer, (rows * n_reduce_shards,
    N). The call does not synchronize the ranks: a barrier after it (the symmetric memory handle's) does."""
    out_handles: torch.Tensor
    scatter_shard_indx: torch.Tensor | None = None
    reduce_rank: int = 0
    n_reduce_shards: int = 1


INNER_BLOCK_K = 32  # the default ragged-K tile: segments hold an expert's tokens, often a few dozen


@dataclass
class InnerRoutingData:
    """The ragged axis is K (an expert weights' gradient, dW[e] = X[seg e]^T @ dY[seg e]): ``matmul_ogs(x, w, None,
    inner_routing_data=...)`` gives y (E, M, N) with y[e] = x[:, segment e] @ w[segment e, :], where expert e's
    segment has ``base.expt_hist[e]`` entries along x's columns and w's rows, in expert order. A padded operand
    (``x_is_padded``, ``w_is_padded``) starts each segment at a multiple of ``block_k`` (the K tile; one of 16,
    32, 64, 128); an unpadded one at the running sum of the histogram. ogsgen masks every segment's end, so the
    padding and the unused tail may hold anything (NaN included). ``base.expt_data`` is made when missing."""
    base: RoutingData
    block_k: int = INNER_BLOCK_K
    x_is_padded: bool = False
    w_is_padded: bool = False


@dataclass(frozen=True)
class InFlexData:
    dtype: torch.dtype | None = None
    scale: torch.Tensor | None = None

    @property
    def is_per_batch(self) -> bool:
        return self.scale is not None and self.scale.numel() > 1


@dataclass(frozen=True)
class OutFlexData:
    dtype: torch.dtype | None = None
    expected_scale: torch.Tensor | None = None
    actual_scale: torch.Tensor | None = None
    checksum_scale: torch.Tensor | None = None


# The defaults of FlexCtx's and PrecisionConfig's fields: one shared immutable instance each, returned by a function,
# so that torch.compile(fullgraph=True) traces building them. (Dynamo can neither call a class given as a field's
# default_factory nor read a default instance kept by the generated __init__; a module global it reads.)
_NO_IN_FLEX, _NO_OUT_FLEX = InFlexData(), OutFlexData()


@dataclass(frozen=True)
class FlexCtx:
    lhs_data: InFlexData = field(default_factory=lambda: _NO_IN_FLEX)
    rhs_data: InFlexData = field(default_factory=lambda: _NO_IN_FLEX)
    out_data: OutFlexData = field(default_factory=lambda: _NO_OUT_FLEX)
    acc_data: InFlexData = field(default_factory=lambda: _NO_IN_FLEX)


_NO_FLEX = FlexCtx()


@dataclass
class PrecisionConfig:
    max_num_imprecise_acc: int | None = None
    allow_tf32: bool = True
    flex_ctx: FlexCtx = field(default_factory=lambda: _NO_FLEX)
    acc_scale: float = 1.0
    flexpoint_saturate_inf: bool = False
    report_quantization_err_fn: object = None
    act_scale: torch.Tensor | None = None
    weight_scale: torch.Tensor | None = None
    out_scale: torch.Tensor | None = None
    out_dtype: torch.dtype | None = None
    enforce_bitwise_invariance: bool = False


def _describe(value) -> str:
    """A function argument's value in an error message: a tensor by its shape and dtype, not its elements."""
    if isinstance(value, torch.Tensor):
        return f"tensor(shape={tuple(value.shape)}, dtype={value.dtype})"
    return repr(value)


def _check_fn_args(kind: str, specs: FnSpecs, values: tuple, owner: str, field: str) -> None:
    if not isinstance(specs, FnSpecs):
        raise SpecError(f"{owner}.specs must be an FnSpecs (what ogsgen.register_{kind} returns), "
                        f"got {type(specs).__name__}")
    if specs.is_default:
        if values:
            raise SpecError(f"{owner}.{field} has values ({', '.join(map(_describe, values))}) but no function; "
                            f"pass the function's FnSpecs as {owner}.specs")
        return
    specs.check_signature(kind)
    if len(values) != len(specs.fn_arg_names):
        raise SpecError(f"{owner}.{field}: {specs.name} takes {len(specs.fn_arg_names)} argument(s) "
                        f"{specs.fn_arg_names}, got {len(values)} value(s) ({', '.join(map(_describe, values))})")
    for name, value in zip(specs.fn_arg_names, values):
        if not isinstance(value, (int, float, torch.Tensor)):
            raise SpecTypeError(f"{owner}.{field}: {specs.name}'s argument {name} is {_describe(value)} "
                                f"({type(value).__name__}); kernel function arguments are numbers or tensors")


@dataclass(frozen=True)
class FusedActivation:
    specs: FnSpecs = field(default_factory=FnSpecs.default)
    fn_args: tuple = ()

    def __post_init__(self):
        object.__setattr__(self, "fn_args", tuple(self.fn_args))
        _check_fn_args("activation", self.specs, self.fn_args, "FusedActivation", "fn_args")


@dataclass(frozen=True)
class Epilogue:
    specs: FnSpecs = field(default_factory=FnSpecs.default)
    fn_arg_values_matmul: tuple = ()
    fn_arg_values_finalize: tuple = ()
    effective_itemsize: float | None = None

    def __post_init__(self):
        object.__setattr__(self, "fn_arg_values_matmul", tuple(self.fn_arg_values_matmul))
        object.__setattr__(self, "fn_arg_values_finalize", tuple(self.fn_arg_values_finalize))
        _check_fn_args("epilogue", self.specs, self.fn_arg_values_matmul, "Epilogue", "fn_arg_values_matmul")
        if self.fn_arg_values_finalize:  # values for the reduce kernel; the matmul values when empty
            _check_fn_args("epilogue", self.specs, self.fn_arg_values_finalize, "Epilogue", "fn_arg_values_finalize")
