"""A catalog of bad inputs across the public API: each raises an ogsgen.OgsgenError whose message names
the offending argument (and, where the case says so, what to do about it), before any kernel runs.

Cases marked xfail are bad inputs that today give an unclear error (a raw Python/torch exception, a message that
does not name the argument or misleads) or none at all; each reason says what is wrong. Remove the mark with the fix.
"""
import re
from functools import cache

import numpy as np
import pytest
import torch
import triton

import ogsgen
from ogsgen import (Epilogue, FlexCtx, FusedActivation, GatherIndx, InFlexData, InnerRoutingData, OutFlexData,
                    PrecisionConfig, RoutingData, ScatterIndx, matmul_ogs)
from ogsgen.moe import checks as routing_checks
from ogsgen.numerics import quantize_mx
from ogsgen.spec import (BF16, FP16, FP32, KernelVariant, NumericFormat, format_named, load_catalog_file,
                         variant_product)

HAS_CUDA = torch.cuda.is_available()
SpecTypeError, Unsupported = ogsgen.SpecTypeError, ogsgen.UnsupportedError
Inapplicable, CatalogError = ogsgen.InapplicableConstraintError, ogsgen.CatalogError

M, K, N, E, TOPK = 8, 16, 32, 4, 2     # tokens, K, N, experts, experts per token
GATES = M * TOPK                        # sorted rows of a MoE call


# Functions for the registration cases (module level: ogsgen reads their source; unique names: names are claimed
# process-wide).
@triton.jit
def _bad_inputs_scale(tile, alpha):
    return tile * alpha


@triton.jit
def _bad_inputs_affine(tile, alpha, beta):
    return tile * alpha + beta


@triton.jit
def _bad_inputs_add_const(tile, offs_m, offs_n, mask, c):
    return tile + c


ADD_CONST = ogsgen.register_epilogue(_bad_inputs_add_const, arg_names=("c",))
SWIGLU = FusedActivation(ogsgen.swiglu, (1.702, 7.0))


@cache
def _routing(device: str, ids: tuple = ((0, 1), (1, 2), (2, 3), (3, 0), (0, 2), (1, 3), (0, 3), (1, 2))):
    """A fixed top-2 routing of M tokens over E experts (4 gates each): (RoutingData, GatherIndx, ScatterIndx)."""
    topk_ids = torch.tensor(ids, dtype=torch.int32, device=device)
    return ogsgen.routing_from_topk(topk_ids, torch.full(topk_ids.shape, 0.5, device=device), E)


