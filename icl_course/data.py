"""The in-context regression task and its samplers (the notation card, NOTATION.md).

A task draws a weight vector ``w``, ``n`` context inputs ``x_i`` and a query ``x_t``;
the labels are ``y_i = <w, x_i> + xi_i`` with ``xi_i ~ N(0, sigma^2)`` and the query's
target ``y_t = <w, x_t>`` carries no noise.  The noise level ``sigma`` may be the same
for every task (:class:`FixedNoise`) or drawn per task (:class:`UniformNoise`,
:class:`CategoricalNoise`), as in the mixed-noise problems of Vladymyrov et al. (2024),
section 2.3.

Shapes use ``B`` for the number of tasks in a batch, ``n`` for context examples and
``d`` for the input dimension.  A token is ``e_i = (x_i, y_i)`` in ``R^(d+1)``; the query
token is ``e_t = (x_t, 0)``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Sequence, Union

import torch

from .linalg import singular_mask, symmetric_eigh
from .runtime import check_count, make_generator, resolve_device, resolve_dtype

__all__ = [
    "TaskBatch",
    "NoiseDistribution",
    "FixedNoise",
    "UniformNoise",
    "CategoricalNoise",
    "as_noise",
    "RegressionTasks",
    "StretchedTasks",
    "stretch",
    "STRETCH_SCALES",
    "STRETCH_FRACTION",
    "context_gram",
    "check_context",
]


# ----------------------------------------------------------------------------- noise


class NoiseDistribution:
    """The law of a task's noise level ``sigma``; subclasses say how it is drawn."""

    def sample(self, num_tasks: int, generator: torch.Generator) -> torch.Tensor:
        """Draw ``num_tasks`` noise levels, shape ``(num_tasks,)``, float64 on the CPU."""
        raise NotImplementedError

    @property
    def second_moment(self) -> float:
        """``E[sigma^2]``, the quantity the one-layer optimum depends on (chapter 2)."""
        raise NotImplementedError

    @property
    def largest(self) -> float:
        """The largest noise level the distribution can draw."""
        raise NotImplementedError

    @property
    def label(self) -> str:
        """A short name for tables and legends, such as ``"U(0, 3)"``."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.label})"


def _check_level(value: float, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{what} must be a number, got {type(value).__name__}")
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{what} must be a finite number >= 0, got {value}")
    return float(value)


class FixedNoise(NoiseDistribution):
    """Every task has the same noise level ``sigma`` (``sigma = 0``: noiseless)."""

    def __init__(self, sigma: float = 0.0):
        self.sigma = _check_level(sigma, "sigma")

    def sample(self, num_tasks, generator):
        return torch.full((num_tasks,), self.sigma, dtype=torch.float64)

    @property
    def second_moment(self):
        return self.sigma**2

    @property
    def largest(self):
        return self.sigma

    @property
    def label(self):
        return f"sigma={self.sigma:g}"


class UniformNoise(NoiseDistribution):
    """``sigma ~ U(0, sigma_max)`` per task: the columns 0..7 of Table 1 (Vladymyrov et al. 2024)."""

    def __init__(self, sigma_max: float):
        self.sigma_max = _check_level(sigma_max, "sigma_max")

    def sample(self, num_tasks, generator):
        return torch.rand(num_tasks, generator=generator, dtype=torch.float64) * self.sigma_max

    @property
    def second_moment(self):
        return self.sigma_max**2 / 3

    @property
    def largest(self):
        return self.sigma_max

    @property
    def label(self):
        return f"U(0, {self.sigma_max:g})"


class CategoricalNoise(NoiseDistribution):
    """``sigma`` uniform over a finite set of levels, e.g. ``{1, 3}``: Table 1's last columns."""

    def __init__(self, levels: Sequence[float]):
        levels = list(levels)
        if not levels:
            raise ValueError("CategoricalNoise needs at least one noise level, e.g. CategoricalNoise([1, 3])")
        self.levels = tuple(_check_level(level, "each noise level") for level in levels)

    def sample(self, num_tasks, generator):
        table = torch.tensor(self.levels, dtype=torch.float64)
        index = torch.randint(len(self.levels), (num_tasks,), generator=generator)
        return table[index]

    @property
    def second_moment(self):
        return sum(level**2 for level in self.levels) / len(self.levels)

    @property
    def largest(self):
        return max(self.levels)

    @property
    def label(self):
        return "{" + ", ".join(f"{level:g}" for level in self.levels) + "}"


NoiseLike = Union[float, int, NoiseDistribution]


