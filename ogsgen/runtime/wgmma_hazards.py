"""Find a known ptxas hazard in compiled Hopper kernels: a wgmma's register operand overwritten in flight.

The MX-weight kernels upcast W in registers and feed it to Hopper's ``wgmma`` as its A operand. wgmma reads
those registers asynchronously, until a ``wgmma.wait_group`` retires it. Triton pipelines the K loop with a few
wgmmas in flight, and ptxas may schedule the next K step's writes into the registers of a wgmma still in
flight (triton-lang/triton#9433): the product then uses partly next-step values. Whether a binary has the
problem depends on the PTX and on ptxas's register allocation (Triton 3.6's binaries have it, also assembled by
ptxas 13.4; Triton 3.9's do not), so it is checked per compiled binary, on its SASS.

The check follows the K loop (a backward branch) twice, keeping the A registers of each issued register-sourced
wgmma (SASS ``HGMMA``, 16-bit; ``QGMMA``, fp8: fp8 x with mxfp4 w converts W to e4m3 in registers) until a
``WARPGROUP.DEPBAR.LE gsb0, N`` retires it (all but the N most recent), and reports every instruction that
writes one of them meanwhile.

:func:`launch_checked` launches a kernel that upcasts in registers on Hopper: a binary with the hazard runs instead
on a clean fallback tile or as its waiting kernel (``WAIT_MMA``),
compiled under :func:`waiting_for_each_wgmma_compiles`: its PTX waits for every wgmma right after issuing it
(``wgmma.wait_group 0``), which leaves ptxas nothing in flight to overwrite. Only the PTX changes; Triton's
pipelined loads and register-fed wgmmas stay as they are.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import tempfile
import threading
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from triton import knobs
from triton.runtime.errors import OutOfResources

from ..errors import OgsgenError
from ..numerics.jit import WGMMA_WAITS_MARKER
from ..spec.variant import canonical_name
from . import launcher, loader, plans
from .arguments import MatmulInputs, matmul_launch
from .loader import cache_dir

_INSTRUCTION = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")
_LABEL = re.compile(r"\.L_x_(\d+):\s*\n\s*/\*([0-9a-f]+)\*/")
_BRANCH = re.compile(r"BRA\s+`\(\.L_x_(\d+)\)")
_RS_WGMMA = re.compile(r"[HQ]GMMA\.\S+\s+R\d+,\s*R(\d+),")  # register-sourced A: HGMMA D, A, gdesc[B], C
_RETIRE = re.compile(r"WARPGROUP\.DEPBAR\.LE\s+gsb0,\s*0x([0-9a-f]+)")
_PREDICATE = re.compile(r"^@!?U?P[T0-9]+\s+")
# Opcodes whose first operand is not a register they write.
_NO_DESTINATION = {"ST", "STS", "STG", "STL", "STSM", "RED", "BAR", "BRA", "DEPBAR", "WARPGROUP", "LDGDEPBAR",
                   "LDGSTS", "EXIT", "NOP", "WARPSYNC", "BSYNC", "BSSY", "CALL", "RET", "MEMBAR", "FENCE", "ERRBAR",
                   "CCTL", "SYNCS", "ARRIVES", "YIELD", "HGMMA", "QGMMA"}
A_OPERAND_REGISTERS = 4  # a thread's share of a 64 x 16 16-bit A tile (or a 64 x 32 fp8 one)


@dataclass(frozen=True)
class Hazard:
    hgmma_address: int
    write_address: int
    instruction: str

    def __str__(self):
        return (f"wgmma at {self.hgmma_address:#x}, its A register rewritten at {self.write_address:#x}: "
                f"{self.instruction}")


def _written_registers(instruction: str) -> set[int]:
    opcode, _, operands = _PREDICATE.sub("", instruction).partition(" ")
    base = opcode.split(".")[0]
    if base in _NO_DESTINATION or base.startswith("U"):  # uniform-datapath ops write UR registers
        return set()
    for operand in (o.strip() for o in operands.split(",")[:2]):
        if re.fullmatch(r"!?P[T0-9]+", operand):
            continue  # a predicate destination first (ISETP, IADD3 with carry, ...)
        if not re.fullmatch(r"R\d+", operand):
            return set()
        width = 1
        if ".128" in opcode or opcode.endswith(".4"):  # LDS.128, LDG.E.128, LDSM.16.M88.4
            width = 4
        elif ".64" in opcode or ".WIDE" in opcode or opcode.endswith(".2") or (base == "CS2R" and ".32" not in opcode):
            width = 2
        first = int(operand[1:])
        return set(range(first, first + width))
    return set()


def loops(sass: str) -> list[list[tuple[int, str]]]:
    """The (address, instruction) lists of each loop in nvdisasm's SASS listing: from a backward branch's target
    to the branch."""
    instructions = [(int(m[1], 16), m[2]) for m in _INSTRUCTION.finditer(sass)]
    index_of = {address: i for i, (address, _) in enumerate(instructions)}
    labels = {m[1]: int(m[2], 16) for m in _LABEL.finditer(sass)}
    bodies = []
    for i, (address, text) in enumerate(instructions):
        branch = _BRANCH.search(text)
        target = labels.get(branch[1]) if branch else None
        if target is not None and target <= address:
            bodies.append(instructions[index_of[target]:i + 1])
    return bodies


def find_hazards(sass: str) -> list[Hazard]:
    """Every write to the A registers of a wgmma that may still be in flight, in nvdisasm's SASS listing."""
    hazards = []
    for body in loops(sass):
        in_flight: list[tuple[int, set[int]]] = []
        for _ in range(2):  # twice: the second pass sees the wgmmas the first left in flight
            for at, instruction in body:
                written = _written_registers(instruction)
                hazards += [Hazard(hgmma, at, instruction) for hgmma, registers in in_flight if written & registers]
                if (hgmma := _RS_WGMMA.search(instruction)):
                    first = int(hgmma[1])
                    in_flight.append((at, set(range(first, first + A_OPERAND_REGISTERS))))
                if (retire := _RETIRE.search(instruction)):
                    keep = int(retire[1], 16)
                    in_flight = in_flight[len(in_flight) - keep:] if keep else []
    return sorted(set(hazards), key=lambda h: (h.hgmma_address, h.write_address))


