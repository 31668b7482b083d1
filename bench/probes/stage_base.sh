#!/usr/bin/env bash
# Stage an earlier ogsgen tree as the package `ogsgen_base` for bench/probes/before_after.py:
#   bench/probes/stage_base.sh TREE DEST [NAME]   (then PYTHONPATH=.:DEST; keep DEST out of git, e.g. .git/info/exclude)
# NAME: the package name (default ogsgen_base; before_after.py --base-name NAME).
set -euo pipefail
tree=$1 dest=$2 name=${3:-ogsgen_base}
rm -rf "$dest" && mkdir -p "$dest"
cp -r "$tree/ogsgen" "$dest/$name"
cp -r "$tree/templates" "$tree/generated" "$dest/"
find "$dest" -name __pycache__ -prune -exec rm -rf {} +
