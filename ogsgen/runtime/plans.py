"""Launch plans: what a validated call did, replayed for the next call with the same signature.

A call's host work (validation, formats, opt flags, argument dicts, the launcher's key) depends only on
the call's *signature*: the shapes, strides, dtypes, devices and 16-byte alignment of its tensors and the
values of everything else. The first call of a signature runs the full path while a :class:`Recording`
notes each buffer it allocates, each tensor it zeroes and each kernel it launches. From that
:func:`build` makes a :class:`Plan`: per launch, the kernel's argument values with every tensor replaced
by a slot (an index into the call's tensors, then its new buffers) and the compiled binary. A later call
with the same signature fills the slots with its own tensors and launches the binaries directly.

A call is planned only when every tensor it launches with (or describes by a TMA descriptor) is one of its own
arguments (by identity), a buffer it allocated (:func:`new_buffer`; a scatter's sorted rows or split-K partials,
written by a launch of the plan), or a view of either at the same address and dtype, and every other argument value is a
plain constant; otherwise (a tensor torch made for the call: x reinterpreted as another dtype, metadata built
for the call) each call takes the full path. A replayed descriptor is the recorded one with the call's tensor as
its base: its shape and strides are the signature's.
"""
from __future__ import annotations

import contextlib
import threading

import torch
from triton.runtime.interpreter import InterpretedFunction
from triton.runtime.jit import JITFunction
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor as GluonTensorDescriptor
from triton.tools.tensor_descriptor import TensorDescriptor

from . import launcher

# Argument values a plan keeps as they were (Triton functions: the activation and epilogue closures).
_CONSTANT_TYPES = (int, float, bool, str, type(None), torch.dtype, JITFunction, InterpretedFunction)
_DESCRIPTOR_TYPES = (TensorDescriptor, GluonTensorDescriptor)  # (a Gluon kernel's carry a shared-memory layout)
_MAX_PLANS = 4096  # each distinct shape is a signature; a caller of endless shapes only refills the cache
_state = threading.local()
_plans: dict[tuple, Plan] = {}


def lookup(signature: tuple, tensors: list) -> Plan | None:
    """The plan of a call with this signature and these tensors, if one was built and its guard admits them."""
    plan = _plans.get(signature)
    if plan is not None:
        for i, j in plan.aliases:
            if tensors[i] is not tensors[j]:
                return None
        if plan.guard is not None and not plan.guard(tensors):
            return None
    return plan


def store(signature: tuple, plan: Plan) -> None:
    if len(_plans) >= _MAX_PLANS:
        _plans.clear()
    _plans[signature] = plan


def clear() -> None:
    """Forget every plan (the kernels they launch were replaced)."""
    _plans.clear()


class Recording:
    """The buffers, zeroings and launches of one call, in order (see :func:`recording`)."""

    def __init__(self):
        self.events: list[tuple] = []
        self.plannable = True


@contextlib.contextmanager
def recording():
    """``with recording() as rec:``: the calls of :func:`new_buffer`, :func:`zero` and :func:`launch` on this
    thread are noted in ``rec``."""
    outer = getattr(_state, "recording", None)
    rec = _state.recording = Recording()
    try:
        yield rec
    finally:
        _state.recording = outer


def _note(event: tuple) -> None:
    rec = getattr(_state, "recording", None)
    if rec is not None:
        rec.events.append(event)


def not_plannable() -> None:
    """Mark the call being recorded as one whose steps a plan cannot replay."""
    rec = getattr(_state, "recording", None)
    if rec is not None:
        rec.plannable = False


def new_buffer(shape: tuple, dtype: torch.dtype, device) -> torch.Tensor:
    buffer = torch.empty(shape, dtype=dtype, device=device)
    _note(("buffer", buffer, shape, dtype, device))
    return buffer


def zero(tensor: torch.Tensor) -> None:
    tensor.zero_()
    _note(("zero", tensor))


def launch(kernel, grid, args: dict, verify=None, compiling=None, **options) -> None:
    """``launcher.launch``, noted once it succeeded."""
    launch_again = launcher.launch(kernel, grid, args, verify=verify, compiling=compiling, **options)
    _note(("launch", kernel, grid, args, options, compiling, launch_again))


