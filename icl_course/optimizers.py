"""Iterative optimisers of the in-context objective, run per task and batched over tasks.

The objective is ``L(w) = 1/(2n) sum_i (<w, x_i> - y_i)^2``, so that ``grad L(w) = (Sigma w - alpha) / n``
with ``Sigma = X^T X`` and ``alpha = X^T y``.  Each optimiser returns its whole path of iterates,
the starting point ``w_0 = 0`` first, so that a chapter can compare a transformer's layer ``l``
with step ``l`` of an algorithm.  The loops run over steps, never over tasks.

* :func:`gradient_descent` (preconditioned, one step size per step) and :func:`tune_step_sizes`;
* :func:`conjugate_gradient`, exact after ``d`` steps;
* :func:`momentum_descent` (heavy ball or Nesterov) and :func:`tune_momentum`;
* :func:`newton_inverse`, Newton's iteration for a matrix inverse (Fu et al. 2023).

The calling convention differs from :mod:`icl_course.baselines` on purpose: a learner there maps a
:class:`~icl_course.data.TaskBatch` to one weight vector per task, while an optimiser here takes the
context as tensors, ``X`` (B, n, d) and ``y`` (B, n) (``gradient_descent(batch.X, batch.y, eta,
num_steps)``), and returns its path, (B, num_steps + 1, d); :func:`newton_inverse` takes the matrix it
inverts.  The tuners take the batch they tune on.
"""

from __future__ import annotations

import math

import torch

from .data import TaskBatch, check_context
from .linalg import singular_mask, symmetric_eigh
from .runtime import check_count

__all__ = ["gradient_descent", "tune_step_sizes", "conjugate_gradient", "newton_inverse",
           "momentum_descent", "tune_momentum"]


def _step_sizes(eta, num_steps: int, like: torch.Tensor) -> torch.Tensor:
    """``eta`` as a (num_steps,) tensor: a number is used at every step."""
    steps = torch.as_tensor(eta, dtype=like.dtype, device=like.device)
    if steps.dim() == 0:
        return steps.expand(num_steps)
    if steps.shape != (num_steps,):
        raise ValueError(f"eta must be a number or hold one step size per step ({num_steps}), "
                         f"got shape {tuple(steps.shape)}")
    return steps


def _mean_weight_loss(w_hat: torch.Tensor, batch: TaskBatch) -> torch.Tensor:
    """``1/2 E (w_hat - w)^T S (w_hat - w)``, the expected query loss (``S = I`` when the batch has no covariance),
    each task weighted by its ``importance_weight`` when the batch has one (drawn from another law, e.g.
    :class:`~icl_course.data.StretchedTasks`)."""
    error = w_hat - batch.w
    if batch.covariance is None:
        losses = 0.5 * (error**2).sum(-1)
    else:
        losses = 0.5 * ((error @ batch.covariance.to(error)) * error).sum(-1)
    if batch.importance_weight is not None:
        losses = losses * batch.importance_weight.to(losses)
    return losses.mean()


def gradient_descent(X: torch.Tensor, y: torch.Tensor, eta, num_steps: int,
                     preconditioner: torch.Tensor | None = None) -> torch.Tensor:
    """Iterates of (preconditioned) GD on ``L(w) = 1/(2n) sum_i (<w, x_i> - y_i)^2`` from 0.

    ``w_{k+1} = w_k - eta_k * A grad L(w_k)`` with ``A = preconditioner`` (identity if None);
    ``eta`` is one number or a sequence of ``num_steps`` step sizes (differentiable, so step
    sizes can be tuned by gradient).  Shapes: ``X`` (B, n, d), ``y`` (B, n), ``preconditioner``
    (d, d) -> (B, num_steps + 1, d), the starting point ``w_0 = 0`` first.  The loop runs over
    steps, never over tasks.
    """
    check_context(X, y)
    check_count(num_steps, "num_steps", minimum=0)
    n, d = X.shape[-2], X.shape[-1]
    steps = _step_sizes(eta, num_steps, X)
    direction = (torch.eye(d, dtype=X.dtype, device=X.device) if preconditioner is None
                 else torch.as_tensor(preconditioner, dtype=X.dtype, device=X.device))
    if direction.shape != (d, d):
        raise ValueError(f"preconditioner must have shape ({d}, {d}), got {tuple(direction.shape)}")
    Sigma = X.transpose(-1, -2) @ X / n
    alpha = (X.transpose(-1, -2) @ y.unsqueeze(-1)).squeeze(-1) / n
    iterates = [torch.zeros_like(alpha)]
    for step in range(num_steps):
        w = iterates[-1]
        gradient = (Sigma @ w.unsqueeze(-1)).squeeze(-1) - alpha
        iterates.append(w - steps[step] * gradient @ direction.T)
    return torch.stack(iterates, dim=1)


