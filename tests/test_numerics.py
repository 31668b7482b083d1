"""Every default dense variant and the custom-function variants against matmul_ogs_torch."""
from pathlib import Path

import pytest
import torch
import triton
import triton.language as tl

import ogsgen
from ogsgen import FusedActivation
from ogsgen.codegen import build
from ogsgen.spec import canonical_name, default_catalog, load_catalog_file
from cases import FN_ARG_VALUES, quick_few, run_case, run_moe_case
from ogsgen.moe import routing_from_topk
from ogsgen.runtime import loader
from ogsgen.runtime.matmul import launch
from ogsgen.testing import assert_close

DEFAULT = default_catalog().by_name()
DENSE = {name: v for name, v in DEFAULT.items()
         if v.family == "matmul" and not v.ragged and not v.inner and not v.fused_comm and not v.preact}
MOE = {name: v for name, v in DEFAULT.items() if v.ragged and not v.fused_comm and not v.preact}
PREACT = {name: v for name, v in DEFAULT.items() if v.preact}
FUSED_COMM = {name: v for name, v in DEFAULT.items() if v.fused_comm}
INNER = {name: v for name, v in DEFAULT.items() if v.inner}
LOADED = set()


@pytest.fixture(scope="module", autouse=True)
def record_loaded_variants():
    """Record every variant these tests launch, to check that the default catalog is covered."""
    original = loader.kernel_for

    def recording(variant, kernel="tiled"):
        LOADED.add(canonical_name(variant) + ("" if kernel in ("tiled", "reduce") else f"_{kernel}"))
        return original(variant, kernel)

    loader.kernel_for = recording
    yield
    loader.kernel_for = original
CUSTOM_CATALOG = Path(__file__).parent / "catalogs" / "custom_catalog.py"
SMALL_BLOCKS = dict(block_m=16, block_n=32, block_k=16)


def small_blocks(variant):
    # MX weights carry a scale per 32 rows of K (swizzled ones come in 64-row groups), MX activations per 32
    # columns, and an fp8 dot and weights upcast in registers need K tiles of 32 at least.
    wide_k = variant.w.scales_apply == "operand" or variant.x.bits == 8  # (NVFP4 too: 16-deep steps are refused)
    blocks = dict(SMALL_BLOCKS, block_k=64 if variant.w.layout != "strided" else 32 if wide_k else 16)
    if variant.y.has_block_scales:  # an output's tiles hold whole scale blocks (mxfp8: 32 columns, fp8: 128)
        blocks = dict(blocks, block_n=variant.y.block_size * variant.reduction_n)
    return blocks


@pytest.fixture(scope="module")
def custom_variants(tmp_path_factory):
    catalog = load_catalog_file(CUSTOM_CATALOG)
    out = tmp_path_factory.mktemp("custom_build")
    build(catalog, out)
    ogsgen.add_search_path(out)
    return catalog.by_name()


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(DENSE))
def test_default_dense_variant(name, device):
    # Shapes that are not multiples of any block size; one launch with default flags, one with
    # small blocks so that many tiles, the GROUP_M ordering and the ragged K tail are exercised,
    # and one with split K (its partials and reduce kernels are catalog companions).
    variant = DENSE[name]
    run_case(variant, 37, 72, 50, device, allow_tf32=False)
    with ogsgen.opt_flags_constraints(**small_blocks(variant)):
        run_case(variant, 70, 198, 62 if variant.w.element == "e2m1" else 61, device, out_alpha=0.75,
                 allow_tf32=False)
        with ogsgen.opt_flags_constraints(split_k=3):
            run_case(variant, 21, 40, 100, device, allow_tf32=False)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(MOE))
def test_default_moe_variant(name, device):
    variant = MOE[name]
    with ogsgen.opt_flags_constraints(**small_blocks(variant)):
        run_moe_case(variant, 23, 64, 40, 4, 2, device)  # k=2: a scatter goes through the top-k reduce
        run_moe_case(variant, 17, 32, 24, 4, 1, device)
        if not (variant.scatter and variant.activation):  # a scatter's split goes through its top-k combine
            run_moe_case(variant, 9, 32, 100, 4, 2, device, split_k=2)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(INNER))
