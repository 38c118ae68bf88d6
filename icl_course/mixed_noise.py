"""Mixed noise (Vladymyrov et al. 2024, sections 5.2-6): the evaluations behind chapter 4.

Each task draws its own noise level ``sigma``, so a good learner must estimate how noisy its
context is and regularise accordingly.  This module holds what chapter 4 measures beyond
:mod:`icl_course.table1`:

* :func:`diagonal_weights_table`: the four weights ``w_xx, w_xy, w_yx, w_yy`` of every layer of a
  ``diag`` or ``gdpp`` model, the numbers that say which algorithm it runs;
* :func:`effective_step`: the step ``c`` with which a learner's weights follow ``alpha`` per task,
  ``<w_hat, alpha> / ||alpha||^2`` (for one GD step ``c = -w_yx``; for ridge it shrinks with ``sigma``);
* :func:`per_task_adjusted_losses` and :func:`tail_summary`: the whole distribution of a model's
  adjusted loss over many tasks, for the heavy tails of deep models;
* :func:`compute_results` / :func:`load_results`: the shipped evaluations that are too slow for a
  notebook (models of 3 layers and more on 1 000 000 tasks per number), remade with
  ``python -m icl_course.mixed_noise``.
"""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path
from typing import Callable, Sequence

import torch

from .baselines import BayesOptimal, TunedRR, oracle_ridge
from .data import FixedNoise, RegressionTasks, TaskBatch
from .evaluate import Estimate, adjusted_losses, per_layer_loss, query_averaged_loss
from .models import LinearTransformer, ModelOutput
from .runtime import make_generator

__all__ = ["diagonal_weights_table", "effective_step", "per_task_adjusted_losses", "tail_summary",
           "compute_results", "load_results", "RESULTS_PATH", "PROFILE_SIGMAS"]

RESULTS_PATH = Path(__file__).parent / "pretrained" / "mixed_noise.json"
#: the fixed noise levels of the shipped per-noise profiles (trained on sigma ~ U(0, 5); 6 is outside)
PROFILE_SIGMAS = (0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0)
TUNING_SEED, EVALUATION_SEED = 11, 2025
TASK_FEATURES = ("smallest_eigenvalue", "largest_eigenvalue", "label_energy", "sigma")
LIGHT_NUM_TASKS = 100_000   # for learners without heavy tails: the baselines and models of 1-2 layers


def diagonal_weights_table(model: LinearTransformer) -> torch.Tensor:
    """The four weights of every layer of a ``diag`` or ``gdpp`` model, summed over heads.

    Returns (L, 4), columns ``w_xx, w_xy, w_yx, w_yy`` (Vladymyrov et al. 2024, section 5.2):
    ``x_i <- x_i + w_xx Sigma x_i + w_xy y_i alpha``, ``y_i <- y_i + w_yx <alpha, x_i> + w_yy lambda y_i``.
    """
    rows = []
    for layer in model.layers:
        weights = layer.diagonal_weights()
        rows.append(torch.stack([weights[name].detach() for name in ("w_xx", "w_xy", "w_yx", "w_yy")]))
    return torch.stack(rows).double()


def effective_step(weights: torch.Tensor, batch: TaskBatch) -> torch.Tensor:
    """The step along ``alpha`` that a learner's weights take, ``<w_hat, alpha> / ||alpha||^2`` per task.

    One GD step from 0 gives ``w_hat = c alpha`` and so exactly ``c``; ridge with penalty ``s^2`` on
    isotropic data gives about ``1 / (n + s^2)``: smaller for noisier tasks.  Shapes: ``weights`` (B, d)
    (or a :class:`~icl_course.models.ModelOutput`) -> (B,).
    """
    if isinstance(weights, ModelOutput):
        weights = weights.weights
    alpha = batch.alpha.to(weights)
    return (weights * alpha).sum(-1) / (alpha * alpha).sum(-1)