class Ctx:
    """What a case builds its inputs from: tiny tensors on the test's device, a fixed routing, a scratch folder."""

    def __init__(self, device, tmp_path):
        self.device, self.tmp = device, tmp_path

    def randn(self, *shape, dtype=torch.float16):
        return torch.randn(*shape, device=self.device, dtype=dtype)

    def zeros(self, *shape, dtype=torch.float32):
        return torch.zeros(*shape, device=self.device, dtype=dtype)

    def ones(self, *shape, dtype=torch.float32):
        return torch.ones(*shape, device=self.device, dtype=dtype)

    def meta(self, *shape, dtype=torch.float32):
        return torch.empty(*shape, device="meta", dtype=dtype)

    @property
    def x(self):            # (M, K) fp16 tokens
        return self.randn(M, K)

    @property
    def xs(self):           # (GATES, K) fp16 rows already in expert-sorted order (a scatter's input)
        return self.randn(GATES, K)

    @property
    def w(self):            # (K, N) fp16
        return self.randn(K, N)

    @property
    def wE(self):           # (E, K, N) fp16, one matrix per expert
        return self.randn(E, K, N)

    @property
    def packed(self):       # (K // 2, N) packed mxfp4 values
        return self.zeros(K // 2, N, dtype=torch.uint8)

    @property
    def rd(self):
        return _routing(self.device)[0]

    @property
    def gi(self):
        return _routing(self.device)[1]

    @property
    def si(self):
        return _routing(self.device)[2]

    def hist(self, *counts):
        return torch.tensor(counts, dtype=torch.int32, device=self.device)

    def swizzled(self):
        return ogsgen.swizzle_mx_values(self.packed, capability=(9, 0))

    def scales(self, *shape):
        return self.zeros(*shape, dtype=torch.uint8)

    def file(self, name, text):
        path = self.tmp / name
        path.write_text(text)
        return path


def pc(**fields):
    return PrecisionConfig(**fields)


def flex(**fields):
    return PrecisionConfig(flex_ctx=FlexCtx(**fields))


def constrained(call, **constraints):
    def run(c):
        with ogsgen.opt_flags_constraints(**constraints):
            return call(c)
    return run


def on_demand_as(value):
    def run(c):
        from ogsgen.runtime import loader
        saved = loader._on_demand
        try:
            ogsgen.set_on_demand(value)
        finally:
            loader._on_demand = saved
            loader._kernels.clear()
    return run


# --------------------------------------------------------------------------------------------------------------------
# The catalog. bad(id, call, argument[, fix]): call(ctx) must raise ``exc`` (an OgsgenError) whose message matches
# the regex ``argument`` (naming the argument) and, when given, the regex ``fix`` (what to do).
# --------------------------------------------------------------------------------------------------------------------

def bad(case_id, call, argument, fix=None, exc=ogsgen.OgsgenError, xfail=None, xfail_on_cpu_only=False,
        host_check=False, crashes_cuda=None):
    marks = []
    if crashes_cuda:  # cannot be an xfail there: the failure takes the process's CUDA context with it
        marks.append(pytest.mark.skipif(HAS_CUDA, reason=crashes_cuda))
    if xfail:
        marks.append(pytest.mark.xfail(condition=not (xfail_on_cpu_only and HAS_CUDA), strict=True, reason=xfail))
    if host_check:  # checks that read routing data back to the host: on a GPU only with OGSGEN_DEBUG=1
        marks.append(pytest.mark.skipif(HAS_CUDA and not routing_checks.DEBUG,
                                        reason="a host-side routing check: on a GPU it runs with OGSGEN_DEBUG=1"))
    return pytest.param(call, exc, argument, fix, id=case_id, marks=marks)


RAW = "raw {} instead of an OgsgenError naming the argument"
MOVE = "move all tensors to one device"

MATMUL_OPERANDS = [
    bad("x=list", lambda c: matmul_ogs(c.x.tolist(), c.w, None), r"x must be a torch\.Tensor, got list",
        exc=SpecTypeError),
    bad("x=None", lambda c: matmul_ogs(None, c.w, None), r"\bx\b.*(torch\.Tensor|None)", exc=SpecTypeError),
    bad("w=None", lambda c: matmul_ogs(c.x, None, None), r"\bw\b.*(torch\.Tensor|None)", exc=SpecTypeError),
    bad("w=numpy", lambda c: matmul_ogs(c.x, np.zeros((K, N), np.float16), None),
        r"w must be a torch\.Tensor, got ndarray", exc=SpecTypeError),
    bad("x-4d", lambda c: matmul_ogs(c.x.reshape(1, 1, M, K), c.w, None), r"x must have 2 or 3 dimensions"),
    bad("x-float64", lambda c: matmul_ogs(c.x.double(), c.w.double(), None), r"x has dtype torch\.float64",
        r"bfloat16, float16 and float32"),
    bad("w-int8", lambda c: matmul_ogs(c.x, c.w.to(torch.int8), None), r"w has dtype torch\.int8"),
    bad("w-bf16-x-fp16", lambda c: matmul_ogs(c.x, c.w.bfloat16(), None),
        r"w\.dtype \(torch\.bfloat16\) must equal x\.dtype \(torch\.float16\)", r"convert one with \.to\(\)"),
    bad("x-fp8-w-bf16", lambda c: matmul_ogs(c.x.to(torch.float8_e4m3fn), c.w.bfloat16(), None),
        r"x torch\.float8_e4m3fn with w torch\.bfloat16.*fp8 x needs fp8 weights"),
    bad("x-K-vs-packed-mxfp4-w", lambda c: matmul_ogs(c.x.bfloat16(), c.zeros(K, N, dtype=torch.uint8), None,
                                                         precision_config=pc(weight_scale=c.scales(1, N))),
        r"x has K=16 columns but w has 32 rows \(packed mxfp4"),
    bad("batched-w-batch-mismatch", lambda c: matmul_ogs(c.x.expand(2, M, K), c.w.expand(3, K, N), None),
        r"batched x of shape \(2, 8, 16\) needs w of shape \(B=2, K, N\)"),
    bad("batched-B-above-grid-limit", lambda c: matmul_ogs(c.x[:1].expand(70000, 1, K), c.w.expand(70000, K, N),
                                                             None),
        r"batched x has B=70000", r"split the batch"),
    # gradients: matmul_ogs is differentiable (tests/test_autograd.py), not with everything it takes
    bad("grad-with-preallocated-y", lambda c: matmul_ogs(c.x.requires_grad_(), c.w, None, y=c.zeros(M, N)),
        r"y \(a preallocated output\)", r"torch\.no_grad\(\)", exc=Unsupported),
    bad("grad-for-fp8-w", lambda c: matmul_ogs(c.x.bfloat16().requires_grad_(), c.w.to(torch.float8_e4m3fn), None),
        r"w must be a bf16, fp16 or fp32 tensor", r"torch\.no_grad\(\)", exc=Unsupported),
]

MATMUL_DEVICES = [
    bad("x-and-w-on-meta", lambda c: matmul_ogs(c.meta(M, K, dtype=torch.float16), c.meta(K, N, dtype=torch.float16),
                                                  None),
        r"x is on meta"),
    bad("w-on-meta", lambda c: matmul_ogs(c.x, c.meta(K, N, dtype=torch.float16), None), r"w is on meta but x is on",
        MOVE),
    bad("y-on-meta", lambda c: matmul_ogs(c.x, c.w, None, y=c.meta(M, N, dtype=torch.float16)), r"y is on meta", MOVE),
    bad("gammas-on-meta", lambda c: matmul_ogs(c.x, c.w, None, gammas=c.meta(M)), r"gammas is on meta", MOVE),
    bad("y_acc_in-on-meta", lambda c: matmul_ogs(c.x, c.w, None, y_acc_in=c.meta(M, N, dtype=torch.float16)),
        r"y_acc_in is on meta", MOVE),
    bad("weight_scale-on-meta", lambda c: matmul_ogs(c.x.bfloat16(), c.packed, None,
                                                      precision_config=pc(weight_scale=c.meta(1, N,
                                                                                              dtype=torch.uint8))),
        r"precision_config\.weight_scale is on meta", MOVE),
    bad("rhs_data.scale-on-meta", lambda c: matmul_ogs(c.x.bfloat16(), c.w.to(torch.float8_e4m3fn), None,
                                                        precision_config=flex(rhs_data=InFlexData(scale=c.meta(1)))),
        r"precision_config\.flex_ctx\.rhs_data\.scale is on meta", MOVE),
    bad("expt_hist-on-meta", lambda c: matmul_ogs(c.x, c.wE, None, RoutingData(None, c.meta(E, dtype=torch.int32),
                                                                               E, TOPK), gather_indx=c.gi),
        r"routing_data\.expt_hist is on meta", MOVE),
    bad("gather_indx.src_indx-on-meta",
        lambda c: matmul_ogs(c.x, c.wE, None, c.rd, gather_indx=GatherIndx(c.meta(GATES, dtype=torch.int32),
                                                                           c.gi.dst_indx)),
        r"gather_indx\.src_indx is on meta", MOVE),
    bad("scatter_indx.dst_indx-on-meta",
        lambda c: matmul_ogs(c.xs, c.wE, None, c.rd, scatter_indx=ScatterIndx(c.si.src_indx,
                                                                              c.meta(GATES, dtype=torch.int32))),
        r"scatter_indx\.dst_indx is on meta", MOVE),
    bad("fused_activation.fn_args-tensor-on-meta",
        lambda c: matmul_ogs(c.x, c.w, None, fused_activation=FusedActivation(ogsgen.swiglu, (c.meta(1), 7.0))),
        r"fused_activation\.fn_args\[0\] is on meta", MOVE),
]

MATMUL_VECTORS_AND_OUTPUTS = [
    bad("bias-(3,N)-dense", lambda c: matmul_ogs(c.x, c.w, c.zeros(3, N)),
        r"bias must have shape \(32,\) or \(1, 32\), got \(3, 32\)"),
    bad("bias-3d", lambda c: matmul_ogs(c.x, c.w, c.zeros(1, 1, N)), r"bias must have 1 or 2 dimensions"),
    bad("bias=list", lambda c: matmul_ogs(c.x, c.w, [0.0] * N), r"bias must be a torch\.Tensor", exc=SpecTypeError),
    bad("bias-(3,N)-for-4-experts", lambda c: matmul_ogs(c.x, c.wE, c.zeros(3, N), c.rd, gather_indx=c.gi),
        r"bias must have shape \(32,\) or \(4, 32\)"),
    bad("betas-length", lambda c: matmul_ogs(c.x, c.w, c.zeros(N), betas=c.ones(M - 1)),
        r"betas must be a contiguous torch\.float32 vector of length 8"),
    bad("betas-fp16", lambda c: matmul_ogs(c.x, c.w, c.zeros(N), betas=c.ones(M, dtype=torch.float16)),
        r"betas must be torch\.float32", r"\.to\(torch\.float32\)"),
    bad("gammas-2d", lambda c: matmul_ogs(c.x, c.w, None, gammas=c.ones(M, 1)), r"gammas must have 1 dimension"),
    bad("gammas-stride-2", lambda c: matmul_ogs(c.x, c.w, None, gammas=c.ones(2 * M)[::2]),
        r"gammas must be a contiguous .*stride \(2,\)"),
    bad("gammas=numpy", lambda c: matmul_ogs(c.x, c.w, None, gammas=np.ones(M, np.float32)),
        r"gammas must be a torch\.Tensor", exc=SpecTypeError),
    bad("gammas-length-moe", lambda c: matmul_ogs(c.x, c.wE, None, c.rd, gather_indx=c.gi, gammas=c.ones(M)),
        r"gammas must be a contiguous torch\.float32 vector of length 16"),
    bad("out_alpha=str", lambda c: matmul_ogs(c.x, c.w, None, out_alpha="2"), r"out_alpha must be a Python float",
        exc=SpecTypeError),
    bad("y=numpy", lambda c: matmul_ogs(c.x, c.w, None, y=np.zeros((M, N), np.float16)),
        r"y must be a torch\.Tensor", exc=SpecTypeError),
    bad("y-1d", lambda c: matmul_ogs(c.x, c.w, None, y=c.zeros(M * N, dtype=torch.float16)),
        r"y must have 2 or 3 dimensions"),
    bad("y-dtype-bf16-for-fp16-call", lambda c: matmul_ogs(c.x, c.w, None, y=c.zeros(M, N, dtype=torch.bfloat16)),
        r"y has dtype torch\.bfloat16 but the output dtype is torch\.float16", r"precision_config\.out_dtype"),
    bad("y-is-x", lambda c: (lambda x: matmul_ogs(x, c.randn(K, K), None, y=x))(c.x),
        r"y overlaps x in memory", r"pass a separate y"),
    bad("y-overlaps-w", lambda c: (lambda w: matmul_ogs(c.x, w, None, y=w[:M]))(c.w), r"y overlaps w in memory"),
    bad("y-overlaps-y_acc_in", lambda c: (lambda buf: matmul_ogs(c.x, c.w, None, y=buf[:M], y_acc_in=buf[1:]))(
        c.zeros(M + 1, N, dtype=torch.float16)), r"y overlaps y_acc_in in memory"),
    bad("y-overlaps-out_scale",
        lambda c: (lambda buf: matmul_ogs(c.x.bfloat16(), c.w.bfloat16(), None,
                                          y=buf[:, :N].view(torch.float8_e4m3fn),
                                          precision_config=pc(out_scale=buf[:, N:N + 1])))(
            c.zeros(M, 2 * N, dtype=torch.uint8)),
        r"y overlaps precision_config\.out_scale in memory"),
    bad("y-rows-alias-(stride-0)", lambda c: matmul_ogs(c.x, c.w, None, y=c.zeros(1, N, dtype=torch.float16)
                                                        .expand(M, N)),
        r"\by\b.*(overlap|stride)"),
    bad("y-rows-overlap", lambda c: matmul_ogs(c.x, c.w, None, y=c.zeros(M * N, dtype=torch.float16).as_strided(
        (M, N), (N // 2, 1))), r"y \(shape \(8, 32\), strides \(16, 1\)\) has elements that overlap each other",
        r"pass a tensor with distinct elements"),
    bad("out_scale-rows-overlap",
        lambda c: matmul_ogs(c.x.bfloat16(), c.randn(K, 2 * N, dtype=torch.bfloat16), None,
                             precision_config=pc(out_scale=c.scales(M + 1).as_strided((M, 2), (1, 1)))),
        r"precision_config\.out_scale \(shape \(8, 2\), strides \(1, 1\)\) has elements that overlap"),
    bad("inner-y-rows-overlap",
        lambda c: matmul_ogs(c.randn(M, 8), c.randn(8, N), None, y=c.zeros(E * M * N, dtype=torch.float16).as_strided(
            (E, M, N), (M * N, N // 2, 1)), inner_routing_data=InnerRoutingData(RoutingData(None, c.hist(2, 2, 2, 2),
                                                                                            E, 1))),
        r"y \(shape \(4, 8, 32\), strides \(256, 16, 1\)\) has elements that overlap"),
    # torch._neg_view(t) reads as -t but keeps t's memory, which is what the kernels write
    bad("y-lazily-negated", lambda c: matmul_ogs(c.x, c.w, None, y=torch._neg_view(c.zeros(M, N, dtype=torch.float16))),
        r"y is a lazily negated or conjugated view", r"pass a tensor without the flag"),
    bad("y_acc_in-is-y-lazily-negated",
        lambda c: (lambda y: matmul_ogs(c.x, c.w, None, y=y, y_acc_in=y))(torch._neg_view(c.zeros(
            M, N, dtype=torch.float16))), r"y is a lazily negated or conjugated view"),
    bad("out_scale-lazily-negated",
        lambda c: matmul_ogs(c.x.bfloat16(), c.w.bfloat16(), None,
                             precision_config=pc(out_scale=torch._neg_view(c.scales(M, 1)))),
        r"precision_config\.out_scale is a lazily negated or conjugated view"),
    bad("actual_scale-lazily-negated",
        lambda c: matmul_ogs(c.x.to(torch.float8_e4m3fn), c.w.to(torch.float8_e4m3fn), None,
                             precision_config=PrecisionConfig(out_dtype=torch.float8_e4m3fn, flex_ctx=FlexCtx(
                                 out_data=OutFlexData(actual_scale=torch._neg_view(c.zeros(1)))))),
        r"precision_config\.flex_ctx\.out_data\.actual_scale is a lazily negated or conjugated view"),
    bad("y_acc_in=numpy", lambda c: matmul_ogs(c.x, c.w, None, y_acc_in=np.zeros((M, N), np.float16)),
        r"y_acc_in must be a torch\.Tensor", exc=SpecTypeError),
    bad("y_acc_in-with-scatter", lambda c: matmul_ogs(c.xs, c.wE, None, c.rd, scatter_indx=c.si,
                                                      y_acc_in=c.zeros(M, N, dtype=torch.float16)),
        r"y_acc_in cannot be combined with scatter_indx"),
]

MATMUL_PRECISION = [
    bad("precision_config=dict", lambda c: matmul_ogs(c.x, c.w, None, precision_config={"out_dtype": torch.float32}),
        r"precision_config must be a PrecisionConfig", exc=SpecTypeError),
    bad("flex_ctx=dict", lambda c: matmul_ogs(c.x, c.w, None, precision_config=pc(flex_ctx={})),
        r"precision_config\.flex_ctx must be a FlexCtx", exc=SpecTypeError),
    bad("out_dtype-float64", lambda c: matmul_ogs(c.x, c.w, None, precision_config=pc(out_dtype=torch.float64)),
        r"precision_config\.out_dtype has dtype torch\.float64"),
    bad("out_dtype='float32'", lambda c: matmul_ogs(c.x, c.w, None, precision_config=pc(out_dtype="float32")),
        r"precision_config\.out_dtype must be a torch\.dtype"),
    bad("allow_tf32='no'", lambda c: matmul_ogs(c.x.float(), c.w.float(), None, precision_config=pc(allow_tf32="no")),
        r"precision_config\.allow_tf32"),
    bad("weight_scale-shape", lambda c: matmul_ogs(c.x.bfloat16(), c.packed, None,
                                                   precision_config=pc(weight_scale=c.scales(2, N // 2))),
        r"precision_config\.weight_scale must hold one e8m0 byte per 32 values of K: shape \(1, 32\)",
        r"more K groups may follow, as padding: they are not read\), got \(2, 16\)"),
    bad("weight_scale-float32", lambda c: matmul_ogs(c.x.bfloat16(), c.packed, None,
                                                     precision_config=pc(weight_scale=c.zeros(1, N))),
        r"precision_config\.weight_scale must be torch\.uint8", r"\.to\(torch\.uint8\)"),
    bad("weight_scale=list", lambda c: matmul_ogs(c.x.bfloat16(), c.packed, None,
                                                  precision_config=pc(weight_scale=[0] * N)),
        r"precision_config\.weight_scale must be a torch\.Tensor", exc=SpecTypeError),
    bad("w-uint8-without-weight_scale", lambda c: matmul_ogs(c.x.bfloat16(), c.packed, None),
        r"precision_config\.weight_scale is None", r"pass its e8m0 scales"),
    bad("swizzled-w-without-weight_scale", lambda c: matmul_ogs(c.x.bfloat16(), c.swizzled(), None),
        r"precision_config\.weight_scale is None"),
    bad("swizzled-w-with-fp16-x", lambda c: matmul_ogs(c.x, c.swizzled(), None,
                                                       precision_config=pc(weight_scale=c.scales(1, N))),
        r"hopper-layout mxfp4 weights .*x must be bf16"),
    bad("swizzled-w-damaged-data",
        lambda c: matmul_ogs(c.x.bfloat16(), ogsgen.SwizzledMxValues(c.zeros(2, 2, dtype=torch.int32), K, N, "hopper",
                                                                     (9, 0)),
                             None, precision_config=pc(weight_scale=c.scales(1, N))),
        r"w is a SwizzledMxValues whose data", r"ogsgen\.swizzle_mx_values"),
    bad("out_scale-with-bf16-out_dtype",
        lambda c: matmul_ogs(c.x.bfloat16(), c.w.bfloat16(), None,
                             precision_config=pc(out_scale=c.scales(M, 1), out_dtype=torch.bfloat16)),
        r"precision_config\.out_scale makes the output mxfp8: out_dtype must be a float8 dtype"),
    bad("out_scale-shape", lambda c: matmul_ogs(c.x.bfloat16(), c.w.bfloat16(), None,
                                                precision_config=pc(out_scale=c.scales(M, 2))),
        r"precision_config\.out_scale must hold one e8m0 byte per 32 output columns of each row \(mxfp8e4m3\): "
        r"shape \(8, 1\)"),
    bad("out_scale-float32-with-bf16-out_dtype",
        lambda c: matmul_ogs(c.x.bfloat16(), c.w.bfloat16(), None,
                             precision_config=pc(out_scale=c.zeros(M, 1), out_dtype=torch.bfloat16)),
        r"precision_config\.out_scale of float32 makes the output fp8e4m3_b128 .*: out_dtype must be "
        r"torch\.float8_e4m3fn"),
    bad("out_scale-float16", lambda c: matmul_ogs(c.x.bfloat16(), c.w.bfloat16(), None,
                                                  precision_config=pc(out_scale=c.zeros(M, 1).half())),
        r"precision_config\.out_scale must be uint8 \(e8m0 scales per 32 columns: an mxfp8 output\) or float32 "
        r"\(a scale per 128 columns of a row: an fp8e4m3_b128 output\), got torch\.float16"),
    bad("out_scale-float32-shape", lambda c: matmul_ogs(c.x.bfloat16(), c.w.bfloat16(), None,
                                                        precision_config=pc(out_scale=c.zeros(M, 2))),
        r"precision_config\.out_scale must hold one float32 scale per 128 output columns of each row "
        r"\(fp8e4m3_b128\): shape \(8, 1\)"),
    bad("lhs_data.scale-on-fp16-x", lambda c: matmul_ogs(c.x, c.w, None,
                                                         precision_config=flex(lhs_data=InFlexData(scale=c.ones(1)))),
        r"precision_config\.flex_ctx\.lhs_data\.scale is set but the operand is fp16", r"drop the scale"),
    bad("rhs_data.scale-3-elements",
        lambda c: matmul_ogs(c.x.bfloat16(), c.w.to(torch.float8_e4m3fn), None,
                             precision_config=flex(rhs_data=InFlexData(scale=c.ones(3)))),
        r"precision_config\.flex_ctx\.rhs_data\.scale must be a contiguous float32 tensor of 1 element"),
    bad("rhs_data.scale-per-expert-strided",
        lambda c: matmul_ogs(c.x.bfloat16().expand(2, M, K), c.randn(2, K, N).to(torch.float8_e4m3fn), None,
                             precision_config=flex(rhs_data=InFlexData(scale=c.ones(4)[::2]))),
        r"precision_config\.flex_ctx\.rhs_data\.scale must be a contiguous float32 tensor of 1 or 2 element"),
    bad("rhs_data.scale-float64",
        lambda c: matmul_ogs(c.x.bfloat16(), c.w.to(torch.float8_e4m3fn), None,
                             precision_config=flex(rhs_data=InFlexData(scale=c.ones(1, dtype=torch.float64)))),
        r"precision_config\.flex_ctx\.rhs_data\.scale must be torch\.float32"),
    bad("rhs_data.scale=python-float",
        lambda c: matmul_ogs(c.x.bfloat16(), c.w.to(torch.float8_e4m3fn), None,
                             precision_config=flex(rhs_data=InFlexData(scale=1.0))),
        r"precision_config\.flex_ctx\.rhs_data\.scale must be a torch\.Tensor, got float", exc=SpecTypeError),
    bad("lhs_data.dtype-fp8-for-fp16-x",
        lambda c: matmul_ogs(c.x, c.w, None, precision_config=flex(lhs_data=InFlexData(dtype=torch.float8_e4m3fn))),
        r"x has dtype torch\.float16 but its InFlexData says torch\.float8_e4m3fn"),
    bad("out_data.expected_scale-with-fp16-output",
        lambda c: matmul_ogs(c.x, c.w, None, precision_config=flex(out_data=OutFlexData(expected_scale=c.ones(1)))),
        r"precision_config\.flex_ctx\.out_data\.expected_scale is set but the output is fp16",
        r"set precision_config\.out_dtype to an fp8 dtype or drop the scale"),
    bad("out_data.actual_scale-fp16",
        lambda c: matmul_ogs(c.x.bfloat16(), c.w.to(torch.float8_e4m3fn), None,
                             precision_config=PrecisionConfig(out_dtype=torch.float8_e4m3fn, flex_ctx=FlexCtx(
                                 out_data=OutFlexData(actual_scale=c.ones(1, dtype=torch.float16))))),
        r"precision_config\.flex_ctx\.out_data\.actual_scale must be torch\.float32"),
    bad("acc_data.scale", lambda c: matmul_ogs(c.x, c.w, None, precision_config=flex(acc_data=InFlexData(
        scale=c.ones(1)))), r"precision_config\.flex_ctx\.acc_data", r"leave it None", exc=Unsupported),
    bad("acc_scale=2.0", lambda c: matmul_ogs(c.x, c.w, None, precision_config=pc(acc_scale=2.0)),
        r"precision_config\.acc_scale=2\.0 is not supported", r"leave it 1\.0 and scale y_acc_in itself",
        exc=Unsupported),
    bad("acc_scale=2.0-after-a-planned-call",  # (a replayed plan checks nothing its signature does not hold)
        lambda c: [matmul_ogs(c.x, c.w, None, precision_config=pc(acc_scale=scale)) for scale in (1.0, 2.0)],
        r"precision_config\.acc_scale=2\.0 is not supported", exc=Unsupported),
    bad("acc_scale=2.0-under-autograd", lambda c: matmul_ogs(c.x.requires_grad_(), c.w, None,
                                                             precision_config=pc(acc_scale=2.0)),
        r"precision_config\.acc_scale=2\.0 is not supported", exc=Unsupported),
    bad("max_num_imprecise_acc-on-fp16", lambda c: matmul_ogs(c.x, c.w, None,
                                                              precision_config=pc(max_num_imprecise_acc=32)),
        r"precision_config\.max_num_imprecise_acc applies to fp8 dots only", r"leave it None"),
]

MATMUL_FUNCTIONS = [
    bad("fused_activation=FnSpecs", lambda c: matmul_ogs(c.x, c.w, None, fused_activation=ogsgen.swiglu),
        r"fused_activation must be a FusedActivation", exc=SpecTypeError),
    bad("FusedActivation(specs=str)", lambda c: FusedActivation("swiglu", (1.0, 1.0)),
        r"FusedActivation\.specs must be an FnSpecs \(what ogsgen\.register_activation returns\), got str"),
    bad("FusedActivation-with-an-epilogue-function", lambda c: FusedActivation(ADD_CONST, (1.0,)),
        r"activation '_bad_inputs_add_const': the function's parameters"),
    bad("FusedActivation-fn_args-str",
        lambda c: matmul_ogs(c.x, c.w, None, fused_activation=FusedActivation(ogsgen.swiglu, ("a", 1.0))),
        r"fn_args"),
    bad("epilogue=str", lambda c: matmul_ogs(c.x, c.w, None, epilogue="relu"), r"epilogue must be an Epilogue",
        exc=SpecTypeError),
    bad("epilogue=FusedActivation", lambda c: matmul_ogs(c.x, c.w, None, epilogue=SWIGLU),
        r"epilogue must be an Epilogue", exc=SpecTypeError),
    bad("Epilogue-with-an-activation-function", lambda c: Epilogue(ogsgen.swiglu, (1.0, 1.0)),
        r"epilogue 'swiglu': the function's parameters", r"def swiglu\(tile, offs_m, offs_n, mask, alpha, limit\)"),
    bad("Epilogue-value-count", lambda c: Epilogue(ADD_CONST, (1.0, 2.0)),
        r"Epilogue\.fn_arg_values_matmul: _bad_inputs_add_const takes 1 argument"),
    bad("Epilogue-finalize-value-count", lambda c: Epilogue(ADD_CONST, (1.0,), (1.0, 2.0)),
        r"Epilogue\.fn_arg_values_finalize: _bad_inputs_add_const takes 1 argument"),
]

MATMUL_ROUTING = [
    bad("routing_data=tuple", lambda c: matmul_ogs(c.x, c.wE, None, (None, c.rd.expt_hist, E, TOPK),
                                                   gather_indx=c.gi),
        r"routing_data must be a RoutingData", exc=SpecTypeError),
    bad("routing_data-n_expts_act-not-the-gathers",  # k is the gates per token: x's rows times k index the gather
        lambda c: matmul_ogs(c.x, c.wE, None, RoutingData(None, c.rd.expt_hist, E, E + 1), gather_indx=c.gi),
        r"gather_indx.src_indx must be a contiguous torch.int32 vector of length"),
    bad("routing_data-n_expts_tot-float",
        lambda c: matmul_ogs(c.x, c.wE, None, RoutingData(None, c.rd.expt_hist, 4.0, TOPK), gather_indx=c.gi),
        r"n_expts_tot must be (a|an) (positive )?int"),
    bad("expt_hist-int64", lambda c: matmul_ogs(c.x, c.wE, None, RoutingData(None, c.rd.expt_hist.long(), E, TOPK),
                                                gather_indx=c.gi),
        r"routing_data\.expt_hist must be torch\.int32"),
    bad("expt_hist-length", lambda c: matmul_ogs(c.x, c.wE, None, RoutingData(None, c.hist(8, 4, 4), E, TOPK),
                                                 gather_indx=c.gi),
        r"routing_data\.expt_hist must be a contiguous torch\.int32 vector of length 4"),
    bad("expt_hist=None-with-expert-w", lambda c: matmul_ogs(c.x, c.wE, None, RoutingData(None, None, E, TOPK)),
        r"expt_hist"),
    bad("expt_hist=None-with-gather_indx", lambda c: matmul_ogs(c.x, c.wE, None, RoutingData(None, None, E, TOPK),
                                                                gather_indx=c.gi),
        r"pass routing_data with a histogram"),
    bad("expt_data=object", lambda c: matmul_ogs(c.x, c.wE, None, RoutingData(None, c.rd.expt_hist, E, TOPK,
                                                                              object()), gather_indx=c.gi),
        r"routing_data\.expt_data"),
    bad("expt_data-of-another-histogram",
        lambda c: matmul_ogs(c.x, c.wE, None, RoutingData(None, c.rd.expt_hist, E, TOPK, _routing(
            c.device, ((0, 1),) * M)[0].expt_data), gather_indx=c.gi),
        r"routing_data\.expt_data was computed for another histogram than routing_data\.expt_hist", host_check=True),
    bad("expt_hist-sums-past-the-rows",
        lambda c: matmul_ogs(c.x, c.wE, None, RoutingData(None, c.hist(8, 8, 8, 8), E, TOPK), gather_indx=c.gi),
        r"routing_data\.expt_hist sums to 32 rows, more than the call's 16", host_check=True),
    bad("expt_hist-negative",
        lambda c: matmul_ogs(c.x, c.wE, None, RoutingData(None, c.hist(9, -1, 4, 4), E, TOPK), gather_indx=c.gi),
        r"routing_data\.expt_hist\[1\] = -1", host_check=True),
    bad("w-experts-vs-n_expts_tot", lambda c: matmul_ogs(c.x, c.wE[:3], None, c.rd, gather_indx=c.gi),
        r"w must hold one \(K, N\) matrix per expert, shape \(4, K, N\)"),
    bad("routing_data-with-3d-x", lambda c: matmul_ogs(c.x[None], c.wE, None, c.rd),
        r"routing_data is not supported in batched mode"),
    bad("gather_indx-in-batched-mode", lambda c: matmul_ogs(c.x.expand(2, M, K), c.w.expand(2, K, N), None,
                                                            gather_indx=c.gi),
        r"gather_indx is not supported in batched mode"),
    bad("gather_indx=tuple", lambda c: matmul_ogs(c.x, c.wE, None, c.rd, gather_indx=(c.gi.src_indx, c.gi.dst_indx)),
        r"gather_indx must be a GatherIndx", exc=SpecTypeError),
    bad("gather_indx.src_indx-int64",
        lambda c: matmul_ogs(c.x, c.wE, None, c.rd, gather_indx=GatherIndx(c.gi.src_indx.long(), c.gi.dst_indx)),
        r"gather_indx\.src_indx must be torch\.int32"),
    bad("gather_indx.src_indx-length",
        lambda c: matmul_ogs(c.x, c.wE, None, c.rd, gather_indx=GatherIndx(c.gi.src_indx[:-1], c.gi.dst_indx)),
        r"gather_indx\.src_indx must be a contiguous torch\.int32 vector of length 16"),
    bad("gather_indx.dst_indx-stride-2",
        lambda c: matmul_ogs(c.x, c.wE, None, c.rd, gather_indx=GatherIndx(
            c.gi.src_indx, c.gi.dst_indx.repeat_interleave(2)[::2])),
        r"gather_indx\.dst_indx must be a contiguous .*stride \(2,\)"),
    bad("gather_indx.src_indx-out-of-range",
        lambda c: matmul_ogs(c.x, c.wE, None, c.rd, gather_indx=GatherIndx(c.gi.src_indx + 100, c.gi.dst_indx)),
        r"gather_indx\.src_indx\[0\] = \d+ is outside \[-1, 16\)", r"ogsgen\.routing", host_check=True),
    bad("gather_indx.dst_indx-out-of-range",
        lambda c: matmul_ogs(c.x, c.wE, None, c.rd, gather_indx=GatherIndx(c.gi.src_indx, c.gi.dst_indx + GATES)),
        r"gather_indx\.dst_indx\[0\] = \d+ is outside \[-1, 16\)", host_check=True),
    bad("gather_indx-not-inverse-permutations",
        lambda c: matmul_ogs(c.x, c.wE, None, c.rd, gather_indx=GatherIndx(c.gi.src_indx.flip(0).contiguous(),
                                                                           c.gi.dst_indx)),
        r"gather_indx: src_indx and dst_indx are not inverse permutations", host_check=True),
    bad("gather_indx-dropped-gate-among-routed-rows",
        lambda c: matmul_ogs(c.x, c.wE, None, c.rd, gather_indx=GatherIndx(
            torch.cat([c.gi.src_indx[:1] * 0 - 1, c.gi.src_indx[1:]]), c.gi.dst_indx)),
        r"gather_indx\.src_indx: 15 routed rows but routing_data\.expt_hist sums to 16", host_check=True),
    bad("scatter_indx=tuple", lambda c: matmul_ogs(c.xs, c.wE, None, c.rd, scatter_indx=(c.si.src_indx,
                                                                                          c.si.dst_indx)),
        r"scatter_indx must be a ScatterIndx", exc=SpecTypeError),
    bad("scatter_indx-for-token-x", lambda c: matmul_ogs(c.x, c.wE, None, c.rd, scatter_indx=c.si),
        r"scatter_indx\.src_indx must be a contiguous torch\.int32 vector of length 8"),
    bad("scatter_indx.src_indx-out-of-range",
        lambda c: matmul_ogs(c.xs, c.wE, None, c.rd, scatter_indx=ScatterIndx(c.si.src_indx - 5, c.si.dst_indx)),
        r"scatter_indx\.src_indx\[\d+\] = -\d+ is outside \[-1, 16\)", host_check=True),
]

CONSTRAINTS = [
    bad("block_n=24", constrained(lambda c: None, block_n=24), r"block_n must be a power of two", exc=Inapplicable),
    bad("block_m=None", constrained(lambda c: None, block_m=None), r"block_m must be a positive int, got None",
        exc=Inapplicable),
    bad("split_k=0", constrained(lambda c: None, split_k=0), r"split_k must be a positive int, got 0",
        exc=Inapplicable),
    bad("split_k='2'", constrained(lambda c: None, split_k="2"), r"split_k must be a positive int, got '2'",
        exc=Inapplicable),
    bad("group_m=2.5", constrained(lambda c: None, group_m=2.5), r"group_m must be a positive int, got 2\.5",
        exc=Inapplicable),
    bad("wait_mma=1", constrained(lambda c: None, wait_mma=1), r"wait_mma must be True or False", exc=Inapplicable),
    bad("maxnreg='64'", constrained(lambda c: None, maxnreg="64"), r"maxnreg must be a positive int",
        exc=Inapplicable),
    bad("wait_mma-with-bf16-weights", constrained(lambda c: matmul_ogs(c.x, c.w, None), wait_mma=True),
        r"wait_mma=True applies to mx weights", r"drop it", exc=Inapplicable),
    bad("split_k-with-y_acc_in", constrained(lambda c: matmul_ogs(c.x.float(), c.w.float(), None,
                                                                  y_acc_in=c.zeros(M, N)), split_k=2),
        r"split_k=2 cannot be combined with y_acc_in", r"use split_k=1", exc=Inapplicable),
    bad("split_k-with-scatter-and-activation",
        constrained(lambda c: matmul_ogs(c.xs, c.wE, None, c.rd, scatter_indx=c.si, fused_activation=SWIGLU),
                    split_k=2),
        r"split_k=2 cannot be combined with .*a scatter with a fused activation", exc=Inapplicable),
    bad("block_m-with-enforce_bitwise_invariance",
        constrained(lambda c: matmul_ogs(c.x, c.w, None, precision_config=pc(enforce_bitwise_invariance=True)),
                    block_m=64),
        r"precision_config\.enforce_bitwise_invariance fixes block_m=128", exc=Inapplicable),
]

ROUTING = [
    bad("routing-logits-1d", lambda c: ogsgen.routing(c.randn(M, dtype=torch.float32), TOPK),
        r"logits must be a \(n_tokens, n_expts_tot\) tensor"),
    bad("routing-logits-int", lambda c: ogsgen.routing(c.zeros(M, E, dtype=torch.int32), TOPK),
        r"logits must be floating point, got torch\.int32"),
    bad("routing-logits-on-meta", lambda c: ogsgen.routing(c.meta(M, E), TOPK), r"logits"),
    bad("routing-n_expts_act=0", lambda c: ogsgen.routing(c.randn(M, E, dtype=torch.float32), 0),
        r"n_expts_act must be an int in \[1, n_expts_tot=4\], got 0"),
    bad("routing-n_expts_act-above-E", lambda c: ogsgen.routing(c.randn(M, E, dtype=torch.float32), E + 1),
        r"n_expts_act must be an int in \[1, n_expts_tot=4\], got 5"),
    bad("routing-n_expts_act=2.0", lambda c: ogsgen.routing(c.randn(M, E, dtype=torch.float32), 2.0),
        r"n_expts_act must be an int .* got 2\.0"),
    bad("routing-n_expts_act=True", lambda c: ogsgen.routing(c.randn(M, E, dtype=torch.float32), True),
        r"n_expts_act must be an int in \[1, n_expts_tot=4\] \(the experts per token\), got True", exc=SpecTypeError),
    bad("routing-expt_indx-shape", lambda c: ogsgen.routing(c.randn(M, E, dtype=torch.float32), TOPK,
                                                            expt_indx=c.zeros(M, 3, dtype=torch.int64)),
        r"expt_indx must have shape \(8, 2\), got \(8, 3\)"),
    bad("routing-expt_indx-float", lambda c: ogsgen.routing(c.randn(M, E, dtype=torch.float32), TOPK,
                                                            expt_indx=c.zeros(M, TOPK)),
        r"expt_indx must hold integer expert ids .* got torch\.float32"),
    bad("routing-expt_indx-on-meta", lambda c: ogsgen.routing(c.randn(M, E, dtype=torch.float32), TOPK,
                                                              expt_indx=c.meta(M, TOPK, dtype=torch.int64)),
        r"expt_indx must hold integer expert ids on .* on meta"),
    bad("routing-expt_indx=list", lambda c: ogsgen.routing(c.randn(M, E, dtype=torch.float32), TOPK,
                                                           expt_indx=[[0, 1]] * M),
        r"expt_indx must be"),
    bad("routing-expt_indx=E", lambda c: ogsgen.routing(c.randn(M, E, dtype=torch.float32), TOPK,
                                                        expt_indx=torch.full((M, TOPK), E, device=c.device)),
        r"expt_indx\[0, 0\] = 4 is not an expert id: ids must lie in \[0, n_expts_tot=4\)", host_check=True),
    bad("routing-expt_indx=-1", lambda c: ogsgen.routing(c.randn(M, E, dtype=torch.float32), TOPK,
                                                         expt_indx=torch.full((M, TOPK), -1, device=c.device)),
        r"expt_indx\[0, 0\] = -1 is not an expert id", host_check=True),
    bad("topk-ids-1d", lambda c: ogsgen.routing_from_topk(c.zeros(M, dtype=torch.int32), c.ones(M), E),
        r"topk_ids must be a \(n_tokens, k\) tensor, got \(8,\)"),
    bad("topk-ids-float", lambda c: ogsgen.routing_from_topk(c.zeros(M, TOPK), c.ones(M, TOPK), E),
        r"topk_ids must hold integer expert ids, got torch\.float32"),
    bad("topk-ids-uint8", lambda c: ogsgen.routing_from_topk(c.zeros(M, TOPK, dtype=torch.uint8), c.ones(M, TOPK),
                                                             E),
        r"topk_ids must hold integer expert ids, got torch\.uint8"),
    bad("topk-ids-k=0", lambda c: ogsgen.routing_from_topk(c.zeros(M, 0, dtype=torch.int32), c.ones(M, 0), E),
        r"topk_ids must hold at least one expert per token"),
    bad("topk-ids-on-meta", lambda c: ogsgen.routing_from_topk(c.meta(M, TOPK, dtype=torch.int32), c.meta(M, TOPK), E),
        r"topk_ids.*meta"),
    bad("topk-ids=E", lambda c: ogsgen.routing_from_topk(c.zeros(M, TOPK, dtype=torch.int32) + E, c.ones(M, TOPK), E),
        r"topk_ids\[0, 0\] = 4 is not an expert id: ids must lie in \[-1, n_expts_tot=4\)", host_check=True),
    bad("topk-ids=-2", lambda c: ogsgen.routing_from_topk(c.zeros(M, TOPK, dtype=torch.int32) - 2, c.ones(M, TOPK),
                                                          E),
        r"topk_ids\[0, 0\] = -2 is not an expert id", host_check=True),
    bad("topk-weights-shape", lambda c: ogsgen.routing_from_topk(c.zeros(M, TOPK, dtype=torch.int32), c.ones(M, 3),
                                                                 E),
        r"topk_weights must be a tensor of topk_ids' shape \(8, 2\), got \(8, 3\)"),
    bad("topk-weights-int", lambda c: ogsgen.routing_from_topk(c.zeros(M, TOPK, dtype=torch.int32),
                                                               c.ones(M, TOPK, dtype=torch.int32), E),
        r"topk_weights must be floating point gate weights"),
    bad("topk-weights-on-meta", lambda c: ogsgen.routing_from_topk(c.zeros(M, TOPK, dtype=torch.int32),
                                                                   c.meta(M, TOPK), E),
        r"topk_weights is on meta but topk_ids is on"),
    bad("topk-weights=list", lambda c: ogsgen.routing_from_topk(c.zeros(M, TOPK, dtype=torch.int32),
                                                                [[0.5, 0.5]] * M, E),
        r"topk_weights must be a tensor of topk_ids' shape"),
    bad("topk-n_expts_tot=0", lambda c: ogsgen.routing_from_topk(c.zeros(M, TOPK, dtype=torch.int32),
                                                                 c.ones(M, TOPK), 0),
        r"n_expts_tot must be a positive int, got 0"),
    bad("topk-n_expts_tot=4.0", lambda c: ogsgen.routing_from_topk(c.zeros(M, TOPK, dtype=torch.int32),
                                                                   c.ones(M, TOPK), 4.0),
        r"n_expts_tot must be a positive int, got 4\.0"),
    bad("topk-n_expts_tot-above-65536", lambda c: ogsgen.routing_from_topk(c.zeros(M, TOPK, dtype=torch.int32),
                                                                           c.ones(M, TOPK), 70000),
        r"n_expts_tot"),
    bad("topk-expected_tokens_per_expt=str",
        lambda c: ogsgen.routing_from_topk(c.zeros(M, TOPK, dtype=torch.int32), c.ones(M, TOPK), E,
                                           expected_tokens_per_expt="8"),
        r"expected_tokens_per_expt"),
]

WEIGHTS = [
    bad("prepare-layout", lambda c: ogsgen.prepare_expert_weights(c.randn(2, 8, 64), layout="in,out"),
        r"layout must be 'out_in' \(E, out, in\) or 'in_out'"),
    bad("prepare-gate_up", lambda c: ogsgen.prepare_expert_weights(c.randn(2, 8, 64), gate_up="fused"),
        r"gate_up must be None, 'concatenated' or 'interleaved', got 'fused'"),
    bad("prepare-format", lambda c: ogsgen.prepare_expert_weights(c.randn(2, 8, 64), format="fp4"),
        r"format must be one of .*got 'fp4'"),
    bad("prepare-value_layout", lambda c: ogsgen.prepare_expert_weights(c.randn(2, 8, 64), format="mxfp4",
                                                                        value_layout="blackwell"),
        r"value_layout must be 'auto' or one of"),
    bad("prepare-hopper-layout-for-bf16", lambda c: ogsgen.prepare_expert_weights(c.randn(2, 8, 64),
                                                                                  value_layout="hopper"),
        r"value_layout='hopper' applies to mxfp4 weights, not bf16"),
    bad("prepare-weight-int", lambda c: ogsgen.prepare_expert_weights(c.zeros(2, 8, 64, dtype=torch.int32)),
        r"weight must be a float tensor \(E, out, in\)"),
    bad("prepare-weight-2d", lambda c: ogsgen.prepare_expert_weights(c.randn(8, 64)),
        r"weight must be a float tensor \(E, out, in\)"),
    bad("prepare-weight-on-meta-mxfp4", lambda c: ogsgen.prepare_expert_weights(c.meta(2, 8, 64), format="mxfp4",
                                                                                value_layout="strided"),
        r"weight is on meta.*move it there"),
    bad("prepare-bias-shape", lambda c: ogsgen.prepare_expert_weights(c.randn(2, 8, 64), c.zeros(2, 64)),
        r"bias must have shape \(E, out\) = \(2, 8\), got \(2, 64\)"),
    bad("prepare-bias=list", lambda c: ogsgen.prepare_expert_weights(c.randn(2, 8, 64), [[0.0] * 8] * 2),
        r"bias must be None or a float tensor \(E, out\) = \(2, 8\), got list", exc=SpecTypeError),
    bad("prepare-gate_up-odd-out", lambda c: ogsgen.prepare_expert_weights(c.randn(2, 7, 64),
                                                                           gate_up="concatenated"),
        r"gate_up needs an even number of output features, got 7"),
    bad("prepare-rounding-mxfp4", lambda c: ogsgen.prepare_expert_weights(c.randn(2, 8, 64), format="mxfp4",
                                                                          rounding="nearest"),
        r"rounding must be one of \('up', 'down'\), got 'nearest'"),
    bad("prepare-rounding-bf16", lambda c: ogsgen.prepare_expert_weights(c.randn(2, 8, 64), rounding="nearest"),
        r"rounding must be one of \('up', 'down'\), got 'nearest'"),
    bad("prepare-mxfp4-odd-in-in_out-layout",
        lambda c: ogsgen.prepare_expert_weights(c.randn(2, 63, 8), layout="in_out", format="mxfp4",
                                                value_layout="strided"),
        r"in must be even for mxfp4 .*got in=63 \(weight \(2, 63, 8\), layout='in_out'\)"),
    bad("prepare-checkpoint-for-bf16", lambda c: ogsgen.prepare_expert_weights(
        (c.zeros(2, 8, 32, dtype=torch.uint8), c.scales(2, 8, 2)), format="bf16"),
        r"a \(values, scales\) checkpoint must be quantized along `in`", r"pass format= one of \['mxfp4'"),
    bad("prepare-checkpoint-3-tuple", lambda c: ogsgen.prepare_expert_weights(
        (c.zeros(2, 8, 32, dtype=torch.uint8), c.scales(2, 8, 2), None), format="mxfp4"),
        r"a checkpoint weight must be a \(values, scales\) tuple of 2 tensors, got a tuple of 3"),
    bad("prepare-checkpoint-non-tensors", lambda c: ogsgen.prepare_expert_weights(([0], [0]), format="mxfp4"),
        r"checkpoint values must be a tensor, got list", exc=SpecTypeError),
    bad("prepare-checkpoint-scales-shape", lambda c: ogsgen.prepare_expert_weights(
        (c.zeros(2, 8, 32, dtype=torch.uint8), c.scales(2, 4, 2)), format="mxfp4", value_layout="strided"),
        r"scales must be \(E, out, in // 32\) = \(2, 8, 2\) for values \(2, 8, 32\) .*got \(2, 4, 2\)"),
    bad("prepare-checkpoint-scales-count", lambda c: ogsgen.prepare_expert_weights(
        (c.zeros(2, 8, 32, dtype=torch.uint8), c.scales(2, 8, 3)), format="mxfp4", value_layout="strided"),
        r"scales must be \(E, out, in // 32\) = \(2, 8, 2\) .*in=64: one scale per 32 values.*got \(2, 8, 3\)"),
    bad("prepare-checkpoint-values-float", lambda c: ogsgen.prepare_expert_weights(
        (c.zeros(2, 8, 32), c.scales(2, 8, 2)), format="mxfp4", value_layout="strided"),
        r"checkpoint values must be torch\.uint8 \(packed mxfp4 values.*got torch\.float32"),
    bad("prepare-checkpoint-scales-float", lambda c: ogsgen.prepare_expert_weights(
        (c.zeros(2, 8, 32, dtype=torch.uint8), c.zeros(2, 8, 2)), format="mxfp4", value_layout="strided"),
        r"checkpoint scales must be torch\.uint8 \(e8m0 scales\).*got torch\.float32"),
]

FUNCTIONS = [
    bad("register-reduction_n=0", lambda c: ogsgen.register_activation(_bad_inputs_scale, arg_names=("alpha",),
                                                                       reduction_n=0),
        r"reduction_n must be a power of two \(1, 2, 4, \.\.\.\), got 0"),
    bad("register-do_not_specialize-unknown", lambda c: ogsgen.register_activation(
        _bad_inputs_scale, arg_names=("alpha",), do_not_specialize=("beta",)),
        r"fn_arg_do_not_specialize names \['beta'\], which are not in fn_arg_names \('alpha',\)"),
    bad("register-arg_names-duplicates", lambda c: ogsgen.register_activation(_bad_inputs_affine,
                                                                              arg_names=("alpha", "alpha")),
        r"fn_arg_names \('alpha', 'alpha'\) has duplicates"),
    bad("register-arg_names=str", lambda c: ogsgen.register_activation(_bad_inputs_scale, arg_names="alpha"),
        r"register_activation: arg_names must be a tuple of names, not a str", r"\('alpha',\)", exc=SpecTypeError),
    bad("register-do_not_specialize=str", lambda c: ogsgen.register_activation(
        _bad_inputs_scale, arg_names=("alpha",), do_not_specialize="alpha"),
        r"register_activation: do_not_specialize must be a tuple of names, not a str", r"\('alpha',\)",
        exc=SpecTypeError),
    bad("register-reference-not-callable", lambda c: ogsgen.register_activation(
        _bad_inputs_scale, arg_names=("alpha",), reference="torch.mul"),
        r"register_activation: reference must be a callable .*got str 'torch\.mul'", exc=SpecTypeError),
    bad("register-epilogue-function-as-activation", lambda c: ogsgen.register_activation(_bad_inputs_add_const,
                                                                                         arg_names=("c",)),
        r"activation '_bad_inputs_add_const': the function's parameters \(tile, offs_m, offs_n, mask, c\)",
        r"def _bad_inputs_add_const\(tile, c\)"),
    bad("register-backward-not-jit", lambda c: ogsgen.register_activation(
        _bad_inputs_scale, arg_names=("alpha",), backward=torch.mul),
        r"FnSpecs '_bad_inputs_scale': backward must be a @triton\.jit function backward\(tile, grad, alpha\) or "
        r"None, got builtin_function_or_method"),
    bad("register-backward-signature", lambda c: ogsgen.register_activation(
        _bad_inputs_scale, arg_names=("alpha",), backward=_bad_inputs_scale),
        r"activation '_bad_inputs_scale': its backward's parameters \(tile, alpha\) do not match; declare it as "
        r"def _bad_inputs_scale\(tile, grad, alpha\)"),
    bad("FnSpecs-backward-of-an-epilogue", lambda c: ogsgen.FnSpecs(
        "_bad_inputs_add_const", _bad_inputs_add_const, ("c",), backward=_bad_inputs_scale).check_signature("epilogue"),
        r"epilogue '_bad_inputs_add_const': only an activation takes a backward function"),
    bad("register-name=int", lambda c: ogsgen.register_activation(_bad_inputs_scale, name=5, arg_names=("alpha",)),
        r"name must be a valid Python identifier .*got 5"),
    # Python reads a non-ASCII identifier as its NFKC form: a kernel rendered with 'ﬁ_scale' would define fi_scale
    bad("register-name-non-ascii", lambda c: ogsgen.register_activation(_bad_inputs_scale, name="\ufb01_scale",
                                                                        arg_names=("alpha",)),
        r"FnSpecs name must be a valid Python identifier of ASCII letters, digits and '_', got '\ufb01_scale'"),
    bad("register-epilogue-name-non-ascii", lambda c: ogsgen.register_epilogue(_bad_inputs_add_const,
                                                                               name="add_\uff43onst", arg_names=("c",)),
        r"FnSpecs name must be a valid Python identifier of ASCII .*got 'add_\uff43onst'"),
    bad("FnSpecs-fn=None", lambda c: ogsgen.FnSpecs("bad_inputs_relu", None),
        r"FnSpecs 'bad_inputs_relu': fn must be a @triton\.jit function, got NoneType"),
    bad("FnSpecs-default-with-args", lambda c: ogsgen.FnSpecs("", None, ("a",)),
        r"FnSpecs\.default\(\) takes no fn_arg_names"),
    bad("FnSpecs-reduction_n=str", lambda c: ogsgen.FnSpecs("_bad_inputs_scale", _bad_inputs_scale, ("alpha",),
                                                            reduction_n="2"),
        r"reduction_n must be a power of two .*got '2'"),
    bad("FnSpecs-arg-names-vs-signature", lambda c: FusedActivation(
        ogsgen.FnSpecs("_bad_inputs_scale", _bad_inputs_scale, ("beta",)), (1.0,)),
        r"the function's parameters \(tile, alpha\) do not match fn_arg_names \('beta',\)"),
]

SPEC = [
    bad("KernelVariant-x=str", lambda c: KernelVariant("bf16", BF16, BF16),
        r"KernelVariant\.x must be a NumericFormat, got 'bf16'"),
    bad("KernelVariant-family", lambda c: KernelVariant(BF16, BF16, BF16, family="conv"),
        r"KernelVariant\.family must be one of \['matmul', 'reduce'\], got 'conv'"),
    bad("KernelVariant-activation=str", lambda c: KernelVariant(BF16, BF16, BF16, activation="swiglu"),
        r"KernelVariant\.activation must be an FnSpecs, got str"),
    bad("KernelVariant-activation-as-epilogue", lambda c: KernelVariant(BF16, BF16, BF16, epilogue=ogsgen.swiglu),
        r"epilogue 'swiglu': the function's parameters"),
    bad("KernelVariant-betas-without-bias", lambda c: KernelVariant(BF16, BF16, BF16, betas=True),
        r"betas=True needs bias=True"),
    bad("KernelVariant-gather-without-ragged", lambda c: KernelVariant(BF16, BF16, BF16, gather=True),
        r"gather and scatter index expert-sorted rows, so they need ragged=True"),
    bad("KernelVariant-y_acc_in-with-scatter", lambda c: KernelVariant(BF16, BF16, BF16, ragged=True, scatter=True,
                                                                       y_acc_in=True),
        r"y_acc_in .*cannot be combined with scatter"),
    bad("KernelVariant-reduce-with-bias", lambda c: KernelVariant(FP32, FP32, BF16, family="reduce", bias=True),
        r"a reduce kernel takes only features \('scatter', 'gammas', 'fused_comm'\), got \['bias'\]"),
    bad("KernelVariant-reduce-w-differs", lambda c: KernelVariant(FP32, BF16, BF16, family="reduce"),
        r"a reduce kernel has no w; set w to x's format"),
    bad("KernelVariant-bias='yes'", lambda c: KernelVariant(BF16, BF16, BF16, bias="yes"),
        r"KernelVariant\.bias must be True or False, got 'yes'", exc=SpecTypeError),
    bad("KernelVariant-unsupported-formats", lambda c: KernelVariant(BF16, FP16, BF16).check_supported(),
        r"x \(bf16\) and w \(fp16\) must share a format", exc=Unsupported),
    bad("NumericFormat-element", lambda c: NumericFormat("int8"), r"format element must be one of .*got 'int8'"),
    bad("NumericFormat-e2m1-unscaled", lambda c: NumericFormat("e2m1"), r"e2m1 \(fp4\) values need block_e8m0 scales",
        r"use MXFP4"),
    bad("format_named-unknown", lambda c: format_named("fp64"), r"unknown format 'fp64'; known formats"),
    bad("canonical_name-of-None", lambda c: ogsgen.canonical_name(None),
        r"canonical_name takes a KernelVariant, got NoneType", exc=SpecTypeError),
    bad("variant_product-unknown-feature", lambda c: variant_product([(BF16, BF16, BF16)], bais=(True,)),
        r"variant_product: unknown features \['bais'\]", exc=CatalogError),
    bad("variant_product-formats-not-triples", lambda c: variant_product([BF16]),
        r"variant_product: formats\[0\] must be an \(x, w, y\) triple of NumericFormat", exc=SpecTypeError),
    bad("catalog-missing-file", lambda c: load_catalog_file(c.tmp / "missing.py"),
        r"--spec .*missing\.py: no such file",
        exc=CatalogError),
    bad("catalog-not-py", lambda c: load_catalog_file(c.file("catalog.txt", "VARIANTS = []\n")),
        r"--spec .*catalog\.txt: a catalog is a Python file", exc=CatalogError),
    bad("catalog-without-VARIANTS", lambda c: load_catalog_file(c.file("bad_inputs_novars.py", "X = 1\n")),
        r"the file defines no VARIANTS", r"add VARIANTS = \[KernelVariant", exc=CatalogError),
    bad("catalog-VARIANTS-entry-int", lambda c: load_catalog_file(c.file("bad_inputs_intentry.py", "VARIANTS = [1]\n")),
        r"VARIANTS\[0\] is an int, not a KernelVariant", exc=CatalogError),
    bad("catalog-VARIANTS=5", lambda c: load_catalog_file(c.file("bad_inputs_intvars.py", "VARIANTS = 5\n")),
        r"VARIANTS must be a list of KernelVariant, got an int", exc=CatalogError),
    bad("catalog-VARIANTS=str", lambda c: load_catalog_file(c.file("bad_inputs_strvars.py", "VARIANTS = 'ogs'\n")),
        r"VARIANTS must be a list of KernelVariant, got a str", exc=CatalogError),
    bad("catalog-VARIANTS-empty", lambda c: load_catalog_file(c.file("bad_inputs_empty.py", "VARIANTS = []\n")),
        r"VARIANTS is empty, so there is nothing to build", r"VARIANTS = \[KernelVariant\(", exc=CatalogError),
    bad("catalog-import-error", lambda c: load_catalog_file(c.file("bad_inputs_importerr.py",
                                                                   "import not_a_module_xyz\nVARIANTS = []\n")),
        r"importing the catalog failed with ModuleNotFoundError", exc=CatalogError),
    bad("catalog-bad-variant", lambda c: load_catalog_file(c.file(
        "bad_inputs_betas.py", "from ogsgen.spec import BF16, KernelVariant\n"
                               "VARIANTS = [KernelVariant(BF16, BF16, BF16, betas=True)]\n")),
        r"--spec .*bad_inputs_betas\.py: KernelVariant: betas scale the bias", exc=CatalogError),
]

NUMERICS_AND_PATHS = [
    bad("quantize_mx-element", lambda c: quantize_mx(c.randn(4, 32, dtype=torch.float32), "fp4"),
        r"element must be one of \('e2m1', 'e4m3', 'e5m2'\), got 'fp4'"),
    bad("quantize_mx-rounding", lambda c: quantize_mx(c.randn(4, 32, dtype=torch.float32), "e2m1", rounding="even"),
        r"rounding must be one of \('up', 'down'\), got 'even'"),
    bad("quantize_mx-odd-e2m1-axis", lambda c: quantize_mx(c.randn(4, 31, dtype=torch.float32), "e2m1"),
        r"along axis 1: its size must be even, got 31"),
    bad("quantize_mx-x=list", lambda c: quantize_mx([[0.0] * 32], "e2m1"), r"\bx must be a torch\.Tensor, got list",
        exc=SpecTypeError),
    bad("quantize_mx-axis-out-of-range", lambda c: quantize_mx(c.randn(64, 32, dtype=torch.float32), "e2m1", axis=2),
        r"axis=2 is out of range for x of shape \(64, 32\)", r"give an axis from -2 to 1"),
    bad("swizzle-float-values", lambda c: ogsgen.swizzle_mx_values(c.zeros(8, 32)),
        r"values must be packed mxfp4: a uint8 tensor"),
    bad("swizzle-1d-values", lambda c: ogsgen.swizzle_mx_values(c.zeros(32, dtype=torch.uint8)),
        r"values must be packed mxfp4: a uint8 tensor \(\.\.\., K // 2, N\)"),
    bad("swizzle-layout", lambda c: ogsgen.swizzle_mx_values(c.packed, layout="blackwell"),
        r"layout must be 'hopper' .*got 'blackwell'"),
    bad("swizzle-capability-(7,5)", lambda c: ogsgen.swizzle_mx_values(c.packed, capability=(7, 5)),
        r"capability \(7, 5\) has none", r"keep the strided values"),
    bad("swizzle-capability=9", lambda c: ogsgen.swizzle_mx_values(c.packed, capability=9),
        r"capability must be a \(major, minor\) pair of ints such as \(9, 0\).*got 9", exc=SpecTypeError),
    bad("swizzle-capability='9.0'", lambda c: ogsgen.swizzle_mx_values(c.packed, capability="9.0"),
        r"capability must be a \(major, minor\) pair of ints .*got '9\.0'", exc=SpecTypeError),
    bad("unswizzle-a-tensor", lambda c: ogsgen.unswizzle_mx_values(c.packed),
        r"w must be a SwizzledMxValues \(from swizzle_mx_values\), got Tensor"),
    bad("add_search_path-missing-folder", lambda c: ogsgen.add_search_path(c.tmp / "not_built"),
        r"add_search_path: .*not_built is not a folder", r"ogsgen build --out", exc=ogsgen.BuildFolderError),
    bad("add_search_path=None", lambda c: ogsgen.add_search_path(None),
        r"add_search_path: path must be a str or os\.PathLike .*got NoneType", exc=SpecTypeError),
    bad("set_on_demand='false'", on_demand_as("false"), r"set_on_demand: enabled must be True or False, got 'false'",
        exc=SpecTypeError),
]

CASES = (MATMUL_OPERANDS + MATMUL_DEVICES + MATMUL_VECTORS_AND_OUTPUTS + MATMUL_PRECISION + MATMUL_FUNCTIONS
         + MATMUL_ROUTING + CONSTRAINTS + ROUTING + WEIGHTS + FUNCTIONS + SPEC + NUMERICS_AND_PATHS)


@pytest.mark.parametrize("call,exc,argument,fix", CASES)
def test_bad_input(call, exc, argument, fix, device, tmp_path):
    with pytest.raises(exc) as info:
        call(Ctx(device, tmp_path))
    assert isinstance(info.value, ogsgen.OgsgenError)
    message = str(info.value)
    assert re.search(argument, message), f"the message does not name the argument ({argument!r}): {message}"
    if fix is not None:
        assert re.search(fix, message), f"the message does not say what to do ({fix!r}): {message}"


# --------------------------------------------------------------------------------------------------------------------
# The command line: ogsgen.cli.main(argv) returns 2 with "ogsgen: error: ..." on stderr for an OgsgenError; argparse
# itself exits 2 for malformed arguments.
# --------------------------------------------------------------------------------------------------------------------

_CATALOGS = {
    "bad_inputs_cli_unsupported.py": "from ogsgen.spec import BF16, FP16, KernelVariant\n"
                                     "VARIANTS = [KernelVariant(BF16, FP16, BF16)]\n",
    "bad_inputs_cli_intentry.py": "VARIANTS = [1]\n",
    "bad_inputs_cli_importerr.py": "import not_a_module_xyz\nVARIANTS = []\n",
    "a_file": "not a folder\n",
}


def cli(case_id, argv, stderr, cpu_only=None):
    marks = [pytest.mark.skipif(HAS_CUDA, reason=cpu_only)] if cpu_only else []
    return pytest.param(argv, stderr, id=case_id, marks=marks)


@pytest.mark.parametrize("argv,stderr", [
    cli("show-unknown-variant", ["show", "ogs_matmul_nope"],
        r"ogsgen: error: show: no variant named 'ogs_matmul_nope' .*`ogsgen list` shows them"),
    cli("build-spec-without-out", ["build", "--spec", "{tmp}/bad_inputs_cli_intentry.py"],
        r"ogsgen: error: --spec needs --out DIR"),
    cli("list-spec-missing", ["list", "--spec", "{tmp}/missing.py"],
        r"ogsgen: error: --spec .*missing\.py: no such file"),
    cli("list-only-matches-nothing", ["list", "--only", "nomatch*"],
        r"ogsgen: error: --only 'nomatch\*' matches no variant .*`ogsgen list` shows the names"),
    cli("build-out-is-a-file", ["build", "--spec", "{tmp}/bad_inputs_cli_unsupported.py", "--out", "{tmp}/a_file",
                                "--dry-run"],
        r"ogsgen: error: --out .*a_file is a file, not a folder"),
    cli("build-unsupported-variant", ["build", "--spec", "{tmp}/bad_inputs_cli_unsupported.py", "--out", "{tmp}/out",
                                      "--dry-run"],
        r"ogsgen: error: ogs_matmul_xbf16_wfp16_ybf16: x \(bf16\) and w \(fp16\) must share a format"),
    cli("show-spec-with-bad-entry", ["show", "x", "--spec", "{tmp}/bad_inputs_cli_intentry.py"],
        r"ogsgen: error: --spec .*: VARIANTS\[0\] is an int, not a KernelVariant"),
    cli("build-check-spec-import-error", ["build", "--check", "--spec", "{tmp}/bad_inputs_cli_importerr.py", "--out",
                                          "{tmp}/out"],
        r"ogsgen: error: --spec .*importing the catalog failed with ModuleNotFoundError"),
    cli("warmup-without-a-gpu", ["warmup", "--only", "ogs_matmul_xbf16_wbf16_ybf16"],
        r"ogsgen: error: ogsgen warmup compiles for the current CUDA GPU, and there is none here",
        cpu_only="there is a GPU here"),
    cli("warmup-jobs-not-an-int", ["warmup", "--jobs", "many"], r"argument --jobs: invalid int value: 'many'"),
    cli("unknown-command", ["frobnicate"], r"argument command: invalid choice: 'frobnicate'"),
])
def test_bad_command_line(argv, stderr, tmp_path, capsys):
    from ogsgen import cli as ogsgen_cli
    for name, text in _CATALOGS.items():
        (tmp_path / name).write_text(text)
    try:
        code = ogsgen_cli.main([arg.replace("{tmp}", str(tmp_path)) for arg in argv])
    except SystemExit as exc:  # argparse's own errors
        code = exc.code
    err = capsys.readouterr().err
    assert code == 2, err
    assert re.search(stderr, err), err
    assert "Traceback" not in err
    assert not (tmp_path / "out").exists()  # nothing written