def tune_step_sizes(batch: TaskBatch, num_steps: int, per_step: bool = True) -> torch.Tensor:
    """Step sizes of GD that minimise the mean loss of its last iterate on ``batch``.

    ``per_step=True`` tunes one ``eta_k`` per step, otherwise one shared ``eta``.  L-BFGS on
    the exact query-averaged loss (float64), started around the one-step optimum
    ``eta = n / (n + d + 1)``.  The order of the steps does not change the last iterate, so
    the (num_steps,) result is sorted ascending.  Tune on one sample, score on another.
    """
    batch = batch.to(dtype=torch.float64)
    n, d = batch.n, batch.d
    base = math.log(n / (n + d + 1))
    # GD's iterate is a polynomial in Sigma whose factors commute, so equal step sizes are a
    # symmetric stationary point: start from distinct ones, and sort the answer.
    spread = torch.linspace(-0.7, 0.7, num_steps, dtype=torch.float64) if per_step and num_steps > 1 \
        else torch.zeros(1, dtype=torch.float64)
    log_steps = (base + spread).requires_grad_(True)  # optimised in log space: step sizes stay positive
    optimizer = torch.optim.LBFGS([log_steps], max_iter=200, line_search_fn="strong_wolfe",
                                  tolerance_grad=1e-12, tolerance_change=1e-14)

    def mean_loss():
        optimizer.zero_grad()
        eta = torch.exp(log_steps).expand(num_steps)
        loss = _mean_weight_loss(gradient_descent(batch.X, batch.y, eta, num_steps)[:, -1], batch)
        loss.backward()
        return loss

    optimizer.step(mean_loss)
    return torch.exp(log_steps.detach()).expand(num_steps).sort().values


def conjugate_gradient(X: torch.Tensor, y: torch.Tensor, num_steps: int) -> torch.Tensor:
    """Iterates of conjugate gradient on the same loss as :func:`gradient_descent`, from 0.

    CG solves the normal equations ``Sigma w = alpha`` (``Sigma = X^T X / n``, ``alpha = X^T y / n``);
    its ``k``-th iterate minimises the loss over the Krylov space spanned by
    ``alpha, Sigma alpha, ..., Sigma^(k-1) alpha``, which holds every ``k``-step GD iterate, and after
    ``d`` steps it is the least-squares solution (chapter 3).
    Shapes: ``X`` (B, n, d), ``y`` (B, n) -> (B, num_steps + 1, d), ``w_0 = 0`` first.  A task whose
    residual is exactly zero stays where it is.
    """
    check_context(X, y)
    check_count(num_steps, "num_steps", minimum=0)
    n = X.shape[-2]
    Sigma = X.transpose(-1, -2) @ X / n
    alpha = (X.transpose(-1, -2) @ y.unsqueeze(-1)).squeeze(-1) / n
    w = torch.zeros_like(alpha)
    residual = alpha.clone()
    direction = residual.clone()
    squared = (residual * residual).sum(-1)
    iterates = [w]
    for _ in range(num_steps):
        curved = (Sigma @ direction.unsqueeze(-1)).squeeze(-1)
        denominator = (direction * curved).sum(-1)
        step = torch.where(denominator > 0, squared / denominator.clamp_min(torch.finfo(X.dtype).tiny),
                           torch.zeros_like(squared))
        w = w + step.unsqueeze(-1) * direction
        residual = residual - step.unsqueeze(-1) * curved
        new_squared = (residual * residual).sum(-1)
        ratio = torch.where(squared > 0, new_squared / squared.clamp_min(torch.finfo(X.dtype).tiny),
                            torch.zeros_like(squared))
        direction = residual + ratio.unsqueeze(-1) * direction
        squared = new_squared
        iterates.append(w)
    return torch.stack(iterates, dim=1)


