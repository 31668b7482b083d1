"""triton_kernels' routing objects, shared by the three generations' packages: ``topk`` and its ``Bitmatrix``,
``SparseMatrix`` with its ``mask_metadata`` (3.6 and later), ``routing_from_bitmatrix`` (3.5 and earlier), and
``RaggedTensorMetadata``. They are ogsgen's routing under triton_kernels' names: the experts come from
``ogsgen.moe.select_experts`` and the sorted order, histogram and ragged metadata from ``ogsgen.routing_from_topk``
and ``ogsgen.moe.make_ragged_tensor_metadata``.

Conventions (triton_kernels' since its 3.6 fix of the two names): gate ``g = token * k + slot``;
``col_sorted_indx[p]`` is the gate at expert-sorted position p (ogsgen's ``GatherIndx.src_indx``) and
``row_sorted_indx[g]`` the sorted position of gate g (``ScatterIndx.src_indx``), -1 for a dropped gate.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..errors import SpecError, UnsupportedError
from ..moe import routing_from_topk
from ..moe.checks import host_checks_apply
from ..moe.metadata import BLOCK_SIZES
from ..moe.metadata import RaggedTensorMetadata as _RaggedTensorMetadata
from ..moe.metadata import make_ragged_tensor_metadata as _make_ragged_tensor_metadata
from ..moe import select_experts
from ..types import RoutingData as _RoutingData
from ._tensor import Bitmatrix, plain_operand

_WORD = 32  # a Bitmatrix word's bits: experts per word


class RaggedTensorMetadata(_RaggedTensorMetadata):
    """ogsgen's ragged metadata with triton_kernels' extra names (``block_sizes()``, ``n_slices``). Unpadded
    slices only: ``slice_sizes_divisibility`` is None."""
    slice_sizes_divisibility = None
    expected_slice_size = None

    @staticmethod
    def block_sizes() -> list[int]:
        return list(BLOCK_SIZES)

    @property
    def n_slices(self) -> int:
        return self.slice_sizes.shape[0]


def make_ragged_tensor_metadata(slice_sizes: torch.Tensor, n_gates: int) -> RaggedTensorMetadata:
    """triton_kernels' ``make_ragged_tensor_metadata(slice_sizes, n_gates)``: ogsgen's, on the device."""
    meta = _make_ragged_tensor_metadata(slice_sizes, n_gates)
    return RaggedTensorMetadata(meta.slice_sizes, meta.slice_offs, meta.block_offs_data, meta.block_schedule_data)


def fit_metadata(meta, n_expts: int, name: str):
    """``meta`` for the ``n_expts`` experts of a call's weights: triton_kernels' routing counts the experts of whole
    32-expert bitmatrix words, the slices past ``n_expts`` are empty and are dropped (once per metadata)."""
    if not isinstance(meta, _RaggedTensorMetadata):
        return meta  # (ogsgen's checks name the type it must have)
    n_slices = meta.slice_sizes.shape[0]
    if n_slices == n_expts:
        return meta
    fitted = meta.__dict__.get("_fitted")
    if fitted is not None and fitted[0] == n_expts:
        return fitted[1]
    if n_slices < n_expts:
        raise SpecError(f"{name} describes {n_slices} experts but the weights hold {n_expts}")
    if host_checks_apply(meta.slice_sizes) and bool(meta.slice_sizes[n_expts:].any()):
        raise SpecError(f"{name} routes rows to experts past the weights' {n_expts}: slice_sizes[{n_expts}:] = "
                        f"{meta.slice_sizes[n_expts:].tolist()}; pass the weights of every expert the routing names")
    trimmed = RaggedTensorMetadata(meta.slice_sizes[:n_expts], meta.slice_offs[:n_expts + 1].contiguous(),
                                   meta.block_offs_data[:, :n_expts + 1].contiguous(), meta.block_schedule_data)
    meta.__dict__["_fitted"] = (n_expts, trimmed)
    return trimmed


@dataclass
class RoutingData(_RoutingData):
    """ogsgen's RoutingData as triton_kernels >= 3.6 callers build it from ``make_ragged_tensor_metadata``: an
    ``expt_hist`` that is not a tensor (``metadata.block_sizes``, as vLLM passes) or is the metadata's own
    ``slice_sizes`` becomes the metadata's histogram for ``n_expts_tot`` experts, and ``gate_scal`` of another
    float dtype is read as float32 (what ogsgen's gammas are)."""

    def __post_init__(self):
        meta = self.expt_data
        if isinstance(meta, _RaggedTensorMetadata):
            self.expt_data = fit_metadata(meta, self.n_expts_tot, "routing_data.expt_data")
            if not isinstance(self.expt_hist, torch.Tensor) or self.expt_hist is meta.slice_sizes:
                self.expt_hist = self.expt_data.slice_sizes
        self.gate_scal = as_float32(self.gate_scal)


def as_float32(value):
    """A floating tensor as float32 (triton_kernels' kernels read gate weights of any float dtype, ogsgen's take
    float32); anything else as it is, for ogsgen's checks to name."""
    if isinstance(value, torch.Tensor) and value.dtype.is_floating_point and value.dtype != torch.float32:
        return value.float()
    return value


@dataclass
class BitmatrixMetadata:
    col_sum: torch.Tensor          # rows (gates) per expert
    col_sorted_indx: torch.Tensor  # sorted position -> gate
    row_sorted_indx: torch.Tensor  # gate -> sorted position


def _words(expt_indx: torch.Tensor, n_cols: int) -> torch.Tensor:
    """The bitmatrix words of top-k expert ids (n_rows, k), -1 for none: uint32 (n_rows, cdiv(n_cols, 32))."""
    n_words = -(-n_cols // _WORD)
    ids = expt_indx.long()
    bits = torch.zeros(ids.shape[0], n_words * _WORD, dtype=torch.int64, device=ids.device)
    bits.scatter_reduce_(1, ids.clamp_min(0), (ids >= 0).long(), "amax")
    weights = torch.ones(_WORD, dtype=torch.int64, device=ids.device) << torch.arange(_WORD, device=ids.device)
    return (bits.view(ids.shape[0], n_words, _WORD) * weights).sum(-1).to(torch.int32).view(torch.uint32)


def check_bitmatrix(mask, expt_indx: torch.Tensor, name: str) -> None:
    """Where the routing checks read back (the CPU, OGSGEN_DEBUG=1): ``mask`` holds exactly the experts of
    ``expt_indx``. (ogsgen routes by the ids; triton_kernels counts by the bitmatrix: the two must agree.)"""
    if not isinstance(mask, Bitmatrix):
        raise SpecError(f"{name} must be a Bitmatrix (Bitmatrix(words, shape=[n_rows, n_cols])), got "
                        f"{type(mask).__name__}")
    if not host_checks_apply(expt_indx):
        return
    expected = _words(expt_indx, mask.shape[1]).view(torch.int32)
    data = mask.storage.data
    if data.dtype not in (torch.uint32, torch.int32) or data.ndim != 2 or data.shape[1] != expected.shape[1] \
            or data.shape[0] < expected.shape[0] or not torch.equal(data[:expected.shape[0]].view(torch.int32),
                                                                    expected):
        raise SpecError(f"{name} does not hold the experts of the ids it comes with (bit e % 32 of word e // 32 set "
                        f"for each expert e of a row): ogsgen routes by the ids, triton_kernels by the bits, and "
                        f"they must agree; rebuild the bitmatrix from the ids")


def select_topk(x, k: int, apply_softmax: bool, dim: int, y_indx, n_rows):
    """(vals in x's dtype, indx int16, Bitmatrix) of triton_kernels' ``topk``: each row's k largest entries (or the
    ``y_indx`` ones) sorted by expert id, softmaxed over the k with ``apply_softmax``."""
    x = plain_operand(x, "x")
    if dim != 1:
        raise SpecError(f"topk: dim={dim!r}; the experts are x's columns, dim=1")
    if n_rows is not None:
        raise UnsupportedError("topk: n_rows (route only the first rows of x) has no ogsgen counterpart; pass "
                               "x[:n_rows]")
    ids, scores = select_experts(x, k, expt_indx=y_indx)
    vals = torch.softmax(scores, dim=-1) if apply_softmax else scores
    n_cols = x.shape[1]
    words = _words(ids, n_cols)
    shape = [x.shape[0], words.shape[1] * _WORD]
    return vals.to(x.dtype), ids.to(torch.int16), Bitmatrix(words, shape=shape, shape_max=list(shape))


@dataclass
class SparseMatrix:
    """Top-k choices as a sparse (tokens, experts) matrix: ``indx`` and ``vals`` (n_tokens, k), ``mask`` their
    Bitmatrix; ``mask_metadata`` holds the expert histogram and the dispatch and combine orders."""
    indx: torch.Tensor
    vals: torch.Tensor
    mask: Bitmatrix

    def __post_init__(self):
        check_bitmatrix(self.mask, self.indx, "SparseMatrix.mask")
        routing_data, gather, scatter = routing_from_topk(self.indx, self.vals, self.mask.shape[1])
        self.mask_metadata = BitmatrixMetadata(routing_data.expt_hist, gather.src_indx, scatter.src_indx)


def topk(x, k, apply_softmax=True, dim=1, y_indx=None, n_rows=None, all_gather=False, symm_mem_pool=None):
    """triton_kernels >= 3.6's ``topk``: each row's ``k`` largest entries of ``x`` (or the experts ``y_indx``
    names) as a ``SparseMatrix`` (vals in x's dtype, softmaxed over the k with ``apply_softmax``; indx int16, sorted
    by expert id). ``ogsgen.moe.select_experts`` chooses them."""
    if all_gather or symm_mem_pool is not None:
        raise UnsupportedError("topk: all_gather / symm_mem_pool (the top-k of every rank, gathered in symmetric "
                               "memory) has no ogsgen counterpart; route each rank's own logits (for a rank's share "
                               "of the experts: ogsgen.expert_parallel_routing)")
    vals, indx, mask = select_topk(x, k, apply_softmax, dim, y_indx, n_rows)
    return SparseMatrix(indx=indx, vals=vals, mask=mask)


def routing_from_bitmatrix(bitmatrix, expt_scal, expt_indx, n_expts_tot, n_expts_act):
    """triton_kernels <= 3.5's ``routing_from_bitmatrix``: ``ogsgen.routing_from_topk(expt_indx, expt_scal,
    n_expts_tot)``, the bitmatrix checked against the ids where the routing checks read back."""
    if not isinstance(expt_indx, torch.Tensor) or expt_indx.ndim != 2 or expt_indx.shape[1] != n_expts_act:
        raise SpecError(f"routing_from_bitmatrix: expt_indx must be (n_tokens, n_expts_act={n_expts_act}) expert ids, "
                        f"got {tuple(expt_indx.shape) if isinstance(expt_indx, torch.Tensor) else expt_indx!r}")
    check_bitmatrix(bitmatrix, expt_indx, "bitmatrix")
    return routing_from_topk(expt_indx, expt_scal, n_expts_tot)


__all__ = ["Bitmatrix", "BitmatrixMetadata", "RaggedTensorMetadata", "RoutingData", "SparseMatrix",
           "make_ragged_tensor_metadata", "routing_from_bitmatrix", "topk"]
