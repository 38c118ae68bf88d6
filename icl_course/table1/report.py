"""The outputs of a Table 1 run (results, table, selected models) and the reading of a run's or a shipped run's."""

from __future__ import annotations

import csv
import json
import os
from pathlib import Path
from typing import Sequence

import torch

from ..evaluate import Estimate
from ..models import LinearTransformer
from .budget import Budget, Table1Error, column_noise
from .candidate import Candidate
from .files import write_json, write_text
from .paper import BASELINES, COLUMNS, PAPER, PAPER_BASELINES, VARIANTS, cell_name, model_name


def result_rows(budget: Budget, columns: Sequence[str], evaluations: dict, candidates: dict[str, Candidate],
                out: Path) -> list[dict]:
    """One row per selected model and per baseline of every column: ours beside the paper's."""
    rows = []
    for column in columns:
        evaluation = evaluations[column]
        index = COLUMNS.index(column)
        for cell, selected in evaluation["selected"].items():
            candidate = candidates[selected]
            mean, stderr, num_tasks, trimmed = evaluation["scores"][cell]
            paper = PAPER[candidate.variant][candidate.depth][index]
            metadata = candidate.metadata
            rows.append({"model": VARIANTS[candidate.variant], "variant": candidate.variant, "depth": candidate.depth,
                         "column": column, "noise": column_noise(column).label, "adjusted_loss": mean,
                         "stderr": stderr, "num_tasks": num_tasks, "trimmed_mean": trimmed,
                         "heavy_tail": Estimate(mean, stderr, num_tasks, trimmed).heavy_tailed(),
                         "paper": paper, "budget": budget.name,
                         "seed": candidate.seed, "steps": metadata["steps"], "status": metadata["status"],
                         "wall_time_s": round(metadata["wall_time"], 2), "device": metadata["device"],
                         "dtype": metadata["dtype"],
                         "checkpoint": str(Path(candidate.path).relative_to(out))})
        for name in BASELINES:
            mean, stderr, num_tasks, trimmed = evaluation["scores"][name]
            rows.append({"model": name, "variant": name, "depth": None, "column": column,
                         "noise": column_noise(column).label, "adjusted_loss": mean, "stderr": stderr,
                         "num_tasks": num_tasks, "trimmed_mean": trimmed,
                         "heavy_tail": Estimate(mean, stderr, num_tasks, trimmed).heavy_tailed(),
                         "paper": PAPER_BASELINES[name][index], "budget": budget.name,
                         "seed": None, "steps": None, "status": "closed form", "wall_time_s": None,
                         "device": evaluation["device"], "dtype": "float64", "checkpoint": None})
    return rows


def _format(value: float) -> str:
    if value == 0:
        return "0"
    if abs(value) < 1e-3 or abs(value) >= 1e4:   # heavy-tailed cells reach 1e44: keep them one word wide
        return f"{value:.2e}"
    return f"{value:.3f}"


def markdown_table(rows: Sequence[dict]) -> str:
    """Our adjusted losses beside the paper's: one row per model, ``ours ± stderr (paper)`` per column."""
    columns = [column for column in COLUMNS if any(row["column"] == column for row in rows)]
    keys = []
    for row in rows:
        key = (row["variant"], row["depth"])
        if key not in keys:
            keys.append(key)
    keys.sort(key=lambda key: (key[1] is None, key[1] or 0, list(VARIANTS).index(key[0]) if key[0] in VARIANTS
                               else BASELINES.index(key[0])))
    lines = ["| model | " + " | ".join(columns) + " |", "| --- |" + " --- |" * len(columns)]
    for variant, depth in keys:
        label = cell_name(variant, depth) if depth is not None else variant
        cells = []
        for column in columns:
            row = next((row for row in rows if (row["variant"], row["depth"], row["column"])
                        == (variant, depth, column)), None)
            if row is None:
                cells.append("")
                continue
            mark = "" if row["status"] in ("finished", "closed form") else " (diverged)"
            mark += " (heavy tail)" if row.get("heavy_tail") and row["depth"] is not None else ""
            dagger = "†" if variant == "gdpp" and depth is not None and impossible_paper_cell(depth, column) else ""
            cells.append(f"{_format(row['adjusted_loss'])} ± {_format(row['stderr'])} "
                         f"({_format(row['paper'])}{dagger}){mark}")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    if any("†" in line for line in lines):
        lines += ["", "† The paper's GD++ is below its own ConstRR in this column. GD++ is linear in the labels and "
                  "ConstRR is the best learner that is (chapter 4, section 1), so no GD++ can be there in expectation: "
                  "that number is not a target."]
    return "\n".join(lines) + "\n"


def impossible_paper_cell(depth: int, column: str) -> bool:
    """Whether the paper's GD++ at ``depth`` in ``column`` is below the paper's ConstRR by more than its
    rounding and Monte-Carlo error (0.002): a value no label-linear learner reaches in expectation."""
    index = COLUMNS.index(column)
    return PAPER["gdpp"][depth][index] < PAPER_BASELINES["ConstRR"][index] - 0.002