def newton_inverse(S: torch.Tensor, num_steps: int) -> torch.Tensor:
    """Newton's iteration for the inverse of a symmetric positive-definite ``S``: ``M <- M (2I - S M)``.

    Started from ``M_0 = I / lambda_max(S)``, the error ``E_k = I - S M_k`` squares at every step,
    ``E_{k+1} = E_k^2``: accuracy ``eps`` takes ``log2(kappa) + log2 log(1/eps)`` steps, the
    doubly logarithmic rate that GD++ shares (Fu et al. 2023; chapter 3).
    Shapes: ``S`` (..., d, d) -> (..., num_steps + 1, d, d), ``M_0`` first.
    """
    S = torch.as_tensor(S)
    if S.dim() < 2 or S.shape[-1] != S.shape[-2]:
        raise ValueError(f"S must be a square matrix or a batch of them, got shape {tuple(S.shape)}")
    check_count(num_steps, "num_steps", minimum=0)
    if not torch.allclose(S, S.transpose(-1, -2)) or bool(singular_mask(S).any()):
        raise ValueError("S must be symmetric positive definite, and not singular in its dtype "
                         "(Newton's iteration for S^-1 needs it)")
    eigenvalues = symmetric_eigh(S, eigenvectors=False)
    identity = torch.eye(S.shape[-1], dtype=S.dtype, device=S.device)
    M = identity / eigenvalues[..., -1, None, None]
    iterates = [M]
    for _ in range(num_steps):
        M = M @ (2 * identity - S @ M)
        iterates.append(M)
    return torch.stack(iterates, dim=-3)


def momentum_descent(X: torch.Tensor, y: torch.Tensor, eta, mu, num_steps: int,
                     nesterov: bool = False) -> torch.Tensor:
    """Iterates of heavy-ball momentum (or Nesterov's method) on the loss of :func:`gradient_descent`.

    Heavy ball (Polyak): ``w_{k+1} = w_k - eta_k grad L(w_k) + mu_k (w_k - w_{k-1})``;
    Nesterov: ``v_k = w_k + mu_k (w_k - w_{k-1})``, ``w_{k+1} = v_k - eta_k grad L(v_k)``;
    ``w_{-1} = w_0 = 0``.  ``eta`` and ``mu`` are numbers or hold one value per step
    (differentiable).  Shapes: ``X`` (B, n, d), ``y`` (B, n) -> (B, num_steps + 1, d), ``w_0`` first.
    """
    check_context(X, y)
    check_count(num_steps, "num_steps", minimum=0)
    n = X.shape[-2]
    steps, momenta = _step_sizes(eta, num_steps, X), _step_sizes(mu, num_steps, X)
    Sigma = X.transpose(-1, -2) @ X / n
    alpha = (X.transpose(-1, -2) @ y.unsqueeze(-1)).squeeze(-1) / n
    iterates = [torch.zeros_like(alpha)]
    previous = iterates[0]
    for step in range(num_steps):
        w = iterates[-1]
        velocity = momenta[step] * (w - previous)
        point = w + velocity if nesterov else w
        gradient = (Sigma @ point.unsqueeze(-1)).squeeze(-1) - alpha
        previous = w
        iterates.append(w + velocity - steps[step] * gradient)
    return torch.stack(iterates, dim=1)


def tune_momentum(batch: TaskBatch, num_steps: int, nesterov: bool = False) -> tuple[float, float]:
    """One step size ``eta`` and one momentum ``mu`` (shared by all steps) for :func:`momentum_descent`.

    They minimise the mean loss of the last iterate on ``batch`` (L-BFGS, float64, ``eta`` kept
    positive, ``mu`` any real number), from ``eta = n / (n + d + 1)``, ``mu = 0.3``.  ``mu`` is not
    confined to (0, 1): over a fixed number of steps the method is a fixed polynomial in the context's
    covariance whatever ``mu`` is, and Nesterov's best ``mu`` at two steps is above 1 on chapter 5's
    data (about 1.3-1.4), so a cap at 1 would leave that baseline tuned at the edge of its range.
    Tune on one sample, score on another.  Returns ``(eta, mu)``.
    """
    batch = batch.to(dtype=torch.float64)
    n, d = batch.n, batch.d
    raw = torch.tensor([math.log(n / (n + d + 1)), 0.3], dtype=torch.float64,
                       requires_grad=True)
    optimizer = torch.optim.LBFGS([raw], max_iter=200, line_search_fn="strong_wolfe",
                                  tolerance_grad=1e-12, tolerance_change=1e-14)

    def mean_loss():
        optimizer.zero_grad()
        loss = _mean_weight_loss(momentum_descent(batch.X, batch.y, torch.exp(raw[0]), raw[1], num_steps,
                                                  nesterov)[:, -1], batch)
        loss.backward()
        return loss

    optimizer.step(mean_loss)
    raw = raw.detach()
    return float(torch.exp(raw[0])), float(raw[1])
