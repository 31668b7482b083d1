"""ogsgen's torch.library custom ops, all of them: ``ogsgen::matmul_ogs`` and ``ogsgen::matmul_ogs_inner`` (ragged
K), whose launches are ``launches``'s, matmul_ogs with its autograd formula (``gradients``),
``ogsgen::activation_backward`` (the backward's fused elementwise kernel) and ``ogsgen::routing_metadata`` (routing's
kernels: routing is torch operations around this one op), each with a fake (meta) implementation. torch.compile and
torch.export trace them as single nodes, AOTAutograd takes their backward from here, and a CUDA graph captures their
launches.

This module imports torch and nothing else: ``import ogsgen`` imports it as soon as torch is imported (see
ogsgen/__init__.py), so that ``torch.ops.ogsgen.*`` exists in every process that imports ogsgen (a program saved by
torch.export loads in a fresh one) without the cost of importing Triton and the runtime, which each op imports at
its first call. The schemas are spelled out: they are what saved programs refer to.
"""
from __future__ import annotations

import importlib

import torch


def _later(module: str, name: str):
    """The function ``name`` of ``module`` (relative to this package), imported when first called."""
    def call(*args, **kwargs):
        return getattr(importlib.import_module(module, __package__), name)(*args, **kwargs)
    return call


def _op(name: str, schema: str, module: str, function: str, fake: str):
    op = torch.library.custom_op(f"ogsgen::{name}", _later(module, function), mutates_args=(), schema=schema)
    op.register_fake(_later(module, fake))
    return op


matmul_ogs_op = _op(
    "matmul_ogs", "(Tensor x, Tensor w, Tensor? bias, Tensor? expt_hist, Tensor? slice_offs, Tensor? block_offs, "
    "Tensor? block_schedule, Tensor? gather_src, Tensor? gather_dst, Tensor? scatter_src, Tensor? scatter_dst, "
    "Tensor? betas, Tensor? gammas, Tensor? y_acc_in, SymInt n_expts_tot, SymInt n_expts_act, float? out_alpha, "
    "str? activation, float[] activation_args, ScalarType? out_dtype, bool allow_tf32, bool save_preact) "
    "-> (Tensor, Tensor)", ".launches", "matmul_ogs", "matmul_ogs_fake")
matmul_ogs_op.register_autograd(_later(".gradients", "matmul_ogs_backward"),
                                setup_context=_later(".gradients", "matmul_ogs_setup_context"))
matmul_ogs_inner_op = _op(
    "matmul_ogs_inner", "(Tensor x, Tensor w, Tensor expt_hist, Tensor? slice_offs, Tensor? block_offs, "
    "Tensor? block_schedule, Tensor? gather_src, SymInt n_expts_act, SymInt block_k, ScalarType? out_dtype, "
    "bool allow_tf32) -> Tensor", ".launches", "matmul_ogs_inner", "matmul_ogs_inner_fake")
activation_backward_op = _op(
    "activation_backward", "(str? activation, float[] activation_args, Tensor? z, Tensor dy, Tensor? dy_rows, "
    "SymInt n_expts_act, Tensor? gammas, Tensor? routed_rows, float? out_alpha, bool d_gammas, "
    "ScalarType out_dtype) -> (Tensor, Tensor)", ".activation_backward", "activation_backward",
    "activation_backward_fake")
routing_metadata_op = _op(
    "routing_metadata", "(Tensor expt_indx, SymInt n_expts_tot, SymInt n_rows) -> (Tensor, Tensor, Tensor, Tensor)",
    "..moe.metadata", "routing_metadata", "routing_metadata_fake")
