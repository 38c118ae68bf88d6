"""Apply the widened-candidate rule to a finished Table 1 run, from the models it kept.

The rule (``icl_course.table1.select.keeps_widened``): a Diag cell also has the model its GD++ cell keeps,
widened to the same function, as a candidate, and a Full cell the one its Diag cell keeps; the cell keeps that
widened model unless its best trained candidate is lower by more than one standard error of their paired
difference on the cell's tuning tasks.  The trained candidates are first compared among themselves by the rule
the run used, so the trained candidate the rule weighs is the one the run kept, and the rule needs no other
model than those a run ships (``models.pt``).  This script runs the package's own code on them:
``StackTrainer.offer_widened`` and ``cell_choice`` on the run's tuning tasks (the same seeds and chunks as the
command), depth by depth (a Diag cell that switches is the model the Full cell of its depth is offered), then
scores each cell that switched on the run's evaluation tasks (the same seed and chunks: every cell of a column
is scored on the very same tasks, paired with the oracle, so a cell's score does not depend on the others scored
beside it) and writes a new run folder with the package's own writers:

    python research/widened_candidates.py --base icl_course/pretrained/table1_cpu --work WORK --out NEW

``WORK`` keeps the models and the selection files (the script resumes from them); ``NEW`` gets
``results.json``, ``results.csv``, ``table.md``, ``models.pt``, ``config.json`` and ``figure.png``.

With ``--nest-from-kept`` it also retrains the nested variant where the run's budget now nests it from the model
its smaller variant's cell keeps (``Budget.nest_from = "selected"``: Full from 4 layers on, in ``cpu`` and
``gpu``): the run's trained models of that variant there go (the command no longer trains them; its fitted and
widened ones stay), and ``StackTrainer.train_stack`` trains one per cell, after the smaller cells' widened
candidates, as the command orders it.  Nothing deeper starts from a Full model, so the other cells are the
command's too.  The record goes to ``config["nested_from_kept"]`` instead of ``config["widened_rule"]``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch

from icl_course.checkpoints import save_checkpoint
from icl_course.data import RegressionTasks
from icl_course.evaluate import adjusted_losses
from icl_course.models import LinearTransformer
from icl_course.plots import plot_table1
from icl_course.table1 import BUDGETS, COLUMNS, Candidate
from icl_course.table1.budget import column_noise
from icl_course.table1.files import write_json
from icl_course.table1.paper import VARIANTS, D, N
from icl_course.table1.report import result_rows, write_outputs
from icl_course.table1.select import WIDENED, cell_choice
from icl_course.table1.training import StackTrainer


def kept_candidates(base: Path, work: Path) -> tuple[dict, list, dict[str, Candidate]]:
    """The base run's configuration, rows and kept models, written as checkpoints under ``work/models``."""
    results = json.loads((base / "results.json").read_text())
    bundle = torch.load(base / "models.pt", map_location="cpu", weights_only=True)["models"]
    candidates = {}
    for row in results["rows"]:
        if row["variant"] not in VARIANTS:
            continue
        name = Path(row["checkpoint"]).stem
        entry = bundle[name]
        model = LinearTransformer(**entry["config"], device="cpu")
        model.load_state_dict(entry["state"])
        path = work / "models" / f"{name}.pt"
        if not path.exists():   # written once: a later write would make the saved selections look stale
            save_checkpoint(path, model, metadata=entry["metadata"])
        candidates[name] = Candidate(name, row["variant"], row["depth"], row["column"], row["seed"], path, model,
                                     entry["metadata"])
    return results["config"], results["rows"], candidates


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", type=Path, required=True, help="a finished run's folder (results.json, models.pt)")
    parser.add_argument("--work", type=Path, required=True, help="a folder for the models and selections (resumed)")
    parser.add_argument("--out", type=Path, required=True, help="a new folder for the run with the rule applied")
    parser.add_argument("--nest-from-kept", action="store_true",
                        help="retrain the nested variant where the budget nests it from the smaller cell's kept model")
    args = parser.parse_args(argv)
    if args.out.exists() and any(args.out.iterdir()):
        parser.error(f"{args.out} is not empty; give a new folder")
    started = time.perf_counter()
    (args.work / "models").mkdir(parents=True, exist_ok=True)
    try:
        config, rows, kept = kept_candidates(args.base, args.work)
    except (OSError, ValueError, KeyError, RuntimeError) as error:   # torch.load raises RuntimeError on a bad file
        parser.error(f"--base must be a finished run's folder (results.json and models.pt): {error}")
    # the named budget with the run's own tuning and scoring sizes, and the rule on
    scoring = {key: config["budget"][key] for key in ("tuning_tasks", "eval_tasks", "eval_tasks_deep", "chunk_size")}
    budget = replace(BUDGETS[config["budget"]["name"]], widened_candidates=True, **scoring)
    depths = sorted({candidate.depth for candidate in kept.values()})
    trainer = StackTrainer(args.work, budget, list(VARIANTS), config["columns"], torch.device("cpu"), False,
                           lambda message: print(message, file=sys.stderr))
    trainer.candidates = dict(kept)
    retrained = [depth for depth in depths if args.nest_from_kept
                 and any(trainer.nests_from_kept(depth, variant) for variant in VARIANTS)]
    if args.nest_from_kept and not retrained:
        parser.error(f"--nest-from-kept: the {budget.name!r} budget nests no variant from the smaller cell's kept "
                     f"model at the run's depths {depths} (Budget.nest_from); leave the option out")
    for name, candidate in kept.items():   # the trained models the command no longer trains
        if candidate.depth in retrained and trainer.nests_from_kept(candidate.depth, candidate.variant) \
                and not name.endswith(("-fit", WIDENED)):
            del trainer.candidates[name]
    for depth in depths:
        late = [variant for variant in VARIANTS if depth in retrained and trainer.nests_from_kept(depth, variant)]
        for variant in [variant for variant in VARIANTS if variant not in late] + late:
            if variant in late:
                trainer.train_stack(depth, variant)
            trainer.offer_widened(depth, variant)
            print(f"offered the widened models of {variant} at {depth} layers", file=sys.stderr, flush=True)
    evaluations, switched = {}, []
    for column in config["columns"]:
        index = COLUMNS.index(column)
        old = {(row["variant"], row["depth"]): row for row in rows if row["column"] == column}
        selected, scores, new = {}, {}, {}
        for (variant, depth), row in old.items():
            if variant not in VARIANTS:
                scores[variant] = [row["adjusted_loss"], row["stderr"], row["num_tasks"], row["trimmed_mean"]]
                continue
            cell = f"{variant}-L{depth}"
            candidates = [candidate for candidate in trainer.candidates.values()
                          if (candidate.variant, candidate.depth, candidate.column) == (variant, depth, column)]
            choice = cell_choice(args.work, budget, column, cell, candidates, torch.device("cpu"))[0]
            selected[cell] = choice.name
            if choice.name == Path(row["checkpoint"]).stem:
                scores[cell] = [row["adjusted_loss"], row["stderr"], row["num_tasks"], row["trimmed_mean"]]
            else:
                new[cell] = choice.model
                switched.append((column, cell, Path(row["checkpoint"]).stem, choice.name))
        if new:
            num_tasks = next(row["num_tasks"] for row in old.values())
            sampler = RegressionTasks(D, N, column_noise(column), dtype=torch.float64, device="cpu")
            estimates = adjusted_losses(new, sampler, num_tasks=num_tasks, chunk_size=budget.chunk_size,
                                        seed=900 + index)
            scores.update({cell: [score.mean, score.stderr, score.num_tasks, score.trimmed_mean]
                           for cell, score in estimates.items()})
            print(f"scored {len(new)} switched cells of column {column}", file=sys.stderr, flush=True)
        evaluations[column] = {"selected": selected, "scores": scores, "device": "cpu"}
    rows = result_rows(budget, config["columns"], evaluations, trainer.candidates, args.work)
    seconds = time.perf_counter() - started
    record = {"script": "research/widened_candidates.py" + (" --nest-from-kept" if retrained else ""),
              "seconds": round(seconds, 1), "switched": [list(entry) for entry in switched]}
    if retrained:
        record["depths"] = retrained
    # the budget as the command now has it (its description, the settings this script applied)
    config = dict(config, budget=budget.as_dict(), seconds=round(config["seconds"] + seconds, 1),
                  **{"nested_from_kept" if retrained else "widened_rule": record})
    args.out.mkdir(parents=True, exist_ok=True)
    names = sorted({name for evaluation in evaluations.values() for name in evaluation["selected"].values()})
    write_outputs(args.out, budget, config, rows, [trainer.candidates[name] for name in names])
    write_json(args.out / "config.json", {key: config[key] for key in ("budget", "variants", "columns", "d", "n")})
    plot_table1(rows, args.out / "figure.png")
    if (args.base / "README.md").exists() and not (args.out / "README.md").exists():
        shutil.copy2(args.base / "README.md", args.out / "README.md")
    print(f"wrote {args.out}: {len(switched)} cells switched to " + ("another model" if retrained else
          "the widened model") + f" in {seconds:.0f} s")
    for column, cell, before, after in switched:
        print(f"  {column:>8} {cell}: {before} -> {after}")


if __name__ == "__main__":
    main()
