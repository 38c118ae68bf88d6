"""Losses and their Monte-Carlo estimates.

The loss is half the mean squared error, ``1/2 E[(y_hat - y_t)^2]`` (the course fixes this
scale once, in chapter 0: it is the scale of Table 1 of Vladymyrov et al. 2024).  Every
predictor here is linear in the query,
``y_hat = <w_hat, x_t>`` with ``w_hat`` independent of ``x_t``, so the expectation over
the query is exact: ``1/2 (w_hat - w)^T S (w_hat - w)``, with ``S`` the query's covariance
(the identity by default).  Using it removes the query's noise from every estimate.

Models of three layers and more have heavy-tailed errors: a few ill-conditioned tasks, amplified
by the polynomial of ``Sigma`` the model computes, can dominate a mean over 100 000 tasks.  So
every function here takes ``num_tasks=None`` to mean 1 000 000 tasks (in chunks) when a
predictor is a model of 3 layers or more, and 100 000 otherwise.

A *predictor* is anything that maps a :class:`~icl_course.data.TaskBatch` to weights
(B, d): a baseline such as :func:`~icl_course.baselines.oracle_ridge`, a fitted
:class:`~icl_course.baselines.ConstRR`, or a
:class:`~icl_course.models.LinearTransformer` (its last layer's ``w^L`` is used).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import torch

from .baselines import oracle_ridge
from .data import FixedNoise, RegressionTasks, TaskBatch
from .models import ModelOutput
from .runtime import make_generator

__all__ = [
    "Estimate",
    "trimmed_count",
    "mean_and_stderr",
    "query_averaged_loss",
    "sampled_query_loss",
    "expected_loss",
    "loss_difference",
    "adjusted_loss",
    "adjusted_losses",
    "paired_adjusted_losses",
    "paired_losses",
    "per_layer_loss",
    "noise_profile",
    "default_num_tasks",
]

EVALUATION_SEED = 2024  # differs from every training seed, so no model is scored on its own batches
DEEP_LAYERS = 3           # from this depth on, errors are heavy-tailed
DEEP_NUM_TASKS = 1_000_000
DEFAULT_NUM_TASKS = 100_000


TRIMMED_FRACTION = 1e-4   # the share of worst tasks a trimmed mean leaves out: 100 of a million


def trimmed_count(num_tasks: int) -> int:
    """How many of ``num_tasks`` tasks a trimmed mean leaves out: the worst 0.01%, at least one."""
    return max(1, int(num_tasks * TRIMMED_FRACTION))


@dataclass(frozen=True)
class Estimate:
    """A Monte-Carlo mean with its standard error over ``num_tasks`` independent tasks, and (where it was
    computed) ``trimmed_mean``, the mean without the worst 0.01% of the tasks (:func:`trimmed_count`), with
    ``trimmed_stderr``, the standard error of the tasks it keeps (as if the cut were fixed in advance).

    Under a heavy tail a few tasks in a million carry the mean, and the standard error, computed from the
    same tasks, does not show it; the trimmed mean does: it moves far from the mean."""

    mean: float
    stderr: float
    num_tasks: int
    trimmed_mean: Optional[float] = None
    trimmed_stderr: Optional[float] = None

    @classmethod
    def from_samples(cls, values) -> "Estimate":
        """The mean of independent per-task values (a (N,) tensor or sequence), its standard error and
        its trimmed mean."""
        values = torch.as_tensor(values, dtype=torch.float64).flatten()
        mean, stderr = mean_and_stderr(values)
        kept = values.numel() - trimmed_count(values.numel())
        # summed directly, not as the total minus the worst: one task of 1e22 would cancel all the others
        best = values.sort().values[:kept]
        trimmed, trimmed_stderr = mean_and_stderr(best) if kept > 1 else (best.sum(), torch.tensor(math.nan))
        return cls(float(mean), float(stderr), values.numel(), float(trimmed), float(trimmed_stderr))

    def heavy_tailed(self, relative_stderr: float = 0.02, trimmed_gap: float = 0.05) -> bool:
        """Whether the estimate shows a heavy tail: a standard error above ``relative_stderr`` of the mean,
        or a trimmed mean more than ``trimmed_gap`` of the mean away from it (a mean that is not finite is
        one too)."""
        if not math.isfinite(self.mean):
            return True
        scale = abs(self.mean)
        gap = 0.0 if self.trimmed_mean is None else abs(self.mean - self.trimmed_mean)
        return self.stderr > relative_stderr * scale or gap > trimmed_gap * scale

    def __str__(self) -> str:
        return f"{self.mean:.4g} ± {self.stderr:.2g}"

    def __format__(self, spec: str) -> str:
        if not spec:
            return str(self)
        return f"{format(self.mean, spec)} ± {format(self.stderr, spec)}"


def mean_and_stderr(samples: torch.Tensor, dim: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """The Monte-Carlo mean of independent samples along ``dim`` and its standard error, entry by entry.

    Shapes: (N, ...) -> two tensors (...), the mean and ``std / sqrt(N)`` (the unbiased standard deviation);
    :meth:`Estimate.from_samples` is the one-number case.
    """
    count = samples.shape[dim]
    if count < 2:
        raise ValueError(f"a standard error needs at least 2 samples, got {count}")
    return samples.mean(dim), samples.std(dim) / math.sqrt(count)


def default_num_tasks(*predictors) -> int:
    """1 000 000 tasks if any predictor is a model of 3 layers or more (heavy tails), else 100 000."""
    deep = any(getattr(predictor, "num_layers", 0) >= DEEP_LAYERS for predictor in predictors)
    return DEEP_NUM_TASKS if deep else DEFAULT_NUM_TASKS


def _count(num_tasks, *predictors) -> int:
    return default_num_tasks(*predictors) if num_tasks is None else num_tasks


def _weights_of(predictor: Callable, batch: TaskBatch) -> torch.Tensor:
    output = predictor(batch)
    return output.weights if isinstance(output, ModelOutput) else output


def query_averaged_loss(weights: torch.Tensor, batch: TaskBatch) -> torch.Tensor:
    """Exact ``1/2 E_{x_t}[(<w_hat, x_t> - <w, x_t>)^2]`` per task.

    Shapes: ``weights`` (B, d) or (B, L, d) -> (B,) or (B, L).
    """
    if weights.shape[0] != batch.num_tasks or weights.shape[-1] != batch.d:
        raise ValueError(f"weights of shape {tuple(weights.shape)} do not fit {batch.num_tasks} tasks with d={batch.d}")
    truth = batch.w if weights.dim() == 2 else batch.w.unsqueeze(1)
    error = weights - truth
    if batch.covariance is None:
        return 0.5 * (error**2).sum(-1)
    return 0.5 * ((error @ batch.covariance.to(error)) * error).sum(-1)


def sampled_query_loss(predictions: torch.Tensor, batch: TaskBatch) -> torch.Tensor:
    """``1/2 (y_hat - y_t)^2`` on the batch's own queries.  Shapes: (B,) or (B, L) -> same."""
    targets = batch.y_t if predictions.dim() == 1 else batch.y_t.unsqueeze(1)
    return 0.5 * (predictions - targets) ** 2