def per_task_adjusted_losses(predictor: Callable, sampler: RegressionTasks, num_tasks: int,
                             chunk_size: int = 50_000, seed: int = EVALUATION_SEED) -> tuple:
    """Every task's adjusted loss (model minus oracle ridge, paired) and what describes the task.

    Returns ``(losses, features)``: ``losses`` (num_tasks,) float64, and ``features`` a dict of (num_tasks,)
    tensors, ``smallest_eigenvalue`` and ``largest_eigenvalue`` of ``Sigma``, the label energy ``lambda``
    and ``sigma``.  Chunked, so a million tasks need only the memory of one chunk besides the results.
    """
    generator = make_generator(seed)
    losses, features = [], {name: [] for name in TASK_FEATURES}
    with torch.no_grad():
        for start in range(0, num_tasks, chunk_size):
            batch = sampler.sample(min(chunk_size, num_tasks - start), generator)
            output = predictor(batch)
            weights = output.weights if isinstance(output, ModelOutput) else output
            losses.append((query_averaged_loss(weights, batch) - query_averaged_loss(oracle_ridge(batch), batch))
                          .double())
            eigenvalues = torch.linalg.eigvalsh(batch.Sigma.double())
            for name, value in zip(TASK_FEATURES, (eigenvalues[:, 0], eigenvalues[:, -1], batch.label_energy,
                                                   batch.sigma)):
                features[name].append(value.double())
    return torch.cat(losses), {name: torch.cat(values) for name, values in features.items()}


def tail_summary(losses: torch.Tensor, features: dict, worst: int = 10) -> dict:
    """What a heavy tail does to a mean.

    The mean with its standard error, quantiles, the mean without the ``worst`` largest tasks, the share
    of the mean those tasks carry, and each task feature (:func:`per_task_adjusted_losses`) of those tasks
    beside its median over all tasks.
    """
    estimate = Estimate.from_samples(losses)
    order = losses.argsort(descending=True)
    kept = losses[order[worst:]]
    quantiles = torch.quantile(losses[: 2**24], torch.tensor([0.5, 0.99, 0.9999], dtype=torch.float64))
    summary = dict(num_tasks=losses.numel(), mean=estimate.mean, stderr=estimate.stderr,
                   median=float(quantiles[0]), q99=float(quantiles[1]), q9999=float(quantiles[2]),
                   largest=[float(value) for value in losses[order[:worst]]],
                   mean_without_worst=float(kept.mean()),
                   stderr_without_worst=float(kept.std() / math.sqrt(kept.numel())),
                   share_of_mean_from_worst=float(losses[order[:worst]].sum() / losses.sum()))
    for name, values in features.items():
        summary[f"worst_{name}"] = [float(value) for value in values[order[:worst]]]
        summary[f"median_{name}"] = float(values.median())
    return summary


def _estimate_dict(estimate: Estimate) -> dict:
    return dict(mean=estimate.mean, stderr=estimate.stderr, num_tasks=estimate.num_tasks)


