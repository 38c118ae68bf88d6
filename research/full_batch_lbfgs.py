"""Is the 3-layer gap at high noise a slow optimiser or a different minimum?  Full-batch L-BFGS says which.

A 3-layer Diag model has 12 weights (``--variant gdpp``: GD++, 9), so its loss on a fixed sample of tasks
can be minimised outright with L-BFGS in float64 (a strong-Wolfe line search, no learning rate).  For every
column this script:

1. starts L-BFGS from the run's own model (``--run``, the ``cpu`` budget's by default) on
   ``--refine-tasks`` tasks: if the loss barely moves, Adam had already reached a minimum;
2. starts L-BFGS from ``--starts`` random initialisations on ``--search-tasks`` tasks, keeps the one
   with the lowest loss on that sample, and refines it on the ``--refine-tasks`` sample;
3. trains each L-BFGS model on with Adam for ``--adam-steps`` steps of fresh tasks (unclipped, batch
   ``--batch``, a cosine from ``--rate`` to 1% of it, float64): a fixed sample never holds the rare tasks
   that a minimum of it may get badly wrong, a stream of fresh ones does;
4. scores every model on the same ``--eval-tasks`` fresh tasks (paired with the oracle ridge) and
   prints, besides the mean and its standard error, what a heavy tail does to it: the mean without the
   ``--worst`` largest tasks, the largest task, and the spread of the estimates that samples of
   100 000 tasks (the paper's evaluation size) would have given.

    python research/full_batch_lbfgs.py --columns 5
    python research/full_batch_lbfgs.py --columns 7 --starts 0
    python research/full_batch_lbfgs.py --columns 2 --variant gdpp --starts 16

research/README.md has the table and what it means for the ``cpu`` budget.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import torch

from icl_course import LinearTransformer, RegressionTasks
from icl_course.baselines import oracle_ridge
from icl_course.evaluate import query_averaged_loss
from icl_course.mixed_noise import diagonal_weights_table, per_task_adjusted_losses, tail_summary
from icl_course.sweep import ModelSpec, train_sweep
from icl_course.table1 import COLUMNS, PAPER, D, N, Table1Error, column_noise, load_table1_model

DEPTH = 3
PAPER_EVAL_TASKS = 100_000


def adjusted_training_loss(model: LinearTransformer, batch) -> float:
    """The model's mean adjusted loss on a fixed sample: what L-BFGS minimised, in the paper's units."""
    with torch.no_grad():
        return float((query_averaged_loss(model(batch).weights, batch)
                      - query_averaged_loss(oracle_ridge(batch), batch)).mean())


def lbfgs(model: LinearTransformer, batch, max_iter: int) -> LinearTransformer:
    """Minimise the mean loss on ``batch`` in place; a start whose loss overflows is left where it fails."""
    optimizer = torch.optim.LBFGS(list(model.parameters()), lr=1.0, max_iter=max_iter, history_size=20,
                                  line_search_fn="strong_wolfe", tolerance_grad=1e-12, tolerance_change=1e-14)

    def closure():
        optimizer.zero_grad()
        loss = query_averaged_loss(model(batch).weights, batch).mean()
        if torch.isfinite(loss):
            loss.backward()
        return loss

    optimizer.step(closure)
    return model


def describe(losses: torch.Tensor, features: dict, worst: int) -> dict:
    summary = tail_summary(losses, features, worst=worst)
    blocks = losses[: losses.numel() // PAPER_EVAL_TASKS * PAPER_EVAL_TASKS].reshape(-1, PAPER_EVAL_TASKS).mean(1)
    return {"mean": summary["mean"], "stderr": summary["stderr"], "median_task": summary["median"],
            "mean_without_worst": summary["mean_without_worst"],
            "stderr_without_worst": summary["stderr_without_worst"], "largest": summary["largest"][0],
            "blocks_of_100k": {"count": blocks.numel(), "median": float(blocks.median()),
                               "min": float(blocks.min()), "max": float(blocks.max())}}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", default="cpu", help="a shipped run ('cpu', 'clipped') or a table1 --out folder")
    parser.add_argument("--columns", nargs="+", default=["5"], choices=COLUMNS)
    parser.add_argument("--variant", default="diag", choices=("gdpp", "diag"),
                        help="the 3-layer model to minimise (GD++ has 9 weights, Diag 12)")
    parser.add_argument("--starts", type=int, default=8, help="random initialisations per column")
    parser.add_argument("--init-scales", nargs="+", type=float, default=[0.05, 0.1, 0.2, 0.3],
                        help="the starts cycle through these weight scales")
    parser.add_argument("--search-tasks", type=int, default=20_000)
    parser.add_argument("--refine-tasks", type=int, default=200_000)
    parser.add_argument("--search-seed", type=int, default=1234, help="the search sample's seed")
    parser.add_argument("--refine-seed", type=int, default=1235, help="the refine sample's seed")
    parser.add_argument("--max-iter", type=int, default=150, help="L-BFGS iterations per fit")
    parser.add_argument("--adam-steps", type=int, default=20_000)
    parser.add_argument("--rate", type=float, default=1e-4, help="Adam's rate at the start of its cosine")
    parser.add_argument("--batch", type=int, default=512)
    parser.add_argument("--eval-tasks", type=int, default=2_000_000)
    parser.add_argument("--worst", type=int, default=10)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--log", type=Path, help="write every result to this JSON file as it comes")
    parser.add_argument("--save", type=Path, help="save every model's weights to this file (torch.save: "
                        "{'column|model': state_dict}), to load into LinearTransformer(10, 3, 1, variant)")
    args = parser.parse_args(argv)
    if args.eval_tasks < PAPER_EVAL_TASKS:
        parser.error(f"--eval-tasks must be at least {PAPER_EVAL_TASKS} (one sample of the paper's size)")
    torch.set_num_threads(args.threads)
    results, saved = [], {}

    for column in args.columns:
        index = COLUMNS.index(column)
        sampler = RegressionTasks(D, N, column_noise(column), dtype=torch.float64)
        search = sampler.sample(args.search_tasks, torch.Generator().manual_seed(args.search_seed))
        refine = sampler.sample(args.refine_tasks, torch.Generator().manual_seed(args.refine_seed))
        models = {}

        started = time.perf_counter()
        try:
            shipped = load_table1_model(args.variant, DEPTH, column, args.run).double()
        except (FileNotFoundError, KeyError, Table1Error) as error:   # no such run, cell, or a damaged file
            parser.error(error.args[0] if error.args else str(error))
        models["the run's model"] = shipped
        polished = lbfgs(load_table1_model(args.variant, DEPTH, column, args.run).double(), refine, args.max_iter)
        models["the run's model + L-BFGS"] = polished
        print(f"sigma_max {column}: the run's model {adjusted_training_loss(shipped, refine):.4f} on the refine "
              f"sample, {adjusted_training_loss(polished, refine):.4f} after L-BFGS "
              f"({time.perf_counter() - started:.0f} s)", flush=True)

        started = time.perf_counter()
        best, best_loss, start_losses = None, math.inf, []
        for start in range(args.starts):
            scale = args.init_scales[start % len(args.init_scales)]
            model = lbfgs(LinearTransformer(D, DEPTH, 1, args.variant, init_scale=scale, seed=100 + start,
                                            dtype=torch.float64), search, args.max_iter)
            loss = adjusted_training_loss(model, search)
            start_losses.append(loss)
            print(f"  start {start} (scale {scale:g}): {loss:.4f} on the search sample", flush=True)
            if math.isfinite(loss) and loss < best_loss:
                best, best_loss = model, loss
        if best is not None:
            lbfgs(best, refine, args.max_iter)
            models["best random start + L-BFGS"] = best
            print(f"sigma_max {column}: best random start {best_loss:.4f} on the search sample, "
                  f"{adjusted_training_loss(best, refine):.4f} on the refine sample "
                  f"({time.perf_counter() - started:.0f} s)", flush=True)
        elif args.starts:
            print(f"sigma_max {column}: no random start ended finite; try smaller --init-scales", flush=True)

        for name in [name for name in models if "L-BFGS" in name]:
            started = time.perf_counter()
            spec = ModelSpec("model", column_noise(column), num_steps=args.adam_steps, learning_rate=args.rate,
                             schedule="cosine", init=models[name])
            # no clipping and no spike rule: the rare large losses are what this phase must see
            result = train_sweep([spec], d=D, n=N, num_layers=DEPTH, parameterization=args.variant,
                                 batch_size=args.batch, clip_norm=None, spike_factor=math.inf, final_fraction=0.01,
                                 dtype="float64", device="cpu", seed=600, progress=False)["model"]
            models[f"{name} + Adam"] = result.model.double()
            print(f"sigma_max {column}: {name} + {args.adam_steps} Adam steps "
                  f"({time.perf_counter() - started:.0f} s)", flush=True)

        for name, model in models.items():
            started = time.perf_counter()
            losses, features = per_task_adjusted_losses(model, sampler, args.eval_tasks, chunk_size=10_000,
                                                        seed=900 + index)
            row = {"column": column, "model": name, "paper": PAPER[args.variant][DEPTH][index],
                   "random_starts_on_search_sample": start_losses,
                   "training_sample": adjusted_training_loss(model, refine),
                   "weights_xx_xy_yx_yy": [[round(value, 5) for value in layer]
                                           for layer in diagonal_weights_table(model).tolist()],
                   **describe(losses, features, args.worst)}
            results.append(row)
            blocks = row["blocks_of_100k"]
            print(f"sigma_max {column:8s} {name:36s} {row['mean']:.4f} ± {row['stderr']:.4f} on "
                  f"{args.eval_tasks} tasks; without the worst {args.worst}: {row['mean_without_worst']:.4f} ± "
                  f"{row['stderr_without_worst']:.4f}; largest {row['largest']:.3g}; samples of 100 000: median "
                  f"{blocks['median']:.4f}, {blocks['min']:.4f} to {blocks['max']:.4f} (paper {row['paper']}; "
                  f"scored in {time.perf_counter() - started:.0f} s)",
                  flush=True)
            if args.log:
                args.log.write_text(json.dumps(results, indent=1))
            if args.save:
                saved[f"{column}|{name}"] = {key: value.detach().cpu() for key, value in model.state_dict().items()}
                torch.save(saved, args.save)


if __name__ == "__main__":
    main()
