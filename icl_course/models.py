"""Linear self-attention, in the merged ``(P, Q)`` form of Vladymyrov et al. 2024, eq. (2)-(3).

One layer moves every token, the query included, by

    e_i <- e_i + sum_k P_k G Q_k e_i,      G = sum_{j <= n} e_j e_j^T   (context tokens only),

so within a layer all tokens move by the same matrix ``T = I + A`` with
``A = sum_k P_k G Q_k``.  Two consequences make the forward pass cheap:

* the context's Gram matrix evolves as ``G <- T G T^T``, so after the first layer the
  ``n`` tokens themselves are never needed again;
* the query starts as ``(x_t, 0)`` and is never read by the context, so its last
  coordinate after layer ``l`` is ``-<w^l, x_t>`` with ``w^l`` independent of ``x_t``:
  every model here is an implicit linear model (Vladymyrov et al. 2024, Theorem 4.1) and the loss
  averaged over the query is ``1/2 ||w^l - w||^2`` (for isotropic queries).

Parameterisations (all views of the same layer; see NOTATION.md):

========  ====================================================  ===========================
name      per head                                              parameters
========  ====================================================  ===========================
full      ``P, Q`` full ``(d+1) x (d+1)``                       ``P``, ``Q``: (H, d+1, d+1)
diag      ``P = diag(p_x I, p_y)``, ``Q = diag(q_x I, q_y)``    ``p``, ``q``: (H, 2)
gdpp      ``diag`` with ``q_y = 0`` (GD++)                      ``p``: (H, 2), ``q``: (H, 1)
gd        ``P = [[0,0],[0,p]]``, ``Q = [[Gamma,0],[0,0]]``      ``p``: (H,), ``Gamma``: (H, d, d)
========  ====================================================  ===========================
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
from torch import nn

from .data import TaskBatch, context_gram, context_of
from .runtime import check_count, make_generator, resolve_device, resolve_dtype

__all__ = [
    "PARAMETERIZATIONS",
    "LinearSelfAttention",
    "LinearTransformer",
    "ModelOutput",
    "next_gram",
    "gd_construction",
    "diagonal_construction",
    "build_model",
    "widen",
    "deepen",
]

PARAMETERIZATIONS = ("full", "diag", "gdpp", "gd")


def _check_parameterization(name: str) -> str:
    if name not in PARAMETERIZATIONS:
        raise ValueError(
            f"unknown parameterization {name!r}; choose one of {', '.join(PARAMETERIZATIONS)}"
        )
    return name


class LinearSelfAttention(nn.Module):
    """One residual linear self-attention layer with ``num_heads`` heads (Vladymyrov et al. 2024, eq. 3).

    Args:
        d: input dimension; tokens have ``d + 1`` coordinates.
        num_heads: ``H``.
        parameterization: one of ``"full"``, ``"diag"``, ``"gdpp"``, ``"gd"``.
        init_scale: standard deviation of the Gaussian initialisation of every parameter.
        generator: CPU ``torch.Generator`` for the initialisation.
    """

    def __init__(self, d: int, num_heads: int = 1, parameterization: str = "full",
                 init_scale: float = 0.02, generator: Optional[torch.Generator] = None,
                 dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu"):
        super().__init__()
        self.d = d
        self.num_heads = num_heads
        self.parameterization = _check_parameterization(parameterization)
        generator = make_generator(generator)
        D, H = d + 1, num_heads
        shapes = {
            "full": {"P": (H, D, D), "Q": (H, D, D)},
            "diag": {"p": (H, 2), "q": (H, 2)},
            "gdpp": {"p": (H, 2), "q": (H, 1)},
            "gd": {"p": (H,), "Gamma": (H, d, d)},
        }[parameterization]
        for name, shape in shapes.items():
            values = torch.randn(shape, generator=generator, dtype=torch.float64) * init_scale
            self.register_parameter(name, nn.Parameter(values.to(device=device, dtype=dtype)))

    @classmethod
    def from_matrices(cls, P: torch.Tensor, Q: torch.Tensor) -> "LinearSelfAttention":
        """A ``full`` layer with the given merged matrices: (D, D) for one head or (H, D, D).

        The layer takes the dtype and device of ``P``; ``d = D - 1``.
        """
        P, Q = torch.as_tensor(P), torch.as_tensor(Q)
        if P.dim() == 2:
            P, Q = P.unsqueeze(0), Q.unsqueeze(0) if Q.dim() == 2 else Q
        if P.dim() != 3 or P.shape != Q.shape or P.shape[1] != P.shape[2]:
            raise ValueError(f"P and Q must both have shape (D, D) or (H, D, D); "
                             f"got {tuple(P.shape)} and {tuple(Q.shape)}")
        layer = cls(P.shape[1] - 1, P.shape[0], "full", init_scale=0.0, dtype=P.dtype, device=P.device)
        with torch.no_grad():
            layer.P.copy_(P)
            layer.Q.copy_(Q.to(P))
        return layer

    # -- views of the parameters -------------------------------------------------------

    def head_matrices(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Every head's merged matrices ``(P, Q)``, each of shape (H, d+1, d+1)."""
        d, H = self.d, self.num_heads
        if self.parameterization == "full":
            return self.P, self.Q
        if self.parameterization == "gd":
            P = self.p.new_zeros(H, d + 1, d + 1)
            Q = self.p.new_zeros(H, d + 1, d + 1)
            P[:, d, d] = self.p
            Q[:, :d, :d] = self.Gamma
            return P, Q
        p_diagonal, q_diagonal = self._diagonals()
        return torch.diag_embed(p_diagonal), torch.diag_embed(q_diagonal)

    def _diagonals(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(H, d+1) diagonals ``(p_x, ..., p_x, p_y)`` and ``(q_x, ..., q_x, q_y)``."""
        d = self.d
        q = self.q if self.parameterization == "diag" else torch.cat([self.q, torch.zeros_like(self.q)], -1)
        expand = torch.tensor([0] * d + [1], device=self.p.device)
        return self.p[:, expand], q[:, expand]

    def diagonal_weights(self) -> dict[str, torch.Tensor]:
        """The four weights of a ``diag``/``gdpp`` layer (Vladymyrov et al. 2024, section 5.2).

        ``w_xx = sum_k p_x q_x``, ``w_xy = sum_k p_x q_y``, ``w_yx = sum_k p_y q_x``,
        ``w_yy = sum_k p_y q_y`` (sums over heads), each a 0-dimensional tensor.
        """
        if self.parameterization not in ("diag", "gdpp"):
            raise ValueError(
                f"diagonal_weights() needs a 'diag' or 'gdpp' layer, this one is {self.parameterization!r}"
            )
        p_diagonal, q_diagonal = self._diagonals()
        d = self.d
        pair = lambda i, j: (p_diagonal[:, i] * q_diagonal[:, j]).sum()  # noqa: E731
        return {"w_xx": pair(0, 0), "w_xy": pair(0, d), "w_yx": pair(d, 0), "w_yy": pair(d, d)}

    # -- the layer ---------------------------------------------------------------------

    def mixing(self, gram: torch.Tensor) -> torch.Tensor:
        """``A = sum_k P_k G Q_k`` for a batch of Gram matrices: (B, d+1, d+1) -> (B, d+1, d+1).

        Each parameterisation takes its cheapest exact route: ``diag`` and ``gdpp`` are an
        elementwise product ``G * (sum_k p_k q_k^T)``; ``gd`` writes only the last row;
        ``full`` contracts ``G`` with the operator ``sum_k P_k (x) Q_k`` in one matrix
        product, which beats per-head batched products of small matrices on a CPU.
        """
        d, D = self.d, self.d + 1
        if self.parameterization in ("diag", "gdpp"):
            p_diagonal, q_diagonal = self._diagonals()
            return gram * (p_diagonal.T @ q_diagonal)
        if self.parameterization == "gd":
            alpha = gram[:, d, :d]
            last_row = alpha @ torch.einsum("h,hij->ij", self.p, self.Gamma)
            top = gram.new_zeros(gram.shape[0], d, D)
            bottom = torch.cat([last_row, gram.new_zeros(gram.shape[0], 1)], dim=-1)
            return torch.cat([top, bottom.unsqueeze(1)], dim=1)
        # A[b, i, l] = sum_{j, k} G[b, j, k] * sum_h P[h, i, j] Q[h, k, l]
        operator = torch.einsum("hij,hkl->jkil", self.P, self.Q).reshape(D * D, D * D)
        return (gram.reshape(-1, D * D) @ operator).reshape(-1, D, D)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """Apply the layer to explicit tokens: (B, n+1, d+1) -> (B, n+1, d+1).

        The last token is the query: it is moved but never read.
        """
        context = tokens[:, :-1]
        gram = context.transpose(-1, -2) @ context
        return tokens + tokens @ self.mixing(gram).transpose(-1, -2)

    def extra_repr(self) -> str:
        return f"d={self.d}, num_heads={self.num_heads}, parameterization={self.parameterization!r}"


@dataclass
class ModelOutput:
    """What a :class:`LinearTransformer` returns for a batch of ``B`` tasks and ``L`` layers.

    Attributes:
        layer_weights: (B, L, d) the implicit linear model ``w^l`` after each layer, so that
            the query's last coordinate is ``-<w^l, x_t>`` (Vladymyrov et al. 2024, Theorem 4.1).
        layer_predictions: (B, L) the prediction ``-y_t^l = <w^l, x_t>`` after each layer,
            or None when no query was given.
    """

    layer_weights: torch.Tensor
    layer_predictions: Optional[torch.Tensor]

    @property
    def weights(self) -> torch.Tensor:
        """The last layer's ``w^L``, (B, d)."""
        return self.layer_weights[:, -1]

    @property
    def prediction(self) -> torch.Tensor:
        """The model's prediction ``y_hat = -y_t^L``, (B,)."""
        if self.layer_predictions is None:
            raise ValueError("no query was given, so there is no prediction; pass x_t or a TaskBatch")
        return self.layer_predictions[:, -1]


def next_gram(gram: torch.Tensor, mixing: torch.Tensor) -> torch.Tensor:
    """The context's Gram matrix after a layer: ``G <- (I + T) G (I + T)^T``.

    Every token moves by the same matrix ``I + T`` with ``T = sum_k P_k G Q_k`` (the layer's
    ``mixing``), so the Gram matrix of the moved context tokens is this product: the forward
    pass never needs the tokens themselves.  Shapes: (B, D, D), (B, D, D) -> (B, D, D).
    """
    moved = gram + mixing @ gram
    return moved + moved @ mixing.transpose(-1, -2)


class LinearTransformer(nn.Module):
    """A stack of ``num_layers`` linear self-attention layers (no MLP, no LayerNorm).

    Call it on a :class:`~icl_course.data.TaskBatch` (or on ``X`` (B, n, d), ``y`` (B, n)
    and optionally ``x_t`` (B, d)) to get a :class:`ModelOutput` with every layer's implicit
    weights and prediction.  ``transform_tokens`` runs the same layers on explicit tokens.

    >>> model = LinearTransformer(d=10, num_layers=3, parameterization="diag")
    """

    def __init__(self, d: int, num_layers: int = 1, num_heads: int = 1,
                 parameterization: str = "full", init_scale: float = 0.02, seed: int = 0,
                 dtype: str | torch.dtype = torch.float32, device: str | torch.device = "auto"):
        super().__init__()
        for name, value in (("d", d), ("num_layers", num_layers), ("num_heads", num_heads)):
            check_count(value, name)
        _check_parameterization(parameterization)
        self.d = d
        self.config = {
            "d": d, "num_layers": num_layers, "num_heads": num_heads,
            "parameterization": parameterization, "init_scale": float(init_scale), "seed": seed,
            "dtype": str(resolve_dtype(dtype)).replace("torch.", ""),
        }
        generator = make_generator(seed)
        dtype, device = resolve_dtype(dtype), resolve_device(device)
        self.layers = nn.ModuleList(
            LinearSelfAttention(d, num_heads, parameterization, init_scale, generator, dtype, device)
            for _ in range(num_layers)
        )

    @property
    def num_layers(self) -> int:
        """``L``, the number of layers."""
        return len(self.layers)

    @property
    def dtype(self) -> torch.dtype:
        """The floating dtype of the weights (tasks must have the same)."""
        return next(self.parameters()).dtype

    @property
    def device(self) -> torch.device:
        """Where the weights live (tasks must live there too)."""
        return next(self.parameters()).device

    def _check_inputs(self, X: torch.Tensor, y: torch.Tensor, x_t: Optional[torch.Tensor]) -> None:
        if X.dim() != 3 or y.dim() != 2 or X.shape[:2] != y.shape:
            raise ValueError(
                f"expected X of shape (B, n, d) and y of shape (B, n); got X {tuple(X.shape)} "
                f"and y {tuple(y.shape)}"
            )
        if X.shape[2] != self.d:
            raise ValueError(f"this model was built for d={self.d}, but the tasks have d={X.shape[2]}")
        if x_t is not None and x_t.shape != (X.shape[0], self.d):
            raise ValueError(f"expected x_t of shape ({X.shape[0]}, {self.d}), got {tuple(x_t.shape)}")
        if X.dtype != self.dtype or X.device != self.device:
            raise ValueError(
                f"the tasks are {X.dtype} on {X.device} but the model is {self.dtype} on "
                f"{self.device}; sample with the same dtype and device, or use batch.to(...)"
            )

    def forward(self, batch: TaskBatch | torch.Tensor, y: Optional[torch.Tensor] = None,
                x_t: Optional[torch.Tensor] = None) -> ModelOutput:
        """Every layer's implicit weights ``w^l`` and predictions.

        Shapes: a batch of B tasks (or ``X`` (B, n, d), ``y`` (B, n), ``x_t`` (B, d)) ->
        :class:`ModelOutput` with ``layer_weights`` (B, L, d) and ``layer_predictions`` (B, L).
        Works on the (B, d+1, d+1) Gram matrix: ``G <- T G T^T``, query map ``E <- T E``.
        """
        X, y, x_t = context_of(batch, y, x_t)
        self._check_inputs(X, y, x_t)
        d = self.d
        gram = context_gram(X, y)
        # query_map maps x_t to the query token: it starts as [I_d; 0] and is multiplied by T.
        query_map = torch.eye(d + 1, d, dtype=X.dtype, device=X.device).expand(X.shape[0], -1, -1)
        layer_weights = []
        for layer in self.layers:
            mixing = layer.mixing(gram)
            query_map = query_map + mixing @ query_map
            gram = next_gram(gram, mixing)
            layer_weights.append(-query_map[:, d, :])
        weights = torch.stack(layer_weights, dim=1)
        predictions = None if x_t is None else (weights @ x_t.unsqueeze(-1)).squeeze(-1)
        return ModelOutput(layer_weights=weights, layer_predictions=predictions)

    def final_weights(self, batch: TaskBatch | torch.Tensor, y: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Only the last layer's ``w^L``, (B, d): the same numbers as ``forward(...).weights``, faster.

        Training needs nothing else, so this path skips the per-layer query maps: it keeps
        each layer's ``A_l``, skips the last Gram update, and reads the last row of
        ``T_L ... T_1`` with row-vector products, ``r <- r (I + A_l)`` from ``l = L`` down.
        """
        X, y, _ = context_of(batch, y)
        self._check_inputs(X, y, None)
        gram = context_gram(X, y)
        mixings = []
        for index, layer in enumerate(self.layers):
            mixings.append(layer.mixing(gram))
            if index + 1 < len(self.layers):
                gram = next_gram(gram, mixings[-1])
        row = mixings[-1][:, self.d]  # e_D^T (I + A_L) - e_D^T, kept without the identity
        row = row + torch.nn.functional.one_hot(torch.tensor(self.d), self.d + 1).to(row)
        for mixing in reversed(mixings[:-1]):
            row = row + (row.unsqueeze(-1) * mixing).sum(-2)
        return -row[:, : self.d]

    def transform_tokens(self, tokens: torch.Tensor) -> list[torch.Tensor]:
        """Run the layers on explicit tokens; returns ``L + 1`` tensors (B, n+1, d+1), input first.

        Slower than :meth:`forward` but shows every token: after a GD layer the context
        labels hold their residuals (chapter 1).
        """
        if tokens.dim() != 3 or tokens.shape[2] != self.d + 1:
            raise ValueError(f"expected tokens of shape (B, n+1, {self.d + 1}), got {tuple(tokens.shape)}")
        history = [tokens]
        for layer in self.layers:
            history.append(layer(history[-1]))
        return history

    def extra_repr(self) -> str:
        config = self.config
        return f"d={config['d']}, num_layers={config['num_layers']}, parameterization={config['parameterization']!r}"


def build_model(config: dict, device: str | torch.device = "auto") -> LinearTransformer:
    """Rebuild a model from its ``config`` dict (as saved in a checkpoint); weights are fresh."""
    known = {"d", "num_layers", "num_heads", "parameterization", "init_scale", "seed", "dtype"}
    unknown = set(config) - known
    if unknown:
        raise ValueError(f"unknown model configuration keys {sorted(unknown)}; expected {sorted(known)}")
    return LinearTransformer(**config, device=device)


#: each parameterisation holds the one before it: GD++ is Diag with ``q_y = 0``, Diag is Full with
#: diagonal blocks ``P = diag(p_x I, p_y)``, ``Q = diag(q_x I, q_y)``
NESTED = ("gdpp", "diag", "full")


def widen(model: LinearTransformer, parameterization: str) -> LinearTransformer:
    """The same function in a larger parameterisation (``gdpp`` -> ``diag`` -> ``full``).

    The returned model computes exactly what ``model`` computes (to rounding) and has the same
    shape, dtype and device; training it can then use the freedom the smaller one lacked
    (Vladymyrov et al. 2024, section 5: Diag adds the ``w_xy``/``w_yy`` terms GD++ lacks).
    """
    source = model.config["parameterization"]
    if source not in NESTED or parameterization not in NESTED \
            or NESTED.index(parameterization) < NESTED.index(source):
        raise ValueError(f"a {source!r} model cannot be widened to {parameterization!r}; "
                         f"each of {' -> '.join(NESTED)} holds only the ones before it")
    config = dict(model.config, parameterization=parameterization, init_scale=0.0)
    wide = LinearTransformer(**config, device=model.device)
    with torch.no_grad():
        for small, big in zip(model.layers, wide.layers):
            if parameterization == "full":
                P, Q = small.head_matrices()
                big.P.copy_(P)
                big.Q.copy_(Q)
            else:
                big.p.copy_(small.p)
                q_y = [torch.zeros_like(small.q)] if source != parameterization else []   # GD++: q_y = 0
                big.q.copy_(torch.cat([small.q] + q_y, -1))
    return wide


def deepen(model: LinearTransformer, position: int, q_scale: float = 0.05) -> LinearTransformer:
    """The same function with one more layer, inserted before layer ``position``.

    The new layer has ``p = 0`` (``P = 0``), so its update ``sum_k P_k G Q_k`` is zero: it passes the
    tokens through and every other layer sees what it saw before.  Its ``q`` (``Q``) is ``q_scale`` times
    the identity pattern, so the gradient with respect to ``p`` is not zero and training can put the layer
    to use.  ``position`` runs from 0 (a new first layer) to ``L - 1`` (just before the last layer); it
    cannot follow the last layer, whose update carries the prediction.  For ``gdpp``, ``diag`` and
    ``full`` models; the result has ``L + 1`` layers and the dtype and device of ``model``.
    """
    source = model.config["parameterization"]
    if source not in NESTED:
        raise ValueError(f"deepen takes a {', '.join(NESTED)} model, not {source!r}")
    num_layers = model.num_layers
    if isinstance(position, bool) or not isinstance(position, int) or not 0 <= position < num_layers:
        raise ValueError(f"position must be 0..{num_layers - 1} for a {num_layers}-layer model (a layer after "
                         f"the last one would change the prediction); got {position!r}")
    config = dict(model.config, num_layers=num_layers + 1, init_scale=0.0)
    deeper = LinearTransformer(**config, device=model.device)
    kept = list(model.layers)
    with torch.no_grad():
        for index, layer in enumerate(deeper.layers):
            if index == position:
                for name, value in layer.named_parameters():
                    if name in ("Q", "q"):
                        value.copy_(torch.eye(value.shape[-1]).expand_as(value) * q_scale if name == "Q"
                                    else torch.full_like(value, q_scale))
                continue
            layer.load_state_dict(kept.pop(0).state_dict())
    return deeper


def gd_construction(d: int, n: int, eta: float, num_layers: int = 1, preconditioner=None,
                    dtype: str | torch.dtype = torch.float64,
                    device: str | torch.device = "cpu") -> LinearTransformer:
    """Weights that make a linear transformer run ``num_layers`` steps of gradient descent.

    The loss is ``L(w) = 1/(2n) sum_i (<w, x_i> - y_i)^2`` from ``w_0 = 0`` with step ``eta``
    (von Oswald et al. 2023, Proposition 1; chapter 1): every layer has
    ``Q = [[Gamma, 0], [0, 0]]`` and ``P = [[0, 0], [0, -eta/n]]`` with ``Gamma = I`` (or
    ``Gamma = preconditioner^T`` for the step ``w <- w - eta * preconditioner @ grad L``).
    Each layer turns every context label into its residual ``y_i - <w^l, x_i>``.

    Shapes: ``preconditioner`` (d, d) or None.  Returns a ``"gd"`` :class:`LinearTransformer`.
    """
    check_count(n, "n")
    model = LinearTransformer(d, num_layers, 1, "gd", init_scale=0.0, dtype=dtype, device=device)
    gamma = torch.eye(d, dtype=torch.float64) if preconditioner is None else \
        torch.as_tensor(preconditioner, dtype=torch.float64).T
    if gamma.shape != (d, d):
        raise ValueError(f"preconditioner must have shape ({d}, {d}), got {tuple(gamma.shape)}")
    with torch.no_grad():
        for layer in model.layers:
            layer.p.fill_(-eta / n)
            layer.Gamma.copy_(gamma.unsqueeze(0))
    return model


def diagonal_construction(d: int, layers: list, dtype: str | torch.dtype = torch.float64,
                          device: str | torch.device = "cpu") -> LinearTransformer:
    """A ``diag`` model with the four weights of every layer set by hand (Vladymyrov et al. 2024, section 5.2).

    ``layers`` holds one dict per layer with any of ``w_xx, w_xy, w_yx, w_yy`` (missing ones are 0).
    One head has rank-one weights ``w_ab = p_a q_b``, so two heads are used: head 1 has
    ``p = (1, 0)``, ``q = (w_xx, w_xy)`` and head 2 ``p = (0, 1)``, ``q = (w_yx, w_yy)``.
    Returns a 2-head ``diag`` :class:`LinearTransformer` with ``len(layers)`` layers.
    """
    names = ("w_xx", "w_xy", "w_yx", "w_yy")
    for index, weights in enumerate(layers):
        unknown = set(weights) - set(names)
        if unknown:
            raise ValueError(f"layer {index}: unknown weights {sorted(unknown)}; the four are {names}")
    model = LinearTransformer(d, len(layers), 2, "diag", init_scale=0.0, dtype=dtype, device=device)
    with torch.no_grad():
        for layer, weights in zip(model.layers, layers):
            value = {name: float(weights.get(name, 0.0)) for name in names}
            layer.p.copy_(torch.tensor([[1.0, 0.0], [0.0, 1.0]], dtype=torch.float64))
            q_rows = [[value["w_xx"], value["w_xy"]], [value["w_yx"], value["w_yy"]]]
            layer.q.copy_(torch.tensor(q_rows, dtype=torch.float64))
    return model
