"""Which start wins a 3-layer cell: every candidate of a Table 1 run, scored on the same tasks.

A budget with ``deepen`` (``icl_course.table1.Deepening``) trains several candidates per cell and keeps
the one with the lowest loss on the tuning sample.  For the ``cpu`` budget at 3 layers these are, per
column, for Diag: ``s0`` and ``s1`` (the trained GD++ of that seed widened to Diag, then the unclipped
phase) and ``s0-d0`` and ``s0-d1`` (the trained 2-layer Diag with a pass-through layer inserted before
its layer 0 or 1, ``icl_course.models.deepen``, then a clipped and an unclipped phase); Full nests from
each of the four.  This script reads every candidate's checkpoint from the ``models/`` folder of a run
(``icl-course table1 --out DIR``; the shipped runs keep only the selected models) and scores all of a
variant's candidates of one column on the same ``--eval-tasks`` fresh tasks, paired with the oracle ridge
(standard errors over tasks), and prints a Markdown table with the candidate the run selected marked:

    python research/deepened_start.py --run DIR --variants diag full --eval-tasks 1000000

With ``--full-rates``, it instead widens each column's selected Diag model to Full (the same function) and
trains it ``--steps`` unclipped steps at each rate, as the Full candidates of the run do at 1e-4, and
scores the Diag start and every Full model on the same tasks:

    python research/deepened_start.py --run DIR --full-rates 1e-4 3e-5 1e-5 --columns 3 4 5 6 "{1,3}" "{1,3,5}" \
        --eval-tasks 200000

With ``--deeper``, it takes the run one layer further the same way: each column's selected model of each of
``--variants`` with a pass-through layer inserted before each of its layers but the last
(``icl_course.models.deepen``) trains the budget's ``Deepening`` phases (2 000 clipped steps on a cosine from
1e-3, then ``--steps`` unclipped at 1e-4), and the start and every deeper model are scored on the same tasks:

    python research/deepened_start.py --run DIR --deeper --variants diag --eval-tasks 1000000

``--deeper`` and ``--full-rates`` also take a shipped run's selected models (``--run cpu``), at any
``--depth`` it has: ``--run cpu --depth 2 --deeper --variants gdpp`` starts 3-layer GD++ models from
the shipped 2-layer ones.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import time
from pathlib import Path

import torch

from icl_course import RegressionTasks
from icl_course.checkpoints import load_checkpoint
from icl_course.evaluate import adjusted_losses
from icl_course.models import deepen, widen
from icl_course.sweep import ModelSpec, train_sweep
from icl_course.table1 import (
    COLUMN_IDS,
    COLUMNS,
    PAPER,
    SHIPPED,
    VARIANTS,
    D,
    Deepening,
    N,
    Table1Error,
    column_noise,
    load_table1_model,
)


def candidates(models: Path, variant: str, depth: int, column: str) -> dict:
    """{candidate suffix ('s0', 's0-d1', ...): checkpoint path} of one cell of a run."""
    prefix = f"{variant}-L{depth}-{COLUMN_IDS[COLUMNS.index(column)]}-"
    found = {}
    for path in sorted(models.glob(prefix + "s*.pt"), key=lambda path: ("-d" in path.name, path.name)):
        suffix = path.name[len(prefix):-len(".pt")]
        if re.fullmatch(r"s\d+(-d\d+)?", suffix):      # not the '.clipped' first phases
            found[suffix] = path
    return found


def selected(run: Path, variant: str, depth: int, column: str) -> str:
    """The candidate the run kept for one cell ('' if that column was not scored)."""
    evaluation = run / "evaluation" / f"{COLUMN_IDS[COLUMNS.index(column)]}.json"
    if not evaluation.exists():
        return ""
    return json.loads(evaluation.read_text())["selected"].get(f"{variant}-L{depth}", "")


def full_rates(run: Path, args) -> None:
    """Each column's selected Diag widened to Full and trained unclipped at each of ``args.full_rates``."""
    starts = selected_models(run, args)
    specs = [ModelSpec(f"{column}|{rate:g}", column_noise(column), num_steps=args.steps, learning_rate=rate,
                       schedule="constant", init=widen(model, "full"))
             for column, (name, model) in starts.items() for rate in args.full_rates]
    started = time.perf_counter()
    trained = train_sweep(specs, d=D, n=N, num_layers=args.depth, parameterization="full", batch_size=512,
                          clip_norm=None, spike_factor=math.inf, dtype="float32", device="cpu", seed=3500,
                          progress=False)
    print(f"{len(specs)} Full models, {args.steps} steps in {time.perf_counter() - started:.0f} s", flush=True)
    rates = [f"{rate:g}" for rate in args.full_rates]
    print(f"\nFull, {args.depth} layers, from the selected Diag (the same function), {args.steps} unclipped steps\n")
    print("| column | Diag (start) | " + " | ".join(f"Full at {rate}" for rate in rates) + " | paper (Full) |")
    print("| --- |" + " --- |" * (len(rates) + 2))
    for column, (name, model) in starts.items():
        models = {"start": model}
        models.update({rate: trained[f"{column}|{rate}"].model for rate in rates})
        sampler = RegressionTasks(D, N, column_noise(column), dtype=torch.float64, device="cpu")
        scores = adjusted_losses(models, sampler, num_tasks=args.eval_tasks, chunk_size=args.chunk_size,
                                 seed=args.seed + COLUMNS.index(column))
        cells = [f"{scores[key].mean:.4f} ± {scores[key].stderr:.4f}" for key in models]
        paper = PAPER["full"][args.depth][COLUMNS.index(column)]
        print(f"| {column} ({name}) | " + " | ".join(cells) + f" | {paper:g} |", flush=True)


