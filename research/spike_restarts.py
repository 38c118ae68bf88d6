"""How often the spike rule stops a deepened noiseless model, and whether restarts save it.

The clipped phase of a Table 1 model skips a step whose loss is above 100 times its running median, and gives
the model up after 50 skipped steps in a row (``icl_course.sweep``).  A skipped step leaves the weights where
they are, so a model that has drifted to weights where every batch breaks the rule stays there until it is given
up.  ``train_sweep(restarts=k)`` sends such a model back to the end of its last logging window without a
skipped step, at half its rate, up to ``k`` times.

This script takes one model of a run (a shipped run's selected model, ``--run cpu``, or any candidate of a run
folder, ``--run DIR --start NAME``), inserts a pass-through layer before ``--position`` (as the budget's
``Deepening`` does), and trains ``--copies`` copies of it in one stack, each on its own batches, with the budget's
clipped phase (2 000 steps, warm-up 100, cosine from 1e-3 to 1% of it, clipping at norm 1, batch 512,
float32), once for every value of ``--restarts``.  For every copy it prints how its training ended, its restarts
(the step, the step it went back to, its rate factor after) and its mean on ``--tasks`` stretched tuning tasks
of the column (``icl_course.table1.select.tuning_sampler``), the ones a deep noiseless cell is picked on:

    python research/spike_restarts.py --run DIR --start diag-L6-u0-s0-d4 --copies 8 --restarts 0 3
    python research/spike_restarts.py --run cpu --variant diag --depth 6 --copies 8 --restarts 0 3

The copies of one call share the task stream's seed, so with and without restarts they see the same batches
until a copy leaves the stack (stopped): from then on the others draw other batches.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from icl_course.checkpoints import load_checkpoint
from icl_course.evaluate import adjusted_losses
from icl_course.models import deepen
from icl_course.sweep import ModelSpec, train_sweep
from icl_course.table1 import COLUMN_IDS, COLUMNS, SHIPPED, Deepening, N, column_noise, load_table1_model
from icl_course.table1.select import tuning_sampler


def starting_model(args) -> tuple[torch.nn.Module, str]:
    """The model the copies deepen, and what it is."""
    if args.run in SHIPPED:
        if args.start:
            raise SystemExit("--start names a candidate of a run folder; with a shipped run give --variant and "
                             "--depth, and its selected model of that cell is used")
        try:
            model = load_table1_model(args.variant, args.depth, args.column, args.run)
        except KeyError as error:   # a cell the run does not have: its message names what there is
            raise SystemExit(error.args[0]) from None
        return model, f"the {args.run} run's selected {args.variant} model of {args.depth} layers, column {args.column}"
    path = Path(args.run) / "models" / f"{args.start}.pt"
    if not args.start or not path.exists():
        raise SystemExit(f"--run DIR needs --start NAME of a model in DIR/models/ ({path} not found)")
    return load_checkpoint(path, device="cpu").model, str(path)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", default="cpu", help="a shipped run's name or a run folder (default: cpu)")
    parser.add_argument("--start", default="", help="with a run folder: the model to deepen, e.g. diag-L6-u0-s0-d4")
    parser.add_argument("--variant", default="diag", choices=("gdpp", "diag"))
    parser.add_argument("--depth", type=int, default=6, help="with a shipped run: the depth of the model to deepen")
    parser.add_argument("--column", default="0", choices=COLUMNS)
    parser.add_argument("--position", type=int, default=0, help="the new layer goes before this layer (default 0)")
    parser.add_argument("--copies", type=int, default=8)
    parser.add_argument("--restarts", type=int, nargs="+", default=[0, 3])
    parser.add_argument("--tasks", type=int, default=100_000, help="stretched tuning tasks per copy")
    parser.add_argument("--seed", type=int, default=0, help="the task stream's seed")
    args = parser.parse_args(argv)
    model, what = starting_model(args)
    config = model.config
    depth = config["num_layers"] + 1
    phase = Deepening()
    print(f"{args.copies} copies of {what} with a pass-through layer before layer {args.position} ({depth} layers), "
          f"column {args.column}: {phase.steps} clipped steps from {phase.learning_rate:g}, each on its own batches")
    for restarts in args.restarts:
        specs = [ModelSpec(f"copy {k}", column_noise(args.column), seed=0, num_steps=phase.steps,
                           learning_rate=phase.learning_rate, warmup_steps=phase.warmup_steps,
                           init=deepen(model, args.position)) for k in range(args.copies)]
        started = time.perf_counter()
        trained = train_sweep(specs, d=config["d"], n=N, num_layers=depth, parameterization=config["parameterization"],
                              batch_size=512, clip_norm=1.0, final_fraction=0.01, dtype="float32", device="cpu",
                              seed=args.seed, restarts=restarts, progress=False)
        seconds = time.perf_counter() - started
        scores = adjusted_losses({name: result.model for name, result in trained.items()},
                                 tuning_sampler(args.column, True, "cpu"), num_tasks=args.tasks, chunk_size=10_000,
                                 seed=700 + COLUMNS.index(args.column))
        print(f"\nrestarts={restarts} (trained in {seconds:.0f} s; column {COLUMN_IDS[COLUMNS.index(args.column)]}):")
        for name, result in trained.items():
            score = scores[name]
            went_back = "; ".join(f"at {step} back to {back}, rate x{factor:g}"
                                  for step, back, factor in result.restarts)
            print(f"  {name}: {result.status} after {result.steps} steps, last window {result.final_loss:.3g}; "
                  f"restarts: {went_back or 'none'}; stretched tasks {score.mean:.3g} ± {score.stderr:.2g}")


if __name__ == "__main__":
    main()
