"""The graded properties of the exercises, decided where the learner's code cannot reach.

Every function a learner writes in ``exercises/`` has a :class:`Check`: example inputs (what the
self-check shows), a way to draw fresh inputs from a seed (what grading uses), and ``verify``,
which compares one output with the package's reference functions and says what is wrong.  The
exercise notebooks call two functions of this module:

* ``checks.self_check("merged_form", merged_form)`` (visible): verifies the examples in the
  learner's own kernel, so that the learner sees at once what is wrong;
* ``checks.hint("merged_form")`` opens the task's next hint, and ``checks.progress(1)`` shows which
  of chapter 1's tasks passed their self-check in this kernel;
* ``checks.record("merged_form", merged_form)`` (in the hidden tests).  Under grading,
  :mod:`icl_course.grading.grade` puts ``ICL_COURSE_ANSWERS`` (a folder) and ``ICL_COURSE_SEED`` in the
  kernel's environment, and ``record`` only calls the function on inputs drawn from that seed and
  saves the outputs there.  Elsewhere (the answer keys under nbval) it verifies them on the spot.

The grader then, in its own process and after the kernel has exited, draws the same inputs from
the same seed, loads the outputs with ``torch.load(weights_only=True)`` (tensors, numbers and
tuples; no code runs) and calls :func:`verify_recorded`.  A learner's code can change anything in
its own kernel, this module's copy included, but not what the grader's process computes: points
depend only on whether the outputs have the graded properties.
"""

from __future__ import annotations

import ast
import copy
import math
import numbers
import os
import random
import re
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

from . import theory
from .baselines import gradient_descent, newton_inverse
from .data import RegressionTasks
from .hints import HINTS
from .models import LinearSelfAttention, gd_construction

__all__ = ["Case", "Check", "CheckFailed", "SelfCheckFailed", "CHECKS", "self_check", "record", "verify_recorded",
           "recorded_names", "giveaways_used", "hint", "progress", "Progress", "ANSWERS_VARIABLE", "SEED_VARIABLE"]

ANSWERS_VARIABLE = "ICL_COURSE_ANSWERS"
SEED_VARIABLE = "ICL_COURSE_SEED"
LOCAL_SEED = 0            # the grading inputs that the answer keys verify under nbval
MAX_RECORD_BYTES = 32 * 2**20
FLOAT64 = dict(dtype=torch.float64, device="cpu")


class CheckFailed(AssertionError):
    """An output does not have the graded property; the message says which and why."""


class SelfCheckFailed(AssertionError):
    """What a learner sees when a self-check fails: the message alone, without a traceback.

    IPython shows the lines of ``_render_traceback_`` instead of the traceback when an exception
    has that method; the frames inside this module would only hide the message.
    """

    def _render_traceback_(self) -> list[str]:
        return [f"\x1b[1;31mSelf-check failed\x1b[0m: {self}"]


@dataclass
class Case:
    """One call of a learner's function: its keyword ``arguments`` and what ``verify`` needs besides."""

    arguments: dict
    context: dict = field(default_factory=dict)

    @property
    def label(self) -> str:
        shown = {key: value for key, value in self.arguments.items() if isinstance(value, (int, float))}
        shapes = {key: tuple(value.shape) for key, value in self.arguments.items() if isinstance(value, torch.Tensor)}
        parts = [f"{key}={value:g}" if isinstance(value, float) else f"{key}={value}" for key, value in shown.items()]
        parts += [f"{key} of shape {shape}" for key, shape in shapes.items()]
        return ", ".join(parts)


@dataclass(frozen=True)
class Check:
    """The graded property of one exercise function.

    ``examples()`` gives the self-check's cases; ``draw(rng)`` gives fresh cases from a
    ``random.Random``; ``verify(case, output)`` raises :class:`CheckFailed` when the output is wrong.
    ``giveaways`` are package names whose use in the answer cell the grader reports.
    """

    chapter: int
    task: int
    name: str
    examples: Callable[[], list]
    draw: Callable[[random.Random], list]
    verify: Callable[[Case, Any], None]
    giveaways: tuple = ()

    def grading_cases(self, seed: int) -> list[Case]:
        """The examples, then fresh cases drawn from ``seed`` (the same on every machine)."""
        return self.examples() + self.draw(random.Random(f"{self.name}:{int(seed)}"))


# -- helpers for verify ------------------------------------------------------------------------

def _fail(message: str):
    raise CheckFailed(message)


def _tensor(value, shape: tuple, what: str) -> torch.Tensor:
    if not isinstance(value, torch.Tensor):
        _fail(f"{what} must be a torch tensor, got {_kind(value)}")
    if tuple(value.shape) != tuple(shape):
        _fail(f"{what} must have shape {tuple(shape)}, got {tuple(value.shape)}")
    if not value.is_floating_point():
        _fail(f"{what} must be a floating-point tensor, got {value.dtype}")
    if not torch.isfinite(value).all():
        _fail(f"{what} contains NaN or infinite values")
    return value.to(torch.float64)


