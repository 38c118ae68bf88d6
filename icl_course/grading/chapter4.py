"""Trusted checks of exercise 4 (mixed noise and adaptive step sizes; Vladymyrov et al. 2024, sections 5-6).

* ``noise_estimate``: AdaRR's unbiased noise-variance estimate per task;
* ``adjusted_loss_per_task``: a learner's loss minus the oracle ridge's, per task;
* ``diag_layer``: one layer of the diagonal linear transformer, written with its four weights;
* ``two_noise_weights``: Theorem 5.2's two-layer weights that match ridge at two noise levels;
* ``noise_posterior``: the posterior over a categorical noise prior given the context.

Built only on the public helpers of :mod:`icl_course.checks`; every reference here is computed
in float64 in the grader's process.
"""

from __future__ import annotations

import random

import torch

from ..baselines import noise_variance_estimate, ridge
from ..theory import two_noise_construction
from .checking import (
    Case,
    Check,
    close,
    expect_number,
    expect_pair,
    expect_tensor,
    fail,
    generator_from,
    mismatch,
    normal,
)

__all__ = ["chapter_4_checks", "reference_diag_layer", "reference_noise_posterior"]

FLOAT64 = dict(dtype=torch.float64, device="cpu")


def _tasks(B: int, n: int, d: int, sigma: torch.Tensor, generator: torch.Generator):
    """``X`` (B, n, d), ``w`` (B, d) and ``y = X w + sigma * noise`` (B, n), each task with its own sigma."""
    X, w = normal(generator, B, n, d), normal(generator, B, d)
    y = (X @ w.unsqueeze(-1)).squeeze(-1) + sigma.unsqueeze(-1) * normal(generator, B, n)
    return X, w, y


def _sigmas(B: int, generator: torch.Generator, low: float = 0.1, high: float = 2.5) -> torch.Tensor:
    return low + (high - low) * torch.rand(B, generator=generator, **FLOAT64)


# -- task 1: AdaRR's noise estimate --------------------------------------------------------------

def _noise_case(B: int, n: int, d: int, generator: torch.Generator) -> Case:
    X, _, y = _tasks(B, n, d, _sigmas(B, generator), generator)
    return Case(dict(X=X, y=y))


def _verify_noise_estimate(case: Case, output) -> None:
    X, y = case.arguments["X"], case.arguments["y"]
    B, n, d = X.shape
    estimate = expect_tensor(output, (B,), "noise_estimate (one estimate per task)")
    expected = noise_variance_estimate(X, y)
    if close(estimate, expected, 1e-6):
        return
    if close(estimate, expected * (n - d) / n, 1e-6):
        fail(f"for {case.label}: your estimates are (n - d) / n = {(n - d) / n:.3g} times the unbiased ones, "
             "too small: the least-squares fit has used up some of the residuals' degrees of freedom")
    if close(estimate, expected.sqrt(), 1e-6):
        fail(f"for {case.label}: that is the standard deviation sigma_est; return the variance sigma_est^2 "
             "(no square root)")
    if close(estimate, (expected * (n - d) / n).sqrt(), 1e-6):
        fail(f"for {case.label}: that is the square root of the residuals' mean square: a standard deviation, "
             "not a variance, and averaged over all n residuals")
    fail(f"for {case.label}: not the unbiased variance of each task's least-squares residuals; the furthest "
         f"task{mismatch(estimate, expected)}")


# -- task 2: the adjusted loss per task ----------------------------------------------------------

def _adjusted_case(B: int, n: int, d: int, generator: torch.Generator) -> Case:
    sigma = _sigmas(B, generator, 0.2, 3.0)
    X, w, y = _tasks(B, n, d, sigma, generator)
    # a learner that does not know sigma: ridge with one constant, nudged
    w_hat = ridge(X, y, 1.0) + 0.1 * normal(generator, B, d)
    return Case(dict(w_hat=w_hat, X=X, y=y, w=w, sigma=sigma))


