"""A gpt-oss-style MoE MLP layer through generated kernels, checked against a plain torch layer.

    python examples/moe_layer.py                        # on a CUDA GPU
    TRITON_INTERPRET=1 python examples/moe_layer.py     # on the CPU (small sizes)

router matmul -> top-k routing -> w1 (gather tokens to experts, + bias, fused SwiGLU)
-> w2 (+ bias, times the gate weights, scattered back and summed over each token's k experts).
"""
import argparse

import torch

import ogsgen
from ogsgen.testing import assert_close


def moe_layer(x, w_router, w1, b1, w2, b2, n_expts_act):
    logits = ogsgen.matmul_ogs(x, w_router, None, precision_config=ogsgen.PrecisionConfig(out_dtype=torch.float32))
    routing_data, gather_indx, scatter_indx = ogsgen.routing(logits, n_expts_act)
    swiglu = ogsgen.FusedActivation(ogsgen.swiglu, (1.702, 7.0))
    hidden = ogsgen.matmul_ogs(x, w1, b1, routing_data, gather_indx=gather_indx, fused_activation=swiglu)
    out = ogsgen.matmul_ogs(hidden, w2, b2, routing_data, scatter_indx=scatter_indx, gammas=routing_data.gate_scal)
    return logits, out


def moe_layer_torch(x, logits, w1, b1, w2, b2, n_expts_act):
    """The same layer in plain torch, token by expert, in float32 (given the router's logits)."""
    weights, experts = torch.topk(logits, n_expts_act, dim=-1)
    weights = torch.softmax(weights, dim=-1)
    out = torch.zeros(x.shape[0], w2.shape[-1], device=x.device)
    for expert in range(w1.shape[0]):
        token, slot = torch.nonzero(experts == expert, as_tuple=True)
        if token.numel():
            h = ogsgen.swiglu_torch(x[token].float() @ w1[expert].float() + b1[expert], 1.702, 7.0)
            h = h.to(x.dtype).float()  # the layer keeps its hidden activations in x's dtype
            out.index_add_(0, token, (h @ w2[expert].float() + b2[expert]) * weights[token, slot, None])
    return out


def main():
    parser = argparse.ArgumentParser()
    on_gpu = torch.cuda.is_available()
    parser.add_argument("--tokens", type=int, default=1024 if on_gpu else 48)
    parser.add_argument("--hidden", type=int, default=2880 if on_gpu else 64)
    parser.add_argument("--intermediate", type=int, default=2880 if on_gpu else 32)
    parser.add_argument("--experts", type=int, default=128 if on_gpu else 8)
    parser.add_argument("--top-k", type=int, default=4 if on_gpu else 2)
    args = parser.parse_args()
    device, dtype = ("cuda" if on_gpu else "cpu"), torch.bfloat16
    torch.manual_seed(0)
    t, h, i, e = args.tokens, args.hidden, args.intermediate, args.experts
    x = torch.randn(t, h, device=device).to(dtype)
    w_router = (torch.randn(h, e, device=device) / h ** 0.5).to(dtype)
    w1 = (torch.randn(e, h, 2 * i, device=device) / h ** 0.5).to(dtype)  # gate/linear columns interleaved
    b1 = torch.randn(e, 2 * i, device=device) * 0.1
    w2 = (torch.randn(e, i, h, device=device) / i ** 0.5).to(dtype)
    b2 = torch.randn(e, h, device=device) * 0.1

    logits, out = moe_layer(x, w_router, w1, b1, w2, b2, args.top_k)
    assert_close(x.float() @ w_router.float(), logits, what="router logits")
    ref = moe_layer_torch(x, logits, w1, b1, w2, b2, args.top_k)
    assert_close(ref, out.float(), what="MoE layer")
    print(f"MoE layer matches torch: tokens={t} hidden={h} experts={e} top-{args.top_k} {dtype} on {device}")


if __name__ == "__main__":
    main()
