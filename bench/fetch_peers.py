"""Fetch the bench's peer: triton_kernels' matmul_ogs generation, as vLLM 0.33.0 vendors it (its wheel's
vllm/third_party/triton_kernels), into DIR, for side-by-side measurement only (keep DIR out of git).

    python bench/fetch_peers.py third_party
    PYTHONPATH=.:third_party python bench/bench_moe.py --out bench/results/$(date +%F)

Downloads one wheel (about 340 MB) with pip and keeps only that package.
"""
import argparse
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

WHEEL = "vllm==0.33.0"
VENDORED = "vllm/third_party/"


def fetch(dest: Path) -> Path:
    package = dest / "triton_kernels"
    if (package / "matmul_ogs.py").is_file():
        return package
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:", WHEEL,
                        "--dest", tmp], check=True)
        wheel, = Path(tmp).glob("vllm-*.whl")
        with zipfile.ZipFile(wheel) as archive:
            for name in archive.namelist():
                if name.startswith(VENDORED + "triton_kernels/") and not name.endswith("/"):
                    target = dest / name.removeprefix(VENDORED)
                    target.parent.mkdir(parents=True, exist_ok=True)
                    target.write_bytes(archive.read(name))
    if not (package / "matmul_ogs.py").is_file():
        raise SystemExit(f"{WHEEL} holds no {VENDORED}triton_kernels/matmul_ogs.py")
    return package


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dest", type=Path, help="the folder to place triton_kernels in (git-ignored)")
    package = fetch(parser.parse_args().dest)
    print(f"triton_kernels in {package}; run the bench with PYTHONPATH=.:{package.parent}")


if __name__ == "__main__":
    main()
