"""Closed-form learners that read the same context as the transformer.

Every learner maps a :class:`~icl_course.data.TaskBatch` of ``B`` tasks to weights
``w_hat`` of shape (B, d); its prediction is ``<w_hat, x_t>``.  So a learner can be scored as it
is, ``adjusted_loss(least_squares, tasks)``; :func:`least_squares` and :func:`ridge` (and
:func:`noise_variance_estimate`) also take the context as tensors, ``least_squares(X, y)``.
Ridge regression follows Vladymyrov et al. 2024, eq. (5): ``w = (Sigma + ridge_lambda I)^-1 alpha``
with ``Sigma = X^T X`` and ``alpha = X^T y``, so the oracle's ``ridge_lambda`` is the task's ``sigma^2``.

The three noise-adaptive baselines of Vladymyrov et al. (2024), section 6:

* :class:`ConstRR`: one ``ridge_lambda`` for every task, tuned on a sample;
* :class:`AdaRR`: ``ridge_lambda = sigma_est^2``, the unbiased estimate
  ``sum_j (y_j - <w_ols, x_j>)^2 / (n - d)`` (needs ``n > d``);
* :class:`TunedRR`: ``ridge_lambda = min(factor * sigma_est^2, cap)`` with both tuned.

The iterative optimisers (gradient descent, conjugate gradient, Newton's iteration, momentum, and
:func:`~icl_course.optimizers.tune_step_sizes`) live in :mod:`icl_course.optimizers`.  They are
not learners of this kind: they take the tensors ``X, y`` and return the whole path of iterates,
(B, num_steps + 1, d), so that a chapter can set step ``l`` beside a transformer's layer ``l``.

Tuning uses one eigendecomposition of ``Sigma`` per task, after which the ridge solution
for any ``ridge_lambda`` costs O(d) per task: a whole grid of values is cheap.
"""

from __future__ import annotations

import torch

from .data import (
    CategoricalNoise,
    FixedNoise,
    NoiseLike,
    TaskBatch,
    UniformNoise,
    as_noise,
    check_context,
    context_of,
)
from .linalg import solve_positive_definite, symmetric_eigh

__all__ = [
    "least_squares",
    "ridge",
    "oracle_ridge",
    "noise_variance_estimate",
    "ConstRR",
    "AdaRR",
    "TunedRR",
    "BayesOptimal",
]


def _check_overdetermined(X: torch.Tensor, method: str, strict: bool) -> None:
    n, d = X.shape[-2], X.shape[-1]
    if strict and n <= d:
        raise ValueError(
            f"{method} needs more context examples than dimensions (n > d), got n={n}, d={d}: "
            "the noise estimate divides by n - d. Use ridge() or oracle_ridge() instead."
        )
    if not strict and n < d:
        raise ValueError(
            f"{method} needs at least as many context examples as dimensions (n >= d), got "
            f"n={n}, d={d}: Sigma = X^T X is singular. Use ridge() with a positive ridge_lambda."
        )


