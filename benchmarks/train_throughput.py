"""Training steps per second: icl_course against a straightforward linear transformer.

Both sides do the same work per step in the paper's configuration (d = 10, n = 20,
batch 2048, Adam): sample a fresh batch of tasks, run the forward pass, back-propagate,
and take an optimiser step.

* ``icl_course``: :class:`icl_course.LinearTransformer`, which works on each task's
  (d+1) x (d+1) Gram matrix and trains on the exact query-averaged loss.
* ``straightforward``: what a competent engineer writes first: batched matrix products
  over tasks and heads (no Python loop over tasks, tokens or heads) that form each head's
  (n+1) x n attention scores ``e_j^T Q_h e_i`` from the tokens, apply them to the values
  ``P_h e_j``, add the result to every token, and train on one sampled query per task.

Run:  python benchmarks/train_throughput.py [--threads 2] [--steps 10] [--rounds 5]
"""

from __future__ import annotations

import argparse
import time

import torch
from torch import nn

from icl_course import LinearTransformer, RegressionTasks, UniformNoise
from icl_course.evaluate import query_averaged_loss


class StraightforwardLinearTransformer(nn.Module):
    """Linear self-attention from the tokens, with the same parameterisations as icl_course."""

    def __init__(self, d: int, num_layers: int, num_heads: int, parameterization: str, init_scale=0.02):
        super().__init__()
        D = d + 1
        self.d, self.parameterization = d, parameterization
        generator = torch.Generator().manual_seed(0)
        if parameterization == "full":
            shapes = {"P": (num_layers, num_heads, D, D), "Q": (num_layers, num_heads, D, D)}
        else:  # diag: P = diag(p_x I, p_y), Q = diag(q_x I, q_y)
            shapes = {"p": (num_layers, num_heads, 2), "q": (num_layers, num_heads, 2)}
        for name, shape in shapes.items():
            self.register_parameter(name, nn.Parameter(torch.randn(shape, generator=generator) * init_scale))

    def matrices(self):
        if self.parameterization == "full":
            return self.P, self.Q
        expand = torch.tensor([0] * self.d + [1])
        return torch.diag_embed(self.p[..., expand]), torch.diag_embed(self.q[..., expand])

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens (B, n+1, d+1), query last -> prediction -y_t (B,)."""
        P, Q = self.matrices()
        for layer in range(P.shape[0]):
            context = tokens[:, :-1]                                        # (B, n, D)
            queries = torch.einsum("hkl,bil->bhik", Q[layer], tokens)       # Q_h e_i: (B, H, n+1, D)
            scores = queries @ context.transpose(-1, -2).unsqueeze(1)       # (B, H, n+1, n)
            values = torch.einsum("hkl,bjl->bhjk", P[layer], context)       # P_h e_j: (B, H, n, D)
            tokens = tokens + (scores @ values).sum(1)
        return -tokens[:, -1, -1]


def steps_per_second(step, num_steps: int) -> float:
    start = time.perf_counter()
    for _ in range(num_steps):
        step()
    return num_steps / (time.perf_counter() - start)


def compare(ours, plain, num_steps: int, rounds: int) -> tuple[float, float, float]:
    """Median rates of both over alternating rounds, and the median of the per-round ratios.

    Alternating rounds expose both implementations to the same machine state, which matters on a
    shared virtual machine whose speed drifts by tens of percent within a minute.
    """
    for _ in range(5):  # warm-up: allocator, thread pool, first-call overheads
        ours()
        plain()
    rates = [(steps_per_second(ours, num_steps), steps_per_second(plain, num_steps)) for _ in range(rounds)]
    median = lambda values: sorted(values)[len(values) // 2]  # noqa: E731
    return (median([a for a, _ in rates]), median([b for _, b in rates]), median([a / b for a, b in rates]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--steps", type=int, default=10, help="timed steps per round")
    parser.add_argument("--rounds", type=int, default=5, help="alternating rounds (median reported)")
    parser.add_argument("--batch-size", type=int, default=2048)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, batch {args.batch_size}, "
          f"d=10, n=20, {args.rounds} alternating rounds of {args.steps} steps, medians")

    d, n = 10, 20
    tasks = RegressionTasks(d, n, UniformNoise(3), device="cpu")
    results = {}
    for parameterization in ("diag", "full"):
        for num_layers in (1, 7):
            generator = torch.Generator().manual_seed(0)
            ours = LinearTransformer(d, num_layers, 1, parameterization, device="cpu")
            ours_optimizer = torch.optim.Adam(ours.parameters(), lr=1e-4)

            def ours_step():
                batch = tasks.sample(args.batch_size, generator)
                loss = query_averaged_loss(ours.final_weights(batch), batch).mean()
                ours_optimizer.zero_grad()
                loss.backward()
                ours_optimizer.step()

            plain = StraightforwardLinearTransformer(d, num_layers, 1, parameterization)
            plain_optimizer = torch.optim.Adam(plain.parameters(), lr=1e-4)

            def plain_step():
                batch = tasks.sample(args.batch_size, generator)
                loss = 0.5 * ((plain(batch.tokens) - batch.y_t) ** 2).mean()
                plain_optimizer.zero_grad()
                loss.backward()
                plain_optimizer.step()

            rate_ours, rate_plain, ratio = compare(ours_step, plain_step, args.steps, args.rounds)
            results[parameterization, num_layers] = ratio
            print(f"{parameterization} L={num_layers}: icl_course {rate_ours:7.1f} steps/s, "
                  f"straightforward {rate_plain:7.1f} steps/s")
    for parameterization in ("diag", "full"):
        print(f"speedup {parameterization} L=7: {results[parameterization, 7]:.2f}x")


if __name__ == "__main__":
    main()