def _number(value, what: str, integer: bool = False) -> float:
    allowed = numbers.Integral if integer else numbers.Real
    if isinstance(value, bool) or not isinstance(value, allowed):
        _fail(f"{what} must be a Python {'int' if integer else 'float'}, got {_kind(value)}"
              + (" (use .item())" if isinstance(value, torch.Tensor) else ""))
    if not math.isfinite(value):
        _fail(f"{what} is {value}")
    return float(value)


def _pair(value, what: str) -> tuple:
    if not isinstance(value, (tuple, list)) or len(value) != 2:
        _fail(f"{what} must return a pair, got {_kind(value)}")
    return tuple(value)


def _plural(count: int, noun: str) -> str:
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


def _kind(value) -> str:
    if isinstance(value, torch.Tensor):
        return f"a tensor of shape {tuple(value.shape)}"
    if isinstance(value, (tuple, list)):
        return f"a {type(value).__name__} of length {len(value)}"
    if isinstance(value, str) and value.startswith("<"):
        return value.strip("<>")
    return f"a {type(value).__name__}"


def _close(got: torch.Tensor, expected: torch.Tensor, tolerance: float = 1e-7) -> bool:
    return bool((got - expected).abs().max() <= tolerance * (1 + expected.abs().max()))


def _generator(rng: random.Random) -> torch.Generator:
    return torch.Generator().manual_seed(rng.getrandbits(62))


def _normal(generator: torch.Generator, *shape) -> torch.Tensor:
    return torch.randn(*shape, generator=generator, **FLOAT64)


# -- chapter 1: linear attention is gradient descent ------------------------------------------

def _merged_form_case(D: int, k: int, v: int, generator: torch.Generator) -> Case:
    W_K, W_Q, W_V, W_P = (_normal(generator, *shape) for shape in ((k, D), (k, D), (v, D), (D, v)))
    return Case(dict(W_K=W_K, W_Q=W_Q, W_V=W_V, W_P=W_P), dict(tokens=_normal(generator, 3, 6, D)))


def _verify_merged_form(case: Case, output) -> None:
    W_K, W_Q, W_V, W_P = (case.arguments[key] for key in ("W_K", "W_Q", "W_V", "W_P"))
    D = W_P.shape[0]
    P, Q = _pair(output, "merged_form")
    P, Q = _tensor(P, (D, D), "P"), _tensor(Q, (D, D), "Q")
    tokens = case.context["tokens"]
    context = tokens[:, :-1]
    scores = (tokens @ W_Q.T) @ (context @ W_K.T).transpose(1, 2)
    four_matrix_head = tokens + scores @ (context @ W_V.T) @ W_P.T
    with torch.no_grad():
        merged_head = LinearSelfAttention.from_matrices(P, Q)(tokens)
    if not _close(merged_head, four_matrix_head):
        _fail(f"for D={D}: the head with your (P, Q) moves tokens differently from the four-matrix head "
              "(P should collect W_P and W_V, Q the key-query product)")


def _linear_attention_case(B: int, n: int, D: int, generator: torch.Generator) -> Case:
    return Case(dict(tokens=_normal(generator, B, n + 1, D), P=_normal(generator, D, D), Q=_normal(generator, D, D)))


def _verify_linear_attention(case: Case, output) -> None:
    tokens, P, Q = (case.arguments[key] for key in ("tokens", "P", "Q"))
    result = _tensor(output, tokens.shape, "linear_attention(tokens, P, Q)")
    with torch.no_grad():
        expected = LinearSelfAttention.from_matrices(P, Q)(tokens)
    if _close(result, expected):
        return
    reads_query = tokens + tokens @ (P @ tokens.transpose(1, 2) @ tokens @ Q).transpose(1, 2)
    if _close(result, reads_query):
        _fail(f"for {case.label}: j must run over the n context tokens only, not the query")
    _fail(f"for {case.label}: the layer does not follow e_i + sum_j (e_j^T Q e_i) P e_j")


def _gd_matrices_case(d: int, n: int, eta: float, seed: int) -> Case:
    return Case(dict(d=d, n=n, eta=eta), dict(seed=seed))


