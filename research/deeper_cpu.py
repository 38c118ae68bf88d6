"""Table 1 beyond 3 layers on a CPU: the ``cpu`` budget's 3-layer recipe at a deeper depth.

The ``cpu`` budget trains its 4 layers from its trained 3-layer models (``Deepening(start="selected")``)
and stops there (an hour on 2 cores).  This trains one deeper depth on its own, from random weights, with
the recipe of the budget's 3-layer row (GD++: clipped steps at its rate, then the unclipped phase at 1e-4; Diag
from GD++ and Full from Diag, unclipped only), with fewer seeds to fit in minutes, and scores every
cell on 1 000 000 tasks, paired with the oracle and the baselines:

    python research/deeper_cpu.py --depth 4 --seeds 0 --out build/table1-cpu-L4

It is an ordinary ``icl-course table1`` run folder (resumed if rerun; ``results.json``, ``table.md``),
made with the budget ``cpu-deeper``, which ``config.json`` records in full.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace

from icl_course.table1 import BUDGETS, run_table1


def deeper_budget(depth: int, seeds) -> object:
    """The ``cpu`` budget with its 3-layer settings carried over to ``depth`` (and only that depth).

    Without the 3-layer row's deepened candidates (they start from the model one layer shallower, which
    a run of one depth does not train) and with every nested variant at the unclipped rate, 1e-4: the
    recipe that made the tables of ``research/README.md``, whose run folders this still resumes.
    """
    cpu = BUDGETS["cpu"]
    settings = cpu.settings(3)
    return replace(cpu, name="cpu-deeper", depths=(depth,), steps=settings["steps"],
                   learning_rate=settings["learning_rate"], warmup_steps=settings["warmup_steps"],
                   dtype=settings["dtype"], unclipped_steps=settings["unclipped_steps"],
                   nested_init=cpu.nested_init[3], nested_learning_rate=None, deepen=None, nest_from="each",
                   seeds=tuple(seeds),
                   description=f"the cpu budget's 3-layer recipe at {depth} layers, seeds {list(seeds)}")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--depth", type=int, default=4)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--out", required=True)
    arguments = parser.parse_args(argv)
    if arguments.depth < 4 or arguments.depth > 7:
        parser.error(f"--depth must be 4..7, got {arguments.depth}")
    started = time.perf_counter()
    run_table1(arguments.out, deeper_budget(arguments.depth, arguments.seeds), device=arguments.device)
    print(f"{time.perf_counter() - started:.0f} s in all")   # the table itself was printed by the run


if __name__ == "__main__":
    main()