def _monte_carlo(per_task: Callable[[TaskBatch], torch.Tensor], sampler: RegressionTasks,
                 num_tasks: int, chunk_size: int, seed) -> list[Estimate]:
    """Mean, standard error and trimmed mean of ``per_task(batch)`` ((B,) or (B, K)) over fresh chunks (each
    task's value times its ``importance_weight`` when the sampler draws from another law, e.g.
    :class:`~icl_course.data.StretchedTasks`).

    The worst :func:`trimmed_count` values of each column are kept across chunks (a running top-k), so the
    trimmed mean costs no second pass and no memory of the whole sample."""
    if isinstance(num_tasks, bool) or not isinstance(num_tasks, int) or num_tasks < 2:
        raise ValueError(f"num_tasks must be at least 2 to have a standard error, got {num_tasks}")
    generator = make_generator(EVALUATION_SEED if seed is None else seed)
    total = total_squares = worst = rest = rest_squares = None
    kept = trimmed_count(num_tasks)
    done = 0
    with torch.no_grad():
        while done < num_tasks:
            size = min(chunk_size, num_tasks - done)
            batch = sampler.sample(size, generator)
            values = per_task(batch).double().reshape(size, -1)
            if batch.importance_weight is not None:   # drawn from another law (StretchedTasks): weighted back;
                weight = batch.importance_weight.double().reshape(size, 1)   # a task cut off (weight 0) counts 0,
                values = torch.where(weight > 0, values * weight, 0.0)       # even where a model overflowed on it
            sums, squares = values.sum(0).cpu(), (values**2).sum(0).cpu()
            total = sums if total is None else total + sums
            total_squares = squares if total_squares is None else total_squares + squares
            pool = values.cpu() if worst is None else torch.cat([worst, values.cpu()])
            ordered = pool.sort(dim=0, descending=True).values
            # what leaves the running top-k is summed as it leaves: the trimmed mean is then a sum of the
            # kept values, not the total minus the worst, which one task of 1e22 would cancel to nothing
            worst, evicted, evicted_squares = ordered[:kept], ordered[kept:].sum(0), (ordered[kept:] ** 2).sum(0)
            rest = evicted if rest is None else rest + evicted
            rest_squares = evicted_squares if rest_squares is None else rest_squares + evicted_squares
            done += size
    mean = total / num_tasks
    variance = (total_squares / num_tasks - mean**2).clamp(min=0) * num_tasks / (num_tasks - 1)
    remaining = num_tasks - kept
    trimmed = rest / remaining
    # the kept tasks' spread, as if the cut were fixed in advance (what a light bulk's mean is known to)
    trimmed_variance = ((rest_squares / remaining - trimmed**2).clamp(min=0) * remaining / (remaining - 1)
                        if remaining > 1 else torch.full_like(trimmed, math.nan))
    return [Estimate(float(m), math.sqrt(float(v) / num_tasks), num_tasks, float(t), math.sqrt(float(u) / remaining))
            for m, v, t, u in zip(mean, variance, trimmed, trimmed_variance)]


