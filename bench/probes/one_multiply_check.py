"""Probe, no GPU needed: the hopper mxfp4 kernels' K loop if the upcast took one bf16x2 multiply per W register
instead of two (the 2^126 renormalization folded into the scale factor, exact only for scale codes <= 128). The
numerics are NOT kept (the factor is unchanged): this measures instruction counts and registers only.

    OGSGEN_ON_DEMAND=1 OGSGEN_CACHE_DIR=<fresh> TRITON_CACHE_DIR=<fresh> PYTHONPATH=.:bench \
        python bench/probes/one_multiply_check.py --out DIR --cases "gpt-oss w2:8192" ...   (offline_sm90_check's arguments)

The modified helper makes the generated kernels stale, hence on-demand generation into a scratch cache.
"""
import runpy
import sys
from pathlib import Path

import triton.language as tl

import ogsgen.numerics.jit as jit

HERE = Path(__file__).resolve().parent
one_multiply = jit.E2M1_WORD_TO_BF16.value.replace("fma.rn.bf16x2 v, v, bias, nz;\n", "")
assert one_multiply.count("fma.rn.bf16x2") == 4
jit.E2M1_WORD_TO_BF16 = tl.constexpr(one_multiply)
sys.path.insert(0, str(HERE))
sys.argv = [str(HERE / "offline_sm90_check.py"), *sys.argv[1:]]
runpy.run_path(str(HERE / "offline_sm90_check.py"), run_name="__main__")
