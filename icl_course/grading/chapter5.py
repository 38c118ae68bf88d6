"""The graded checks of chapter 5, Memformers implement conjugate gradient (Dutta et al. 2024).

* ``cg_iterates``: conjugate gradient on a batch of tasks, every iterate;
* ``memformer_layer``: one CGD-like Memformer layer in Ahn et al.'s matrix form, with its register;
* ``momentum_alpha_gamma``: the scalars that make a CGD-like Memformer run heavy-ball momentum with a step
  size and a momentum of its own at every step.
"""

from __future__ import annotations

import random

import torch

from ..data import TaskBatch
from ..memformer import Memformer
from ..optimizers import conjugate_gradient, momentum_descent
from .checking import FLOAT64, Case, Check, close, describe, expect_tensor, fail, generator_from, mismatch, normal

__all__ = ["chapter_5_checks", "reference_memformer_layer"]


# -- task 1: CG on a batch ---------------------------------------------------------------------

def _cg_case(B: int, n: int, d: int, num_steps: int, generator: torch.Generator) -> Case:
    X = normal(generator, B, n, d) * torch.linspace(0.3, 1.0, d, **FLOAT64)
    y = X @ normal(generator, d, 1).squeeze(-1) + 0.1 * normal(generator, B, n)
    return Case(dict(X=X, y=y, num_steps=num_steps))


def _verify_cg(case: Case, output) -> None:
    X, y, num_steps = (case.arguments[key] for key in ("X", "y", "num_steps"))
    B, n, d = X.shape
    iterates = expect_tensor(output, (B, num_steps + 1, d), "cg_iterates (w_0 = 0 first)")
    expected = conjugate_gradient(X, y, num_steps)
    if not close(iterates[:, 0], expected[:, 0], 1e-12):
        fail(f"for {case.label}: the first iterate is not w_0 = 0; the furthest entry "
             f"[task, coordinate]{mismatch(iterates[:, 0], expected[:, 0])}")
    if num_steps >= 1 and not close(iterates[:, 1], expected[:, 1], 1e-8):
        fail(f"for {case.label}: the first step w_1 is wrong; the furthest entry "
             f"[task, coordinate]{mismatch(iterates[:, 1], expected[:, 1])}")
    if not close(iterates, expected, 1e-7):
        fail(f"for {case.label}: w_0 and w_1 are right, but later iterates differ from conjugate gradient on "
             "each task's Sigma w = alpha; the furthest entry "
             f"[task, step, coordinate]{mismatch(iterates, expected)}")


# -- task 2: one Memformer layer with its register ---------------------------------------------

def reference_memformer_layer(Z, register, A, alpha, gamma):
    """``R <- Attn(Z) + gamma R``, ``Z <- Z + alpha R`` with ``Attn(Z) = P Z M Z^T Q Z / n``.

    ``P = [[0, 0], [0, 1]]``, ``Q = -[[A^T, 0], [0, 0]]``, ``M = diag(I_n, 0)``.  Shapes: ``Z`` and
    ``register`` (B, d+1, n+1), ``A`` (d, d) -> (new Z, new register).
    """
    d, n = Z.shape[-2] - 1, Z.shape[-1] - 1
    P = torch.zeros(d + 1, d + 1, dtype=Z.dtype)
    P[d, d] = 1.0
    Q = torch.zeros(d + 1, d + 1, dtype=Z.dtype)
    Q[:d, :d] = -A.T
    mask = torch.diag(torch.cat([torch.ones(n, dtype=Z.dtype), torch.zeros(1, dtype=Z.dtype)]))
    attention = P @ Z @ mask @ Z.transpose(-1, -2) @ Q @ Z / n
    new_register = attention + gamma * register
    return Z + alpha * new_register, new_register


def _layer_case(B: int, n: int, d: int, generator: torch.Generator, fresh: bool, query_label: bool = False) -> Case:
    """With ``query_label`` the query token's last entry is not zero (as in a deeper layer, where it holds
    minus the prediction so far): only then does an implementation that ignores the mask ``M`` go wrong."""
    X, x_t = normal(generator, B, n, d), normal(generator, B, d)
    y = X @ normal(generator, d, 1).squeeze(-1)
    context = torch.cat([X, y.unsqueeze(-1)], -1).transpose(-1, -2)
    label = normal(generator, B, 1) if query_label else torch.zeros(B, 1, **FLOAT64)
    query = torch.cat([x_t, label], -1).unsqueeze(-1)
    Z = torch.cat([context, query], -1)
    register = torch.zeros_like(Z) if fresh else 0.3 * normal(generator, B, d + 1, n + 1)
    A = torch.eye(d, **FLOAT64) + 0.3 * normal(generator, d, d)
    return Case(dict(Z=Z, register=register, A=A, alpha=0.8, gamma=0.4))


