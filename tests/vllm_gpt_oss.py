"""python tests/vllm_gpt_oss.py GENERATION: vLLM's gpt-oss MoE module (triton_kernel_moe_forward), its mxfp4 weight
preparation (_swizzle_mxfp4, mx_scale_kwargs) and its generation check (get_triton_kernels_version), fetched
unchanged from vLLM's wheel by tests/fetch_vllm_moe.py, run after ``ogsgen.compat.install(GENERATION)`` on bf16 and
mxfp4 weights, against the torch reference; exits non-zero where a result differs or vLLM logs a warning or error.
A process of its own: the install, vLLM's cached generation and its custom ops are the process's.

The rest of vLLM that these modules import is stood in for below: its logger, the platform (no CUDA, or an H100),
the custom-op registry, the MoE config types and base classes. The stand-ins are vLLM's serving machinery, not its
math: every result compared is computed by vLLM's code on the triton_kernels package it imports. Names the modules
import but the tested calls never use are placeholders that fail if used."""
import enum
import importlib.util
import logging
import math
import os
import re
import sys
import types
from dataclasses import dataclass
from pathlib import Path

import torch
import triton
import triton.language as tl

import ogsgen
import ogsgen.compat
from ogsgen.compat import _tensor
from ogsgen.testing import assert_close, install_interpreter_fixes

sys.path.insert(0, str(Path(__file__).parent))
from compat_layers import checkpoint_moe, reference_layer  # noqa: E402
from fetch_vllm_moe import DEFAULT_DEST  # noqa: E402

MOE = "vllm.model_executor.layers.fused_moe"
# What vLLM's get_triton_kernels_version names each generation
VLLM_NAMES = {"3.5": "3.5.1", "3.6": "3.6", "3.8": "3.8"}


# ------------------------------------------------------------------ stand-ins for vLLM's runtime

class Logger(logging.LoggerAdapter):
    """vLLM's logger: a logging.Logger with *_once methods."""
    def debug_once(self, msg, *args, **kwargs):
        self.debug(msg, *args)

    def info_once(self, msg, *args, **kwargs):
        self.info(msg, *args)

    def warning_once(self, msg, *args, **kwargs):
        self.warning(msg, *args)


class Platform:
    """vLLM's current_platform, as far as the tested calls ask: a CUDA GPU of compute capability ``capability``
    (major, minor), or none (None, this machine)."""
    capability = None

    def is_cuda(self):
        return self.capability is not None

    def is_rocm(self):
        return False

    def is_device_capability(self, capability, device_id=0):
        return self.is_cuda() and self.capability[0] * 10 + self.capability[1] == capability

    def is_device_capability_family(self, capability, device_id=0):
        return self.is_cuda() and self.capability[0] == capability // 10


def direct_register_custom_op(op_name, op_func, mutates_args=None, fake_impl=None, **kwargs):
    """vLLM's torch custom-op registration (mxfp4_utils registers two at import, as torch.ops.vllm.*)."""
    op = torch.library.custom_op(f"vllm::{op_name}", op_func, mutates_args=mutates_args or ())
    if fake_impl is not None:
        op.register_fake(fake_impl)


def resize_cache(x, v):
    """vLLM's fused_moe.utils._resize_cache."""
    return x.flatten()[:math.prod(v)].view(*v)


@dataclass
class FusedMoEQuantConfig:
    """vLLM's FusedMoEQuantConfig, as the MoE forward reads it."""
    w1_bias: torch.Tensor | None = None
    w2_bias: torch.Tensor | None = None
    w1_precision: object = None
    w2_precision: object = None


def placeholder(name):
    """A name the modules import that the tested calls never use (a base class, a type in a signature): a class that
    fails if made or called."""
    def unused(*args, **kwargs):
        raise NotImplementedError(f"{name} is a placeholder of tests/vllm_gpt_oss.py, not vLLM's")
    return type(name, (), {"__init__": unused})


def stand_in(name, **names):
    """Module ``name`` in sys.modules (with its parent packages), holding ``names``."""
    module = sys.modules.setdefault(name, types.ModuleType(name))
    module.__dict__.update(names)
    parent, _, child = name.rpartition(".")
    if parent:
        setattr(stand_in(parent, __path__=[]), child, module)
    return module


def install_stand_ins(platform):
    sys.modules.setdefault("regex", re)  # vLLM's import_utils imports regex as a drop-in for re
    stand_in("vllm.logger", init_logger=lambda name: Logger(logging.getLogger(name), {}))
    stand_in("vllm.platforms", current_platform=platform)
    stand_in("vllm.platforms.rocm", on_gfx950=lambda: False)
    stand_in("vllm.triton_utils", tl=tl, triton=triton)
    stand_in("vllm.utils.torch_utils", direct_register_custom_op=direct_register_custom_op,
             is_torch_equal_or_newer=lambda version: torch.torch_version.TorchVersion(torch.__version__) >= version)
    stand_in(f"{MOE}.modular_kernel", **{name: placeholder(name) for name in (
        "FusedMoEExpertsModular", "FusedMoEExpertsMonolithic", "FusedMoEActivationFormat", "ExpertTokensMetadata",
        "TopKWeightAndReduce")})
    stand_in(f"{MOE}.activation", MoEActivation=enum.Enum("MoEActivation", [
        "SWIGLUOAI", "SILU", "GELU", "SWIGLUSTEP", "SWIGLUOAI_UNINTERLEAVE"]))
    stand_in(f"{MOE}.config", FusedMoEQuantConfig=FusedMoEQuantConfig,
             FUSED_MOE_UNQUANTIZED_CONFIG=FusedMoEQuantConfig(),
             **{name: placeholder(name) for name in ("FusedMoEConfig", "FusedMoEParallelConfig", "RoutingMethodType")})
    stand_in(f"{MOE}.experts.lora_experts_mixin", LoRAExpertsMixin=placeholder("LoRAExpertsMixin"))
    stand_in(f"{MOE}.topk_weight_and_reduce", TopKWeightAndReduceNoOP=placeholder("TopKWeightAndReduceNoOP"))
    stand_in(f"{MOE}.utils", _resize_cache=resize_cache, remap_topk_to_local=placeholder("remap_topk_to_local"),
             swiglu_limit_func=placeholder("swiglu_limit_func"))
    stand_in("vllm.model_executor.layers.quantization.utils.quant_utils", QuantKey=placeholder("QuantKey"),
             kMxfp4Static=placeholder("kMxfp4Static"))


