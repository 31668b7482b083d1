"""The ceilings a benchmark's rates are held to, found in the run that quotes the rates.

A rate above its ceiling is a counting error (a FLOP or byte count, a unit), not a result: the benches put the
error in the row instead of the rate and exit with status 1 after writing their files.

- TF/s: the faster of two dense cuBLAS matmuls (torch.matmul, bf16, 8192^3 and 16384x8192x8192) timed at the
  start of the run (their best time), plus SPREAD for the spread of timings (ogsgen's dense kernel and cuBLAS's
  are within 2% of each other on the H200; a grouped or MoE product does not beat a large dense one).
- TB/s: the memory's peak, from the GPU's memory clock and bus width (two transfers per clock): 4.8 TB/s on an
  H200. Byte counts count each byte once, so no effective rate can pass it.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass

SPREAD = 1.03


class ImpossibleRate(ValueError):
    """A rate above what the GPU can do, measured in the same run."""


@dataclass(frozen=True)
class Ceilings:
    dense_tflops: float   # dense cuBLAS bf16, measured
    hbm_tbps: float       # the memory's peak, from the device's attributes

    def check(self, what: str, tflops: float | None = None, tbps: float | None = None) -> None:
        """Raise ImpossibleRate if ``tflops`` or ``tbps`` (of ``what``) is above its ceiling."""
        if tflops is not None and tflops > self.dense_tflops * SPREAD:
            raise ImpossibleRate(f"{what}: {tflops:.1f} TF/s is above the dense cuBLAS rate of this run "
                                 f"({self.dense_tflops:.1f} TF/s, +{SPREAD - 1:.0%}): its FLOP count is wrong")
        if tbps is not None and tbps > self.hbm_tbps:
            raise ImpossibleRate(f"{what}: {tbps:.2f} TB/s is above the memory's peak ({self.hbm_tbps:.2f} TB/s): "
                                 f"its byte count is wrong")

    def as_dict(self) -> dict:
        return {"dense_bf16_tflops": round(self.dense_tflops, 1), "hbm_peak_tbps": round(self.hbm_tbps, 2)}


def exit_if_impossible(rows) -> None:
    """After a bench has written its files: exit with status 1 naming the rows whose rate was impossible."""
    impossible = [f"{row['case']} {row['impl']}" for row in rows if row["error"].startswith("ImpossibleRate")]
    if impossible:
        sys.exit(f"rates above the GPU's ceilings (a counting error; see each row's error): {', '.join(impossible)}")


def hbm_peak_tbps(device_index: int = 0) -> float:
    import triton
    props = triton.runtime.driver.active.utils.get_device_properties(device_index)
    if not props["mem_clock_rate"] or not props["mem_bus_width"]:
        raise RuntimeError("the GPU reports no memory clock or bus width: the bench cannot check its TB/s")
    return 2 * props["mem_clock_rate"] * 1e3 * props["mem_bus_width"] / 8 / 1e12   # clock in kHz, width in bits


def measure() -> Ceilings:
    import torch
    from triton.testing import do_bench
    best = 0.0
    for m, n, k in ((8192, 8192, 8192), (16384, 8192, 8192)):
        a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
        ms = do_bench(lambda: torch.matmul(a, b), warmup=25, rep=200, return_mode="min")
        best = max(best, 2 * m * n * k / (ms * 1e-3) / 1e12)
    return Ceilings(dense_tflops=best, hbm_tbps=hbm_peak_tbps(torch.cuda.current_device()))
