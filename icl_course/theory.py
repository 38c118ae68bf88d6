"""The course's closed forms, as functions a notebook can assert against.

Chapters add to this module; each function names the paper and equation it makes
executable.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .data import NoiseLike, as_noise, check_context, context_gram
from .models import next_gram

__all__ = ["optimal_one_step_coefficient", "one_step_loss", "optimal_preconditioner",
           "preconditioned_one_step_loss", "one_layer_bilinear_form", "ImplicitLinearModel",
           "implicit_model_step", "implicit_linear_model", "gdpp_spectrum", "gdpp_residual", "condition_number",
           "gdpp_layers_needed", "gdpp_one_layer_condition", "gdpp_best_one_layer_scale",
           "two_noise_construction", "adaptive_step_size", "best_linear_cosine"]


def _second_moment(noise: NoiseLike, second_moment: float | None) -> float:
    """``E[sigma^2]`` from a noise law or given directly (never both: which would win is a guess)."""
    if second_moment is None:
        return as_noise(noise).second_moment
    if not (isinstance(noise, (int, float)) and noise == 0):
        raise ValueError("give the noise law or its second_moment, not both")
    if not isinstance(second_moment, (int, float)) or isinstance(second_moment, bool) or second_moment < 0:
        raise ValueError(f"second_moment is E[sigma^2], a number >= 0; got {second_moment!r}")
    return float(second_moment)


def optimal_one_step_coefficient(d: int, n: int, noise: NoiseLike = 0.0, *,
                                 second_moment: float | None = None) -> float:
    """The best ``c`` in the one-layer prediction ``y_hat = c <alpha, x_t>``.

    For ``x ~ N(0, I_d)``, ``w ~ N(0, I_d)`` and noise with ``E[sigma^2] = s2`` the loss
    ``1/2 E||c alpha - w||^2`` uses ``E<alpha, w> = n d`` and
    ``E||alpha||^2 = n d (n + d + 1) + n d s2`` (Wishart second moment), so

        c* = 1 / (n + d + 1 + E[sigma^2]).

    In GD terms ``c = eta / n``: the noiseless optimum is ``eta* = n / (n + d + 1)``
    (Mahankali, Hashimoto, Ma 2023; chapter 2).  ``noise`` is a sigma or a noise law; or pass
    ``second_moment=E[sigma^2]`` directly.
    """
    return 1.0 / (n + d + 1 + _second_moment(noise, second_moment))


def one_step_loss(d: int, n: int, noise: NoiseLike = 0.0, coefficient: float | None = None, *,
                  second_moment: float | None = None) -> float:
    """``1/2 E[(c <alpha, x_t> - y_t)^2]`` in closed form (``c`` defaults to the optimum).

    ``= d/2 * (1 - 2 c n + c^2 n (n + d + 1 + E[sigma^2]))``; at ``c*`` this is
    ``d/2 * (1 - n / (n + d + 1 + E[sigma^2]))``: the one-layer row of Table 1 before the
    oracle's loss is subtracted.  ``second_moment=E[sigma^2]`` may replace ``noise``.
    """
    second_moment = _second_moment(noise, second_moment)
    if coefficient is None:
        coefficient = optimal_one_step_coefficient(d, n, second_moment=second_moment)
    c = coefficient
    return 0.5 * d * (1 - 2 * c * n + c**2 * n * (n + d + 1 + second_moment))


def _covariance(covariance) -> torch.Tensor:
    S = torch.as_tensor(covariance, dtype=torch.float64)
    if S.dim() != 2 or S.shape[0] != S.shape[1]:
        raise ValueError(f"covariance must be a square (d, d) matrix, got shape {tuple(S.shape)}")
    return S


def optimal_preconditioner(covariance, n: int, noise: NoiseLike = 0.0, weights: str = "identity", *,
                           second_moment: float | None = None) -> torch.Tensor:
    """The best ``B`` in ``y_hat = <B alpha, x_t>`` when ``x ~ N(0, S)`` (chapter 2).

    With ``W = X^T X`` Wishart, ``E[W M W] = n^2 S M S + n S M^T S + n tr(M S) S`` (Isserlis), and
    minimising the quadratic loss in ``B`` gives, with ``s2 = E[sigma^2]``:

    * ``weights="inverse"``, ``w ~ N(0, S^-1)``: ``B* = S^-1 / (n + d + 1 + s2)``, a multiple of ``S^-1``
      (Mahankali, Hashimoto, Ma 2023, last section; the problem is isotropic in whitened coordinates);
    * ``weights="identity"``, ``w ~ N(0, I)``: ``B* = ((n + 1) S + (tr S + s2) I)^-1``, which is *not*
      a multiple of ``S^-1`` unless ``S`` is.

    ``second_moment=E[sigma^2]`` may replace ``noise``.  Shapes: ``covariance`` (d, d) -> (d, d), float64.
    """
    S = _covariance(covariance)
    d = S.shape[0]
    second_moment = _second_moment(noise, second_moment)
    if weights == "inverse":
        return torch.linalg.inv(S) / (n + d + 1 + second_moment)
    if weights == "identity":
        return torch.linalg.inv((n + 1) * S + (torch.trace(S) + second_moment) * torch.eye(d, dtype=S.dtype))
    raise ValueError(f"weights must be 'identity' (w ~ N(0, I)) or 'inverse' (w ~ N(0, S^-1)), got {weights!r}")


def preconditioned_one_step_loss(preconditioner, covariance, n: int, noise: NoiseLike = 0.0,
                                 weights: str = "identity", *, second_moment: float | None = None) -> float:
    """``1/2 E[(<B alpha, x_t> - y_t)^2]`` in closed form for ``x ~ N(0, S)`` (see above).

    With ``C = E[w w^T]`` (``I`` or ``S^-1``) and ``M = B^T S B``:
    ``2 L = n^2 tr(S M S C) + n tr(S M S C) + n tr(M S) tr(S C) - 2 n tr(S B S C) + tr(S C) + s2 n tr(M S)``.
    ``second_moment=E[sigma^2]`` may replace ``noise``.  Shapes: ``preconditioner`` (d, d), ``covariance`` (d, d).
    """
    S = _covariance(covariance)
    B = torch.as_tensor(preconditioner, dtype=torch.float64)
    if weights not in ("identity", "inverse"):
        raise ValueError(f"weights must be 'identity' or 'inverse', got {weights!r}")
    C = torch.eye(S.shape[0], dtype=S.dtype) if weights == "identity" else torch.linalg.inv(S)
    M = B.T @ S @ B
    second_moment = _second_moment(noise, second_moment)
    twice = ((n * n + n) * torch.trace(S @ M @ S @ C) + n * torch.trace(M @ S) * torch.trace(S @ C)
             - 2 * n * torch.trace(S @ B @ S @ C) + torch.trace(S @ C) + second_moment * n * torch.trace(M @ S))
    return 0.5 * float(twice)


def one_layer_bilinear_form(layer) -> dict:
    """Read a one-layer model's prediction as forms of the context (chapter 2).

    The query's new last coordinate is ``sum_k (P_k G Q_k)[d, :d] x_t``, and with
    ``G = [[Sigma, alpha], [alpha^T, lambda]]`` the prediction ``y_hat = -(...)`` is

        y_hat = <B alpha, x_t> + sum_{a,b} Sigma_ab <K_ab, x_t> + lambda <v, x_t>,

    returned as ``{"B": (d, d), "Sigma_terms": (d, d, d) K, "label_energy_term": (d,) v}``.
    GD is ``B = c I`` with the other two zero.
    """
    P, Q = layer.head_matrices()
    P, Q = P.detach().double(), Q.detach().double()
    d = P.shape[-1] - 1
    p_x, p_y = P[:, d, :d], P[:, d, d]            # (H, d), (H,)
    Q_xx, q_yx = Q[:, :d, :d], Q[:, d, :d]        # (H, d, d), (H, d)
    # y_hat = -[(p_x^T Sigma + p_y alpha^T) Q_xx + (p_x^T alpha + p_y lambda) q_yx^T] x_t
    B = -(torch.einsum("h,hji->ij", p_y, Q_xx) + torch.einsum("hi,hj->ij", q_yx, p_x))
    sigma_terms = -torch.einsum("ha,hbj->abj", p_x, Q_xx)
    label_energy_term = -torch.einsum("h,hj->j", p_y, q_yx)
    return {"B": B, "Sigma_terms": sigma_terms, "label_energy_term": label_energy_term}


@dataclass
class ImplicitLinearModel:
    """Every layer's implicit linear model (Vladymyrov et al. 2024, Theorem 4.1 and Lemma 4.3).

    After layer ``l`` every context token is ``x_i^l = M x_i + y_i u`` and ``y_i^l = a y_i - <w, x_i>``,
    and the query is ``x_t^l = M x_t``, ``y_t^l = -<w, x_t>``: the prediction is ``<w^L, x_t>``.

    Attributes (B tasks, L layers): ``M`` (B, L, d, d), ``u`` (B, L, d), ``a`` (B, L), ``w`` (B, L, d).
    """

    M: torch.Tensor
    u: torch.Tensor
    a: torch.Tensor
    w: torch.Tensor


def implicit_model_step(M: torch.Tensor, u: torch.Tensor, a: torch.Tensor, w: torch.Tensor,
                        mixing: torch.Tensor) -> tuple:
    """One layer of the recursion of Theorem 4.1 (Vladymyrov et al. 2024); see :func:`implicit_linear_model`.

    With ``mixing = T = [[T_xx, t_xy], [t_yx^T, t_yy]]`` (the paper's blocks ``A, b, c, d``), all four
    updated from the old values: ``M <- (I + T_xx) M - t_xy w^T``, ``u <- (I + T_xx) u + a t_xy``,
    ``a <- (1 + t_yy) a + <t_yx, u>``, ``w <- (1 + t_yy) w - M^T t_yx``.
    Shapes: ``M`` (B, d, d), ``u`` (B, d), ``a`` (B,), ``w`` (B, d), ``mixing`` (B, d+1, d+1) ->
    the new ``(M, u, a, w)`` with the same shapes.
    """
    d = M.shape[-1]
    T_xx, t_xy, t_yx, t_yy = mixing[..., :d, :d], mixing[..., :d, d], mixing[..., d, :d], mixing[..., d, d]
    return (M + T_xx @ M - t_xy.unsqueeze(-1) * w.unsqueeze(-2),
            u + (T_xx @ u.unsqueeze(-1)).squeeze(-1) + a.unsqueeze(-1) * t_xy,
            (1 + t_yy) * a + (t_yx * u).sum(-1),
            (1 + t_yy).unsqueeze(-1) * w - (M.transpose(-1, -2) @ t_yx.unsqueeze(-1)).squeeze(-1))


def implicit_linear_model(model, X: torch.Tensor, y: torch.Tensor) -> ImplicitLinearModel:
    """Run the recursion of Theorem 4.1 (Vladymyrov et al. 2024) through every layer of ``model``.

    With ``T^l = sum_k P_k G^l Q_k = [[T_xx, t_xy], [t_yx^T, t_yy]]`` for the layer's context Gram
    matrix ``G^l`` (the paper names the blocks ``A, b, c, d``), all four are updated from their old
    values (:func:`implicit_model_step`):

        M <- (I + T_xx) M - t_xy w^T,    u <- (I + T_xx) u + a t_xy,
        a <- (1 + t_yy) a + <t_yx, u>,    w <- (1 + t_yy) w - M^T t_yx,

    from ``M = I, u = 0, a = 1, w = 0``.  Expanding
    ``x' = (I + T_xx)(M x + y u) + t_xy (a y - <w, x>)`` gives the minus sign in the ``M`` update;
    the paper prints ``+ b w^T``, a misprint.

    Shapes: ``X`` (B, n, d), ``y`` (B, n) -> :class:`ImplicitLinearModel`.  Works for every
    parameterisation and number of heads, since it only needs each layer's ``mixing``.
    """
    if X.dim() != 3 or y.shape != X.shape[:2] or X.shape[2] != model.d:
        raise ValueError(f"expected X (B, n, {model.d}) and y (B, n); got {tuple(X.shape)} and {tuple(y.shape)}")
    X, y = X.to(model.dtype), y.to(model.dtype)
    batch_size, d = X.shape[0], model.d
    gram = context_gram(X, y)
    state = (torch.eye(d, dtype=X.dtype, device=X.device).expand(batch_size, d, d), X.new_zeros(batch_size, d),
             X.new_ones(batch_size), X.new_zeros(batch_size, d))
    history = []
    for layer in model.layers:
        mixing = layer.mixing(gram)
        state = implicit_model_step(*state, mixing)
        history.append(state)
        gram = next_gram(gram, mixing)
    M, u, a, w = (torch.stack(values, dim=1) for values in zip(*history))
    return ImplicitLinearModel(M=M, u=u, a=a, w=w)


def gdpp_spectrum(eigenvalues: torch.Tensor, num_layers: int, gamma=None, gamma_scale: float = 1.0) -> torch.Tensor:
    """The eigenvalues of ``Sigma^l`` through ``num_layers`` GD++ layers (Vladymyrov et al. 2024, section 5.1).

    A GD++ layer moves every ``x_i`` by ``I - gamma Sigma`` (``gamma = -w_xx``), so
    ``Sigma <- (I - gamma Sigma) Sigma (I - gamma Sigma)`` and each eigenvalue maps to
    ``lambda (1 - gamma lambda)^2``.  ``gamma=None`` uses ``gamma_scale / (3 lambda_max)`` of the
    current layer (``gamma_scale = 1`` is Theorem 5.1's choice); a number uses it at every layer.
    Shapes: ``eigenvalues`` (..., d) -> (..., num_layers + 1, d), the input first.
    """
    values = torch.as_tensor(eigenvalues)
    if isinstance(num_layers, bool) or not isinstance(num_layers, int) or num_layers < 0:
        raise ValueError(f"num_layers must be an integer >= 0, got {num_layers!r}")
    history = [values]
    for _ in range(num_layers):
        step = gamma_scale / (3 * values.max(-1, keepdim=True).values) if gamma is None else gamma
        values = values * (1 - step * values) ** 2
        history.append(values)
    return torch.stack(history, dim=-2)


def gdpp_residual(eigenvalues: torch.Tensor, w_xx, w_yx) -> torch.Tensor:
    """What a GD++ model leaves of ``w`` on a noiseless task, one eigen-direction of ``X^T X`` at a time
    (Vladymyrov et al. 2024, section 5.1).

    With ``q_y = 0`` a GD++ layer never lets the labels move the inputs, so on noiseless tasks (``y = X w``) its
    implicit weights are a function of the Gram matrix applied to the task's weights: ``w^L = F(X^T X) w``, and
    in the eigenbasis ``u_k`` of ``X^T X`` the error is ``w^L - w = -sum_k r(lambda_k) (u_k^T w) u_k`` with
    ``r = 1 - F``, so a task's loss is ``1/2 sum_k r(lambda_k)^2 (u_k^T w)^2`` and, ``w ~ N(0, I)``, its mean
    over ``w`` is ``1/2 sum_k r(lambda_k)^2``.  Along one direction, with ``s_0 = lambda`` and ``a_0 = lambda``
    (``X^T y`` there, for a unit weight) and ``m_0 = 1`` (what the query's input has been multiplied by), layer
    ``l`` does

        ``r <- r + w_yx^l a_l m_l``,  ``s_{l+1} = (1 + w_xx^l s_l)^2 s_l``,
        ``a_{l+1} = (1 + w_xx^l s_l)(1 + w_yx^l s_l) a_l``,  ``m_{l+1} = (1 + w_xx^l s_l) m_l``,

    from ``r = 1``: a polynomial in ``lambda`` of degree up to ``3^L``.  ``w_xx`` and ``w_yx`` are the layers'
    weights of :meth:`~icl_course.models.LinearSelfAttention.diagonal_weights` (``gamma = -w_xx`` of
    :func:`gdpp_spectrum`).  Shapes: ``eigenvalues`` (...), ``w_xx`` and ``w_yx`` (L,) -> ``r`` (...);
    differentiable in all three.
    """
    values = torch.as_tensor(eigenvalues)
    w_xx, w_yx = torch.as_tensor(w_xx, dtype=values.dtype), torch.as_tensor(w_yx, dtype=values.dtype)
    if w_xx.dim() != 1 or w_xx.shape != w_yx.shape:
        raise ValueError(f"w_xx and w_yx must be two (L,) tensors of the same length, got shapes "
                         f"{tuple(w_xx.shape)} and {tuple(w_yx.shape)}")
    s, a, moved, residual = values, values, torch.ones_like(values), torch.ones_like(values)
    for xx, yx in zip(w_xx, w_yx):
        residual = residual + yx * a * moved
        factor = 1 + xx * s
        s, a, moved = factor**2 * s, factor * (1 + yx * s) * a, factor * moved
    return residual


def condition_number(eigenvalues: torch.Tensor) -> torch.Tensor:
    """``lambda_max / lambda_min``.  Shapes: (..., d) -> (...)."""
    values = torch.as_tensor(eigenvalues)
    return values.max(-1).values / values.min(-1).values


def gdpp_layers_needed(kappa: float, eps: float) -> int:
    """GD++ layers (``gamma = 1/(3 lambda_max)``) until the condition number is at most ``1 + eps``,
    plus the final GD step (Theorem 5.1, Vladymyrov et al. 2024).

    The map is increasing on ``[0, lambda_max]``, so the extreme eigenvalues stay extreme and the
    spectrum ``{1, kappa}`` stands for every spectrum with that condition number.  This counts to
    ``1 + eps``; the theorem's proof runs on to ``1 + eps / (2 kappa)`` so that its guarantee holds
    in the original coordinates.  After the layers, one GD step with the best constant step
    ``2 / (lambda_min + lambda_max)`` leaves a relative error of at most ``(kappa' - 1) / (kappa' + 1)``
    in every eigendirection, so ``gdpp_layers_needed(kappa, 2 e / (1 - e))`` layers reach relative
    error ``e`` in ``w``.
    """
    if not kappa >= 1 or not 0 < eps:
        raise ValueError(f"need kappa >= 1 and eps > 0, got kappa={kappa}, eps={eps}")
    spectrum = torch.tensor([1.0, float(kappa)], dtype=torch.float64)
    layers = 0
    while condition_number(spectrum) - 1 > eps:
        spectrum = gdpp_spectrum(spectrum, 1)[1]
        layers += 1
    return layers + 1


def gdpp_one_layer_condition(kappa: float, gamma_scale: float) -> float:
    """The condition number after one GD++ layer with ``gamma = gamma_scale / (3 lambda_max)`` when
    the eigenvalues fill ``[1, kappa]`` (an upper bound for any spectrum with those extremes).

    ``f(lambda) = lambda (1 - gamma lambda)^2`` rises to its peak ``4 / (27 gamma)`` at
    ``lambda = 1 / (3 gamma) = kappa / gamma_scale`` and falls to zero at ``1 / gamma``.  For
    ``gamma_scale <= 1`` the peak lies beyond ``kappa`` and the new condition number is
    ``f(kappa) / f(1)``; above 1 the peak lies inside and the map folds the spectrum.  The minimum
    is always ``min(f(1), f(kappa))``.  Needs ``0 < gamma_scale < 3`` (at 3, ``f(kappa) = 0``).
    """
    if not kappa >= 1 or not 0 < gamma_scale < 3:
        raise ValueError(f"need kappa >= 1 and 0 < gamma_scale < 3, got kappa={kappa}, gamma_scale={gamma_scale}")
    gamma = gamma_scale / (3 * kappa)
    image = lambda value: value * (1 - gamma * value) ** 2  # noqa: E731
    peak = image(min(kappa, max(1.0, kappa / gamma_scale)))
    return peak / min(image(1.0), image(float(kappa)))


def gdpp_best_one_layer_scale(kappa: float) -> float:
    """The ``gamma_scale`` (``gamma lambda_max = gamma_scale / 3``) that minimises
    :func:`gdpp_one_layer_condition`: ``3 (sqrt(kappa) - 1) / (sqrt(kappa) - 1 / kappa)``.

    Up to ``gamma_scale = 1`` the new condition number falls as the step grows; beyond it the peak
    ``4 kappa / (9 gamma_scale)`` keeps falling while ``f(1) <= f(kappa)``, and the best step is where
    the two ends meet, ``f(1) = f(kappa)``.  It tends to 1 (the theorem's ``1/3``) as ``kappa -> 1``,
    like ``1 + (kappa - 1) / 2``, and to 3 (``gamma lambda_max -> 1``) as ``kappa`` grows.
    """
    if not kappa >= 1:
        raise ValueError(f"need kappa >= 1, got kappa={kappa}")
    root = math.sqrt(kappa)
    if root - 1 < 1e-12:
        return 1.0
    return 3 * (root - 1) / (root - 1 / kappa)


def two_noise_construction(n: int, sigma_1: float, sigma_2: float) -> list[dict]:
    """The two-layer weights of Theorem 5.2 (Vladymyrov et al. 2024) that reach ridge for two noise levels.

    Layer 1 has only ``w_yx`` (a GD step), layer 2 only ``w_yy`` (it rescales every label, the
    query's too, by ``1 + w_yy lambda^1``).  With ``x ~ N(0, I/n)``, ``Sigma -> I`` and
    ``lambda^1 -> n sigma^2`` as ``n`` grows, so the prediction tends to
    ``-(1 + n sigma^2 w_yy) w_yx <alpha, x_t>`` while ridge tends to ``<alpha, x_t> / (1 + sigma^2)``.
    Matching both levels gives two linear equations in ``w_yx`` and ``m = w_yy w_yx``:
    ``-(w_yx + n sigma^2 m) = 1 / (1 + sigma^2)`` for ``sigma = sigma_1, sigma_2`` (the paper drops
    the minus sign that the prediction ``y_hat = -y_t`` carries).
    Returns ``[{"w_yx": ...}, {"w_yy": ...}]`` for :func:`~icl_course.models.diagonal_construction`.
    """
    if sigma_1 == sigma_2:
        raise ValueError("the construction needs two different noise levels")
    target_1, target_2 = 1 / (1 + sigma_1**2), 1 / (1 + sigma_2**2)
    m = (target_2 - target_1) / (n * (sigma_1**2 - sigma_2**2))
    w_yx = -target_1 - n * sigma_1**2 * m
    return [{"w_yx": w_yx}, {"w_yy": m / w_yx}]


def adaptive_step_size(w_xy: float, w_yx: float, X: torch.Tensor, y: torch.Tensor) -> tuple:
    """The step on ``alpha`` of a ``w_xy`` layer followed by a ``w_yx`` layer, exactly and as the paper
    approximates it (Vladymyrov et al. 2024, section 5.3).

    A layer with only ``w_xy`` moves ``x_i <- x_i + w_xy y_i alpha`` (the query's ``x_t`` stays: its
    label slot is 0), so ``alpha^1 = sum_i y_i x_i^1 = (1 + w_xy lambda) alpha`` with the label energy
    ``lambda = sum_i y_i^2``; the ``w_yx`` layer then predicts ``-w_yx (1 + w_xy lambda) <alpha, x_t>``:
    a step that shrinks for noisier tasks.  The paper writes ``1 + w_xy sum_i r_i^2`` with the
    least-squares residuals ``r_i``, which drops the explained energy ``||X w_ols||^2``, so
    ``exact - paper = -w_yx w_xy ||X w_ols||^2`` exactly.
    Shapes: ``X`` (B, n, d), ``y`` (B, n) -> ``(exact, paper)``, each (B,); the paper's needs ``n > d``.
    """
    from .baselines import least_squares

    check_context(X, y)
    energy = (y**2).sum(-1)
    residuals = y - (X @ least_squares(X, y).unsqueeze(-1)).squeeze(-1)
    return -w_yx * (1 + w_xy * energy), -w_yx * (1 + w_xy * (residuals**2).sum(-1))


def best_linear_cosine(X: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """The largest cosine between ``target`` and any vector ``X v``: ``||Pi_X target|| / ||target||``.

    Fed linear labels, every layer's context labels are ``X (a w_* - w)`` (Theorem 4.1), so this
    bounds how well they can correlate with a nonlinear target such as ``x_i(1)^2`` (Theorem 4.2,
    Vladymyrov et al. 2024).  Shapes: ``X`` (B, n, d), ``target`` (B, n) -> (B,).
    """
    if X.dim() != 3 or target.shape != X.shape[:2]:
        raise ValueError(f"expected X (B, n, d) and target (B, n); got {tuple(X.shape)} and {tuple(target.shape)}")
    projection = X @ torch.linalg.lstsq(X, target.unsqueeze(-1)).solution
    return projection.squeeze(-1).norm(dim=-1) / target.norm(dim=-1)
