"""Running Table 1 end to end (:func:`run_table1`), and gathering runs made in parts (:func:`merge_runs`)."""

from __future__ import annotations

import platform
import shutil
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Callable, Optional, Sequence

import torch

from ..runtime import resolve_device
from .budget import BUDGETS, Budget, Table1Error, check_run
from .files import prepare_out, seconds_so_far
from .paper import COLUMNS, VARIANTS, D, N, model_name
from .report import result_rows, write_outputs
from .select import evaluate_column
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
    (with every deepened candidate of those depths the runs finished), whose ``config.json`` then names
    exactly those depths; scoring ``out`` with the ordinary command
    and ``--depths`` of the returned tuple trains nothing and only tunes, selects and evaluates.
    Returns the depths gathered (empty if not even 1 layer was finished everywhere).
    """
    if budget not in BUDGETS:
        raise Table1Error(f"unknown budget {budget!r}; choose one of {', '.join(BUDGETS)}")
    models = {path.name: path for folder in folders for path in Path(folder).glob("models/*.pt")}
    chosen = BUDGETS[budget]
    depths = []
    for depth in chosen.depths:
        names = [f"{model_name(v, depth, c, s)}.pt" for v in VARIANTS for c in COLUMNS for s in chosen.seeds_at(depth)]
        if not all(name in models for name in names):
            break
        depths.append(depth)
    if not depths:
        return ()
    out = Path(out)
    config = {"budget": replace(chosen, depths=tuple(depths)).as_dict(), "variants": list(VARIANTS),
              "columns": list(COLUMNS), "d": D, "n": N}
    prepare_out(out, config)
    for depth in depths:
        seeds = chosen.seeds_at(depth)
        for name in (f"{model_name(v, depth, c, s)}.pt" for v in VARIANTS for c in COLUMNS for s in seeds):
            shutil.copy2(models[name], out / "models" / name)
        # the deepened candidates (and those nested from them) the runs finished, so scoring does not retrain them
        for name in (f"{model_name(v, depth, c, s)}-d" for v in VARIANTS for c in COLUMNS for s in seeds):
            for found in models:
                if found.startswith(name) and found[len(name):-len(".pt")].isdigit():
                    shutil.copy2(models[found], out / "models" / found)
    return tuple(depths)