def expected_loss(predictor: Callable, sampler: RegressionTasks, num_tasks: int | None = None,
                  chunk_size: int = 50_000, seed=None) -> Estimate:
    """``1/2 E[(y_hat - y_t)^2]`` over ``num_tasks`` fresh tasks from ``sampler`` (see :func:`default_num_tasks`)."""
    return _monte_carlo(lambda batch: query_averaged_loss(_weights_of(predictor, batch), batch),
                        sampler, _count(num_tasks, predictor), chunk_size, seed)[0]


def loss_difference(predictor: Callable, reference: Callable, sampler: RegressionTasks,
                    num_tasks: int | None = None, chunk_size: int = 50_000, seed=None) -> Estimate:
    """``loss(predictor) - loss(reference)``, paired on the same tasks (a small standard error)."""
    def difference(batch):
        return (query_averaged_loss(_weights_of(predictor, batch), batch)
                - query_averaged_loss(_weights_of(reference, batch), batch))
    return _monte_carlo(difference, sampler, _count(num_tasks, predictor, reference),
                        chunk_size, seed)[0]


def adjusted_loss(predictor: Callable, sampler: RegressionTasks, num_tasks: int | None = None,
                  chunk_size: int = 50_000, seed=None) -> Estimate:
    """Loss minus the oracle ridge's loss on the same tasks (Vladymyrov et al. 2024, section 6).

    Paired on the same tasks, so the standard error is that of the difference.
    """
    return adjusted_losses({"predictor": predictor}, sampler, num_tasks, chunk_size, seed)["predictor"]


def adjusted_losses(predictors: dict, sampler: RegressionTasks, num_tasks: int | None = None,
                    chunk_size: int = 50_000, seed=None) -> dict:
    """:func:`adjusted_loss` for several predictors on the very same tasks: name -> Estimate.

    The oracle is computed once per chunk, and every predictor sees the same tasks, so the
    differences between two rows are themselves paired comparisons.
    """
    return paired_adjusted_losses(predictors, sampler, None, num_tasks, chunk_size, seed)[0]


def paired_adjusted_losses(predictors: dict, sampler: RegressionTasks, reference: str | None,
                           num_tasks: int | None = None, chunk_size: int = 50_000, seed=None) -> tuple[dict, dict]:
    """:func:`adjusted_losses`, and each predictor's paired difference from ``reference`` (one of the names),
    in one pass over the same tasks: ``(name -> Estimate, name -> Estimate of loss(name) - loss(reference))``.

    The difference's standard error is that of the per-task differences, far smaller than either loss's when
    the two predictors err on the same tasks: whether one predictor beats another is read from it, not from
    the two losses' errors (``reference=None``: no differences).
    """
    return paired_losses(predictors, sampler, reference, num_tasks, chunk_size, seed, adjusted=True)


