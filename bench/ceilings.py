"""The ceilings a benchmark's rates are held to, found in the run that quotes the rates.

A rate above its ceiling is a counting error (a FLOP or byte count, a unit), not a result: the benches put the
error in the row instead of the rate and exit with status 1 after writing their files.

- TF/s: the faster of two dense cuBLAS matmuls (8192^3 and 16384x8192x8192) timed at the start of the run (their
  best time), bf16 (torch.matmul) and, for fp8 products, e4m3 (torch._scaled_mm), plus SPREAD for the spread of
  timings (ogsgen's dense kernel and cuBLAS's are within 2% of each other on the H200; a grouped or MoE product
  does not beat a large dense one; cuBLAS's own dense rows are held to the TB/s ceiling only).
- TB/s: the memory's peak, from the GPU's memory clock and bus width (two transfers per clock): 4.8 TB/s on an
  H200. Byte counts count each byte once, so no effective rate can pass it.
"""
import sys
from dataclasses import dataclass

SPREAD = 1.03


class ImpossibleRate(ValueError):
    """A rate above what the GPU can do, measured in the same run."""


@dataclass(frozen=True)
class Ceilings:
    dense_tflops: float   # dense cuBLAS bf16, measured
    hbm_tbps: float       # the memory's peak, from the device's attributes
    dense_fp8_tflops: float | None = None   # dense cuBLAS e4m3, measured (None: no fp8 on this GPU)

    def check(self, what: str, tflops: float | None = None, tbps: float | None = None, fp8: bool = False) -> None:
        """Raise ImpossibleRate if ``tflops`` or ``tbps`` (of ``what``; ``fp8``: an fp8 product) is above its
        ceiling."""
        ceiling, kind = (self.dense_fp8_tflops, "fp8") if fp8 else (self.dense_tflops, "bf16")
        if tflops is not None and ceiling is not None and tflops > ceiling * SPREAD:
            raise ImpossibleRate(f"{what}: {tflops:.1f} TF/s is above the dense {kind} cuBLAS rate of this run "
                                 f"({ceiling:.1f} TF/s, +{SPREAD - 1:.0%}): its FLOP count is wrong")
        if tbps is not None and tbps > self.hbm_tbps:
            raise ImpossibleRate(f"{what}: {tbps:.2f} TB/s is above the memory's peak ({self.hbm_tbps:.2f} TB/s): "
                                 f"its byte count is wrong")

    def as_dict(self) -> dict:
        return {"dense_bf16_tflops": round(self.dense_tflops, 1), "hbm_peak_tbps": round(self.hbm_tbps, 2),
                "dense_fp8_tflops": None if self.dense_fp8_tflops is None else round(self.dense_fp8_tflops, 1)}


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
    shapes = ((8192, 8192, 8192), (16384, 8192, 8192))

    def best(product, dtype):
        rate = 0.0
        for m, n, k in shapes:
            a = torch.randn(m, k, device="cuda").to(dtype)
            b = torch.randn(n, k, device="cuda").to(dtype).mT   # column-major, as _scaled_mm takes fp8 b
            ms = do_bench(lambda: product(a, b), warmup=25, rep=200, return_mode="min")
            rate = max(rate, 2 * m * n * k / (ms * 1e-3) / 1e12)
        return rate
    one = torch.ones((), device="cuda")
    fp8 = torch.cuda.get_device_capability() >= (8, 9)
    return Ceilings(dense_tflops=best(torch.matmul, torch.bfloat16), hbm_tbps=hbm_peak_tbps(torch.cuda.current_device()),
                    dense_fp8_tflops=best(lambda a, b: torch._scaled_mm(a, b, one, one, out_dtype=torch.bfloat16),
                                          torch.float8_e4m3fn) if fp8 else None)
