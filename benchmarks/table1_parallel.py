"""Table 1 in several processes side by side on one GPU, then scored in one folder.

One stack of tiny models is launch-bound on a GPU (a step is a few hundred kernels of microseconds
each), so six processes sharing the card train about three times as fast as one.  This is how the
results shipped in ``icl_course/pretrained/table1`` were made, on one H100:

    python benchmarks/table1_parallel.py --budget gpu --out build/gpu-table --time-limit 530

Each process trains one variant on half of the columns (``icl-course table1 --variants V --columns
...``) into a folder of its own; rerunning resumes them.  A budget with nested starts (Diag from the
trained GD++, Full from Diag: the ``cpu`` budget) keeps the three variants in one process per half.
Then every model of the depths that all processes finished is copied into ``--out`` and scored there
with the ordinary command (which finds the models trained and only tunes, selects and evaluates).  The
models are not bit-identical to a one-process run (the task stream of a stack depends on which models
share it); the recipe, budget and seeds are the same.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from icl_course.table1 import BUDGETS, COLUMNS, VARIANTS, merge_runs

HALVES = {"a": COLUMNS[:5], "b": COLUMNS[5:]}


def train_in_parallel(budget: str, work: Path, device: str, time_limit: float) -> None:
    # a budget with nested starts trains Diag from GD++ and Full from Diag in the same folder, so its
    # variants stay together in one process per half of the columns
    nested = any(BUDGETS[budget].settings(depth)["nested_init"] for depth in BUDGETS[budget].depths)
    groups = {"all": list(VARIANTS)} if nested else {variant: [variant] for variant in VARIANTS}
    processes = []
    for group, variants in groups.items():
        for half, columns in HALVES.items():
            command = [sys.executable, "-m", "icl_course", "table1", "--budget", budget, "--device", device,
                       "--variants", *variants, "--columns", *columns, "--out", str(work / f"{group}-{half}"),
                       "--no-progress"]
            processes.append(subprocess.Popen(command))
    for process in processes:
        try:
            process.wait(timeout=time_limit)
        except subprocess.TimeoutExpired:   # finished models are on disk; a rerun resumes the rest
            process.kill()
            process.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", default="gpu", choices=list(BUDGETS))
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--out", required=True, help="the folder the merged table is scored in")
    parser.add_argument("--work", default="build/table1-parallel", help="the processes' own folders")
    parser.add_argument("--time-limit", type=float, default=None, help="seconds before training stops")
    arguments = parser.parse_args()
    work, out = Path(arguments.work), Path(arguments.out)
    train_in_parallel(arguments.budget, work, arguments.device, arguments.time_limit)
    depths = merge_runs(sorted(work.glob("*-[ab]")), out, arguments.budget)
    if not depths:
        sys.exit("no depth was finished by every process; run again to resume")
    subprocess.run([sys.executable, "-m", "icl_course", "table1", "--budget", arguments.budget, "--device",
                    arguments.device, "--depths", *map(str, depths), "--out", str(out), "--no-progress"], check=True)


if __name__ == "__main__":
    main()