def _normal_equations(batch, y=None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(X, Sigma, alpha)`` of a :class:`TaskBatch`, or of ``X`` (B, n, d) and ``y`` (B, n), checked:
    ``Sigma = X^T X`` (B, d, d) and ``alpha = X^T y`` (B, d)."""
    X, y, _ = context_of(batch, y)
    check_context(X, y)
    if isinstance(batch, TaskBatch):
        return X, batch.Sigma, batch.alpha
    return X, X.transpose(-1, -2) @ X, (X.transpose(-1, -2) @ y.unsqueeze(-1)).squeeze(-1)


def least_squares(batch, y: torch.Tensor | None = None) -> torch.Tensor:
    """Ordinary least squares per task, ``w* = Sigma^-1 alpha`` (Vladymyrov et al. 2024, eq. 4).

    ``least_squares(batch)`` for a :class:`TaskBatch`, or ``least_squares(X, y)``.
    Shapes: ``X`` (B, n, d), ``y`` (B, n) -> (B, d).  Needs ``n >= d``.
    """
    X, Sigma, alpha = _normal_equations(batch, y)
    _check_overdetermined(X, "least squares", strict=False)
    # The normal equations: at these sizes one batched Cholesky solve is several times faster
    # than a QR-based lstsq, and Sigma is well conditioned unless n is close to d.
    return solve_positive_definite(Sigma, alpha.unsqueeze(-1), "least squares").squeeze(-1)


def ridge(batch, y=None, ridge_lambda=None) -> torch.Tensor:
    """Ridge regression per task, ``(Sigma + ridge_lambda I)^-1 alpha`` (Vladymyrov et al. 2024, eq. 5).

    ``ridge(batch, ridge_lambda)`` for a :class:`TaskBatch`, or ``ridge(X, y, ridge_lambda)``.
    Shapes: ``X`` (B, n, d), ``y`` (B, n), ``ridge_lambda`` a number or (B,) -> (B, d).
    """
    if isinstance(batch, TaskBatch):   # the second argument, if any, is ridge_lambda: the batch has its y
        if y is not None and ridge_lambda is not None:
            raise TypeError("ridge(batch, ridge_lambda) takes the labels from the batch: pass ridge_lambda only")
        y, ridge_lambda = None, (y if ridge_lambda is None else ridge_lambda)
    if ridge_lambda is None:
        raise TypeError("ridge needs ridge_lambda: ridge(batch, ridge_lambda) or ridge(X, y, ridge_lambda)")
    X, Sigma, alpha = _normal_equations(batch, y)
    ridge_lambda = torch.as_tensor(ridge_lambda, dtype=X.dtype, device=X.device)
    if ridge_lambda.dim() > 1 or (ridge_lambda.dim() == 1 and ridge_lambda.shape[0] != X.shape[0]):
        raise ValueError(f"ridge_lambda must be a number or have shape ({X.shape[0]},), "
                         f"got {tuple(ridge_lambda.shape)}")
    if (ridge_lambda < 0).any():
        raise ValueError("ridge_lambda must be >= 0")
    if X.shape[-2] < X.shape[-1] and (ridge_lambda == 0).any():
        raise ValueError(
            f"ridge with ridge_lambda = 0 is least squares, which needs n >= d (got n={X.shape[-2]}, "
            f"d={X.shape[-1]}): Sigma is singular. Use a positive ridge_lambda"
        )
    regulariser = ridge_lambda.reshape(-1, 1, 1) * torch.eye(X.shape[-1], dtype=X.dtype, device=X.device)
    return solve_positive_definite(Sigma + regulariser, alpha.unsqueeze(-1), "ridge").squeeze(-1)


def oracle_ridge(batch: TaskBatch) -> torch.Tensor:
    """Ridge that knows each task's noise, ``ridge_lambda = sigma^2``: (B, d).

    With ``w ~ N(0, I)`` this is the posterior mean of ``w``, the best any learner can do
    when it is told ``sigma``; the adjusted loss of Table 1 is measured against it.
    """
    return ridge(batch, batch.sigma**2)


def noise_variance_estimate(batch, y: torch.Tensor | None = None) -> torch.Tensor:
    """The unbiased estimate ``sum_j (y_j - <w_ols, x_j>)^2 / (n - d)`` per task: (B,).

    ``noise_variance_estimate(batch)`` for a :class:`TaskBatch`, or ``noise_variance_estimate(X, y)``.
    Shapes: ``X`` (B, n, d), ``y`` (B, n).  Needs ``n > d``.
    """
    X, y, _ = context_of(batch, y)
    check_context(X, y)
    _check_overdetermined(X, "the noise-variance estimate", strict=True)
    n, d = X.shape[-2], X.shape[-1]
    residuals = y - (X @ least_squares(batch, y).unsqueeze(-1)).squeeze(-1)
    return (residuals**2).sum(-1) / (n - d)


class _Spectrum:
    """``Sigma = V diag(e) V^T`` per task, so that ridge for any ``ridge_lambda`` is O(d).

    ``w(ridge_lambda) = V (beta / (e + ridge_lambda))`` with ``beta = V^T alpha``; the
    squared error against the truth is ``||beta / (e + ridge_lambda) - V^T w||^2``.
    """

    def __init__(self, batch: TaskBatch):
        batch = batch.to(dtype=torch.float64)
        self.eigenvalues, self.vectors = symmetric_eigh(batch.Sigma)
        self.beta = (self.vectors.transpose(-1, -2) @ batch.alpha.unsqueeze(-1)).squeeze(-1)
        self.rotated_truth = (self.vectors.transpose(-1, -2) @ batch.w.unsqueeze(-1)).squeeze(-1)
        self.covariance = batch.covariance

    def half_squared_errors(self, ridge_lambdas: torch.Tensor) -> torch.Tensor:
        """``1/2 ||w(ridge_lambda) - w||_S^2`` for a grid of K values: (K,) or (K, B) -> (K, B)."""
        shape = (-1, 1, 1) if ridge_lambdas.dim() == 1 else (ridge_lambdas.shape[0], -1, 1)
        error = self.beta / (self.eigenvalues + ridge_lambdas.reshape(shape)) - self.rotated_truth
        if self.covariance is None:
            return 0.5 * (error**2).sum(-1)
        # back in the original coordinates the error is V @ error; weigh it by the query covariance S
        error = torch.einsum("bij,kbj->kbi", self.vectors, error)
        return 0.5 * torch.einsum("kbi,ij,kbj->kb", error, self.covariance.to(error), error)


def _minimise_over_log(mean_loss, low: float, high: float, coarse: int = 21, iterations: int = 24) -> float:
    """Minimise ``mean_loss`` over a positive parameter between ``10**low`` and ``10**high``.

    ``mean_loss`` maps a (K,) tensor of values to their (K,) mean losses.  A coarse grid in
    ``log10`` brackets the minimum, then golden-section search narrows the bracket.
    """
    grid = torch.linspace(low, high, coarse, dtype=torch.float64)
    best = int(mean_loss(10**grid).argmin())
    left, right = float(grid[max(best - 1, 0)]), float(grid[min(best + 1, coarse - 1)])
    ratio = (5**0.5 - 1) / 2
    evaluate = lambda point: float(mean_loss(torch.tensor([10**point], dtype=torch.float64))[0])  # noqa: E731
    inner_left, inner_right = right - ratio * (right - left), left + ratio * (right - left)
    loss_left, loss_right = evaluate(inner_left), evaluate(inner_right)
    for _ in range(iterations):
        if loss_left <= loss_right:
            right, inner_right, loss_right = inner_right, inner_left, loss_left
            inner_left = right - ratio * (right - left)
            loss_left = evaluate(inner_left)
        else:
            left, inner_left, loss_left = inner_left, inner_right, loss_right
            inner_right = left + ratio * (right - left)
            loss_right = evaluate(inner_right)
    return 10 ** ((left + right) / 2)


class ConstRR:
    """Ridge with one ``ridge_lambda`` for all tasks, tuned to minimise the mean loss.

    ``fit(batch)`` tunes on a sample of the task distribution; calling the fitted object on
    another batch returns its weights (B, d).  (Vladymyrov et al. 2024, section 6, "ConstRR".)
    """

    def __init__(self, ridge_lambda: float | None = None):
        self.ridge_lambda = ridge_lambda

    def fit(self, batch: TaskBatch) -> "ConstRR":
        """Tune ``ridge_lambda`` on ``batch`` (use a different sample to score)."""
        spectrum = _Spectrum(batch)
        self.ridge_lambda = _minimise_over_log(
            lambda values: spectrum.half_squared_errors(values).mean(-1), -6.0, 4.0)
        return self

    def __call__(self, batch: TaskBatch) -> torch.Tensor:
        if self.ridge_lambda is None:
            raise RuntimeError("ConstRR is not tuned yet: call .fit(tuning_batch) first, or pass ridge_lambda")
        return ridge(batch, self.ridge_lambda)

    def __repr__(self) -> str:
        return f"ConstRR(ridge_lambda={self.ridge_lambda})"


class AdaRR:
    """Ridge with ``ridge_lambda = sigma_est^2``, the unbiased noise estimate (needs ``n > d``)."""

    def fit(self, batch: TaskBatch) -> "AdaRR":
        """Nothing to tune; present so that every baseline can be used the same way."""
        return self

    def __call__(self, batch: TaskBatch) -> torch.Tensor:
        return ridge(batch, noise_variance_estimate(batch))

    def __repr__(self) -> str:
        return "AdaRR()"


class TunedRR:
    """Ridge with ``ridge_lambda = min(factor * sigma_est^2, cap)``; ``factor``, ``cap`` tuned."""

    def __init__(self, factor: float | None = None, cap: float | None = None):
        self.factor, self.cap = factor, cap

    def fit(self, batch: TaskBatch) -> "TunedRR":
        """Tune ``factor`` and ``cap`` on ``batch`` by coordinate descent on the mean loss."""
        spectrum = _Spectrum(batch)
        estimate = noise_variance_estimate(batch.to(dtype=torch.float64))
        factor, cap = 1.0, float(estimate.max())
        for _ in range(2):  # a second pass changes the tuned loss by well under 0.1%
            factor = _minimise_over_log(lambda values: spectrum.half_squared_errors(
                torch.clamp(values.unsqueeze(-1) * estimate, max=cap)).mean(-1), -2.0, 2.0)
            cap = _minimise_over_log(lambda values: spectrum.half_squared_errors(
                torch.minimum(factor * estimate, values.unsqueeze(-1))).mean(-1), -4.0, 4.0)
        self.factor, self.cap = factor, cap
        return self

    def __call__(self, batch: TaskBatch) -> torch.Tensor:
        if self.factor is None:
            raise RuntimeError("TunedRR is not tuned yet: call .fit(tuning_batch) first, or pass factor and cap")
        estimate = noise_variance_estimate(batch)
        return ridge(batch, torch.clamp(self.factor * estimate, max=self.cap))

    def __repr__(self) -> str:
        return f"TunedRR(factor={self.factor}, cap={self.cap})"


class BayesOptimal:
    """The posterior mean of ``w`` when the learner knows the noise *prior* but not the task's ``sigma``.

    Beyond Vladymyrov et al. 2024: the oracle ridge knows each task's ``sigma``, which no
    learner can; this is the best any learner can do.  With ``w ~ N(0, I)``, given ``sigma`` the
    posterior mean is the ridge solution ``(Sigma + sigma^2 I)^-1 alpha`` and the labels are
    ``y ~ N(0, X X^T + sigma^2 I)``; so the answer averages the ridge solutions over the posterior of
    ``sigma``, ``p(sigma | X, y) ∝ p(sigma) N(y; 0, X X^T + sigma^2 I)``.  A uniform prior is integrated
    with ``num_levels`` midpoints (one-dimensional quadrature), a categorical one exactly.  One SVD of
    ``X`` per task makes every level cost O(d).

    >>> BayesOptimal(UniformNoise(3))(batch)    # (B, d)
    """

    def __init__(self, noise: NoiseLike, num_levels: int = 128):
        noise = as_noise(noise)
        if isinstance(noise, FixedNoise):
            levels = [noise.sigma]
        elif isinstance(noise, UniformNoise):
            levels = [(k + 0.5) * noise.sigma_max / num_levels for k in range(num_levels)]
        elif isinstance(noise, CategoricalNoise):
            levels = list(noise.levels)
        else:
            raise TypeError(f"BayesOptimal knows FixedNoise, UniformNoise and CategoricalNoise, not {noise!r}")
        self.noise = noise
        self.levels = torch.tensor(levels, dtype=torch.float64)

    def posterior(self, batch: TaskBatch) -> torch.Tensor:
        """``p(sigma_k | context)`` for every level: (B, K)."""
        return self._chunked(batch)[1]

    def __call__(self, batch: TaskBatch) -> torch.Tensor:
        """The posterior mean of ``w``: (B, d)."""
        return self._chunked(batch)[0].to(batch.X.dtype)

    def _chunked(self, batch: TaskBatch):
        X, y = batch.X.double(), batch.y.double()
        check_context(X, y)
        # (chunk, K, d) intermediates: keep them to a few hundred MB whatever the batch size
        size = max(1, 2**24 // (len(self.levels) * X.shape[-1]))
        parts = [self._solve(X_part, y_part) for X_part, y_part in zip(X.split(size), y.split(size))]
        return torch.cat([part[0] for part in parts]), torch.cat([part[1] for part in parts])

    def _solve(self, X: torch.Tensor, y: torch.Tensor):
        n, d = X.shape[-2:]
        if n >= d:
            # X = U S V^T through the eigendecomposition of Sigma = V S^2 V^T: a batched SVD of X costs
            # about 15 times more on a CPU.  Only S U^T y = V^T alpha and (U^T y)^2 = (V^T alpha)^2 / S^2 are
            # needed, and alpha lies in the span of those directions, so a small S divides a small number.
            eigenvalues, V = symmetric_eigh(X.transpose(-1, -2) @ X)
            S, Vh = eigenvalues.clamp_min(torch.finfo(X.dtype).tiny).sqrt(), V.transpose(-1, -2)
            projected = (Vh @ (X.transpose(-1, -2) @ y.unsqueeze(-1))).squeeze(-1) / S
        else:
            U, S, Vh = torch.linalg.svd(X, full_matrices=False)       # rank k = min(n, d)
            projected = (U.transpose(-1, -2) @ y.unsqueeze(-1)).squeeze(-1)  # (B, k)
        if bool((self.levels == 0).any()):
            if len(self.levels) > 1:
                raise ValueError("a prior with an atom at sigma = 0 next to other levels is not supported")
            # sigma = 0 is known: the posterior mean is the minimum-norm interpolant
            solution = (Vh.transpose(-1, -2) @ (projected / S).unsqueeze(-1)).squeeze(-1)
            return solution, torch.ones(X.shape[0], 1, dtype=torch.float64)
        residual = ((y * y).sum(-1) - (projected * projected).sum(-1)).clamp_min(0)
        zeros = n - S.shape[-1]                                          # eigenvalues of X X^T that are 0
        noise_variance = self.levels.to(X).pow(2)                        # (K,)
        squares = S.unsqueeze(-2) ** 2 + noise_variance[:, None]         # (B, K, k)
        log_likelihood = -0.5 * ((projected.unsqueeze(-2) ** 2 / squares).sum(-1) + squares.log().sum(-1)
                                 + residual.unsqueeze(-1) / noise_variance + zeros * noise_variance.log())
        posterior = torch.softmax(log_likelihood, dim=-1)                # the prior is flat over the levels
        shrunk = S.unsqueeze(-2) * projected.unsqueeze(-2) / squares     # (B, K, k): ridge in the SVD basis
        solution = ((posterior.unsqueeze(-1) * shrunk).sum(-2).unsqueeze(-2) @ Vh).squeeze(-2)
        return solution, posterior

    def __repr__(self) -> str:
        return f"BayesOptimal({self.noise.label})"