def _verify_gd_matrices(case: Case, output) -> None:
    d, n, eta = (case.arguments[key] for key in ("d", "n", "eta"))
    P, Q = _pair(output, "gd_matrices")
    P, Q = _tensor(P, (d + 1, d + 1), "P"), _tensor(Q, (d + 1, d + 1), "Q")
    batch = RegressionTasks(d, n, noise=0.5, **FLOAT64).sample(16, seed=case.context["seed"])
    with torch.no_grad():
        after = LinearSelfAttention.from_matrices(P, Q)(batch.tokens)
    w_1 = gradient_descent(batch.X, batch.y, eta, 1)[:, 1]
    gd_prediction = (w_1 * batch.x_t).sum(-1)
    if not _close(-after[:, -1, -1], gd_prediction):
        if _close(after[:, -1, -1], gd_prediction):   # diagnose only what is wrong
            _fail(f"for d={d}, n={n}, eta={eta:g}: the sign is flipped: the query's last coordinate must become "
                  "-<w_1, x_t> (the prediction is minus it), so P's corner is -eta/n, not +eta/n")
        _fail(f"for d={d}, n={n}, eta={eta:g}: the query's prediction is not that of one GD step")
    residuals = batch.y - torch.einsum("bnd,bd->bn", batch.X, w_1)
    if not _close(after[:, :-1, -1], residuals):
        _fail(f"for d={d}, n={n}, eta={eta:g}: the context labels should become the residuals y_i - <w_1, x_i>")


def _layers_case(d: int, n: int, eta: float, num_layers: int, seed: int) -> Case:
    batch = RegressionTasks(d, n, noise=0.3, **FLOAT64).sample(16, seed=seed)
    P, Q = (matrix[0].detach().clone() for matrix in gd_construction(d, n, eta).layers[0].head_matrices())
    return Case(dict(tokens=batch.tokens, P=P, Q=Q, num_layers=num_layers), dict(batch=batch, eta=eta))


def _verify_transformer_prediction(case: Case, output) -> None:
    batch, eta, num_layers = case.context["batch"], case.context["eta"], case.arguments["num_layers"]
    prediction = _tensor(output, (batch.X.shape[0],), "transformer_prediction (one prediction per task)")
    w_L = gradient_descent(batch.X, batch.y, eta, num_layers)[:, -1]
    expected = (w_L * batch.x_t).sum(-1)
    layers, steps = _plural(num_layers, "layer"), _plural(num_layers, "GD step")
    if not _close(prediction, expected):
        if _close(prediction, -expected):   # diagnose only what is wrong
            _fail(f"the sign is flipped ({case.label}): the prediction is minus the query's last coordinate, "
                  f"y_hat = -e_t[-1], after the {layers}")
        _fail(f"with the GD weights, {layers} should give the prediction of {steps} ({case.label})")


def _best_step_size_reference(d: int, n: int, num_tasks: int, seed: int) -> float:
    batch = RegressionTasks(d, n, **FLOAT64).sample(num_tasks, seed=seed)
    step = batch.alpha / n                      # w_1 = eta * step: the loss is a quadratic in eta
    return float((step * batch.w).sum() / (step * step).sum())


def _verify_best_step_size(case: Case, output) -> None:
    eta = _number(output, "best_step_size")
    best = _best_step_size_reference(**case.arguments)
    d, n = case.arguments["d"], case.arguments["n"]
    if abs(eta - best) <= 2e-3 * abs(best):
        return
    if abs(eta * n - best) <= 2e-3 * abs(best):
        _fail(f"for {case.label}: {eta:.5f} is the coefficient c = eta / n on alpha; return the step eta = n c")
    if abs(eta - n / (n + d + 1)) <= 1e-9:
        _fail(f"for {case.label}: {eta:.5f} is n / (n + d + 1), the limit for infinitely many tasks; return the step "
              f"with the smallest mean loss on the sampled tasks ({best:.5f})")
    _fail(f"for {case.label}: eta = {eta:.5f}, but the step with the smallest mean loss on these tasks is "
          f"{best:.5f} (within 0.2% is enough)")