def test_default_inner_variant(name, device):
    """Ragged K as training's backward calls it: x^T of tokens (gathered) or sorted rows, w the rows' dY."""
    variant = INNER[name]
    rd, gi, _ = ogsgen.routing(torch.randn(13, 5, device=device), 2)
    x = torch.randn(13 if variant.gather else 26, 40, device=device).to(variant.x.torch_dtype)
    dy = torch.randn(26, 24, device=device).to(variant.x.torch_dtype)
    acc = torch.randn(5, 40, 24, device=device).to(variant.y.torch_dtype) if variant.y_acc_in else None
    kwargs = dict(gather_indx=gi if variant.gather else None, y_acc_in=acc,
                  # fp32 as fp32: on the GPU the default tf32 dots differ from the reference by more than 1e-3
                  precision_config=ogsgen.PrecisionConfig(out_dtype=variant.y.torch_dtype, allow_tf32=False),
                  inner_routing_data=ogsgen.InnerRoutingData(rd, 16))
    expected = ogsgen.matmul_ogs_torch(x.mT, dy, None, **kwargs).float()
    out = ogsgen.matmul_ogs(x.mT, dy, None, **kwargs)
    tolerance = 2e-2 if variant.y.bits == 16 else 1e-3
    torch.testing.assert_close(out.float(), expected, atol=tolerance * expected.abs().max().item(), rtol=0)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(FUSED_COMM))
def test_default_fused_comm_variant(name, device):
    """Two ranks' buffers in one process, the rows all-gathered (tests/test_fused_comm.py: shards, more ranks)."""
    variant = FUSED_COMM[name]
    dtype = variant.x.torch_dtype
    if variant.family == "reduce":  # the top-k reduce of a scatter: token rows, each rank's partial in its slot
        rd, _, si = ogsgen.routing(torch.randn(11, 4, device=device), 2)
        args = (torch.randn(22, 32, device=device).to(dtype), torch.randn(4, 32, 24, device=device).to(dtype), None,
                rd)
        kwargs = dict(scatter_indx=si, gammas=rd.gate_scal if variant.gammas else None)
        rows = 11
    elif variant.ragged:
        rd, gi, _ = ogsgen.routing(torch.randn(11, 4, device=device), 2)
        x = torch.randn(11 if variant.gather else 22, 32, device=device).to(dtype)
        args = (x, torch.randn(4, 32, 24, device=device).to(dtype), None, rd)
        kwargs = dict(gather_indx=gi if variant.gather else None, gammas=rd.gate_scal if variant.gammas else None)
        rows = 22
    else:
        args = (torch.randn(22, 32, device=device).to(dtype), torch.randn(32, 24, device=device).to(dtype),
                torch.randn(24, device=device) if variant.bias else None)
        kwargs = {}
        rows = 22
    expected = ogsgen.matmul_ogs_torch(*(a.float() if isinstance(a, torch.Tensor) and a.dtype == dtype else a
                                         for a in args), **kwargs).to(dtype)
    buffers = [torch.zeros(2 * rows, 24, device=device).to(dtype) for _ in range(2)]
    handles = torch.tensor([b.data_ptr() for b in buffers], dtype=torch.int64, device=device)
    for rank in range(2):
        ogsgen.matmul_ogs(*args, **kwargs, y=buffers[rank], fused_comm=ogsgen.FusedComm(handles, None, rank, 2))
    for buffer in buffers:
        for rank in range(2):
            torch.testing.assert_close(buffer[rank::2].float(), expected.float(),
                                       atol=3e-2 * expected.abs().max().item(), rtol=0)


PERSISTENT = sorted(name for name, v in DEFAULT.items() if v.has_persistent_kernel and not v.preact)


@pytest.mark.parametrize("name", quick_few(sorted(PREACT), {
    "ogs_matmul_xbf16_wbf16_ybf16_ragged_gather_bias_preact_act_swiglu", "ogs_matmul_xbf16_wbf16_ybf16_bias_preact_act_swiglu"}))