def as_noise(noise: NoiseLike) -> NoiseDistribution:
    """A number means :class:`FixedNoise`; a :class:`NoiseDistribution` passes through."""
    if isinstance(noise, NoiseDistribution):
        return noise
    if isinstance(noise, (int, float)) and not isinstance(noise, bool):
        return FixedNoise(noise)
    raise TypeError(
        "noise must be a number (a fixed sigma) or a NoiseDistribution such as "
        f"UniformNoise(3) or CategoricalNoise([1, 3]); got {noise!r}"
    )


# ----------------------------------------------------------------------------- batches


def check_context(X: torch.Tensor, y: torch.Tensor) -> None:
    """A clear ``ValueError`` unless ``X`` is (B, n, d) and ``y`` is (B, n)."""
    if not isinstance(X, torch.Tensor) or not isinstance(y, torch.Tensor):
        raise TypeError(f"X and y must be tensors, got {type(X).__name__} and {type(y).__name__}")
    if X.dim() != 3 or y.dim() != 2 or X.shape[:2] != y.shape:
        raise ValueError(
            f"expected X of shape (B, n, d) and y of shape (B, n); got {tuple(X.shape)} and {tuple(y.shape)}"
        )


def context_of(batch, y=None, x_t=None) -> tuple:
    """``(X, y, x_t)`` from a :class:`TaskBatch`, or from ``X`` (B, n, d), ``y`` (B, n) and an optional
    ``x_t`` (B, d) passed separately: the two ways the models and learners accept tasks."""
    if isinstance(batch, TaskBatch):
        return batch.X, batch.y, batch.x_t
    if y is None:
        raise ValueError("pass a TaskBatch, or both X (B, n, d) and y (B, n)")
    return batch, y, x_t


