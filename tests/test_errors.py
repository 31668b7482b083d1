"""Every bad input raises an exception that names the argument and the fix."""
import pytest
import torch
import triton
import triton.language as tl

import ogsgen
from ogsgen import Epilogue, FusedActivation, GatherIndx, PrecisionConfig, SpecError, SpecTypeError, matmul_ogs


def _xw(device, m=8, k=16, n=32, dtype=torch.float16):
    return torch.randn(m, k, device=device, dtype=dtype), torch.randn(k, n, device=device, dtype=dtype)


@pytest.mark.parametrize("mutate,exc,message", [
    (lambda x, w: (x.int(), w, {}), SpecError, "x has dtype torch.int32"),
    (lambda x, w: (x, w.float(), {}), SpecError, r"w.dtype \(torch.float32\) must equal x.dtype"),
    (lambda x, w: (x[:, :15], w, {}), SpecError, "x has K=15 columns but w has 16 rows"),
    (lambda x, w: (x, w, {"bias": torch.randn(31, device=x.device)}), SpecError, r"bias must have shape \(32,\)"),
    (lambda x, w: (x, w, {"bias": torch.randn(32, device=x.device).half()}), SpecError, "bias must be torch.float32"),
    (lambda x, w: (x, w, {"bias": torch.randn(64, device=x.device)[::2]}), SpecError, "bias must be contiguous"),
    (lambda x, w: (x, w, {"gammas": torch.rand(7, device=x.device)}), SpecError, "gammas must be a contiguous"),
    (lambda x, w: (x, w, {"betas": torch.rand(8, device=x.device)}), SpecError, "betas scale the bias"),
    (lambda x, w: (x, w, {"y": torch.empty(8, 31, device=x.device, dtype=x.dtype)}), SpecError,
     r"y must have shape \(8, 32\) or \(1, 8, 32\)"),
    (lambda x, w: (x, w, {"y": torch.empty(8, 32, device=x.device)}), SpecError,
     "set precision_config.out_dtype=torch.float32"),
    (lambda x, w: (x, w, {"precision_config": PrecisionConfig(out_dtype=torch.int8)}), SpecError,
     "precision_config.out_dtype has dtype torch.int8"),
    (lambda x, w: (x, w.expand(3, 16, 32), {}), SpecError, "holds 3 experts but there is no routing_data"),
    (lambda x, w: (x.expand(2, 8, 16), w, {}), SpecError, r"batched x of shape \(2, 8, 16\) needs w of shape"),
    # one output for two batch entries: each would write (or read) past it
    (lambda x, w: (x.expand(2, 8, 16), w.expand(2, 16, 32), {"y": torch.empty(1, 8, 32, device=x.device,
                                                                              dtype=x.dtype)}),
     SpecError, r"y must have shape \(2, 8, 32\), got \(1, 8, 32\)"),
    (lambda x, w: (x.expand(2, 8, 16), w.expand(2, 16, 32), {"y_acc_in": torch.empty(1, 8, 32, device=x.device,
                                                                                     dtype=x.dtype)}),
     SpecError, r"y_acc_in must have shape \(2, 8, 32\), got \(1, 8, 32\)"),
    (lambda x, w: (x[0], w, {}), SpecError, "x must have 2 or 3 dimensions"),
    (lambda x, w: (x, w, {"out_alpha": torch.tensor(1.0)}), TypeError, "out_alpha must be a Python float"),
    (lambda x, w: (x, w[:, :31], {"fused_activation": FusedActivation(ogsgen.swiglu, (1.0, 1.0))}), SpecError,
     "N must be a multiple of 2"),
    (lambda x, w: (x, w, {"gather_indx": GatherIndx(torch.zeros(8, dtype=torch.int32),
                                                     torch.zeros(8, dtype=torch.int32))}),
     SpecError, "gather_indx and scatter_indx index expert-sorted rows: pass routing_data"),
    (lambda x, w: (x, w, {"inner_routing_data": object()}), SpecTypeError, "must be an ogsgen.InnerRoutingData"),
    (lambda x, w: (x, w, {"fused_comm": object()}), SpecTypeError, "must be an ogsgen.FusedComm"),
    (lambda x, w: (x, w, {"precision_config": PrecisionConfig(weight_scale=torch.zeros(1))}), SpecError,
     "precision_config.weight_scale makes w an mx tensor: w must be uint8"),
    (lambda x, w: (x, w, {"precision_config": PrecisionConfig(act_scale=torch.zeros(1, dtype=torch.uint8))}),
     SpecError, "act_scale of uint8 \\(e8m0 scales\\) makes x mxfp8: x must be torch.float8_e4m3fn"),
    (lambda x, w: (x, w, {"precision_config": PrecisionConfig(act_scale=torch.zeros(1))}), SpecError,
     "act_scale of float32 is the scale of an e4m3 x for fp8e4m3_b128, fp8e4m3_channel or mxfp4 weights"),
    (lambda x, w: (x, w, {"bias": torch.randn(32, device="meta")}), SpecError, "bias is on meta but x is on"),
])
def test_bad_call(mutate, exc, message, device):
    x, w = _xw(device)
    x, w, kwargs = mutate(x, w)
    with pytest.raises(exc, match=message):
        matmul_ogs(x, w, kwargs.pop("bias", None), **kwargs)


