"""Exceptions raised by ogsgen. Each message names the offending argument and says how to fix it."""
import os
import sys
import warnings


class OgsgenError(Exception):
    """Base class of every error ogsgen raises on purpose."""


class SpecError(OgsgenError, ValueError):
    """A function, format, variant or catalog description is invalid."""


class SpecTypeError(SpecError, TypeError):
    """An argument is not of the type the API takes (a tensor, a RoutingData, a Python float, ...)."""


class CatalogError(SpecError):
    """A catalog file cannot be loaded or does not describe kernel variants."""


class UnsupportedError(OgsgenError, NotImplementedError):
    """The requested combination is valid in the spec but has no code path (yet)."""


class VariantNotBuiltError(OgsgenError, LookupError):
    """A call needs a kernel variant that no search-path directory holds."""


class StaleKernelError(OgsgenError, RuntimeError):
    """A generated kernel file differs from what its folder's manifest records, or no longer matches today's
    templates or function sources."""


class BuildFolderError(OgsgenError):
    """A build folder (``--out``) or its manifest.json cannot be used: not a folder, not writable, damaged."""


class InapplicableConstraintError(OgsgenError, ValueError):
    """An opt-flags constraint cannot be honoured for this call."""


class PerformanceWarning(UserWarning):
    """A call runs correctly but slower than it could, and the message says what to change (silence it with
    ``warnings.filterwarnings("ignore", category=ogsgen.PerformanceWarning)``)."""


InapplicableConstraint = InapplicableConstraintError  # triton_kernels' name, which callers of the mirrored API catch


def did_you_mean(name: str, candidates) -> str:
    """``"; did you mean A or B?"`` naming the candidates closest to a misspelt ``name``, or ``""``."""
    import difflib  # only on the error path

    close = difflib.get_close_matches(name, list(candidates), n=3, cutoff=0.6)
    return f"; did you mean {' or '.join(close)}?" if close else ""


def warn_at_caller(message: str, category: type[Warning]) -> None:
    """``warnings.warn`` pointing at the user's line: the first frame outside ogsgen and torch (a differentiable
    call passes through torch's autograd and custom-op frames, so no fixed stack level finds it)."""
    internal = tuple(os.path.dirname(sys.modules[name].__file__) + os.sep for name in ("ogsgen", "torch")
                     if name in sys.modules)
    frame, level = sys._getframe(1), 2
    while frame.f_back is not None and frame.f_code.co_filename.startswith(internal):
        frame, level = frame.f_back, level + 1
    warnings.warn(message, category, stacklevel=level)