def write_outputs(out: Path, budget: Budget, config: dict, rows: list[dict], selected: Sequence[Candidate]) -> None:
    """``results.json``, ``results.csv``, ``table.md`` and ``models.pt`` (the ``selected`` models) under ``out``."""
    fields = ["model", "variant", "depth", "column", "noise", "adjusted_loss", "stderr", "num_tasks",
              "trimmed_mean", "heavy_tail", "paper",
              "budget", "seed", "steps", "status", "wall_time_s", "device", "dtype", "checkpoint"]
    write_json(out / "results.json", {"config": config, "rows": rows})
    temporary = out / "results.csv.tmp"
    try:
        with open(temporary, "w", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=fields)
            writer.writeheader()
            writer.writerows(rows)
        os.replace(temporary, out / "results.csv")
    except OSError as error:
        raise Table1Error(f"could not write {out / 'results.csv'} ({error.strerror or error})") from None
    header = (f"# Table 1 (Vladymyrov et al. 2024), budget `{budget.name}`\n\n"
              f"Adjusted loss (ours ± standard error, the paper's in parentheses); {budget.description}.\n\n")
    write_text(out / "table.md", header + markdown_table(rows))
    bundle = {}
    for candidate in selected:
        model = candidate.model
        bundle[candidate.name] = {
            "config": dict(model.config),
            "state": {key: value.detach().cpu() for key, value in model.state_dict().items()},
            "metadata": {key: value for key, value in candidate.metadata.items() if key != "history"}}
    try:
        torch.save({"format": "icl-course-table1-models", "version": 1, "models": bundle}, out / "models.pt")
    except OSError as error:
        raise Table1Error(f"could not write {out / 'models.pt'} ({error.strerror or error})") from None


#: the runs shipped with the package, name -> folder (each has a README with the command that made it):
#: ``"cpu"`` (the default: depths 1-7 by this package's ``cpu`` budget) and ``"clipped"`` (depths 1-5 by an
#: earlier ``gpu`` budget that clipped the gradients to the end of training; heavy-tailed cells from 3 layers)
SHIPPED = {"cpu": Path(__file__).parent.parent / "pretrained" / "table1_cpu",
           "clipped": Path(__file__).parent.parent / "pretrained" / "table1_clipped"}
DEFAULT_RUN = "cpu"


def shipped_or_path(path, file_name: str) -> Path:
    if path is None or path in SHIPPED:
        path = SHIPPED[path or DEFAULT_RUN] / file_name
    else:
        path = Path(path)
        path = path / file_name if path.is_dir() else path
    if not path.exists():
        renamed = (" (the shipped run that an earlier `gpu` budget made is now called 'clipped')"
                   if str(path) == "gpu" else "")
        raise FileNotFoundError(f"no Table 1 {file_name} at {path}; pass the --out folder of an "
                                f"`icl-course table1` run, or a shipped run: {', '.join(map(repr, SHIPPED))}"
                                + renamed)
    return path


def _damaged(path: Path) -> Table1Error:
    return Table1Error(f"{path} could not be read: it is damaged or was not written by `icl-course table1`. "
                       "Run the same command again with its --out to rewrite it (finished models are kept), or "
                       "reinstall the package if it is a shipped run.")


def load_results(path=None) -> list[dict]:
    """The rows of a ``results.json``: of a run's folder or file, or of a shipped run, ``"cpu"`` (the
    default: depths 1-7, this package's ``cpu`` budget) or ``"clipped"`` (depths 1-5, clipped to the end)."""
    path = shipped_or_path(path, "results.json")
    try:
        return json.loads(path.read_text())["rows"]
    except (ValueError, KeyError, TypeError, UnicodeDecodeError):
        raise _damaged(path) from None


def load_table1_model(variant: str, depth: int, column: str, path=None) -> LinearTransformer:
    """The model selected for one cell of a run (``path`` as in :func:`load_results`; default: the
    shipped ``"cpu"`` run)."""
    path = shipped_or_path(path, "models.pt")
    try:
        bundle = torch.load(path, map_location="cpu", weights_only=True)["models"]
    except Exception:   # torch raises several types for a truncated or foreign file
        raise _damaged(path) from None
    prefix = model_name(variant, depth, column, 0).rsplit("-s", 1)[0] + "-s"
    matches = [name for name in bundle if name.startswith(prefix)]
    if not matches:
        why = ""
        if any(name.startswith(f"{variant}-L{depth}-") for name in bundle):   # the depth is there, this cell is not
            readme = path.parent / "README.md"
            why = (f"; this run has {variant} models of {depth} layers for other columns, but no candidate of this "
                   f"cell could be trained" + (f" ({readme} says why)" if readme.is_file() else ""))
        raise KeyError(f"no {variant} model of {depth} layers for column {column} in {path}{why}")
    entry = bundle[matches[0]]
    model = LinearTransformer(**entry["config"], device="cpu")
    model.load_state_dict(entry["state"])
    return model
