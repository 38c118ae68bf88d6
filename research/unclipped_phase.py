"""Heavy tails of deep Table 1 models: continue a run's models without clipping, or widen GD++ first.

Takes the models of an ``icl-course table1`` run (a shipped name such as ``cpu``, or any ``--out``
folder with a ``models.pt``) at one depth and trains, for every column and learning rate, one of:

* ``continue``: the run's own Diag and Full model, further with Adam at a constant rate, no gradient
  clipping and no spike rule (every batch counts, however large its loss);
* ``nested``: the run's GD++ model widened to Diag (``q_y = 0``), trained the same way, and that Diag
  widened to Full, trained the same way (``icl_course.models.widen``: the same function, more freedom);
* ``full-from-diag``: the run's Diag model widened to Full, trained the same way.

Every model, the run's own included, is then scored on ``--eval-tasks`` fresh tasks paired with the
oracle ridge, with standard errors (research/README.md has the tables):

    python research/unclipped_phase.py --run DIR --mode continue --steps 1000 --rates 1e-4 3e-4
    python research/unclipped_phase.py --run DIR --mode nested --steps 2000 --rates 1e-4 3e-4
    python research/unclipped_phase.py --run cpu --mode full-from-diag --depth 2 --columns 3 4 7 "{1,3}" \
        --steps 2000 --rates 1e-4 --eval-tasks 100000
"""

from __future__ import annotations

import argparse
import math
import time

import torch

from icl_course import RegressionTasks
from icl_course.evaluate import adjusted_losses
from icl_course.models import widen
from icl_course.sweep import ModelSpec, train_sweep
from icl_course.table1 import COLUMNS, PAPER, D, N, column_noise, load_table1_model


def _train(variant, depth, starts, args, seed):
    """Continue every model of ``starts`` ({(column, rate): model}) without clipping, as one stack."""
    specs = [ModelSpec(f"{variant}|{column}|{rate:g}", column_noise(column), num_steps=args.steps,
                       learning_rate=rate, schedule=args.schedule, init=model)
             for (column, rate), model in starts.items()]
    started = time.perf_counter()
    results = train_sweep(specs, d=D, n=N, num_layers=depth, parameterization=variant, batch_size=args.batch,
                          clip_norm=None, spike_factor=math.inf, final_fraction=0.01, dtype=args.dtype,
                          device=args.device, seed=seed, progress=False)
    print(f"{variant}: {len(specs)} models, {args.steps} steps in {time.perf_counter() - started:.0f} s", flush=True)
    return {(name.split("|")[1], float(name.split("|")[2])): result.model for name, result in results.items()}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", default="cpu", help="a shipped run ('cpu', 'clipped') or a table1 --out folder")
    parser.add_argument("--mode", default="continue", choices=["continue", "nested", "full-from-diag"])
    parser.add_argument("--depth", type=int, default=3)
    parser.add_argument("--columns", nargs="+", default=list(COLUMNS), choices=COLUMNS)
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--batch", type=int, default=512)
    parser.add_argument("--rates", nargs="+", type=float, default=[1e-4, 3e-4])
    parser.add_argument("--schedule", default="constant", choices=["constant", "cosine"],
                        help="the rate over the phase: constant, or a cosine from it to 1%% of it")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--eval-tasks", type=int, default=1_000_000)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args(argv)

    run = {variant: {column: load_table1_model(variant, args.depth, column, args.run) for column in args.columns}
           for variant in PAPER}
    trained = {}
    if args.mode == "continue":
        for variant in ("diag", "full"):
            trained[variant] = _train(variant, args.depth, {(c, r): run[variant][c] for c in args.columns
                                                            for r in args.rates}, args, seed=31)
    elif args.mode == "full-from-diag":
        trained["full"] = _train("full", args.depth, {(c, r): widen(run["diag"][c], "full") for c in args.columns
                                                      for r in args.rates}, args, seed=41)
    else:
        trained["diag"] = _train("diag", args.depth, {(c, r): widen(run["gdpp"][c], "diag") for c in args.columns
                                                      for r in args.rates}, args, seed=37)
        trained["full"] = _train("full", args.depth, {key: widen(model, "full")
                                                      for key, model in trained["diag"].items()}, args, seed=37)
    print(f"adjusted loss on {args.eval_tasks} tasks (the paper's in parentheses)")
    for column in args.columns:
        index = COLUMNS.index(column)
        models = {f"{variant} run": run[variant][column] for variant in PAPER}
        for variant, models_by_key in trained.items():
            models.update({f"{variant} {rate:g}": models_by_key[(column, rate)] for rate in args.rates})
        sampler = RegressionTasks(D, N, column_noise(column), dtype=torch.float64, device=args.device)
        scores = adjusted_losses(models, sampler, num_tasks=args.eval_tasks, chunk_size=10_000, seed=900 + index)
        shown = "  ".join(f"{name}: {score.mean:.4g} ± {score.stderr:.2g} ({PAPER[name.split()[0]][args.depth][index]})"
                          for name, score in scores.items())
        print(f"sigma_max {column}: {shown}", flush=True)


if __name__ == "__main__":
    main()
