"""The check for ptxas's in-flight wgmma register hazard, and what matmul_ogs does when a binary has it."""
import contextlib
import json
import logging
import os
import re
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path

import pytest
import torch

import ogsgen
from ogsgen.runtime import launcher, matmul, plans, wgmma_hazards
from ogsgen.numerics.jit import WGMMA_WAITS_MARKER
from ogsgen.runtime.wgmma_hazards import find_hazards
from ogsgen.spec import default_catalog
from cases import run_case

DEFAULT = default_catalog().by_name()
HERE = Path(__file__).parent
HOPPER_SWIGLU = "ogs_matmul_xbf16_wmxfp4hopper_ybf16_ragged_gather_bias_act_swiglu"


def _sass(*lines):
    """A loop in nvdisasm's format: label .L_x_0 at 0x100, one instruction per 0x10, branching back at the end."""
    body = [f"        /*{0x100 + 16 * i:04x}*/                   {line} ;" for i, line in enumerate(lines)]
    end = 0x100 + 16 * len(lines)
    return "\n".join([".L_x_0:", *body, f"        /*{end:04x}*/              @P1 BRA `(.L_x_0) ;"])


def test_a_register_written_while_its_wgmma_may_be_in_flight_is_found():
    # Two wgmmas in flight (DEPBAR keeps 1 then 2); the second pass writes R88 (the first's A) before retiring it.
    sass = _sass("LOP3.LUT R88, R2, 0x81c081c0, RZ, 0xc0, !PT", "WARPGROUP.ARRIVE",
                 "HGMMA.64x128x16.F32.BF16 R24, R88, gdesc[UR12], R24, gsb0", "IMAD.SHL.U32 R92, R3, 0x40, RZ",
                 "WARPGROUP.DEPBAR.LE gsb0, 0x1", "HGMMA.64x128x16.F32.BF16 R24, R92, gdesc[UR12], R24, gsb0",
                 "WARPGROUP.DEPBAR.LE gsb0, 0x2")
    hazards = find_hazards(sass)
    assert [(h.hgmma_address, h.write_address) for h in hazards] == [(0x120, 0x100), (0x150, 0x130)]
    assert "LOP3.LUT R88" in hazards[0].instruction


def test_an_fp8_wgmma_register_operand_is_checked_too():
    # fp8 x with mxfp4 w converts W to e4m3 in registers: sm_90 issues QGMMA (fp8), whose A registers are as
    # exposed as HGMMA's.
    sass = _sass("PRMT R40, R2, 0x7604, RZ", "WARPGROUP.ARRIVE",
                 "QGMMA.64x16x32.F32.E4M3.E4M3 R56, R40, gdesc[UR24], R56, gsb0", "F2FP.SATFINITE.E4M3.F32.PACK_AB R43, R5, R4",
                 "WARPGROUP.DEPBAR.LE gsb0, 0x0")
    hazards = find_hazards(sass)
    assert [(h.hgmma_address, h.write_address) for h in hazards] == [(0x120, 0x130)]
    assert "wgmma at 0x120" in str(hazards[0])


def test_retired_wgmmas_and_other_registers_are_not_hazards():
    sass = _sass("LDS.64 R88, [R2]", "LDS.64 R90, [R2+0x8]", "WARPGROUP.ARRIVE",
                 "HGMMA.64x128x16.F32.BF16 R24, R88, gdesc[UR12], R24, gsb0", "WARPGROUP.DEPBAR.LE gsb0, 0x1",
                 "IADD3 R92, P0, R4, 0x10, RZ", "ISETP.GE.AND P0, PT, R5, R6, PT", "STS [R88], R7",
                 "WARPGROUP.DEPBAR.LE gsb0, 0x0")
    assert find_hazards(sass) == []
    # The same loop with a 128-bit load into R88..R91 before the retiring wait: a hazard (width counted).
    assert len(find_hazards(sass.replace("IADD3 R92, P0, R4, 0x10, RZ", "LDS.128 R88, [R2+0x10]"))) == 1


