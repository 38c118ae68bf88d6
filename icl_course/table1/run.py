"""Running Table 1 end to end (:func:`run_table1`), in several processes side by side (:func:`run_in_jobs`,
the command's ``--jobs N``), and gathering runs made in parts (:func:`merge_runs`)."""

from __future__ import annotations

import json
import platform
import shutil
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Callable, Optional, Sequence

import torch

from ..models import NESTED
from ..runtime import resolve_device
from .budget import BUDGETS, NESTED_FROM_KEPT, Budget, Table1Error, check_run, deepened_tags, naming_seed
from .files import prepare_out, seconds_so_far, write_json
from .paper import COLUMNS, VARIANTS, D, N, model_name
from .report import result_rows, write_outputs
from .select import WIDENED, evaluate_column
from .training import StackTrainer


def run_table1(out, budget: str | Budget = "quick", device: str = "auto", variants: Optional[Sequence[str]] = None,
               depths: Optional[Sequence[int]] = None, columns: Optional[Sequence[str]] = None,
               progress: bool = True, verbose: bool = True, figure: Optional[Callable] = None,
               **overrides) -> list[dict]:
    """Train, tune and score Table 1 into the folder ``out``; returns the rows of ``results.json``.

    Args:
        out: the folder for everything (created; resumed when it holds a run of the same configuration).
        budget: ``"quick"``, ``"cpu"``, ``"gpu"``, ``"paper"`` or a :class:`Budget`.
        device: ``"auto"``, ``"cpu"``, ``"cuda"``, ...
        variants, depths, columns: restrict the table (default: all of the budget).
        figure: draws ``figure.png``, called as ``figure(rows, out / "figure.png")``: the command passes
            :func:`icl_course.plots.plot_table1` (None: no figure).
        overrides: replace fields of the budget, e.g. ``steps=20, eval_tasks=2000`` for a test.
    """
    budget, variants, columns = check_run(budget, variants, depths, columns, overrides)
    try:
        device = resolve_device(device)
    except ValueError as error:
        raise Table1Error(str(error)) from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise Table1Error("--device cuda was asked for, but torch sees no CUDA GPU; use --device auto or cpu")
    out = Path(out)
    config = {"budget": budget.as_dict(), "variants": variants, "columns": columns, "d": D, "n": N}
    prepare_out(out, config)

    def log(message):
        if verbose:
            print(message, file=sys.stderr)

    started = time.perf_counter()
    candidates = StackTrainer(out, budget, variants, columns, device, progress, log).train_all()
    evaluations = {}
    for column in columns:
        cells = {}
        for candidate in candidates.values():
            if candidate.column == column:
                cells.setdefault(candidate.cell, []).append(candidate)
        evaluations[column] = evaluate_column(out, budget, column, cells, device, log)
    rows = result_rows(budget, columns, evaluations, candidates, out)
    selected = sorted({name for evaluation in evaluations.values() for name in evaluation["selected"].values()})
    # the run's wall time: this call's plus that of the calls before it that wrote results (a call killed
    # before writing is not counted; every model's own training time is in its row)
    seconds = time.perf_counter() - started + seconds_so_far(out)
    config_out = dict(config, device=str(device), torch=torch.__version__, python=platform.python_version(),
                      seconds=round(seconds, 1))
    write_outputs(out, budget, config_out, rows, [candidates[name] for name in selected])
    if figure is not None:
        try:
            figure(rows, out / "figure.png")
        except OSError as error:
            raise Table1Error(f"could not write {out / 'figure.png'} ({error.strerror or error})") from None
    shutil.rmtree(out / "sweeps", ignore_errors=True)
    return rows


def merge_runs(folders: Sequence, out, budget: str = "gpu") -> tuple:
    """Gather the models that separate runs trained (each on some variants or columns) into ``out``.

    ``folders`` are ``--out`` folders of ``icl-course table1`` runs of one ``budget``, for instance
    one process per variant on one GPU (````icl-course table1 --jobs N````).  Every depth that those
    runs finished for all variants, columns and seeds, from the shallowest on, is copied into ``out``
    (with every deepened candidate and noiseless fit of those depths the runs finished), whose ``config.json``
    then names exactly those depths; scoring ``out`` with the ordinary command and ``--depths`` of the returned
    tuple trains nothing and only tunes, selects and evaluates.
    Returns the depths gathered (empty if not even 1 layer was finished everywhere).
    """
    if budget not in BUDGETS:
        raise Table1Error(f"unknown budget {budget!r}; choose one of {', '.join(BUDGETS)}")
    models = {path.name: path for folder in folders for path in Path(folder).glob("models/*.pt")}
    chosen = BUDGETS[budget]
    depths = []
    for depth in chosen.depths:
        if not all(name in models for name in _required(chosen, depth)):
            break
        depths.append(depth)
    if not depths:
        return ()
    out = Path(out)
    config = {"budget": replace(chosen, depths=tuple(depths)).as_dict(), "variants": list(VARIANTS),
              "columns": list(COLUMNS), "d": D, "n": N}
    _forget_fewer_depths(out / "config.json", config)
    prepare_out(out, config)
    for depth in depths:
        for name in _required(chosen, depth):
            shutil.copy2(models[name], out / "models" / name)
        # the deepened candidates (and those nested from them) the runs finished, so scoring does not retrain them
        seeds = chosen.seeds_at(depth) or (naming_seed(chosen, depth - 1),)
        for name in (f"{model_name(v, depth, c, s)}-d" for v in VARIANTS for c in COLUMNS for s in seeds):
            for found in models:
                if found.startswith(name) and found[len(name):-len(".pt")].isdigit():
                    shutil.copy2(models[found], out / "models" / found)
        # and the noiseless column's fits (NoiselessFit) and the widened candidates, with their times: the models
        # deepened from a fit or nested from a widened one are not trained again, and neither is made again
        for found in models:
            if found.endswith(("-fit.pt", f"{WIDENED}.pt")) and found.split("-")[1] == f"L{depth}":
                shutil.copy2(models[found], out / "models" / found)
    return tuple(depths)