def load_fetched(name):
    """vLLM's module ``name``, from the file tests/fetch_vllm_moe.py placed, unchanged."""
    spec = importlib.util.spec_from_file_location(name, DEFAULT_DEST / (name.replace(".", "/") + ".py"))
    module = sys.modules[name] = importlib.util.module_from_spec(spec)
    stand_in(name)  # in its parent packages
    spec.loader.exec_module(module)
    return module


# ------------------------------------------------------------------ the run

class Warnings(logging.Handler):
    """What vLLM's loggers say at WARNING and above (its module logs an error where an import of triton_kernels
    fails)."""
    def __init__(self):
        super().__init__(logging.WARNING)
        self.records = []

    def emit(self, record):
        self.records.append(self.format(record))


def main(generation):
    if os.environ.get("TRITON_INTERPRET") == "1":  # as tests/conftest.py: the interpreter's defects corrected
        install_interpreter_fixes()
    ogsgen.compat.install(generation)
    platform = Platform()
    install_stand_ins(platform)
    warnings = Warnings()
    logging.getLogger("vllm").addHandler(warnings)
    import_utils = load_fetched("vllm.utils.import_utils")
    mxfp4_utils = load_fetched("vllm.model_executor.layers.quantization.utils.mxfp4_utils")
    moe = load_fetched(f"{MOE}.experts.gpt_oss_triton_kernels_moe")
    version = import_utils.get_triton_kernels_version()
    assert version == VLLM_NAMES[generation], f"vLLM reads generation {version}, not {VLLM_NAMES[generation]}"
    print(f"vLLM reads generation {generation}: get_triton_kernels_version() == {version!r}")
    mo = importlib.import_module("triton_kernels.matmul" if version == "3.8" else "triton_kernels.matmul_ogs")

    t = checkpoint_moe("cuda" if torch.cuda.is_available() else "cpu")
    gating_output = (t["x"] @ t["wg"]).float() + t["bg"]
    routing = ogsgen.routing(gating_output, 2)

    def forward(w13, w2, quant):
        out = moe.triton_kernel_moe_forward(t["x"], w13, w2, gating_output, topk=2, renormalize=True,
                                            quant_config=quant)
        assert out.shape == t["x"].shape and out.dtype == torch.bfloat16
        return out.float()

    # bf16 weights (E, K, N), biases in the quant config (vLLM's biased_moe_quant_config)
    w13, w2 = t["w13_ref"].bfloat16(), t["w2_ref"].bfloat16()
    bf16_ref = reference_layer({**t, "w13_ref": w13.float(), "w2_ref": w2.float()}, routing)
    assert_close(bf16_ref, forward(w13, w2, FusedMoEQuantConfig(t["w13_bias"], t["w2_bias"])), maxtol=3e-2)
    print("bf16: matches the reference")

    for case, capability in (("mxfp4 without CUDA", None), ("mxfp4 on an H100", (9, 0))):
        platform.capability = capability
        _tensor._hopper_layouts_wanted = lambda: capability == (9, 0)  # the layouts an H100 gets
        # vLLM's mxfp4 oracle: _swizzle_mxfp4 (on an H100: hopper layouts, K's scale groups padded to a multiple of
        # 4, split_k=1), then PrecisionConfig(**mx_scale_kwargs(scale), flex_ctx=FlexCtx(rhs_data=flex))
        w13, w13_flex, w13_scale = mxfp4_utils._swizzle_mxfp4(t["w13"], t["w13_scale"])
        w2, w2_flex, w2_scale = mxfp4_utils._swizzle_mxfp4(t["w2"], t["w2_scale"])
        groups = [scale.shape[-2] for scale in (w13_scale, w2_scale)]
        assert groups == ([4, 4] if capability else [2, 1]), f"{case}: scales of {groups} K groups"
        layout = type(w13.storage.layout).__name__
        assert layout == ("HopperMXValueLayout" if capability else "StridedLayout"), f"{case}: {layout}"
        quant = FusedMoEQuantConfig(
            t["w13_bias"], t["w2_bias"],
            mo.PrecisionConfig(**mxfp4_utils.mx_scale_kwargs(w13_scale), flex_ctx=mo.FlexCtx(rhs_data=w13_flex)),
            mo.PrecisionConfig(**mxfp4_utils.mx_scale_kwargs(w2_scale), flex_ctx=mo.FlexCtx(rhs_data=w2_flex)))
        assert_close(reference_layer(t, routing), forward(w13, w2, quant), maxtol=3e-2, what=case)
        print(f"{case}: matches the reference")
    assert not warnings.records, f"vLLM logged: {warnings.records}"


if __name__ == "__main__":
    main(sys.argv[1])
