"""Memformers: linear attention with a memory of past updates (Dutta et al. 2024).

Ahn et al. (2023) write linear attention on the ``(d+1) x (n+1)`` token matrix ``Z`` (context
columns, then the query column ``(x_t, 0)``) as

    Attn(Z) = sum_k P_k Z M Z^T Q_k Z / n,      M = diag(I_n, 0)   (the query is never read).

With ``P = [[0, 0], [0, 1]]`` and ``Q = -[[A^T, 0], [0, 0]]`` a residual layer ``Z <- Z + Attn(Z)``
keeps ``y_i - <w, x_i>`` in the label slot of every context column and ``-<w, x_t>`` in the query's,
and moves ``w`` by one step of preconditioned GD, ``w <- w - A grad R(w)``, on
``R(w) = 1/(2n) sum_i (<w, x_i> - y_i)^2`` (for a symmetric ``A`` this is the paper's
``Q = -[[A, 0], [0, 0]]``).  A Memformer adds a register to the residual stream:

* ``memory="cgd"`` (the CGD-like Memformer): ``R_l = Attn_l(Z_l) + gamma_l R_{l-1}`` and
  ``Z_{l+1} = Z_l + alpha_l R_l``, with scalars ``alpha_l, gamma_l`` shared by all tasks.  With
  ``A_l = I`` this is conjugate gradient's recursion ``p <- -g + beta p``, ``w <- w + a p`` with
  fixed coefficients;
* ``memory="lfom"`` (linear first-order methods): ``R_l = Attn_l(Z_l)`` and
  ``Z_{l+1} = Z_l + sum_{j <= l} Gamma_j^(l) (.) R_j`` with gates of the shape of ``Z``.
  ``tied=True`` is the paper's experiment, ``Gamma_j^(l) = Gamma_j`` for every ``l``, which gives
  ``Z_{l+1} - Z_l = (Z_l - Z_{l-1}) + Gamma_l (.) R_l``: heavy-ball momentum with coefficient 1;
  ``tied="layer"`` is the other reading of the paper's equation, ``Gamma_j^(l) = Gamma_l`` for every ``j <= l``,
  which gives ``Z_{l+1} - Z_l = (Gamma_l / Gamma_{l-1}) (.) (Z_l - Z_{l-1}) + Gamma_l (.) R_l``: a momentum
  coefficient free at every layer; ``tied=False`` learns every ``Gamma_j^(l)``;
* ``memory="none"``: the plain linear transformer ``Z_{l+1} = Z_l + Attn_l(Z_l)``.

Attention per head (``attention=``): ``"identity"`` (``A_l = I``, nothing learned: GD directions),
``"gd"`` (a learned ``A_l`` per head) or ``"full"`` (full ``P_k, Q_k``).  In the GD form the heads
only add up, ``sum_k A_k``, to one preconditioner; full heads are a sum of ``H`` different bilinear
maps of the Gram matrix, which one head cannot write.

Everything runs batched over tasks, and every model returns its implicit linear model ``w^l`` after
each layer (prediction ``<w^l, x_t> = -`` the query's label slot), as
:class:`~icl_course.models.ModelOutput`.  Models with gates or full ``P, Q`` run on the token matrix
(an LFOM gate may treat each column differently, so the columns do not all move by one matrix); the
others run the same recursion on ``w`` itself, which is exact and much cheaper.

The second half of the module is chapter 5's experiment pipeline (Dutta et al.'s data law
:func:`paper_tasks`, many models trained at once by :func:`train_models`, fairly tuned baselines,
the shipped results file); figures and sliders live in :mod:`icl_course.plots` and
:mod:`icl_course.widgets`.
"""

from __future__ import annotations

import copy
import math
import pathlib
import time
from typing import Optional

import torch
from torch import nn
from torch.func import functional_call, stack_module_state, vmap

from .data import (
    STRETCH_FRACTION,
    STRETCH_SCALES,
    RegressionTasks,
    StretchedTasks,
    TaskBatch,
    check_context,
    context_of,
    stretch,
)
from .evaluate import per_layer_loss
from .models import ModelOutput
from .optimizers import conjugate_gradient, gradient_descent, momentum_descent, tune_momentum, tune_step_sizes
from .runtime import available_device, check_count, make_generator, resolve_device, resolve_dtype

__all__ = ["ATTENTIONS", "MEMORIES", "MODELS", "SETTINGS", "BASELINES", "Memformer", "cg_coefficients",
           "momentum_coefficients", "change_coordinates", "rotated_coordinates", "covariance", "paper_tasks",
           "one_layer_optimum", "build", "train_models",
           "tuned_baselines", "small_batch_experiment", "run_experiments", "load_experiments", "load_model",
           "final_losses", "loss_band", "training_lengths", "setting_samplers", "widen_heads", "train_groups",
           "score_groups"]

ATTENTIONS = ("identity", "gd", "full")
MEMORIES = ("none", "cgd", "lfom")


