#!/usr/bin/env bash
# device call T (tree 3adb697): call S's L2-promotion probe again (its patched module failed to load under another name)
export PYTHONPATH=.:bench
echo 3adb697 > $OUT/tree.txt
timeout 330 python bench/probes/l2_promotion.py --out $OUT/l2 > $OUT/l2.log 2>&1
echo "rc $?" >> $OUT/l2.log
