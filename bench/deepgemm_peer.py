"""DeepGEMM's grouped fp8 GEMMs (DeepSeek-V3's 128 x 128 block scales) as a bench peer, from the wheels that
bench/fetch_peers.py places in DIR/deep_gemm_wheels (sgl-deep-gemm 0.1.0 and apache-tvm-ffi 0.1.9); `load` unpacks
them beside it. Its kernels are compiled by nvcc at first use (CUDA_HOME, default /usr/local/cuda). Timed as
DeepSeek's MoE runs them: the GEMM alone, on x quantized per row and 128 columns and laid out beforehand (the
dispatch that does that in a model is not timed).

- contiguous (prefill): each expert's gate rows contiguous, padded to whole 128-row blocks (m_indices: the expert
  of each row, -1 for padding), x's scales MN-major and TMA-aligned;
- masked (decode): rows (E, max_m, K) per expert, the valid count of each (masked_m), a rows hint (expected_m).
Both read ogsgen's prepared weights as they are: w.mT is DeepGEMM's B (E, N, K), weight_scale.mT its (E, N / 128,
K / 128) scales. Each output is checked against a float32 reference in DeepGEMM's own row order."""
from __future__ import annotations

import ctypes
import os
import sys
import zipfile
from pathlib import Path

import torch

from fetch_peers import DEEP_GEMM_DIR, DEEP_GEMM_WHEELS


def load(wheels: Path):
    """The deep_gemm module, from the wheels in ``wheels`` (unpacked once into wheels/site)."""
    site = wheels / "site"
    if not (site / "deep_gemm").is_dir():
        found = sorted(wheels.glob("*.whl"))
        if len(found) < len(DEEP_GEMM_WHEELS):
            raise ImportError(f"no {' and '.join(DEEP_GEMM_WHEELS)} wheels in {wheels}: python bench/fetch_peers.py "
                              f"places them")
        for wheel in found:
            zipfile.ZipFile(wheel).extractall(site)
    sys.path.insert(0, str(site))
    os.environ.setdefault("CUDA_HOME", "/usr/local/cuda")
    os.environ.setdefault("DG_JIT_CACHE_DIR", str(wheels / "jit_cache"))
    _load_globally("libnvrtc.so.13")  # its extension needs it, and torch does not load it
    import deep_gemm
    return deep_gemm


def _load_globally(soname):
    """dlopen ``soname`` for the libraries loaded after it: by name, else from pip's nvidia packages or CUDA_HOME."""
    folders = [*Path(torch.__file__).parents[1].glob("nvidia/*/lib"), Path(os.environ["CUDA_HOME"]) / "lib64"]
    for path in [soname, *(str(p) for folder in folders for p in sorted(folder.glob(soname + "*")))]:
        try:
            return ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
        except OSError:
            continue
    raise ImportError(f"{soname} not found by name, in pip's nvidia packages or in CUDA_HOME/lib64")


def _gates(topk_ids, gather):
    """Per gate (t * top_k + j, sorted by expert, token order kept): its expert and the x row it reads."""
    experts = topk_ids.reshape(-1).long()
    order = torch.argsort(experts, stable=True)
    return order, experts[order], order // topk_ids.shape[1] if gather else order


def contiguous(dg, x8, x_scale, w, w_scale, topk_ids, gather, products):
    """(run, reference) of m_grouped_fp8_gemm_nt_contiguous on the gates' rows; both give (rows, N).
    ``products(src, experts)``: x_ref[src[i]] @ w[experts[i]] in float32, the reference's rows."""
    align = int(dg.get_mk_alignment_for_contiguous_layout())
    gates, experts, src = _gates(topk_ids, gather)
    counts = torch.bincount(experts, minlength=w.shape[0])
    padded = (counts + align - 1) // align * align
    rank = torch.arange(len(gates), device=x8.device) - (torch.cumsum(counts, 0) - counts)[experts]
    dst, rows = (torch.cumsum(padded, 0) - padded)[experts] + rank, int(padded.sum())
    a = torch.zeros(rows, x8.shape[1], dtype=x8.dtype, device=x8.device)
    a[dst] = x8[src]
    a_scale = torch.ones(rows, x_scale.shape[1], device=x8.device)
    a_scale[dst] = x_scale[src]
    a_scale = dg.get_mn_major_tma_aligned_tensor(a_scale)
    m_indices = torch.full((rows,), -1, dtype=torch.int32, device=x8.device)
    m_indices[dst] = experts.to(torch.int32)
    out = torch.zeros(rows, w.shape[2], dtype=torch.bfloat16, device=x8.device)

    def run():
        dg.m_grouped_fp8_gemm_nt_contiguous((a, a_scale), (w.mT, w_scale.mT), out, m_indices)
        return out

    def reference():
        y = torch.zeros(rows, w.shape[2], device=x8.device)
        y[dst] = products(src, experts)
        return y
    return run, reference


def masked(dg, x8, x_scale, w, w_scale, topk_ids, gather, products):
    """(run, reference) of fp8_m_grouped_gemm_nt_masked on the gates' rows; both give (E, max_m, N)."""
    gates, experts, src = _gates(topk_ids, gather)
    counts = torch.bincount(experts, minlength=w.shape[0])
    slot = torch.arange(len(gates), device=x8.device) - (torch.cumsum(counts, 0) - counts)[experts]
    max_m = -(-int(counts.max()) // 64) * 64
    a = torch.zeros(w.shape[0], max_m, x8.shape[1], dtype=x8.dtype, device=x8.device)
    a[experts, slot] = x8[src]
    a_scale = torch.ones(w.shape[0], max_m, x_scale.shape[1], device=x8.device)
    a_scale[experts, slot] = x_scale[src]
    a_scale = dg.get_mn_major_tma_aligned_tensor(a_scale)
    masked_m = counts.to(torch.int32)
    expected_m = -(-len(gates) // int((counts > 0).sum()))  # rows per active expert
    out = torch.zeros(w.shape[0], max_m, w.shape[2], dtype=torch.bfloat16, device=x8.device)

    def run():
        dg.fp8_m_grouped_gemm_nt_masked((a, a_scale), (w.mT, w_scale.mT), out, masked_m, expected_m)
        return out

    def reference():
        y = torch.zeros(w.shape[0], max_m, w.shape[2], device=x8.device)
        y[experts, slot] = products(src, experts)
        return y
    return run, reference