def _verify_layer(case: Case, output) -> None:
    Z = case.arguments["Z"]
    if not isinstance(output, (tuple, list)) or len(output) != 2:
        fail(f"memformer_layer must return (new Z, new register), got {describe(output)}")
    new_Z, new_register = (expect_tensor(value, Z.shape, name)
                           for value, name in zip(output, ("new Z", "new register")))
    expected_Z, expected_register = reference_memformer_layer(**case.arguments)
    if not close(new_register, expected_register, 1e-9):
        plain = reference_memformer_layer(**{**case.arguments, "gamma": 0.0})[1]
        if close(new_register, plain, 1e-9):
            fail(f"for {case.label}: the new register is Attn(Z) alone: it does not depend on the old register")
        fail(f"for {case.label}: the new register is not Attn(Z) + gamma * register, with "
             "Attn(Z) = P Z M Z^T Q Z / n (the mask keeps the query column out of Z M Z^T); the furthest entry "
             f"[task, row, column]{mismatch(new_register, expected_register)}")
    if not close(new_Z, expected_Z, 1e-9):
        fail(f"for {case.label}: the new register is right, but the new Z is not Z + alpha * (the new register); "
             f"the furthest entry [task, row, column]{mismatch(new_Z, expected_Z)}")


# -- task 3: momentum as a Memformer -----------------------------------------------------------

def _verify_momentum(case: Case, output) -> None:
    eta, mu = case.arguments["eta"], case.arguments["mu"]
    num_layers = eta.shape[0]
    if not isinstance(output, (tuple, list)) or len(output) != 2:
        fail(f"momentum_alpha_gamma must return (alpha, gamma), got {describe(output)}")
    alpha, gamma = (expect_tensor(value, (num_layers,), name) for value, name in zip(output, ("alpha", "gamma")))
    batch = case.context["batch"]
    model = Memformer(batch.d, batch.n, num_layers, attention="identity", memory="cgd", dtype=torch.float64)
    got = model(batch, alpha=alpha, gamma=gamma).layer_weights
    expected = momentum_descent(batch.X, batch.y, eta, mu, num_layers)[:, 1:]
    if not close(got[:, 0], expected[:, 0], 1e-6):  # 1e-6: float32 answers pass
        fail(f"for {case.label}: the first layer is not one GD step of size eta_1; the furthest entry "
             f"[task, coordinate]{mismatch(got[:, 0], expected[:, 0])}")
    if not close(got, expected, 1e-6):
        naive = model(batch, alpha=eta, gamma=mu).layer_weights
        if close(got, naive, 1e-6):
            fail(f"for {case.label}: your layers run as with gamma = mu, which matches heavy ball only while the "
                 "step size stays the same; here eta changes from layer to layer")
        fail(f"for {case.label}: the layers do not follow w + eta_l(-grad) + mu_l (w - w_prev); the furthest "
             f"entry [task, layer, coordinate]{mismatch(got, expected)}")


def _momentum_case(eta, mu, generator: torch.Generator) -> Case:
    B, n, d = 4, 12, 3
    X = normal(generator, B, n, d)
    w = normal(generator, B, d)
    y = (X @ w.unsqueeze(-1)).squeeze(-1)
    x_t = normal(generator, B, d)
    batch = TaskBatch(X=X, y=y, x_t=x_t, y_t=(x_t * w).sum(-1), w=w, sigma=torch.zeros(B, **FLOAT64))
    return Case(dict(eta=torch.tensor(eta, **FLOAT64), mu=torch.tensor(mu, **FLOAT64)), dict(batch=batch))


def chapter_5_checks() -> list[Check]:
    """The graded checks of chapter 5, in task order."""
    def cg_draw(rng: random.Random):
        return [_cg_case(rng.randint(1, 4), rng.randint(6, 30), rng.randint(1, 6), rng.randint(0, 7),
                         generator_from(rng)) for _ in range(3)]

    def layer_draw(rng: random.Random):
        return [_layer_case(rng.randint(1, 3), rng.randint(3, 12), rng.randint(1, 5), generator_from(rng), False,
                            query_label=True) for _ in range(3)]

    def momentum_draw(rng: random.Random):
        sizes = [rng.randint(1, 6) for _ in range(3)]
        return [_momentum_case([rng.uniform(0.1, 0.9) for _ in range(L)], [rng.uniform(0.0, 0.9) for _ in range(L)],
                               generator_from(rng)) for L in sizes]

    def momentum_examples():   # a constant schedule, then one whose step size changes
        return [_momentum_case([0.5, 0.5], [0.3, 0.3], torch.Generator().manual_seed(0)),
                _momentum_case([0.2, 0.6, 0.4, 0.8], [0.0, 0.8, 0.5, 0.3], torch.Generator().manual_seed(1))]

    return [
        Check(5, 1, "cg_iterates", lambda: [_cg_case(3, 20, 5, 6, torch.Generator().manual_seed(0))], cg_draw,
              _verify_cg, giveaways=("optimizers", "conjugate_gradient", "cg_coefficients")),
        Check(5, 2, "memformer_layer",
              lambda: [_layer_case(2, 6, 3, torch.Generator().manual_seed(0), True),
                       _layer_case(2, 6, 3, torch.Generator().manual_seed(1), False)],
              layer_draw, _verify_layer, giveaways=("memformer", "Memformer", "reference_memformer_layer")),
        Check(5, 3, "momentum_alpha_gamma", momentum_examples, momentum_draw, _verify_momentum,
              giveaways=("memformer", "momentum_coefficients")),
    ]