def context_gram(X: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The Gram matrix of the context tokens, ``G = sum_i e_i e_i^T``.

    Shapes: ``X`` (B, n, d), ``y`` (B, n) -> ``G`` (B, d+1, d+1), with blocks
    ``[[Sigma, alpha], [alpha^T, lambda]]`` (Vladymyrov et al. 2024, section 2.1).
    """
    tokens = torch.cat([X, y.unsqueeze(-1)], dim=-1)
    return tokens.transpose(-1, -2) @ tokens


@dataclass(frozen=True)
class TaskBatch:
    """A batch of ``B`` regression tasks.

    Attributes (shapes):
        X: (B, n, d) context inputs ``x_i``.
        y: (B, n) context labels ``y_i = <w, x_i> + xi_i``.
        x_t: (B, d) query inputs.
        y_t: (B,) query targets ``<w, x_t>`` (noiseless).
        w: (B, d) the task's true weights.
        sigma: (B,) the task's noise level.
        covariance: (d, d) the covariance ``S`` of every ``x`` (context and query),
            or None for the identity.
        importance_weight: (B,) ``p/q`` of each task when the batch was drawn from another law ``q`` than
            the one it stands for (:class:`StretchedTasks`), or None; the estimates of
            :mod:`icl_course.evaluate` multiply every task's value by it.
    """

    X: torch.Tensor
    y: torch.Tensor
    x_t: torch.Tensor
    y_t: torch.Tensor
    w: torch.Tensor
    sigma: torch.Tensor
    covariance: torch.Tensor | None = None
    importance_weight: torch.Tensor | None = None

    @property
    def num_tasks(self) -> int:
        """``B``."""
        return self.X.shape[0]

    @property
    def n(self) -> int:
        """Context examples per task."""
        return self.X.shape[1]

    @property
    def d(self) -> int:
        """Input dimension."""
        return self.X.shape[2]

    @property
    def tokens(self) -> torch.Tensor:
        """Context tokens then the query token ``(x_t, 0)``: shape (B, n+1, d+1)."""
        context = torch.cat([self.X, self.y.unsqueeze(-1)], dim=-1)
        query = torch.cat([self.x_t, torch.zeros_like(self.y_t).unsqueeze(-1)], dim=-1)
        return torch.cat([context, query.unsqueeze(1)], dim=1)

    @property
    def gram(self) -> torch.Tensor:
        """``G`` of the context tokens, (B, d+1, d+1); see :func:`context_gram`."""
        return context_gram(self.X, self.y)

    @property
    def Sigma(self) -> torch.Tensor:
        """``Sigma = sum_i x_i x_i^T``, (B, d, d)."""
        return self.X.transpose(-1, -2) @ self.X

    @property
    def alpha(self) -> torch.Tensor:
        """``alpha = sum_i y_i x_i``, (B, d)."""
        return (self.X * self.y.unsqueeze(-1)).sum(dim=1)

    @property
    def label_energy(self) -> torch.Tensor:
        """The papers' ``lambda = sum_i y_i^2``, (B,)."""
        return (self.y**2).sum(dim=1)

    def to(self, device=None, dtype=None) -> "TaskBatch":
        """The same tasks on another device or in another floating dtype."""
        def move(tensor):
            return None if tensor is None else tensor.to(device=device, dtype=dtype)

        return TaskBatch(*(move(getattr(self, name)) for name in
                           ("X", "y", "x_t", "y_t", "w", "sigma", "covariance", "importance_weight")))

    def __getitem__(self, index) -> "TaskBatch":
        """Select tasks, e.g. ``batch[:10]``; the covariance is shared and kept."""
        weight = None if self.importance_weight is None else self.importance_weight[index]
        return replace(self, X=self.X[index], y=self.y[index], x_t=self.x_t[index],
                       y_t=self.y_t[index], w=self.w[index], sigma=self.sigma[index], importance_weight=weight)


# ----------------------------------------------------------------------------- sampler


def _cholesky_factor(matrix, d: int, name: str) -> torch.Tensor:
    matrix = torch.as_tensor(matrix, dtype=torch.float64)
    if matrix.shape != (d, d):
        raise ValueError(f"{name} must have shape ({d}, {d}) for d={d}, got {tuple(matrix.shape)}")
    if not torch.allclose(matrix, matrix.T, atol=1e-10, rtol=1e-8):
        raise ValueError(f"{name} must be symmetric")
    if bool(singular_mask(matrix)):
        raise ValueError(f"{name} must be positive definite, and this one is singular (or nearly, in float64)")
    return torch.linalg.cholesky(matrix)


class RegressionTasks:
    """Sampler of in-context linear regression tasks.

    ``x ~ N(0, covariance)`` (identity by default), ``w ~ N(weight_mean, weight_covariance)``
    (zero mean and identity by default), ``sigma`` from ``noise`` (a number or a
    :class:`NoiseDistribution`).  Draws happen on the CPU from the given generator and are
    then cast and moved, so a seed means the same tasks on every device and in both dtypes.

    >>> tasks = RegressionTasks(d=10, n=20, noise=UniformNoise(3))
    >>> batch = tasks.sample(2048, seed=0)          # X: (2048, 20, 10)
    """

    def __init__(self, d: int, n: int, noise: NoiseLike = 0.0, covariance=None,
                 weight_covariance=None, weight_mean=None, dtype: str | torch.dtype = torch.float32,
                 device: str | torch.device = "auto"):
        self.d = check_count(d, "d")
        self.n = check_count(n, "n")
        self.noise = as_noise(noise)
        self.dtype = resolve_dtype(dtype)
        self.device = resolve_device(device)
        self.covariance = None if covariance is None else torch.as_tensor(covariance, dtype=torch.float64)
        self._x_factor = None if covariance is None else _cholesky_factor(covariance, d, "covariance")
        self.weight_covariance = (None if weight_covariance is None
                                  else torch.as_tensor(weight_covariance, dtype=torch.float64))
        self._w_factor = (None if weight_covariance is None
                          else _cholesky_factor(weight_covariance, d, "weight_covariance"))
        self.weight_mean = None
        if weight_mean is not None:
            self.weight_mean = torch.as_tensor(weight_mean, dtype=torch.float64)
            if self.weight_mean.shape != (d,):
                raise ValueError(f"weight_mean must have shape ({d},), got {tuple(self.weight_mean.shape)}")

    def with_noise(self, noise: NoiseLike) -> "RegressionTasks":
        """The same sampler with another noise law (used for per-noise profiles)."""
        clone = RegressionTasks.__new__(RegressionTasks)
        clone.__dict__.update(self.__dict__)
        clone.noise = as_noise(noise)
        return clone

    def _draw(self, num_tasks: int, seed) -> tuple:
        """The generator and the draws of ``num_tasks`` tasks, in float64: ``sigma`` (B,), ``w`` (B, d), the
        inputs of the context and the query (B, n+1, d) and the label noise (B, n), all standard but ``sigma``."""
        check_count(num_tasks, "num_tasks")
        generator = make_generator(seed)
        B, n, d = num_tasks, self.n, self.d
        sigma = self.noise.sample(B, generator)
        # Standard normals are drawn in float32 (five times faster than float64 on a CPU)
        # and everything after is computed in float64, so both dtypes see the same tasks.
        w = torch.randn(B, d, generator=generator).double()
        inputs = torch.randn(B, n + 1, d, generator=generator).double()
        noise = torch.randn(B, n, generator=generator).double()
        return generator, sigma, w, inputs, noise

    def sample(self, num_tasks: int, seed: int | torch.Generator | None = None) -> TaskBatch:
        """Draw ``num_tasks`` tasks; ``seed`` is an int or a ``torch.Generator`` (advanced in place).

        An int (or None, meaning 0) gives the same tasks on every call; pass one generator to
        successive calls to draw a stream of fresh batches.

        Returns a :class:`TaskBatch` with ``X`` (B, n, d), ``y`` (B, n), ``x_t`` (B, d),
        ``y_t`` (B,), ``w`` (B, d), ``sigma`` (B,).
        """
        _, sigma, w, inputs, noise = self._draw(num_tasks, seed)
        n = self.n
        if self._w_factor is not None:
            w = w @ self._w_factor.T
        if self.weight_mean is not None:
            w = w + self.weight_mean
        if self._x_factor is not None:
            inputs = inputs @ self._x_factor.T
        X, x_t = inputs[:, :n], inputs[:, n]
        y = (X @ w.unsqueeze(-1)).squeeze(-1) + sigma.unsqueeze(-1) * noise
        y_t = (x_t * w).sum(-1)
        batch = TaskBatch(X=X, y=y, x_t=x_t, y_t=y_t, w=w, sigma=sigma, covariance=self.covariance)
        return batch.to(device=self.device, dtype=self.dtype)

    def __repr__(self) -> str:
        extra = ("" if self.covariance is None else ", covariance=S") + \
            ("" if self.weight_covariance is None else ", weight_covariance=C") + \
            ("" if self.weight_mean is None else ", weight_mean=m")
        return f"RegressionTasks(d={self.d}, n={self.n}, noise={self.noise.label}{extra})"


#: :class:`StretchedTasks`' default mixture: the factors a stretched direction gets, and the share of tasks stretched
STRETCH_SCALES, STRETCH_FRACTION = (0.25, 0.5, 1.5, 2.0, 2.5), 0.5


def stretch(Z: torch.Tensor, scales: Sequence[float], fraction: float,
            generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """The draws of :class:`StretchedTasks`: standard context inputs ``Z`` (B, n, d), float64, of which a share
    ``fraction`` of the tasks get one coordinate (uniform) scaled by a factor (uniform from ``scales``); returns
    the stretched inputs (B, n, d) and each task's ``importance_weight = p(Z) / q(Z)`` (B,), at most
    ``1 / (1 - fraction)``.  The two draws from ``generator`` (on ``Z``'s device) come after whatever it drew
    before."""
    B, n, d = Z.shape
    on = {"device": Z.device}   # the generator's device (a sweep draws on the GPU it trains on)
    stretched = torch.rand(B, generator=generator, **on) < fraction
    component = torch.randint(0, len(scales) * d, (B,), generator=generator, **on)
    factors = torch.tensor(scales, dtype=torch.float64, **on)
    factor = torch.ones(B, d, dtype=torch.float64, **on)
    factor[torch.arange(B, **on), component % d] = torch.where(stretched, factors[component // d], 1.0)
    Z = Z * factor.unsqueeze(1)
    columns = (Z**2).sum(1)                                                           # ||Z e_k||^2, (B, d)
    log_ratios = (-n * torch.log(factors)[:, None, None]
                  + 0.5 * (1 - factors**-2)[:, None, None] * columns.unsqueeze(0))    # (S, B, d)
    log_mixture = torch.logsumexp(log_ratios.transpose(0, 1).reshape(B, -1), dim=1) - math.log(factors.numel() * d)
    log_q = torch.logaddexp(torch.full_like(log_mixture, math.log1p(-fraction)), log_mixture + math.log(fraction))
    return Z, torch.exp(-log_q)


class StretchedTasks(RegressionTasks):
    """Tasks of :class:`RegressionTasks` with the rare ill-conditioned ones drawn on purpose.

    A defensive mixture for importance sampling: with probability ``1 - fraction`` a task is drawn as by
    :class:`RegressionTasks`; otherwise one coordinate ``k`` of every context input's standard draw ``z_i``
    (``x_i = L z_i``, ``L L^T`` the ``covariance``, identity by default), chosen uniformly, is multiplied by a
    factor ``s`` chosen uniformly from ``scales`` (``z_i ~ N(0, I + (s^2 - 1) e_k e_k^T)``), which makes an
    eigenvalue of ``Sigma`` unusually large (``s > 1``) or small (``s < 1``). Each task carries
    ``importance_weight = p(X) / q(X)``, with (``X e_k`` the standard draws' column ``k``)

        q(X) / p(X) = (1 - fraction) + fraction * mean over (s, k) of s^(-n) exp((1 - 1/s^2) ||X e_k||^2 / 2),

    at most ``1 / (1 - fraction)``, so the weighted mean of any per-task value estimates its mean under the plain
    law without bias, and tasks a plain sample meets once in millions are met in every chunk. The query, ``w``
    and the noise are drawn as by :class:`RegressionTasks` (``covariance``, ``weight_covariance`` and
    ``weight_mean`` as there).

    ``largest_eigenvalue_cap`` truncates the law: a task whose largest eigenvalue of ``Sigma`` is above it gets
    weight 0, so the weighted mean estimates ``E[value; lambda_max(Sigma) <= cap]``. A model of L layers computes a
    polynomial of ``Sigma`` that grows without bound beyond the spectra it was trained on, so its plain mean is
    carried by tasks far rarer than any sample reaches; the truncated mean compares models on the spectra a
    sample of a given size can meet.

    >>> tasks = StretchedTasks(d=10, n=20, noise=0.0)
    >>> batch = tasks.sample(1000, seed=0)       # batch.importance_weight: (1000,)
    """

    def __init__(self, d: int, n: int, noise: NoiseLike = 0.0, scales: Sequence[float] = STRETCH_SCALES,
                 fraction: float = STRETCH_FRACTION, largest_eigenvalue_cap: float = math.inf,
                 dtype: str | torch.dtype = torch.float32, device: str | torch.device = "auto",
                 covariance=None, weight_covariance=None, weight_mean=None):
        super().__init__(d, n, noise, covariance, weight_covariance, weight_mean, dtype=dtype, device=device)
        cap = largest_eigenvalue_cap
        if isinstance(cap, bool) or not isinstance(cap, (int, float)) or not cap > 0:
            raise ValueError(f"largest_eigenvalue_cap must be a positive number (or math.inf: no cap); got {cap!r}")
        self.largest_eigenvalue_cap = float(cap)
        if not scales or any(isinstance(s, bool) or not isinstance(s, (int, float)) or not 0 < s < math.inf
                             or s == 1 for s in scales):
            raise ValueError(f"scales must be positive factors other than 1, e.g. (0.5, 2.0); got {scales!r}")
        if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0 < fraction < 1:
            raise ValueError(f"fraction, the share of stretched tasks, must be strictly between 0 and 1; "
                             f"got {fraction!r}")
        self.scales, self.fraction = tuple(float(s) for s in scales), float(fraction)

    def sample(self, num_tasks: int, seed: int | torch.Generator | None = None) -> TaskBatch:
        """Draw ``num_tasks`` tasks as :meth:`RegressionTasks.sample`, each with its ``importance_weight``."""
        generator, sigma, w, inputs, noise = self._draw(num_tasks, seed)
        X, weight = stretch(inputs[:, :self.n], self.scales, self.fraction, generator)
        x_t = inputs[:, self.n]
        if self._x_factor is not None:
            X, x_t = X @ self._x_factor.T, x_t @ self._x_factor.T
        if self._w_factor is not None:
            w = w @ self._w_factor.T
        if self.weight_mean is not None:
            w = w + self.weight_mean
        y = (X @ w.unsqueeze(-1)).squeeze(-1) + sigma.unsqueeze(-1) * noise
        y_t = (x_t * w).sum(-1)
        if math.isfinite(self.largest_eigenvalue_cap):
            largest = symmetric_eigh(X.transpose(-1, -2) @ X, eigenvectors=False)[:, -1]
            weight = torch.where(largest <= self.largest_eigenvalue_cap, weight, 0.0)
        batch = TaskBatch(X=X, y=y, x_t=x_t, y_t=y_t, w=w, sigma=sigma, covariance=self.covariance,
                          importance_weight=weight)
        return batch.to(device=self.device, dtype=self.dtype)

    def __repr__(self) -> str:
        extra = ("" if self.covariance is None else ", covariance=S") + \
            ("" if self.weight_covariance is None else ", weight_covariance=C") + \
            ("" if self.weight_mean is None else ", weight_mean=m")
        return (f"StretchedTasks(d={self.d}, n={self.n}, noise={self.noise!r}, scales={self.scales}, "
                f"fraction={self.fraction}, largest_eigenvalue_cap={self.largest_eigenvalue_cap}{extra})")

