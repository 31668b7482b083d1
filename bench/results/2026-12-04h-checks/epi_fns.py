import torch, triton, triton.language as tl, ogsgen

def rowcol_torch(tile, rows, cols, a):
    return torch.where((cols % 3 == 0)[None, :], tile * 2.0, tile.abs()) + a * (rows[:, None] % 5).float() - 0.01 * cols[None, :].float()

@ogsgen.register_epilogue(arg_names=("a",), reference=rowcol_torch)
@triton.jit
def rowcol(tile, offs_m, offs_n, mask, a):
    t = tl.where((offs_n % 3 == 0)[None, :], tile * 2.0, tl.abs(tile))
    return t + a * (offs_m[:, None] % 5).to(tl.float32) - 0.01 * offs_n[None, :].to(tl.float32)