def _chapter_1() -> list[Check]:
    def merged_examples():
        return [_merged_form_case(4, 3, 2, torch.Generator().manual_seed(0))]

    def merged_draw(rng):
        return [_merged_form_case(rng.randint(2, 7), rng.randint(1, 5), rng.randint(1, 5), _generator(rng))
                for _ in range(5)]

    def attention_examples():
        return [_linear_attention_case(2, 5, 3, torch.Generator().manual_seed(0))]

    def attention_draw(rng):
        return [_linear_attention_case(rng.randint(1, 5), rng.randint(1, 15), rng.randint(2, 6), _generator(rng))
                for _ in range(5)]

    def gd_examples():
        return [_gd_matrices_case(3, 8, 0.5, seed=0)]

    def gd_draw(rng):
        return [_gd_matrices_case(rng.randint(1, 6), rng.randint(2, 30), round(rng.uniform(0.1, 1.2), 3),
                                  rng.getrandbits(31)) for _ in range(5)]

    def layers_examples():
        return [_layers_case(3, 10, 0.6, num_layers, seed=num_layers) for num_layers in (1, 2, 4)]

    def layers_draw(rng):
        return [_layers_case(rng.randint(1, 5), rng.randint(4, 30), round(rng.uniform(0.2, 0.8), 3),
                             rng.randint(2, 6), rng.getrandbits(31)) for _ in range(4)]

    def step_examples():
        return [Case(dict(d=10, n=20, num_tasks=20_000, seed=0))]

    def step_draw(rng):
        cases = []
        for _ in range(3):
            d = rng.randint(2, 8)
            cases.append(Case(dict(d=d, n=rng.randint(d, 40), num_tasks=rng.choice((500, 2000)),
                                   seed=rng.getrandbits(31))))
        return cases

    return [
        Check(1, 1, "merged_form", merged_examples, merged_draw, _verify_merged_form),
        Check(1, 2, "linear_attention", attention_examples, attention_draw, _verify_linear_attention,
              giveaways=("LinearSelfAttention", "LinearTransformer", "from_matrices", "transform_tokens")),
        Check(1, 3, "gd_matrices", gd_examples, gd_draw, _verify_gd_matrices, giveaways=("gd_construction",)),
        Check(1, 4, "transformer_prediction", layers_examples, layers_draw, _verify_transformer_prediction,
              giveaways=("gradient_descent", "gd_construction", "LinearTransformer", "LinearSelfAttention")),
        Check(1, 5, "best_step_size", step_examples, step_draw, _verify_best_step_size,
              giveaways=("theory", "optimal_one_step_coefficient", "tune_step_sizes")),
    ]


# -- chapter 2: one step of GD is the optimal one-layer learner -------------------------------

def _verify_fourth_moment(case: Case, output) -> None:
    d = case.arguments["d"]
    value = _number(output, "fourth_moment", integer=True)
    if value != d * (d + 2):
        _fail(f"for d={d}: fourth_moment gives {value:g}; E||x||^4 = E[(sum_i z_i^2)^2] "
              "(expand the square: d terms E[z^4] and d(d-1) terms E[z_i^2] E[z_j^2])")


def _verify_fourth_moment_monte_carlo(case: Case, output) -> None:
    d, num_samples = case.arguments["d"], case.arguments["num_samples"]
    mean, error = _pair(output, "fourth_moment_monte_carlo")
    mean, error = _number(mean, "the mean"), _number(error, "the standard error")
    exact = d * (d + 2)
    # Var ||x||^4 = E||x||^8 - (E||x||^4)^2, with E||x||^8 = d(d+2)(d+4)(d+6)
    true_error = math.sqrt((d * (d + 2) * (d + 4) * (d + 6) - exact**2) / num_samples)
    if not 0.8 * true_error < error < 1.2 * true_error:
        _fail(f"for {case.label}: the standard error {error:.4g} should be about std / sqrt(num_samples) = "
              f"{true_error:.4g}")
    if abs(mean - exact) > 5 * true_error:
        _fail(f"for {case.label}: the Monte-Carlo mean {mean:.4f} is {abs(mean - exact) / true_error:.1f} "
              f"standard errors away from {exact}")


def _verify_optimal_coefficient(case: Case, output) -> None:
    d, n, second_moment = (case.arguments[key] for key in ("d", "n", "second_moment"))
    c = _number(output, "optimal_coefficient")
    best = theory.optimal_one_step_coefficient(d, n, math.sqrt(second_moment))
    if abs(c - best) <= 1e-9 * best:
        return
    if second_moment > 0 and abs(c - 1 / (n + d + 1)) <= 1e-9 * c:
        _fail(f"for {case.label}: c = {c:.6g} is the noiseless answer; the noise is missing from E||alpha||^2, "
              "which has a term n d E[sigma^2]")
    if abs(c - n * best) <= 1e-9 * n * best:
        _fail(f"for {case.label}: {c:.6g} is the step eta* = n c*; return the coefficient c* on alpha")
    if abs(c - 1 / n) <= 1e-9 / n:
        _fail(f"for {case.label}: 1/n is the step that treats Sigma/n as the identity; the minimiser is smaller: "
              "E||alpha||^2 = nd(n + d + 1) + nd E[sigma^2] (a fourth moment of x)")
    _fail(f"for {case.label}: c = {c:.6g}, but the minimiser is {best:.6g} (use E<alpha, w> = nd and "
          "E||alpha||^2 = nd(n + d + 1) + nd E[sigma^2])")


