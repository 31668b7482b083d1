"""``triton_kernels.matmul_ogs_details.opt_flags``: constraints on the launch heuristic, process-wide or (as the
newest triton_kernels' ``scoped_opt_flags_constraints``) for a block of calls."""
import warnings

from ....errors import InapplicableConstraint, UnsupportedError
from ....runtime.opt_flags import opt_flags_constraints, set_process_constraints

__all__ = ["InapplicableConstraint", "reset_opt_flags_constraints", "scoped_opt_flags_constraints", "set_opt_flags",
           "update_opt_flags_constraints"]

# triton_kernels' keys -> ogsgen's
_RENAMED = {"is_persistent": "persistent"}
# triton_kernels' tuning keys that ogsgen's kernels have no counterpart for (they change speed, not results)
_NO_COUNTERPART = ("epilogue_subtile", "idle_sms", "xcd_swizzle", "fused_scatter", "max_allowable_mn",
                   "w_cache_modifier", "arch", "target_kernel_kwargs")
_constraints: dict = {}
_warned: set = set()


def _renamed(constraints: dict) -> dict:
    """triton_kernels' constraint names as ogsgen's; keys with no ogsgen counterpart are left out, with a warning
    once per key."""
    renamed = {}
    for key, value in constraints.items():
        if key in _NO_COUNTERPART:
            if key not in _warned:
                _warned.add(key)
                warnings.warn(f"ogsgen: opt flags constraint {key!r} has no counterpart in ogsgen's kernels and is "
                              f"ignored (it tunes speed, not results)", RuntimeWarning, stacklevel=3)
            continue
        renamed[_RENAMED.get(key, key)] = value
    return renamed


def update_opt_flags_constraints(constraints: dict) -> None:
    """Add ``constraints`` to the process-wide ones (triton_kernels' names: ``is_persistent``, ``block_m``,
    ``split_k``, ...). Keys with no ogsgen counterpart are ignored, with a warning once per key."""
    renamed = _renamed(constraints)
    set_process_constraints({**_constraints, **renamed})  # checks them first
    _constraints.update(renamed)


def scoped_opt_flags_constraints(constraints: dict):
    """``with scoped_opt_flags_constraints({...}):`` ``constraints`` (triton_kernels' names) for the calls in the
    block, over the process-wide ones: ``ogsgen.opt_flags_constraints``."""
    return opt_flags_constraints(**_renamed(constraints))


def reset_opt_flags_constraints() -> None:
    """Remove every process-wide constraint."""
    _constraints.clear()
    set_process_constraints({})


def set_opt_flags(opt_flags) -> None:
    raise UnsupportedError("set_opt_flags: ogsgen takes constraints only (update_opt_flags_constraints, or "
                           "ogsgen.opt_flags_constraints(...) around the calls)")