def selected_models(run, args, variant: str = "diag") -> dict:
    """{column: (name, model)} of each column's selected ``variant`` of ``args.depth`` layers, in float64.

    ``run`` is a run's ``--out`` folder, or the name of a shipped run (``"cpu"``, ``"clipped"``), whose
    ``models.pt`` holds the selected models only."""
    if run in SHIPPED:
        return {column: (f"shipped {run}", load_table1_model(variant, args.depth, column, path=run).double())
                for column in args.columns}
    starts = {}
    for column in args.columns:
        name = selected(run, variant, args.depth, column)
        if name:
            starts[column] = (name, load_checkpoint(run / "models" / f"{name}.pt", device="cpu").model.double())
    return starts


def deeper(run: Path, args, variant: str) -> None:
    """Each column's selected ``variant`` with a pass-through layer at every position, trained as a Deepening."""
    starts = selected_models(run, args, variant)
    positions = range(args.depth)
    recipe = Deepening()
    phases = [dict(num_steps=recipe.steps, learning_rate=recipe.learning_rate, warmup_steps=recipe.warmup_steps,
                   schedule="cosine", clip_norm=1.0, spike_factor=100.0),
              dict(num_steps=args.steps, learning_rate=1e-4, warmup_steps=0, schedule="constant", clip_norm=None,
                   spike_factor=math.inf)]
    models = {f"{column}|d{position}": deepen(model, position) for column, (name, model) in starts.items()
              for position in positions}
    started = time.perf_counter()
    for index, phase in enumerate(phases):
        specs = [ModelSpec(key, column_noise(key.split("|")[0]), num_steps=phase["num_steps"],
                           learning_rate=phase["learning_rate"], warmup_steps=phase["warmup_steps"],
                           schedule=phase["schedule"], init=model) for key, model in models.items()]
        trained = train_sweep(specs, d=D, n=N, num_layers=args.depth + 1, parameterization=variant, batch_size=512,
                              clip_norm=phase["clip_norm"], spike_factor=phase["spike_factor"], final_fraction=0.01,
                              dtype="float32", device="cpu", seed=3600 + index, progress=False)
        models = {key: result.model.double() for key, result in trained.items()}
    name = VARIANTS[variant]
    print(f"{len(models)} {name} models of {args.depth + 1} layers, {recipe.steps} clipped and {args.steps} "
          f"unclipped steps in {time.perf_counter() - started:.0f} s", flush=True)
    print(f"\n{name}, {args.depth + 1} layers, from the selected {args.depth}-layer {name} with a pass-through "
          f"layer before layer k\n")
    print(f"| column | start ({args.depth} layers) | " + " | ".join(f"k = {position}" for position in positions)
          + f" | paper ({args.depth + 1} layers) |")
    print("| --- |" + " --- |" * (len(positions) + 2))
    for column, (name, model) in starts.items():
        scored = {"start": model}
        scored.update({position: models[f"{column}|d{position}"] for position in positions})
        sampler = RegressionTasks(D, N, column_noise(column), dtype=torch.float64, device="cpu")
        scores = adjusted_losses(scored, sampler, num_tasks=args.eval_tasks, chunk_size=args.chunk_size,
                                 seed=args.seed + COLUMNS.index(column))
        cells = [f"{scores[key].mean:.4g} ± {scores[key].stderr:.2g}" for key in scored]
        paper = PAPER[variant][args.depth + 1][COLUMNS.index(column)]
        print(f"| {column} | " + " | ".join(cells) + f" | {paper:g} |", flush=True)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", required=True, help="the --out folder of an icl-course table1 run; with --deeper "
                        f"or --full-rates also a shipped run ({', '.join(SHIPPED)}), which keeps the selected models")
    parser.add_argument("--depth", type=int, default=3)
    parser.add_argument("--variants", nargs="+", default=["diag", "full"], choices=["gdpp", "diag", "full"])
    parser.add_argument("--columns", nargs="+", default=list(COLUMNS), choices=COLUMNS)
    parser.add_argument("--eval-tasks", type=int, default=1_000_000)
    parser.add_argument("--chunk-size", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=4242, help="seeds the evaluation tasks of every column")
    parser.add_argument("--full-rates", nargs="+", type=float, default=None,
                        help="widen the selected Diag models to Full and train them at these rates instead")
    parser.add_argument("--deeper", action="store_true",
                        help="deepen each selected model of --variants by one layer at every position and train "
                             "it instead")
    parser.add_argument("--steps", type=int, default=3000, help="unclipped steps for --full-rates and --deeper")
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.run in SHIPPED and (args.deeper or args.full_rates):
        run = args.run
    elif not (Path(args.run) / "models").is_dir():
        parser.error(f"{args.run} has no models/ folder; pass the --out folder of an icl-course table1 run (or, with "
                     f"--deeper or --full-rates, a shipped run: {', '.join(SHIPPED)})")
    else:
        run = Path(args.run)
    try:
        if args.full_rates:
            full_rates(run, args)
            return
        if args.deeper:
            for variant in args.variants:
                deeper(run, args, variant)
            return
    except (KeyError, Table1Error) as error:   # a cell the shipped run does not have, or a damaged models.pt
        parser.error(error.args[0] if error.args else str(error))
    for variant in args.variants:
        rows, names = [], []
        for column in args.columns:
            found = candidates(run / "models", variant, args.depth, column)
            if not found:
                continue
            kept = selected(run, variant, args.depth, column)
            models = {suffix: load_checkpoint(path, device="cpu").model.double() for suffix, path in found.items()}
            started = time.perf_counter()
            sampler = RegressionTasks(D, N, column_noise(column), dtype=torch.float64, device="cpu")
            scores = adjusted_losses(models, sampler, num_tasks=args.eval_tasks, chunk_size=args.chunk_size,
                                     seed=args.seed + COLUMNS.index(column))
            print(f"{variant} {column}: {len(models)} candidates on {args.eval_tasks} tasks in "
                  f"{time.perf_counter() - started:.0f} s", flush=True)
            names = names or list(models)
            cells = []
            for suffix in names:
                if suffix not in scores:
                    cells.append("")
                    continue
                mark = "**" if kept.endswith("-" + suffix) else ""
                cells.append(f"{mark}{scores[suffix].mean:.4f} ± {scores[suffix].stderr:.4f}{mark}")
            paper = PAPER[variant][args.depth][COLUMNS.index(column)]
            rows.append(f"| {column} | " + " | ".join(cells) + f" | {paper:g} |")
        if rows:
            print(f"\n{variant}, {args.depth} layers (bold: the candidate the run selected on its tuning sample)\n")
            print("| column | " + " | ".join(names) + " | paper |")
            print("| --- |" + " --- |" * (len(names) + 1))
            print("\n".join(rows), flush=True)
        else:
            print(f"{run / 'models'} holds no {variant} model of {args.depth} layers for the columns asked for "
                  "(a run's --out folder keeps every candidate; the shipped runs keep only models.pt)")


if __name__ == "__main__":
    main()
