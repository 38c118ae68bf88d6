"""Does a Full model nested from the Diag its cell keeps have the tail of the Full the table keeps?

From 4 layers on, the ``cpu`` budget nests a Full model from each of the cell's two Diag candidates (deepened
before the first and before the last layer) and the cell keeps the better on its tuning tasks. At 4 layers and
``sigma_max = 1`` that is the Full nested from the Diag the Diag cell did not keep, and it is the one heavy-tailed
cell of the shipped run. This script trains, for every column of one depth, a Full nested from the Diag the
shipped run keeps there, as the command's Full stack of that depth trains it (all columns in one stack, the
stack's seed, the budget's unclipped steps at the nested rate, batch, float32), then scores it beside that Diag
widened and the Full the run keeps: paired on the cell's tuning tasks and on its evaluation tasks (the run's seeds
and chunks), with trimmed means and the heavy-tail flag.

    python research/full_from_kept_diag.py --depth 4 --out full_from_kept_diag_L4.json
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from icl_course.data import RegressionTasks
from icl_course.evaluate import paired_adjusted_losses
from icl_course.models import widen
from icl_course.sweep import ModelSpec, train_sweep
from icl_course.table1 import BUDGETS, COLUMN_IDS, COLUMNS, VARIANTS, D, N, load_table1_model
from icl_course.table1.budget import column_noise
from icl_course.table1.select import tuning_sampler


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--depth", type=int, default=4, help="a depth of 4-7 (Full nests at 1e-5 there)")
    parser.add_argument("--columns", nargs="+", default=list(COLUMNS))
    parser.add_argument("--steps", type=int, default=None, help="default: the budget's unclipped steps")
    parser.add_argument("--tasks", type=int, default=1_000_000, help="tuning and evaluation tasks per column")
    parser.add_argument("--out", type=Path, default=None, help="a JSON file for the numbers")
    args = parser.parse_args(argv)
    if args.depth not in range(4, 8):
        parser.error(f"--depth takes 4, 5, 6 or 7 (Full nests from Diag at 1e-5 there); got {args.depth}")
    unknown = [column for column in args.columns if column not in COLUMNS]
    if unknown:
        parser.error(f"unknown columns {unknown}; the columns are {', '.join(COLUMNS)}")
    budget = BUDGETS["cpu"]
    settings = budget.settings(args.depth)
    steps = args.steps or settings["unclipped_steps"]
    diags = {column: load_table1_model("diag", args.depth, column) for column in args.columns}
    specs = [ModelSpec(f"full-L{args.depth}-{COLUMN_IDS[COLUMNS.index(column)]}-kept", column_noise(column), seed=0,
                       num_steps=steps, learning_rate=settings["nested_learning_rate"]["full"], warmup_steps=0,
                       schedule="constant", init=widen(diags[column].float(), "full")) for column in args.columns]
    started = time.perf_counter()
    trained = train_sweep(specs, d=D, n=N, num_layers=args.depth, parameterization="full",
                          batch_size=budget.batch_size, clip_norm=None, spike_factor=float("inf"), restarts=0,
                          final_fraction=budget.final_fraction, dtype=settings["dtype"], device="cpu",
                          seed=1000 * args.depth + sorted(VARIANTS).index("full") + 500, progress=False)
    print(f"trained {len(specs)} Full models of {args.depth} layers, {steps} steps, in "
          f"{time.perf_counter() - started:.0f} s")
    results = {}
    for spec, column in zip(specs, args.columns):
        index = COLUMNS.index(column)
        models = {"nested from the kept Diag": trained[spec.name].model.double(),
                  "kept Diag, widened": widen(diags[column].double(), "full"),
                  "kept Full": load_table1_model("full", args.depth, column).double()}
        tuning, differences = paired_adjusted_losses(models, tuning_sampler(column, True, "cpu"), "kept Diag, widened",
                                                     num_tasks=args.tasks, chunk_size=budget.chunk_size,
                                                     seed=700 + index)
        plain = RegressionTasks(D, N, column_noise(column), dtype=torch.float64, device="cpu")
        evaluation, _ = paired_adjusted_losses(models, plain, None, num_tasks=args.tasks,
                                               chunk_size=budget.chunk_size, seed=900 + index)
        results[column] = {
            name: {"tuning": [tuning[name].mean, tuning[name].stderr],
                   "difference from the kept Diag": ([differences[name].mean, differences[name].stderr]
                                                     if name in differences else None),
                   "evaluation": [evaluation[name].mean, evaluation[name].stderr, evaluation[name].trimmed_mean],
                   "heavy_tail": evaluation[name].heavy_tailed()} for name in models}
        new = differences["nested from the kept Diag"]
        print(f"{column:>8}: tuning, nested minus kept Diag {new.mean:+.3g} ({new.mean / new.stderr:+.1f} standard "
              "errors); evaluation " + ", ".join(
                  f"{name} {score.mean:.5g} ± {score.stderr / score.mean:.1%} (trimmed {score.trimmed_mean:.5g}"
                  f"{', heavy' if score.heavy_tailed() else ''})" for name, score in evaluation.items()))
    if args.out is not None:
        args.out.write_text(json.dumps({"depth": args.depth, "steps": steps, "columns": results}, indent=1))


if __name__ == "__main__":
    main()