class _Launch:
    __slots__ = ("kernel", "grid", "options", "compiling", "template", "slots", "descriptors", "direct")

    def __init__(self, kernel, grid, options, compiling, template, slots, descriptors, direct):
        self.kernel, self.grid, self.options, self.compiling = kernel, grid, options, compiling
        self.template, self.slots, self.descriptors, self.direct = template, slots, descriptors, direct

    def values(self, tensors: list) -> list:
        """The kernel's argument values, in parameter order, for a call's tensors (and buffers)."""
        values = list(self.template)
        for position, index in self.slots:
            values[position] = tensors[index]
        for position, index, recorded in self.descriptors:
            # copy.copy's generic protocol costs about 1.3 us more per descriptor than this shallow copy
            values[position] = descriptor = object.__new__(recorded.__class__)
            descriptor.__dict__.update(recorded.__dict__)
            descriptor.base = tensors[index]
        return values

    def __call__(self, tensors: list) -> None:
        values = self.values(tensors)
        if self.direct is not None and not launcher.hooks_installed():
            self.direct(self.grid, values)
        else:
            launcher.launch(self.kernel, self.grid, dict(zip(self.kernel.arg_names, values)),
                            compiling=self.compiling, **self.options)


class _Buffer:
    __slots__ = ("shape", "dtype", "device")

    def __init__(self, shape, dtype, device):
        self.shape, self.dtype, self.device = shape, dtype, device

    def __call__(self, tensors: list) -> None:
        tensors.append(torch.empty(self.shape, dtype=self.dtype, device=self.device))


class _Zero:
    __slots__ = ("index",)

    def __init__(self, index):
        self.index = index

    def __call__(self, tensors: list) -> None:
        tensors[self.index].zero_()


class Plan:
    """The steps of a recorded call; ``run(tensors)`` replays them on another call's tensors (in the order the
    recorded call's were given, a list the buffers are appended to) and returns the output. ``aliases``: pairs
    of positions that held one object in the recorded call and must again, as the steps read it from the
    first. ``guard``: None, or a predicate of the tensors that the caller's checks need to hold beyond the
    signature (outputs that overlap no input), whose failure sends the call down the checked path."""
    __slots__ = ("steps", "result", "aliases", "guard")

    def __init__(self, steps: tuple, result: int, aliases: tuple, guard=None):
        self.steps, self.result, self.aliases, self.guard = steps, result, aliases, guard

    def run(self, tensors: list):
        for step in self.steps:
            step(tensors)
        return tensors[self.result]


def build(rec: Recording, tensors: list, result, guard=None) -> Plan | None:
    """The plan of a recorded call whose arguments were ``tensors`` and whose output was ``result`` (with the
    guard ``guard``, see :class:`Plan`); None when its steps cannot be replayed from those alone."""
    if not rec.plannable:
        return None
    slot_of: dict[int, int] = {}
    also_at: dict[int, list[int]] = {}
    aliases: set[tuple[int, int]] = set()

    def add(tensor, index):
        if id(tensor) in slot_of:  # one object passed as several arguments (a histogram that is the slice sizes)
            also_at.setdefault(id(tensor), []).append(index)
        else:
            slot_of[id(tensor)] = index

    def slot(tensor) -> int | None:
        index = slot_of.get(id(tensor))
        if index is not None:
            aliases.update((index, other) for other in also_at.get(id(tensor), ()))
        base = tensor._base
        if index is None and base is not None and base.dtype == tensor.dtype and base.data_ptr() == tensor.data_ptr():
            index = slot(base)  # a view at its base's address (a reshaped buffer): kernels take only the address
        return index

    for index, value in enumerate(tensors):
        if isinstance(value, torch.Tensor):
            add(value, index)
    n_tensors, steps = len(tensors), []
    for event in rec.events:
        if event[0] == "buffer":
            _, buffer, shape, dtype, device = event
            add(buffer, n_tensors)
            n_tensors += 1
            steps.append(_Buffer(shape, dtype, device))
        elif event[0] == "zero":
            index = slot(event[1])
            if index is None:
                return None
            steps.append(_Zero(index))
        else:
            _, kernel, grid, args, options, compiling, launch_again = event
            template, slots, descriptors = [], [], []
            for position, name in enumerate(kernel.arg_names):
                value = args[name]
                if isinstance(value, torch.Tensor):
                    index = slot(value)
                    if index is None:
                        return None
                    slots.append((position, index))
                    value = None
                elif isinstance(value, _DESCRIPTOR_TYPES):
                    index = slot(value.base)
                    if index is None:
                        return None
                    # kept without its base: the plan outlives the call, whose tensors must not
                    recorded = object.__new__(value.__class__)
                    recorded.__dict__.update(value.__dict__, base=None)
                    descriptors.append((position, index, recorded))
                    value = None
                elif not isinstance(value, _CONSTANT_TYPES):
                    return None
                template.append(value)
            steps.append(_Launch(kernel, grid, options, compiling, tuple(template), tuple(slots), tuple(descriptors),
                                 launch_again))
    index = slot(result)
    return None if index is None else Plan(tuple(steps), index, tuple(sorted(aliases)), guard)