def test_cpu_tensors_without_interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    x, w = _xw("cpu")
    with pytest.raises(SpecError, match="x is on cpu; ogsgen.s kernels run on a CUDA device"):
        matmul_ogs(x, w, None)


def test_activation_argument_count():
    with pytest.raises(SpecError, match=r"swiglu takes 2 argument\(s\) \('alpha', 'limit'\), got 1"):
        FusedActivation(ogsgen.swiglu, (1.0,))


def test_epilogue_without_function_but_values():
    with pytest.raises(SpecError, match="has values"):
        Epilogue(fn_arg_values_matmul=(1.0,))


def test_function_argument_errors_summarize_tensors():
    # A message names a tensor value by its shape and dtype: thousands of printed elements hide the cause.
    with pytest.raises(SpecError) as info:
        Epilogue(fn_arg_values_matmul=(torch.randn(1000),))
    assert "tensor(shape=(1000,), dtype=torch.float32)" in str(info.value) and len(str(info.value)) < 300
    with pytest.raises(SpecError) as info:
        FusedActivation(ogsgen.swiglu, (torch.randn(1000),))
    assert "got 1 value(s) (tensor(shape=(1000,)" in str(info.value) and len(str(info.value)) < 300


def test_function_signature_error_reads_well():
    with pytest.raises(SpecError, match="an epilogue function must be declared as def swiglu"):
        Epilogue(ogsgen.swiglu, (1.0, 1.0))


@pytest.mark.skipif(torch.cuda.is_available(), reason="outside the interpreter, @triton.jit itself refuses it")
def test_function_without_a_source_file():
    # Under the interpreter a function made by exec is a valid @triton.jit function whose source cannot be read:
    # registering it used to fail with a raw OSError.
    namespace = {"triton": triton}
    exec("@triton.jit\ndef made_by_exec(tile):\n    return tile\n", namespace)
    with pytest.raises(SpecError, match="the source of 'made_by_exec' cannot be read .* define it in a .py file"):
        ogsgen.register_activation(namespace["made_by_exec"])


def test_signature_mismatch():
    @triton.jit
    def scale_by(tile, factor):
        return tile * factor

    with pytest.raises(SpecError, match=r"parameters \(tile, factor\) do not match fn_arg_names \('alpha',\)"):
        ogsgen.register_activation(scale_by, arg_names=("alpha",))
    with pytest.raises(SpecError, match=r"def scale_by\(tile, offs_m, offs_n, mask, factor\)"):
        ogsgen.register_epilogue(scale_by, arg_names=("factor",))