def _half_error(weights: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return 0.5 * ((weights - w) ** 2).sum(-1)


def _verify_adjusted_loss(case: Case, output) -> None:
    w_hat, X, y, w, sigma = (case.arguments[key] for key in ("w_hat", "X", "y", "w", "sigma"))
    loss = expect_tensor(output, (X.shape[0],), "adjusted_loss_per_task (one loss per task)")
    oracle = _half_error(ridge(X, y, sigma**2), w)
    expected = _half_error(w_hat, w) - oracle
    if close(loss, expected, 1e-8):
        return
    if close(loss, 2 * expected, 1e-8):
        fail(f"for {case.label}: that is twice the adjusted loss; the loss is half the squared error, "
             "1/2 ||w_hat - w||^2 (for both the learner and the oracle)")
    if close(loss, -expected, 1e-8):
        fail(f"for {case.label}: the sign is flipped: the adjusted loss is the learner's loss minus the oracle's "
             "(positive when the learner is worse)")
    if close(loss, _half_error(w_hat, w) - _half_error(ridge(X, y, sigma), w), 1e-8):
        fail(f"for {case.label}: the oracle's ridge_lambda is the noise variance sigma^2, not sigma")
    if close(loss, _half_error(w_hat, w), 1e-8):
        fail(f"for {case.label}: that is the learner's loss alone; subtract the oracle ridge's loss")
    fail(f"for {case.label}: not the learner's half squared error minus the oracle ridge's; the furthest "
         f"task{mismatch(loss, expected)}")


# -- task 3: one diag layer ----------------------------------------------------------------------

def reference_diag_layer(tokens, w_xx, w_xy, w_yx, w_yy):
    """Every token moves by ``I + T``, ``T = [[w_xx Sigma, w_xy alpha], [w_yx alpha^T, w_yy lambda]]``.

    ``Sigma, alpha, lambda`` are sums over the context tokens (the last token, the query, is never
    read).  Shapes: ``tokens`` (B, n+1, d+1), the weights numbers -> (B, n+1, d+1).
    """
    X, y = tokens[:, :-1, :-1], tokens[:, :-1, -1]
    Sigma = X.transpose(-1, -2) @ X
    alpha = (X.transpose(-1, -2) @ y.unsqueeze(-1))                    # (B, d, 1)
    energy = (y**2).sum(-1).reshape(-1, 1, 1)                           # (B, 1, 1)
    T = torch.cat([torch.cat([w_xx * Sigma, w_xy * alpha], -1),
                   torch.cat([w_yx * alpha.transpose(-1, -2), w_yy * energy], -1)], -2)
    return tokens + (T @ tokens.transpose(-1, -2)).transpose(-1, -2)


def _diag_case(B: int, n: int, d: int, generator: torch.Generator, query_label: bool,
               weights: tuple | None = None) -> Case:
    tokens = normal(generator, B, n + 1, d + 1)
    if not query_label:
        tokens[:, -1, -1] = 0.0
    if weights is None:
        weights = tuple(round(float(value), 4) for value in (torch.rand(4, generator=generator, **FLOAT64) - 0.5) / n)
    w_xx, w_xy, w_yx, w_yy = weights
    return Case(dict(tokens=tokens, w_xx=w_xx, w_xy=w_xy, w_yx=w_yx, w_yy=w_yy))


def _verify_diag_layer(case: Case, output) -> None:
    tokens = case.arguments["tokens"]
    weights = {key: case.arguments[key] for key in ("w_xx", "w_xy", "w_yx", "w_yy")}
    new = expect_tensor(output, tokens.shape, "diag_layer (the new tokens)")
    expected = reference_diag_layer(tokens, **weights)
    if close(new, expected, 1e-9):
        return
    where = f"for {case.label}"
    x_part, y_part = new[..., :-1], new[..., -1]
    if close(x_part, expected[..., :-1], 1e-9) and weights["w_yx"] != 0:
        X, labels = tokens[:, :-1, :-1], tokens[:, :-1, -1]
        alpha = (X * labels.unsqueeze(-1)).sum(1)
        late = (tokens[..., -1] + weights["w_yx"] * (x_part @ alpha.unsqueeze(-1)).squeeze(-1)
                + weights["w_yy"] * (labels**2).sum(-1, keepdim=True) * tokens[..., -1])
        if close(y_part, late, 1e-9):
            fail(f"{where}: the labels were updated from the already-updated inputs; compute the new x and the "
                 "new y both from the old token")
    context_and_query = reference_diag_layer(torch.cat([tokens, torch.zeros_like(tokens[:, :1])], 1), **weights)
    if close(new, context_and_query[:, :-1], 1e-9):
        fail(f"{where}: Sigma, alpha and lambda must sum over the n context tokens only; the query (the last token) "
             "is moved, never read")
    if close(new, 2 * tokens - expected, 1e-9):
        fail(f"{where}: the sign is flipped: a layer adds its update, x <- x + w_xx Sigma x + w_xy y alpha, "
             "y <- y + w_yx <alpha, x> + w_yy lambda y")
    if close(new, expected - tokens, 1e-9):
        fail(f"{where}: that is the update alone; add the residual: the new token is the old one plus the update")
    swapped = dict(weights, w_xy=weights["w_yx"], w_yx=weights["w_xy"])
    if close(new, reference_diag_layer(tokens, **swapped), 1e-9):
        fail(f"{where}: w_xy and w_yx are swapped: w_xy moves the inputs (by y alpha), w_yx moves the labels "
             "(by <alpha, x>)")
    if close(x_part, expected[..., :-1], 1e-9):
        fail(f"{where}: the inputs are right but the labels are not: y <- y + w_yx <alpha, x> + w_yy lambda y "
             "(lambda = sum_i y_i^2 over the context)")
    if close(y_part, expected[..., -1], 1e-9):
        fail(f"{where}: the labels are right but the inputs are not: x <- x + w_xx Sigma x + w_xy y alpha")
    fail(f"{where}: the new tokens are wrong in both their inputs and their labels; the furthest entry "
         f"[task, token, coordinate]{mismatch(new, expected)}")


# -- task 4: Theorem 5.2's two-noise construction ------------------------------------------------

def _two_noise_reference(n, sigma_1, sigma_2) -> tuple:
    first, second = two_noise_construction(n, sigma_1, sigma_2)
    return first["w_yx"], second["w_yy"]


def _near(value: float, reference: float) -> bool:
    return abs(value - reference) <= 1e-8 * (abs(reference) + 1e-12)


def _verify_two_noise(case: Case, output) -> None:
    n, sigma_1, sigma_2 = (case.arguments[key] for key in ("n", "sigma_1", "sigma_2"))
    w_yx, w_yy = expect_pair(output, "two_noise_weights")
    w_yx, w_yy = expect_number(w_yx, "w_yx"), expect_number(w_yy, "w_yy")
    expected_yx, expected_yy = _two_noise_reference(n, sigma_1, sigma_2)
    if _near(w_yx, expected_yx) and _near(w_yy, expected_yy):
        return
    where = f"for {case.label}"
    if _near(w_yx, -expected_yx) and _near(w_yy, expected_yy):
        fail(f"{where}: w_yx has the wrong sign, as in the paper, which drops a minus sign: the prediction is "
             "y_hat = -y_t, so solve -(1 + n sigma^2 w_yy) w_yx = 1 / (1 + sigma^2)")
    if _near(w_yx, expected_yy) and _near(w_yy, expected_yx):
        fail(f"{where}: return the pair in the order (w_yx, w_yy)")
    unsquared = _two_noise_reference(n, sigma_1**0.5, sigma_2**0.5)
    if _near(w_yx, unsquared[0]) and _near(w_yy, unsquared[1]):
        fail(f"{where}: use the noise variances sigma^2, not sigma")
    missed = [f"sigma = {sigma:g}" for sigma in (sigma_1, sigma_2)
              if not _near(-(1 + n * sigma**2 * w_yy) * w_yx, 1 / (1 + sigma**2))]
    fail(f"{where}: ({w_yx:.6g}, {w_yy:.6g}) does not solve -(1 + n sigma^2 w_yy) w_yx = 1 / (1 + sigma^2) at "
         + " and ".join(missed or ["both levels"]) + f"; expected ({expected_yx:.6g}, {expected_yy:.6g})")


# -- task 5: the posterior over noise levels -----------------------------------------------------

def reference_noise_posterior(X, y, levels, squared: bool = True, log_determinant: bool = True) -> torch.Tensor:
    """``p(sigma_k | X, y)`` for a uniform prior over ``levels`` and ``w ~ N(0, I)``: (B, K).

    ``y ~ N(0, X X^T + sigma_k^2 I_n)`` given ``sigma_k``.  ``squared=False`` and
    ``log_determinant=False`` give two typical mistakes (sigma for sigma^2; the quadratic form alone).
    """
    levels = torch.as_tensor(levels, **FLOAT64)
    n = X.shape[-2]
    variance = levels**2 if squared else levels
    covariance = (X @ X.transpose(-1, -2)).unsqueeze(1) + variance.reshape(-1, 1, 1) * torch.eye(n, **FLOAT64)
    if log_determinant:
        likelihood = torch.distributions.MultivariateNormal(torch.zeros(n, **FLOAT64), covariance_matrix=covariance)
        log_likelihood = likelihood.log_prob(y.unsqueeze(1))
    else:
        log_likelihood = -0.5 * (y.unsqueeze(1).unsqueeze(-2) @ torch.linalg.solve(
            covariance, y.unsqueeze(1).unsqueeze(-1))).reshape(covariance.shape[:2])
    return torch.softmax(log_likelihood, dim=-1)


LEVEL_GRID = (0.1, 0.2, 0.3, 0.5, 0.7, 1.5, 2.0, 3.0, 4.0)   # never 1, where sigma = sigma^2


def _posterior_case(B: int, n: int, d: int, levels: list, generator: torch.Generator) -> Case:
    index = torch.randint(len(levels), (B,), generator=generator)
    X, _, y = _tasks(B, n, d, torch.tensor(levels, **FLOAT64)[index], generator)
    return Case(dict(X=X, y=y, levels=list(levels)))


def _verify_noise_posterior(case: Case, output) -> None:
    X, y, levels = (case.arguments[key] for key in ("X", "y", "levels"))
    posterior = expect_tensor(output, (X.shape[0], len(levels)), "noise_posterior (B, K): one row per task")
    expected = reference_noise_posterior(X, y, levels)
    if close(posterior, expected, 1e-7):
        return
    where = f"for {case.label}, levels={list(levels)}"
    if not close(posterior.sum(-1), torch.ones_like(posterior[:, 0]), 1e-7):
        fail(f"{where}: each row must sum to 1; normalise the likelihoods over the levels (a softmax of the "
             "log-likelihoods)")
    if close(posterior, reference_noise_posterior(X, y, levels, log_determinant=False), 1e-7):
        fail(f"{where}: the log-determinant term is missing: log N(y; 0, C) = -1/2 (y^T C^-1 y + log det C) "
             "+ const, and det C depends on sigma_k")
    if close(posterior, reference_noise_posterior(X, y, levels, squared=False), 1e-7):
        fail(f"{where}: the covariance is X X^T + sigma_k^2 I (the noise variance), not X X^T + sigma_k I")
    fail(f"{where}: not the posterior p(sigma_k | X, y) under a uniform prior over the levels; the furthest "
         f"entry [task, level]{mismatch(posterior, expected)}")


# -- the catalogue -------------------------------------------------------------------------------

def chapter_4_checks() -> list[Check]:
    """The graded checks of exercise 4."""
    def seeded(seed: int) -> torch.Generator:
        return torch.Generator().manual_seed(seed)

    def noise_draw(rng: random.Random):
        cases = []
        for _ in range(3):
            d = rng.randint(1, 8)
            cases.append(_noise_case(rng.randint(1, 4), rng.randint(d + 1, d + 25), d, generator_from(rng)))
        return cases

    def adjusted_draw(rng: random.Random):
        return [_adjusted_case(rng.randint(1, 4), rng.randint(1, 30), rng.randint(1, 8), generator_from(rng))
                for _ in range(3)]

    def diag_draw(rng: random.Random):
        return [_diag_case(rng.randint(1, 3), rng.randint(1, 12), rng.randint(1, 8), generator_from(rng), True)
                for _ in range(3)]

    def two_noise_draw(rng: random.Random):
        cases = []
        for _ in range(4):
            sigma_1, sigma_2 = sorted(rng.sample(LEVEL_GRID, 2))
            cases.append(Case(dict(n=rng.randint(5, 2000), sigma_1=float(sigma_1), sigma_2=float(sigma_2))))
        return cases

    def posterior_draw(rng: random.Random):
        return [_posterior_case(rng.randint(1, 4), rng.randint(1, 12), rng.randint(1, 8),
                                sorted(rng.sample(LEVEL_GRID, rng.randint(2, 4))), generator_from(rng))
                for _ in range(3)]

    return [
        Check(4, 1, "noise_estimate", lambda: [_noise_case(3, 12, 4, seeded(0))], noise_draw,
              _verify_noise_estimate, giveaways=("baselines", "noise_variance_estimate", "least_squares", "AdaRR")),
        Check(4, 2, "adjusted_loss_per_task", lambda: [_adjusted_case(4, 10, 3, seeded(0))], adjusted_draw,
              _verify_adjusted_loss,
              giveaways=("baselines", "evaluate", "oracle_ridge", "query_averaged_loss", "adjusted_loss")),
        Check(4, 3, "diag_layer",
              lambda: [_diag_case(2, 6, 3, seeded(0), False, (-0.1, 0.05, -0.2, 0.03)),
                       _diag_case(2, 6, 3, seeded(1), True, (0.02, -0.04, 0.1, -0.05))],
              diag_draw, _verify_diag_layer,
              giveaways=("models", "diagonal_construction", "LinearSelfAttention", "LinearTransformer",
                         "transform_tokens", "next_gram")),
        Check(4, 4, "two_noise_weights",
              lambda: [Case(dict(n=100, sigma_1=0.5, sigma_2=2.0)), Case(dict(n=1000, sigma_1=1.0, sigma_2=3.0))],
              two_noise_draw, _verify_two_noise, giveaways=("theory", "two_noise_construction")),
        Check(4, 5, "noise_posterior", lambda: [_posterior_case(4, 6, 3, [0.5, 2.0], seeded(0))], posterior_draw,
              _verify_noise_posterior, giveaways=("baselines", "BayesOptimal", "CategoricalNoise")),
    ]

