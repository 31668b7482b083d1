"""The specification layer: function identity, formats, variants and canonical names."""
import importlib.util
import pickle
import subprocess
import sys

import pytest

import ogsgen
from ogsgen.errors import SpecError, UnsupportedError
from ogsgen.spec import (BF16, FP16, FP32, FP8_E4M3, FP8_E4M3_B128, FP8_E4M3_CHANNEL, FP8_E5M2, MXFP4, MXFP4_HOPPER,
                         MXFP8_E4M3, FnSpecs, KernelVariant, NumericFormat, canonical_name, companions, format_named,
                         topk_plan, topk_split_k_plan, variant_product)
from ogsgen.spec.catalog import Catalog, _expand, default_catalog
from ogsgen.spec.functions import function_source_hash

MODULE = '''
import triton
import triton.language as tl

OFFSET = {offset}

@triton.jit
def helper(t):
    return t + OFFSET

@triton.jit
def act(tile, k):
    return helper(tile) * k
'''


def _load(tmp_path, name, offset=1.0, extra=""):
    path = tmp_path / f"{name}.py"
    path.write_text(MODULE.format(offset=offset) + extra)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def test_hash_depends_on_source_and_callees_not_name_or_place(tmp_path):
    a = _load(tmp_path, "hash_mod_a")
    same = _load(tmp_path, "hash_mod_b", extra="\n\n# a comment after the functions\n")
    other_constant = _load(tmp_path, "hash_mod_c", offset=2.0)
    assert function_source_hash(a.act) == function_source_hash(same.act)
    assert function_source_hash(a.act) != function_source_hash(other_constant.act)
    assert function_source_hash(a.helper) != function_source_hash(a.act)


def test_hash_ignores_triton_library_functions():
    # tl.sigmoid etc. are Triton's own @jit functions: a Triton upgrade must not make kernels stale.
    assert function_source_hash(ogsgen.swiglu.fn) == ogsgen.swiglu.source_hash
    from ogsgen.spec.functions import _dependencies
    assert all(not name.startswith("tl.") for name, _ in _dependencies(ogsgen.swiglu.fn))


def test_fnspecs_equality_is_by_content(tmp_path):
    a = _load(tmp_path, "eq_mod_a")
    b = _load(tmp_path, "eq_mod_b")
    spec_a = FnSpecs("eq_act", a.act, ("k",))
    spec_b = FnSpecs("eq_act", b.act, ("k",))
    assert spec_a == spec_b and hash(spec_a) == hash(spec_b) and spec_a.fn is not spec_b.fn
    assert FnSpecs("eq_act", a.act, ("k",), reduction_n=2) != spec_a
    ogsgen.unregister("eq_act")


def test_default_fnspecs():
    d = FnSpecs.default()
    assert d.is_default and d.reduction_n == 1 and d == FnSpecs.default()
    assert KernelVariant(BF16, BF16, BF16, activation=d).activation is None


def test_swiglu_builtin():
    assert ogsgen.swiglu.fn_arg_names == ("alpha", "limit") and ogsgen.swiglu.reduction_n == 2
    assert ogsgen.spec.registered("activation", "swiglu") is ogsgen.swiglu
    with pytest.raises(SpecError, match="no epilogue named 'swiglu' is registered"):
        ogsgen.spec.registered("epilogue", "swiglu")


