#!/usr/bin/env bash
# device call Q (tree 5862325): the GPU suite, complete; the decode persistent rule with gathered x (issue 33):
# w1 decode cases (fewer rows than experts, gathered x) timed with the heuristic's tiled kernel against the
# persistent decode tile, both weight layouts, in turn
export PYTHONPATH=.:third_party:third_party/vllm
echo 5862325 > $OUT/tree.txt
nvidia-smi --query-gpu=name,power.limit,driver_version --format=csv > $OUT/gpu.txt
python -c "import torch, triton; print(torch.__version__, triton.__version__)" >> $OUT/gpu.txt
timeout 240 python -m pytest -q -rf -n 4 tests/test_gpu.py > $OUT/gpu_tests.txt 2>&1
echo "rc $?" >> $OUT/gpu_tests.txt
CASES=("gpt-oss w1:4" "gpt-oss w1:8" "gpt-oss w1:16" "gpt-oss w1:31" "DeepSeek-V3 w1:4" "DeepSeek-V3 w1:8"
       "DeepSeek-V3 w1:16" "DeepSeek-V3 w1:31" "Qwen3-30B-A3B w1:8" "Qwen3-30B-A3B w1:15" "Mixtral-8x7B w1:2"
       "Mixtral-8x7B w1:3")
for f in bf16 bf16-kmajor; do
  timeout 150 python bench/probes/tile_sweep.py --out $OUT/decode_gather --format $f --cases "${CASES[@]}" \
    --tiles 16x128x128x4x4p 16x128x64x8x4p 16x64x128x4x4p --in-turn > $OUT/decode_gather_$f.log 2>&1
  echo "rc $?" >> $OUT/decode_gather_$f.log
done
