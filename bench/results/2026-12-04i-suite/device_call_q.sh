#!/usr/bin/env bash
# device call Q: Dynamo's lru_cache warning at a compile of the layer: the new test with ogsgen/devices.py before
# and after the fix
export PYTHONPATH=.
cp ogsgen/devices.py /tmp/devices_after.py
cp .snap/devices_before.py ogsgen/devices.py
timeout 100 python -m pytest -q -rf tests/test_compile.py -k warns_of_nothing > $OUT/before.txt 2>&1; echo "rc $?" >> $OUT/before.txt
cp /tmp/devices_after.py ogsgen/devices.py
timeout 150 python -m pytest -q -rf tests/test_compile.py tests/test_devices.py > $OUT/after.txt 2>&1; echo "rc $?" >> $OUT/after.txt
tail -4 $OUT/before.txt; tail -4 $OUT/after.txt