def test_formats_express_fp8_and_mx():
    assert FP8_E4M3.scaling == "flexpoint" and FP8_E4M3.bits == 8 and FP8_E4M3.name == "fp8e4m3"
    assert MXFP4.block_size == 32 and MXFP4.bits == 4 and MXFP4.name == "mxfp4"
    assert MXFP8_E4M3.name == "mxfp8e4m3"
    assert NumericFormat("e2m1", "block_e8m0", 32, layout="hopper").name == "mxfp4hopper"
    assert format_named("bf16") is BF16
    with pytest.raises(SpecError, match="unknown format 'bf17'"):
        format_named("bf17")
    with pytest.raises(SpecError, match="e2m1 .* need block_e8m0"):
        NumericFormat("e2m1")
    with pytest.raises(SpecError, match="flexpoint scaling applies to fp8"):
        NumericFormat("bf16", "flexpoint")
    with pytest.raises(SpecError, match="'block_e8m0' scales take block_size 32 .* got 0"):
        NumericFormat("e4m3", "block_e8m0")
    with pytest.raises(SpecError, match="block_size applies to 'block_e8m0', 'block_f32' and 'block_e4m3' scaling, not 'flexpoint'"):
        NumericFormat("e4m3", "flexpoint", 32)
    with pytest.raises(SpecError, match="'block_f32' scales take block_size 128 .* or 0 .* got 32"):
        NumericFormat("e4m3", "block_f32", 32)
    with pytest.raises(SpecError, match="block_f32 scaling applies to fp8 elements, not bf16"):
        NumericFormat("bf16", "block_f32", 128)
    assert FP8_E4M3_B128.name == "fp8e4m3_b128" and FP8_E4M3_CHANNEL.name == "fp8e4m3_channel"
    assert format_named("fp8e4m3_b128") is FP8_E4M3_B128
    assert [f.scales_apply for f in (BF16, FP8_E4M3, MXFP4, FP8_E4M3_B128, FP8_E4M3_CHANNEL)] == \
        ["none", "epilogue", "operand", "k_group", "epilogue"]


def test_variants_the_spec_expresses_but_no_template_renders_yet():
    KernelVariant(BF16, MXFP4, BF16).check_supported()  # has a path: dequantized in the kernel
    KernelVariant(BF16, MXFP4_HOPPER, BF16).check_supported()
    with pytest.raises(UnsupportedError, match="hopper-layout mxfp4 weights are upcast in registers, so x must be "
                                               "bf16, mxfp8 or e4m3"):
        KernelVariant(FP16, MXFP4_HOPPER, FP16).check_supported()
    with pytest.raises(UnsupportedError, match="only w has swizzled layouts"):
        KernelVariant(BF16, MXFP4, MXFP4_HOPPER).check_supported()
    with pytest.raises(SpecError, match="the hopper layout holds mxfp4 values"):
        NumericFormat("e4m3", "block_e8m0", 32, layout="hopper")
    KernelVariant(MXFP8_E4M3, MXFP4_HOPPER, BF16).check_supported()  # mx activations: upcast to bf16 as well
    with pytest.raises(UnsupportedError, match="mx activations are mxfp8 .* not mxfp4"):
        KernelVariant(MXFP4, BF16, BF16).check_supported()
    with pytest.raises(UnsupportedError, match="mxfp8 activations are upcast to bf16 .* got fp16"):
        KernelVariant(MXFP8_E4M3, FP16, BF16).check_supported()
    with pytest.raises(UnsupportedError, match="mxfp8 activations are upcast to bf16 .* got fp8e4m3_b128"):
        KernelVariant(MXFP8_E4M3, FP8_E4M3_B128, BF16).check_supported()
    with pytest.raises(UnsupportedError, match="MX weights need bf16, fp16 or mxfp8 x"):
        KernelVariant(FP32, MXFP4, FP32).check_supported()
    # e4m3 x with mxfp4 w: fp8 dots on W converted to e4m3; not e5m2 x, nor mxfp8 w
    for x in (FP8_E4M3, FP8_E4M3_CHANNEL):
        for w in (MXFP4, MXFP4_HOPPER):
            assert KernelVariant(x, w, BF16).folds_mx_scales
            KernelVariant(x, w, BF16).check_supported()
    with pytest.raises(UnsupportedError, match="MX weights need .* not fp8e5m2 x with mxfp4 weights"):
        KernelVariant(FP8_E5M2, MXFP4, BF16).check_supported()
    with pytest.raises(UnsupportedError, match="MX weights need .* not fp8e4m3 x with mxfp8e4m3 weights"):
        KernelVariant(FP8_E4M3, MXFP8_E4M3, BF16).check_supported()
    assert not KernelVariant(FP8_E4M3_B128, FP8_E4M3_B128, BF16).folds_mx_scales
    with pytest.raises(UnsupportedError, match="must share a format"):
        KernelVariant(BF16, FP16, BF16).check_supported()