def test_preact_variant(name, device):
    """The training forward's variants: y as the plain variant computes it, and the rows before the activation
    (out_alpha * (x @ w + bias)) in the output dtype, by the tiled kernel and (where the variant has one) the
    persistent kernel; ragged rows with dropped gates, which write nothing."""
    variant = DEFAULT[name]
    dtype, out_dtype = variant.x.torch_dtype, variant.y.torch_dtype
    n_expts, k_act, k, n = 4, 2, 40, 48
    if variant.ragged:
        weights, ids = torch.topk(torch.randn(13, n_expts, device=device).softmax(-1), k_act)
        ids = torch.where(torch.rand(ids.shape, device=device) < 0.2, -1, ids)  # some gates routed nowhere
        rd, gi, _ = routing_from_topk(ids, weights, n_expts)
        rows = 13 * k_act
        x = torch.randn(13 if variant.gather else rows, k, device=device).to(dtype)
        w = (torch.randn(n_expts, k, n, device=device) / 4).to(dtype)
        routing = dict(routing_data=rd, gather_indx=gi if variant.gather else None)
        routed = int(rd.expt_data.slice_offs[n_expts])
    else:
        rows = routed = 21
        x, w = torch.randn(rows, k, device=device).to(dtype), (torch.randn(k, n, device=device) / 4).to(dtype)
        routing = {}
    bias = torch.randn(*((n_expts,) if variant.ragged else ()), n, device=device) if variant.bias else None
    gammas = torch.rand(rows, device=device) if variant.gammas else None
    act = FusedActivation(variant.activation, FN_ARG_VALUES[variant.activation.name](n // 2, device))
    expected_z = ogsgen.matmul_ogs_torch(x.float(), w.float(), bias, **routing, out_alpha=0.5)
    expected_y = ogsgen.matmul_ogs_torch(x.float(), w.float(), bias, **routing, out_alpha=0.5, gammas=gammas,
                                         fused_activation=act)
    for persistent in (False, True) if variant.has_persistent_kernel else (False,):
        z = torch.full((rows, n), float("nan"), device=device).to(out_dtype)
        with ogsgen.opt_flags_constraints(persistent=persistent, block_m=16, block_n=32, block_k=16):
            y = launch(x, w, bias, **routing, gammas=gammas, out_alpha=0.5, fused_activation=act, preact=z,
                       precision_config=ogsgen.PrecisionConfig(out_dtype=out_dtype, allow_tf32=False))
        for got, want in ((z, expected_z), (y, expected_y)):
            torch.testing.assert_close(got[:routed].float(), want[:routed], atol=3e-2 * want.abs().max().item(),
                                       rtol=2e-2)
        assert z[routed:].isnan().all()  # rows of no expert: not written


@pytest.mark.parametrize("name", quick_few(PERSISTENT, {
    "ogs_matmul_xbf16_wbf16_ybf16_bias", "ogs_matmul_xbf16_wbf16_ybf16_ragged_gather_bias_act_swiglu",
    "ogs_matmul_xfp16_wfp16_yfp16_ragged_scatter_bias_gammas"}))
def test_persistent_kernel(name, device):
    # Small tiles: every program loops over several tiles (the interpreter runs three programs), and M, N and K
    # all have tails, which TMA zero-fills (K = 56 and 40 are multiples of 8, as TMA's 16-byte strides need, and
    # N = 80 and 48 multiples of 16, so that Y's rows after SwiGLU are too). A gather reads x's rows by pointers,
    # masked past each expert's rows, whose K needs no 16-byte rows (20) and may be whole K steps (32).
    variant = DEFAULT[name]
    with ogsgen.opt_flags_constraints(persistent=True, block_m=16, block_n=32, block_k=16):
        if variant.ragged:
            run_moe_case(variant, 23, 64, 40, 4, 2, device)
            if variant.scatter:  # top-k > 1 runs the plain ragged companion; top-1 scatters directly
                run_moe_case(variant, 23, 64, 40, 4, 1, device)
            if variant.gather:  # dropped gates (-1) must not disturb the gathered rows
                run_moe_case(variant, 19, 32, 24, 4, 2, device, drop=0.3)
                run_moe_case(variant, 19, 32, 20, 4, 2, device)
                run_moe_case(variant, 19, 32, 32, 4, 2, device)
        else:
            run_case(variant, 37, 80, 56, device, allow_tf32=False)
            run_case(variant, 20, 48, 24, device, batch=3, allow_tf32=False)


def test_heuristic_falls_back_to_the_tiled_kernel_where_tma_cannot_read_x_or_write_y(device, monkeypatch):
    # A shape the heuristic runs persistently (on the interpreter, or on a GPU with TMA); x or y transposed has
    # no TMA descriptor (its last stride is not 1), so the same call takes the tiled kernel, with the same result.
    launched = []
    original = loader.kernel_for
    monkeypatch.setattr(loader, "kernel_for", lambda variant, kernel="tiled": launched.append(kernel == "persistent") or
                        original(variant, kernel))
    if device == "cuda" and torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("no TMA on this GPU: the persistent kernel is never chosen")
    variant = DEFAULT["ogs_matmul_xbf16_wbf16_ybf16_bias"]
    m, n, k = (4096, 2048, 256) if device == "cuda" else (128, 256, 256)  # on a GPU, tiles for every SM
    run_case(variant, m, n, k, device)
    run_case(variant, m, n, k, device, x_transposed=True)
    run_case(variant, m, n, k, device, y_transposed=True)
    run_case(variant, m, n, k, device, w_transposed=True)  # a K-major w has a descriptor: its transpose's
    assert launched == [True, False, False, True]


@pytest.mark.parametrize("name", ["ogs_matmul_xbf16_wbf16_ybf16_bias",
                                  "ogs_matmul_xbf16_wbf16_ybf16_ragged_gather_bias_act_swiglu",
                                  "ogs_matmul_xfp16_wfp16_yfp16_ragged_scatter_gammas"])
def test_persistent_kernel_reads_a_k_major_w(name, device, monkeypatch):
    # nn.Linear checkpoints and vLLM hold expert weights (E, N, K), passed as w.mT: K-contiguous. The persistent
    # kernel reads them through a TMA descriptor of w.mT and transposes the tile for the dot.
    launched = []
    original = loader.kernel_for
    monkeypatch.setattr(loader, "kernel_for", lambda variant, kernel="tiled": launched.append(kernel == "persistent") or
                        original(variant, kernel))
    variant = DEFAULT[name]
    with ogsgen.opt_flags_constraints(persistent=True, block_m=16, block_n=32, block_k=16):
        if variant.ragged:
            run_moe_case(variant, 23, 64, 40, 4, 2, device, w_k_major=True)
        else:
            run_case(variant, 37, 80, 56, device, w_transposed=True, allow_tf32=False)
            run_case(variant, 20, 48, 24, device, batch=3, w_transposed=True, allow_tf32=False)
    assert launched and launched[0] is True


@pytest.mark.slow
def test_every_default_variant_was_launched():
    # Runs after the parametrized tests above, in their process (pytest keeps file order; with -n, pyproject's
    # --dist loadfile keeps a file's tests in one worker).
    expected = set(DEFAULT) | {name + "_persistent" for name in PERSISTENT}
    missing = sorted(expected - LOADED)
    assert not missing, f"default variants no test launched: {missing}"


@pytest.mark.slow
def test_custom_variants(custom_variants, device):
    for name, variant in sorted(custom_variants.items()):
        if variant.ragged:
            with ogsgen.opt_flags_constraints(**SMALL_BLOCKS):
                for k_act in (1, 2):
                    run_moe_case(variant, 21, 32, 24, 4, k_act, device)
        elif variant.family == "matmul":  # the reduce companions run under the split-K case
            with ogsgen.opt_flags_constraints(**SMALL_BLOCKS):
                run_case(variant, 45, 66, 40, device)
                with ogsgen.opt_flags_constraints(split_k=2):
                    run_case(variant, 20, 34, 64, device)


@pytest.mark.parametrize("name", ["ogs_matmul_xbf16_wbf16_ybf16_bias", "ogs_matmul_xfp16_wfp16_yfp16_act_swiglu",
                                  "ogs_matmul_xfp32_wfp32_yfp32_bias_gammas"])
@pytest.mark.parametrize("x_t,w_t,y_t", [(False, False, False), (True, False, False), (False, True, False),
                                         (False, False, True), (True, True, True)])
def test_major_orders(name, x_t, w_t, y_t, device):
    run_case(DEFAULT[name], 33, 40, 24, device, x_transposed=x_t, w_transposed=w_t, y_transposed=y_t,
             allow_tf32=False)


@pytest.mark.parametrize("name", ["ogs_matmul_xbf16_wbf16_ybf16", "ogs_matmul_xfp16_wfp16_yfp32_bias_act_swiglu",
                                  "ogs_matmul_xfp32_wfp32_yfp32_bias"])
def test_batched(name, device):
    with ogsgen.opt_flags_constraints(block_m=16, block_n=16, block_k=16):
        run_case(DEFAULT[name], 20, 34, 19, device, batch=3, allow_tf32=False)


def test_batched_shared_bias(device):
    x = torch.randn(2, 5, 8, device=device, dtype=torch.float16)
    w = torch.randn(2, 8, 6, device=device, dtype=torch.float16)
    bias = torch.randn(6, device=device)
    y = ogsgen.matmul_ogs(x, w, bias)
    ref = torch.stack([x[b].float() @ w[b].float() + bias for b in range(2)])
    torch.testing.assert_close(y.float(), ref, atol=2e-2, rtol=1e-2)


@pytest.mark.parametrize("m,n,k", [(0, 5, 7), (5, 0, 7), (0, 0, 0)])
@pytest.mark.parametrize("batch", [None, 3])
def test_zero_size_output(m, n, k, batch, device):
    lead = (batch,) if batch else ()
    x = torch.randn(lead + (m, k), device=device, dtype=torch.float16)
    w = torch.randn(lead + (k, n), device=device, dtype=torch.float16)
    y = ogsgen.matmul_ogs(x, w, None)
    assert y.shape == lead + (m, n) and y.dtype == torch.float16


@pytest.mark.parametrize("batch", [None, 2])
def test_zero_reduction_dim_gives_bias(batch, device):
    lead = (batch,) if batch else ()
    x = torch.randn(lead + (7, 0), device=device, dtype=torch.bfloat16)
    w = torch.randn(lead + (0, 9), device=device, dtype=torch.bfloat16)
    bias = torch.randn(lead + (9,), device=device)
    y = ogsgen.matmul_ogs(x, w, bias, out_alpha=2.0)
    ref = (2.0 * bias).to(torch.bfloat16)
    expected = ref.unsqueeze(-2).expand(lead + (7, 9))
    assert torch.equal(y, expected)


def test_zero_reduction_dim_with_transposed_empty_x(device):
    x = torch.randn(0, 16, device=device, dtype=torch.bfloat16).T  # (16, 0), column-major view
    w = torch.randn(0, 32, device=device, dtype=torch.bfloat16)
    bias = torch.randn(32, device=device)
    y = ogsgen.matmul_ogs(x, w, bias)
    assert torch.equal(y, bias.to(torch.bfloat16).expand(16, 32))


def test_canonical_names_cover_the_catalog():
    assert all(canonical_name(v) == name for name, v in DEFAULT.items())


def _row_and_column_torch(tile, rows, cols, a):
    return torch.where((cols % 3 == 0)[None, :], tile * 2.0, tile.abs()) + a * (rows[:, None] % 5) - cols[None, :] / 64


@ogsgen.register_epilogue(arg_names=("a",), reference=_row_and_column_torch)
@triton.jit
def _row_and_column(tile, offs_m, offs_n, mask, a):
    # nonlinear, and different for each output row and column: a kernel path that hands the epilogue other rows
    # or columns than y's, or runs it before a top-k sum, gives other values
    tile = tl.where((offs_n % 3 == 0)[None, :], tile * 2.0, tl.abs(tile))
    return tile + a * (offs_m[:, None] % 5).to(tl.float32) - offs_n[None, :].to(tl.float32) / 64


ROW_AND_COLUMN = ogsgen.Epilogue(_row_and_column, (0.25,))


def _pair_product_torch(tile, c):
    return tile[:, 0::2] * torch.relu(tile[:, 1::2] + c)


@ogsgen.register_activation(arg_names=("c",), reduction_n=2, reference=_pair_product_torch)
@triton.jit
def _pair_product(tile, c):
    # a user's two-into-one activation (not SwiGLU): columns 2j and 2j + 1 make y's column j
    first, second = tl.split(tl.reshape(tile, (tile.shape[0], tile.shape[1] // 2, 2)))
    return first * tl.maximum(second + c, 0.0)


@pytest.mark.usefixtures("kernels_on_demand")
@pytest.mark.parametrize("activation", [pytest.param(None, marks=pytest.mark.slow), FusedActivation(_pair_product, (0.5,))],
                         ids=["", "pair_product"])
@pytest.mark.parametrize("constraints", [{}, {"persistent": True}, {"split_k": 2}], ids=["tiled", "persistent",
                                                                                         "split_k"])
@pytest.mark.parametrize("mode,k_act", [("dense", 1), ("batched", 1), ("sorted", 2), ("gather", 2), ("scatter", 1),
                                        ("gather-scatter", 2)])
def test_epilogue_sees_y_rows_and_columns_on_every_kernel_path(mode, k_act, constraints, activation, device):
    """A user epilogue gets y's row and column indices (after the scatter, in the reduce kernel after a top-k sum or
    split K) on the tiled, persistent and split-K paths, with w stored K-contiguous, after a user activation that
    folds column pairs."""
    m, k, n, n_expts = 40, 32, 48, 4
    torch.manual_seed(0)
    if "scatter" in mode and "split_k" in constraints and (k_act == 1 or activation is not None):
        pytest.skip("split K takes neither a scatter of one expert per token nor one after an activation "
                    "(tested in test_bad_inputs)")
    lead = {"dense": (), "batched": (2,)}.get(mode, (n_expts,))  # w's batch entries or experts
    w = (torch.randn(*lead, n, k, device=device) / k ** 0.5).bfloat16().mT  # K-contiguous
    kwargs = {}
    if mode in ("dense", "batched"):
        x = torch.randn(*lead, m, k, device=device).bfloat16()
    else:
        rd, gi, si = ogsgen.routing(torch.randn(m, n_expts, device=device), k_act)
        kwargs = dict(routing_data=rd, gather_indx=gi if "gather" in mode else None,
                      scatter_indx=si if "scatter" in mode else None)
        x = torch.randn(m if "gather" in mode else m * k_act, k, device=device).bfloat16()
    pc = ogsgen.PrecisionConfig(allow_tf32=False)
    with ogsgen.opt_flags_constraints(**constraints):
        y = ogsgen.matmul_ogs(x, w, None, epilogue=ROW_AND_COLUMN, fused_activation=activation, precision_config=pc,
                              **kwargs)
    ref = ogsgen.matmul_ogs_torch(x.float(), w.float(), None, epilogue=ROW_AND_COLUMN, fused_activation=activation,
                                  **kwargs)
    assert_close(ref, y.float())


@ogsgen.register_activation(arg_names=("c",), reference=lambda tile, c: _pair_product_torch(tile, c))
@triton.jit
def _pair_product_registered_as_one(tile, c):
    # folds column pairs, but registered with reduction_n=1: the runtime allocates N output columns
    first, second = tl.split(tl.reshape(tile, (tile.shape[0], tile.shape[1] // 2, 2)))
    return first * tl.maximum(second + c, 0.0)


@pytest.mark.usefixtures("kernels_on_demand")
@pytest.mark.parametrize("constraints", [{}, {"persistent": True}, {"split_k": 2}], ids=["tiled", "persistent",
                                                                                         "split_k"])
def test_activation_of_another_width_than_its_reduction_n_is_refused(constraints, device):
    # Its kernel fails to compile with the reason (the activation's result must have 1/reduction_n of the tile's
    # columns) rather than leaving y's columns past its result unwritten, or failing on a broadcast.
    x, w = torch.randn(16, 32, device=device).bfloat16(), torch.randn(32, 64, device=device).bfloat16()
    act = FusedActivation(_pair_product_registered_as_one, (0.5,))
    with ogsgen.opt_flags_constraints(**constraints), \
            pytest.raises(Exception, match=r"activation _pair_product_registered_as_one must return 1/1 of its tile"):
        ogsgen.matmul_ogs(x, w, None, fused_activation=act)
