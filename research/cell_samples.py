"""A cell of a Table 1 run scored on other samples than the table's own: is its tail the model's, or the sample's?

The table scores each cell on one sample of fresh tasks (a million for 3 layers and more) and flags it heavy-tailed
when the standard error is above 2% of the mean or the mean without the worst 0.01% of the tasks is more than 5%
below it.  A flag can come from the model (every large sample has such tasks) or from one rare task the table's
sample happened to hold.  This scores the cell's selected model on ``--samples`` other plain samples of the
column's law and on one sample of the stretched tuning tasks of the deep cells' selection
(``icl_course.table1.select.tuning_sampler``: rare spectra drawn on purpose and weighted back, truncated at
``STRETCHED_CAP``), each with its standard error and trimmed mean, beside the table's own numbers.

    python research/cell_samples.py --variant full --depth 4 --column 1        # the shipped cpu run
"""

from __future__ import annotations

import argparse
import time

import torch

from icl_course.data import RegressionTasks, StretchedTasks
from icl_course.evaluate import Estimate, adjusted_losses
from icl_course.table1 import VARIANTS, load_results, load_table1_model
from icl_course.table1.budget import column_noise
from icl_course.table1.paper import COLUMNS, D, N
from icl_course.table1.select import STRETCHED_CAP


def other_samples(model, column: str, samples: int, tasks: int, chunk_size: int, seed: int) -> dict:
    """``{label: Estimate}``: the model on ``samples`` plain samples (seeds ``seed``, ``seed + 1``, ...) and on
    one stretched sample, each of ``tasks`` tasks, in the table's adjusted loss."""
    plain = RegressionTasks(D, N, column_noise(column), dtype=torch.float64, device="cpu")
    stretched = StretchedTasks(D, N, column_noise(column), largest_eigenvalue_cap=STRETCHED_CAP, dtype=torch.float64,
                               device="cpu")
    out = {}
    for index in range(samples):
        out[f"plain sample, seed {seed + index}"] = adjusted_losses({"model": model}, plain, tasks, chunk_size,
                                                                    seed=seed + index)["model"]
    out[f"stretched tuning tasks, seed {seed}"] = adjusted_losses({"model": model}, stretched, tasks, chunk_size,
                                                                  seed=seed)["model"]
    return out


def _line(label: str, estimate: Estimate) -> str:
    trimmed = estimate.trimmed_mean
    return (f"  {label:38s} {estimate.mean:.4g} ± {100 * estimate.stderr / estimate.mean:.1f}%, trimmed "
            f"{trimmed:.4g} ({100 * (trimmed / estimate.mean - 1):+.1f}%)")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", default="cpu", help="a shipped run ('cpu', 'clipped') or a run's --out folder")
    parser.add_argument("--variant", default="full", choices=list(VARIANTS))
    parser.add_argument("--depth", type=int, default=4)
    parser.add_argument("--column", default="1", choices=list(COLUMNS))
    parser.add_argument("--samples", type=int, default=2, help="other plain samples")
    parser.add_argument("--tasks", type=int, default=1_000_000, help="tasks per sample")
    parser.add_argument("--chunk-size", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=12_345, help="sample i draws with seed + i")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    row = next((row for row in load_results(args.run)
                if (row["variant"], row["depth"], row["column"]) == (args.variant, args.depth, args.column)), None)
    if row is None:
        parser.error(f"the run {args.run!r} has no cell {VARIANTS[args.variant]} at {args.depth} layers in column "
                     f"{args.column}; give a --depth it trained")
    model = load_table1_model(args.variant, args.depth, args.column, args.run).double()
    started = time.perf_counter()
    scores = other_samples(model, args.column, args.samples, args.tasks, args.chunk_size, args.seed)
    print(f"{VARIANTS[args.variant]} {args.depth} layers, column {args.column} (adjusted loss, {args.tasks} tasks "
          f"per sample, {time.perf_counter() - started:.0f} s):")
    print(_line("the table's own sample", Estimate(row["adjusted_loss"], row["stderr"], row["num_tasks"],
                                                   row["trimmed_mean"])))
    for label, estimate in scores.items():
        print(_line(label, estimate))


if __name__ == "__main__":
    main()