def _verify_one_step_loss(case: Case, output) -> None:
    d, n, second_moment, c = (case.arguments[key] for key in ("d", "n", "second_moment", "c"))
    value = _number(output, "one_step_loss")
    expected = theory.one_step_loss(d, n, math.sqrt(second_moment), c)

    def near(reference):
        return abs(value - reference) <= 1e-9 * (1 + abs(reference))
    if near(expected):
        return
    if near(2 * expected):
        _fail(f"for {case.label}: {value:.6g} is twice the loss; the course's loss is half the squared error")
    if second_moment > 0 and near(theory.one_step_loss(d, n, 0.0, c)):
        _fail(f"for {case.label}: {value:.6g} is the noiseless loss; the noise is missing (it adds "
              "c^2 n d E[sigma^2] / 2)")
    _fail(f"for {case.label}: the loss is {expected:.6g}, your closed form gives {value:.6g}")


def _bilinear_case(d: int, generator: torch.Generator) -> Case:
    return Case(dict(P=0.3 * _normal(generator, d + 1, d + 1), Q=0.3 * _normal(generator, d + 1, d + 1)))


def _verify_bilinear_B(case: Case, output) -> None:
    P, Q = case.arguments["P"], case.arguments["Q"]
    d = P.shape[0] - 1
    B = _tensor(output, (d, d), "B")
    expected = theory.one_layer_bilinear_form(LinearSelfAttention.from_matrices(P, Q))["B"]
    if _close(B, expected):
        return
    if _close(B, -expected):
        _fail(f"for d={d}: the sign is flipped: y_hat is minus the query's last coordinate")
    if _close(B, expected.T):
        _fail(f"for d={d}: B is transposed: <B alpha, x_t> = alpha^T B^T x_t, so check which index of Q_xx meets "
              "alpha and which meets x_t")
    _fail(f"for d={d}: B is wrong; the terms in alpha are p_y alpha^T Q_xx x_t and (p_x^T alpha)(q_yx^T x_t), "
          "inside y_hat = -(...)")


def _preconditioner_case(d: int, n: int, second_moment: float, generator: torch.Generator) -> Case:
    rotation, _ = torch.linalg.qr(_normal(generator, d, d))
    S = rotation @ torch.diag(torch.rand(d, generator=generator, **FLOAT64) + 0.1) @ rotation.T
    return Case(dict(S=(S + S.T) / 2, n=n, second_moment=second_moment))


def _verify_optimal_preconditioner(case: Case, output) -> None:
    S, n, second_moment = (case.arguments[key] for key in ("S", "n", "second_moment"))
    d = S.shape[0]
    B = _tensor(output, (d, d), "B")
    sigma = math.sqrt(second_moment)
    best = theory.preconditioned_one_step_loss(theory.optimal_preconditioner(S, n, sigma), S, n, sigma)
    loss = theory.preconditioned_one_step_loss(B, S, n, sigma)
    # any multiple of S^-1 (B S = k I) is the shape of the answer for the other prior, w ~ N(0, S^-1)
    k = torch.trace(B @ S) / d
    if loss > best + 1e-9 * (1 + abs(best)) and _close(B @ S, k * torch.eye(d, dtype=B.dtype)):
        _fail(f"for d={d}, n={n}, second_moment={second_moment:g}: that is the best B when w ~ N(0, S^-1), a "
              "multiple of S^-1; here w ~ N(0, I), and the answer is ((n + 1) S + (tr S + E[sigma^2]) I)^-1")
    if loss > best + 1e-9 * (1 + abs(best)):
        _fail(f"for d={d}, n={n}, second_moment={second_moment:g}: your B has loss {loss:.8g}, the best B has "
              f"{best:.8g}")


def _chapter_2() -> list[Check]:
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
                                     _generator(rng)) for _ in range(3)]

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
              loss_draw, _verify_one_step_loss, giveaways=("theory",)),
        Check(2, 4, "bilinear_B", lambda: [_bilinear_case(3, torch.Generator().manual_seed(0))],
              lambda rng: [_bilinear_case(rng.randint(1, 6), _generator(rng)) for _ in range(3)],
              _verify_bilinear_B, giveaways=("theory", "one_layer_bilinear_form")),
        Check(2, 5, "optimal_preconditioner",
              lambda: [_preconditioner_case(4, 20, 0.25, torch.Generator().manual_seed(0))],
              preconditioner_draw, _verify_optimal_preconditioner,
              giveaways=("theory", "preconditioned_one_step_loss")),
    ]


# -- chapter 3: GD++ is a second-order method --------------------------------------------------

def _implicit_case(B: int, d: int, generator: torch.Generator) -> Case:
    return Case(dict(M=torch.eye(d, **FLOAT64) + 0.3 * _normal(generator, B, d, d), u=_normal(generator, B, d),
                     a=1 + 0.1 * _normal(generator, B), w=_normal(generator, B, d),
                     mixing=0.2 * _normal(generator, B, d + 1, d + 1)))


