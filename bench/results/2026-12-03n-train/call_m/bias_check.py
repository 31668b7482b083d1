"""GPU diagnostic: the ragged bias gradient (a row of ones times dz, ragged K) against index_add segment sums."""
import sys
import torch
import ogsgen

for tokens, E, k, n in [(2048, 256, 8, 4096), (2048, 256, 8, 7168), (2048, 128, 4, 5760), (2048, 128, 4, 4096),
                        (2048, 256, 8, 5760), (512, 256, 8, 4096)]:
    torch.manual_seed(0)
    rd, gi, si = ogsgen.routing(torch.randn(tokens, E, device="cuda"), k)
    rows = tokens * k
    dz = torch.randn(rows, n, device="cuda").bfloat16()
    experts = torch.repeat_interleave(torch.arange(E, device="cuda"), rd.expt_hist.long())
    ref = torch.zeros(E, n, device="cuda").index_add_(0, experts, dz.float())
    for m in (1, 16):
        ones = torch.ones(m, rows, dtype=dz.dtype, device="cuda")
        pc = ogsgen.PrecisionConfig(out_dtype=torch.float32)
        y = ogsgen.matmul_ogs(ones, dz, None, inner_routing_data=ogsgen.InnerRoutingData(rd, 32), precision_config=pc)
        for row in (0, m - 1):
            err = (y[:, row] - ref).abs()
            bad = (err > 1e-2 * ref.abs().max()).nonzero()
            print(f"T={tokens} E={E} k={k} N={n} M={m} row {row}: rel {((y[:, row] - ref).norm() / ref.norm()).item():.2e}"
                  f" bad entries {bad.shape[0]} experts {bad[:, 0].unique()[:8].tolist()} cols {bad[:, 1].unique()[:8].tolist()}",
                  flush=True)
