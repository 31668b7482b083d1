"""Numeric cases at realistic sizes, on a CUDA GPU only (results recorded in docs/gpu_runs.md)."""
from pathlib import Path

import pytest

import ogsgen
from ogsgen.codegen import build
from ogsgen.spec import default_catalog, load_catalog_file
from cases import run_case

pytestmark = pytest.mark.gpu
DEFAULT = default_catalog().by_name()


@pytest.mark.parametrize("name,m,n,k", [
    ("ogs_matmul_xbf16_wbf16_ybf16", 8192, 8192, 8192),
    ("ogs_matmul_xbf16_wbf16_ybf16_bias", 4096, 5760, 2880),
    ("ogs_matmul_xbf16_wbf16_ybf16_bias_act_swiglu", 4096, 5760, 2880),
    ("ogs_matmul_xbf16_wbf16_ybf16_bias_gammas", 64, 5760, 2880),
    ("ogs_matmul_xbf16_wbf16_yfp32", 2048, 128, 2880),  # router-style: E=128 logits in fp32
    ("ogs_matmul_xfp16_wfp16_yfp16_bias_gammas_act_swiglu", 1000, 4096, 7168),
    ("ogs_matmul_xfp32_wfp32_yfp32_bias", 2048, 2000, 1999),
    ("ogs_matmul_xfp16_wfp16_yfp32", 1, 2880, 2880),
])
def test_dense_realistic(name, m, n, k):
    run_case(DEFAULT[name], m, n, k, "cuda")


def test_fp32_without_tf32():
    run_case(DEFAULT["ogs_matmul_xfp32_wfp32_yfp32"], 1024, 1000, 2048, "cuda", allow_tf32=False, maxtol=1e-4,
             rmstol=1e-5)


@pytest.mark.parametrize("x_t,w_t,y_t", [(True, False, False), (False, True, False), (False, False, True)])
def test_major_orders_realistic(x_t, w_t, y_t):
    run_case(DEFAULT["ogs_matmul_xbf16_wbf16_ybf16_bias"], 320, 400, 400, "cuda", x_transposed=x_t,
             w_transposed=w_t, y_transposed=y_t)


def test_batched_realistic():
    run_case(DEFAULT["ogs_matmul_xbf16_wbf16_ybf16_bias_act_swiglu"], 300, 400, 400, "cuda", batch=5)
    run_case(DEFAULT["ogs_matmul_xfp16_wfp16_yfp16"], 16, 16, 1000, "cuda", batch=5)
    run_case(DEFAULT["ogs_matmul_xfp16_wfp16_yfp16"], 8, 8, 8, "cuda", batch=10000)


def test_custom_functions_realistic(tmp_path):
    catalog = load_catalog_file(Path(__file__).parent / "catalogs" / "custom_catalog.py")
    build(catalog, tmp_path)
    ogsgen.add_search_path(tmp_path)
    for variant in catalog.variants:
        if variant.family == "matmul":
            run_case(variant, 1000, 704, 608, "cuda")
