#!/usr/bin/env bash
# device call K: the ragged-K kernel with vectorized, pipelined x loads and the tile loop (4b498a9): GPU tests, the
# tile/persistence sweep on gpt-oss-120b and DeepSeek-V3 T=2048 (each ending with the ogsgen training step)
export PYTHONPATH=.:third_party:third_party/vllm
export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
timeout 80 python -m pytest -q -rf -n 4 tests/test_inner.py tests/test_autograd.py > $OUT/tests.txt 2>&1
echo "rc $?" >> $OUT/tests.txt
timeout 200 python bench/probes/inner_sweep.py --out $OUT/sweep_gptoss --case gpt-oss-120b:2048 > $OUT/sweep_gptoss.log 2>&1
echo "rc $?" >> $OUT/sweep_gptoss.log
timeout 220 python bench/probes/inner_sweep.py --out $OUT/sweep_deepseek --case DeepSeek-V3:2048 \
  --tiles 128x256x32x8x3 128x256x32x8x3p 128x256x64x8x3p 128x128x32x4x3 128x128x32x4x3p 128x128x64x4x4 \
  > $OUT/sweep_deepseek.log 2>&1
echo "rc $?" >> $OUT/sweep_deepseek.log