def _verify_implicit_step(case: Case, output) -> None:
    M, u, a, w, mixing = (case.arguments[key] for key in ("M", "u", "a", "w", "mixing"))
    if not isinstance(output, (tuple, list)) or len(output) != 4:
        _fail(f"implicit_step must return the four new values (M, u, a, w), got {_kind(output)}")
    expected = theory.implicit_model_step(M, u, a, w, mixing)
    for name, got, reference in zip("Muaw", output, expected):
        got = _tensor(got, reference.shape, name)
        if _close(got, reference, 1e-10):
            continue
        d = M.shape[-1]
        misprint = reference + 2 * mixing[:, :d, d].unsqueeze(-1) * w.unsqueeze(-2) if name == "M" else None
        if misprint is not None and _close(got, misprint, 1e-10):
            _fail(f"for {case.label}: M has the paper's misprinted + b w^T (+ t_xy w^T here); expand "
                  "(I + T_xx)(M x + y u) + t_xy (a y - <w, x>)")
        _fail(f"for {case.label}: the new {name} is wrong (update all four from the old values)")


def _verify_gdpp_layers(case: Case, output) -> None:
    layers = _number(output, "gdpp_layers", integer=True)
    expected = theory.gdpp_layers_needed(**case.arguments)
    if layers != expected:
        _fail(f"for {case.label}: {layers:g} layers, but {expected} are needed (count the layers until "
              "kappa - 1 <= eps, then add the final GD step)")


def _cosine_case(B: int, n: int, d: int, generator: torch.Generator) -> Case:
    X = _normal(generator, B, n, d)
    return Case(dict(X=X, target=X[..., 0] ** 2 + 0.1 * _normal(generator, B, n)))


def _verify_best_cosine(case: Case, output) -> None:
    X, target = case.arguments["X"], case.arguments["target"]
    cosine = _tensor(output, (X.shape[0],), "best_cosine (one cosine per task)")
    expected = theory.best_linear_cosine(X, target)
    if not _close(cosine, expected, 1e-8):
        _fail(f"for {case.label}: the best cosine is ||projection of target on the columns of X|| / ||target||")


def _newton_case(d: int, num_steps: int, generator: torch.Generator) -> Case:
    rotation, _ = torch.linalg.qr(_normal(generator, d, d))
    eigenvalues = torch.logspace(0, 2, d, **FLOAT64)
    S = rotation @ torch.diag(eigenvalues) @ rotation.T
    return Case(dict(S=(S + S.T) / 2, num_steps=num_steps))


def _verify_newton_iterates(case: Case, output) -> None:
    S, num_steps = case.arguments["S"], case.arguments["num_steps"]
    d = S.shape[0]
    iterates = _tensor(output, (num_steps + 1, d, d), "newton_iterates (M_0 first)")
    expected = newton_inverse(S, num_steps)
    if not _close(iterates[0], expected[0], 1e-10):
        _fail(f"for d={d}: start from M_0 = I / lambda_max(S)")
    if not _close(iterates, expected, 1e-8):
        _fail(f"for d={d}, num_steps={num_steps}: the iterates differ from M <- M (2I - S M)")


def _chapter_3() -> list[Check]:
    def gdpp_draw(rng):
        return [Case(dict(kappa=float(10 ** rng.uniform(0.5, 6)), eps=float(10 ** -rng.uniform(1, 12))))
                for _ in range(4)]

    return [
        Check(3, 1, "implicit_step", lambda: [_implicit_case(3, 4, torch.Generator().manual_seed(0))],
              lambda rng: [_implicit_case(rng.randint(1, 4), rng.randint(1, 6), _generator(rng)) for _ in range(3)],
              _verify_implicit_step, giveaways=("theory", "implicit_model_step", "implicit_linear_model")),
        Check(3, 2, "gdpp_layers", lambda: [Case(dict(kappa=100.0, eps=1e-6)), Case(dict(kappa=10.0, eps=0.5))],
              gdpp_draw, _verify_gdpp_layers, giveaways=("theory", "gdpp_spectrum", "gdpp_layers_needed")),
        Check(3, 3, "best_cosine", lambda: [_cosine_case(3, 20, 4, torch.Generator().manual_seed(0))],
              lambda rng: [_cosine_case(rng.randint(1, 4), rng.randint(8, 40), rng.randint(1, 7), _generator(rng))
                           for _ in range(3)], _verify_best_cosine, giveaways=("theory", "best_linear_cosine")),
        Check(3, 4, "newton_iterates", lambda: [_newton_case(3, 4, torch.Generator().manual_seed(0))],
              lambda rng: [_newton_case(rng.randint(1, 6), rng.randint(0, 8), _generator(rng)) for _ in range(3)],
              _verify_newton_iterates, giveaways=("baselines", "optimizers", "newton_inverse")),
    ]


CHECKS: dict[str, Check] = {check.name: check for check in _chapter_1() + _chapter_2() + _chapter_3()}

