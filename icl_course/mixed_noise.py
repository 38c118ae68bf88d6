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
  ``python -m icl_course.mixed_noise``;
* :func:`compute_depth_profiles`: the per-noise, per-layer profiles of the deepest tail-free models
  (Vladymyrov et al. 2024, figures 2, 3 and 6), added to the same file;
* :func:`compute_head_comparison`: does a second head help a trained two-layer Diag model?  Added too.
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
from .linalg import symmetric_eigh
from .models import LinearTransformer, ModelOutput
from .runtime import make_generator

__all__ = ["diagonal_weights_table", "effective_step", "per_task_adjusted_losses", "tail_summary",
           "compute_results", "compute_depth_profiles", "compute_head_comparison", "load_results", "RESULTS_PATH",
           "PROFILE_SIGMAS", "RESULTS_RUN", "DEPTH_PROFILE_RUN", "DEPTH_PROFILE_DEPTH", "DEPTH_PROFILE_MODELS",
           "DEPTH_PROFILE_SIGMAS"]

RESULTS_PATH = Path(__file__).parent / "pretrained" / "mixed_noise.json"
#: the fixed noise levels of the shipped per-noise profiles (trained on sigma ~ U(0, 5); 6 is outside)
PROFILE_SIGMAS = (0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0)
TUNING_SEED, EVALUATION_SEED = 11, 2025
TASK_FEATURES = ("smallest_eigenvalue", "largest_eigenvalue", "label_energy", "sigma")
LIGHT_NUM_TASKS = 100_000   # for learners without heavy tails: the baselines and models of 1-2 layers
#: the Table 1 run whose models :func:`compute_results` evaluates: the ``clipped`` run (depths 1-5), whose
#: 3-layer models show heavy tails and whose 5-layer Diag on U(0, 5) has none
RESULTS_RUN = "clipped"
#: the Table 1 run whose deepest models :func:`compute_depth_profiles` evaluates: the ``cpu`` run (depths 1-7),
#: whose models have no heavy tails in the columns below (its tails are in the noiseless column)
DEPTH_PROFILE_RUN = "cpu"
#: the depth of the models it evaluates: 7, that of the paper's figures 2, 3 and 6
DEPTH_PROFILE_DEPTH = 7
#: (variant, depth, column) of those models: figure 2 (GD++ and Diag on U(0, 5), Diag on U(0, 7)),
#: figure 3 (Diag and Full trained on {1, 3}) and figure 6 (every layer of the GD++ and Diag models on U(0, 5))
DEPTH_PROFILE_MODELS = tuple((variant, DEPTH_PROFILE_DEPTH, column) for variant, column in (
    ("gdpp", "5"), ("diag", "5"), ("diag", "7"), ("diag", "{1,3}"), ("full", "{1,3}")))