def cg_coefficients(X: torch.Tensor, y: torch.Tensor, num_steps: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Each task's conjugate-gradient step sizes and direction weights, from ``w_0 = 0``.

    CG on ``R(w)``: ``p_0 = -g_0``, ``p_k = -g_k + beta_k p_{k-1}``, ``w_{k+1} = w_k + a_k p_k`` with
    ``a_k = |g_k|^2 / (p_k^T Sigma p_k / n)`` and ``beta_k = |g_k|^2 / |g_{k-1}|^2`` (``beta_0 = 0``).
    Returns ``(a, beta)``, each (B, num_steps): a CGD-like Memformer with ``A_l = I``,
    ``alpha_l = a_{l-1}`` and ``gamma_l = beta_{l-1}`` runs these iterates.  A task whose gradient
    vanishes gets ``a = beta = 0`` from then on.
    """
    check_context(X, y)
    check_count(num_steps, "num_steps")
    n = X.shape[-2]
    Sigma = X.transpose(-1, -2) @ X / n
    gradient = -(X.transpose(-1, -2) @ y.unsqueeze(-1)).squeeze(-1) / n  # at w = 0
    tiny = torch.finfo(X.dtype).tiny
    direction = -gradient
    squared = (gradient * gradient).sum(-1)
    steps, betas = [], [torch.zeros_like(squared)]
    for k in range(num_steps):
        curved = (Sigma @ direction.unsqueeze(-1)).squeeze(-1)
        denominator = (direction * curved).sum(-1)
        step = torch.where(denominator > 0, squared / denominator.clamp_min(tiny), torch.zeros_like(squared))
        steps.append(step)
        gradient = gradient + step.unsqueeze(-1) * curved
        new_squared = (gradient * gradient).sum(-1)
        beta = torch.where(squared > 0, new_squared / squared.clamp_min(tiny), torch.zeros_like(squared))
        if k + 1 < num_steps:
            betas.append(beta)
        direction = -gradient + beta.unsqueeze(-1) * direction
        squared = new_squared
    return torch.stack(steps, dim=-1), torch.stack(betas, dim=-1)


def momentum_coefficients(eta, mu) -> tuple[torch.Tensor, torch.Tensor]:
    """``alpha, gamma`` that make a CGD-like Memformer (``A_l = I``) run heavy-ball momentum.

    Heavy ball: ``w_{l+1} = w_l - eta_l g_l + mu_l (w_l - w_{l-1})``.  The Memformer's register
    is ``R_l = (w_{l+1} - w_l) / alpha_l``, so ``w_{l+1} = w_l - alpha_l g_l
    + (alpha_l gamma_l / alpha_{l-1}) (w_l - w_{l-1})``: ``alpha_l = eta_l`` and
    ``gamma_l = mu_l eta_{l-1} / eta_l`` (``gamma_1`` is never used; it is set to 0).
    ``eta``, ``mu``: (L,) -> ``alpha, gamma`` (L,).
    """
    eta = torch.as_tensor(eta, dtype=torch.float64)
    mu = torch.as_tensor(mu, dtype=torch.float64)
    if eta.dim() != 1 or mu.shape != eta.shape:
        raise ValueError(f"eta and mu must be vectors of one length, got {tuple(eta.shape)} and {tuple(mu.shape)}")
    gamma = torch.zeros_like(eta)
    gamma[1:] = mu[1:] * eta[:-1] / eta[1:]
    return eta.clone(), gamma


def _gd_matrices(A: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Ahn et al.'s ``P = [[0,0],[0,1]]`` and ``Q = -[[A^T,0],[0,0]]`` for a stack ``A`` (..., d, d)."""
    d = A.shape[-1]
    P = torch.zeros(*A.shape[:-2], d + 1, d + 1, dtype=A.dtype, device=A.device)
    P[..., d, d] = 1.0
    Q = torch.nn.functional.pad(-A.transpose(-1, -2), (0, 1, 0, 1))
    return P, Q


class Memformer(nn.Module):
    """A stack of Ahn et al.'s linear attention layers with an optional memory register.

    Args:
        d: input dimension; ``n``: context length (the LFOM gates have the shape of ``Z``, so
            they need it; the other models accept any ``n`` but are built for this one).
        num_layers: ``L``; ``num_heads``: ``H``.
        attention: ``"identity"``, ``"gd"`` or ``"full"`` (see the module doc).
        memory: ``"none"``, ``"cgd"`` or ``"lfom"``; ``tied``: the LFOM gates, ``True`` (one ``Gamma_j`` per
            register entry, the same in every layer), ``"layer"`` (one ``Gamma_l`` per layer for all the
            entries it adds up) or ``False`` (every ``Gamma_j^(l)``).
        init_step: ``A_l`` starts at ``init_step / H`` times the identity (``"gd"``); ``alpha_l``
            starts at ``init_step`` when ``attention="identity"``, else at 1.
        init_scale: standard deviation of the noise added to every initial value.

    Call it on a :class:`~icl_course.data.TaskBatch` (or ``X``, ``y``, ``x_t``).  ``alpha`` and
    ``gamma`` (each (L,) or (B, L)) replace the learned scalars of a CGD-like model for one call,
    for instance by each task's own CG coefficients.
    """

    def __init__(self, d: int, n: int, num_layers: int = 1, num_heads: int = 1, attention: str = "gd",
                 memory: str = "cgd", tied: bool | str = True, init_step: float = 0.2, init_scale: float = 0.0,
                 seed: int = 0, dtype: str | torch.dtype = torch.float32, device: str | torch.device = "cpu"):
        super().__init__()
        for name, value in (("d", d), ("n", n), ("num_layers", num_layers), ("num_heads", num_heads)):
            check_count(value, name)
        if attention not in ATTENTIONS:
            raise ValueError(f"unknown attention {attention!r}; choose one of {', '.join(ATTENTIONS)}")
        if memory not in MEMORIES:
            raise ValueError(f"unknown memory {memory!r}; choose one of {', '.join(MEMORIES)}")
        if not isinstance(tied, bool) and tied != "layer":   # 1 or 0 would pass `in (True, False)` and misindex
            raise ValueError(f"tied is True (one gate per register entry), 'layer' (one per layer) or False (every "
                             f"gate); got {tied!r}")
        if attention == "identity" and num_heads != 1:
            raise ValueError("attention='identity' has nothing to learn per head; use num_heads=1")
        self.d, self.n, self.attention, self.memory, self.tied = d, n, attention, memory, tied
        self.config = dict(d=d, n=n, num_layers=num_layers, num_heads=num_heads, attention=attention,
                           memory=memory, tied=tied, init_step=float(init_step),
                           init_scale=float(init_scale), seed=seed)
        generator = make_generator(seed)
        dtype, device = resolve_dtype(dtype), resolve_device(device)
        L, H, D = num_layers, num_heads, d + 1

        def noisy(base: torch.Tensor) -> nn.Parameter:
            noise = torch.randn(base.shape, generator=generator, dtype=torch.float64) * init_scale
            return nn.Parameter((base + noise).to(dtype=dtype, device=device))

        if attention == "gd":
            self.A = noisy(torch.eye(d, dtype=torch.float64).expand(L, H, d, d) * init_step / H)
        elif attention == "full":
            P, Q = _gd_matrices(torch.eye(d, dtype=torch.float64).expand(L, H, d, d) * init_step / H)
            self.P, self.Q = noisy(P), noisy(Q)
        else:
            self.register_buffer("A", torch.eye(d, dtype=dtype, device=device).expand(L, 1, d, d).clone())
        if memory == "cgd":
            start = init_step if attention == "identity" else 1.0
            self.alpha = noisy(torch.full((L,), start, dtype=torch.float64))
            self.gamma = noisy(torch.zeros(L, dtype=torch.float64))
        elif memory == "lfom":
            shape = (L, L, D, n + 1) if tied is False else (L, D, n + 1)
            base = torch.ones(shape, dtype=torch.float64)
            if tied is False:  # start as plain GD: Gamma_l^(l) = 1, older updates gated off
                base = base * torch.eye(L, dtype=torch.float64)[:, :, None, None]
            self.gates = noisy(base)

    # -- properties the training loop and the evaluators use ------------------------------------

    @property
    def num_layers(self) -> int:
        """``L``, the number of layers."""
        return self.config["num_layers"]

    @property
    def dtype(self) -> torch.dtype:
        """The floating dtype of the weights (tasks must have the same)."""
        return self.A.dtype if self.attention != "full" else self.P.dtype

    @property
    def device(self) -> torch.device:
        """Where the weights live (tasks must live there too)."""
        return self.A.device if self.attention != "full" else self.P.device

    def attention_matrices(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Every layer's and head's ``P`` and ``Q``, each (L, H, d+1, d+1)."""
        if self.attention == "full":
            return self.P, self.Q
        return _gd_matrices(self.A)

    def gate(self, j: int, layer: int) -> torch.Tensor:
        """``Gamma_j^(l)`` (0-based ``j <= layer``), shape (d+1, n+1); ``tied=True`` ignores ``layer``,
        ``tied="layer"`` ignores ``j``."""
        if self.memory != "lfom":
            raise ValueError("only memory='lfom' has gates")
        if not 0 <= j <= layer < self.num_layers:
            raise ValueError(f"need 0 <= j <= layer < {self.num_layers}, got j={j}, layer={layer}")
        if self.tied is True:
            return self.gates[j]
        return self.gates[layer] if self.tied == "layer" else self.gates[layer, j]

    # -- the forward pass ------------------------------------------------------------------------

    def _coefficients(self, value, name: str, B: int) -> torch.Tensor:
        """A (B, L) tensor of a CGD coefficient: the learned one, or an override."""
        L = self.num_layers
        if value is None:
            return getattr(self, name).expand(B, L)
        value = torch.as_tensor(value, dtype=self.dtype, device=self.device)
        if value.shape not in ((L,), (B, L)):
            raise ValueError(f"{name} must have shape ({L},) or ({B}, {L}), got {tuple(value.shape)}")
        return value.expand(B, L)

    def forward(self, batch: TaskBatch | torch.Tensor, y: Optional[torch.Tensor] = None,
                x_t: Optional[torch.Tensor] = None, alpha=None, gamma=None, tokens: bool = False) -> ModelOutput:
        """Every layer's implicit weights ``w^l`` (B, L, d) and predictions (B, L) (None without ``x_t``).

        ``tokens=True`` runs on the token matrix ``Z`` even where a cheaper exact recursion exists (to check it).
        """
        X, y, x_t = context_of(batch, y, x_t)
        check_context(X, y)
        B, n, d = X.shape
        if d != self.d:
            raise ValueError(f"this model was built for d={self.d}, but the tasks have d={d}")
        if self.memory == "lfom" and n != self.n:
            raise ValueError(f"the LFOM gates have the shape of Z for n={self.n}, but the tasks have n={n}")
        if x_t is not None and x_t.shape != (B, d):
            raise ValueError(f"expected x_t of shape ({B}, {d}), got {tuple(x_t.shape)}")
        if X.dtype != self.dtype or X.device != self.device:
            raise ValueError(f"the tasks are {X.dtype} on {X.device} but the model is {self.dtype} on "
                             f"{self.device}; use batch.to(...)")
        if self.memory != "cgd" and (alpha is not None or gamma is not None):
            raise ValueError("alpha and gamma replace the coefficients of memory='cgd' only")
        if tokens or self.attention == "full":
            weights = self._token_forward(X, y, alpha, gamma)
        elif self.memory == "lfom":
            weights = self._label_recursion(X, y)
        else:
            weights = self._weight_recursion(X, y, alpha, gamma)
        predictions = None if x_t is None else (weights @ x_t.unsqueeze(-1)).squeeze(-1)
        return ModelOutput(layer_weights=weights, layer_predictions=predictions)

    def _weight_recursion(self, X: torch.Tensor, y: torch.Tensor, alpha, gamma) -> torch.Tensor:
        """``w^l`` (B, L, d) of a GD-form model without gates, on ``w`` itself: each layer is
        ``r_l = -A_l grad R(w_l) + gamma_l r_{l-1}``, ``w_{l+1} = w_l + alpha_l r_l`` (``gamma = 0``,
        ``alpha = 1`` without memory), which is what the token matrix computes (section 1 of chapter 5;
        ``tests/test_memformer.py`` checks the two paths agree).  Far cheaper than the tokens."""
        B, n, d = X.shape
        Sigma = X.transpose(-1, -2) @ X / n
        moment = (X.transpose(-1, -2) @ y.unsqueeze(-1)).squeeze(-1) / n
        A = self.A.sum(1)                                                   # heads add up: (L, d, d)
        if self.memory == "cgd":
            alphas, gammas = self._coefficients(alpha, "alpha", B), self._coefficients(gamma, "gamma", B)
        w = torch.zeros(B, d, dtype=X.dtype, device=X.device)
        register, layer_weights = None, []
        for layer in range(self.num_layers):
            gradient = (Sigma @ w.unsqueeze(-1)).squeeze(-1) - moment
            update = -gradient @ A[layer].T
            if self.memory == "cgd":
                if register is not None:
                    update = update + gammas[:, layer, None] * register
                register = update
                update = alphas[:, layer, None] * update
            w = w + update
            layer_weights.append(w)
        return torch.stack(layer_weights, dim=1)

    def _label_recursion(self, X: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """``w^l`` (B, L, d) of a GD-form LFOM model from the label row of ``Z`` alone (nothing else moves).

        Layer ``j`` reads the context's label slots ``r`` (B, n), ``c_j = X^T r / n``, and writes
        ``-<A_j c_j, x_i>`` into context column ``i`` and ``A_j c_j`` into ``w``; layer ``l`` adds every
        past write gated by the label row of ``Gamma_j^(l)`` (its first ``n`` entries for the context,
        the last for the query).  Exact, and far cheaper than the token matrix.
        """
        n = X.shape[-2]
        A = self.A.sum(1)                                                   # heads add up: (L, d, d)
        residuals = y
        w = torch.zeros(X.shape[0], X.shape[-1], dtype=X.dtype, device=X.device)
        directions, layer_weights = [], []
        for layer in range(self.num_layers):
            moment = (residuals.unsqueeze(-2) @ X).squeeze(-2) / n          # X^T r / n = -grad R(w)
            directions.append(moment @ A[layer].T)
            for j, direction in enumerate(directions):
                gate = self.gate(j, layer)[-1]                             # the label row: (n + 1,)
                residuals = residuals - gate[:n] * (X @ direction.unsqueeze(-1)).squeeze(-1)
                w = w + gate[n] * direction
            layer_weights.append(w)
        return torch.stack(layer_weights, dim=1)

    def _token_forward(self, X: torch.Tensor, y: torch.Tensor, alpha, gamma) -> torch.Tensor:
        """``w^l`` (B, L, d) from the token matrix ``Z`` itself (every model; the only path for gates
        and full ``P, Q``)."""
        B, n, d = X.shape
        P, Q = self.attention_matrices()
        context = torch.cat([X, y.unsqueeze(-1)], dim=-1)                   # (B, n, D) rows = columns of Z
        query = torch.eye(d + 1, d, dtype=X.dtype, device=X.device).expand(B, -1, -1)  # (B, D, d)
        if self.memory == "cgd":
            alphas, gammas = self._coefficients(alpha, "alpha", B), self._coefficients(gamma, "gamma", B)
            register = None
        updates = []
        layer_weights = []
        for layer in range(self.num_layers):
            gram = context.transpose(-1, -2) @ context                       # (B, D, D)
            mixing = torch.einsum("hij,bjk,hkl->bil", P[layer], gram, Q[layer]) / n
            update = (context @ mixing.transpose(-1, -2), mixing @ query)    # Attn on context, on query
            if self.memory == "none":
                step = update
            elif self.memory == "cgd":
                if register is not None:
                    g = gammas[:, layer, None, None]
                    update = (update[0] + g * register[0], update[1] + g * register[1])
                register = update
                a = alphas[:, layer, None, None]
                step = (a * update[0], a * update[1])
            else:
                updates.append(update)
                step = (0, 0)
                for j, (ctx_update, query_update) in enumerate(updates):
                    gate = self.gate(j, layer)
                    step = (step[0] + gate[:, :n].T * ctx_update, step[1] + gate[:, n, None] * query_update)
            context, query = context + step[0], query + step[1]
            layer_weights.append(-query[:, d, :])
        return torch.stack(layer_weights, dim=1)

    def final_weights(self, batch: TaskBatch | torch.Tensor, y: Optional[torch.Tensor] = None) -> torch.Tensor:
        """The last layer's ``w^L``, (B, d) (what :func:`~icl_course.train.train` fits)."""
        return self.forward(batch, y).weights

    def extra_repr(self) -> str:
        c = self.config
        return (f"d={c['d']}, n={c['n']}, num_layers={c['num_layers']}, num_heads={c['num_heads']}, "
                f"attention={c['attention']!r}, memory={c['memory']!r}, tied={c['tied']}")


def change_coordinates(model: Memformer, C) -> Memformer:
    """The model written for inputs in other coordinates, ``x' = C x`` (``C`` (d, d), invertible).

    On the tokens ``Z' = T Z``, ``T = diag(C, 1)``, a layer with ``P' = T P T^-1`` and ``Q' = T^-T Q T^-1`` computes
    ``T`` times what ``P, Q`` compute on ``Z`` (in the GD form, ``A' = C^-T A C^-1``); ``T`` leaves the label row alone,
    so on ``(X C^T, y, x_t C^T)`` the returned model predicts what ``model`` predicts on ``(X, y, x_t)``.  Dutta et
    al.'s rotated tasks are the isotropic ones seen through ``C = U D`` (:func:`rotated_coordinates`).

    Exact as long as the memory commutes with ``T``: the learned CGD scalars do (``alpha``, ``gamma`` overrides of a
    call are not mapped), and so do LFOM gates when a layer never updates the input rows (the GD form: ``P``'s input
    rows are 0), when the gates of the input rows are equal within each column, or when ``C`` is diagonal.  Otherwise
    gates that differ between input rows scale single coordinates, which ``C`` mixes, and the model is in general
    mapped to a different function (always, for a ``C`` without zero entries such as ``U D``).  With
    ``attention="identity"`` (``A_l = I`` fixed) only an orthogonal ``C`` can be absorbed, as for CG.
    """
    if not isinstance(model, Memformer):
        raise TypeError(f"change_coordinates rewrites a Memformer (memformer.build or memformer.load_model); got "
                        f"{type(model).__name__}")
    d, dtype = model.d, torch.float64
    C = torch.as_tensor(C, dtype=dtype, device=model.device)
    if C.shape != (d, d):
        raise ValueError(f"C must be a ({d}, {d}) matrix for this model (d={d}), got shape {tuple(C.shape)}")
    finite = bool(torch.isfinite(C).all())
    singular_values = torch.linalg.svdvals(C) if finite else None
    if not finite or singular_values[-1] <= 1e-12 * singular_values[0]:
        raise ValueError("C must be invertible (its smallest singular value is 0 or below 1e-12 of its largest): "
                         "a change of coordinates has to be undoable")
    inverse = torch.linalg.inv(C)
    if model.attention == "identity" and not torch.allclose(inverse.T @ inverse, torch.eye(d, dtype=dtype,
                                                                                          device=C.device)):
        raise ValueError("attention='identity' keeps A_l = I, which absorbs only an orthogonal C (like CG, its steps "
                         "depend on the coordinates); build the model with attention='gd' or 'full' to learn A_l")
    mapped = copy.deepcopy(model)
    with torch.no_grad():
        names = {"full": ("P", "Q"), "gd": ("A",)}.get(model.attention, ())
        for name, value in _carried({name: getattr(model, name).to(dtype) for name in names}, C).items():
            getattr(mapped, name).copy_(value)
    return mapped


def _carried(weights: dict, C: torch.Tensor) -> dict:
    """``weights`` ("P" and "Q", or "A", each (..., D, D) or (..., d, d)) written for inputs ``x' = C x``: with
    ``T = diag(C, 1)``, ``P' = T P T^-1``, ``Q' = T^-T Q T^-1``, ``A' = C^-T A C^-1``; ``C`` (..., d, d) broadcasts
    against the weights' leading dimensions (one ``C`` per model of a stack)."""
    d = C.shape[-1]
    C_inverse = torch.linalg.inv(C)
    T = torch.eye(d + 1, dtype=C.dtype, device=C.device).repeat(*C.shape[:-2], 1, 1)
    T_inverse = T.clone()
    T[..., :d, :d], T_inverse[..., :d, :d] = C, C_inverse
    carried = {}
    if "P" in weights:
        carried["P"] = T @ weights["P"] @ T_inverse
        carried["Q"] = T_inverse.transpose(-1, -2) @ weights["Q"] @ T_inverse
    if "A" in weights:
        carried["A"] = C_inverse.transpose(-1, -2) @ weights["A"] @ C_inverse
    return carried


# -- the experiments of chapter 5 (Dutta et al. 2024, section 5), shipped as one small file -------

SCALES = (1.0, 1.0, 0.5, 0.25, 1.0)   # Dutta et al.'s D: x = U D z, so the inputs have covariance U D^2 U^T
MODELS = {  # name -> (attention, memory): the trained families of chapter 5
    "linear transformer": ("gd", "none"),
    "CGD-like (scalars)": ("identity", "cgd"),
    "CGD-like + A_l": ("gd", "cgd"),
    "LFOM (tied gates)": ("gd", "lfom"),
    "LFOM (per-layer gates)": ("gd", "lfom"),
}
# how each LFOM family ties its gates (Memformer's tied): the paper's equation loses the index that says whether a
# gate belongs to the register entry (Gamma_j) or to the layer that adds the entries up (Gamma_l); both are trained
GATES = {"LFOM (tied gates)": True, "LFOM (per-layer gates)": "layer"}
SETTINGS = ("rotated", "isotropic")
BASELINES = ("CG", "GD (tuned steps)", "momentum", "Nesterov")
# Dutta et al.'s two experiments with every entry of P and Q trained (attention="full"), each a part of the results:
# "heads", the CGD-like model with A_l as 1 and as 5 heads on the rotated data (their figure 5), and "quasi_newton",
# the LFOM with tied gates whose P may update the inputs too, on both settings (their figure 3)
FULL_ATTENTION = {"heads": ("CGD-like + A_l", (1, 5)), "quasi_newton": ("LFOM (tied gates)", SETTINGS)}
# their Adam steps: at the recipe's 2 000 their fresh-task losses from 2 layers on still fell 3-14% over the last
# quarter of training (their losses reach 1e-4, where GD-form models stop near 1e-2); the shipped ones were trained on
# a GPU at 1 500 to 12 000 steps (research/full_attention_gpu.py), which shows 1-2 layers converged by 3 000 and
# 3-4 layers still falling at 12 000; the heads' 3- and 4-layer models were then trained 24 000 and 48 000 steps on
# a CPU (`--parts heads --depths ...`): results["full_attention_lengths"] holds every other training
FULL_ATTENTION_STEPS = 12_000
FULL_ATTENTION_DEPTHS = (1, 2, 3, 4)   # the paper's depths: these models cost hundreds of times a GD-form one
# the depths of each part that train and are scored on stretched tasks, as the GD form's deepest: trained on plain
# batches, the 4-layer quasi-Newton LFOM's mean over a million stretched tasks is 3e3 to 4e12 at almost every
# training length (a plain million reads 3e-4 to 0.15, carried by a few tasks), and trained on stretched batches it
# stays finite (research/README.md); the heads keep plain training (48 000 stretched steps are hours on a CPU)
FULL_ATTENTION_STRETCHED = {"heads": (), "quasi_newton": (4,)}
# "stretched_depths": models of these depths train, and they and the baselines with as many steps are tuned and
# scored, on tasks with a stretched direction drawn on purpose and weighted back (StretchedTasks): at 5 and 6 layers
# a few tasks in a million with a large eigenvalue carry the mean, so plain samples of a million cannot pin it
# (standard errors of 30-46%) and batches of 500 never show training the tasks that decide it; they train for
# "stretched_num_steps" (at 2 000 the 6-layer models on rotated data stayed 14-51% above their isotropic loss, at
# 4 000 still 4.5-23%); the baselines with as many steps are tuned on "stretched_tune_tasks" of them (tuned on 10 000,
# whose weighted mean hangs on a few rare tasks, GD with 6 tuned steps scored 11-13% above the steps tuned
# on 200 000, on fresh ones)
RECIPE = {"d": 5, "n": 20, "depths": (1, 2, 3, 4, 5, 6), "seeds": (0, 1, 2), "num_steps": 2000, "batch_size": 500,
          "learning_rate": 0.05, "warmup_steps": 100, "clip_norm": 1.0, "curve_every": 100, "curve_tasks": 20_000,
          "eval_tasks": 1_000_000, "shallow_eval_tasks": 200_000, "tune_tasks": 10_000, "baseline_tasks": 200_000,
          "stretched_depths": (5, 6), "stretched_num_steps": 8000,
          "stretched_tune_tasks": 200_000}
PRETRAINED = pathlib.Path(__file__).resolve().parent / "pretrained" / "ch5_memformers.pt"
COMMAND = ("OMP_NUM_THREADS=1 nice -n 10 python -m icl_course.memformer   "
           "# writes icl_course/pretrained/ch5_memformers.pt")


def rotation(seed: int) -> torch.Tensor:
    """A Haar-random orthogonal ``U`` (d = 5) from ``seed`` (QR of a Gaussian, signs fixed)."""
    gaussian = torch.randn(5, 5, generator=make_generator(seed), dtype=torch.float64)
    Q, R = torch.linalg.qr(gaussian)
    return Q * torch.sign(torch.diagonal(R))


def rotated_coordinates(seed: int) -> torch.Tensor:
    """``C = U D`` (d, d), ``U = rotation(seed)``: ``paper_tasks("rotated", seed)`` are ``paper_tasks("isotropic")``
    with inputs ``x' = C x`` and weights ``w' = C^-T w`` (labels unchanged); see :func:`change_coordinates`."""
    return rotation(seed) @ torch.diag(torch.tensor(SCALES, dtype=torch.float64))


def covariance(seed: Optional[int]) -> Optional[torch.Tensor]:
    """``S = U D^2 U^T`` with ``U = rotation(seed)``, or None (isotropic, ``S = I``) for ``seed=None``."""
    if seed is None:
        return None
    U = rotation(seed)
    return U @ torch.diag(torch.tensor(SCALES, dtype=torch.float64) ** 2) @ U.T


def paper_tasks(setting: str, seed: int = 0, law: str = "paper", dtype="float64", device="cpu"):
    """The task law of Dutta et al.'s experiments (Ahn et al.'s ``generate_data(U, D)``).

    ``setting="rotated"``: ``x = U D z`` (``x ~ N(0, S)``, ``S = U D^2 U^T``, ``U = rotation(seed)``) and,
    with ``law="paper"``, ``w = U D^-1 z'``, i.e. ``w ~ N(0, S^-1)``, so that the labels
    ``<w, x> = <z', z>`` have the law of the isotropic case; ``law="isotropic w"`` draws ``w ~ N(0, I)``
    instead (an earlier version of the course).  ``setting="isotropic"``: ``S = I`` and ``w ~ N(0, I)``.
    Noiseless labels, ``d = 5``, ``n = 20``.  Returns a :class:`~icl_course.data.RegressionTasks`.
    """
    if setting not in SETTINGS:
        raise ValueError(f"unknown setting {setting!r}; choose one of {', '.join(SETTINGS)}")
    if law not in ("paper", "isotropic w"):
        raise ValueError(f"unknown law {law!r}; choose 'paper' (w ~ N(0, S^-1)) or 'isotropic w' (w ~ N(0, I))")
    S = covariance(seed) if setting == "rotated" else None
    weights = torch.linalg.inv(S) if S is not None and law == "paper" else None
    return RegressionTasks(RECIPE["d"], RECIPE["n"], covariance=S, weight_covariance=weights, dtype=dtype,
                           device=device)


def stretched_tasks(sampler: RegressionTasks) -> StretchedTasks:
    """The law of ``sampler`` (a :func:`paper_tasks`) drawn as :class:`~icl_course.data.StretchedTasks`: half of the
    tasks with one direction of the standard draws stretched or shrunk, every task weighted back, so weighted means
    estimate the same expected losses with the rare large-eigenvalue tasks met in every chunk."""
    return StretchedTasks(sampler.d, sampler.n, 0.0, covariance=sampler.covariance,
                          weight_covariance=sampler.weight_covariance, dtype="float64", device="cpu")


def stretched(depth: int, recipe: Optional[dict] = None) -> bool:
    """Whether models of ``depth`` layers (and baselines of as many steps) train and are scored on
    :func:`stretched_tasks` (the recipe's ``stretched_depths``; none in a recipe made before it had them)."""
    return depth in (recipe or RECIPE).get("stretched_depths", ())


def training_steps(depth: int, recipe: Optional[dict] = None) -> int:
    """Adam steps of a model of ``depth`` layers: the recipe's ``stretched_num_steps`` for its stretched depths,
    ``num_steps`` otherwise."""
    r = recipe or RECIPE
    return r.get("stretched_num_steps", r["num_steps"]) if stretched(depth, r) else r["num_steps"]


def full_attention_recipe(part: str, num_steps: int = FULL_ATTENTION_STEPS, recipe: Optional[dict] = None) -> dict:
    """The recipe one part of ``FULL_ATTENTION`` trains with: ``recipe`` (default ``RECIPE``) at ``num_steps`` steps
    for every depth, on the depths of ``FULL_ATTENTION_DEPTHS`` it has, stretched at the part's
    ``FULL_ATTENTION_STRETCHED`` depths."""
    if part not in FULL_ATTENTION:
        raise ValueError(f"unknown part {part!r}; choose among {', '.join(map(repr, FULL_ATTENTION))}")
    r = recipe or RECIPE
    return dict(r, num_steps=num_steps, stretched_num_steps=num_steps,
                depths=tuple(depth for depth in r["depths"] if depth in FULL_ATTENTION_DEPTHS),
                stretched_depths=FULL_ATTENTION_STRETCHED[part])


def one_layer_optimum(setting: str, family: str, seed: int = 0) -> float:
    """The smallest expected loss a one-layer model of ``family`` can reach on :func:`paper_tasks`.

    One layer predicts with ``w^1 = c A b``, ``b = X^T y / n``.  For ``w ~ N(0, W)`` and Gaussian inputs
    ``E[b b^T] = ((n+1) S W S + tr(W S) S) / n`` and ``E[w b^T] = W S``; the best ``A`` solves
    ``A E[b b^T] = E[w b^T]`` and the best multiple of ``I`` (the scalar CGD-like family) is
    ``tr(S E[w b^T]) / tr(S E[b b^T])``.  Loss ``1/2 E (w^1 - w)^T S (w^1 - w)``.
    """
    tasks = paper_tasks(setting, seed)
    d, n = RECIPE["d"], RECIPE["n"]
    S = tasks.covariance if tasks.covariance is not None else torch.eye(d, dtype=torch.float64)
    W = tasks.weight_covariance if tasks.weight_covariance is not None else torch.eye(d, dtype=torch.float64)
    bb = ((n + 1) * S @ W @ S + torch.trace(W @ S) * S) / n
    wb = W @ S
    if MODELS[family][0] == "identity":
        A = torch.trace(S @ wb) / torch.trace(S @ bb) * torch.eye(d, dtype=torch.float64)
    else:
        A = torch.linalg.solve(bb, wb.T).T
    return float(0.5 * (torch.trace(S @ A @ bb @ A.T) - 2 * torch.trace(S @ A @ wb.T) + torch.trace(S @ W)))


def build(family: str, num_layers: int, num_heads: int = 1, attention: Optional[str] = None, seed: int = 0,
          dtype="float64", device="cpu") -> Memformer:
    """One of the chapter's models (``MODELS``), untrained: GD-like start, small noise (seeded)."""
    if family not in MODELS:
        raise KeyError(f"unknown family {family!r}; choose one of {list(MODELS)}")
    default_attention, memory = MODELS[family]
    return Memformer(RECIPE["d"], RECIPE["n"], num_layers, num_heads, attention or default_attention, memory,
                     tied=GATES.get(family, True), init_scale=0.01, seed=seed, dtype=dtype, device=device)


def _factors(samplers) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Each sampler's ``S``, and factors with ``x = F_x z``, ``w = F_w z'``: three (M, d, d) stacks."""
    eye = torch.eye(RECIPE["d"], dtype=torch.float64)
    S = torch.stack([eye if s.covariance is None else s.covariance for s in samplers])
    W = torch.stack([eye if s.weight_covariance is None else s.weight_covariance for s in samplers])
    return S, torch.linalg.cholesky(S), torch.linalg.cholesky(W)


def _stacked_batches(factors, size: int, generator, stretched: bool = False):
    """One fresh noiseless batch per model, stacked: X (M, B, n, d), y (M, B, n), w (M, B, d); with ``stretched``,
    drawn as :class:`~icl_course.data.StretchedTasks` and with each task's importance weight (M, B) last."""
    _, x_factor, w_factor = factors
    M, d, n = x_factor.shape[0], RECIPE["d"], RECIPE["n"]
    Z = torch.randn(M, size, n, d, generator=generator, dtype=torch.float64)
    if not stretched:
        X = Z @ x_factor.transpose(-1, -2)[:, None]
    w = torch.randn(M, size, d, generator=generator, dtype=torch.float64) @ w_factor.transpose(-1, -2)
    if not stretched:
        return X, (X @ w.unsqueeze(-1)).squeeze(-1), w
    Z, weight = stretch(Z.reshape(M * size, n, d), STRETCH_SCALES, STRETCH_FRACTION, generator)
    X = Z.reshape(M, size, n, d) @ x_factor.transpose(-1, -2)[:, None]
    return X, (X @ w.unsqueeze(-1)).squeeze(-1), w, weight.reshape(M, size)


def _stacked_loss(layer_weights, w, covariances):
    """``1/2 (w^L - w)^T S (w^L - w)`` per model and task: (K, M, B, d) -> (K, M, B) (``S`` per model, (M, d, d))."""
    error = layer_weights - w
    return 0.5 * torch.einsum("kmbi,mij,kmbj->kmb", error, covariances, error)


def train_models(family: str, depths, samplers, seeds, recipe: Optional[dict] = None,
                 fixed_batch: Optional[int] = None, attention: Optional[str] = None, num_heads: int = 1,
                 device: str | torch.device = "cpu", stretched: bool = False, start: Optional[dict] = None,
                 batch_seed: Optional[int] = None, whitened: bool = False) -> dict:
    """Train one model of ``family`` per depth in ``depths`` and per sampler, all at once (vectorised).

    The model for depth ``L`` and sampler ``m`` is built with seed ``seeds[m]``; all models of one sampler
    see the same fresh batches.  Adam, a warm-up then a cosine decay to 0, each model's gradient clipped to
    ``clip_norm``; the loss is the query-averaged loss of the model's last layer.  Every ``curve_every``
    steps each model is scored on the same ``curve_tasks`` fresh tasks (never trained on).  Returns
    ``{L: (weights, curve)}``: a state dict whose tensors have the samplers first, and the
    (samplers, num_steps // curve_every + 1) curve.  ``fixed_batch=B`` fits one batch of ``B`` tasks per sampler
    instead (Dutta et al.'s small-batch experiment), returned as ``{L: (weights, curve, (X, y, w))}``.
    ``attention`` and ``num_heads`` change the family's attention (``"full"``: every ``P`` and ``Q``) and heads.
    ``device`` (``"cpu"``, ``"cuda"``, ``"auto"``) is where the models train; the tasks are drawn on the CPU with
    the same generator on every device, and what is returned is on the CPU.  ``stretched=True`` draws every batch
    (and the curve's tasks) as :func:`stretched_tasks` and weights each task's loss back: the same expected loss,
    with the rare large-eigenvalue tasks that carry a deep model's mean in every batch.
    ``start`` (one depth only): a state dict whose tensors have the samplers first (as returned), the models' start
    instead of :func:`build`'s, to train a model further (or a widened one); ``batch_seed`` seeds the stream of
    training batches (default: one fixed by ``seeds``), so that further training meets batches it has not seen.
    ``whitened=True`` lets Adam step in the coordinates where each sampler's inputs are white, ``x = F z`` with ``F``
    the Cholesky factor of its ``S``: it trains ``P~ = T^-1 P T`` and ``Q~ = T^T Q T`` (``T = diag(F, 1)``), or
    ``A~ = F^T A F`` in the GD form, and returns ``P, Q`` (or ``A``) again.  The model class and the loss are the
    same (the map is one-to-one, the gates and CGD scalars are left as they are), but Adam's steps, entry by entry,
    are not invariant to a change of basis: in the given coordinates they must undo the stretch of ``S`` (chapter 5,
    section 9).  With ``S = I`` it is plain training.
    """
    if stretched and fixed_batch is not None:
        raise ValueError("stretched batches weight a fresh stream of tasks; a fixed batch is fitted as it is")
    r = recipe or RECIPE
    device = available_device(device)
    depths, deepest, S = list(depths), max(depths), len(samplers)
    # The plain linear transformer trains in the factored form alpha_l A_l (a CGD-like model whose gamma_l stay 0):
    # the same functions, but Adam then moves the scale of A_l as fast as its shape, which the rotated data need
    # (trained on A_l alone, it stopped above its isotropic loss, which the affine invariance says it can reach).
    factored = family == "linear transformer"
    trained_as = "CGD-like + A_l" if factored else family
    models = [build(trained_as, deepest, num_heads, attention, seed=seed).to(device) for _ in depths for seed in seeds]
    if start is not None:
        if len(depths) != 1 or factored:
            raise ValueError(f"a start is the weights of one depth of a family trained as it is; got depths {depths} "
                             f"of {family!r}")
        try:
            for index, model in enumerate(models):
                model.load_state_dict({k: v[index] for k, v in start.items()})
        except (RuntimeError, IndexError) as error:
            raise ValueError(f"start does not fit {S} models of {family!r} with {deepest} layers and {num_heads} "
                             f"head(s): {str(error).splitlines()[0]}") from None
    params, buffers = stack_module_state(models)
    params = {k: v.detach().reshape(len(depths), S, *v.shape[1:]).requires_grad_(True) for k, v in params.items()}
    buffers = {k: v.reshape(len(depths), S, *v.shape[1:]) for k, v in buffers.items()}
    if factored:
        params["gamma"].data.zero_()
    template = build(trained_as, deepest, num_heads, attention).to("meta")
    factors = _factors(samplers)
    covariances = factors[0].to(device)
    last, each = (torch.tensor(depths) - 1).to(device), torch.arange(len(depths), device=device)
    given = _whitening(params, factors[1].to(device)) if whitened else (lambda p: p)

    def forward(p, b, X, y):
        return functional_call(template, {**p, **b}, (X, y)).layer_weights

    run = vmap(vmap(forward), in_dims=(0, 0, None, None))       # depths outside, samplers inside

    def losses(X, y, w, importance=None):   # (K, S) mean loss of each model's last layer
        weights = run(given(params), buffers, X, y)             # (K, S, B, deepest, d)
        final = weights[each, :, :, last]    # (K, S, B, d)
        per_task = _stacked_loss(final, w, covariances)
        return (per_task if importance is None else per_task * importance).mean(-1)

    def on_device(batch):
        return tuple(tensor.to(device) for tensor in batch)

    leaves = list(params.values())
    optimizer = torch.optim.Adam(leaves, lr=r["learning_rate"])
    generator = make_generator(10_000 + 97 * sum(seeds) if batch_seed is None else batch_seed)
    checks = on_device(_stacked_batches(factors, r["curve_tasks"], make_generator(20_000), stretched))
    curve = []
    for step in range(r["num_steps"] + 1):
        if step % r["curve_every"] == 0:
            with torch.no_grad():
                curve.append(losses(*checks))
        if step == r["num_steps"]:
            break
        if fixed_batch is None or step == 0:
            batch = on_device(_stacked_batches(factors, r["batch_size"] if fixed_batch is None else fixed_batch,
                                               generator, stretched))
        loss = losses(*batch)
        optimizer.zero_grad()
        loss.sum().backward()
        for leaf in leaves:   # a coefficient no model uses (gamma_1, layers past a model's depth) gets none
            if leaf.grad is None:
                leaf.grad = torch.zeros_like(leaf)
        if factored:
            params["gamma"].grad.zero_()          # Adam leaves a parameter with no gradient where it is
        norms = torch.sqrt(sum((leaf.grad.flatten(2) ** 2).sum(-1) for leaf in leaves))      # (K, S)
        scale = r["clip_norm"] / norms.clamp_min(r["clip_norm"])
        for leaf in leaves:
            leaf.grad.mul_(scale.reshape(*scale.shape, *[1] * (leaf.dim() - 2)))
        warm = min(1.0, (step + 1) / r["warmup_steps"])
        for group in optimizer.param_groups:
            group["lr"] = r["learning_rate"] * warm * 0.5 * (1 + math.cos(math.pi * step / r["num_steps"]))
        optimizer.step()
    curve = torch.stack(curve, -1).cpu()
    trained = {}
    params = given(params)
    if factored:
        params = {"A": params["alpha"][..., None, None, None] * params["A"]}
    for index, depth in enumerate(depths):   # keep each model's own layers
        weights = {k: v[index, :, :depth].detach().cpu().clone() for k, v in {**params, **buffers}.items()}
        trained[depth] = ((weights, curve[index]) if fixed_batch is None
                          else (weights, curve[index], tuple(tensor.cpu() for tensor in batch)))
    return trained


def _whitening(params: dict, x_factor: torch.Tensor):
    """Rewrite stacked ``params`` (models (K, S) first) in place for Adam in white coordinates, ``x = F z`` with
    ``x_factor`` (S, d, d) the samplers' ``F``; return the map that gives back the weights in the given coordinates."""
    if not {"P", "A"} & set(params):
        raise ValueError("whitened=True changes the basis of A_l or of P_l and Q_l; this family has neither "
                         "(attention='identity' keeps A_l = I)")
    names = ("P", "Q") if "P" in params else ("A",)
    F = x_factor[None, :, None, None].to(params[names[0]].dtype)   # (S, d, d) -> over (K, S, layers, heads, d, d)
    with torch.no_grad():   # Adam's start: the weights written for the white inputs z = F^-1 x
        for name, value in _carried({name: params[name] for name in names}, torch.linalg.inv(F)).items():
            params[name].copy_(value)

    def given(p: dict) -> dict:
        return {**p, **_carried({name: p[name] for name in names}, F)}

    return given


def small_batch_experiment(sizes=(1, 10), recipe: Optional[dict] = None, device: str | torch.device = "cpu",
                           restarts: int = 20) -> dict:
    """Dutta et al.'s small-batch comparison: the scalar CGD-like Memformer fitted to one batch of ``B`` tasks
    (per seed, on the rotated data), scored on **that batch** against CG run on the same tasks, and on
    ``shallow_eval_tasks`` fresh tasks.  Whether each fit is converged is recorded too: the norm of the batch loss's
    gradient at the end of Adam, and the lowest batch loss that L-BFGS reaches from ``restarts`` random coefficients
    (steps in [0, 2), memory weights in [0, 1.5)).  Returns ``{B: {"batch": (seeds, depths), "cg_batch": ...,
    "fresh": ..., "fresh_stderr": ..., "gradient_norm": ..., "restarts_best": ...}}``."""
    r = recipe or RECIPE
    seeds = list(r["seeds"])
    samplers = [paper_tasks("rotated", seed) for seed in seeds]
    S = _factors(samplers)[0]
    out = {}
    for size in sizes:
        trained = train_models("CGD-like (scalars)", r["depths"], samplers, seeds, r, fixed_batch=size, device=device)
        keys = ("batch", "cg_batch", "fresh", "fresh_stderr", "gradient_norm", "restarts_best")
        rows = {key: [] for key in keys}
        for depth, (weights, _, (X, y, w)) in trained.items():
            values = {key: [] for key in keys}
            for m, seed in enumerate(seeds):
                model = build("CGD-like (scalars)", depth)
                model.load_state_dict(unstack(weights, m))

                def batch_loss(net=model, m=m):
                    error = net(X[m], y[m]).weights - w[m]
                    return 0.5 * ((error @ S[m]) * error).sum(-1).mean()
                fitted = batch_loss()
                gradients = torch.autograd.grad(fitted, [model.alpha, model.gamma], allow_unused=True)
                values["batch"].append(fitted.detach())
                values["gradient_norm"].append(torch.sqrt(sum((g ** 2).sum() for g in gradients if g is not None)))
                values["restarts_best"].append(_best_restart(model, batch_loss, restarts, 100 * seed + depth))
                cg_error = conjugate_gradient(X[m], y[m], depth)[:, -1] - w[m]
                values["cg_batch"].append(0.5 * ((cg_error @ S[m]) * cg_error).sum(-1).mean())
                means, errors = score(model, samplers[m], r["shallow_eval_tasks"], seed=9_000 + seed + depth)
                values["fresh"].append(means[-1])
                values["fresh_stderr"].append(errors[-1])
            for key in keys:
                rows[key].append(torch.stack(values[key]).detach())
        out[size] = {key: torch.stack(values, 1) for key, values in rows.items()}
    return out


def _best_restart(model: Memformer, batch_loss, restarts: int, seed: int) -> torch.Tensor:
    """The lowest ``batch_loss()`` that L-BFGS reaches from ``restarts`` random ``alpha, gamma`` of ``model`` (which
    it leaves as it found it); ``inf`` for ``restarts=0``."""
    kept = {name: value.detach().clone() for name, value in model.state_dict().items()}
    generator, best = make_generator(seed), torch.tensor(math.inf, dtype=torch.float64)
    for _ in range(restarts):
        with torch.no_grad():
            model.alpha.copy_(2 * torch.rand(model.alpha.shape, generator=generator, dtype=torch.float64))
            model.gamma.copy_(1.5 * torch.rand(model.gamma.shape, generator=generator, dtype=torch.float64))
        optimizer = torch.optim.LBFGS([model.alpha, model.gamma], max_iter=1000, tolerance_grad=1e-12,
                                      tolerance_change=1e-15, history_size=50, line_search_fn="strong_wolfe")

        def closure():
            optimizer.zero_grad()
            loss = batch_loss()
            loss.backward()
            return loss
        optimizer.step(closure)
        with torch.no_grad():
            loss = batch_loss()
        if torch.isfinite(loss):     # a start that runs off to huge steps is no candidate
            best = torch.minimum(best, loss)
    model.load_state_dict(kept)
    return best


def eval_count(depth: int, recipe: Optional[dict] = None) -> int:
    """Fresh tasks that score a model of ``depth`` layers: ``eval_tasks`` from 3 layers on (their errors are
    heavy-tailed), ``shallow_eval_tasks`` below."""
    r = recipe or RECIPE
    return r["eval_tasks"] if depth >= 3 else r["shallow_eval_tasks"]


def widen_heads(weights: dict, num_heads: int, seed: int = 0, how: str = "new") -> dict:
    """1-head models with every entry of ``P`` and ``Q`` trained (a state dict, models first: ``P``, ``Q`` of shape
    (M, L, 1, d+1, d+1)) as ``num_heads``-head models that compute the very same functions.

    A layer adds ``sum_k P_k Z M Z^T Q_k Z / n`` over its heads (Dutta and Sra 2024, eq. 3.1: the heads' attention
    values are summed).  ``how="new"``: the first head is the trained one and
    the new heads have ``P_k = 0`` (so they add nothing) and ``Q_k`` of standard deviation 0.01 (so that their ``P_k``
    get a gradient).  ``how="split"``: every head has the trained ``Q`` and ``P / H`` plus noise that sums to zero over
    the heads (standard deviation a tenth of the mean ``|P| / H``), so the heads are equally large and differ from the
    start.  Seeded by ``seed``."""
    P, Q = weights["P"], weights["Q"]
    if P.dim() != 5 or P.shape[2] != 1 or Q.shape != P.shape:
        raise ValueError(f"widen_heads takes stacked 1-head weights, P and Q of shape (models, layers, 1, d+1, d+1); "
                         f"got P {tuple(P.shape)} and Q {tuple(Q.shape)}")
    check_count(num_heads, "num_heads")
    generator = make_generator(seed)
    if how == "split":
        noise = torch.randn((*P.shape[:2], num_heads, *P.shape[3:]), generator=generator, dtype=P.dtype)
        noise = (noise - noise.mean(2, keepdim=True)) * 0.1 * P.abs().mean((2, 3, 4), keepdim=True) / num_heads
        return dict(weights, P=P / num_heads + noise, Q=Q.expand(-1, -1, num_heads, -1, -1).clone())
    if how != "new":
        raise ValueError(f"how is 'new' (the trained head and new heads from P = 0) or 'split' (the trained head "
                         f"shared out over the heads); got {how!r}")
    extra = (*P.shape[:2], num_heads - 1, *P.shape[3:])
    noise = 0.01 * torch.randn(extra, generator=generator, dtype=Q.dtype)
    return dict(weights, P=torch.cat([P, torch.zeros(extra, dtype=P.dtype)], 2), Q=torch.cat([Q, noise], 2))


def unstack(weights: dict, index: int) -> dict:
    """Model ``index``'s state dict from a stacked one."""
    return {key: value[index] for key, value in weights.items()}


def score(model, sampler, num_tasks: int, seed: int):
    """Per-layer loss of ``model`` on ``num_tasks`` fresh tasks: (means, standard errors), each (L,)."""
    estimates = per_layer_loss(model, sampler, num_tasks=num_tasks, seed=seed)
    return (torch.tensor([e.mean for e in estimates], dtype=torch.float64),
            torch.tensor([e.stderr for e in estimates], dtype=torch.float64))


def tuned_baselines(sampler, num_steps: int, tune_tasks: int, score_tasks: int, seed: int = 0,
                    stretched_steps=(), stretched_tune_tasks: Optional[int] = None) -> dict:
    """CG, GD with one tuned step size per step, and heavy-ball momentum and Nesterov with one tuned
    ``(eta, mu)``, each run for k = 1..``num_steps`` steps on every task's own context.

    Tuned for every k separately (L-BFGS on the exact loss of ``tune_tasks`` tasks), then scored on
    ``score_tasks`` other fresh tasks; for k in ``stretched_steps`` both samples are drawn as
    :func:`stretched_tasks` and weighted back, as the models of as many layers are, and tuned on
    ``stretched_tune_tasks`` of them (default ``tune_tasks``).  Returns ``{method: {"mean":
    (K,), "stderr": (K,), "parameters": [per k]}}`` with the methods of ``BASELINES``.
    """
    plain = sampler.sample(tune_tasks, seed=11 + seed)
    wide = stretched_tasks(sampler).sample(stretched_tune_tasks or tune_tasks, seed=11 + seed) if stretched_steps \
        else None
    steps = range(1, num_steps + 1)
    samples = [wide if k in stretched_steps else plain for k in steps]
    tuned = {"CG": [None for _ in steps],
             "GD (tuned steps)": [tune_step_sizes(sample, k) for k, sample in zip(steps, samples)],
             "momentum": [tune_momentum(sample, k) for k, sample in zip(steps, samples)],
             "Nesterov": [tune_momentum(sample, k, nesterov=True) for k, sample in zip(steps, samples)]}

    def paths(batch):   # (B, 4 K, d): each method's last iterate after k = 1..K steps
        X, y = batch.X, batch.y
        last = [conjugate_gradient(X, y, num_steps)[:, 1:]]
        gd_steps = tuned["GD (tuned steps)"]
        last.append(torch.stack([gradient_descent(X, y, eta, k)[:, -1] for k, eta in zip(steps, gd_steps)], 1))
        for name, nesterov in (("momentum", False), ("Nesterov", True)):
            last.append(torch.stack([momentum_descent(X, y, eta, mu, k, nesterov=nesterov)[:, -1]
                                     for k, (eta, mu) in zip(steps, tuned[name])], 1))
        return ModelOutput(torch.cat(last, 1), None)

    estimates = per_layer_loss(paths, sampler, num_tasks=score_tasks, seed=4321 + seed)
    if stretched_steps:   # the same paths on stretched tasks, kept for the steps that use them
        weighted = per_layer_loss(paths, stretched_tasks(sampler), num_tasks=score_tasks, seed=4321 + seed)
        estimates = [weighted[i] if i % num_steps + 1 in stretched_steps else estimate
                     for i, estimate in enumerate(estimates)]
    return {name: {"mean": torch.tensor([e.mean for e in estimates[i * num_steps:(i + 1) * num_steps]],
                                        dtype=torch.float64),
                   "stderr": torch.tensor([e.stderr for e in estimates[i * num_steps:(i + 1) * num_steps]],
                                          dtype=torch.float64),
                   "parameters": [None if p is None else torch.as_tensor(p, dtype=torch.float64) for p in tuned[name]]}
            for i, name in enumerate(BASELINES)}


def setting_samplers(seeds) -> list:
    """The samplers of chapter 5's trained models, in the order they are stacked: ``paper_tasks("rotated", seed)``
    for every seed in ``seeds`` (each its own ``U``), then ``paper_tasks("isotropic", seed)`` for each (2 * len(seeds)).
    """
    return [paper_tasks(setting, seed) for setting in SETTINGS for seed in seeds]


def run_experiments(path=PRETRAINED, resume: bool = True, recipe: Optional[dict] = None, redo=(),
                    device: str | torch.device = "cpu") -> dict:
    """Train and score every model of chapter 5, tune and score the baselines; save all in ``path``.

    For each family of ``MODELS`` and each depth, one model per seed and setting (``SETTINGS``; on the
    rotated data seed ``s`` also draws ``U``), all trained at once by :func:`train_models`, then
    scored per layer on ``eval_tasks`` fresh tasks (seeded apart from training); the recipe's
    ``stretched_depths`` train for ``stretched_num_steps`` and train and score on :func:`stretched_tasks`.  The file is
    rewritten after every (family, depth), and ``resume=True`` keeps what it holds except the parts
    named in ``redo`` (``"baselines"``, ``"small_batch"`` or families of ``MODELS``).  Layout (nested
    keys): ``results["models"][setting][family][depth]`` holds ``"weights"`` (a state dict, one model
    per seed along the first axis), ``"curve"`` (seeds, checkpoints), ``"mean"`` and ``"stderr"``
    (seeds, depth), ``"stretched"`` and ``"num_steps"``; a resumed file trains again the depths whose
    ``stretched`` or ``num_steps`` differ from the recipe's; ``results["baselines"][setting][method]`` as
    :func:`tuned_baselines`;
    ``results[part][key][depth]`` the same for the parts of ``FULL_ATTENTION`` (``FULL_ATTENTION_STEPS`` steps),
    and ``results["full_attention_lengths"][steps][part]`` those parts trained for fewer steps, if the file has them
    (kept as they are: research/full_attention_gpu.py makes them).
    ``device`` is where the models train (:func:`train_models`); tuning and scoring run on the CPU in float64.
    """
    r = dict(recipe or RECIPE)
    path = pathlib.Path(path)
    available_device(device)   # before hours of tuning, not after
    unknown = set(redo) - {"baselines", "small_batch", *FULL_ATTENTION, *MODELS}
    if unknown:
        raise ValueError(f"cannot redo {sorted(unknown)}; choose among 'baselines', 'small_batch', "
                         f"{', '.join(map(repr, FULL_ATTENTION))} and {list(MODELS)}")
    results = {"recipe": r, "command": COMMAND, "models": {s: {f: {} for f in MODELS} for s in SETTINGS},
               "baselines": {}}
    if resume and path.exists():
        done = load_experiments(path)
        # resuming trains the depths these change, and tunes the baselines again
        free = ("depths", "stretched_depths", "stretched_num_steps", "stretched_tune_tasks")
        if {k: v for k, v in done["recipe"].items() if k not in free} != {k: v for k, v in r.items() if k not in free}:
            raise ValueError(f"{path} was made with another recipe; pass resume=False (or another path) to start over")
        results["models"], results["baselines"] = done["models"], done["baselines"]
        if tuple(done["recipe"].get("stretched_depths", ())) != tuple(r.get("stretched_depths", ())) or \
                done["recipe"].get("stretched_tune_tasks") != r.get("stretched_tune_tasks"):
            results["baselines"] = {}   # their stretched steps or tasks changed: tuned and scored again (minutes)
        for setting in SETTINGS:   # a family the file predates is trained now
            for family in MODELS:
                results["models"].setdefault(setting, {}).setdefault(family, {})
        results["seconds"] = done.get("seconds", {})
        results.update({key: done[key] for key in ("small_batch", "total_seconds", "timing", "redone",
                                                   "full_attention_steps", "full_attention_lengths", *FULL_ATTENTION)
                        if key in done and key not in redo})
        if "baselines" in redo:
            results["baselines"] = {}
        if "small_batch" in redo:
            results.pop("small_batch", None)
        for family in set(redo) & set(MODELS):
            for setting in SETTINGS:
                results["models"][setting][family] = {}
    seeds = list(r["seeds"])
    for setting in SETTINGS:
        if setting not in results["baselines"]:
            start = time.perf_counter()
            results["baselines"][setting] = tuned_baselines(
                paper_tasks(setting), max(r["depths"]), r["tune_tasks"], r["baseline_tasks"],
                stretched_steps=tuple(depth for depth in r["depths"] if stretched(depth, r)),
                stretched_tune_tasks=r.get("stretched_tune_tasks"))
            results["seconds"] = {**results.get("seconds", {}), f"baselines {setting}": time.perf_counter() - start}
            torch.save(results, path)
            print(f"baselines {setting}: {time.perf_counter() - start:.0f} s", flush=True)
    if "small_batch" not in results:
        start = time.perf_counter()
        results["small_batch"] = small_batch_experiment(recipe=r, device=device)
        results["seconds"] = {**results.get("seconds", {}), "small batches": time.perf_counter() - start}
        torch.save(results, path)
        print(f"small batches: {time.perf_counter() - start:.0f} s", flush=True)
    samplers = setting_samplers(seeds)
    for family in MODELS:
        # a depth is trained (again) when the file lacks it or trained it on other tasks than the recipe says
        stale = tuple(depth for depth in r["depths"] if any(
            depth not in results["models"][s][family]
            or results["models"][s][family][depth].get("stretched", False) != stretched(depth, r)
            or results["models"][s][family][depth].get("num_steps", r["num_steps"]) != training_steps(depth, r)
            for s in SETTINGS))
        if not stale:
            continue
        start = time.perf_counter()
        trained = _trained_and_scored(family, samplers, seeds, dict(r, depths=stale), device=device)
        for index, setting in enumerate(SETTINGS):
            results["models"][setting][family].update(trained[index])
        part = family if stale == tuple(r["depths"]) else f"{family}, {', '.join(map(str, stale))} layers"
        results["seconds"] = {**results.get("seconds", {}), part: time.perf_counter() - start}
        torch.save(results, path)
        finals = [[results["models"][s][family][k]["mean"][:, -1].mean().item() for k in r["depths"]]
                  for s in SETTINGS]
        print(f"{family}: rotated {[f'{v:.3g}' for v in finals[0]]}, isotropic {[f'{v:.3g}' for v in finals[1]]}, "
              f"{time.perf_counter() - start:.0f} s", flush=True)
    for part, (family, keys) in FULL_ATTENTION.items():
        longer = full_attention_recipe(part, FULL_ATTENTION_STEPS if r is RECIPE or r == RECIPE else r["num_steps"], r)
        done = results.get(part, {}) if results.get("full_attention_steps") == longer["num_steps"] else {}
        # a depth is trained (again) when the file lacks it or trained it on other tasks than the part's recipe says
        stale = tuple(depth for depth in longer["depths"] if any(
            depth not in done.get(key, {}) or done[key][depth].get("stretched", False) != stretched(depth, longer)
            for key in keys))
        if not stale:
            continue
        start, again = time.perf_counter(), dict(longer, depths=stale)
        if part == "heads":     # the rotated data only, as the paper's figure
            runs = {heads: _trained_and_scored(family, samplers[:len(seeds)], seeds, again, 1, "full", heads,
                                               device)[0] for heads in keys}
        else:
            runs = dict(zip(keys, _trained_and_scored(family, samplers, seeds, again, len(SETTINGS), "full",
                                                      device=device)))
        results[part] = {key: {**done.get(key, {}), **runs[key]} for key in keys}
        results["full_attention_steps"] = longer["num_steps"]
        name = part if stale == longer["depths"] else f"{part}, {', '.join(map(str, stale))} layers"
        results["seconds"] = {**results.get("seconds", {}), name: time.perf_counter() - start}
        torch.save(results, path)
        finals = {key: [round(runs[key][depth]["mean"][:, -1].mean().item(), 4) for depth in stale] for key in keys}
        print(f"{part}: {finals}, {time.perf_counter() - start:.0f} s", flush=True)
    return results


def _trained_and_scored(family: str, samplers, seeds, r: dict, settings: int = len(SETTINGS),
                        attention: Optional[str] = None, num_heads: int = 1, device="cpu") -> list[dict]:
    """Train ``family`` at every depth of ``r`` on ``samplers`` (``settings`` groups of one per seed, all at
    once) and score each model per layer on fresh tasks.  Returns, per group, ``{depth: {"weights" (seeds
    first), "curve" (seeds, checkpoints), "mean", "stderr" (seeds, depth)}}``."""
    groups = train_groups(family, samplers, seeds, r, settings, attention, num_heads, device)
    return score_groups(groups, family, samplers, seeds, r, attention, num_heads)


def train_groups(family: str, samplers, seeds, r: dict, settings: int = len(SETTINGS),
                 attention: Optional[str] = None, num_heads: int = 1, device="cpu") -> list[dict]:
    """Train ``family`` at every depth of the recipe ``r`` on ``samplers`` (``settings * len(seeds)`` of them,
    stacked as :func:`setting_samplers` stacks them), all models at once with :func:`train_models`.

    Returns one dict per group of ``len(seeds)`` samplers, ``{depth: {"weights" (a state dict, seeds first),
    "curve" (seeds, checkpoints), "stretched", "num_steps"}}``: the training half of what :func:`run_experiments`
    ships (the recipe's stretched depths train apart, on their own stream of stretched batches)."""
    trained = {}
    for kind in (False, True):   # the plain depths, then those trained on stretched tasks (the same stream each)
        depths = [depth for depth in r["depths"] if stretched(depth, r) == kind]
        if depths:
            trained.update(train_models(family, depths, samplers, seeds * settings,
                                        dict(r, num_steps=training_steps(depths[0], r)), attention=attention,
                                        num_heads=num_heads, device=device, stretched=kind))
    groups = [{} for _ in range(settings)]
    for depth, (weights, curve) in trained.items():
        for index in range(settings):
            chosen = slice(index * len(seeds), (index + 1) * len(seeds))
            groups[index][depth] = {"weights": {k: v[chosen].clone() for k, v in weights.items()},
                                    "curve": curve[chosen].clone(), "stretched": stretched(depth, r),
                                    "num_steps": training_steps(depth, r)}
    return groups


def score_groups(groups: list[dict], family: str, samplers, seeds, r: dict, attention: Optional[str] = None,
                 num_heads: int = 1) -> list[dict]:
    """The scoring half of what :func:`run_experiments` ships, for :func:`train_groups`'s output: adds each run's
    per-layer ``"mean"`` and ``"stderr"`` (seeds, depth) on :func:`eval_count` fresh tasks (the seed
    ``7 000 + 31 * seed + depth``), on the CPU in float64; group ``index`` holds the models of samplers
    ``index * len(seeds) ...``."""
    for index, group in enumerate(groups):
        for depth, run in group.items():
            scores = []
            for position, seed in enumerate(seeds):
                model = build(family, depth, num_heads, attention)
                model.load_state_dict(unstack(run["weights"], position))
                sampler = samplers[index * len(seeds) + position]
                scores.append(score(model, stretched_tasks(sampler) if stretched(depth, r) else sampler,
                                    eval_count(depth, r), seed=7_000 + 31 * seed + depth))
            run["mean"], run["stderr"] = torch.stack([s[0] for s in scores]), torch.stack([s[1] for s in scores])
    return groups


def load_experiments(path=PRETRAINED) -> dict:
    """The shipped results of :func:`run_experiments` (weights, curves, scores, baselines), loaded as plain
    tensors, numbers and strings (nothing in the file runs)."""
    path = pathlib.Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no chapter 5 results at {path}: make them with `python -m icl_course.memformer "
                                f"--out {path}`")
    try:
        results = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:   # torch raises several types for a truncated or foreign file
        raise ValueError(f"{path} could not be read as chapter 5 results ({type(error).__name__}); it is damaged or "
                         "was not made by run_experiments. Delete it, or pass --restart, to train afresh.") from None
    if not isinstance(results, dict) or not {"recipe", "models", "baselines"} <= set(results):
        raise ValueError(f"{path} is not a file of chapter 5 results (run_experiments writes recipe, models and "
                         "baselines). Delete it, or pass --restart, to train afresh.")
    return results


def load_model(results: dict, setting: str, family: str, depth: int, seed: int = 0) -> Memformer:
    """A trained model of :func:`run_experiments` (the ``seed``-th of its runs), rebuilt on the CPU."""
    runs = results["models"].get(setting, {}).get(family, {})
    if depth not in runs or not 0 <= seed < len(results["recipe"]["seeds"]):
        raise KeyError(f"no trained model ({setting!r}, {family!r}, depth {depth}, seed {seed}) in these results: "
                       f"a setting of {list(results['models'])}, a family of {list(MODELS)}, a depth of "
                       f"{tuple(results['recipe']['depths'])} and a seed index below {len(results['recipe']['seeds'])}")
    model = build(family, depth)
    model.load_state_dict(unstack(runs[depth]["weights"], seed))
    return model


def load_full_attention_model(results: dict, part: str, key, depth: int, seed: int = 0) -> Memformer:
    """A trained model of a part of ``FULL_ATTENTION``: ``part="heads"`` with ``key`` heads (1 or 5), or
    ``part="quasi_newton"`` with ``key`` a setting; the ``seed``-th run, rebuilt on the CPU."""
    if part not in FULL_ATTENTION:
        raise KeyError(f"unknown part {part!r}; choose one of {list(FULL_ATTENTION)}")
    family, keys = FULL_ATTENTION[part]
    runs = results.get(part, {}).get(key, {})
    if depth not in runs or not 0 <= seed < len(results["recipe"]["seeds"]):
        raise KeyError(f"no trained model ({part!r}, {key!r}, depth {depth}, seed {seed}) in these results: "
                       f"a key of {list(keys)}, a depth of {tuple(results['recipe']['depths'])} and a seed index "
                       f"below {len(results['recipe']['seeds'])} (made by `--redo {part}`)")
    model = build(family, depth, key if part == "heads" else 1, "full")
    model.load_state_dict(unstack(runs[depth]["weights"], seed))
    return model


def final_losses(results: dict, setting: str, family: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Each run's loss after its last layer, per depth: (means, standard errors), each (seeds, depths)."""
    return run_losses(results["models"][setting][family])


def run_losses(runs: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`final_losses` of any ``{depth: run}`` of the results (a family's, or a part of ``FULL_ATTENTION``'s,
    e.g. ``results["heads"][5]``): (means, standard errors), each (seeds, depths)."""
    depths = sorted(runs)
    return (torch.stack([runs[k]["mean"][:, -1] for k in depths], 1),
            torch.stack([runs[k]["stderr"][:, -1] for k in depths], 1))


def training_lengths(results: dict, part: str, key) -> tuple[list[int], torch.Tensor, torch.Tensor]:
    """A part of ``FULL_ATTENTION`` trained for several numbers of Adam steps (the shipped ``full_attention_steps``
    and those of ``results["full_attention_lengths"]``): ``(steps, means, stderrs)``, the steps ascending and each
    tensor (lengths, seeds, depths), the loss after the last layer on fresh tasks.  The depths are those of the
    shipped length; a length trained for some depths only (e.g. the deepest ones, trained longer) is NaN at the
    others."""
    if part not in FULL_ATTENTION:
        raise KeyError(f"unknown part {part!r}; choose one of {list(FULL_ATTENTION)}")
    trained = {results["full_attention_steps"]: results[part], **{
        steps: parts[part] for steps, parts in results.get("full_attention_lengths", {}).items() if part in parts}}
    if key not in trained[results["full_attention_steps"]]:
        raise KeyError(f"no {part!r} runs with key {key!r} in these results; "
                       f"choose one of {list(FULL_ATTENTION[part][1])}")
    depths = sorted(trained[results["full_attention_steps"]][key])
    steps = sorted(length for length, runs in trained.items() if key in runs)
    means = torch.full((len(steps), len(results["recipe"]["seeds"]), len(depths)), math.nan, dtype=torch.float64)
    stderrs = means.clone()
    for row, length in enumerate(steps):
        runs = trained[length][key]
        for column, depth in enumerate(depths):
            if depth in runs:
                means[row, :, column] = runs[depth]["mean"][:, -1]
                stderrs[row, :, column] = runs[depth]["stderr"][:, -1]
    return steps, means, stderrs


def longest_training(results: dict, part: str, key) -> tuple[list[int], torch.Tensor, torch.Tensor, torch.Tensor]:
    """Each depth of a part of ``FULL_ATTENTION`` after its longest training (some depths were trained longer than
    others): ``(steps, means, stderrs, change)``, ``steps`` per depth, ``means`` and ``stderrs`` (seeds, depths) the
    loss after the last layer on fresh tasks, and ``change`` (seeds, depths) its relative change from the training
    half as long, ``means / means at steps // 2 - 1`` (NaN where the file has no such training)."""
    lengths, means, stderrs = training_lengths(results, part, key)
    steps, rows = [], []
    for column in range(means.shape[-1]):
        row = max(index for index in range(len(lengths)) if not means[index, :, column].isnan().any())
        steps.append(lengths[row])
        rows.append(row)
    columns = torch.arange(means.shape[-1])
    longest, errors = means[rows, :, columns].T, stderrs[rows, :, columns].T
    half = torch.stack([means[lengths.index(length // 2), :, column] if length // 2 in lengths
                        else torch.full_like(means[0, :, column], math.nan) for column, length in enumerate(steps)], 1)
    return steps, longest, errors, longest / half - 1


def late_fall(runs: dict, share: float = 0.25) -> torch.Tensor:
    """How much each run's fresh-task training curve fell over the last ``share`` of its training, (seeds, depths):
    ``curve[start of that stretch] / curve[end] - 1`` (0 for a flat curve; the sign says which way it moved)."""
    depths = sorted(runs)
    backs = {k: round((runs[k]["curve"].shape[-1] - 1) * share) + 1 for k in depths}   # depths may train apart
    return torch.stack([runs[k]["curve"][:, -backs[k]] / runs[k]["curve"][:, -1] - 1 for k in depths], 1)



def loss_band(results: dict, setting: str, name: str, width: float = 4.0) -> tuple[torch.Tensor, torch.Tensor]:
    """``(low, high)`` per depth for a trained family or a baseline of ``results``: the lowest mean minus
    ``width`` standard errors and the highest mean plus ``width`` standard errors over the seeds (one run for a
    baseline).  One curve is below another, beyond sampling error and seed spread, where its ``high`` is below
    the other's ``low``."""
    if name in MODELS:
        means, errors = final_losses(results, setting, name)
    elif name in BASELINES:
        depths = len(results["recipe"]["depths"])
        curve = results["baselines"][setting][name]
        means, errors = curve["mean"][None, :depths], curve["stderr"][None, :depths]
    else:
        raise KeyError(f"unknown family or baseline {name!r}; choose one of {list(MODELS) + list(BASELINES)}")
    return (means - width * errors).min(0).values, (means + width * errors).max(0).values

if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description="train and score the models of chapter 5 (Dutta et al. 2024)")
    parser.add_argument("--out", default=str(PRETRAINED))
    parser.add_argument("--restart", action="store_true", help="train every model again (default: keep those in --out)")
    parser.add_argument("--redo", nargs="+", default=[], metavar="PART",
                        help="recompute only these parts of --out: baselines, small_batch, heads, quasi_newton "
                             "or a family of MODELS")
    parser.add_argument("--device", default="cpu",
                        help="where the models train: cpu (default; the shipped file was made there), cuda or auto")
    arguments = parser.parse_args()
    try:
        available_device(arguments.device)
    except ValueError as error:
        parser.error(str(error))
    torch.set_num_threads(1)
    begin = time.perf_counter()
    resumed = not arguments.restart and pathlib.Path(arguments.out).exists()
    before = load_experiments(arguments.out).get("seconds", {}) if resumed else {}
    output = run_experiments(arguments.out, resume=not arguments.restart, redo=arguments.redo, device=arguments.device)
    output["total_seconds"] = output.get("total_seconds", 0.0) + time.perf_counter() - begin
    computed = [part for part, seconds in output.get("seconds", {}).items() if before.get(part) != seconds]
    if resumed and computed:   # which parts a later run recomputed, with the command and its time
        output["redone"] = output.get("redone", []) + [
            {"command": COMMAND.split("   ")[0] + (f" --redo {' '.join(arguments.redo)}" if arguments.redo
                                                   else "   # resumed"),
             "parts": computed, "seconds": time.perf_counter() - begin}]
    torch.save(output, arguments.out)
    print(f"done in {time.perf_counter() - begin:.0f} s", flush=True)