def test_one_name_two_sources():
    @triton.jit
    def clamp_a(tile, bound):
        return tl.minimum(tile, bound)

    @triton.jit
    def clamp_b(tile, bound):
        return tl.maximum(tile, -bound)

    ogsgen.register_activation(clamp_a, name="test_clamp", arg_names=("bound",))
    assert ogsgen.register_activation(clamp_a, name="test_clamp", arg_names=("bound",)).name == "test_clamp"
    with pytest.raises(SpecError, match="'test_clamp' is already taken.*ogsgen.unregister"):
        ogsgen.register_activation(clamp_b, name="test_clamp", arg_names=("bound",))
    ogsgen.unregister("test_clamp")
    assert ogsgen.register_activation(clamp_b, name="test_clamp", arg_names=("bound",)).fn is clamp_b
    ogsgen.unregister("test_clamp")


@pytest.mark.parametrize("name,arg_names", [("bad-name", ()), ("x); import os  #", ()), ("ok", ("a b",)),
                                             ("class", ()), ("ok", ("N); os.system('x')",))])
def test_names_must_be_identifiers(name, arg_names):
    @triton.jit
    def fn(tile, a):
        return tile

    with pytest.raises(SpecError, match="valid Python identifier"):
        ogsgen.register_activation(fn, name=name, arg_names=arg_names)


def test_not_a_jit_function():
    with pytest.raises(SpecError, match="must be a @triton.jit function"):
        ogsgen.register_activation(lambda tile: tile, name="plain_python")


def test_reduction_n_power_of_two():
    @triton.jit
    def fold3(tile):
        return tile

    with pytest.raises(SpecError, match="reduction_n must be a power of two"):
        ogsgen.register_activation(fold3, reduction_n=3)


@pytest.mark.parametrize("constraints,message", [({"block_q": 16}, "unknown key 'block_q'"),
                                                 ({"block_m": 48}, "must be a power of two"),
                                                 ({"block_k": 8}, "at least 16"),
                                                 ({"num_warps": 0}, "positive int"),
                                                 ({"persistent": 2}, "persistent must be True or False"),
                                                 ({"fallback_tiles": ((128, 128, 8, 3),)}, "must be a tuple of"),
                                                 ({"fallback_tiles": [(128, 128, 8, 3, False)]}, "must be a tuple of"),
                                                 ({"fallback_tiles": ((128, 96, 8, 3, False),)},
                                                  r"fallback_tiles \(128, 96, 8, 3, False\): block_k must be a power"),
                                                 ({"fallback_tiles": ((128, 128, 8, 3, 1),)},
                                                  r"\(128, 128, 8, 3, 1\): wait_mma must be True or False"),
                                                 ({"num_stages": True}, "num_stages must be a positive int"),
                                                 ({"maxnreg": 300}, "maxnreg must be a register count from 24 to "
                                                                    "255"),
                                                 ({"maxnreg": 16}, "maxnreg must be a register count")])
def test_bad_constraints(constraints, message):
    with pytest.raises(ogsgen.InapplicableConstraintError, match=message):
        with ogsgen.opt_flags_constraints(**constraints):
            pass


def test_ragged_block_m_constraint_is_inapplicable(device):
    from ogsgen.moe import routing
    rd, gi, _ = routing(torch.randn(8, 4, device=device), 2)
    x, _ = _xw(device)
    w = torch.randn(4, 16, 32, device=device, dtype=torch.float16)
    with ogsgen.opt_flags_constraints(block_m=256):
        with pytest.raises(ogsgen.InapplicableConstraintError, match="block_m=256: ragged rows need block_m in"):
            matmul_ogs(x, w, None, rd, gather_indx=gi)