def _compile_offline(name: str, tile, wait_mma: bool, waiting_compile: bool = True, arch: int = 90,
                     even_k: bool = True, scales_n_contiguous: bool = False):
    """An offline compile of a generated MX kernel (hopper-layout or MX-activation) for sm_<arch> with Triton's own
    ptxas (no GPU needed); ``even_k``: K a multiple of BLOCK_K;
    ``scales_n_contiguous``: scales stored as prepare_expert_weights stores them (else K-contiguous)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from ogsgen.numerics.jit import compiling_for
    from ogsgen.runtime import loader
    variant = DEFAULT[name]
    kernel = loader.kernel_for(variant)
    w_pointer = {"hopper": "*i32", "strided": "*u8"}[variant.w.layout] if variant.w.scaling != "none" else "*bf16"
    pointers = dict(Y="*bf16", X="*fp8e4nv" if variant.x.scaling == "block_e8m0" else "*bf16", W=w_pointer,
                    XMxScale="*u8", WMxScale="*u8", Bias="*fp32", SliceSizes="*i32", SliceOffs="*i32",
                    BlockSchedule="*i64", GatherIndx="*i32")
    signature = {arg: pointers.get(arg, "i32") for arg in kernel.arg_names}
    signature.update({arg: "fp32" for arg in ("out_alpha", "act_alpha", "act_limit") if arg in signature})
    unit_strides = ["stride_x_k", "stride_y_n", "stride_w_n" if variant.w.scaling == "none" else "stride_w_k",
                    "stride_xmx_k", "stride_wmx_n" if scales_n_contiguous else "stride_wmx_k"]
    constants = dict(GROUP_M=8, EVEN_K=even_k, OFFSETS_64=False,
                     **{stride: 1 for stride in unit_strides if stride in kernel.arg_names},
                     WAIT_MMA=wait_mma,
                     **dict(zip(("BLOCK_M", "BLOCK_N", "BLOCK_K"), tile[:3])))
    if DEFAULT[name].activation is not None:
        constants["ACTIVATION_FN"] = DEFAULT[name].activation.fn
    signature.update({arg: "constexpr" for arg in constants})
    names = list(signature)
    aligned = {(names.index(a),): [["tt.divisibility", 16]] for a, kind in signature.items()
               if kind.startswith("*") or (a.startswith("stride") or a in ("N", "K")) and a not in constants}
    source = triton.compiler.ASTSource(fn=kernel, signature=signature, constexprs=constants, attrs=aligned)
    target = GPUTarget("cuda", arch, 32)
    with wgmma_hazards.waiting_for_each_wgmma_compiles() if waiting_compile else contextlib.nullcontext(), \
            compiling_for(target):
        return triton.compile(source, target=target, options=dict(num_warps=tile[3], num_stages=tile[4]))


def _ptxas_version():
    from triton import knobs
    out = subprocess.run([knobs.nvidia.ptxas.path, "--version"], capture_output=True, text=True).stdout
    return tuple(int(v) for v in re.search(r"release (\d+)\.(\d+)", out).groups())


def hazards_in_sm90_compiles() -> str:
    """JSON of gpt-oss w1 mxfp4 at its large-batch tile: {wait_mma: [register-sourced HGMMAs, hazards, the
    K loop's wgmma waits (the N of each WARPGROUP.DEPBAR.LE gsb0, N)]}, the ptxas version, and the error of
    the waiting kernel compiled without ogsgen's waiting compile. Runs in a process without TRITON_INTERPRET
    (the interpreter replaces @triton.jit)."""
    tile = (128, 256, 64, 16, 3)
    result = {"ptxas": _ptxas_version()}
    for wait_mma in (False, True):
        sass = wgmma_hazards.sass_of(_compile_offline(HOPPER_SWIGLU, tile, wait_mma).asm["cubin"])
        result[str(wait_mma)] = [len(re.findall(r"HGMMA\.\S+\s+R\d+,\s*R\d+,", sass)), len(find_hazards(sass)),
                                 sorted(set(re.findall(r"WARPGROUP\.DEPBAR\.LE\s+gsb0,\s*(0x[0-9a-f]+)", sass)))]
    from triton import knobs
    with tempfile.TemporaryDirectory() as empty, knobs.cache.scope():
        knobs.cache.dir = empty  # Triton < 3.7 would return the waiting compile's binary from its cache
        try:
            _compile_offline(HOPPER_SWIGLU, tile, True, waiting_compile=False)
            result["unhooked"] = "compiled"
        except Exception as exc:  # Triton wraps ptxas's failure in its own exception types
            result["unhooked"] = str(exc)
    return json.dumps(result)


def mx_activation_hazards() -> str:
    """JSON {wait_mma: in-flight hazards} of the dense kernel of mxfp8 x and bf16 w (x upcast in registers,
    the wgmma's A operand) at its large-batch tile, K with a tail, and the ptxas version."""
    result = {"ptxas": _ptxas_version()}
    for wait_mma in (False, True):
        compiled = _compile_offline("ogs_matmul_xmxfp8e4m3_wbf16_ybf16", (128, 128, 128, 8, 4), wait_mma,
                                    even_k=False)
        result[str(wait_mma)] = len(find_hazards(wgmma_hazards.sass_of(compiled.asm["cubin"])))
    return json.dumps(result)


def wgmmas_and_waits() -> str:
    """JSON {tile: [HGMMAs, WARPGROUP.DEPBAR waits]} in the SASS of the plain ragged hopper-layout kernel (what
    top-k > 1 scatters run) at the heuristic's decode and large-batch tiles, K with a tail as gpt-oss's (sm_90
    compiles with Triton's ptxas)."""
    result = {}
    for tile in ((16, 256, 128, 8, 3), (128, 256, 128, 8, 4)):
        compiled = _compile_offline("ogs_matmul_xbf16_wmxfp4hopper_ybf16_ragged", tile, False, even_k=False,
                                    scales_n_contiguous=True)
        sass = wgmma_hazards.sass_of(compiled.asm["cubin"])
        result["x".join(map(str, tile))] = [len(re.findall(r"\bHGMMA\.", sass)),
                                            len(re.findall(r"WARPGROUP\.DEPBAR", sass))]
    return json.dumps(result)


def compile_errors_before_hopper() -> str:
    """JSON {arch: "compiled" or the error} of the hopper-layout kernel at its decode tile for Ampere and Ada,
    whose PTX has no packed 16-bit min and max (the sm_90 scale path would not assemble there)."""
    result = {}
    for arch in (80, 89):
        try:
            _compile_offline(HOPPER_SWIGLU, (16, 128, 128, 4, 3), False, arch=arch)
            result[arch] = "compiled"
        except Exception as exc:  # Triton wraps ptxas's failure in its own exception types
            result[arch] = str(exc)[-2000:]
    return json.dumps(result)


def _run_offline(function: str) -> dict:
    """Run ``function`` of this module in a process without TRITON_INTERPRET (the interpreter replaces
    @triton.jit) and with an empty Triton cache (a binary cached by a compile that saw another target would
    be returned for the same key); its JSON result."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    # The tests folder and the repository root: a relative PYTHONPATH entry would resolve against cwd=HERE.
    path = os.pathsep.join([str(HERE), str(HERE.parent), env.get("PYTHONPATH", "")])
    with tempfile.TemporaryDirectory() as cache:
        done = subprocess.run([sys.executable, "-c", f"import test_wgmma_hazards as t; print(t.{function}())"],
                              cwd=HERE, env=dict(env, PYTHONPATH=path, TRITON_CACHE_DIR=cache), capture_output=True,
                              text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_the_hopper_layout_kernel_compiles_for_ampere_and_ada():
    assert _run_offline("compile_errors_before_hopper") == {"80": "compiled", "89": "compiled"}


@pytest.mark.slow
def test_wait_mma_removes_the_hazard_from_a_real_sm90_binary():
    # gpt-oss w1 mxfp4 at its large-batch tile: ptxas 12.8 (Triton 3.6) overwrites A registers in flight (found
    # by the check, and wrong on the H200: bench/probes/mx_tile_check.py); with wait_mma the binary is clean.
    result = _run_offline("hazards_in_sm90_compiles")
    rs_hgmmas, hazards, waits = result["True"]
    assert rs_hgmmas >= 4 and hazards == 0  # register-sourced wgmmas, none overwritten in flight
    assert waits == ["0x0"]  # each wgmma waited for: nothing in flight
    assert result["True"][0] == result["False"][0]  # W stays in registers, as in the asynchronous kernel
    if tuple(result["ptxas"]) == (12, 8):
        assert result["False"][1] > 0
    # Compiled without ogsgen's waiting compile, ptxas refuses the waiting kernel by the marker's name.
    assert WGMMA_WAITS_MARKER in result["unhooked"]


@pytest.mark.slow
def test_wait_mma_removes_the_hazard_from_an_mx_activation_sm90_binary():
    # mxfp8 x with bf16 w: the upcast x is the wgmma's register operand. Triton 3.6's ptxas (12.8) overwrites it in
    # flight at the prefill tile (49 places, offline); the waiting kernel is clean, and every Triton's check runs.
    result = _run_offline("mx_activation_hazards")
    assert result["True"] == 0
    if tuple(result["ptxas"]) == (12, 8):
        assert result["False"] > 0


@pytest.mark.slow
def test_ptxas_keeps_the_k_loops_wgmmas_in_flight():
    # ptxas serializes every wgmma of a kernel (each waited for at once: "C7515 Potential Performance Loss") when
    # the accumulator may be set outside a wgmma between them and their last wait. A K loop that might run zero
    # times did that (its zeros joined the loop's exit path); the template's loop runs at least once. Serialized,
    # each HGMMA is followed by its own wait (bench/results/2026-12-01n-probes: 6-7% slower at T=8192).
    for tile, (hgmmas, waits) in _run_offline("wgmmas_and_waits").items():
        assert hgmmas >= 16 and waits < hgmmas, f"{tile}: ptxas waits for each wgmma ({hgmmas} HGMMA, {waits} waits)"


_MARKED_PTX = """\t// begin inline asm
\t{marker};
mov.b32 %r5, 0;
\t// end inline asm
\twgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 {{%r1}}, {{%r2}}, %rd1, %p1, 1, 1, 0;
\twgmma.commit_group.sync.aligned;
\twgmma.wait_group.sync.aligned 3;
\twgmma.wait_group.sync.aligned 0;
"""


def test_the_waiting_compile_rewrites_only_marked_ptx():
    marked = _MARKED_PTX.format(marker=WGMMA_WAITS_MARKER)
    rewritten = wgmma_hazards.wait_for_each_wgmma(marked)
    assert WGMMA_WAITS_MARKER not in rewritten and "mov.b32 %r5, 0;" in rewritten
    assert re.findall(r"wait_group\.sync\.aligned (\d+);", rewritten) == ["0", "0"]
    unmarked = _MARKED_PTX.format(marker="// another kernel")
    assert wgmma_hazards.wait_for_each_wgmma(unmarked) == unmarked


def test_the_waiting_compile_hook_nests_chains_and_restores(monkeypatch):
    from triton import knobs
    calls = []

    def outer(*args):
        calls.append(len(args))
        return ("outer-key", "outer-hash") if not args else None
    monkeypatch.setattr(knobs.runtime, "add_stages_inspection_hook", outer)
    with wgmma_hazards.waiting_for_each_wgmma_compiles():
        with wgmma_hazards.waiting_for_each_wgmma_compiles():
            hook = knobs.runtime.add_stages_inspection_hook
            assert hook is not outer
        assert knobs.runtime.add_stages_inspection_hook is hook  # the outer scope still holds
        key, digest = hook()  # Triton >= 3.7 asks for a cache key: both hooks are in it
        assert key.startswith("outer-key") and "ogsgen" in key and digest.startswith("outer-hash")
        stages = {"ptx": lambda src, metadata: _MARKED_PTX.format(marker=WGMMA_WAITS_MARKER)}
        hook(None, stages, None, None, 90)
        assert calls == [0, 5]  # the outer hook ran in both conventions
        assert "wait_group.sync.aligned 3" not in stages["ptx"]("", {})
    assert knobs.runtime.add_stages_inspection_hook is outer


def test_the_waiting_compile_hook_is_restored_after_overlapping_threads(monkeypatch):
    import threading
    from triton import knobs
    monkeypatch.setattr(knobs.runtime, "add_stages_inspection_hook", None)
    first_inside, second_done = threading.Event(), threading.Event()
    seen_after_second = []

    def first():
        with wgmma_hazards.waiting_for_each_wgmma_compiles():
            first_inside.set()
            second_done.wait(10)  # the second thread enters and leaves meanwhile

    def second():
        first_inside.wait(10)
        with wgmma_hazards.waiting_for_each_wgmma_compiles():
            pass
        seen_after_second.append(knobs.runtime.add_stages_inspection_hook)
        second_done.set()
    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(20)
    assert seen_after_second and seen_after_second[0] is not None  # the first thread's scope still held
    assert knobs.runtime.add_stages_inspection_hook is None


@pytest.mark.parametrize("name", ["ogs_matmul_xbf16_wmxfp4hopper_ybf16_bias", "ogs_matmul_xbf16_wmxfp4_ybf16",
                                  "ogs_matmul_xbf16_wmxfp8e4m3_yfp32", "ogs_matmul_xmxfp8e4m3_wbf16_ybf16"])
def test_wait_mma_computes_the_same(name, device):
    variant = DEFAULT[name]
    with ogsgen.opt_flags_constraints(wait_mma=True, block_m=16, block_n=32, block_k=64):
        run_case(variant, 37, 72, 128, device)


def test_wait_mma_is_refused_without_mx_weights(device):
    x = torch.randn(8, 16, device=device, dtype=torch.float16)
    with ogsgen.opt_flags_constraints(wait_mma=True):
        with pytest.raises(ogsgen.InapplicableConstraintError, match="wait_mma=True applies to mx weights"):
            ogsgen.matmul_ogs(x, x.T.contiguous(), None)
    with pytest.raises(ogsgen.InapplicableConstraintError, match="wait_mma must be True or False"):
        with ogsgen.opt_flags_constraints(wait_mma=1):
            pass


def _simulate_hopper(monkeypatch, hazardous, record_stages=False):
    """matmul_ogs as on Hopper, with launches recorded (WAIT_MMA, BLOCK_N, num_warps[, num_stages], checked) and
    none run; a checked launch raises what ``hazardous(args, options)`` returns (an exception, or None for a
    clean binary)."""
    launches = []

    def fake_launch(kernel, grid, args, verify=None, compiling=None, **options):
        # Waiting kernels compile only under waiting_for_each_wgmma_compiles (ptxas refuses them otherwise).
        assert (compiling is wgmma_hazards.waiting_for_each_wgmma_compiles) == args["WAIT_MMA"]
        stages = (options["num_stages"],) if record_stages else ()
        launches.append((args["WAIT_MMA"], args["BLOCK_N"], options["num_warps"], *stages, verify is not None))
        problem = hazardous(args, options) if verify is not None else None
        if problem is not None:
            raise problem

    monkeypatch.setattr(launcher, "launch", fake_launch)
    monkeypatch.setattr(matmul, "_has_wgmma", lambda x: True)
    monkeypatch.setattr(wgmma_hazards, "_REPLACED", {})
    return launches


def _mx_call(device, hopper: bool, k: int = 256):
    """A dense mxfp4 call of 8 rows (so 16-row tiles): strided or hopper-layout values."""
    from ogsgen.numerics import quantize_mx
    from ogsgen.numerics.layouts import swizzle_mx_values
    values, scales = quantize_mx(torch.randn(k, 128, device=device).mT.contiguous(), "e2m1", axis=-1)
    w = swizzle_mx_values(values.mT, capability=(9, 0)) if hopper else values.mT
    x = torch.randn(8, k, device=device).bfloat16()
    pc = ogsgen.PrecisionConfig(weight_scale=scales.mT)
    return lambda: ogsgen.matmul_ogs(x, w, None, precision_config=pc)


def _hazard():
    return wgmma_hazards.RegisterOperandHazard("kernel: 1 writes to in-flight wgmma A registers")


def test_a_binary_with_the_hazard_is_replaced_by_the_waiting_one(monkeypatch, device, caplog):
    # Strided mxfp4 has no fallback tile: the first call warns and runs the same tile waiting for each wgmma
    # (checked too); later calls with the same parameters go straight to it.
    launches = _simulate_hopper(monkeypatch, lambda args, options: None if args["WAIT_MMA"] else _hazard())
    call = _mx_call(device, hopper=False)
    with warnings.catch_warnings(), caplog.at_level(logging.DEBUG, logger="ogsgen"):
        warnings.simplefilter("error")  # logged, not warned: ogsgen chose a safe binary, the caller has nothing to do
        call()
        plans.clear()  # the checked path again, which finds the replacement
        call()
        call()  # the plan that call recorded, replayed: the checked binary, launched without checking it again
    said = [record.getMessage() for record in caplog.records if record.levelno == logging.INFO]
    assert len(said) == 1 and re.search("ptxas let the next K step .* wait for each wgmma", said[0]), said
    assert wgmma_hazards.hazard_replacements() == 1
    tile = launches[0][1:3]
    assert launches == [(False, *tile, True), (True, *tile, True), (True, *tile, True), (True, *tile, False)]


def test_an_mx_activation_binary_with_the_hazard_runs_its_waiting_kernel(monkeypatch, device):
    # mxfp8 x with bf16 w: x, upcast in registers, is the wgmma's register operand; its binaries are checked too
    # (Triton 3.6's prefill binaries have the hazard: test_wait_mma_removes_the_hazard_from_an_mx_activation_...).
    from ogsgen.numerics import quantize_mx
    launches = _simulate_hopper(monkeypatch, lambda args, options: None if args["WAIT_MMA"] else _hazard())
    x_values, x_scales = quantize_mx(torch.randn(8, 256, device=device), "e4m3")
    w = torch.randn(256, 128, device=device).bfloat16()
    ogsgen.matmul_ogs(x_values, w, None, precision_config=ogsgen.PrecisionConfig(act_scale=x_scales))
    assert wgmma_hazards.hazard_replacements() == 1
    tile = launches[0][1:3]
    assert launches == [(False, *tile, True), (True, *tile, True)]


def test_a_replacement_holds_for_its_own_binary_only(monkeypatch, device):
    # The hazard belongs to one binary. A call of the same launch parameters that compiles another binary (K
    # with a tail: EVEN_K false) checks its own and runs it, clean here, whatever ran before it in the process
    # (as in a fresh process that warm-up prepared, which compiled that call's plain binary only).
    launches = _simulate_hopper(monkeypatch, lambda args, options: _hazard()
                                if args["EVEN_K"] and not args["WAIT_MMA"] else None)
    _mx_call(device, hopper=False, k=256)()
    _mx_call(device, hopper=False, k=288)()
    assert [(wait_mma, checked) for wait_mma, *_, checked in launches] == [(False, True), (True, True),
                                                                          (False, True)]
    assert len(wgmma_hazards._REPLACED) == 1


def test_a_hazardous_hopper_tile_runs_its_clean_fallback_tile(monkeypatch, device):
    # A fallback tile (8 warps): its binary is checked, clean here, and used from then on, without waiting.
    launches = _simulate_hopper(monkeypatch, lambda args, options: _hazard() if options["num_warps"] == 4 else None)
    call = _mx_call(device, hopper=True)
    with ogsgen.opt_flags_constraints(fallback_tiles=((128, 128, 8, 3, False),)):
        call()
        plans.clear()
        call()
    assert launches == [(False, 128, 4, True), (False, 128, 8, True), (False, 128, 8, True)]
    (original, replacement), = wgmma_hazards._REPLACED.items()
    assert (replacement.num_warps, replacement.wait_mma, replacement.fallback_tiles) == (8, False, ())
    assert original[0].fallback_tiles == ((128, 128, 8, 3, False),)


@pytest.mark.parametrize("clean_stages,runs", [(4, (False, 128, 4, 4)), (2, (True, 128, 8, 2))])
def test_fallback_tiles_are_tried_in_order_until_one_is_clean(monkeypatch, device, clean_stages, runs):
    # Fallbacks: 8 warps (hazardous here), then 4 stages, then 8 warps and 2 stages waiting for each wgmma; the
    # first clean one runs, not the tile's own waiting kernel, and later calls go straight to it.
    def hazardous(args, options):
        return None if options["num_stages"] == clean_stages else _hazard()
    launches = _simulate_hopper(monkeypatch, hazardous, record_stages=True)
    call = _mx_call(device, hopper=True)
    fallbacks = ((128, 128, 8, 3, False), (128, 128, 4, 4, False), (128, 128, 8, 2, True))
    with ogsgen.opt_flags_constraints(block_m=16, block_n=128, block_k=128, num_warps=4, num_stages=3,
                                      fallback_tiles=fallbacks):
        call()
        plans.clear()
        call()
    tried = [(False, 128, 4, 3, True), (False, 128, 8, 3, True), (False, 128, 4, 4, True), (True, 128, 8, 2, True)]
    assert launches == tried[:tried.index((*runs, True)) + 1] + [(*runs, True)]


@pytest.mark.parametrize("problem", ["hazard", "too much shared memory"])
def test_a_fallback_tile_that_cannot_run_leaves_the_waiting_kernel(monkeypatch, device, problem):
    from triton.runtime.errors import OutOfResources

    def hazardous(args, options):
        if args["WAIT_MMA"]:
            return None
        if options["num_warps"] == 8:
            return _hazard() if problem == "hazard" else OutOfResources(245760, 232448, "shared memory")
        return _hazard()
    launches = _simulate_hopper(monkeypatch, hazardous)
    with ogsgen.opt_flags_constraints(fallback_tiles=((128, 128, 8, 3, False),)):
        _mx_call(device, hopper=True)()
    assert launches == [(False, 128, 4, True), (False, 128, 8, True), (True, 128, 4, True)]


def test_a_waiting_kernel_with_the_hazard_is_an_error(monkeypatch, device):
    _simulate_hopper(monkeypatch, lambda args, options: _hazard())
    with pytest.raises(wgmma_hazards.RegisterOperandHazard, match="the waiting kernel has it too.*opt_flags"):
        _mx_call(device, hopper=False)()


def test_hopper_mx_flags_wait_rather_than_fall_back_unless_fallback_tiles_are_asked_for():
    from dataclasses import asdict
    from ogsgen.runtime.opt_flags import TileProblem, make_opt_flags

    def flags(rows, constraints=()):  # gpt-oss w1 shape, hopper-layout mxfp4, 128 experts, H200
        return make_opt_flags(TileProblem(2, 1, rows * 128, 5760, 2880, 1, 128, rows, True, 132, "hopper",
                                          constraints=constraints))
    # Measured with the word layout: each heuristic tile's own waiting kernel beats the clean tiles tried.
    assert flags(8).fallback_tiles == flags(64).fallback_tiles == flags(256).fallback_tiles == ()
    assert (flags(256).block_m, flags(256).block_n) == (64, 256)  # 64-row tiles from 64 rows per expert up
    asked = ((256, 128, 8, 4, False), (256, 128, 8, 4, True))
    assert flags(128, (("fallback_tiles", asked),)).fallback_tiles == asked
    with pytest.raises(ogsgen.InapplicableConstraintError, match=r"fallback tile \(128, 32, 8, 3, False\): block_k=32: "
                                                            r"hopper-layout mxfp4 weights come in groups of 64"):
        flags(8, (("fallback_tiles", ((128, 32, 8, 3, False),)),))
    with pytest.raises(ogsgen.InapplicableConstraintError, match="fallback tile would change it; drop fallback_tiles"):
        make_opt_flags(TileProblem(2, 1, 128 * 128, 5760, 2880, 1, 128, 128, True, 132, "hopper",
                                   bitwise_invariant=True, constraints=(("fallback_tiles", asked),)))
    # Warm-up reproduces a call's flags as constraints: all of them, so asked-for fallback tiles stay.
    with_fallback = flags(128, (("fallback_tiles", asked),))
    assert flags(128, tuple(sorted(asdict(with_fallback).items()))) == with_fallback


def test_a_hazardous_tile_asked_for_runs_its_waiting_kernel(monkeypatch, device):
    # No fallback tiles asked for: the tile asked for runs, or its waiting kernel.
    launches = _simulate_hopper(monkeypatch, lambda args, options: None if args["WAIT_MMA"] else _hazard())
    with ogsgen.opt_flags_constraints(num_warps=4):
        _mx_call(device, hopper=True)()
    assert launches == [(False, 128, 4, True), (True, 128, 4, True)]


def test_verdicts_are_kept_on_disk_by_binary_hash(monkeypatch, tmp_path):
    # The first check disassembles; a later one (another process, same cache) reads the verdict instead.
    monkeypatch.setenv("OGSGEN_CACHE_DIR", str(tmp_path))
    listings = {b"clean": _sass("HGMMA.64x128x16.F32.BF16 R24, R88, gdesc[UR12], R24, gsb0",
                                "WARPGROUP.DEPBAR.LE gsb0, 0x0"),
                b"hazard": _sass("IMAD.SHL.U32 R88, R2, 0x4, RZ",
                                 "HGMMA.64x128x16.F32.BF16 R24, R88, gdesc[UR12], R24, gsb0",
                                 "WARPGROUP.DEPBAR.LE gsb0, 0x1")}
    disassembled = []
    monkeypatch.setattr(wgmma_hazards, "sass_of", lambda cubin: disassembled.append(cubin) or listings[cubin])

    class Compiled:
        def __init__(self, cubin):
            self.name, self.hash, self.asm = f"kernel_{cubin.decode()}", f"hash-{cubin.decode()}", {"cubin": cubin}

    for _ in range(2):
        wgmma_hazards.check_compiled(Compiled(b"clean"))
        with pytest.raises(wgmma_hazards.RegisterOperandHazard, match="kernel_hazard: 1 writes to in-flight"):
            wgmma_hazards.check_compiled(Compiled(b"hazard"))
    assert disassembled == [b"clean", b"hazard"]


@pytest.mark.parametrize("kept", [b"", b"\xff\xfe garbage", b"some text", b'{"check": 2, "binary": "hash-hazard"',
                                  b'{"check": 1, "binary": "hash-hazard", "hazards": 0, "message": ""}',
                                  b'{"check": 2, "binary": "hash-other", "hazards": 0, "message": ""}',
                                  b'{"check": 2, "binary": "hash-hazard", "hazards": 0, "message": "x"}'])
def test_a_damaged_or_foreign_verdict_means_check_again(kept, monkeypatch, tmp_path):
    # An empty verdict file (a crash mid-write) used to read as "clean", and the hazardous binary ran (max error
    # 1.9e35 on the H200); bytes that are not UTF-8 crashed; other text read as a hazard message.
    monkeypatch.setenv("OGSGEN_CACHE_DIR", str(tmp_path))
    sass = _sass("IMAD.SHL.U32 R88, R2, 0x4, RZ", "HGMMA.64x128x16.F32.BF16 R24, R88, gdesc[UR12], R24, gsb0",
                 "WARPGROUP.DEPBAR.LE gsb0, 0x1")
    disassembled = []
    monkeypatch.setattr(wgmma_hazards, "sass_of", lambda cubin: disassembled.append(cubin) or sass)

    class Compiled:
        name, hash, asm = "kernel_hazard", "hash-hazard", {"cubin": b"hazard"}
    path = wgmma_hazards._verdict_path(Compiled.hash)
    path.parent.mkdir(parents=True)
    path.write_bytes(kept)
    for _ in range(2):  # checked, then its rewritten verdict is read
        with pytest.raises(wgmma_hazards.RegisterOperandHazard, match="kernel_hazard: 1 writes to in-flight"):
            wgmma_hazards.check_compiled(Compiled())
    assert disassembled == [b"hazard"]
    assert not [p for p in path.parent.iterdir() if p.name.endswith(".tmp")]


def test_a_binary_that_cannot_be_disassembled_is_treated_as_hazardous(monkeypatch, tmp_path):
    monkeypatch.setenv("OGSGEN_CACHE_DIR", str(tmp_path))

    def no_disassembler(cubin):
        raise FileNotFoundError("nvdisasm")
    monkeypatch.setattr(wgmma_hazards, "sass_of", no_disassembler)

    class Compiled:
        name, hash, asm = "kernel", "hash", {"cubin": b""}
    with pytest.raises(wgmma_hazards.RegisterOperandHazard, match="could not be read to check .* assuming"):
        wgmma_hazards.check_compiled(Compiled())
    assert not list(tmp_path.rglob("hash"))  # no verdict kept: a later process with nvdisasm checks it


@pytest.mark.slow
def test_warmup_reports_the_binaries_replaced_for_the_hazard(monkeypatch, device, capsys):
    # `ogsgen warmup` says, in its summary, how many binaries had the hazard (one warm-up call here), as a serving
    # process's log says it once.
    from ogsgen.cli import main
    from ogsgen.runtime import warmup
    _simulate_hopper(monkeypatch, lambda args, options: None if args["WAIT_MMA"] else _hazard())
    calls = [c for c in warmup.warmup_calls([DEFAULT["ogs_matmul_xbf16_wmxfp4_ybf16"]], 132)
             if isinstance(c, warmup.WarmupCall) and c.flags.split_k == 1]
    assert [warmup.warm(call, torch.device(device))[1:] for call in calls[:1] * 2] == [("", 1), ("", 0)]
    monkeypatch.setattr(warmup, "warmup", lambda spec, names, jobs, progress: warmup.WarmupReport(
        done=4, seconds=2.0, hazard_replaced=wgmma_hazards.hazard_replacements()))
    assert main(["warmup", "--only", "ogs_matmul_xbf16_wmxfp4_ybf16"]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == (
        "ogsgen warmup: 1 binary had ptxas's wgmma register hazard; their calls run a clean tile or wait for each "
        "wgmma instead (correct; docs/troubleshooting.md)")
