"""``triton_kernels.matmul_ogs_details.opt_flags``: process-wide constraints on the launch heuristic."""
import warnings

from ....errors import InapplicableConstraint, UnsupportedError
from ....runtime.opt_flags import set_process_constraints

__all__ = ["InapplicableConstraint", "reset_opt_flags_constraints", "set_opt_flags", "update_opt_flags_constraints"]

# triton_kernels' keys -> ogsgen's
_RENAMED = {"is_persistent": "persistent"}
# triton_kernels' tuning keys that ogsgen's kernels have no counterpart for (they change speed, not results)
_NO_COUNTERPART = ("epilogue_subtile", "idle_sms", "xcd_swizzle", "fused_scatter", "max_allowable_mn",
                   "w_cache_modifier", "arch", "target_kernel_kwargs")
_constraints: dict = {}
_warned: set = set()


def update_opt_flags_constraints(constraints: dict) -> None:
    """Add ``constraints`` to the process-wide ones (triton_kernels' names: ``is_persistent``, ``block_m``,
    ``split_k``, ...). Keys with no ogsgen counterpart are ignored, with a warning once per key."""
    renamed = {}
    for key, value in constraints.items():
        if key in _NO_COUNTERPART:
            if key not in _warned:
                _warned.add(key)
                warnings.warn(f"ogsgen: opt flags constraint {key!r} has no counterpart in ogsgen's kernels and is "
                              f"ignored (it tunes speed, not results)", RuntimeWarning, stacklevel=2)
            continue
        renamed[_RENAMED.get(key, key)] = value
    set_process_constraints({**_constraints, **renamed})  # checks them first
    _constraints.update(renamed)


def reset_opt_flags_constraints() -> None:
    """Remove every process-wide constraint."""
    _constraints.clear()
    set_process_constraints({})


def set_opt_flags(opt_flags) -> None:
    raise UnsupportedError("set_opt_flags: ogsgen takes constraints only (update_opt_flags_constraints, or "
                           "ogsgen.opt_flags_constraints(...) around the calls)")