def compute_results(num_tasks: int = 1_000_000, path=None, log: Callable = print,
                    tuning_tasks: int = 100_000) -> dict:
    """Chapter 4's slow evaluations of the shipped Table 1 models; writes JSON to ``path`` (default: the package's).

    * ``profiles``: adjusted loss at each fixed ``sigma`` in :data:`PROFILE_SIGMAS` of the models trained
      on ``U(0, 5)`` (Diag 3 and 5 layers on ``num_tasks`` tasks per level; GD++ and Diag 2 layers, TunedRR
      tuned on ``U(0, 5)`` and the Bayes-optimal learner for that prior on the first 100 000 of them);
    * ``per_layer``: the adjusted loss of every layer's prediction of the 5-layer GD++, Diag and Full models;
    * ``floor``: per Table 1 column, TunedRR and the Bayes-optimal learner on 100 000 tasks, paired with the oracle;
    * ``tails``: the per-task distribution (:func:`tail_summary`) of two cells with heavy tails and one without.

    TunedRR is tuned on ``tuning_tasks`` tasks of another seed.  About 45 minutes on one CPU core.
    """
    from .table1 import COLUMNS, column_noise, load_table1_model

    started = time.perf_counter()
    # everything in float64: the deep models were trained in it, and a float32 model is the same function
    tasks = RegressionTasks(10, 20, noise=column_noise("5"), dtype=torch.float64, device="cpu")
    light_tasks = min(num_tasks, LIGHT_NUM_TASKS)
    tuned = TunedRR().fit(tasks.sample(tuning_tasks, seed=TUNING_SEED))
    # Light-tailed learners need fewer tasks; an evaluation of fewer tasks with the same seed scores the
    # first tasks of the longer one, so every profile is still paired with the others.
    groups = [
        ({f"{name} {depth}": load_table1_model(variant, depth, "5").double()
          for name, variant, depth in (("Diag", "diag", 3), ("Diag", "diag", 5))}, num_tasks),
        ({f"{name} {depth}": load_table1_model(variant, depth, "5").double()
          for name, variant, depth in (("GD++", "gdpp", 2), ("Diag", "diag", 2))}
         | dict(TunedRR=tuned, Bayes=BayesOptimal(column_noise("5"))), light_tasks),
    ]
    profiles = {name: [] for predictors, _ in groups for name in predictors}
    for sigma in PROFILE_SIGMAS:
        for predictors, count in groups:
            scores = adjusted_losses(predictors, tasks.with_noise(FixedNoise(sigma)), count, seed=EVALUATION_SEED)
            for name, estimate in scores.items():
                profiles[name].append(_estimate_dict(estimate))
        log(f"profile at sigma = {sigma:g} done ({time.perf_counter() - started:.0f} s)")
    per_layer = {}
    for name, variant in (("GD++", "gdpp"), ("Diag", "diag"), ("Full", "full")):
        per_layer[f"{name} 5"] = [_estimate_dict(estimate) for estimate in per_layer_loss(
            load_table1_model(variant, 5, "5").double(), tasks, num_tasks, seed=EVALUATION_SEED, adjusted=True)]
    log(f"per-layer losses done ({time.perf_counter() - started:.0f} s)")
    floor = {}
    for column in COLUMNS:
        noise = column_noise(column)
        sampler = RegressionTasks(10, 20, noise=noise, dtype=torch.float64, device="cpu")
        bayes = BayesOptimal(FixedNoise(0.0) if noise.largest == 0 else noise)
        tuned_here = TunedRR().fit(sampler.sample(tuning_tasks, seed=TUNING_SEED))
        scores = adjusted_losses(dict(TunedRR=tuned_here, Bayes=bayes), sampler, light_tasks, seed=EVALUATION_SEED)
        floor[column] = {name: _estimate_dict(estimate) for name, estimate in scores.items()}
    log(f"Bayes floor done ({time.perf_counter() - started:.0f} s)")
    tails = {}
    for variant, depth, column in (("diag", 3, "7"), ("full", 3, "0"), ("diag", 5, "5")):
        model = load_table1_model(variant, depth, column).double()
        sampler = RegressionTasks(10, 20, noise=column_noise(column), dtype=torch.float64, device="cpu")
        tails[f"{variant} {depth} {column}"] = tail_summary(*per_task_adjusted_losses(model, sampler, num_tasks))
    log(f"tails done ({time.perf_counter() - started:.0f} s)")
    results = dict(num_tasks=num_tasks, sigmas=list(PROFILE_SIGMAS), profiles=profiles, per_layer=per_layer,
                   floor=floor, tails=tails, tuned_on="U(0, 5)", tuned=dict(factor=tuned.factor, cap=tuned.cap),
                   command="python -m icl_course.mixed_noise", torch=torch.__version__,
                   seconds=round(time.perf_counter() - started, 1))
    path = Path(path) if path is not None else RESULTS_PATH
    path.write_text(json.dumps(results, indent=1) + "\n")
    return results


def load_results(path=None) -> dict:
    """The evaluations written by :func:`compute_results` (default: the ones shipped with the package)."""
    path = Path(path) if path is not None else RESULTS_PATH
    if not path.is_file():
        raise FileNotFoundError(f"no chapter 4 evaluations at {path}; "
                                "make them with `python -m icl_course.mixed_noise`")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise ValueError(f"{path} is not a valid results file ({error}); remake it with "
                         "`python -m icl_course.mixed_noise`") from None


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m icl_course.mixed_noise [--num-tasks N] [--out PATH]``: remake chapter 4's evaluations."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m icl_course.mixed_noise", description=main.__doc__)
    parser.add_argument("--num-tasks", type=int, default=1_000_000, help="tasks per number (default 1 000 000)")
    parser.add_argument("--out", default=None, help=f"the JSON file to write (default {RESULTS_PATH})")
    args = parser.parse_args(argv)
    if args.num_tasks < 2:
        parser.error("--num-tasks must be at least 2")
    compute_results(args.num_tasks, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
