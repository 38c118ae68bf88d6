"""Scoring a Table 1 run: tune the baselines, keep each cell's best candidate, score everything.

Each column's result is saved under ``evaluation/`` and each cell's choice under ``selections/``, so a
resumed run redoes neither.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Optional, Sequence

import torch

from ..baselines import AdaRR, ConstRR, TunedRR
from ..data import RegressionTasks, StretchedTasks
from ..evaluate import Estimate, adjusted_losses, paired_adjusted_losses
from .budget import Budget, column_noise
from .candidate import Candidate
from .files import write_json
from .paper import COLUMN_IDS, COLUMNS, D, N

#: a deep cell's candidate counts as light-tailed when its standard error on the tuning tasks is at most this
#: share of its mean: the same bound the table uses to flag a heavy tail (:meth:`Estimate.heavy_tailed`)
LIGHT_TAIL_STDERR = 0.02
#: the columns whose deep cells compare their candidates on tasks drawn from
#: :class:`~icl_course.data.StretchedTasks` (weighted back to the column's law) rather than plain ones: in the
#: noiseless column the losses are so small that tasks rarer than one in a million, with an unusually large
#: eigenvalue of ``Sigma``, decide the mean, and a plain million tuning tasks rarely meets them
STRETCHED_COLUMNS = ("0",)
#: ... truncated at this largest eigenvalue of ``Sigma`` (``d = 10``, ``n = 20``: of the order of one task in 20
#: million is above it, 20 plain millions held one at 112, research/README.md; the median is about 49): beyond it
#: every deep trained model's polynomial explodes, so the comparison is on the spectra a sample of practical size meets
STRETCHED_CAP = 110.0
#: the name ending of a Diag or Full cell's candidate that is the model the cell of the smaller variant keeps
#: (GD++ for Diag, Diag for Full), widened to the same function (:func:`~icl_course.models.widen`)
WIDENED = "-widened"
#: ... which the cell keeps unless its best trained candidate is lower by more than this many standard errors
#: of their paired difference on the tuning tasks (the one-standard-error rule of model selection: the
#: simpler model, unless the richer one is clearly better)
WIDENED_MARGIN = 1.0


def tuning_sampler(column: str, deep: bool, device) -> RegressionTasks:
    """The tasks a cell's candidates are compared on: the column's law, or (a deep cell of a column in
    ``STRETCHED_COLUMNS``) :class:`~icl_course.data.StretchedTasks` of that law, truncated at ``STRETCHED_CAP``."""
    if deep and column in STRETCHED_COLUMNS:
        return StretchedTasks(D, N, column_noise(column), largest_eigenvalue_cap=STRETCHED_CAP, dtype=torch.float64,
                              device=device)
    return RegressionTasks(D, N, column_noise(column), dtype=torch.float64, device=device)


def pick_candidate(scores: dict[str, Estimate], deep: bool, stretched: bool = False,
                   plain: Optional[dict[str, Estimate]] = None) -> str:
    """The candidate of a cell with the lowest mean on the tuning sample (``scores``: name -> Estimate).

    With ``plain``, the same candidates' scores (with trimmed means) on a plain million of the column's law, as
    a deep cell of a column of ``STRETCHED_COLUMNS`` has them: the candidates that pass the table's own
    heavy-tail test there (:meth:`Estimate.heavy_tailed`) compete first, on that mean; only when none passes
    do the rules below pick.

    For a deep cell, scored on a million tasks, only among the candidates whose standard error is at most
    ``LIGHT_TAIL_STDERR`` (2%) of their mean, if there are any: a larger one is the mark of a heavy tail, whose
    mean that many tasks do not pin down (a few tasks in a million carry it).  On stretched tuning tasks
    (``stretched``) the rare tasks are drawn on purpose and weighted back, so a standard error there rests on
    many of them and is an honest one, whatever its size: the candidates compete on their upper bound, the mean
    plus two standard errors, and a better model whose error is larger is not passed over for a worse one with
    a small error.  A mean that is not finite never wins.
    """
    light = {name: score.mean for name, score in (plain or {}).items() if not score.heavy_tailed()}
    if light:
        return min(light, key=light.get)
    if stretched:
        bounds = {name: (score.mean + 2 * score.stderr if math.isfinite(score.mean + score.stderr) else math.inf)
                  for name, score in scores.items()}
        return min(bounds, key=bounds.get)
    if deep:
        light = {name: score for name, score in scores.items()
                 if score.stderr <= LIGHT_TAIL_STDERR * abs(score.mean)}
        scores = light or scores
    means = {name: (score.mean if math.isfinite(score.mean) else math.inf) for name, score in scores.items()}
    return min(means, key=means.get)


def keeps_widened(difference: Estimate, trained: Estimate, widened: Estimate, deep: bool) -> bool:
    """Whether a cell keeps the smaller variant's model, widened, over its best trained candidate.

    ``difference``: the paired ``loss(trained) - loss(widened)`` on the tuning tasks; ``trained`` and
    ``widened``: their own scores there.  A larger variant contains the smaller one, so a trained model that
    is not better than the smaller variant's by more than ``WIDENED_MARGIN`` standard errors of the difference
    is no evidence for the extra freedom (in the shipped ``cpu`` run the best trained Full of 45 of the 54 noisy
    cells of 2-7 layers was above the Diag it contains on the tuning tasks: research/README.md).  Exceptions: the
    same function (a difference of exactly 0: nothing to choose), a widened mean that is not finite where the
    trained one is, and in a deep cell a widened model that fails the light-tail bound (``LIGHT_TAIL_STDERR``)
    where the trained one passes.
    """
    if difference.mean == 0 and difference.stderr == 0:
        return False
    if not math.isfinite(widened.mean) and math.isfinite(trained.mean):
        return False
    if deep and widened.stderr > LIGHT_TAIL_STDERR * abs(widened.mean) \
            and trained.stderr <= LIGHT_TAIL_STDERR * abs(trained.mean):
        return False
    return not difference.mean < -WIDENED_MARGIN * difference.stderr


def choose(scores: dict[str, Estimate], deep: bool, stretched: bool, plain: dict[str, Estimate],
           differences: dict[str, Estimate], widened: Optional[str]) -> str:
    """A cell's pick: :func:`pick_candidate` among its trained candidates, then :func:`keeps_widened` against the
    candidate ``widened`` (None: the cell has none; ``differences``: each candidate's paired difference from
    it)."""
    trained = [name for name in scores if name != widened]
    if not trained:
        return widened
    chosen = pick_candidate({name: scores[name] for name in trained}, deep, stretched,
                            {name: score for name, score in plain.items() if name != widened})
    if widened is not None and keeps_widened(differences[chosen], scores[chosen], scores[widened], deep):
        return widened
    return chosen


def newer_than(path: Path, candidates: Sequence[Candidate]) -> bool:
    """Whether the saved file ``path`` was written after every candidate's model: a result saved before a
    candidate was trained again describes another model and must be redone."""
    written = path.stat().st_mtime
    return all(not candidate.path.exists() or candidate.path.stat().st_mtime <= written for candidate in candidates)


def cell_choice(out: Path, budget: Budget, column: str, cell: str, candidates: Sequence[Candidate],
                device) -> tuple[Candidate, dict]:
    """The candidate a cell keeps and ``{name: [mean, stderr, tasks]}``, the tuning scores it was picked by.

    Every candidate is scored on the column's tuning tasks (a cell of 3 layers or more on ``eval_tasks_deep``
    of them: a deep model's mean can hang on one task in a million; in a column of ``STRETCHED_COLUMNS``, drawn
    by :func:`tuning_sampler`, and on as many plain ones for the heavy-tail test) and :func:`pick_candidate`
    chooses among the trained ones; a Diag or Full cell then keeps the smaller variant's model, widened (its
    candidate named ``...-widened``), unless the trained pick beats it clearly (:func:`keeps_widened`).  The
    choice is saved in ``selections/`` and read back while the candidates stay the same and none was trained
    again since (the saved scores are then picked from again, by the current rule): a deeper model that
    starts from it and the evaluation see the same one.
    """
    usable = [candidate for candidate in candidates if candidate.finished] or list(candidates)
    by_name = {candidate.name: candidate for candidate in usable}
    if len(usable) == 1:
        return usable[0], {}
    widened = next((name for name in by_name if name.endswith(WIDENED)), None)
    path = out / "selections" / f"{cell}-{COLUMN_IDS[COLUMNS.index(column)]}.json"
    deep_cell = usable[0].depth >= 3
    sampler = tuning_sampler(column, deep_cell, device)
    stretched = isinstance(sampler, StretchedTasks)
    # scores on other tasks than the rule's are redone
    law = f"{sampler!r} and plain" if stretched else "plain"
    if path.exists():
        saved = json.loads(path.read_text())
        if saved.get("candidates") == list(by_name) and newer_than(path, usable) \
                and saved.get("tuning", "plain") == law:
            plain = {name: Estimate(*score[:2], int(score[2]), score[3])
                     for name, score in saved.get("plain_scores", {}).items()}
            differences = {name: Estimate(*score[:2], int(score[2]))
                           for name, score in saved.get("differences", {}).items()}
            chosen = choose({name: Estimate(*score[:2], int(score[2])) for name, score in saved["scores"].items()},
                            deep_cell, stretched, plain, differences, widened)
            if chosen != saved["selected"]:
                write_json(path, dict(saved, selected=chosen))
            return by_name[chosen], saved["scores"]
    models = {name: candidate.model.to(device) for name, candidate in by_name.items()}
    num_tasks = max(budget.tuning_tasks, budget.eval_tasks_deep) if deep_cell else budget.tuning_tasks
    scores, differences = paired_adjusted_losses(models, sampler, widened, chunk_size=budget.chunk_size,
                                                 seed=700 + COLUMNS.index(column), num_tasks=num_tasks)
    plain = adjusted_losses(models, tuning_sampler(column, False, device), chunk_size=budget.chunk_size,
                            seed=1100 + COLUMNS.index(column), num_tasks=num_tasks) if stretched else {}
    chosen = choose(scores, deep_cell, stretched, plain, differences, widened)
    scores = {name: [score.mean, score.stderr, score.num_tasks] for name, score in scores.items()}
    saved = {"cell": cell, "column": column, "candidates": list(by_name), "selected": chosen, "scores": scores,
             "tuning": law}
    if differences:
        saved["differences"] = {name: [score.mean, score.stderr, score.num_tasks]
                                for name, score in differences.items()}
    if plain:
        saved["plain_scores"] = {name: [score.mean, score.stderr, score.num_tasks, score.trimmed_mean]
                                 for name, score in plain.items()}
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json(path, saved)
    return by_name[chosen], scores


def evaluate_column(out: Path, budget: Budget, column: str, cells: dict[str, list[Candidate]], device,
                    log) -> dict:
    """Tune the baselines, pick each cell's best candidate, score everything paired with the oracle.

    ``cells``: ``{cell: [candidates]}`` of this column.  Returns (and saves) the column's evaluation:
    the candidates, the selected one of each cell, the tuning scores and ``scores``, ``{cell or baseline:
    [mean, stderr, tasks, trimmed mean]}`` of the adjusted loss on a fresh sample (the trimmed mean leaves
    out the worst 0.01% of the tasks: :class:`~icl_course.evaluate.Estimate`).  A saved evaluation without
    trimmed means, made before they were recorded, is scored again, and so is one older than a candidate's
    model or whose cells now keep other candidates.
    """
    index = COLUMNS.index(column)
    path = out / "evaluation" / f"{COLUMN_IDS[index]}.json"
    names = {cell: [candidate.name for candidate in candidates] for cell, candidates in cells.items()}
    if path.exists():
        saved = json.loads(path.read_text())
        if saved.get("candidates") == names and all(len(score) == 4 for score in saved["scores"].values()) \
                and newer_than(path, [candidate for candidates in cells.values() for candidate in candidates]) \
                and saved["selected"] == {cell: cell_choice(out, budget, column, cell, candidates, device)[0].name
                                          for cell, candidates in cells.items()}:
            return saved
    started = time.perf_counter()
    noise = column_noise(column)
    tuning_sampler = RegressionTasks(D, N, noise, dtype=torch.float64, device="cpu")
    tuning = tuning_sampler.sample(budget.tuning_tasks, seed=500 + index)
    constant, tuned = ConstRR().fit(tuning), TunedRR().fit(tuning)
    sampler = RegressionTasks(D, N, noise, dtype=torch.float64, device=device)
    selection, tuning_scores = {}, {}
    for cell, candidates in cells.items():
        selection[cell], scores = cell_choice(out, budget, column, cell, candidates, device)
        tuning_scores.update(scores)
    predictors = {"ConstRR": constant, "AdaRR": AdaRR(), "TunedRR": tuned}
    predictors.update({cell: candidate.model.to(device) for cell, candidate in selection.items()})
    deep = any(candidate.depth >= 3 for candidate in selection.values())
    num_tasks = budget.eval_tasks_deep if deep else budget.eval_tasks
    scores = adjusted_losses(predictors, sampler, num_tasks=num_tasks, chunk_size=budget.chunk_size,
                             seed=900 + index)
    for candidate in selection.values():
        candidate.model.to("cpu")
    result = {"column": column, "candidates": names,
              "selected": {cell: candidate.name for cell, candidate in selection.items()},
              "tuning_scores": tuning_scores,
              "scores": {name: [score.mean, score.stderr, score.num_tasks, score.trimmed_mean]
                         for name, score in scores.items()},
              "baselines": {"ConstRR": constant.ridge_lambda, "TunedRR": [tuned.factor, tuned.cap]},
              "device": str(device), "seconds": time.perf_counter() - started}
    write_json(path, result)
    log(f"scored column {column} on {num_tasks} tasks in {result['seconds']:.0f} s")
    return result
