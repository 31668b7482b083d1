"""Train a small mixture-of-experts model with ogsgen's kernels, beside the same model on the torch reference.

    python examples/train_moe.py                        # on a CUDA GPU
    TRITON_INTERPRET=1 python examples/train_moe.py     # on the CPU (small sizes)

A student MoE layer (router, w1 with its tokens gathered to their experts and SwiGLU fused, w2 scattered back and
weighted by the gates) learns a random teacher's function with Adam. The parameters are float32 and each step runs
in bf16 (the weights cast per step, as autocast would); gradients flow through ogsgen.matmul_ogs's backward, which
runs on ogsgen's kernels, and through the gates into the router. The same model and steps run on
ogsgen.matmul_ogs_torch (float32 reference arithmetic): the losses must fall, agree over the first steps and end
at the same level.
"""
import argparse
import math

import torch

import ogsgen

SWIGLU = ogsgen.FusedActivation(ogsgen.swiglu, (1.702, 7.0))


class MoE(torch.nn.Module):
    def __init__(self, width, hidden, n_expts, n_expts_act, matmul):
        super().__init__()
        self.n_expts_act, self.matmul = n_expts_act, matmul
        self.router = torch.nn.Parameter(torch.randn(width, n_expts) / math.sqrt(width))
        self.w1 = torch.nn.Parameter(torch.randn(n_expts, width, 2 * hidden) / math.sqrt(width))
        self.b1 = torch.nn.Parameter(torch.zeros(n_expts, 2 * hidden))
        self.w2 = torch.nn.Parameter(torch.randn(n_expts, hidden, width) / math.sqrt(hidden))
        self.b2 = torch.nn.Parameter(torch.zeros(n_expts, width))

    def forward(self, x):
        routing_data, gather, scatter = ogsgen.routing(x.float() @ self.router, self.n_expts_act)
        x = x.bfloat16()
        hidden = self.matmul(x, self.w1.bfloat16(), self.b1, routing_data, gather_indx=gather,
                             fused_activation=SWIGLU)
        return self.matmul(hidden.bfloat16(), self.w2.bfloat16(), self.b2, routing_data, scatter_indx=scatter,
                           gammas=routing_data.gate_scal)


def train(model, inputs, targets, steps, lr):
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    losses = []
    for step in range(steps):
        x, y = inputs[step % len(inputs)], targets[step % len(inputs)]
        loss = (model(x).float() - y).square().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--steps", type=int, default=None, help="default: 100 on a GPU, 12 on the CPU")
    args = parser.parse_args()
    small = args.device == "cpu"
    tokens, width, hidden, n_expts, n_expts_act = (32, 32, 32, 4, 2) if small else (2048, 512, 512, 16, 4)
    steps = args.steps or (12 if small else 100)
    torch.manual_seed(0)
    teacher = MoE(width, hidden, n_expts, n_expts_act, ogsgen.matmul_ogs_torch).to(args.device)
    inputs = [torch.randn(tokens, width, device=args.device) for _ in range(4)]
    with torch.no_grad():
        targets = [teacher(x).float() for x in inputs]
    student = MoE(width, hidden, n_expts, n_expts_act, ogsgen.matmul_ogs).to(args.device)
    reference = MoE(width, hidden, n_expts, n_expts_act, ogsgen.matmul_ogs_torch).to(args.device)
    reference.load_state_dict(student.state_dict())
    losses = train(student, inputs, targets, steps, lr=3e-3)
    reference_losses = train(reference, inputs, targets, steps, lr=3e-3)
    for step in range(0, steps, max(1, steps // 10)):
        print(f"step {step:4d}  loss ogsgen {losses[step]:.5f}  torch reference {reference_losses[step]:.5f}")
    # Early steps agree closely (the gradients are the same); later, bf16 rounding flips some tokens' top-k choices
    # and the runs drift apart as any two training runs do, so there the loss levels are compared.
    early = max(abs(a - b) / b for a, b in zip(losses[:10], reference_losses[:10]))
    tail = max(1, steps // 10)
    final, final_reference = sum(losses[-tail:]) / tail, sum(reference_losses[-tail:]) / tail
    assert final < 0.7 * losses[0], f"the loss did not fall: {losses[0]:.4f} -> {final:.4f}"
    assert early < 0.02, f"ogsgen's first losses left the reference's by {early:.1%}"
    assert abs(final - final_reference) < 0.1 * final_reference, \
        f"final loss {final:.4f} against the reference's {final_reference:.4f}"
    print(f"training matches the torch reference: loss {losses[0]:.4f} -> {final:.4f} in {steps} steps "
          f"(reference {final_reference:.4f}), first ten steps within {early:.2%}")


if __name__ == "__main__":
    main()
