"""Fetch vLLM's gpt-oss MoE module and the two vLLM modules the tests run with it, unchanged, from vLLM's wheel.

The wheel is vLLM 0.33.0's (the one bench/fetch_peers.py takes the bench's peers from; about 340 MB, downloaded with
pip); the files go into DIR, by default third_party/vllm_moe (git-ignored), where tests/test_compat_install.py looks
for them:

* vllm/model_executor/layers/fused_moe/experts/gpt_oss_triton_kernels_moe.py: the MoE forward of each triton_kernels
  generation;
* vllm/model_executor/layers/quantization/utils/mxfp4_utils.py: the mxfp4 weight preparation (_swizzle_mxfp4);
* vllm/utils/import_utils.py: get_triton_kernels_version, how vLLM tells the generations apart.

    python tests/fetch_vllm_moe.py
"""
import argparse
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

WHEEL = "vllm==0.33.0"
DEFAULT_DEST = Path(__file__).resolve().parents[1] / "third_party" / "vllm_moe"
MODULES = ("vllm/model_executor/layers/fused_moe/experts/gpt_oss_triton_kernels_moe.py",
           "vllm/model_executor/layers/quantization/utils/mxfp4_utils.py",
           "vllm/utils/import_utils.py")


def fetch(dest: Path = DEFAULT_DEST) -> list[Path]:
    """Place ``MODULES`` in ``dest`` under their paths in the wheel (a download only when one is missing); their
    paths."""
    placed = [dest / name for name in MODULES]
    if not all(path.is_file() for path in placed):
        with tempfile.TemporaryDirectory() as tmp:
            subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
                            WHEEL, "--dest", tmp], check=True)
            wheel, = Path(tmp).glob("vllm-*.whl")
            with zipfile.ZipFile(wheel) as archive:
                for name, path in zip(MODULES, placed):
                    path.parent.mkdir(parents=True, exist_ok=True)
                    path.write_bytes(archive.read(name))
    return placed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dest", type=Path, nargs="?", default=DEFAULT_DEST,
                        help=f"the folder to place them in (default: {DEFAULT_DEST}, git-ignored)")
    for path in fetch(parser.parse_args().dest):
        print(f"placed {path} (from {WHEEL})")


if __name__ == "__main__":
    main()