#: the fixed noise levels of those profiles: the whole range 0-7, so that U(0, 5) and {1, 3} extrapolate
DEPTH_PROFILE_SIGMAS = (0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0)


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
            eigenvalues = symmetric_eigh(batch.Sigma.double(), eigenvectors=False)
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
                    tuning_tasks: int = 100_000, run: str = RESULTS_RUN) -> dict:
    """Chapter 4's slow evaluations of Table 1 run ``run``'s models; writes JSON to ``path`` (default: the package's).

    * ``profiles``: adjusted loss at each fixed ``sigma`` in :data:`PROFILE_SIGMAS` of the models trained
      on ``U(0, 5)`` (Diag 3 and 5 layers on ``num_tasks`` tasks per level; GD++ and Diag 2 layers, TunedRR
      tuned on ``U(0, 5)`` and the Bayes-optimal learner for that prior on the first 100 000 of them);
    * ``per_layer``: the adjusted loss of every layer's prediction of the 5-layer GD++, Diag and Full models;
    * ``floor``: per Table 1 column, TunedRR and the Bayes-optimal learner on 100 000 tasks, paired with the oracle;
    * ``tails``: the per-task distribution (:func:`tail_summary`) of two cells with heavy tails and one without.

    TunedRR is tuned on ``tuning_tasks`` tasks of another seed.  About 45 minutes on one CPU core.  The file
    is written anew: run :func:`compute_depth_profiles` and :func:`compute_head_comparison` after it.
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
        ({f"{name} {depth}": load_table1_model(variant, depth, "5", run).double()
          for name, variant, depth in (("Diag", "diag", 3), ("Diag", "diag", 5))}, num_tasks),
        ({f"{name} {depth}": load_table1_model(variant, depth, "5", run).double()
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
            load_table1_model(variant, 5, "5", run).double(), tasks, num_tasks, seed=EVALUATION_SEED, adjusted=True)]
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
        model = load_table1_model(variant, depth, column, run).double()
        sampler = RegressionTasks(10, 20, noise=column_noise(column), dtype=torch.float64, device="cpu")
        tails[f"{variant} {depth} {column}"] = tail_summary(*per_task_adjusted_losses(model, sampler, num_tasks))
    log(f"tails done ({time.perf_counter() - started:.0f} s)")
    results = dict(run=run, num_tasks=num_tasks, sigmas=list(PROFILE_SIGMAS), profiles=profiles, per_layer=per_layer,
                   floor=floor, tails=tails, tuned_on="U(0, 5)", tuned=dict(factor=tuned.factor, cap=tuned.cap),
                   command="python -m icl_course.mixed_noise", torch=torch.__version__,
                   seconds=round(time.perf_counter() - started, 1))
    path = Path(path) if path is not None else RESULTS_PATH
    path.write_text(json.dumps(results, indent=1) + "\n")
    return results


def _model_key(variant: str, depth: int, column: str) -> str:
    from .table1 import VARIANTS

    return f"{VARIANTS[variant]} {depth} on {column}"


def compute_depth_profiles(num_tasks: int = 1_000_000, path=None, log: Callable = print, run: str = DEPTH_PROFILE_RUN,
                           models: Sequence = DEPTH_PROFILE_MODELS, sigmas: Sequence[float] = DEPTH_PROFILE_SIGMAS,
                           chunk_size: int = 50_000, tuning_tasks: int = 100_000) -> dict:
    """Per-noise profiles of every layer of the deepest tail-free Table 1 models; adds ``depth_profiles`` to ``path``.

    At each fixed ``sigma`` in ``sigmas`` every model in ``models`` (``(variant, depth, column)`` of Table 1
    run ``run``) sees the same ``num_tasks`` tasks, paired with the oracle ridge: the adjusted loss of each
    layer's prediction ``-y_t^l`` (Vladymyrov et al. 2024, figure 6; the last layer is the model's own,
    figures 2 and 3).  AdaRR and TunedRR (tuned on each model's training prior) are scored on the first
    100 000 of those tasks.  Writes ``depth_profiles = {run, sigmas, num_tasks, models: {name: {variant,
    depth, column, layers: [sigma][layer] -> {mean, stderr, num_tasks}}}, baselines: {column: {name:
    [sigma] -> {...}}}}`` into the JSON at ``path`` (default: the package's), keeping its other entries.
    About 30 minutes on one CPU core for the defaults.
    """
    from .baselines import AdaRR
    from .table1 import column_noise, load_table1_model

    started = time.perf_counter()
    path = Path(path) if path is not None else RESULTS_PATH
    results = load_results(path) if path.is_file() else {}
    loaded = {_model_key(*spec): load_table1_model(*spec, run).double() for spec in models}
    columns = sorted({column for _, _, column in models}, key=str)
    baselines = {column: dict(AdaRR=AdaRR(), TunedRR=TunedRR().fit(RegressionTasks(
        10, 20, noise=column_noise(column), dtype=torch.float64, device="cpu").sample(tuning_tasks, seed=TUNING_SEED)))
        for column in columns}
    light_tasks = min(num_tasks, LIGHT_NUM_TASKS)
    layers = {name: [] for name in loaded}
    baseline_profiles = {column: {name: [] for name in baselines[column]} for column in columns}
    with torch.no_grad():
        for sigma in sigmas:
            sampler = RegressionTasks(10, 20, noise=FixedNoise(float(sigma)), dtype=torch.float64, device="cpu")
            generator = make_generator(EVALUATION_SEED)
            losses = {name: [] for name in loaded}
            light = {column: {name: [] for name in baselines[column]} for column in columns}
            for start in range(0, num_tasks, chunk_size):
                batch = sampler.sample(min(chunk_size, num_tasks - start), generator)
                oracle = query_averaged_loss(oracle_ridge(batch), batch)
                for name, model in loaded.items():   # (B, L): every layer's prediction, paired with the oracle
                    losses[name].append(query_averaged_loss(model(batch).layer_weights, batch) - oracle.unsqueeze(1))
                if start < light_tasks:
                    kept = min(chunk_size, light_tasks - start)
                    for column, learners in baselines.items():
                        for name, learner in learners.items():
                            light[column][name].append(
                                (query_averaged_loss(learner(batch), batch) - oracle)[:kept])
            for name, chunks in losses.items():
                per_layer = torch.cat(chunks)
                layers[name].append([_estimate_dict(Estimate.from_samples(per_layer[:, layer]))
                                     for layer in range(per_layer.shape[1])])
            for column in columns:
                for name, chunks in light[column].items():
                    baseline_profiles[column][name].append(_estimate_dict(Estimate.from_samples(torch.cat(chunks))))
            log(f"depth profiles at sigma = {sigma:g} done ({time.perf_counter() - started:.0f} s)")
    results["depth_profiles"] = dict(
        run=run, sigmas=[float(sigma) for sigma in sigmas], num_tasks=num_tasks,
        models={_model_key(*spec): dict(variant=spec[0], depth=spec[1], column=spec[2],
                                        layers=layers[_model_key(*spec)]) for spec in models},
        baselines=baseline_profiles, seconds=round(time.perf_counter() - started, 1),
        command="python -m icl_course.mixed_noise --depth-profiles-only")
    path.write_text(json.dumps(results, indent=1) + "\n")
    return results["depth_profiles"]


def compute_head_comparison(path=None, log: Callable = print, run: str = DEPTH_PROFILE_RUN, column: str = "5",
                            num_steps: int = 3000, num_tasks: int = LIGHT_NUM_TASKS, seed: int = 3) -> dict:
    """One head against two for the two-layer Diag model of Table 1 run ``run``; adds ``heads`` to ``path``.

    A single head's four weights per layer are products ``p_a q_b`` (so ``w_xx w_yy = w_xy w_yx``); two heads
    set all four freely (:func:`~icl_course.models.diagonal_construction`).  Both start from the run's
    trained model of ``column`` (the two-head one as its exact copy) and train the same ``num_steps`` more
    (Adam at a constant 1e-4, batch 512, no clipping, the same task stream), then are scored with the
    model they started from on the same ``num_tasks`` tasks, paired with the oracle ridge.  About a
    minute on one CPU core.
    """
    from .models import diagonal_construction
    from .table1 import column_noise, load_table1_model
    from .train import train

    started = time.perf_counter()
    path = Path(path) if path is not None else RESULTS_PATH
    results = load_results(path) if path.is_file() else {}
    start = load_table1_model("diag", 2, column, run).float()
    names = ("w_xx", "w_xy", "w_yx", "w_yy")
    layers = [dict(zip(names, row.tolist())) for row in diagonal_weights_table(start)]
    models = {"one head": load_table1_model("diag", 2, column, run).float(),
              "two heads": diagonal_construction(10, layers).float()}
    sampler = RegressionTasks(10, 20, noise=column_noise(column), dtype=torch.float32, device="cpu")
    with torch.enable_grad():
        for model in models.values():
            train(model, sampler, num_steps, batch_size=512, learning_rate=1e-4, schedule="constant",
                  clip_norm=None, seed=seed, progress=False)
    log(f"head comparison trained ({time.perf_counter() - started:.0f} s)")
    predictors = {"trained": start.double(), **{name: model.double() for name, model in models.items()}}
    evaluation = RegressionTasks(10, 20, noise=column_noise(column), dtype=torch.float64, device="cpu")
    with torch.no_grad():
        generator = make_generator(EVALUATION_SEED)
        losses = {name: [] for name in predictors}
        for begin in range(0, num_tasks, 50_000):
            batch = evaluation.sample(min(50_000, num_tasks - begin), generator)
            oracle = query_averaged_loss(oracle_ridge(batch), batch)
            for name, predictor in predictors.items():
                losses[name].append(query_averaged_loss(predictor(batch).weights, batch) - oracle)
    losses = {name: torch.cat(values) for name, values in losses.items()}
    results["heads"] = dict(
        run=run, column=column, num_steps=num_steps, num_tasks=num_tasks,
        scores={name: _estimate_dict(Estimate.from_samples(values)) for name, values in losses.items()},
        two_minus_one=_estimate_dict(Estimate.from_samples(losses["two heads"] - losses["one head"])),
        weights={name: diagonal_weights_table(model).tolist() for name, model in models.items()},
        seconds=round(time.perf_counter() - started, 1), command="python -m icl_course.mixed_noise --heads-only")
    path.write_text(json.dumps(results, indent=1) + "\n")
    return results["heads"]


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
    parser.add_argument("--depth-profiles-only", action="store_true",
                        help="remake only the profiles of the deepest tail-free models (compute_depth_profiles)")
    parser.add_argument("--heads-only", action="store_true",
                        help="remake only the one-head against two-heads comparison (compute_head_comparison)")
    args = parser.parse_args(argv)
    if args.num_tasks < 2:
        parser.error("--num-tasks must be at least 2")
    if args.depth_profiles_only and args.heads_only:
        parser.error("--depth-profiles-only and --heads-only each remake one part: pass at most one")
    if not (args.depth_profiles_only or args.heads_only):
        compute_results(args.num_tasks, args.out)
    if not args.heads_only:
        compute_depth_profiles(args.num_tasks, args.out)
    if not args.depth_profiles_only:
        compute_head_comparison(args.out, num_tasks=min(args.num_tasks, LIGHT_NUM_TASKS))
    return 0


if __name__ == "__main__":
    sys.exit(main())