def test_persistent_constraint_names_what_blocks_it(device):
    from ogsgen.moe import routing
    rd, gi, _ = routing(torch.randn(8, 4, device=device), 2)
    x = torch.randn(8, 16, device=device, dtype=torch.float16)
    w = torch.randn(4, 16, 32, device=device, dtype=torch.float16)
    with ogsgen.opt_flags_constraints(persistent=True):
        with pytest.raises(ogsgen.InapplicableConstraintError, match="persistent=True: this call.s kernel variant has no "
                                                                "persistent kernel: that needs plain bf16 or fp16"):
            matmul_ogs(x.float(), w.float(), None, rd, gather_indx=gi)
        with pytest.raises(ogsgen.InapplicableConstraintError, match=r"TMA needs x 16-byte aligned, contiguous along its "
                                                                r"last dimension .* pass x.contiguous\(\)"):
            matmul_ogs(torch.randn(16, 8, device=device, dtype=torch.float16).T, w[0], None)
        with pytest.raises(ogsgen.InapplicableConstraintError, match=r"TMA needs rows of a multiple of 16 bytes: the "
                                                                r"output's rows \(12 columns of 2 bytes\) are not"):
            matmul_ogs(x, w[0, :, :12].contiguous(), None)
        with pytest.raises(ogsgen.InapplicableConstraintError, match=r"TMA needs y 16-byte aligned, contiguous along its "
                                                                r"last dimension .* pass y.contiguous\(\)"):
            matmul_ogs(x, w[0], None, y=torch.empty(32, 8, device=device, dtype=torch.float16).T)
        with pytest.raises(ogsgen.InapplicableConstraintError, match=r"x is empty \(shape \(8, 0\)\): a TMA descriptor"):
            matmul_ogs(x[:, :0], w[0, :0], torch.zeros(32, device=device))
        with pytest.raises(ogsgen.InapplicableConstraintError, match="the persistent kernel does not split K"):
            with ogsgen.opt_flags_constraints(split_k=2):
                matmul_ogs(x, w[0], None, precision_config=ogsgen.PrecisionConfig(out_dtype=torch.float32))


def test_persistent_tiles_hold_two_storable_halves():
    # The persistent kernel's epilogue stores column halves of its tile by TMA, in boxes of 16 bytes or more.
    from ogsgen.runtime.opt_flags import TileProblem, make_opt_flags

    def flags(block_n, reduction_n=1, y_scale_block=0):
        return make_opt_flags(TileProblem(2, 1, 4096, 512, 256, reduction_n, None, 0, True, 132, None, False, y_scale_block,
                              constraints=(("block_n", block_n), ("persistent", True)), persistent_blocker=None))
    assert flags(16).block_n == 16  # halves of 8 columns: 16 bytes of bf16
    with pytest.raises(ogsgen.InapplicableConstraintError, match="the persistent kernel stores half tiles of at least 8 "
                                                            "output columns, so block_n must be at least 32"):
        flags(16, reduction_n=2)
    with pytest.raises(ogsgen.InapplicableConstraintError, match=r"an output with a scale per 32 columns needs "
                                                                 r"block_n // 2 // reduction_n to be a multiple of 32"):
        flags(32, y_scale_block=32)
    assert flags(64, y_scale_block=32).block_n == 64
    with pytest.raises(ogsgen.InapplicableConstraintError, match=r"a scale per 128 columns needs block_n // 2"):
        flags(128, y_scale_block=128)  # fp8 b128 output


def test_constraints_are_scoped():
    from ogsgen.runtime.opt_flags import current_constraints
    with ogsgen.opt_flags_constraints(block_m=32):
        with ogsgen.opt_flags_constraints(block_n=64):
            assert dict(current_constraints()) == {"block_m": 32, "block_n": 64}
        assert dict(current_constraints()) == {"block_m": 32}
    assert current_constraints() == ()


def test_inapplicable_constraint_keeps_triton_kernels_name():
    # Code written against triton_kernels catches InapplicableConstraint; it is ogsgen's error under that name.
    assert ogsgen.InapplicableConstraint is ogsgen.InapplicableConstraintError
    assert issubclass(ogsgen.InapplicableConstraint, ogsgen.OgsgenError)


def test_a_name_taken_out_of_the_api_says_what_to_do_instead():
    with pytest.raises(AttributeError, match=r"ogsgen\.bound_mx_scales was removed on 2026-12-04.*Remove the call"):
        ogsgen.bound_mx_scales
    with pytest.raises(AttributeError, match=r"module 'ogsgen' has no attribute 'no_such_name'"):
        ogsgen.no_such_name
