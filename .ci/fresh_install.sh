#!/usr/bin/env bash
# CI: the README's install in a virtual environment that shares nothing with any other (no .pth files, no system
# site-packages, no PYTHONPATH): build the wheel, install it with the dependencies it declares, build and check the
# kernels as the README says, run one interpreted matmul, and check that everything, ogsgen's templates/ and
# generated/ included, comes from that environment and that the build left no file in the package; then the
# README's test install over it (pip install -e '.[test]' in the checkout), after which `import ogsgen` must import
# the checkout.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
unset PYTHONPATH

# Build from a copy of the package's inputs: an in-tree build reuses build/lib, which can hold stale files.
mkdir "$work/src"
tar -C "$repo" --exclude=__pycache__ -cf - pyproject.toml README.md LICENSE ogsgen templates generated |
  tar -C "$work/src" -xf -
python3 -m pip wheel --quiet --no-deps --wheel-dir "$work/dist" "$work/src"

python3 -m venv "$work/venv"
# The CPU build of torch (a local file on these machines); an unpinned torch would pull a multi-GB CUDA build.
"$work/venv/bin/python" -m pip install --quiet torch==2.13.0
"$work/venv/bin/python" -m pip install --quiet "$work"/dist/ogsgen-*.whl

cd "$work"  # nothing of the checkout on sys.path
export PATH="$work/venv/bin:$PATH"
echo "== fresh install: ogsgen build && ogsgen build --check"
# README: install and build (one command a line: set -e does not stop at the left side of a failing &&)
ogsgen build
ogsgen build --check
TRITON_INTERPRET=1 python - <<'PY'
import sys
import sysconfig

import filelock
import jinja2
import numpy
import torch
import triton

import ogsgen
from ogsgen._resources import data_dir

site = sysconfig.get_paths()["purelib"]
outside = [p for p in sys.path if p and not p.startswith(sys.prefix)
           and not (p.startswith(sys.base_prefix) and "-packages" not in p)]
assert not outside, f"sys.path reaches outside the fresh environment and the standard library: {outside}"
for module in (ogsgen, torch, triton, jinja2, numpy, filelock):
    assert module.__file__.startswith(site), f"{module.__name__} comes from {module.__file__}, not {site}"
for folder in ("templates", "generated"):
    assert str(data_dir(folder)).startswith(site), f"ogsgen's {folder}/ is {data_dir(folder)}, not in {site}"
# bf16: the interpreter's bf16 dot is wrong unless the installed package corrects it
x, w = torch.randn(64, 96, dtype=torch.bfloat16), torch.randn(96, 80, dtype=torch.bfloat16)
y = ogsgen.matmul_ogs(x, w, None)
torch.testing.assert_close(y.float(), x.float() @ w.float(), atol=5e-2, rtol=2e-2)
from importlib.metadata import entry_points
assert [e.value for e in entry_points(group="pytest11") if e.name == "ogsgen"] == ["ogsgen.pytest_plugin"]
# `ogsgen build` wrote nothing into the installed package (a file pip did not install stays behind when pip removes
# the package, and the leftover folder then shadows an editable install)
from importlib.metadata import files
from pathlib import Path
recorded = {Path(f.locate()).resolve() for f in files("ogsgen")}
package = Path(ogsgen.__file__).parent
unrecorded = [p for p in package.rglob("*") if p.is_file() and "__pycache__" not in p.parts and p not in recorded]
assert not unrecorded, f"files in the installed package that pip did not install: {unrecorded}"
print(f"fresh install: ogsgen {ogsgen.__version__} (triton {triton.__version__}, torch {torch.__version__}) "
      f"built, checked and ran a bf16 matmul from {site}; the pytest plugin is registered")
PY

echo "== fresh install: then the README's test install, pip install -e '.[test]' in the checkout"
(cd "$work/src" && python -m pip install --quiet -e '.[test]')
python - "$work/src" <<'PY'
import sys
from pathlib import Path

import ogsgen
from ogsgen._resources import data_dir

checkout = Path(sys.argv[1]).resolve()
assert ogsgen.__file__ and Path(ogsgen.__file__).resolve() == checkout / "ogsgen" / "__init__.py", \
    f"import ogsgen imports {ogsgen.__file__ or ogsgen.__path__}, not the checkout {checkout}"
assert data_dir("generated") == checkout / "generated", data_dir("generated")
print(f"fresh install: after pip install -e '.[test]', import ogsgen imports the checkout {checkout}")
PY
