"""ogsgen for training and torch.compile: the differentiable, traceable ``matmul_ogs`` (the public one) and the
custom ops behind it. ``matmul_ogs`` loads on first use: ogsgen imports ``custom_ops`` (which imports torch only) as
soon as torch is imported, and the runtime behind ``matmul_ogs`` imports Triton."""

__all__ = ["matmul_ogs"]


def __getattr__(name: str):
    if name != "matmul_ogs":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from .api import matmul_ogs
    globals()[name] = matmul_ogs
    return matmul_ogs