def test_canonical_name():
    v = KernelVariant(BF16, BF16, FP32, bias=True, gammas=True, activation=ogsgen.swiglu)
    assert canonical_name(v) == "ogs_matmul_xbf16_wbf16_yfp32_bias_gammas_act_swiglu"
    assert canonical_name(v).isidentifier()


def test_variant_rules():
    with pytest.raises(SpecError, match="betas=True needs bias=True"):
        KernelVariant(BF16, BF16, BF16, betas=True)
    with pytest.raises(SpecError, match="gather and scatter index expert-sorted rows"):
        KernelVariant(BF16, BF16, BF16, gather=True)
    with pytest.raises(SpecError, match="y_acc_in .* cannot be combined with scatter"):
        KernelVariant(BF16, BF16, BF16, ragged=True, scatter=True, y_acc_in=True)
    with pytest.raises(SpecError, match="a reduce kernel takes only features"):
        KernelVariant(FP32, FP32, BF16, family="reduce", bias=True)
    with pytest.raises(SpecError, match="family must be one of"):
        KernelVariant(BF16, BF16, BF16, family="persistent")
    product = variant_product([(BF16, BF16, BF16)], bias=(False, True), betas=(False, True))
    assert len(product) == 3  # betas without bias skipped
    with pytest.raises(SpecError, match="unknown features"):
        variant_product([(BF16, BF16, BF16)], biases=(True,))


@pytest.mark.slow  # (5 s on a CPU)
def test_topk_plan_and_catalog_companions():
    w2 = KernelVariant(BF16, MXFP4_HOPPER, BF16, ragged=True, scatter=True, bias=True, gammas=True)
    matmul, reduce = topk_plan(w2)
    # the matmul writes expert-sorted rows (no scatter, no gammas); the reduce gathers, weights and sums them
    assert canonical_name(matmul) == "ogs_matmul_xbf16_wmxfp4hopper_ybf16_ragged_bias"
    assert canonical_name(reduce) == "ogs_reduce_xbf16_ybf16_scatter_gammas"
    catalog = Catalog("test", _expand([w2], "test")).by_name()
    # companions are expanded transitively: the top-k matmul may split K, so its partials and reduce are built
    assert {"ogs_matmul_xbf16_wmxfp4hopper_yfp32_ragged_bias", "ogs_reduce_xfp32_ybf16"} <= set(catalog)
    # K split through the top-k combine: the same fp32 partials, summed over splits and gates by one reduce
    partials, split_reduce = topk_split_k_plan(w2)
    assert canonical_name(partials) == "ogs_matmul_xbf16_wmxfp4hopper_yfp32_ragged_bias"
    assert canonical_name(split_reduce) == "ogs_reduce_xfp32_ybf16_scatter_gammas" in catalog
    with pytest.raises(SpecError, match="with an activation cannot split K"):
        topk_split_k_plan(KernelVariant(BF16, BF16, BF16, ragged=True, scatter=True,
                                        activation=ogsgen.swiglu))
    for variant in default_catalog().variants:
        assert {canonical_name(c) for c in companions(variant)} <= set(default_catalog().by_name())


@pytest.mark.slow
def test_variant_hash_is_cached_but_not_pickled():
    variant = KernelVariant(BF16, BF16, BF16, ragged=True, gammas=True)
    assert hash(variant) == hash(variant) == hash(KernelVariant(BF16, BF16, BF16, ragged=True, gammas=True))
    # A variant pickled here and loaded in another process (other string hashes) must hash as that process's own.
    script = ("import pickle, sys; from ogsgen.spec import KernelVariant; from ogsgen.spec.formats import BF16; "
              "v = pickle.loads(sys.stdin.buffer.read()); "
              "print(hash(v) == hash(KernelVariant(BF16, BF16, BF16, ragged=True, gammas=True)))")
    done = subprocess.run([sys.executable, "-c", script], input=pickle.dumps(variant), capture_output=True)
    assert done.stdout.strip() == b"True", done.stderr
