"""For users' own tests of kernels and functions: a numeric comparison, and the corrections of Triton's CPU
interpreter (``ogsgen.numerics.interpreter`` lists them) that make the CPU compute what the GPU does.

ogsgen corrects the interpreter before its first interpreted launch; the pytest plugin this package registers
(``ogsgen.pytest_plugin``) corrects it when a pytest session starts with TRITON_INTERPRET=1, so a test of a
user's own Triton kernel in bf16 is right too. Outside pytest, call :func:`install_interpreter_fixes` first.
"""
import torch

from ..numerics.interpreter import install as install_interpreter_fixes
from ..numerics.interpreter import installed as interpreter_fixes_installed

__all__ = ["assert_close", "install_interpreter_fixes", "interpreter_fixes_installed"]


def assert_close(ref: torch.Tensor, actual: torch.Tensor, maxtol: float = 2e-2, rmstol: float = 4e-3,
                 what: str = "result") -> None:
    """Compare ``actual`` with ``ref`` in float64, relative to the reference's magnitude.

    Where the reference is finite: max |actual - ref| / max |ref| <= maxtol and rms(actual - ref) / rms(ref) <=
    rmstol, and a NaN or inf in ``actual`` fails (a poisoned, unwritten output cannot pass). Where the reference
    is NaN or inf, ``actual`` must be the same (NaN, or the inf of the same sign).
    """
    if ref.shape != actual.shape:
        raise AssertionError(f"{what}: shape {tuple(actual.shape)} != reference shape {tuple(ref.shape)}")
    ref, actual = ref.double(), actual.double()
    finite = torch.isfinite(ref)
    bad = (finite & ~torch.isfinite(actual)) | (ref.isnan() & ~actual.isnan()) | (ref.isinf() & (actual != ref))
    if bad.any():
        first = tuple(int(i) for i in bad.nonzero()[0])
        raise AssertionError(f"{what}: {int(bad.sum())} values differ in kind from the reference (NaN, inf or "
                             f"finite; first at {first}: {actual[first].item()}, reference {ref[first].item()})")
    ref, actual = ref[finite], actual[finite]
    if ref.numel() == 0:
        return
    diff = actual - ref
    scale = ref.abs().max().clamp_min(torch.finfo(torch.float32).tiny)
    max_err = (diff.abs().max() / scale).item()
    rms_err = (diff.pow(2).mean().sqrt() / ref.pow(2).mean().sqrt().clamp_min(1e-300)).item()
    if max_err > maxtol or rms_err > rmstol:
        raise AssertionError(f"{what}: max error {max_err:.3g} (limit {maxtol:g}), rms error {rms_err:.3g} "
                             f"(limit {rmstol:g})")
