"""Replace some columns of a finished Table 1 run by those of another run of the same budget.

A recipe change that touches one column (the noiseless column's light-tailed fits, ``NoiselessFit``) need not
train the other nine again: run the command on that column alone (``icl-course table1 --budget cpu --columns 0
--out PART``), then write a run whose rows and models of those columns come from ``PART`` and the rest from
``BASE``:

    python research/replace_columns.py --base icl_course/pretrained/table1_cpu --part PART --out OUT

``OUT`` gets ``results.json``, ``results.csv``, ``table.md``, ``models.pt``, ``config.json`` and ``figure.png``,
written by the package's own functions.  Its configuration is the part's (the budget as it is now), with all
the columns of both; ``results.json``'s also has ``parts``: which columns each run made, its own configuration's
budget and its seconds (``seconds`` is their sum).  Both
runs must be of the same budget; the part's budget may add settings that only touch its columns, which the
script does not check (the run's README must say what changed).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from icl_course.models import LinearTransformer
from icl_course.plots import plot_table1
from icl_course.table1 import BUDGETS, COLUMN_IDS, COLUMNS, Candidate
from icl_course.table1.files import write_json
from icl_course.table1.report import write_outputs


def read_run(folder: Path) -> tuple[dict, list, dict]:
    """A finished run's configuration, rows and models bundle."""
    results = json.loads((folder / "results.json").read_text())
    bundle = torch.load(folder / "models.pt", map_location="cpu", weights_only=True)["models"]
    return results["config"], results["rows"], bundle


def column_of(name: str) -> str:
    """The column of a model's name, e.g. ``diag-L4-u0-s0-fit`` -> ``"0"``."""
    return COLUMNS[COLUMN_IDS.index(name.split("-")[2])]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", type=Path, required=True, help="the run whose other columns are kept")
    parser.add_argument("--part", type=Path, required=True, help="a run of some columns, which replace the base's")
    parser.add_argument("--out", type=Path, required=True, help="a new folder for the combined run")
    args = parser.parse_args(argv)
    try:
        base_config, base_rows, base_models = read_run(args.base)
        part_config, part_rows, part_models = read_run(args.part)
    except (OSError, ValueError, KeyError, RuntimeError) as error:   # torch.load raises RuntimeError on a bad file
        parser.error(f"--base and --part must be finished runs' folders (results.json and models.pt): {error}")
    if base_config["budget"]["name"] != part_config["budget"]["name"]:
        parser.error(f"the runs are of different budgets: {base_config['budget']['name']!r} and "
                     f"{part_config['budget']['name']!r}")
    replaced = part_config["columns"]
    if args.out.exists() and any(args.out.iterdir()):
        parser.error(f"{args.out} is not empty; give a new folder")
    args.out.mkdir(parents=True, exist_ok=True)
    rows = [row for column in COLUMNS for row in (part_rows if column in replaced else base_rows)
            if row["column"] == column]
    bundle = {name: entry for name, entry in base_models.items() if column_of(name) not in replaced}
    bundle.update(part_models)
    selected = []
    for name, entry in bundle.items():
        model = LinearTransformer(**entry["config"], device="cpu")
        model.load_state_dict(entry["state"])
        row = next(row for row in rows if row["checkpoint"] == f"models/{name}.pt")
        selected.append(Candidate(name, row["variant"], row["depth"], row["column"], row["seed"],
                                  args.out / "models" / f"{name}.pt", model, entry["metadata"]))
    kept = [column for column in base_config["columns"] if column not in replaced]
    parts = [{"columns": kept, "run": str(args.base),
              "budget": base_config["budget"], "seconds": base_config.get("seconds")},
             {"columns": replaced, "run": str(args.part), "budget": part_config["budget"],
              "seconds": part_config.get("seconds")}]
    config = dict(part_config, columns=[column for column in COLUMNS if column in kept or column in replaced],
                  parts=parts,
                  seconds=round(sum(part["seconds"] or 0 for part in parts), 1))
    write_outputs(args.out, BUDGETS[part_config["budget"]["name"]], config, rows, selected)
    write_json(args.out / "config.json", {key: config[key] for key in ("budget", "variants", "columns", "d", "n")})
    plot_table1(rows, args.out / "figure.png")
    print(f"wrote {args.out}: columns {', '.join(replaced)} from {args.part}, the others from {args.base}")


if __name__ == "__main__":
    main()