def paired_losses(predictors: dict, sampler: RegressionTasks, reference: str | None, num_tasks: int | None = None,
                  chunk_size: int = 50_000, seed=None, adjusted: bool = False, pairs=()) -> tuple[dict, dict]:
    """The losses of several predictors on the very same tasks, and each one's paired difference from
    ``reference``: ``(name -> Estimate, name -> Estimate of loss(name) - loss(reference))``, as
    :func:`paired_adjusted_losses` (``adjusted=True``: each loss minus the oracle ridge's) but for plain losses,
    e.g. noiseless tasks, where the oracle is exact.

    ``pairs``: further ``(name, base)`` differences, on the same tasks in the same pass, in the second dict under
    ``f"{name} - {base}"`` (e.g. what a stage of training moved a model, beside the gap to ``reference``)."""
    names = list(predictors)
    if reference is not None and reference not in predictors:
        raise ValueError(f"reference {reference!r} is not one of the predictors ({', '.join(names)})")
    for pair in pairs:      # a bare string or number would otherwise be split up or fail inside tuple()
        if not isinstance(pair, (tuple, list)) or len(pair) != 2 or any(name not in predictors for name in pair):
            raise ValueError(f"each of pairs is (name, base), both among the predictors ({', '.join(names)}); "
                             f"got {pair!r}")
    pairs = [tuple(pair) for pair in pairs]
    others = [index for index, name in enumerate(names) if name != reference] if reference is not None else []
    columns = ([(index, names.index(reference)) for index in others]
               + [(names.index(name), names.index(base)) for name, base in pairs])

    def per_task(batch):
        losses = torch.stack([query_averaged_loss(_weights_of(predictors[name], batch), batch) for name in names],
                             dim=-1)
        if adjusted:
            losses = losses - query_averaged_loss(oracle_ridge(batch), batch).unsqueeze(-1)
        if not columns:
            return losses
        # an oracle cancels in a difference
        first, second = zip(*columns)
        return torch.cat([losses, losses[:, list(first)] - losses[:, list(second)]], dim=-1)
    num_tasks = _count(num_tasks, *predictors.values())
    estimates = _monte_carlo(per_task, sampler, num_tasks, chunk_size, seed)
    differences = {names[index]: estimate for index, estimate in zip(others, estimates[len(names):])}
    differences.update({f"{name} - {base}": estimate
                        for (name, base), estimate in zip(pairs, estimates[len(names) + len(others):])})
    return dict(zip(names, estimates[:len(names)])), differences


def per_layer_loss(model, sampler: RegressionTasks, num_tasks: int | None = None,
                   chunk_size: int = 50_000, seed=None, adjusted: bool = False) -> list[Estimate]:
    """The loss of every layer's intermediate prediction ``-y_t^l``, l = 1..L (a list of L)."""
    def per_layer(batch):
        losses = query_averaged_loss(model(batch).layer_weights, batch)
        if adjusted:
            losses = losses - query_averaged_loss(oracle_ridge(batch), batch).unsqueeze(1)
        return losses
    return _monte_carlo(per_layer, sampler, _count(num_tasks, model), chunk_size, seed)


def noise_profile(predictor: Callable, sampler: RegressionTasks, sigmas: Sequence[float],
                  num_tasks: int | None = None, chunk_size: int = 50_000, seed=None) -> list[Estimate]:
    """Adjusted loss at each fixed noise level in ``sigmas`` (the per-noise profile of Vladymyrov et al. 2024, Fig. 2).

    ``num_tasks`` per level; by default 20 000, or 1 000 000 for a model of 3 layers or more.
    """
    if num_tasks is None:
        num_tasks = DEEP_NUM_TASKS if default_num_tasks(predictor) == DEEP_NUM_TASKS else 20_000
    return [adjusted_loss(predictor, sampler.with_noise(FixedNoise(float(sigma))), num_tasks,
                          chunk_size, seed) for sigma in sigmas]
