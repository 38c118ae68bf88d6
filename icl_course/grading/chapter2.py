"""The graded checks of chapter 2, one step of GD is the optimal one-layer learner.

``fourth_moment``, ``fourth_moment_monte_carlo``, ``optimal_coefficient``, ``one_step_loss``,
``bilinear_B`` and ``optimal_preconditioner``, each verified against the closed forms of :mod:`icl_course.theory`.
"""

from __future__ import annotations

import math

import torch

from .. import theory
from ..models import LinearSelfAttention
from .checking import (
    FLOAT64,
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

__all__ = ["chapter_2_checks"]

def _verify_fourth_moment(case: Case, output) -> None:
    d = case.arguments["d"]
    value = expect_number(output, "fourth_moment", integer=True)
    if value != d * (d + 2):
        fail(f"for d={d}: fourth_moment gives {value:g}, but E||x||^4 = {d * (d + 2)}")


def _verify_fourth_moment_monte_carlo(case: Case, output) -> None:
    d, num_samples = case.arguments["d"], case.arguments["num_samples"]
    mean, error = expect_pair(output, "fourth_moment_monte_carlo")
    mean, error = expect_number(mean, "the mean"), expect_number(error, "the standard error")
    exact = d * (d + 2)
    # Var ||x||^4 = E||x||^8 - (E||x||^4)^2, with E||x||^8 = d(d+2)(d+4)(d+6)
    true_error = math.sqrt((d * (d + 2) * (d + 4) * (d + 6) - exact**2) / num_samples)
    if not 0.8 * true_error < error < 1.2 * true_error:
        fail(f"for {case.label}: the standard error is {error:.4g}, but that of a mean of num_samples draws, "
             f"std(||x||^4) / sqrt(num_samples), is about {true_error:.4g} (within 20% passes)")
    # evidence of sampling: a sample's mean and standard error scatter around the closed forms; either one
    # hitting its closed form to 9 digits happens with probability below 1e-5, so it was computed, not sampled
    if abs(mean - exact) <= 1e-9 * exact or abs(error - true_error) <= 1e-9 * true_error:
        fail(f"for {case.label}: ({mean:g}, {error:.6g}) uses the closed forms d(d + 2) or std / sqrt(num_samples) "
             "to 9 digits, which a Monte-Carlo estimate from num_samples draws does not hit")
    if not abs(mean - exact) <= 5 * true_error:
        fail(f"for {case.label}: the Monte-Carlo mean {mean:.4f} is {abs(mean - exact) / true_error:.1f} "
             f"standard errors away from {exact}")


def _verify_optimal_coefficient(case: Case, output) -> None:
    d, n, second_moment = (case.arguments[key] for key in ("d", "n", "second_moment"))
    c = expect_number(output, "optimal_coefficient")
    best = theory.optimal_one_step_coefficient(d, n, second_moment=second_moment)
    if abs(c - best) <= 1e-9 * best:
        return
    if second_moment > 0 and abs(c - 1 / (n + d + 1)) <= 1e-9 * c:
        fail(f"for {case.label}: c = {c:.6g} is the noiseless answer; the noise is missing (E[sigma^2] = "
             f"{second_moment:g} here), and the minimiser is {best:.6g}")
    if abs(c - n * best) <= 1e-9 * n * best:
        fail(f"for {case.label}: {c:.6g} is n = {n} times the minimiser {best:.6g}: the step eta* = n c*, not the "
             "coefficient c* on alpha")
    if abs(c - 1 / n) <= 1e-9 / n:
        fail(f"for {case.label}: 1/n is the step that treats Sigma/n as the identity; the minimiser is smaller, "
             f"{best:.6g}")
    fail(f"for {case.label}: c = {c:.6g}, but the minimiser is {best:.6g}")


def _verify_one_step_loss(case: Case, output) -> None:
    d, n, second_moment, c = (case.arguments[key] for key in ("d", "n", "second_moment", "c"))
    value = expect_number(output, "one_step_loss")
    expected = theory.one_step_loss(d, n, coefficient=c, second_moment=second_moment)

    def near(reference):
        return abs(value - reference) <= 1e-9 * (1 + abs(reference))
    if near(expected):
        return
    if near(2 * expected):
        fail(f"for {case.label}: {value:.6g} is twice the loss; the course's loss is half the squared error")
    if second_moment > 0 and near(theory.one_step_loss(d, n, 0.0, c)):
        fail(f"for {case.label}: {value:.6g} is the noiseless loss; the noise is missing (E[sigma^2] = "
             f"{second_moment:g} here), and the loss is {expected:.6g}")
    fail(f"for {case.label}: the loss is {expected:.6g}, your closed form gives {value:.6g}")


def _bilinear_case(d: int, generator: torch.Generator) -> Case:
    return Case(dict(P=0.3 * normal(generator, d + 1, d + 1), Q=0.3 * normal(generator, d + 1, d + 1)))


def _verify_bilinear_B(case: Case, output) -> None:
    P, Q = case.arguments["P"], case.arguments["Q"]
    d = P.shape[0] - 1
    B = expect_tensor(output, (d, d), "B")
    expected = theory.one_layer_bilinear_form(LinearSelfAttention.from_matrices(P, Q))["B"]
    if close(B, expected):
        return
    if close(B, -expected):
        fail(f"for d={d}: the sign is flipped: your B is minus the expected one")
    if close(B, expected.T):
        fail(f"for d={d}: B is transposed: your B[i, j] is the expected B[j, i]")
    fail(f"for d={d}: B is wrong; the furthest entry{mismatch(B, expected)}")


def _preconditioner_case(d: int, n: int, second_moment: float, generator: torch.Generator) -> Case:
    rotation, _ = torch.linalg.qr(normal(generator, d, d))
    S = rotation @ torch.diag(torch.rand(d, generator=generator, **FLOAT64) + 0.1) @ rotation.T
    return Case(dict(S=(S + S.T) / 2, n=n, second_moment=second_moment))


def _verify_optimal_preconditioner(case: Case, output) -> None:
    S, n, second_moment = (case.arguments[key] for key in ("S", "n", "second_moment"))
    d = S.shape[0]
    B = expect_tensor(output, (d, d), "B")
    best = theory.preconditioned_one_step_loss(theory.optimal_preconditioner(S, n, second_moment=second_moment), S, n,
                                               second_moment=second_moment)
    loss = theory.preconditioned_one_step_loss(B, S, n, second_moment=second_moment)
    # "not (loss <= ...)": a B so large that the loss overflows to inf or NaN fails too
    optimal = math.isfinite(float(loss)) and float(loss) <= float(best) + 1e-9 * (1 + abs(float(best)))
    # any multiple of S^-1 (B S = k I) is the shape of the answer for the other prior, w ~ N(0, S^-1)
    k = torch.trace(B @ S) / d
    if not optimal and close(B @ S, k * torch.eye(d, dtype=B.dtype)):
        fail(f"for d={d}, n={n}, second_moment={second_moment:g}: that is the best B when w ~ N(0, S^-1), a "
             f"multiple of S^-1; here w ~ N(0, I): your B has loss {loss:.8g}, the best B has {best:.8g}")
    if not optimal:
        fail(f"for d={d}, n={n}, second_moment={second_moment:g}: your B has loss {loss:.8g}, the best B has "
             f"{best:.8g}")


def chapter_2_checks() -> list[Check]:
    """The graded checks of chapter 2, in task order."""
    def moment_draw(rng):
        return [Case(dict(d=rng.randint(2, 15))) for _ in range(3)]

    def monte_carlo_draw(rng):
        return [Case(dict(d=rng.randint(2, 13), num_samples=200_000, seed=rng.getrandbits(31))) for _ in range(3)]

    def coefficient_draw(rng):
        return [Case(dict(d=rng.randint(1, 15), n=rng.randint(2, 40), second_moment=round(rng.uniform(0, 4), 4)))
                for _ in range(4)]

    def loss_draw(rng):
        return [Case(dict(d=rng.randint(1, 12), n=rng.randint(2, 30), second_moment=round(rng.uniform(0, 9), 4),
                          c=round(rng.uniform(0, 0.2), 5))) for _ in range(4)]

    def preconditioner_draw(rng):
        return [_preconditioner_case(rng.randint(2, 6), rng.randint(5, 40), round(rng.uniform(0, 4), 4),
                                     generator_from(rng)) for _ in range(3)]

    return [
        Check(2, 1, "fourth_moment", lambda: [Case(dict(d=1)), Case(dict(d=10))], moment_draw,
              _verify_fourth_moment, giveaways=("theory",)),
        Check(2, 1, "fourth_moment_monte_carlo", lambda: [Case(dict(d=4, num_samples=200_000, seed=0))],
              monte_carlo_draw, _verify_fourth_moment_monte_carlo, giveaways=("theory",)),
        Check(2, 2, "optimal_coefficient",
              lambda: [Case(dict(d=10, n=20, second_moment=0.0)), Case(dict(d=10, n=20, second_moment=3.0))],
              coefficient_draw, _verify_optimal_coefficient, giveaways=("theory", "optimal_one_step_coefficient")),
        Check(2, 3, "one_step_loss",
              lambda: [Case(dict(d=10, n=20, second_moment=1.0, c=0.03)),
                       Case(dict(d=3, n=8, second_moment=0.0, c=0.2))],
              loss_draw, _verify_one_step_loss, giveaways=("theory", "one_step_loss")),
        Check(2, 4, "bilinear_B", lambda: [_bilinear_case(3, torch.Generator().manual_seed(0))],
              lambda rng: [_bilinear_case(rng.randint(1, 6), generator_from(rng)) for _ in range(3)],
              _verify_bilinear_B, giveaways=("theory", "one_layer_bilinear_form")),
        Check(2, 5, "optimal_preconditioner",
              lambda: [_preconditioner_case(4, 20, 0.25, torch.Generator().manual_seed(0))],
              preconditioner_draw, _verify_optimal_preconditioner,
              giveaways=("theory", "optimal_preconditioner", "preconditioned_one_step_loss")),
    ]
