import os, sys, itertools
if not os.environ.get("PROBE_GPU"): os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ["OGSGEN_ON_DEMAND"] = "1"
sys.path.insert(0, os.path.dirname(__file__))
import torch, ogsgen
from ogsgen import matmul_ogs, matmul_ogs_torch, Epilogue, PrecisionConfig, FusedActivation
from ogsgen.testing import assert_close
import epi_fns
dev = "cuda" if torch.cuda.is_available() else "cpu"
big = dev == "cuda"
torch.manual_seed(0)
epi = Epilogue(epi_fns.rowcol.specs if hasattr(epi_fns.rowcol, "specs") else epi_fns.rowcol, (0.25,))
results = []
def check(name, fn_ours, fn_ref, n_rows=None):
    try:
        y = fn_ours(); r = fn_ref()
        if n_rows is not None: y, r = y[:n_rows], r[:n_rows]
        assert_close(r.float(), y.float(), maxtol=2e-2, rmstol=1e-2)
        results.append((name, "ok"))
    except ogsgen.InapplicableConstraintError as e:
        results.append((name, "inapplicable: " + str(e)[:80]))
    except AssertionError as e:
        results.append((name, "FAIL " + str(e)[:200]))
SIZES = [(300, 256, 384), (8, 512, 256), (1, 256, 512), (2048, 512, 1024)] if big else [(40, 32, 48), (3, 32, 64)]
CONSTRAINTS = [{}, {"split_k": 2}, {"persistent": True}, {"block_m": 16, "block_n": 32}]
for (M, K, N), kmaj, constraint in [(s, km, c) for s in SIZES for km in (False, True) for c in (CONSTRAINTS if s == SIZES[0] else [{}])]:
    dtype = torch.bfloat16
    constraint = dict(constraint)
    def layout(t):
        return t.mT.contiguous().mT if kmaj else t
    x = torch.randn(M, K, device=dev).to(dtype); w = layout((torch.randn(K, N, device=dev) / K**0.5).to(dtype))
    pc = PrecisionConfig(allow_tf32=False)
    for act in [None, FusedActivation(ogsgen.swiglu, (1.702, 7.0))]:
        def ours():
            with ogsgen.opt_flags_constraints(**constraint):
                return matmul_ogs(x, w, None, epilogue=epi, fused_activation=act, precision_config=pc)
        check(f"dense {M}x{K}x{N} kmaj={kmaj} {constraint} act={act is not None}", ours, lambda: matmul_ogs_torch(x.float(), w.float(), None, epilogue=epi, fused_activation=act))
    # batched
    xb = torch.randn(2, M, K, device=dev).to(dtype); wb = layout((torch.randn(2, K, N, device=dev)/K**0.5).to(dtype))
    def ours():
        with ogsgen.opt_flags_constraints(**constraint):
            return matmul_ogs(xb, wb, None, epilogue=epi, precision_config=pc)
    check(f"batched {M}x{K}x{N} kmaj={kmaj} {constraint}", ours, lambda: matmul_ogs_torch(xb.float(), wb.float(), None, epilogue=epi))
    # moe
    T, E = (M, 8)
    for k, mode in itertools.product([1, 2], ["sorted", "gather", "scatter", "gather+scatter"]):
        logits = torch.randn(T, E, device=dev)
        rd, gi, si = ogsgen.routing(logits, k)
        xm = torch.randn(T if "gather" in mode else T * k, K, device=dev).to(dtype)
        wm = layout((torch.randn(E, K, N, device=dev) / K**0.5).to(dtype))
        g = gi if "gather" in mode else None; s = si if "scatter" in mode else None
        if s is not None and "gather" not in mode:
            pass
        def ours():
            with ogsgen.opt_flags_constraints(**constraint):
                return matmul_ogs(xm, wm, None, rd, gather_indx=g, scatter_indx=s, epilogue=epi, precision_config=pc)
        def ref():
            return matmul_ogs_torch(xm.float(), wm.float(), None, rd, gather_indx=g, scatter_indx=s, epilogue=epi)
        check(f"moe {M}x{K}x{N} kmaj={kmaj} k={k} {mode} {constraint}", ours, ref)
for r in results: print(*r)