# The helpers a chapter's catalogue of checks may use (the catalogues of later chapters live in modules
# of their own and import these, never the underscored names).
fail, expect_tensor, expect_number, expect_pair, describe = _fail, _tensor, _number, _pair, _kind
close, generator_from, normal = _close, _generator, _normal

from .grading.chapter4 import chapter_4_checks  # noqa: E402
from .grading_chapter5 import chapter_5_checks  # noqa: E402  (it builds on the names above)

CHECKS.update({check.name: check for check in chapter_4_checks()})
CHECKS.update({check.name: check for check in chapter_5_checks()})


# -- the three places a check runs ------------------------------------------------------------

def _find(name: str) -> Check:
    if name not in CHECKS:
        raise KeyError(f"no check named {name!r}; the checks are {sorted(CHECKS)}")
    return CHECKS[name]


def _portable(value, depth: int = 0):
    """``value`` as plain tensors, numbers and tuples, which ``torch.load(weights_only=True)`` reads."""
    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu").as_subclass(torch.Tensor).clone()
    if isinstance(value, (bool, str)) or value is None:
        return value if not isinstance(value, str) else value[:200]
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        return float(value)
    if isinstance(value, (tuple, list)) and depth < 2 and len(value) <= 16:
        return tuple(_portable(item, depth + 1) for item in value)
    if type(value).__module__ == "numpy" and hasattr(value, "shape"):
        return torch.as_tensor(value.copy())
    return f"<an object of type {type(value).__name__}>"


def self_check(name: str, function: Callable) -> None:
    """Verify ``function`` on the examples of the check ``name`` and on cases drawn with a local seed.

    Raises :class:`SelfCheckFailed` (an ``AssertionError``) saying what is wrong; prints
    ``name: passed`` otherwise.  The drawn cases come from a seed of their own, never from the
    grading seed, which only the instructor's grading run knows.
    """
    check = _find(name)
    cases = check.examples() + check.draw(random.Random(f"{name}:self-check"))
    _OUTCOMES[name] = "failed: the function raised an error"   # until every case has passed
    for case in cases:
        output = _portable(function(**copy.deepcopy(case.arguments)))
        try:
            check.verify(case, output)
        except CheckFailed as failure:
            _OUTCOMES[name] = f"failed: {str(failure).splitlines()[0][:160]}"
            stuck = f" (stuck? checks.hint({name!r}) opens a hint)" if name in HINTS else ""
            raise SelfCheckFailed(f"{name}: {failure}{stuck}") from None
    _OUTCOMES[name] = "passed"
    print(f"{name}: passed ({len(cases)} cases)")


# what the self-checks of this kernel found, and how many hints each task has opened
_OUTCOMES: dict[str, str] = {}
_HINTS_SHOWN: dict[str, int] = {}


def hint(name: str) -> None:
    """Print the next hint of the task ``name`` (the first call the first hint, and so on).

    The first hint points the way; the last one nearly gives the answer.  ``checks.hint(name)``
    after the last one repeats it.
    """
    _find(name)
    hints = HINTS.get(name, ())
    if not hints:
        print(f"{name}: this task has no hints")
        return
    shown = min(_HINTS_SHOWN.get(name, 0) + 1, len(hints))
    _HINTS_SHOWN[name] = shown
    for number in range(1, shown + 1):
        print(f"hint {number} of {len(hints)}: {hints[number - 1]}")
    if shown < len(hints):
        print(f"(call checks.hint({name!r}) again for the next)")


@dataclass
class Progress:
    """A chapter's tasks and what their self-checks found in this kernel (a table in Jupyter)."""

    chapter: int
    rows: list  # (task, name, status, hints opened)

    @property
    def passed(self) -> int:
        return sum(status == "passed" for _, _, status, _ in self.rows)

    def __str__(self) -> str:
        lines = [f"chapter {self.chapter}: {self.passed} of {len(self.rows)} tasks passed their self-check"]
        lines += [f"  task {task}  {name:28s} {status}" + (f"  ({hints} hints)" if hints else "")
                  for task, name, status, hints in self.rows]
        return "\n".join(lines)

    __repr__ = __str__

    def _repr_html_(self) -> str:
        from html import escape
        cells = "".join(
            f"<tr><td>{task}</td><td><code>{escape(name)}</code></td><td>{'&#10004; ' if status == 'passed' else ''}"
            f"{escape(status)}</td><td>{hints or ''}</td></tr>" for task, name, status, hints in self.rows)
        return (f"<p>Chapter {self.chapter}: {self.passed} of {len(self.rows)} tasks passed their self-check "
                f"in this kernel.</p><table><thead><tr><th>task</th><th>function</th><th>self-check</th>"
                f"<th>hints opened</th></tr></thead><tbody>{cells}</tbody></table>")


