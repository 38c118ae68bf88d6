"""Does the unclipped phase do better on a decaying rate than at its constant 1e-4?  The same start, both ways.

Every Table 1 model of two layers and more ends with an unclipped phase at a constant rate (the ``cpu``
budget: 3 000 steps at 1e-4).  Continued runs (``longer_training.py``) fell most in their last segment, the one
on a cosine, which hints that a constant rate leaves Adam at a noise floor.  This script takes, per column, the
model a run keeps for a cell and the first phase it was trained from (``models/NAME.clipped.pt`` in the run's
folder: GD++, Diag but for a 3-layer Diag nested from GD++, deepened candidates), and trains that phase's end
again both ways, on the same batches: ``--steps`` steps at the constant rate (the budget's phase
again) and ``--steps`` steps on a cosine from that rate to ``--final-fraction`` of it.  It scores the run's own
model and both new ones on the same ``--eval-tasks`` fresh tasks per column (paired with the oracle ridge) and
prints a Markdown table:

    python research/unclipped_decay.py --run DIR --variants gdpp diag --depths 3 6 --eval-tasks 200000

A model that has no first phase on disk (a nested Full, a 3-layer Diag nested from GD++) is left out, and
said so.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import torch

from icl_course import RegressionTasks
from icl_course.checkpoints import load_checkpoint
from icl_course.evaluate import adjusted_losses
from icl_course.sweep import ModelSpec, train_sweep
from icl_course.table1 import BUDGETS, COLUMN_IDS, COLUMNS, PAPER, VARIANTS, D, N, column_noise

NOISY = [column for column in COLUMNS if column != "0"]


def first_phases(run: Path, variant: str, depth: int, columns) -> dict:
    """{column: (name, the run's model, its first phase)} of the cells whose kept model has a first phase."""
    found = {}
    for column in columns:
        evaluation = run / "evaluation" / f"{COLUMN_IDS[COLUMNS.index(column)]}.json"
        if not evaluation.exists():
            raise SystemExit(f"{evaluation} not found: --run takes the folder of an icl-course table1 run that "
                             f"scored column {column} (a shipped run keeps no first phases)")
        name = json.loads(evaluation.read_text())["selected"].get(f"{variant}-L{depth}", "")
        first = run / "models" / f"{name}.clipped.pt"
        if not name or not first.exists():
            print(f"{variant}-L{depth} on {column}: {name or 'no model'} has no first phase on disk; left out")
            continue
        found[column] = (name, load_checkpoint(run / "models" / f"{name}.pt", device="cpu").model.double(),
                         load_checkpoint(first, device="cpu").model)
    return found


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", type=Path, required=True, help="the --out folder of an icl-course table1 run")
    parser.add_argument("--variants", nargs="+", default=["gdpp", "diag"], choices=("gdpp", "diag"))
    parser.add_argument("--depths", nargs="+", type=int, default=[3, 6])
    parser.add_argument("--columns", nargs="+", default=NOISY, choices=COLUMNS)
    parser.add_argument("--steps", type=int, default=None, help="default: the cpu budget's unclipped steps")
    parser.add_argument("--rate", type=float, default=BUDGETS["cpu"].unclipped_learning_rate)
    parser.add_argument("--final-fraction", type=float, default=0.01)
    parser.add_argument("--batch", type=int, default=BUDGETS["cpu"].batch_size)
    parser.add_argument("--eval-tasks", type=int, default=200_000)
    parser.add_argument("--chunk-size", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=4242, help="seeds the evaluation tasks of every column")
    args = parser.parse_args(argv)
    for depth in args.depths:
        steps = args.steps or BUDGETS["cpu"].settings(depth)["unclipped_steps"]
        for variant in args.variants:
            starts = first_phases(args.run, variant, depth, args.columns)
            if not starts:
                continue
            started, trained = time.perf_counter(), {}
            for schedule in ("constant", "cosine"):
                specs = [ModelSpec(f"{column}|{schedule}", column_noise(column), num_steps=steps,
                                   learning_rate=args.rate, schedule=schedule, init=first)
                         for column, (_, _, first) in starts.items()]
                # the same stream seed and stack for both schedules: each column's two models see the same batches
                trained.update(train_sweep(specs, d=D, n=N, num_layers=depth, parameterization=variant,
                                           batch_size=args.batch, clip_norm=None, spike_factor=math.inf,
                                           final_fraction=args.final_fraction, dtype="float32", device="cpu",
                                           seed=5200 + depth, progress=False))
            name = VARIANTS[variant]
            print(f"\n{name}, {depth} layers: {2 * len(starts)} models, {steps} unclipped steps from {args.rate:g} in "
                  f"{time.perf_counter() - started:.0f} s\n")
            print("| column (kept model) | the run's model | constant again | cosine to "
                  f"{args.final_fraction:g}x | paper |")
            print("| --- | --- | --- | --- | --- |")
            for column, (kept, model, _) in starts.items():
                models = {"run": model, "constant": trained[f"{column}|constant"].model,
                          "cosine": trained[f"{column}|cosine"].model}
                sampler = RegressionTasks(D, N, column_noise(column), dtype=torch.float64, device="cpu")
                scores = adjusted_losses(models, sampler, num_tasks=args.eval_tasks, chunk_size=args.chunk_size,
                                         seed=args.seed + COLUMNS.index(column))
                cells = [f"{scores[key].mean:.4g} ± {scores[key].stderr:.2g}" for key in models]
                paper = PAPER[variant][depth][COLUMNS.index(column)]
                print(f"| {column} ({kept}) | " + " | ".join(cells) + f" | {paper:g} |", flush=True)


if __name__ == "__main__":
    main()
