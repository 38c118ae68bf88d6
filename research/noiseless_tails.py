"""Which tasks carry the heavy tails of the noiseless column (sigma_max = 0) of a Table 1 run.

For every selected model of that column, scored on fresh noiseless tasks, print its mean loss and, for its
worst tasks, the loss beside the smallest and largest eigenvalue of ``X^T X`` (the unnormalised covariance of
the context: the Gram matrix the models work on) and ``|w|``; then the quantiles of those eigenvalues over
the same tasks, so that a worst task can be read as typical or rare.

A model of L layers computes a polynomial of ``X^T X``: where an eigenvalue is much smaller than usual, its
correction along that direction is small (the error there stays near ``w``'s component), and where one is much
larger, the polynomial can grow without bound. The output says which of the two each cell's tail is.

    python research/noiseless_tails.py --run cpu --depths 4 5 6 7 --tasks 1000000
"""

from __future__ import annotations

import argparse
import heapq
import time

import torch

from icl_course.data import RegressionTasks
from icl_course.evaluate import query_averaged_loss
from icl_course.table1 import VARIANTS, load_table1_model
from icl_course.table1.paper import D, N

QUANTILES = (1e-6, 1e-5, 1e-4, 0.5, 1 - 1e-4, 1 - 1e-5, 1 - 1e-6)


def worst_tasks(models: dict, num_tasks: int, chunk_size: int, seed: int, keep: int):
    """Per model: its mean loss and its ``keep`` worst tasks as (loss, smallest eigenvalue, largest, |w|);
    and every task's smallest and largest eigenvalue of ``X^T X``."""
    sampler = RegressionTasks(D, N, 0.0, dtype=torch.float64, device="cpu")
    totals = {name: 0.0 for name in models}
    worst = {name: [] for name in models}
    smallest, largest = [], []
    for chunk in range(-(-num_tasks // chunk_size)):
        batch = sampler.sample(min(chunk_size, num_tasks - chunk * chunk_size), seed=seed + chunk)
        eigenvalues = torch.linalg.eigvalsh(batch.X.transpose(-1, -2) @ batch.X)
        smallest.append(eigenvalues[:, 0])
        largest.append(eigenvalues[:, -1])
        norms = batch.w.norm(dim=-1)
        for name, model in models.items():
            with torch.no_grad():
                losses = query_averaged_loss(model.final_weights(batch), batch)
            totals[name] += losses.sum().item()
            top = torch.topk(losses, min(keep, len(losses)))
            for value, index in zip(top.values.tolist(), top.indices.tolist()):
                item = (value, eigenvalues[index, 0].item(), eigenvalues[index, -1].item(), norms[index].item())
                heapq.heappush(worst[name], item)
                if len(worst[name]) > keep:
                    heapq.heappop(worst[name])
    means = {name: total / num_tasks for name, total in totals.items()}
    return means, {name: sorted(items, reverse=True) for name, items in worst.items()}, \
        torch.cat(smallest), torch.cat(largest)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", default="cpu", help="a shipped run ('cpu', 'clipped') or a run's --out folder")
    parser.add_argument("--depths", type=int, nargs="+", default=[4, 5, 6, 7])
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument("--tasks", type=int, default=1_000_000)
    parser.add_argument("--chunk-size", type=int, default=50_000)
    parser.add_argument("--seed", type=int, default=10_000, help="chunk i draws with seed + i")
    parser.add_argument("--worst", type=int, default=3, help="how many worst tasks to show per model")
    args = parser.parse_args(argv)
    models = {f"{VARIANTS[variant]} {depth}": load_table1_model(variant, depth, "0", args.run).double()
              for variant in args.variants for depth in args.depths}
    started = time.perf_counter()
    means, worst, smallest, largest = worst_tasks(models, args.tasks, args.chunk_size, args.seed, args.worst)
    print(f"{args.tasks} noiseless tasks (d = {D}, n = {N}) in {time.perf_counter() - started:.0f} s; "
          "the worst tasks of each model: loss (smallest, largest eigenvalue of X^T X; |w|)")
    for name in models:
        shown = "; ".join(f"{loss:.2g} ({low:.2f}, {high:.0f}; {norm:.1f})" for loss, low, high, norm in worst[name])
        print(f"  {name:>8} layers: mean {means[name]:.3g}; {shown}")
    levels = torch.tensor(QUANTILES, dtype=torch.float64)
    low = torch.quantile(smallest, levels[:4]).tolist()
    high = torch.quantile(largest, levels[3:]).tolist()
    print("quantiles of the smallest eigenvalue at " + ", ".join(f"{q:g}" for q in QUANTILES[:4]) + ": "
          + ", ".join(f"{value:.3f}" for value in low))
    print("quantiles of the largest eigenvalue at " + ", ".join(f"{q:g}" for q in QUANTILES[3:]) + ": "
          + ", ".join(f"{value:.1f}" for value in high))


if __name__ == "__main__":
    main()
