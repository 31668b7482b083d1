"""A launch's arguments: the value of each parameter that ``ogsgen.spec.kernel_abi`` declares for the kernel,
computed from the call's checked inputs, the launch's flags and output, and what the runtime derives from them
(TMA descriptors, tile schedules, program counts)."""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import torch
from triton.tools.tensor_descriptor import TensorDescriptor

from ..devices import target
from ..spec import kernel_abi
from ..spec.operands import ScaledOperand
from ..spec.variant import KernelVariant
from ..types import Epilogue, FusedActivation, FusedComm, InnerRoutingData, PrecisionConfig, RoutingData
from . import loader, memory
from .descriptors import prefetch_rows, ragged_rows_descriptor
from .opt_flags import WS_BLOCK_K, WS_BLOCK_M, WS_BLOCK_N, WS_MAXNREG, OptFlags, reduce_tile, row_tiles


def cdiv(a: int, b: int) -> int:
    return -(-a // b)  # triton.cdiv costs microseconds per call on the host in recent Triton releases


@dataclass
class Call:
    """What every kernel of one call shares."""
    x_op: ScaledOperand  # x's values with their format and scales
    w_op: ScaledOperand  # w's (values as the kernel reads them: packed or swizzled)
    batch: int          # batch entries (1 unless batched)
    m: int              # rows of the matmul: x rows, or sorted rows in MoE mode
    n: int
    routing: RoutingData | None
    gather_indx: object
    scatter_indx: object
    act: FusedActivation
    epi: Epilogue
    pc: PrecisionConfig
    inner: InnerRoutingData | None = None  # ragged K: routing is then its base, with metadata
    comm: FusedComm | None = None

    @property
    def x(self) -> torch.Tensor:
        return self.x_op.values

    @property
    def w(self) -> torch.Tensor:
        return self.w_op.values

    @property
    def k(self) -> int:
        return self.w_op.k


class MatmulInputs:
    """What the matmul kernels' argument values are computed from. ``out``: the tensor the kernel writes, (M, N) /
    (B, M, N) rows or (S, B, M, N) fp32 split-K partials."""

    def __init__(self, variant: KernelVariant, call: Call, flags: OptFlags, out: torch.Tensor, *, bias, betas, gammas,
                 y_acc_in, out_alpha, split_k: int = 1, preact=None):
        self.variant, self.call, self.flags, self.out = variant, call, flags, out
        self.bias, self.betas, self.gammas, self.y_acc_in = bias, betas, gammas, y_acc_in
        self.preact = preact  # the rows before the activation (variant.preact)
        self.out_alpha, self.split_k = out_alpha, split_k

    def with_flags(self, flags: OptFlags) -> "MatmulInputs":
        """The same launch with other flags (the tile that replaces a binary with the wgmma register hazard)."""
        return MatmulInputs(self.variant, self.call, flags, self.out, bias=self.bias, betas=self.betas,
                            gammas=self.gammas, y_acc_in=self.y_acc_in, out_alpha=self.out_alpha,
                            split_k=self.split_k, preact=self.preact)

    @property
    def epilogue_values(self) -> tuple:
        return self.call.epi.fn_arg_values_matmul

    @cached_property
    def offsets_64(self) -> bool:
        call = self.call
        return memory.needs_64bit_offsets(
            (call.x, (-1,)), (call.w, (-2, -1)), (self.out, (0, -1) if self.split_k > 1 else (-1,)),
            (self.y_acc_in, (-1,)), (call.w_op.block_scales, (-2, -1)), (call.x_op.block_scales, (-1,)),
            (call.pc.out_scale, (-1,)), (self.preact, (-1,)))

    @cached_property
    def n_row_tiles(self) -> int:
        """Row tiles of a ragged call: at most this many entries of the block schedule are used."""
        return row_tiles(self.call.m, self.flags.block_m, self.call.routing.n_expts_tot)

    def tiled_grid(self) -> tuple[int, int, int]:
        if self.variant.inner:  # programs loop over the tiles: one per SM where the flags ask for persistence
            return (self.n_programs if self.flags.persistent else self._tiles), 1, 1
        grid_m = self.n_row_tiles if self.variant.ragged else cdiv(self.call.m, self.flags.block_m)
        return grid_m * cdiv(self.call.n, self.flags.block_n), self.call.batch, self.split_k

    # The persistent kernel's TMA descriptors: x (ragged rows, or batch, rows, K), w (experts or batch, K, N) and,
    # where that kernel stores by TMA, Y (as x) in half tiles.

    @cached_property
    def x_desc(self) -> TensorDescriptor:
        if self.variant.ragged:
            return ragged_rows_descriptor(self.call.x, self.flags.block_m, self.flags.block_k)
        return TensorDescriptor.from_tensor(_as_3d(self.call.x), [1, self.flags.block_m, self.flags.block_k])

    @cached_property
    def w_k_major(self) -> bool:
        """w's K is contiguous and its N is not (nn.Linear weights, or vLLM's (E, N, K) ones, viewed transposed): the
        persistent kernel reads it through a descriptor of w.mT."""
        return self.call.w.stride(-1) != 1

    @property
    def w_desc(self) -> TensorDescriptor:
        w3, flags = _as_3d(self.call.w), self.flags
        if self.w_k_major:
            descriptor = TensorDescriptor.from_tensor(w3.mT, [1, flags.block_n, flags.block_k])
            # Tile rows of 128 bytes along K, the next K step's in the next 128: fetched into L2 256 bytes at a time
            return prefetch_rows(descriptor) if flags.block_k * w3.element_size() <= 128 else descriptor
        return TensorDescriptor.from_tensor(w3, [1, flags.block_k, flags.block_n])

    @property
    def y_desc(self) -> TensorDescriptor:
        block = [self.flags.block_m, self.flags.block_n // 2 // self.variant.reduction_n]  # the epilogue's half tiles
        if self.variant.ragged:  # (a ragged call's y may carry a batch dimension of 1)
            return ragged_rows_descriptor(self.out[0] if self.out.ndim == 3 else self.out, *block)
        return TensorDescriptor.from_tensor(_as_3d(self.out), [1, *block])

    # The warp-specialized kernel's (Gluon's descriptors, with the shared-memory layout of their tiles): x's sorted
    # rows (rows, K) in 128 x 128 boxes, w as (experts * N, K), K-contiguous, in 128 x 128 boxes.

    @property
    def ws_x_desc(self):
        return _gluon_descriptor(self.call.x, [WS_BLOCK_M, WS_BLOCK_K])

    @property
    def ws_w_desc(self):
        w = self.call.w.mT  # (experts, N, K), K-contiguous (the kernel's blocker checks it)
        return _gluon_descriptor(w.reshape(-1, w.shape[-1]), [WS_BLOCK_N, WS_BLOCK_K])

    @cached_property
    def _tiles(self) -> int:
        call = self.call
        row_tiles_ = self.n_row_tiles if self.variant.ragged else call.batch * cdiv(call.m, self.flags.block_m)
        return row_tiles_ * cdiv(call.n, self.flags.block_n)

    @cached_property
    def n_programs(self) -> int:
        """One program per SM; the interpreter (CPU) gets three, so that its programs, too, loop over tiles."""
        call = self.call
        return max(1, min(self._tiles, target(call.x.device).sm_count if call.x.is_cuda else 3))


class ReduceInputs:
    """What the reduce kernel's argument values are computed from: ``parts`` summed into ``out`` (B, M, N //
    reduction_n). Split K: ``parts`` (S, B, M, N). A scatter: ``parts`` the matmul's rows (sorted rows, N), or their
    split-K partials (split, sorted rows, N); ``scatter_src`` (M * S) the sorted row of each token's S gates (-1:
    dropped)."""

    def __init__(self, variant: KernelVariant, call: Call, parts: torch.Tensor, out: torch.Tensor, *, gammas,
                 epilogue_values: tuple, scatter_src=None):
        self.variant, self.call, self.parts, self.out = variant, call, parts, out
        self.gammas, self.epilogue_values, self.scatter_src = gammas, epilogue_values, scatter_src
        # (with fused communication, out is this rank's buffer: its rows interleave the reduce shards')
        self.m = out.shape[1] // (call.comm.n_reduce_shards if call.comm is not None else 1)
        self.n = parts.shape[-1]
        self.block_m, self.block_n, self.num_warps = reduce_tile(self.n, variant.reduction_n, variant.y.block_size)
        self.offsets_64 = memory.needs_64bit_offsets((parts, (-1,)), (out, (-1,)), (call.pc.out_scale, (-1,)))

    def grid(self) -> tuple[int, int, int]:
        return cdiv(self.m, self.block_m) * cdiv(self.n, self.block_n), self.out.shape[0], 1


def kernel_arguments(variant: KernelVariant, kernel: str, inputs) -> dict:
    """The launch arguments of ``variant``'s ``kernel``: each declared parameter's value, by name."""
    return {p.name: p.value(inputs) for p in kernel_abi.parameters(variant, kernel)}


def matmul_launch(inputs: MatmulInputs) -> tuple:
    """(kernel, grid, arguments, options) of the matmul kernel for the inputs' flags."""
    variant, flags = inputs.variant, inputs.flags
    if flags.warp_specialized:
        args = kernel_arguments(variant, "warp_specialized", inputs)
        # 12 warps: the kernel's 4 (a consumer warpgroup) and its partitions', registers set per partition
        return loader.kernel_for(variant, "warp_specialized"), (inputs.n_programs, 1, 1), args, \
            dict(num_warps=4, maxnreg=WS_MAXNREG)
    # (a ragged-K variant has one kernel, whose programs loop over tiles: flags.persistent sets their count)
    kernel = "persistent" if flags.persistent and not variant.inner else "tiled"
    args = kernel_arguments(variant, kernel, inputs)
    grid = (inputs.n_programs, 1, 1) if kernel == "persistent" else inputs.tiled_grid()
    return loader.kernel_for(variant, kernel), grid, args, launch_options(flags)


def reduce_launch(inputs: ReduceInputs) -> tuple:
    """(kernel, grid, arguments, options) of the reduce kernel."""
    args = kernel_arguments(inputs.variant, "reduce", inputs)
    return loader.kernel_for(inputs.variant), inputs.grid(), args, dict(num_warps=inputs.num_warps)


def launch_options(flags: OptFlags) -> dict:
    """Triton's compile options for these flags."""
    options = dict(num_warps=flags.num_warps, num_stages=flags.num_stages)
    if flags.maxnreg is not None:
        options["maxnreg"] = flags.maxnreg
    return options


def _gluon_descriptor(t: torch.Tensor, block: list[int]):
    from ..numerics.gluon_hopper import gl, hopper_descriptor  # (Gluon is imported where a call takes the kernel)
    return hopper_descriptor(t, block, gl.NVMMASharedLayout.get_default_for(block, gl.float8e4nv))


def _as_3d(t: torch.Tensor) -> torch.Tensor:
    return t if t.ndim == 3 else t.unsqueeze(0)
