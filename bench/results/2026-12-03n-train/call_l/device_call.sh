#!/usr/bin/env bash
# device call L: the training step with the ragged-K heuristic of this session (both libraries, T=2048 and 8192),
# DeepSeek-V3's kernel breakdown, then the decode / mxfp4 bench with peers queued since 2026-12-03
export PYTHONPATH=.:third_party:third_party/vllm
export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
echo 6cd43a4 > $OUT/tree.txt
timeout 270 python bench/bench_train.py --out $OUT/train --tokens 2048 8192 > $OUT/train.log 2>&1
echo "rc $?" >> $OUT/train.log
timeout 60 python bench/probes/train_breakdown.py --out $OUT/breakdown --case "DeepSeek-V3:2048" > $OUT/breakdown.log 2>&1
echo "rc $?" >> $OUT/breakdown.log
timeout 170 python bench/bench_moe.py --out $OUT/moe --tokens 1 8 32 256 --formats bf16 bf16-kmajor mxfp4 --no-dense > $OUT/moe.log 2>&1
echo "rc $?" >> $OUT/moe.log
