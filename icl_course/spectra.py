"""The eigenvalues of ``X^T X`` exactly, and the expected losses they decide (chapter 5).

With Gaussian inputs, ``X^T X`` (``X`` the ``n x d`` matrix of a task's context inputs) is a real Wishart
matrix ``W_d(n, I)``.  Its eigenvalues have the joint density, for ``s_1 < ... < s_d``,

    ``prod_i s_i^a e^{-s_i / 2}  prod_{i<j} (s_j - s_i)`` up to a constant, ``a = (n - d - 1) / 2``,

and where ``n - d`` is odd, ``a`` is a whole number, so integrating all eigenvalues but one out of it leaves
a finite sum: the density of the eigenvalue of a randomly chosen eigen-direction is
``rho(s) = sum c s^p e^{-r s / 2}`` with rational ``c`` (:func:`eigenvalue_density`, in exact arithmetic).  Its
moments are exact rationals, and the Gauss rule of ``rho`` (:func:`gauss_rule`) integrates every polynomial of
degree below twice its number of nodes exactly.

That decides the expected loss of every learner whose error is a polynomial of ``X^T X`` applied to ``w``.
On noiseless tasks with ``x ~ N(0, I)`` and ``w ~ N(0, I)`` (chapter 5's isotropic setting, and its rotated one
seen in white coordinates) an estimate ``w_hat = w - r(X^T X) w`` loses
``1/2 E[|r(X^T X) w|^2] = (d / 2) E[r(s)^2]``, one integral against ``rho``:

* :func:`best_shared_residual`: the best ``r`` of degree ``L`` with ``r(0) = 1``, exactly.  Every method that
  runs ``L`` steps on the context with scalar coefficients shared by all tasks (GD with one step size per step,
  heavy ball, Nesterov, the CGD-like Memformer with scalars, and in white coordinates every GD-form model whose
  ``A_l`` are multiples of ``I``) has such a residual, so none can lose less; its roots are real and positive, so GD
  with the steps ``n / root`` reaches it;
* :func:`gdpp_memformer_loss`: a CGD-like Memformer whose layers are GD++ steps, ``P_l = diag(p_x I, p_y)``
  and ``Q_l = diag(q_x I, 0)`` (the symmetric part of the models with every entry of ``P`` and ``Q`` trained,
  in white coordinates: :func:`gdpp_part`).  Its residual after ``L`` layers has degree ``(3^L - 1) / 2``;
  :func:`fit_gdpp_memformer` minimises its exact expected loss.

Nothing here samples: these numbers have no standard error, and no rare task can hide from them.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import time
from fractions import Fraction
from functools import lru_cache
from itertools import permutations
from pathlib import Path
from typing import Optional

import numpy as np
import torch

from .data import TaskBatch
from .memformer import Memformer
from .runtime import check_count, make_generator

__all__ = ["eigenvalue_density", "density", "eigenvalue_moments", "gauss_rule", "eigenvalues_above",
           "eigenvalue_beyond", "tasks_with_eigenvalue", "loss_density",
           "best_shared_residual", "gdpp_memformer_residuals", "gdpp_memformer_loss", "fit_gdpp_memformer",
           "minimum_check", "gdpp_memformer", "gdpp_part", "invariant_part", "deepened", "make_optima", "load_optima",
           "MAX_NODES"]

#: The Gauss rules here take their weights from the orthonormal polynomials evaluated in float64 at the
#: nodes; beyond about 150 nodes those values pass 10^154 and their squares overflow.
MAX_NODES = 150


def _check_sizes(d: int, n: int) -> None:
    check_count(d, "d")
    check_count(n, "n")
    if n < d:
        raise ValueError(f"X^T X needs n >= d to have d non-zero eigenvalues; got d={d}, n={n}")
    if (n - d) % 2 == 0:
        raise ValueError(f"the exact eigenvalue density is a finite sum only when n - d is odd (a whole power "
                         f"(n - d - 1) / 2); got d={d}, n={n}. Use n = {n + 1} or sample tasks instead")


def _vandermonde_terms(d: int, a: int) -> dict:
    """``prod_i s_i^a e^{-s_i/2} prod_{i<j}(s_j - s_i)`` as ``{(powers, rates): coefficient}``."""
    terms = {}
    for order in permutations(range(d)):
        sign = 1
        seen = list(order)
        for i in range(d):   # the permutation's sign, by sorting it with swaps
            while seen[i] != i:
                j = seen[i]
                seen[i], seen[j] = seen[j], seen[i]
                sign = -sign
        key = (tuple(a + order[i] for i in range(d)), (1,) * d)
        terms[key] = terms.get(key, 0) + sign
    return {key: Fraction(value) for key, value in terms.items() if value}


def _integrate(terms: dict, variable: int, bound: int, below: bool) -> dict:
    """Integrate ``variable`` out of ``terms`` over ``(0, s_bound)`` (``below``) or ``(s_bound, inf)``.

    Uses ``int_0^y t^p e^{-c t} dt = p!/c^{p+1} - e^{-c y} sum_j p!/(j! c^{p-j+1}) y^j`` and
    ``int_y^inf t^p e^{-c t} dt = e^{-c y} sum_j p!/(j! c^{p-j+1}) y^j`` with ``c = rate / 2``.
    """
    out: dict = {}

    def add(key, value):
        out[key] = out.get(key, 0) + value

    for (powers, rates), coefficient in terms.items():
        p, rate = powers[variable], rates[variable]
        c = Fraction(rate, 2)
        rest_powers, rest_rates = list(powers), list(rates)
        rest_powers[variable], rest_rates[variable] = 0, 0
        if below:
            add((tuple(rest_powers), tuple(rest_rates)), coefficient * math.factorial(p) / c ** (p + 1))
        for j in range(p + 1):
            new_powers, new_rates = list(rest_powers), list(rest_rates)
            new_powers[bound] += j
            new_rates[bound] += rate
            value = coefficient * Fraction(math.factorial(p), math.factorial(j)) / c ** (p - j + 1)
            add((tuple(new_powers), tuple(new_rates)), -value if below else value)
    return {key: value for key, value in out.items() if value}


@lru_cache(maxsize=None)
def eigenvalue_density(d: int, n: int) -> tuple:
    """The density of one eigenvalue of ``X^T X`` (a random eigen-direction's), exactly.

    Returns ``((c, p, r), ...)``: ``rho(s) = sum c s^p e^{-r s / 2}`` with ``c`` a ``Fraction``, normalised
    (``int rho = 1``).  It is the mean of the densities of the ``d`` ordered eigenvalues; each is the joint
    density with the others integrated out in turn (those below from 0, those above to infinity), in exact
    rational arithmetic.  Needs ``n - d`` odd; ``d = 5, n = 20`` takes under a second.
    """
    _check_sizes(d, n)
    base = _vandermonde_terms(d, (n - d - 1) // 2)
    total: dict = {}
    for k in range(d):   # the k-th smallest eigenvalue stays
        terms = dict(base)
        for variable in range(k):                       # s_0 < s_1 < ... < s_k
            terms = _integrate(terms, variable, variable + 1, below=True)
        for variable in range(d - 1, k, -1):            # s_k < ... < s_{d-1}
            terms = _integrate(terms, variable, variable - 1, below=False)
        for (powers, rates), coefficient in terms.items():
            key = (powers[k], rates[k])
            total[key] = total.get(key, 0) + coefficient
    mass = sum(c * math.factorial(p) * Fraction(2, r) ** (p + 1) for (p, r), c in total.items())
    return tuple((c / mass, p, r) for (p, r), c in sorted(total.items()) if c)


def density(s, d: int = 5, n: int = 20) -> torch.Tensor:
    """``rho(s)`` of :func:`eigenvalue_density` at the points ``s`` (any shape, float64; 0 for ``s < 0``)."""
    s = torch.as_tensor(s, dtype=torch.float64)
    positive = s.clamp_min(1e-300)
    value = torch.zeros_like(s)
    for c, p, r in eigenvalue_density(d, n):
        value = value + float(c) * torch.exp(p * torch.log(positive) - r * positive / 2)
    return torch.where(s >= 0, value, torch.zeros_like(value))


def eigenvalue_moments(d: int, n: int, count: int) -> list:
    """``E[s^k]`` for ``k = 0 .. count - 1``, exact ``Fraction`` s (``E[s] = n``, ``E[s^2] = n (n + d + 1)``)."""
    terms = eigenvalue_density(d, n)
    return [sum(c * math.factorial(p + k) * Fraction(2, r) ** (p + k + 1) for c, p, r in terms) for k in range(count)]


@lru_cache(maxsize=None)
def _recurrence(d: int, n: int, num_nodes: int) -> tuple:
    """The three-term recurrence ``a_k, b_k`` (``k < num_nodes``) of the monic orthogonal polynomials of
    ``rho``, from its exact moments by Chebyshev's algorithm (Gautschi 2004, chapter 2), exactly."""
    moments = eigenvalue_moments(d, n, 2 * num_nodes)
    a, b = [Fraction(0)] * num_nodes, [Fraction(0)] * num_nodes
    a[0], b[0] = moments[1] / moments[0], moments[0]
    previous, current = [Fraction(0)] * (2 * num_nodes), list(moments)
    for k in range(1, num_nodes):
        following = [Fraction(0)] * (2 * num_nodes)
        for index in range(k, 2 * num_nodes - k):
            following[index] = current[index + 1] - a[k - 1] * current[index] - b[k - 1] * previous[index]
        a[k] = following[k + 1] / following[k] - current[k] / current[k - 1]
        b[k] = following[k] / current[k - 1]
        previous, current = current, following
    return tuple(a), tuple(b)


@lru_cache(maxsize=None)
def _rule(d: int, n: int, num_nodes: int) -> tuple:
    a, b = (np.array([float(v) for v in values]) for values in _recurrence(d, n, num_nodes))
    root_b = np.sqrt(b)
    nodes = np.linalg.eigvalsh(np.diag(a) + np.diag(root_b[1:], 1) + np.diag(root_b[1:], -1))
    # Christoffel numbers 1 / sum_k q_k(x)^2 with orthonormal q_k: accurate to rounding even where a weight is
    # 1e-90 (the eigenvectors' first entries, the textbook route, are not: they carry absolute errors of 1e-16)
    previous, current = np.zeros_like(nodes), np.full_like(nodes, 1 / root_b[0])
    squares = current**2
    for k in range(num_nodes - 1):
        following = ((nodes - a[k]) * current - (root_b[k] * previous if k else 0.0)) / root_b[k + 1]
        previous, current = current, following
        squares = squares + current**2
    return nodes, 1 / squares


def gauss_rule(d: int = 5, n: int = 20, num_nodes: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    """Nodes and weights (each (num_nodes,), float64) with ``sum_j weight_j f(node_j) = E[f(s)]`` for every
    polynomial ``f`` of degree below ``2 num_nodes`` (``s`` an eigenvalue of ``X^T X``, law
    :func:`eigenvalue_density`); exact up to rounding.  At most :data:`MAX_NODES` nodes."""
    check_count(num_nodes, "num_nodes")
    if num_nodes > MAX_NODES:
        raise ValueError(f"at most {MAX_NODES} nodes (float64 overflows beyond); got num_nodes={num_nodes}")
    _check_sizes(d, n)
    nodes, weights = _rule(d, n, num_nodes)
    return torch.tensor(nodes, dtype=torch.float64), torch.tensor(weights, dtype=torch.float64)


def eigenvalues_above(x: float, d: int = 5, n: int = 20) -> float:
    """How many eigenvalues of ``X^T X`` exceed ``x``, on average over tasks: ``d int_x^inf rho``, exactly
    (a task has one with at most this chance; for a rare ``x`` the two agree)."""
    if not x >= 0:
        raise ValueError(f"x must be a number >= 0, got {x!r}")
    if x == 0:
        return float(d)
    total = 0.0
    for c, p, r in eigenvalue_density(d, n):
        rate = r / 2    # int_x^inf t^p e^{-rate t} dt = e^{-rate x} sum_j p!/j! x^j / rate^{p-j+1}
        total += float(c) * sum(math.exp(-rate * x + j * math.log(x) - math.lgamma(j + 1) + math.lgamma(p + 1)
                                         - (p - j + 1) * math.log(rate)) for j in range(p + 1))
    return d * total


def eigenvalue_beyond(count: float, d: int = 5, n: int = 20) -> float:
    """The ``x`` with ``eigenvalues_above(x) = count``: beyond it a sample of ``1 / count`` tasks holds one eigenvalue
    on average (``count = 1e-6``: the edge of what a million tasks see).  Bisection to rounding."""
    if not 0 < count < d:
        raise ValueError(f"count must lie between 0 and d = {d} (eigenvalues per task beyond x), got {count!r}")
    low, high = 0.0, float(n)
    while eigenvalues_above(high, d, n) > count:
        low, high = high, 2 * high
    for _ in range(200):
        middle = (low + high) / 2
        if middle in (low, high):
            break
        low, high = (middle, high) if eigenvalues_above(middle, d, n) > count else (low, middle)
    return (low + high) / 2


def tasks_with_eigenvalue(s: float, num_tasks: int = 2_000, seed: int = 0, d: int = 5, n: int = 20) -> TaskBatch:
    """Noiseless isotropic tasks whose largest eigenvalue of ``X^T X`` is set to ``s`` (float64, on the CPU).

    ``X = U diag(sqrt(s_k)) V^T`` is drawn as usual and its largest singular value replaced by ``sqrt(s)``, so the
    other eigenvalues and the eigenvectors keep their law; ``w``, then the queries, are drawn after ``X`` from the
    same seeded generator, and ``y = X w``.  For looking at what a model does on rare spectra, not for averaging:
    the batch is not a sample of the task law.  Shapes as :class:`~icl_course.data.TaskBatch`."""
    if not s > 0:
        raise ValueError(f"s must be a positive eigenvalue, got {s!r}")
    check_count(num_tasks, "num_tasks")
    check_count(d, "d")
    check_count(n, "n")
    if n < d:
        raise ValueError(f"X^T X needs n >= d to have d non-zero eigenvalues; got d={d}, n={n}")
    generator = make_generator(seed)
    X = torch.randn(num_tasks, n, d, generator=generator, dtype=torch.float64)
    U, singular, Vh = torch.linalg.svd(X, full_matrices=False)
    singular[:, 0] = s ** 0.5
    X = U @ torch.diag_embed(singular) @ Vh
    w = torch.randn(num_tasks, d, generator=generator, dtype=torch.float64)
    x_t = torch.randn(num_tasks, d, generator=generator, dtype=torch.float64)
    return TaskBatch(X=X, y=(X @ w.unsqueeze(-1)).squeeze(-1), x_t=x_t, y_t=(x_t * w).sum(-1), w=w,
                     sigma=torch.zeros(num_tasks, dtype=torch.float64))


def best_shared_residual(num_steps: int, d: int = 5, n: int = 20) -> dict:
    """The smallest expected loss of any ``num_steps``-step method with scalar coefficients shared by all tasks.

    Such a method returns ``w_hat = q(X^T X) X^T y`` for a polynomial ``q`` of degree ``num_steps - 1``, so its
    residual ``r(s) = 1 - s q(s)`` has degree ``num_steps`` and ``r(0) = 1``; on noiseless isotropic tasks its
    loss is ``(d/2) E[r(s)^2]``, a quadratic form in ``r``'s coefficients with the exact moments of
    :func:`eigenvalue_moments`, minimised here in rational arithmetic.

    Returns ``{"loss": float, "exact": Fraction, "coefficients": [Fraction] (r's, from s^0), "roots": (num_steps,)
    float64 tensor, increasing, "gd_steps": the step sizes eta_k = n / root_k that make GD on
    R(w) = |X w - y|^2 / (2 n) reach it}``.
    """
    check_count(num_steps, "num_steps")
    moments = eigenvalue_moments(d, n, 2 * num_steps + 1)
    # normal equations of min E[(1 + sum_k c_k s^k)^2] over c_1..c_L, solved by Gaussian elimination
    size = num_steps
    matrix = [[moments[j + k] for k in range(1, size + 1)] for j in range(1, size + 1)]
    right = [-moments[j] for j in range(1, size + 1)]
    for i in range(size):
        for row in range(i + 1, size):
            factor = matrix[row][i] / matrix[i][i]
            for column in range(i, size):
                matrix[row][column] -= factor * matrix[i][column]
            right[row] -= factor * right[i]
    solution = [Fraction(0)] * size
    for i in reversed(range(size)):
        solution[i] = (right[i] - sum(matrix[i][c] * solution[c] for c in range(i + 1, size))) / matrix[i][i]
    coefficients = [Fraction(1), *solution]
    exact = Fraction(d, 2) * sum(coefficients[j] * coefficients[k] * moments[j + k]
                                 for j in range(size + 1) for k in range(size + 1))
    roots = np.roots([float(c) for c in reversed(coefficients)])
    if np.abs(roots.imag).max(initial=0.0) > 1e-9 * np.abs(roots).max():
        raise ArithmeticError("the best shared residual has complex roots; this should not happen for a density "
                              "on (0, inf)")
    roots = torch.tensor(np.sort(roots.real), dtype=torch.float64)
    return {"loss": float(exact), "exact": exact, "coefficients": coefficients, "roots": roots,
            "gd_steps": n / roots}


def _as_layers(*values) -> list[torch.Tensor]:
    tensors = [torch.as_tensor(value, dtype=torch.float64) for value in values]
    shape = tensors[0].shape
    if len(shape) != 1 or any(t.shape != shape for t in tensors):
        raise ValueError(f"w_xx, w_yx, alpha and gamma must be (L,) tensors of one length; got shapes "
                         f"{[tuple(t.shape) for t in tensors]}")
    return tensors


def gdpp_memformer_residuals(eigenvalues, w_xx, w_yx, alpha, gamma, n: int = 20) -> torch.Tensor:
    """What a GD++ Memformer leaves of ``w`` along an eigen-direction of ``X^T X``, after every layer.

    Layer ``l`` has ``P_l = diag(p_x I, p_y)``, ``Q_l = diag(q_x I, 0)``, ``w_xx = p_x q_x``, ``w_yx = p_y q_x``
    (chapter 4's names), and the CGD-like register (Dutta et al. 2024, eq. 3.2):
    ``R_l = Attn_l(Z_l) + gamma_l R_{l-1}``, ``Z_{l+1} = Z_l + alpha_l R_l``.  Along an eigen-direction with
    eigenvalue ``s`` every input is ``m`` times what it was and every label slot's error ``e`` times ``w``'s
    component (both start at 1); the current Gram eigenvalue is ``m^2 s`` and attention adds
    ``w_xx m^2 s m / n`` to ``m`` and ``w_yx m^2 s e / n`` to ``e``.  Returns ``e`` after each layer:
    ``(L, *eigenvalues.shape)``, differentiable in the weights.  Tasks' loss after layer ``l``:
    ``1/2 sum_k e_l(s_k)^2 (u_k^T w)^2``.
    """
    s = torch.as_tensor(eigenvalues, dtype=torch.float64)
    w_xx, w_yx, alpha, gamma = _as_layers(w_xx, w_yx, alpha, gamma)
    inputs, errors = torch.ones_like(s), torch.ones_like(s)
    register_inputs, register_errors = torch.zeros_like(s), torch.zeros_like(s)
    out = []
    for layer in range(len(w_xx)):
        gram = inputs * inputs * s / n
        register_inputs = w_xx[layer] * gram * inputs + gamma[layer] * register_inputs
        register_errors = w_yx[layer] * gram * errors + gamma[layer] * register_errors
        inputs = inputs + alpha[layer] * register_inputs
        errors = errors + alpha[layer] * register_errors
        out.append(errors)
    return torch.stack(out)


def gdpp_memformer_loss(w_xx, w_yx, alpha, gamma, d: int = 5, n: int = 20) -> torch.Tensor:
    """The exact expected loss after every layer, (L,), of :func:`gdpp_memformer_residuals` on noiseless
    isotropic tasks: ``(d/2) E[e_l(s)^2]`` with the Gauss rule of enough nodes for the residual's degree
    ``(3^l - 1) / 2`` (up to 5 layers: 6 need more nodes than :data:`MAX_NODES`)."""
    layers = len(_as_layers(w_xx, w_yx, alpha, gamma)[0])
    needed = (3**layers + 1) // 2           # degree of e^2 is 3^L - 1 < 2 * needed
    if needed > MAX_NODES:
        raise ValueError(f"{layers} layers give a residual of degree {(3**layers - 1) // 2}, whose square needs "
                         f"{needed} Gauss nodes; at most {MAX_NODES} are available (up to 5 layers)")
    nodes, weights = gauss_rule(d, n, max(needed, 8))
    residuals = gdpp_memformer_residuals(nodes, w_xx, w_yx, alpha, gamma, n)
    return d / 2 * (residuals**2 * weights).sum(-1)


def loss_density(s, w_xx, w_yx, alpha, gamma, d: int = 5, n: int = 20) -> torch.Tensor:
    """``(d/2) e_L(s)^2 rho(s)``: the expected loss after the last layer of a GD++ Memformer, spread over the
    eigenvalue ``s`` (its integral is :func:`gdpp_memformer_loss`'s last entry).  Shapes: ``s`` any -> the same."""
    residual = gdpp_memformer_residuals(s, w_xx, w_yx, alpha, gamma, n)[-1]
    return d / 2 * residual**2 * density(s, d, n)


def fit_gdpp_memformer(num_layers: int, d: int = 5, n: int = 20, restarts: int = 8, seed: int = 0,
                       starts: Optional[list] = None, hops: int = 0, max_iterations: int = 3000) -> dict:
    """Minimise the exact expected loss of a ``num_layers`` GD++ Memformer (:func:`gdpp_memformer_loss`).

    L-BFGS (strong Wolfe line search, float64) on ``w_xx, w_yx, gamma`` with ``alpha = 1`` (a scale ``alpha``
    can be moved into the other three), from ``restarts`` random starts and the given ``starts`` (each a dict
    of ``w_xx, w_yx, gamma``); keeps the lowest.  The loss has many local minima from 4 layers on, so ``hops``
    rounds of basin hopping follow: six starts around the best so far, each weight times ``1 + 0.3 N(0, 1)``.
    Returns ``{"w_xx", "w_yx", "alpha", "gamma"}`` (each (L,)),
    ``"losses"`` (L,), ``"loss"``, ``"gradient"`` (largest entry of the gradient at the end) and
    ``"hessian_eigenvalues"`` (of the loss in the weights that change it: all but ``gamma_1``, which meets an empty
    register, and the last layer's ``w_xx``, which moves the inputs after the answer is read).
    """
    check_count(num_layers, "num_layers")
    generator = make_generator(seed)
    candidates = list(starts or [])
    for _ in range(restarts):
        candidates.append({"w_xx": -torch.rand(num_layers, generator=generator, dtype=torch.float64) * n / 20,
                           "w_yx": -torch.rand(num_layers, generator=generator, dtype=torch.float64) * n / 10,
                           "gamma": torch.randn(num_layers, generator=generator, dtype=torch.float64) / 10})
    alpha = torch.ones(num_layers, dtype=torch.float64)

    def final(w_xx, w_yx, gamma):
        return gdpp_memformer_loss(w_xx, w_yx, alpha, gamma, d, n)[-1]

    best = None

    def descend(start):
        # L-BFGS steps on w_xx / n and w_yx / n, the numbers that multiply a Gram eigenvalue (about n): in those
        # units its first steps have the size of the weights' own scale, and far more starts end in low basins
        scaled = [torch.as_tensor(start[name], dtype=torch.float64).clone() / scale
                  for name, scale in (("w_xx", n), ("w_yx", n), ("gamma", 1))]
        scaled = [value.requires_grad_(True) for value in scaled]
        optimizer = torch.optim.LBFGS(scaled, lr=1, max_iter=max_iterations, tolerance_grad=1e-30,
                                      tolerance_change=1e-40, history_size=100, line_search_fn="strong_wolfe")

        def closure():
            optimizer.zero_grad()
            loss = final(scaled[0] * n, scaled[1] * n, scaled[2])
            loss.backward()
            return loss

        try:
            optimizer.step(closure)
        except RuntimeError:   # a start that overflows to NaN in the line search: skip it
            return None
        weights = [scaled[0].detach() * n, scaled[1].detach() * n, scaled[2].detach().clone()]
        loss = final(*weights).item()
        return (loss, weights) if math.isfinite(loss) else None

    for start in candidates:
        found = descend(start)
        if found is not None and (best is None or found[0] < best[0]):
            best = found
    for _ in range(hops if best is not None else 0):
        for _ in range(6):
            start = {name: value * (1 + 0.3 * torch.randn(value.shape, generator=generator, dtype=torch.float64))
                     for name, value in zip(("w_xx", "w_yx", "gamma"), best[1])}
            found = descend(start)
            if found is not None and found[0] < best[0]:
                best = found
    if best is None:
        raise RuntimeError("no start reached a finite loss; give starts closer to a working model")
    w_xx, w_yx, gamma = best[1]
    return {"w_xx": w_xx, "w_yx": w_yx, "alpha": alpha, "gamma": gamma,
            "losses": gdpp_memformer_loss(w_xx, w_yx, alpha, gamma, d, n), "loss": best[0],
            **minimum_check(w_xx, w_yx, alpha, gamma, d, n)}


def minimum_check(w_xx, w_yx, alpha, gamma, d: int = 5, n: int = 20) -> dict:
    """Is a GD++ Memformer at a minimum of its exact expected loss after the last layer?  ``{"gradient": the
    largest entry of the gradient, "hessian_eigenvalues": those of the Hessian}``, both in the weights that change
    that loss: all but ``gamma_1``, which meets an empty register, and the last layer's ``w_xx``, which moves the
    inputs after the answer is read (``alpha`` stays fixed: a scale the others absorb).  A strict local minimum has a
    vanishing gradient and positive eigenvalues."""
    w_xx, w_yx, alpha, gamma = _as_layers(w_xx, w_yx, alpha, gamma)
    L = len(w_xx)
    free = torch.cat([w_xx[:-1], w_yx, gamma[1:]])

    def of_free(vector):
        return gdpp_memformer_loss(torch.cat([vector[:L - 1], w_xx[-1:]]), vector[L - 1:2 * L - 1], alpha,
                                   torch.cat([gamma[:1], vector[2 * L - 1:]]), d, n)[-1]

    point = free.clone().requires_grad_(True)
    gradient = torch.autograd.grad(of_free(point), point)[0]
    hessian = torch.autograd.functional.hessian(of_free, free)
    return {"gradient": gradient.abs().max().item(), "hessian_eigenvalues": torch.linalg.eigvalsh(hessian)}


def gdpp_memformer(w_xx, w_yx, alpha, gamma, d: int = 5, n: int = 20, num_heads: int = 1) -> Memformer:
    """A :class:`~icl_course.memformer.Memformer` (``attention="full"``, ``memory="cgd"``, float64) that computes
    the GD++ Memformer of these weights: ``P_l = diag(w_xx I, w_yx)``, ``Q_l = diag(I, 0)`` in its first head
    (the others, if any, zero)."""
    w_xx, w_yx, alpha, gamma = _as_layers(w_xx, w_yx, alpha, gamma)
    model = Memformer(d, n, num_layers=len(w_xx), num_heads=num_heads, attention="full", memory="cgd",
                      dtype="float64")
    with torch.no_grad():
        model.P.zero_()
        model.Q.zero_()
        model.P[:, 0, :d, :d] = w_xx[:, None, None] * torch.eye(d, dtype=torch.float64)
        model.P[:, 0, d, d] = w_yx
        model.Q[:, 0, :d, :d] = torch.eye(d, dtype=torch.float64)
        model.alpha.copy_(alpha)
        model.gamma.copy_(gamma)
    return model


def _invariant_blocks(matrix: torch.Tensor, d: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per head, the mean diagonal of the input block and the label corner of ``P`` or ``Q`` (..., d+1, d+1): the
    two numbers that rotations of white inputs leave of the matrix."""
    return matrix[..., :d, :d].diagonal(dim1=-2, dim2=-1).mean(-1), matrix[..., d, d]


def _with_blocks(inputs: torch.Tensor, label: torch.Tensor, d: int) -> torch.Tensor:
    """``diag(inputs I, label)``, per head: (..., d+1, d+1)."""
    matrix = torch.zeros(*inputs.shape, d + 1, d + 1, dtype=inputs.dtype, device=inputs.device)
    matrix[..., :d, :d] = inputs[..., None, None] * torch.eye(d, dtype=inputs.dtype, device=inputs.device)
    matrix[..., d, d] = label
    return matrix


def invariant_part(model: Memformer) -> Memformer:
    """The part of a full-attention Memformer that rotations of the white inputs leave alone: in every head,
    ``P = diag(p_x I, p_y)`` and ``Q = diag(q_x I, q_y)`` with ``p_x, q_x`` the mean diagonal of the input blocks and
    ``p_y, q_y`` the label corners; the memory is kept.  Unlike :func:`gdpp_part` it keeps ``q_y`` (the label energy's
    weights ``w_xy = p_x q_y`` and ``w_yy = p_y q_y``).  Pass a model whose inputs are white."""
    if not isinstance(model, Memformer) or model.attention != "full":
        raise ValueError("invariant_part reads a Memformer with attention='full'")
    d = model.d
    part = copy.deepcopy(model)
    with torch.no_grad():
        for matrix in (part.P, part.Q):
            matrix.copy_(_with_blocks(*_invariant_blocks(matrix, d), d))
    return part


def gdpp_part(model: Memformer) -> dict:
    """The GD++ Memformer inside a full-attention CGD-like Memformer, and what it leaves out.

    In coordinates where the inputs are white, symmetry under rotations of the inputs leaves each head one
    ``p_x I`` and one ``q_x I`` in its input blocks and ``p_y`` in the label corner; ``w_xx = sum_k p_x q_x`` and
    ``w_yx = sum_k p_y q_x`` (``p_x, q_x`` the mean diagonal of each head's input block).  Returns those
    weights with ``alpha`` and ``gamma`` (each (L,)), and ``"rest"``: per layer, the Frobenius norm of
    ``sum_k P_k (.) Q_k`` minus its GD++ part over its own norm, with ``(.)`` the Kronecker product (the layer as
    a map of the Gram matrix), so 0 for a model that is a GD++ Memformer.  Pass a model whose inputs are white
    (:func:`~icl_course.memformer.change_coordinates` with ``C^-1``).
    """
    if not isinstance(model, Memformer) or model.attention != "full" or model.memory != "cgd":
        raise ValueError("gdpp_part reads a Memformer with attention='full' and memory='cgd'")
    d = model.d
    P, Q = (weight.detach().to(torch.float64) for weight in model.attention_matrices())    # (L, H, D, D)
    (p_x, p_y), (q_x, _) = _invariant_blocks(P, d), _invariant_blocks(Q, d)
    symmetric_P, symmetric_Q = _with_blocks(p_x, p_y, d), _with_blocks(q_x, torch.zeros_like(q_x), d)

    def operator(first, second):   # sum_k P_k (x) Q_k: G -> sum_k P_k G Q_k as a tensor, (L, D, D, D, D)
        return torch.einsum("lhij,lhkm->lijkm", first, second)

    whole, part = operator(P, Q), operator(symmetric_P, symmetric_Q)
    rest = (whole - part).flatten(1).norm(dim=-1) / whole.flatten(1).norm(dim=-1)
    return {"w_xx": (p_x * q_x).sum(-1), "w_yx": (p_y * q_x).sum(-1),
            "alpha": model.alpha.detach().to(torch.float64).clone(),
            "gamma": model.gamma.detach().to(torch.float64).clone(), "rest": rest}


# -- the shipped optima of chapter 5 ---------------------------------------------------------------

PRETRAINED = Path(__file__).resolve().parent / "pretrained" / "ch5_gdpp_memformer.json"
#: random starts and rounds of basin hopping per depth of :func:`make_optima` (each depth also starts from the
#: shallower optimum, deepened)
RESTARTS = {1: 4, 2: 8, 3: 24, 4: 150, 5: 40}
HOPS = {1: 0, 2: 0, 3: 2, 4: 10, 5: 4}


def deepened(fit: dict) -> list[dict]:
    """Starts one layer deeper than ``fit``: a layer that does nothing (``w_xx = w_yx = gamma = 0``) inserted at
    every position."""
    starts = []
    for position in range(len(fit["w_xx"]) + 1):
        starts.append({name: torch.cat([fit[name][:position], torch.zeros(1, dtype=torch.float64),
                                        fit[name][position:]]) for name in ("w_xx", "w_yx", "gamma")})
    return starts


def make_optima(depths=(1, 2, 3, 4), restarts: Optional[dict] = None, path=PRETRAINED) -> dict:
    """Fit the GD++ Memformer of every depth (:func:`fit_gdpp_memformer`, from :data:`RESTARTS` random starts and
    the shallower fit deepened) and write the weights, exact losses and the checks of a minimum to ``path``."""
    restarts = restarts or RESTARTS
    out = {"about": "chapter 5: the GD++ Memformer (CGD-like register, P = diag(w_xx I, w_yx), Q = diag(I, 0)) "
                    "that minimises the exact expected loss on noiseless isotropic tasks, d = 5, n = 20",
           "command": "python -m icl_course.spectra" + (f" --out {path}" if Path(path) != PRETRAINED else ""),
           "restarts": {str(depth): restarts[depth] for depth in depths},
           "hops": {str(depth): HOPS[depth] for depth in depths}, "depths": {}}
    begin, previous = time.perf_counter(), None
    for depth in depths:
        started = time.perf_counter()
        fit = fit_gdpp_memformer(depth, restarts=restarts[depth], seed=depth, hops=HOPS[depth],
                                 starts=deepened(previous) if previous is not None else None)
        out["depths"][str(depth)] = {
            **{name: fit[name].tolist() for name in ("w_xx", "w_yx", "alpha", "gamma")},
            "losses": fit["losses"].tolist(), "loss": fit["loss"], "gradient": fit["gradient"],
            "hessian_eigenvalues": fit["hessian_eigenvalues"].tolist(), "seconds": time.perf_counter() - started}
        print(f"{depth} layers: exact loss {fit['loss']:.6g}, gradient {fit['gradient']:.1e}, smallest Hessian "
              f"eigenvalue {fit['hessian_eigenvalues'].min():.2e} ({time.perf_counter() - started:.0f} s)",
              flush=True)
        previous = {name: fit[name] for name in ("w_xx", "w_yx", "gamma")}
    out["seconds"] = time.perf_counter() - begin
    Path(path).write_text(json.dumps(out, indent=1) + "\n")
    return out


def load_optima(path=PRETRAINED) -> dict:
    """The shipped fits of :func:`make_optima`: ``{depth: {"w_xx", "w_yx", "alpha", "gamma": (L,) float64 tensors,
    "loss", "gradient", "hessian_eigenvalues", "seconds"}}``, plus ``"command"`` and ``"seconds"``."""
    try:
        raw = json.loads(Path(path).read_text())
        fits = {int(depth): {key: torch.tensor(value, dtype=torch.float64) if isinstance(value, list) else value
                             for key, value in fit.items()} for depth, fit in raw["depths"].items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as error:
        raise ValueError(f"{path}: not a file of GD++ Memformer fits ({error}); remake it with "
                         f"`python -m icl_course.spectra`") from None
    return {**fits, "command": raw.get("command", ""), "seconds": raw.get("seconds", float("nan"))}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description="Fit chapter 5's GD++ Memformers on their exact expected loss "
                                                 "(about 25 minutes on one CPU core for depths 1-4) and write them "
                                                 "to the package.")
    parser.add_argument("--depths", type=int, nargs="+", default=[1, 2, 3, 4], help="consecutive, from 1")
    parser.add_argument("--out", type=Path, default=PRETRAINED)
    args = parser.parse_args(argv)
    if args.depths != list(range(1, len(args.depths) + 1)) or len(args.depths) > 5:
        parser.error("--depths must run 1, 2, ... up to at most 5 (each depth starts from the one before)")
    make_optima(tuple(args.depths), RESTARTS, args.out)


if __name__ == "__main__":
    main()
