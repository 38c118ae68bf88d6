"""The command ``icl-course table1``: the interface of :func:`~icl_course.table1.run_table1`, which also
draws the run's figure (:func:`icl_course.plots.plot_table1`)."""

from __future__ import annotations

import argparse
import sys

from ..checkpoints import CheckpointError
from ..plots import plot_table1
from .budget import BUDGETS, Table1Error
from .paper import COLUMNS, VARIANTS
from .report import markdown_table
from .run import run_in_jobs, run_table1


def main(argv=None) -> int:
    """``icl-course table1 --budget {quick,cpu,gpu,paper} --device auto --out DIR``."""
    parser = argparse.ArgumentParser(
        prog="icl-course table1",
        description="Reproduce Table 1 of Vladymyrov et al. (2024): train GD++, Diag and Full linear transformers "
                    "on ten mixed-noise problems, score them against ConstRR, AdaRR and TunedRR.")
    parser.add_argument("--budget", choices=list(BUDGETS), default="quick",
                        help="; ".join(f"{name}: {budget.description}" for name, budget in BUDGETS.items()))
    parser.add_argument("--device", default="auto", help="auto (CUDA, then MPS, then CPU), cpu, cuda, ...")
    parser.add_argument("--out", required=True, help="the output folder (resumed if it holds the same run)")
    parser.add_argument("--variants", nargs="+", choices=list(VARIANTS), help="default: all three")
    parser.add_argument("--depths", nargs="+", type=int, help="default: the budget's")
    parser.add_argument("--columns", nargs="+", choices=list(COLUMNS), help="default: all ten")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument("--jobs", type=int, default=1,
                        help="train in this many processes side by side (faster on a GPU: 6 for the whole table), "
                             "each into a folder under OUT/jobs, then score in OUT; run again to resume")
    parser.add_argument("--time-limit", type=float, help="with --jobs: seconds before training stops (resumable)")
    args = parser.parse_args(argv)
    if args.jobs != 1 and (args.variants or args.columns):
        parser.error("--jobs trains every variant and column; leave out --variants and --columns")
    if args.time_limit is not None and args.jobs == 1:
        parser.error("--time-limit goes with --jobs N")
    try:
        if args.jobs != 1:
            rows = run_in_jobs(args.out, args.budget, args.device, args.jobs, args.depths, args.time_limit,
                               figure=plot_table1)
        else:
            rows = run_table1(args.out, args.budget, args.device, args.variants, args.depths, args.columns,
                              progress=not args.no_progress, figure=plot_table1)
    except (Table1Error, CheckpointError) as error:
        print(f"icl-course table1: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"\nicl-course table1: interrupted; run the same command again to resume from {args.out}",
              file=sys.stderr)
        return 130
    print(markdown_table(rows))
    print(f"results, table and figure in {args.out}")
    return 0
