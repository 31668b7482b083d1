"""Fetch the bench's peers into DIR (keep DIR out of git; the checkout's third_party/ is ignored), for side-by-side
measurement only, from one wheel, vLLM 0.33.0's (about 340 MB, downloaded with pip):

* triton_kernels' matmul_ogs generation, as vLLM vendors it (vllm/third_party/triton_kernels) -> DIR/triton_kernels;
* vLLM's bf16 fused_moe Triton kernel (fused_moe_kernel and its helper write_zeros_to_output, from
  vllm/model_executor/layers/fused_moe/fused_moe.py, with plain triton imports) -> DIR/vllm/vllm_fused_moe_kernel.py,
  which bench/vllm_peer_launch.py launches;
* DeepGEMM's wheels for the GPU machine's Python 3.12 -> DIR/deep_gemm_wheels, which bench/deepgemm_peer.py loads.

    python bench/fetch_peers.py third_party
    PYTHONPATH=.:third_party:third_party/vllm python bench/bench_moe.py --out bench/results/$(date +%F)
"""
import argparse
import ast
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

WHEEL = "vllm==0.33.0"
# the newest DeepGEMM that loads under torch 2.11 (0.2.x is built against torch 2.13's ABI), and its tvm-ffi
DEEP_GEMM_WHEELS, DEEP_GEMM_DIR = ("sgl-deep-gemm==0.1.0", "apache-tvm-ffi==0.1.9"), "deep_gemm_wheels"
VENDORED = "vllm/third_party/"
FUSED_MOE = "vllm/model_executor/layers/fused_moe/fused_moe.py"
KERNEL_FUNCTIONS = ("write_zeros_to_output", "fused_moe_kernel")
KERNEL_MODULE = Path("vllm") / "vllm_fused_moe_kernel.py"
HEADER = (f"# From the {WHEEL} wheel, {FUSED_MOE} (Apache-2.0, the vLLM project's contributors), placed by\n"
          f"# bench/fetch_peers.py; only the imports differ. For side-by-side measurement only.\n"
          f"import triton\nimport triton.language as tl\n\n\n")


def kernel_source(fused_moe: str) -> str:
    """The module of vLLM's fused_moe kernel functions, taken from the source of its fused_moe.py."""
    lines = fused_moe.splitlines(keepends=True)
    parts = {}
    for node in ast.parse(fused_moe).body:
        if isinstance(node, ast.FunctionDef) and node.name in KERNEL_FUNCTIONS:
            start = min([d.lineno for d in node.decorator_list] or [node.lineno]) - 1
            parts[node.name] = "".join(lines[start:node.end_lineno])
    if missing := [name for name in KERNEL_FUNCTIONS if name not in parts]:
        raise SystemExit(f"{WHEEL}'s {FUSED_MOE} defines no {', '.join(missing)}")
    return HEADER + "\n\n".join(parts[name] for name in KERNEL_FUNCTIONS) + "\n"


def _place(wheel: Path, dest: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        for name in archive.namelist():
            if name.startswith(VENDORED + "triton_kernels/") and not name.endswith("/"):
                target = dest / name.removeprefix(VENDORED)
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(archive.read(name))
        (dest / KERNEL_MODULE).parent.mkdir(parents=True, exist_ok=True)
        (dest / KERNEL_MODULE).write_text(kernel_source(archive.read(FUSED_MOE).decode()))


def fetch(dest: Path) -> list[Path]:
    """Place the peers in ``dest`` (a download only when one is missing); their paths."""
    peers = [dest / "triton_kernels" / "matmul_ogs.py", dest / KERNEL_MODULE]
    if not all(peer.is_file() for peer in peers):
        with tempfile.TemporaryDirectory() as tmp:
            subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
                            WHEEL, "--dest", tmp], check=True)
            wheel, = Path(tmp).glob("vllm-*.whl")
            _place(wheel, dest)
    if not peers[0].is_file():
        raise SystemExit(f"{WHEEL} holds no {VENDORED}triton_kernels/matmul_ogs.py")
    wheels = dest / DEEP_GEMM_DIR
    wheels.mkdir(parents=True, exist_ok=True)
    if len(list(wheels.glob("*.whl"))) < len(DEEP_GEMM_WHEELS):  # binary wheels of the GPU machine's Python and CPU
        platforms = [f"--platform={p}" for p in ("manylinux_2_28_x86_64", "manylinux_2_24_x86_64",
                                                 "manylinux2014_x86_64")]
        subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
                        "--python-version=3.12", "--implementation=cp", *platforms, *DEEP_GEMM_WHEELS,
                        "--dest", str(wheels)], check=True)
    return peers + sorted(wheels.glob("*.whl"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dest", type=Path, help="the folder to place the peers in (git-ignored)")
    dest = parser.parse_args().dest
    for peer in fetch(dest):
        print(f"placed {peer}")
    print(f"run the bench with PYTHONPATH=.:{dest}:{dest / 'vllm'}")


if __name__ == "__main__":
    main()
