"""Does far more training close the 3-layer gap at high noise?  Continue a run's Diag and Full models.

The ``cpu`` budget's 3-layer Diag and Full models stay 1.2x-1.8x above the paper from ``sigma_max = 4``
on.  This script takes them (from a shipped run or any ``icl-course table1 --out`` folder) and trains them
on, unclipped, with Adam at a constant rate, in segments of fresh tasks; the last segment decays on a
cosine to 1% of the rate.  After every segment each model is scored on ``--eval-tasks`` fresh tasks
(paired with the oracle ridge, the same tasks after every segment), so the table shows whether the
models move towards the paper or wander (research/README.md has the table):

    python research/longer_training.py --run cpu --columns 5 7 "{1,3,5}" --segments 5 \
        --segment-steps 5000 --eval-tasks 200000

``--variants`` and ``--depth`` take it to other cells, e.g. GD++ at 6 layers and ``sigma_max = 1``:

    python research/longer_training.py --run cpu --depth 6 --variants gdpp --columns 1 --segments 4
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import torch

from icl_course import RegressionTasks
from icl_course.evaluate import adjusted_losses
from icl_course.sweep import ModelSpec, train_sweep
from icl_course.table1 import COLUMNS, PAPER, D, N, column_noise, load_table1_model

TRAINED = ("diag", "full")   # the variants trained on unless --variants names others


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", default="cpu", help="a shipped run ('cpu', 'clipped') or a table1 --out folder")
    parser.add_argument("--depth", type=int, default=3)
    parser.add_argument("--variants", nargs="+", default=list(TRAINED), choices=("gdpp", "diag", "full"))
    parser.add_argument("--columns", nargs="+", default=["5", "7", "{1,3,5}"], choices=COLUMNS)
    parser.add_argument("--segments", type=int, default=5, help="the last one decays on a cosine")
    parser.add_argument("--segment-steps", type=int, default=5000)
    parser.add_argument("--rate", type=float, default=1e-4)
    parser.add_argument("--batch", type=int, default=512)
    parser.add_argument("--eval-tasks", type=int, default=200_000)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--log", type=Path, help="write every score to this JSON file as it comes")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)

    models = {(variant, column): load_table1_model(variant, args.depth, column, args.run)
              for variant in args.variants for column in args.columns}
    scores = []

    def score(after: str) -> None:
        for column in args.columns:
            index = COLUMNS.index(column)
            sampler = RegressionTasks(D, N, column_noise(column), dtype=torch.float64)
            estimates = adjusted_losses({variant: models[(variant, column)] for variant in args.variants}, sampler,
                                        num_tasks=args.eval_tasks, chunk_size=10_000, seed=900 + index)
            scores.append({"after": after, "column": column,
                           **{variant: [estimate.mean, estimate.stderr] for variant, estimate in estimates.items()}})
            print(f"{after:>22s}  sigma_max {column:8s}" + "  ".join(
                f"{variant}: {estimate.mean:.4f} ± {estimate.stderr:.4f} (paper {PAPER[variant][args.depth][index]})"
                for variant, estimate in estimates.items()), flush=True)
        if args.log:
            args.log.write_text(json.dumps(scores, indent=1))

    score("the run's")
    for segment in range(args.segments):
        schedule = "cosine" if segment == args.segments - 1 else "constant"
        for variant in args.variants:
            specs = [ModelSpec(f"{variant}|{column}", column_noise(column), num_steps=args.segment_steps,
                               learning_rate=args.rate, schedule=schedule, init=models[(variant, column)])
                     for column in args.columns]
            started = time.perf_counter()
            # every segment sees fresh tasks; no clipping and no spike rule (research/README.md says why)
            results = train_sweep(specs, d=D, n=N, num_layers=args.depth, parameterization=variant,
                                  batch_size=args.batch, clip_norm=None, spike_factor=math.inf, final_fraction=0.01,
                                  device="cpu", seed=500 + segment, progress=False)
            models.update({(variant, column): results[f"{variant}|{column}"].model for column in args.columns})
            print(f"segment {segment + 1} ({schedule}), {variant}: {time.perf_counter() - started:.0f} s", flush=True)
        score(f"+{(segment + 1) * args.segment_steps} steps ({schedule})")


if __name__ == "__main__":
    main()