def _required(budget: Budget, depth: int) -> list[str]:
    """The model files a depth needs in every cell: its seeds' models, or, for a depth that only deepens the
    shallower models, every deepened candidate and every one nested from them; a variant nested from the model
    its smaller cell keeps (``Budget.nest_from``), its one model per cell."""
    seeds, settings = budget.seeds_at(depth), budget.settings(depth)
    kept = [v for v in VARIANTS if NESTED.index(v) and v in settings["nested_init"]
            and settings["nest_from"] == "selected"]
    names = [f"{model_name(v, depth, c, naming_seed(budget, depth))}{NESTED_FROM_KEPT}.pt" for v in kept
             for c in COLUMNS]
    if seeds:
        return [f"{model_name(v, depth, c, s)}.pt" for v in VARIANTS if v not in kept for c in COLUMNS
                for s in seeds] + names
    seed = naming_seed(budget, depth - 1)
    return [f"{model_name(v, depth, c, seed)}{tag}.pt" for v in VARIANTS for c in COLUMNS
            for tag in deepened_tags(budget, depth, v, list(VARIANTS))] + names


def _forget_fewer_depths(path: Path, config: dict) -> None:
    """A merged folder gathered before the runs finished more depths takes the new depths (its models are
    copies, replaced by the merge, and its scores are redone for the new candidates)."""
    try:
        saved = json.loads(path.read_text())
    except (OSError, ValueError):
        return
    def without_depths(data):
        return dict(data, budget=dict(data["budget"], depths=None, description=None))

    if isinstance(saved, dict) and isinstance(saved.get("budget"), dict) and \
            without_depths(saved) == without_depths(config):
        write_json(path, config)


def job_groups(budget: str, jobs: int) -> list[tuple[str, list, list]]:
    """How ``jobs`` processes share the table: ``[(folder name, variants, columns)]``.

    One stack of tiny models is launch-bound on a GPU, so processes side by side train faster than one.
    From 3 jobs on each variant gets its own processes, each on a contiguous part of the columns (6 jobs: one
    per variant and half of the columns, how the shipped ``gpu`` run was made); with fewer, or for a budget
    with nested starts (Diag from the trained GD++, Full from Diag), the variants stay together and only the
    columns are split.  Never more processes than ``jobs``, nor than one per column and variant group.
    """
    if budget not in BUDGETS:
        raise Table1Error(f"unknown budget {budget!r}; choose one of {', '.join(BUDGETS)}")
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise Table1Error(f"--jobs takes a number of processes, 1 or more; got {jobs!r}")
    chosen = BUDGETS[budget]
    nested = any(chosen.settings(depth)["nested_init"] for depth in chosen.depths)
    together = nested or jobs < len(VARIANTS)
    groups = {"all": list(VARIANTS)} if together else {variant: [variant] for variant in VARIANTS}
    parts = min(len(COLUMNS), max(1, jobs // len(groups)))
    size, extra = divmod(len(COLUMNS), parts)
    bounds = [sum(size + (index < extra) for index in range(part)) for part in range(parts + 1)]
    return [(f"{group}-{part}", variants, list(COLUMNS[bounds[part]:bounds[part + 1]]))
            for group, variants in groups.items() for part in range(parts)]


def run_in_jobs(out, budget: str = "gpu", device: str = "auto", jobs: int = 6,
                depths: Optional[Sequence[int]] = None, time_limit: Optional[float] = None, verbose: bool = True,
                figure: Optional[Callable] = None) -> list[dict]:
    """Train the table in ``jobs`` processes of the command side by side (:func:`job_groups`), each into a
    folder of its own under ``out/jobs``, then gather (:func:`merge_runs`) and score the depths they all
    finished in ``out``; returns its rows.

    Run again with the same arguments to resume (after ``time_limit`` seconds the processes are stopped;
    finished models are kept).  The models are not bit-identical to a one-process run: a stack's task
    stream depends on which models share it; the recipe, budget and seeds are the same.
    """
    groups = job_groups(budget, jobs)
    work = Path(out) / "jobs"
    processes = []
    for name, variants, columns in groups:
        command = [sys.executable, "-m", "icl_course", "table1", "--budget", budget, "--device", device,
                   "--variants", *variants, "--columns", *columns, "--out", str(work / name), "--no-progress"]
        if depths:
            command += ["--depths", *map(str, depths)]
        processes.append(subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=None if verbose
                                          else subprocess.DEVNULL))
    deadline = None if time_limit is None else time.monotonic() + time_limit    # one limit for all of them
    for process in processes:
        try:
            process.wait(timeout=None if deadline is None else max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:   # finished models are on disk; a rerun resumes the rest
            process.kill()
            process.wait()
    gathered = merge_runs(sorted(work / name for name, _, _ in groups), out, budget)
    if not gathered:
        raise Table1Error(f"no depth was finished by every one of the {len(groups)} jobs; run the same command "
                          f"again to resume from {out}")
    return run_table1(out, budget, device, depths=gathered, progress=False, verbose=verbose, figure=figure)