def progress(chapter: int) -> Progress:
    """The tasks of ``chapter`` with what their self-checks found in this kernel: passed, failed (and
    why, in a line), or not run yet.  Grading decides the points on its own; this is for the learner."""
    tasks = sorted((check.task, check.name) for check in CHECKS.values() if check.chapter == chapter)
    if not tasks:
        chapters = sorted({check.chapter for check in CHECKS.values()})
        raise ValueError(f"no graded tasks in chapter {chapter!r}; the chapters with tasks are {chapters}")
    return Progress(chapter, [(task, name, _OUTCOMES.get(name, "not run yet"), _HINTS_SHOWN.get(name, 0))
                              for task, name in tasks])


def record(name: str, function: Callable) -> None:
    """Hidden tests: save ``function``'s outputs for grading, or verify them outside grading (see module doc)."""
    check = _find(name)
    directory = os.environ.get(ANSWERS_VARIABLE)
    cases = check.grading_cases(int(os.environ.get(SEED_VARIABLE, LOCAL_SEED)))
    if not directory:
        for case in cases:
            check.verify(case, _portable(function(**copy.deepcopy(case.arguments))))
        return
    entries = []
    for case in cases:
        try:
            entries.append(("output", _portable(function(**copy.deepcopy(case.arguments)))))
        except Exception as error:  # the grader reports it; the other cases still count as failed
            entries.append(("error", f"{type(error).__name__}: {error}"[:300]))
    torch.save(entries, Path(directory) / f"{name}.pt")


def _load_record(path: Path) -> list:
    if not path.exists():
        _fail("no outputs were recorded (the grading cell did not run: did the notebook stop early?)")
    if path.stat().st_size > MAX_RECORD_BYTES:
        _fail(f"the recorded outputs take {path.stat().st_size / 2**20:.0f} MiB, more than any answer needs")
    if zipfile.is_zipfile(path):  # torch.save writes an uncompressed zip: anything else may be a zip bomb
        with zipfile.ZipFile(path) as archive:
            entries = archive.infolist()
        unpacked = sum(entry.file_size for entry in entries)
        if unpacked > MAX_RECORD_BYTES or any(entry.compress_type != zipfile.ZIP_STORED for entry in entries):
            _fail(f"the recorded outputs would unpack to {unpacked / 2**20:.0f} MiB or are compressed, "
                  "which checks.record never writes")
    try:
        entries = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # anything but plain tensors and numbers is refused, never executed
        _fail(f"the recorded outputs could not be read safely ({type(error).__name__})")
    if not isinstance(entries, (list, tuple)) or not all(
            isinstance(entry, tuple) and len(entry) == 2 and entry[0] in ("output", "error") for entry in entries):
        _fail("the recorded outputs are not in the format that checks.record writes")
    return list(entries)


def verify_recorded(names: list[str], directory: Path, seed: int) -> dict[str, str]:
    """Verify the outputs that :func:`record` saved in ``directory`` for every check in ``names``.

    Runs in the grader's process.  Returns ``{name: ""}`` for a check that passed on every case,
    otherwise ``{name: what went wrong}``; nothing the recorded file holds is ever executed.
    """
    verdicts = {}
    for name in names:
        check = _find(name)
        try:
            entries = _load_record(Path(directory) / f"{name}.pt")
            cases = check.grading_cases(seed)
            if len(entries) != len(cases):
                _fail(f"{len(entries)} outputs were recorded for {len(cases)} grading inputs")
            for case, (kind, value) in zip(cases, entries):
                if kind == "error":
                    _fail(f"{name}({case.label}) raised {value}")
                try:
                    check.verify(case, value)
                except CheckFailed:
                    raise
                except Exception as error:  # an output of an unexpected type or shape
                    _fail(f"the output for {case.label} could not be checked ({type(error).__name__}: {error})")
            verdicts[name] = ""
        except CheckFailed as failure:
            verdicts[name] = f"{name}: {failure}"
    return verdicts


_RECORD_CALL = re.compile(r"""checks\.record\(\s*["'](\w+)["']""")


def recorded_names(source: str) -> list[str]:
    """The check names that a hidden-test cell's ``checks.record("name", ...)`` calls grade."""
    return _RECORD_CALL.findall(source)


def giveaways_used(source: str, names: tuple) -> list[str]:
    """Which of ``names`` (package reference functions) an answer cell's code mentions.

    Looks at every identifier, attribute and imported name, leaving out the functions the cell
    defines itself.  A heuristic for the instructor, not a proof: code can always hide a name.
    """
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return sorted(name for name in names if re.search(rf"\b{re.escape(name)}\b", source))
    seen, defined = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            seen.add(node.id)
        elif isinstance(node, ast.Attribute):
            seen.add(node.attr)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                seen.update(alias.name.split("."))
            seen.update((getattr(node, "module", None) or "").split("."))
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            defined.add(node.name)
    return sorted((seen - defined) & set(names))
