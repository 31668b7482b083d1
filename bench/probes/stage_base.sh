#!/usr/bin/env bash
# Stage an earlier ogsgen tree as the package `ogsgen_base` for bench/probes/before_after.py:
#   bench/probes/stage_base.sh TREE DEST     (then PYTHONPATH=.:DEST; keep DEST out of git, e.g. .git/info/exclude)
set -euo pipefail
tree=$1 dest=$2
rm -rf "$dest" && mkdir -p "$dest"
cp -r "$tree/ogsgen" "$dest/ogsgen_base"
cp -r "$tree/templates" "$tree/generated" "$dest/"
find "$dest" -name __pycache__ -prune -exec rm -rf {} +
