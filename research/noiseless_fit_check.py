"""Is a run's noiseless column light-tailed on every million, not only on the table's?

The table's heavy-tail test (a standard error at most 2% of the mean, and the mean without the worst 0.01% of the
tasks within 5% of it) is scored on one million tasks.  From 5 layers on the noiseless models' means are near
1e-5, and a few tasks in a million (a smallest eigenvalue of ``X^T X`` near 0.1, a largest above 100) can decide
it.  This script scores the GD++ that a run keeps in each deep noiseless cell, and its light-tailed fit
(:mod:`icl_course.table1.noiseless`), on ``--millions`` independent plain millions, through the spectrum (the
model's exact loss), and counts the millions on which each fails the table's test and 70% of it (the fit's own
check).

It also compares, for ``lambda_max(X^T X) > 100``, the probability that ``--stretched`` stretched tasks give
weighted back (:class:`~icl_course.data.StretchedTasks`, the objective of the first fits) with the share of the
plain millions: the stretched sample stretches one coordinate axis, and a plain task's large eigenvalue points
along any direction.

    python research/noiseless_fit_check.py --run icl_course/pretrained/table1_cpu --millions 20

About 4 minutes to draw 20 millions on a 2-core CPU, and 20-30 s a model; research/README.md has the results.
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path

import torch

from icl_course.checkpoints import load_checkpoint
from icl_course.data import StretchedTasks
from icl_course.linalg import symmetric_eigh
from icl_course.table1 import load_table1_model
from icl_course.table1.noiseless import CheckTasks, gdpp_weights
from icl_course.table1.paper import D, N


def per_million(check: CheckTasks, weights: torch.Tensor) -> str:
    """One line: the mean over the millions, the worst standard error and trimmed-mean gap (relative), and the
    millions that fail the table's test and 70% of it."""
    estimates = check.estimates(weights)
    if not all(math.isfinite(estimate.mean) for estimate in estimates):
        return "overflows on some task"
    stderr = [estimate.stderr / estimate.mean for estimate in estimates]
    gap = [abs(estimate.mean - estimate.trimmed_mean) / estimate.mean for estimate in estimates]
    fails = sum(estimate.heavy_tailed() for estimate in estimates)
    fails70 = sum(estimate.heavy_tailed(0.014, 0.035) for estimate in estimates)
    mean = sum(estimate.mean for estimate in estimates) / len(estimates)
    return (f"mean {mean:.3g}; worst standard error {max(stderr):.2%}; trimmed mean below the mean: median "
            f"{sorted(gap)[len(gap) // 2]:.2%}, worst {max(gap):.2%}; fails the table's test on {fails} of "
            f"{len(estimates)} samples ({fails70} at 70% of it)")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", type=Path, default=Path("icl_course/pretrained/table1_cpu"))
    parser.add_argument("--millions", type=int, default=20, help="independent samples")
    parser.add_argument("--tasks", type=int, default=1_000_000, help="tasks a sample (the table's: a million)")
    parser.add_argument("--depths", type=int, nargs="+", default=[4, 5, 6, 7])
    parser.add_argument("--seed", type=int, default=7000)
    parser.add_argument("--stretched", type=int, default=20_000)
    args = parser.parse_args(argv)
    torch.set_num_threads(2)

    started = time.perf_counter()
    check = CheckTasks(args.tasks, seed=args.seed, samples=args.millions)
    largest = check.eigenvalues[:, -1]
    print(f"{args.millions} plain samples of {args.tasks} tasks drawn in {time.perf_counter() - started:.0f} s; "
          f"smallest eigenvalue below 0.22: {(check.eigenvalues[:, 0] < 0.22).sum().item() / args.millions:.1f} "
          f"tasks a sample; "
          f"largest above 100: {(largest > 100).sum().item()}, above 110: {(largest > 110).sum().item()}")
    stretched = StretchedTasks(D, N, 0.0, dtype=torch.float64, device="cpu").sample(args.stretched, seed=1200)
    top = symmetric_eigh(stretched.X.transpose(-1, -2) @ stretched.X, eigenvectors=False)[:, -1]
    weighted = (stretched.importance_weight * (top > 100)).sum().item() / args.stretched
    print(f"P(lambda_max > 100): {weighted:.2g} from {args.stretched} stretched tasks weighted back, "
          f"{(largest > 100).float().mean().item():.2g} on the plain samples")

    for depth in args.depths:
        kept = load_table1_model("gdpp", depth, "0", args.run)
        print(f"{depth} layers, the kept GD++: {per_million(check, gdpp_weights(kept))}")
        fit = args.run / "models" / f"gdpp-L{depth}-u0-s0-fit.pt"
        if fit.exists():
            checkpoint = load_checkpoint(fit, device="cpu")
            print(f"{depth} layers, the fit (start {checkpoint.metadata['fit']['start']!r}, rare weight "
                  f"{checkpoint.metadata['fit']['rare_weight']}): {per_million(check, gdpp_weights(checkpoint.model))}")


if __name__ == "__main__":
    main()
