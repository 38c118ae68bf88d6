"""Light-tailed GD++ models for Table 1's noiseless column, fitted on their exact loss.

In the noiseless column (``sigma_max = 0``) every trained model of 4 layers and more has a heavy tail: the rare
tasks whose smallest eigenvalue of ``X^T X`` is near 0.2 carry its mean, and the best GD++ of its class has a
heavier tail still (``research/noiseless_optimum.py`` in the repository).  The lowest mean and the table's
light-tail test pull apart there.  On noiseless tasks a GD++ model's loss is a function of the spectrum of
``X^T X`` and of two numbers per layer (:func:`icl_course.theory.gdpp_residual`), so a GD++ that passes the
test can be fitted outright: minimise the expected loss over the column's own law with the rare tasks weighted
up, which trades some of the mean for a light tail, and keep, over a few weights and starts, the fit with the
lowest mean among those that pass the test with room to spare on each of ten plain samples.  A run of a budget
with a :class:`NoiselessFit` offers these fits (and the same functions as
Diag and Full models, :func:`~icl_course.models.widen`) as candidates of the noiseless column's deep cells.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import torch

from ..data import RegressionTasks
from ..evaluate import Estimate
from ..linalg import symmetric_eigh
from ..models import LinearTransformer
from ..theory import gdpp_residual
from .paper import D, N


@dataclass(frozen=True)
class NoiselessFit:
    """How a run fits the light-tailed GD++ of the noiseless column's cells at ``depths``.

    A task is rare when the smallest eigenvalue of its ``X^T X`` is below ``smallest`` or its largest above
    ``largest`` (about one task in 2 000 for the defaults, ``d = 10``, ``n = 20``; the tasks that carry the
    trained models' tails lie beyond both); its loss counts ``1 + rare_weight`` times in the fitted objective,
    and ``r(lambda)^2`` on a grid from ``largest`` to ``cap`` counts ``guard * rare_weight`` (``guard = 0``: no
    guard; :class:`FitTasks`, a stratified sample of ``pool_tasks`` plain tasks that keeps every rare one and
    about ``fit_tasks`` others).
    Each ``rare_weight`` is fitted from every start (the trained GD++ candidates of the cell, and the GD++ the
    table keeps one layer shallower and the fit there, each with one more layer: :func:`deeper_starts`) by
    :func:`fit_gdpp`; a fit counts as light-tailed when, on each of ``check_samples`` samples of
    ``check_tasks`` plain tasks, its standard error is at most ``check_stderr`` of its mean and its mean without
    the worst 0.01% of the tasks is within ``check_trimmed_gap`` of it: 70% of the table's bounds on every
    sample, since the table scores it on another one.  From 5 layers on one million says little about the next
    (a task in a million has a smallest eigenvalue near 0.1), hence ten of them.  Every named budget from
    ``cpu`` up uses these defaults; why they are what they are is in research/README.md (second entry of
    2026-11-27).
    """

    depths: tuple = (4, 5, 6, 7)
    rare_weights: tuple = (30.0, 100.0, 300.0, 1000.0, 3000.0)
    smallest: float = 0.3
    largest: float = 80.0
    fit_tasks: int = 20_000
    check_tasks: int = 1_000_000
    check_samples: int = 10
    adam_steps: int = 300
    adam_learning_rate: float = 1e-3
    rounds: int = 2
    iterations: int = 40
    check_stderr: float = 0.014
    check_trimmed_gap: float = 0.035
    pool_tasks: int = 4_000_000
    cap: float = 150.0
    guard: float = 1e-6


#: eigenvalues in the guard grid of :class:`FitTasks`, from ``largest`` to ``cap``
GUARD_POINTS = 141


def gdpp_weights(model: LinearTransformer) -> torch.Tensor:
    """A GD++ model's (2, L) weights in float64: ``w_xx`` (row 0) and ``w_yx`` (row 1) of every layer."""
    if model.config["parameterization"] != "gdpp":
        raise ValueError(f"gdpp_weights takes a 'gdpp' model, not {model.config['parameterization']!r}")
    weights = [layer.diagonal_weights() for layer in model.layers]
    return torch.stack([torch.stack([w["w_xx"] for w in weights]),
                        torch.stack([w["w_yx"] for w in weights])]).detach().double().cpu()


def gdpp_model(weights: torch.Tensor) -> LinearTransformer:
    """The GD++ model (``d = 10``, float64, CPU) with these (2, L) weights: ``p = (w_xx, w_yx)``, ``q = 1``."""
    weights = torch.as_tensor(weights, dtype=torch.float64)
    if weights.dim() != 2 or weights.shape[0] != 2 or weights.shape[1] < 1:
        raise ValueError(f"weights must be (2, L): w_xx and w_yx of each of L layers; got {tuple(weights.shape)}")
    model = LinearTransformer(D, weights.shape[1], 1, "gdpp", dtype=torch.float64, device="cpu")
    with torch.no_grad():
        for layer, (xx, yx) in zip(model.layers, weights.T):
            layer.q.fill_(1.0)
            layer.p.copy_(torch.stack([xx, yx]).reshape(1, 2))
    return model


class FitTasks:
    """The spectra of noiseless tasks a fit minimises over: every rare task of ``pool_tasks`` plain ones and a
    subsample of about ``fit_tasks`` of the others, each weighted back by its share (a stratified sample of the
    column's own law), and a grid of eigenvalues from ``largest`` to ``cap``.

    The rare spectra are drawn from the plain law, not stretched along an axis (:class:`~icl_course.data.
    StretchedTasks`): a plain task's large eigenvalue points along any direction, and stretching one coordinate
    reaches few of them, so the weighted-back sample, unbiased, is at this size almost always low there: 20 000
    stretched tasks gave ``lambda_max > 100`` a probability of 4e-8 where 20 million plain tasks hold one in a
    million, and fits left spikes there (research/README.md,
    second entry of 2026-11-27).  The grid guards the eigenvalues beyond the pool's largest, which a table's
    million still meets: a task's loss is a sum over its eigenvalues of ``r(lambda)^2`` (averaged over ``w``,
    :func:`~icl_course.theory.gdpp_residual`), so ``r`` on the grid bounds the loss of any task with such a
    large eigenvalue.
    """

    def __init__(self, setting: NoiselessFit, seed: int, chunk_size: int = 200_000):
        sampler = RegressionTasks(D, N, 0.0, dtype=torch.float64, device="cpu")
        generator = torch.Generator().manual_seed(seed)
        share = min(1.0, setting.fit_tasks / setting.pool_tasks)   # of the ordinary tasks, kept
        eigenvalues, rare = [], []
        for start in range(0, setting.pool_tasks, chunk_size):
            X = sampler.sample(min(chunk_size, setting.pool_tasks - start), generator).X
            values = symmetric_eigh(X.transpose(-1, -2) @ X, eigenvectors=False)   # (B, d), ascending
            is_rare = (values[:, 0] < setting.smallest) | (values[:, -1] > setting.largest)
            kept = is_rare | (torch.rand(len(values), generator=generator, dtype=torch.float64) < share)
            eigenvalues.append(values[kept])
            rare.append(is_rare[kept])
        self.eigenvalues, self.rare = torch.cat(eigenvalues), torch.cat(rare)
        self.weight = torch.where(self.rare, 1.0, 1.0 / share).double()
        self.num_tasks = setting.pool_tasks
        self.grid = torch.linspace(setting.largest, setting.cap, GUARD_POINTS, dtype=torch.float64).unsqueeze(0)
        self.guard = setting.guard

    def objective(self, weights: torch.Tensor, rare_weight: float) -> torch.Tensor:
        """``E[(1 + rare_weight 1{rare}) 1/2 sum_k r(lambda_k)^2] + guard rare_weight mean_grid r(lambda)^2``
        (the first term averaged over ``w``, on the stratified sample)."""
        per_task = 0.5 * (gdpp_residual(self.eigenvalues, weights[0], weights[1]) ** 2).sum(-1)
        tasks = (self.weight * torch.where(self.rare, 1.0 + rare_weight, 1.0) * per_task).sum() / self.num_tasks
        return tasks + self.guard * rare_weight * (gdpp_residual(self.grid, weights[0], weights[1]) ** 2).mean()


class CheckTasks:
    """``samples`` independent samples of ``num_tasks`` plain noiseless tasks each, in spectral form: the
    eigenvalues of ``X^T X`` and the squared components of ``w`` along its eigenvectors, so a GD++'s per-task
    loss is ``1/2 sum_k r(lambda_k)^2 (u_k^T w)^2`` exactly (:func:`~icl_course.theory.gdpp_residual`), without
    running the model."""

    def __init__(self, num_tasks: int, seed: int, samples: int = 1, chunk_size: int = 100_000):
        sampler = RegressionTasks(D, N, 0.0, dtype=torch.float64, device="cpu")
        generator = torch.Generator().manual_seed(seed)
        eigenvalues, components = [], []
        for start in range(0, num_tasks * samples, chunk_size):
            batch = sampler.sample(min(chunk_size, num_tasks * samples - start), generator)
            values, vectors = symmetric_eigh(batch.X.transpose(-1, -2) @ batch.X)
            eigenvalues.append(values)
            components.append((vectors.transpose(-1, -2) @ batch.w.unsqueeze(-1)).squeeze(-1) ** 2)
        self.eigenvalues, self.components = torch.cat(eigenvalues), torch.cat(components)
        self.num_tasks, self.samples = num_tasks, samples

    def estimates(self, weights: torch.Tensor, samples: Optional[int] = None) -> list[Estimate]:
        """The GD++'s loss on each sample (on the first ``samples`` of them when given): mean, standard error and
        trimmed mean (a model that overflows on some task: an infinite estimate)."""
        samples = self.samples if samples is None else samples
        with torch.no_grad():
            end = samples * self.num_tasks
            residual = gdpp_residual(self.eigenvalues[:end], weights[0], weights[1])
            losses = 0.5 * (residual**2 * self.components[:end]).sum(-1)
        if not torch.isfinite(losses).all():
            return [Estimate(math.inf, math.inf, self.num_tasks, math.inf)] * samples
        return [Estimate.from_samples(sample) for sample in losses.split(self.num_tasks)]

    def estimate(self, weights: torch.Tensor) -> Estimate:
        """The GD++'s loss on all the tasks as one sample."""
        parts = self.estimates(weights)
        if len(parts) == 1:
            return parts[0]
        with torch.no_grad():
            losses = 0.5 * (gdpp_residual(self.eigenvalues, weights[0], weights[1]) ** 2 * self.components).sum(-1)
        return Estimate.from_samples(losses)


def fit_gdpp(tasks: FitTasks, start: torch.Tensor, rare_weight: float, setting: NoiselessFit) -> torch.Tensor:
    """Adam, then L-BFGS, from ``start`` (2, L) on the logarithm of :meth:`FitTasks.objective` (its scale runs
    from 1e-2 to 1e-9 over the depths); returns the lowest point passed through.

    L-BFGS alone seldom leaves a deep start: its first steps overshoot to weights where the polynomial
    explodes on some task.  So ``adam_steps`` of Adam go first, each step that would leave a non-finite value
    undone at half the rate; then ``rounds`` rounds of L-BFGS of ``iterations`` each (a round that leaves a
    non-finite value ends the fit).
    """
    weights = start.detach().clone().double().requires_grad_()
    with torch.no_grad():
        best_value, best = tasks.objective(weights, rare_weight).item(), weights.detach().clone()

    def keep(value):
        nonlocal best_value, best
        if math.isfinite(value) and (value < best_value or not math.isfinite(best_value)):
            best_value, best = value, weights.detach().clone()

    adam = torch.optim.Adam([weights], lr=setting.adam_learning_rate)
    for _ in range(setting.adam_steps):
        adam.zero_grad()
        value = tasks.objective(weights, rare_weight)
        if not torch.isfinite(value):
            with torch.no_grad():
                weights.copy_(best)
            for group in adam.param_groups:
                group["lr"] /= 2
            continue
        keep(value.item())
        torch.log(value).backward()
        adam.step()
    with torch.no_grad():
        weights.copy_(best)
    optimiser = torch.optim.LBFGS([weights], lr=1, max_iter=setting.iterations, history_size=50,
                                  line_search_fn="strong_wolfe", tolerance_grad=1e-40, tolerance_change=1e-40)

    def closure():
        optimiser.zero_grad()
        loss = torch.log(tasks.objective(weights, rare_weight))
        loss.backward()
        return loss

    for _ in range(setting.rounds):
        optimiser.step(closure)
        with torch.no_grad():
            value = tasks.objective(weights, rare_weight).item()
        if not math.isfinite(value):
            break
        keep(value)
    return best


def deeper_starts(weights: torch.Tensor) -> dict[str, torch.Tensor]:
    """(2, L) -> starts of (2, L + 1): before the first and before the last layer, a layer that passes the
    tokens through (``w_xx = w_yx = 0``: the same function) or a copy of that layer; the fits from the two
    kinds end in different places, and neither wins at every depth."""
    zero = torch.zeros(2, 1, dtype=weights.dtype)
    starts = {}
    for i in sorted({0, weights.shape[1] - 1}):
        starts[f"pass-through before layer {i}"] = torch.cat([weights[:, :i], zero, weights[:, i:]], dim=1)
        starts[f"copy of layer {i}"] = torch.cat([weights[:, :i + 1], weights[:, i:]], dim=1)
    return starts


def light_tailed_fit(starts: dict, setting: NoiselessFit, fit_tasks: FitTasks,
                     check_tasks: CheckTasks) -> Optional[dict]:
    """The light-tailed model with the lowest mean among every (2, L) start of ``starts`` (name -> weights) and
    its fits with every ``rare_weight``; None if none passes.  The starts compete as they are (``rare_weight``
    None): a light-tailed shallower model with a pass-through layer keeps its place whatever the fits do.

    A model is light-tailed when it passes on every one of ``check_tasks``' samples.  Every model is scored on
    the first sample; those that pass there are checked on all the others in the order of that mean, and the
    first to pass on all of them is kept (so a run checks a few models, not all, on many millions).

    Returns ``{"weights": (2, L), "start": name, "rare_weight": w, "mean": mean over the samples, "check":
    [[mean, stderr, tasks, trimmed mean] of each sample]}``.
    """
    def light(checks):
        return not any(check.heavy_tailed(setting.check_stderr, setting.check_trimmed_gap) for check in checks)

    passed_first = []
    for name, start in starts.items():
        for rare_weight in (None, *setting.rare_weights):
            weights = start.double() if rare_weight is None else fit_gdpp(fit_tasks, start, rare_weight, setting)
            first = check_tasks.estimates(weights, samples=1)
            if light(first):
                passed_first.append((first[0].mean, name, rare_weight, weights))
    for _, name, rare_weight, weights in sorted(passed_first, key=lambda entry: entry[0]):
        checks = check_tasks.estimates(weights)
        if light(checks):
            return {"weights": weights, "start": name, "rare_weight": rare_weight,
                    "mean": sum(check.mean for check in checks) / len(checks),
                    "check": [[check.mean, check.stderr, check.num_tasks, check.trimmed_mean] for check in checks]}
    return None
