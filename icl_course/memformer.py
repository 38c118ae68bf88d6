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
* ``memory="none"``: the plain linear transformer ``Z_{l+1} = Z_l + Attn_l(Z_l)``.

Attention per head (``attention=``): ``"identity"`` (``A_l = I``, nothing learned: GD directions),
``"gd"`` (a learned ``A_l`` per head) or ``"full"`` (full ``P_k, Q_k``).  In the GD form the heads
only add up, ``sum_k A_k``, to one preconditioner; full heads are a sum of ``H`` different bilinear
maps of the Gram matrix, which one head cannot write.

Everything runs batched over tasks.  The context columns are kept explicitly (an LFOM gate may
treat each column differently, so they do not all move by one matrix); the query column is kept as
a linear map of ``x_t``, so every model returns its implicit linear model ``w^l`` after each layer
(prediction ``<w^l, x_t> = -`` the query's label slot), as :class:`~icl_course.models.ModelOutput`.
"""

from __future__ import annotations

import ast
from typing import Optional

import torch
from torch import nn

from .data import TaskBatch, check_context, context_of
from .models import ModelOutput
from .runtime import check_count, make_generator, resolve_device, resolve_dtype

__all__ = ["ATTENTIONS", "MEMORIES", "Memformer", "cg_coefficients", "momentum_coefficients", "run_experiments",
           "load_experiments", "load_model", "eval_count", "covariance", "show_coefficients", "coefficient_explorer"]

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
        memory: ``"none"``, ``"cgd"`` or ``"lfom"``; ``tied`` ties the LFOM gates over layers.
        init_step: ``A_l`` starts at ``init_step / H`` times the identity (``"gd"``); ``alpha_l``
            starts at ``init_step`` when ``attention="identity"``, else at 1.
        init_scale: standard deviation of the noise added to every initial value.

    Call it on a :class:`~icl_course.data.TaskBatch` (or ``X``, ``y``, ``x_t``).  ``alpha`` and
    ``gamma`` (each (L,) or (B, L)) replace the learned scalars of a CGD-like model for one call,
    for instance by each task's own CG coefficients.
    """

    def __init__(self, d: int, n: int, num_layers: int = 1, num_heads: int = 1, attention: str = "gd",
                 memory: str = "cgd", tied: bool = True, init_step: float = 0.2, init_scale: float = 0.0,
                 seed: int = 0, dtype: str | torch.dtype = torch.float32, device: str | torch.device = "cpu"):
        super().__init__()
        for name, value in (("d", d), ("n", n), ("num_layers", num_layers), ("num_heads", num_heads)):
            check_count(value, name)
        if attention not in ATTENTIONS:
            raise ValueError(f"unknown attention {attention!r}; choose one of {', '.join(ATTENTIONS)}")
        if memory not in MEMORIES:
            raise ValueError(f"unknown memory {memory!r}; choose one of {', '.join(MEMORIES)}")
        if attention == "identity" and num_heads != 1:
            raise ValueError("attention='identity' has nothing to learn per head; use num_heads=1")
        self.d, self.n, self.attention, self.memory, self.tied = d, n, attention, memory, bool(tied)
        self.config = dict(d=d, n=n, num_layers=num_layers, num_heads=num_heads, attention=attention,
                           memory=memory, tied=bool(tied), init_step=float(init_step),
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
            shape = (L, D, n + 1) if tied else (L, L, D, n + 1)
            base = torch.ones(shape, dtype=torch.float64)
            if not tied:  # start as plain GD: Gamma_l^(l) = 1, older updates gated off
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
        """``Gamma_j^(l)`` (0-based ``j <= layer``), shape (d+1, n+1); tied gates ignore ``layer``."""
        if self.memory != "lfom":
            raise ValueError("only memory='lfom' has gates")
        if not 0 <= j <= layer < self.num_layers:
            raise ValueError(f"need 0 <= j <= layer < {self.num_layers}, got j={j}, layer={layer}")
        return self.gates[j] if self.tied else self.gates[layer, j]

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
                x_t: Optional[torch.Tensor] = None, alpha=None, gamma=None) -> ModelOutput:
        """Every layer's implicit weights ``w^l`` (B, L, d) and predictions (B, L) (None without ``x_t``)."""
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
        weights = torch.stack(layer_weights, dim=1)
        predictions = None if x_t is None else (weights @ x_t.unsqueeze(-1)).squeeze(-1)
        return ModelOutput(layer_weights=weights, layer_predictions=predictions)

    def final_weights(self, batch: TaskBatch | torch.Tensor, y: Optional[torch.Tensor] = None) -> torch.Tensor:
        """The last layer's ``w^L``, (B, d) (what :func:`~icl_course.train.train` fits)."""
        return self.forward(batch, y).weights

    def extra_repr(self) -> str:
        c = self.config
        return (f"d={c['d']}, n={c['n']}, num_layers={c['num_layers']}, num_heads={c['num_heads']}, "
                f"attention={c['attention']!r}, memory={c['memory']!r}, tied={c['tied']}")


# -- the experiments of chapter 5, shipped as one file ------------------------------------------

SCALES = (1.0, 1.0, 0.5, 0.25, 1.0)   # Dutta et al.'s D; the inputs have covariance U D^2 U^T
MODELS = {  # name -> (attention, memory): the four trained families of chapter 5
    "linear transformer": ("gd", "none"),
    "CGD-like (scalars)": ("identity", "cgd"),
    "CGD-like + A_l": ("gd", "cgd"),
    "LFOM (tied gates)": ("gd", "lfom"),
}
RECIPE = {"d": 5, "n": 20, "depths": (1, 2, 3, 4, 5, 6), "rotations": (0, 1, 2, 3, 4), "isotropic_seeds": 2,
          "num_steps": 300, "batch_size": 500, "learning_rate": 0.02, "clip_norm": 1.0,
          "eval_tasks": 1_000_000, "shallow_eval_tasks": 100_000,
          "head_counts": (1, 2, 4), "head_layers": 2, "head_steps": 400}
PRETRAINED = __import__("pathlib").Path(__file__).resolve().parent / "pretrained" / "ch5_memformers.pt"
COMMAND = "python -m icl_course.memformer            # writes icl_course/pretrained/ch5_memformers.pt"


def rotation(seed: int) -> torch.Tensor:
    """A Haar-random orthogonal ``U`` (d = 5) from ``seed`` (QR of a Gaussian, signs fixed)."""
    gaussian = torch.randn(5, 5, generator=make_generator(seed), dtype=torch.float64)
    Q, R = torch.linalg.qr(gaussian)
    return Q * torch.sign(torch.diagonal(R))


def covariance(seed: Optional[int]) -> Optional[torch.Tensor]:
    """``S = U D^2 U^T`` with ``U = rotation(seed)``, or None (isotropic) for ``seed=None``."""
    if seed is None:
        return None
    U = rotation(seed)
    return U @ torch.diag(torch.tensor(SCALES, dtype=torch.float64) ** 2) @ U.T


def build(name: str, num_layers: int, num_heads: int = 1, attention: Optional[str] = None,
          seed: int = 0, device="cpu") -> Memformer:
    """One of the chapter's models (``MODELS``), untrained."""
    default_attention, memory = MODELS[name]
    return Memformer(RECIPE["d"], RECIPE["n"], num_layers, num_heads, attention or default_attention,
                     memory, init_scale=0.01, seed=seed, device=device)


def eval_count(depth: int) -> int:
    """Fresh tasks that score a model of ``depth`` layers: 1 000 000 from 3 layers on (heavy tails), else 100 000."""
    return RECIPE["eval_tasks"] if depth >= 3 else RECIPE["shallow_eval_tasks"]


def _score(model: Memformer, tasks, num_tasks: int, seed: int) -> list[tuple[float, float]]:
    from .evaluate import per_layer_loss

    return [(e.mean, e.stderr) for e in per_layer_loss(model, tasks, num_tasks=num_tasks, seed=seed)]


def _weights(model: Memformer) -> dict:
    return {k: v.detach().cpu() for k, v in model.state_dict().items()}


def run_experiments(path=PRETRAINED, device="auto", settings=("S", "I"), heads=True, resume=True) -> dict:
    """Train every model of chapter 5 and score it on fresh tasks; save the weights and the scores.

    For each data setting (``"S"``: the five rotations; ``"I"``: isotropic, two training seeds),
    each family in ``MODELS`` and each depth in ``RECIPE["depths"]`` (every depth is a model of its
    own): Adam on fresh batches, then per-layer losses on :func:`eval_count` fresh tasks (seeded
    apart from training).  Also the heads experiment (2 layers, scored on 1 000 000 tasks: its
    differences are small).  The file is rewritten after every model and,
    with ``resume=True``, models already in it are kept, so an interrupted run goes on where it
    stopped (every model has its own seeds, so the result does not depend on the interruption).
    """
    import pathlib

    from .data import RegressionTasks
    from .train import train

    device = resolve_device(device)
    r = RECIPE
    path = pathlib.Path(path)
    results = {"recipe": dict(r), "command": COMMAND, "models": {}, "losses": {}, "heads": {}}
    if resume and path.exists():
        done = load_experiments(path)
        if {k: v for k, v in done["recipe"].items() if k != "depths"} != {k: v for k, v in r.items() if k != "depths"}:
            raise ValueError(f"{path} was made with another recipe; pass resume=False (or another path) to start over")
        for part in ("models", "losses", "heads"):
            results[part].update(done[part])
    for setting in settings:
        for rot in (r["rotations"] if setting == "S" else r["rotations"][:r["isotropic_seeds"]]):
            tasks = RegressionTasks(r["d"], r["n"], covariance=covariance(rot if setting == "S" else None),
                                    device=device)
            for name in MODELS:
                for depth in r["depths"]:
                    key = str((setting, rot, name, depth))
                    if key in results["losses"]:
                        continue
                    model = build(name, depth, seed=rot, device=device)
                    train(model, tasks, r["num_steps"], batch_size=r["batch_size"], learning_rate=r["learning_rate"],
                          clip_norm=r["clip_norm"], seed=100 + rot, progress=False)
                    results["models"][key] = _weights(model)
                    results["losses"][key] = _score(model, tasks, eval_count(depth), seed=7_000 + rot)
                    torch.save(results, path)
                    print(key, f"{results['losses'][key][-1][0]:.4g}", flush=True)
    tasks = RegressionTasks(r["d"], r["n"], covariance=covariance(0), device=device)
    for attention in ("gd", "full") if heads else ():
        for count in r["head_counts"]:
            key = str((attention, count))
            if key in results["heads"]:
                continue
            model = build("linear transformer", r["head_layers"], count, attention, device=device)
            train(model, tasks, r["head_steps"], batch_size=r["batch_size"], learning_rate=r["learning_rate"] / 2,
                  clip_norm=r["clip_norm"], seed=300, progress=False)
            results["models"]["heads " + key] = _weights(model)
            results["heads"][key] = _score(model, tasks, r["eval_tasks"], seed=7_000)
            torch.save(results, path)
            print(key, f"{results['heads'][key][-1][0]:.4g}", flush=True)
    results["recipe"] = dict(r)
    torch.save(results, path)
    return results


def rescore_experiments(path=PRETRAINED, device="auto") -> dict:
    """Score the trained models of ``path`` again on :func:`eval_count` fresh tasks (the same seeds
    as :func:`run_experiments`), keeping their weights; rewrites the file.  Models of 3 layers and
    more have heavy-tailed errors, so the course scores them on a million tasks."""
    from .data import RegressionTasks

    device = resolve_device(device)
    r = RECIPE
    results = load_experiments(path)
    for key in list(results["losses"]):
        setting, rot, name, depth = ast.literal_eval(key)   # keys are tuples written as text
        tasks = RegressionTasks(r["d"], r["n"], covariance=covariance(rot if setting == "S" else None), device=device)
        model = load_model(results, setting, rot, name, depth).to(device)
        results["losses"][key] = _score(model, tasks, eval_count(depth), seed=7_000 + rot)
        print(key, f"{results['losses'][key][-1][0]:.4g} +- {results['losses'][key][-1][1]:.2g}", flush=True)
    tasks = RegressionTasks(r["d"], r["n"], covariance=covariance(0), device=device)
    for key in list(results["heads"]):
        attention, heads = ast.literal_eval(key)
        model = build("linear transformer", r["head_layers"], heads, attention, device=device)
        model.load_state_dict(results["models"]["heads " + key])
        results["heads"][key] = _score(model, tasks, r["eval_tasks"], seed=7_000)
    results["recipe"] = dict(results["recipe"], eval_tasks=r["eval_tasks"], shallow_eval_tasks=r["shallow_eval_tasks"])
    torch.save(results, path)
    return results


def load_experiments(path=PRETRAINED) -> dict:
    """The shipped results of :func:`run_experiments` (weights and scores), loaded as plain tensors,
    numbers and strings (nothing in the file runs)."""
    import pathlib

    path = pathlib.Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no chapter 5 results at {path}: make them with `{COMMAND.split('#')[0].strip()} "
                                f"--out {path}`")
    try:
        results = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:   # torch raises several types for a truncated or foreign file
        raise ValueError(f"{path} could not be read as chapter 5 results ({type(error).__name__}); it is damaged or "
                         "was not made by run_experiments. Delete it, or pass --restart, to train afresh.") from None
    if not isinstance(results, dict) or not {"recipe", "models", "losses", "heads"} <= set(results):
        raise ValueError(f"{path} is not a file of chapter 5 results (run_experiments writes recipe, models, losses "
                         "and heads). Delete it, or pass --restart, to train afresh.")
    return results


def load_model(results: dict, setting: str, rot: int, name: str, depth: int) -> Memformer:
    """A trained model of :func:`run_experiments`, rebuilt on the CPU."""
    key = str((setting, rot, name, depth))
    if key not in results["models"]:
        raise KeyError(f"no trained model {key} in these results: setting 'S' or 'I', a rotation of "
                       f"{tuple(results['recipe']['rotations'])}, a name of {list(MODELS)} and a depth of "
                       f"{tuple(results['recipe']['depths'])}")
    model = build(name, depth, seed=rot)
    model.load_state_dict(results["models"][key])
    return model


def show_coefficients(alpha=(0.5, 0.5, 0.5), gamma=(0.0, 0.3, 0.3), rot: Optional[int] = 0,
                      num_tasks: int = 4000, seed: int = 0):
    """A CGD-like Memformer (``A_l = I``) with the given ``alpha_l, gamma_l`` beside CG (chapter 5).

    Left: the loss after each layer, ``log10`` of ``1/2 E (w^l - w)^T S (w^l - w)``, against CG run on
    each task with its own coefficients.  Right: the chosen ``alpha_l`` (squares) and ``gamma_l``
    (triangles) over the middle 90% of CG's per-task ``a``, ``beta`` at the same step.  Returns the figure.
    """
    import matplotlib.pyplot as plt

    from .data import RegressionTasks
    from .evaluate import query_averaged_loss
    from .optimizers import conjugate_gradient

    L = len(alpha)
    tasks = RegressionTasks(RECIPE["d"], RECIPE["n"], covariance=covariance(rot), dtype=torch.float64, device="cpu")
    batch = tasks.sample(num_tasks, seed=seed)
    model = Memformer(RECIPE["d"], RECIPE["n"], L, attention="identity", memory="cgd", dtype=torch.float64)
    with torch.no_grad():
        ours = query_averaged_loss(model(batch, alpha=torch.tensor(alpha), gamma=torch.tensor(gamma)).layer_weights,
                                   batch).mean(0)
    cg = query_averaged_loss(conjugate_gradient(batch.X, batch.y, L)[:, 1:], batch).mean(0)
    a, beta = cg_coefficients(batch.X, batch.y, L)
    figure, (left, right) = plt.subplots(1, 2, figsize=(9.6, 3.4))
    layers = torch.arange(1, L + 1)
    left.plot(layers, ours.log10(), "o-", color="C1", label="Memformer (shared alpha, gamma)")
    left.plot(layers, cg.log10(), "s--", color="C0", label="CG (each task its own)")
    left.set(xlabel="layer / step l", ylabel="log10 loss", title="loss per layer")
    left.set_xticks(layers.tolist())
    left.legend()
    for values, chosen, offset, marker, name in ((a, alpha, -0.12, "s", "alpha / a"),
                                                 (beta, gamma, 0.12, "^", "gamma / beta")):
        low, high = values.quantile(0.05, dim=0), values.quantile(0.95, dim=0)
        right.vlines(layers + offset, low, high, color="0.6", lw=6)
        right.plot(layers + offset, chosen, marker, color="C1", label=name)
    right.set(xlabel="layer l", ylabel="coefficient", title="chosen vs CG's 5-95% range (grey)",
              xticks=layers.tolist())
    right.legend()
    figure.tight_layout()
    return figure


def coefficient_explorer(alpha=(0.5, 0.5, 0.5), gamma=(0.0, 0.3, 0.3)):
    """Sliders for three layers' ``alpha_l, gamma_l`` around :func:`show_coefficients`."""
    import ipywidgets as widgets

    from .widgets import explorer

    def show(**values):
        return show_coefficients([values[f"alpha_{k}"] for k in (1, 2, 3)],
                                 [values[f"gamma_{k}"] for k in (1, 2, 3)])

    controls = {f"alpha_{k}": widgets.FloatSlider(value=alpha[k - 1], min=0.0, max=3.0, step=0.05,
                                                  description=f"alpha_{k}") for k in (1, 2, 3)}
    controls.update({f"gamma_{k}": widgets.FloatSlider(value=gamma[k - 1], min=0.0, max=1.5, step=0.05,
                                                       description=f"gamma_{k}") for k in (1, 2, 3)})
    return explorer(show, **controls)


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description="train and score the models of chapter 5")
    parser.add_argument("--out", default=str(PRETRAINED))
    parser.add_argument("--settings", default="SI", help="S (rotated), I (isotropic) or both")
    parser.add_argument("--no-heads", action="store_true")
    parser.add_argument("--rescore", action="store_true", help="only score the models of --out again")
    parser.add_argument("--restart", action="store_true", help="train every model again (default: keep those in --out)")
    arguments = parser.parse_args()
    if arguments.rescore:
        rescore_experiments(arguments.out)
    else:
        run_experiments(arguments.out, settings=tuple(arguments.settings), heads=not arguments.no_heads,
                        resume=not arguments.restart)