def sass_of(cubin: bytes) -> str:
    """nvdisasm's listing of a cubin (the disassembler that ships with Triton)."""
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(cubin)
    try:
        return subprocess.run([knobs.nvidia.nvdisasm.path, "-c", f.name], check=True, capture_output=True,
                              text=True).stdout
    finally:
        os.remove(f.name)


class RegisterOperandHazard(OgsgenError, RuntimeError):
    """A compiled kernel has the ptxas hazard above; its results could be wrong."""


# The verdict cache's format and check version (part of its path too, so a changed check does not reuse old
# verdicts). Version 1 kept a bare message, and an empty or truncated file read as "clean"; version 2 saw 16-bit
# wgmmas only.
CHECK_VERSION = 3


def _verdict_path(binary_hash: str) -> Path:
    return cache_dir() / "wgmma-checks" / f"v{CHECK_VERSION}" / binary_hash


def _read_verdict(path: Path, binary_hash: str) -> str | None:
    """The kept verdict of a binary ('' when clean, else the hazard), or None when there is none or the file is not
    a whole, well-formed verdict of this check version for this binary (a crash mid-write, another tool's file):
    the binary is then checked again."""
    try:
        record = json.loads(path.read_bytes().decode("utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    if not (isinstance(record, dict) and record.get("check") == CHECK_VERSION and record.get("binary") == binary_hash
            and isinstance(record.get("hazards"), int) and isinstance(record.get("message"), str)
            and (record["hazards"] == 0) == (record["message"] == "")):
        return None
    return record["message"]


def _keep_verdict(path: Path, binary_hash: str, hazards: int, message: str) -> None:
    """Write a verdict atomically and durably (a reader sees a whole verdict or none); a cache only: a folder that
    cannot be written costs the next process the check again."""
    record = json.dumps({"check": CHECK_VERSION, "binary": binary_hash, "hazards": hazards, "message": message})
    temporary = path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(temporary, "w", encoding="utf-8") as f:
            f.write(record)
            f.flush()
            os.fsync(f.fileno())
        os.replace(temporary, path)
    except OSError:
        temporary.unlink(missing_ok=True)


def check_compiled(compiled) -> None:
    """Raise RegisterOperandHazard if a Triton CompiledKernel for sm_90 has the hazard.

    Verdicts are kept on disk by the binary's hash (Triton's, which covers the source, the options and the
    compiler versions), so a later process skips the disassembly (a few tenths of a second per binary).
    """
    path = _verdict_path(compiled.hash)
    verdict = _read_verdict(path, compiled.hash)
    if verdict is None:
        try:
            sass = sass_of(compiled.asm["cubin"])
        except (OSError, RuntimeError, subprocess.CalledProcessError) as exc:  # no usable nvdisasm: assume it
            raise RegisterOperandHazard(f"{compiled.name}: its SASS could not be read to check ({exc}); "
                                        f"assuming the hazard") from exc
        hazards = find_hazards(sass)
        verdict = (f"{compiled.name}: {len(hazards)} writes to in-flight wgmma A registers, first: {hazards[0]}"
                   if hazards else "")
        _keep_verdict(path, compiled.hash, len(hazards), verdict)
    if verdict:
        raise RegisterOperandHazard(verdict)


_MARKER_LINE = re.compile(rf"^\s*{WGMMA_WAITS_MARKER};\s*\n", re.MULTILINE)
_WAIT_GROUP = re.compile(r"wgmma\.wait_group\.sync\.aligned\s+\d+;")


def wait_for_each_wgmma(ptx: str) -> str:
    """A marked kernel's PTX (``ogsgen.numerics.jit.request_wgmma_waits``) without the marker, every
    ``wgmma.wait_group N`` made ``wgmma.wait_group 0``; any other PTX unchanged. Waiting for more groups than
    Triton asked for never changes a result, only how much overlaps."""
    ptx, marked = _MARKER_LINE.subn("", ptx)
    return _WAIT_GROUP.sub("wgmma.wait_group.sync.aligned 0;", ptx) if marked else ptx


_hook_lock = threading.Lock()
_hook_depth = 0
_outer_hook = None  # a hook someone else installed, chained


def _stages_hook(*args):
    """Triton's add_stages_inspection_hook: with no arguments (as Triton 3.9 asks) a cache key; else it wraps the
    PTX stage with :func:`wait_for_each_wgmma`, after any hook installed before it."""
    outer = _outer_hook
    if not args:
        key, digest = outer() if outer is not None else ("", "")
        return f"{key}ogsgen-wgmma-waits-1", f"{digest}ogsgen-wgmma-waits-1"
    if outer is not None:
        outer(*args)
    stages = args[1]
    make_ptx = stages.get("ptx")
    if make_ptx is not None:  # NVIDIA backends only: the marker and the waits are PTX
        stages["ptx"] = lambda src, metadata: wait_for_each_wgmma(make_ptx(src, metadata))


@contextmanager
def waiting_for_each_wgmma_compiles():
    """Compile (and launch) under this for kernels marked by ``request_wgmma_waits``: their PTX is rewritten by
    :func:`wait_for_each_wgmma`; other kernels compile as they would. Nests, and chains a hook already set."""
    global _hook_depth, _outer_hook
    with _hook_lock:
        if _hook_depth == 0:
            _outer_hook = knobs.runtime.add_stages_inspection_hook
            knobs.runtime.add_stages_inspection_hook = _stages_hook
        _hook_depth += 1
    try:
        yield
    finally:
        with _hook_lock:
            _hook_depth -= 1
            if _hook_depth == 0:
                knobs.runtime.add_stages_inspection_hook = _outer_hook
                _outer_hook = None


def compiling(flags):
    """What launches of these flags compile under: a waiting kernel's binary exists only as compiled by
    :func:`waiting_for_each_wgmma_compiles`."""
    return waiting_for_each_wgmma_compiles if flags.wait_mma else None


# (opt flags, launcher.binary_key) of MX binaries with the wgmma register hazard -> the flags their calls run
# instead. Per binary: a specialization's hazard says nothing of another's (K with a tail or not), and a fresh
# process checks each binary it compiles.
_REPLACED: dict = {}


def launch_checked(inputs: MatmulInputs) -> None:
    """Launch a matmul kernel that upcasts in registers on Hopper, its binary checked for the hazard before its
    first launch; one that has it is replaced for good (that binary: the same flags may compile clean binaries for
    other calls) by :func:`_launch_replacement`."""
    flags = inputs.flags
    kernel, grid, args, options = matmul_launch(inputs)
    binary = launcher.binary_key(kernel, args, options)
    if (replacement := _REPLACED.get((flags, binary))) is not None:
        flags, inputs = replacement, inputs.with_flags(replacement)
        kernel, grid, args, options = matmul_launch(inputs)
    try:
        plans.launch(kernel, grid, args, verify=check_compiled, compiling=compiling(flags), **options)
    except RegisterOperandHazard as hazard:
        if flags.wait_mma:
            raise RegisterOperandHazard(
                f"{hazard}: the waiting kernel has it too, so no binary of {canonical_name(inputs.variant)} with "
                f"launch parameters {flags} is safe; try other opt_flags_constraints or another Triton release"
            ) from hazard
        _launch_replacement(inputs, binary, hazard)


def _launch_replacement(inputs: MatmulInputs, binary: tuple, hazard: RegisterOperandHazard) -> None:
    """Run a launch whose binary (``binary``: its ``launcher.binary_key``) has the hazard on the first of the
    flags' fallback tiles whose binary is clean and fits, else on the same tile waiting for each wgmma (checked as
    well). The choice is remembered for (flags, binary) and logged."""
    flags, replacement = inputs.flags, None
    for tile in flags.fallback_tiles:
        candidate = flags.fallback(tile)
        kernel, grid, args, options = matmul_launch(inputs.with_flags(candidate))
        try:
            plans.launch(kernel, grid, args, verify=check_compiled, compiling=compiling(candidate), **options)
            replacement = candidate
            break
        except (RegisterOperandHazard, OutOfResources) as exc:
            loader.log.info("fallback tile %s of %s not used: %s", tile, flags, exc)
    if replacement is None:
        replacement = flags.waiting()
        launch_checked(inputs.with_flags(replacement))
    _REPLACED[(flags, binary)] = replacement
    loader.log.debug("%s; launch parameters %s now run as %s", hazard, flags, replacement)
    # Logged, not warned: ogsgen has already chosen a safe binary, and there is nothing for the caller to do.
    if len(_REPLACED) == 1:
        loader.log.info("ptxas let the next K step overwrite registers a wgmma still reads (triton-lang/triton#9433) "
                        "in %s; MX-weight kernels where this happens run a tile whose binary is clean or wait for each "
                        "wgmma instead (correct, sometimes slower; each case is logged at debug level). Triton 3.9 "
                        "compiles them without the hazard.", hazard)


def hazard_replacements() -> int:
    """How many binaries this process replaced for the wgmma hazard (``ogsgen warmup`` reports them)."""
    return len(_REPLACED)


def forget_hazard_replacements() -> None:
    """Forget which binaries this process replaced for the wgmma hazard, so that the next call of each checks
    (and compiles) its own binary again, as a fresh process would (probes report what each row replaced)."""
    _REPLACED.clear()
