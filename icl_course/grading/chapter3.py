"""The graded checks of chapter 3, GD++ is a second-order method.

``implicit_step``, ``gdpp_layers``, ``best_cosine`` and ``newton_iterates``, verified against
:mod:`icl_course.theory` and :func:`icl_course.optimizers.newton_inverse`.
"""

from __future__ import annotations

import torch

from .. import theory
from ..optimizers import newton_inverse
from .checking import (
    FLOAT64,
    Case,
    Check,
    close,
    describe,
    expect_number,
    expect_tensor,
    fail,
    generator_from,
    mismatch,
    normal,
)

__all__ = ["chapter_3_checks"]

def _implicit_case(B: int, d: int, generator: torch.Generator) -> Case:
    return Case(dict(M=torch.eye(d, **FLOAT64) + 0.3 * normal(generator, B, d, d), u=normal(generator, B, d),
                     a=1 + 0.1 * normal(generator, B), w=normal(generator, B, d),
                     mixing=0.2 * normal(generator, B, d + 1, d + 1)))


def _verify_implicit_step(case: Case, output) -> None:
    M, u, a, w, mixing = (case.arguments[key] for key in ("M", "u", "a", "w", "mixing"))
    if not isinstance(output, (tuple, list)) or len(output) != 4:
        fail(f"implicit_step must return the four new values (M, u, a, w), got {describe(output)}")
    expected = theory.implicit_model_step(M, u, a, w, mixing)
    for name, got, reference in zip("Muaw", output, expected):
        got = expect_tensor(got, reference.shape, name)
        if close(got, reference, 1e-10):
            continue
        d = M.shape[-1]
        misprint = reference + 2 * mixing[:, :d, d].unsqueeze(-1) * w.unsqueeze(-2) if name == "M" else None
        if misprint is not None and close(got, misprint, 1e-10):
            fail(f"for {case.label}: your M carries + t_xy w^T, the paper's misprinted + b w^T; the furthest "
                 f"entry{mismatch(got, reference)}")
        fail(f"for {case.label}: the new {name} is wrong; its furthest entry{mismatch(got, reference)}")


def _verify_gdpp_layers(case: Case, output) -> None:
    layers = expect_number(output, "gdpp_layers", integer=True)
    expected = theory.gdpp_layers_needed(**case.arguments)
    if layers != expected:
        fail(f"for {case.label}: {layers:g} layers, but {expected} are needed (the GD++ layers and the final GD "
             "step together)")


def _cosine_case(B: int, n: int, d: int, generator: torch.Generator) -> Case:
    X = normal(generator, B, n, d)
    return Case(dict(X=X, target=X[..., 0] ** 2 + 0.1 * normal(generator, B, n)))


def _verify_best_cosine(case: Case, output) -> None:
    X, target = case.arguments["X"], case.arguments["target"]
    cosine = expect_tensor(output, (X.shape[0],), "best_cosine (one cosine per task)")
    expected = theory.best_linear_cosine(X, target)
    if not close(cosine, expected, 1e-8):
        fail(f"for {case.label}: not the best cosine of a vector of the columns' span with the target; the "
             f"furthest task{mismatch(cosine, expected)}")


def _newton_case(d: int, num_steps: int, generator: torch.Generator) -> Case:
    rotation, _ = torch.linalg.qr(normal(generator, d, d))
    eigenvalues = torch.logspace(0, 2, d, **FLOAT64)
    S = rotation @ torch.diag(eigenvalues) @ rotation.T
    return Case(dict(S=(S + S.T) / 2, num_steps=num_steps))


def _verify_newton_iterates(case: Case, output) -> None:
    S, num_steps = case.arguments["S"], case.arguments["num_steps"]
    d = S.shape[0]
    iterates = expect_tensor(output, (num_steps + 1, d, d), "newton_iterates (M_0 first)")
    expected = newton_inverse(S, num_steps)
    if not close(iterates[0], expected[0], 1e-10):
        fail(f"for d={d}: the first iterate is not M_0 = I / lambda_max(S); the furthest entry "
             f"[row, column]{mismatch(iterates[0], expected[0])}")
    if not close(iterates, expected, 1e-8):
        fail(f"for d={d}, num_steps={num_steps}: the iterates differ from M <- M (2I - S M); the furthest entry "
             f"[step, row, column]{mismatch(iterates, expected)}")


def chapter_3_checks() -> list[Check]:
    """The graded checks of chapter 3, in task order."""
    def gdpp_draw(rng):
        return [Case(dict(kappa=float(10 ** rng.uniform(0.5, 6)), eps=float(10 ** -rng.uniform(1, 12))))
                for _ in range(4)]

    return [
        Check(3, 1, "implicit_step", lambda: [_implicit_case(3, 4, torch.Generator().manual_seed(0))],
              lambda rng: [_implicit_case(rng.randint(1, 4), rng.randint(1, 6), generator_from(rng)) for _ in range(3)],
              _verify_implicit_step, giveaways=("theory", "implicit_model_step", "implicit_linear_model")),
        Check(3, 2, "gdpp_layers", lambda: [Case(dict(kappa=100.0, eps=1e-6)), Case(dict(kappa=10.0, eps=0.5))],
              gdpp_draw, _verify_gdpp_layers, giveaways=("theory", "gdpp_spectrum", "gdpp_layers_needed")),
        Check(3, 3, "best_cosine", lambda: [_cosine_case(3, 20, 4, torch.Generator().manual_seed(0))],
              lambda rng: [_cosine_case(rng.randint(1, 4), rng.randint(8, 40), rng.randint(1, 7), generator_from(rng))
                           for _ in range(3)], _verify_best_cosine, giveaways=("theory", "best_linear_cosine")),
        Check(3, 4, "newton_iterates", lambda: [_newton_case(3, 4, torch.Generator().manual_seed(0))],
              lambda rng: [_newton_case(rng.randint(1, 6), rng.randint(0, 8), generator_from(rng)) for _ in range(3)],
              _verify_newton_iterates, giveaways=("baselines", "optimizers", "newton_inverse")),
    ]
