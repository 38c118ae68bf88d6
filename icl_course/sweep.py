"""Many linear transformers of the same shape trained as one.

A sweep such as Table 1 of Vladymyrov et al. (2024) is dozens of small models of one shape that
differ only in their noise law, seed and learning rate.  Trained one after another, each step of
each model is a handful of tiny operations, and the fixed cost of launching them dominates.  Here
every parameter carries a leading *model axis*: ``M`` models are one set of tensors of shape
``(M, L, H, ...)``, each model draws its own batch of tasks from its own noise law, and one
batched forward and backward pass per step trains them all.  Each model keeps its own learning-rate
schedule, its own gradient clipping and its own Adam state, so the result is what ``M`` separate
runs of Adam would give (the task stream differs, the algorithm does not).  The schedule, the spike rule and
the masked Adam step are :mod:`icl_course.trainer_core`'s, shared with :func:`icl_course.train.train`.

Models leave the stack when they finish (each may have its own number of steps) or diverge, and
the others go on.  Divergence is judged per model with a spike-tolerant rule: a step whose loss is
not finite, or larger than ``spike_factor`` times the model's running median, is *skipped* for that
model (no update, Adam state untouched) and counted; ``patience`` skipped steps in a row and the
model has diverged.  Deep models see single batches with one ill-conditioned task that spike the
loss by orders of magnitude; skipping them keeps good runs alive.  A skipped step leaves the weights
where they are, so a model that has drifted to weights where every batch breaks the rule can never get
past it.  With ``restarts`` such a model is not given up at once: it goes back to its state at the end
of its last healthy logging window (one whose last step, and at least half of its steps, were taken: in
deep noiseless models a batch with one rare task breaks the rule often, so windows without any skipped
step can be rare), with its weights, Adam moments and running median, and goes on at ``backoff`` times
its rate, up to ``restarts`` times.

The forward pass is the one of :class:`~icl_course.models.LinearTransformer`, on each task's
``(d+1) x (d+1)`` Gram matrix: ``A_l = sum_k P_k G Q_k``, ``G <- (I + A_l) G (I + A_l)^T``, and the
last row of ``(I + A_L) ... (I + A_1)`` gives the implicit weights ``w^L``.  The loss is the exact
query-averaged ``1/2 ||w^L - w||^2``.

>>> specs = [ModelSpec(f"m{s}", UniformNoise(s), seed=s, num_steps=500, learning_rate=3e-3) for s in range(8)]
>>> results = train_sweep(specs, d=10, n=20, num_layers=2, parameterization="diag")
>>> results["m3"].model          # a LinearTransformer, ready for icl_course.evaluate
"""

from __future__ import annotations

import os
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional, Sequence

import torch

from .checkpoints import CheckpointError
from .data import (
    STRETCH_FRACTION,
    STRETCH_SCALES,
    CategoricalNoise,
    FixedNoise,
    NoiseDistribution,
    UniformNoise,
    as_noise,
    stretch,
)
from .models import LinearTransformer
from .runtime import check_count, resolve_device, resolve_dtype
from .trainer_core import SCHEDULES, AdamState, adam_step, schedule_factor, spiked

__all__ = ["ModelSpec", "SweepResult", "ModelStack", "train_sweep", "SCHEDULES", "noise_key"]

SWEEP_FORMAT = "icl-course-sweep"
SWEEP_VERSION = 1


def noise_key(noise: NoiseDistribution) -> str:
    """A stable text form of a noise law, used to compare configurations."""
    if isinstance(noise, UniformNoise):
        return f"uniform:{noise.sigma_max:g}"
    if isinstance(noise, CategoricalNoise):
        return "categorical:" + ",".join(f"{level:g}" for level in noise.levels)
    if isinstance(noise, FixedNoise):
        return f"fixed:{noise.sigma:g}"
    raise TypeError(f"the sweep knows FixedNoise, UniformNoise and CategoricalNoise, not {noise!r}")


@dataclass
class ModelSpec:
    """One model of a sweep.

    Attributes:
        name: unique within the sweep; results are keyed by it.
        noise: the model's noise law (a number means a fixed ``sigma``).
        seed: the initialisation seed (the same weights as ``LinearTransformer(..., seed=seed)``).
        num_steps: optimiser steps for this model.
        learning_rate: Adam's base learning rate.
        warmup_steps: linear warm-up steps.
        schedule: ``"cosine"`` (decay to ``final_fraction`` of the rate at ``num_steps``) or ``"constant"``.
        init: optional weights to start from (a :class:`LinearTransformer` of the sweep's shape),
            for example a deeper model initialised from a trained shallower one.
        stretched: draw this model's context inputs as :class:`~icl_course.data.StretchedTasks` does (one
            direction of half the tasks stretched or shrunk on purpose) and weight each task's loss back by its
            ``importance_weight``: the same expected loss, but the rare ill-conditioned tasks that carry a deep
            noiseless model's tail are in every batch (on Table 1's noiseless column that does not remove the
            tail: research/README.md, ``noiseless_optimum.py``).
    """

    name: str
    noise: object
    seed: int = 0
    num_steps: int = 1000
    learning_rate: float = 1e-3
    warmup_steps: int = 0
    schedule: str = "cosine"
    init: Optional[LinearTransformer] = None
    stretched: bool = False

    def __post_init__(self):
        self.noise = as_noise(self.noise)
        noise_key(self.noise)
        check_count(self.num_steps, f"{self.name}: num_steps")
        check_count(self.warmup_steps, f"{self.name}: warmup_steps", minimum=0)
        if not (isinstance(self.learning_rate, (int, float)) and self.learning_rate > 0):
            raise ValueError(f"{self.name}: learning_rate must be positive, got {self.learning_rate!r}")
        if self.schedule not in SCHEDULES:
            raise ValueError(f"{self.name}: unknown schedule {self.schedule!r}; choose one of {', '.join(SCHEDULES)}")

    def key(self) -> dict:
        """What identifies this model's training (compared on resume)."""
        return {"name": self.name, "noise": noise_key(self.noise), "seed": self.seed,
                "num_steps": self.num_steps, "learning_rate": float(self.learning_rate),
                "warmup_steps": self.warmup_steps, "schedule": self.schedule,
                "init": None if self.init is None else "given",
                **({"stretched": True} if self.stretched else {})}   # a plain model's key is the one it always had


@dataclass
class SweepResult:
    """What the sweep hands back for one model."""

    name: str
    model: LinearTransformer
    status: str                      # "finished" or "diverged"
    steps: int                       # steps taken (== num_steps when finished)
    final_loss: float                # mean training loss over the last logging window
    wall_time: float                 # seconds from the sweep's start to the model leaving it
    history: list = field(default_factory=list)   # [(step, mean loss over the window)]
    skipped_steps: int = 0           # spikes skipped in total
    message: str = ""
    restarts: list = field(default_factory=list)   # [(step, the step it went back to, its rate factor after)]


class ModelStack:
    """``M`` linear transformers of one shape as tensors with a leading model axis.

    Parameters (``L`` layers, ``H`` heads, ``D = d + 1``): ``diag`` ``p, q`` (M, L, H, 2);
    ``gdpp`` ``p`` (M, L, H, 2), ``q`` (M, L, H, 1); ``full`` ``P, Q`` (M, L, H, D, D).
    """

    SHAPES = {"diag": ("p", "q"), "gdpp": ("p", "q"), "full": ("P", "Q")}

    def __init__(self, models: Sequence[LinearTransformer], dtype=torch.float32, device="cpu"):
        if not models:
            raise ValueError("a stack needs at least one model")
        config = models[0].config
        self.d, self.num_layers = config["d"], config["num_layers"]
        self.num_heads, self.parameterization = config["num_heads"], config["parameterization"]
        if self.parameterization not in self.SHAPES:
            raise ValueError(f"the sweep trains 'diag', 'gdpp' and 'full' models, not {self.parameterization!r}")
        for model in models:
            shape = {key: model.config[key] for key in ("d", "num_layers", "num_heads", "parameterization")}
            if shape != {key: config[key] for key in shape}:
                raise ValueError(f"every model of a stack must have the same shape; {shape} differs from the first")
        self.dtype, self.device = resolve_dtype(dtype), resolve_device(device)
        self.params = {}
        for name in self.SHAPES[self.parameterization]:
            per_model = [torch.stack([getattr(layer, name).detach().double() for layer in model.layers])
                         for model in models]
            self.params[name] = torch.stack(per_model).to(self.dtype).to(self.device).requires_grad_(True)
        self._expand = torch.tensor([0] * self.d + [1], device=self.device)

    @property
    def num_models(self) -> int:
        """How many models the stack holds now."""
        return next(iter(self.params.values())).shape[0]

    def select(self, keep: torch.Tensor) -> None:
        """Keep only the models at indices ``keep`` (a 1-d long tensor)."""
        keep = keep.to(self.device)
        self.params = {name: value.detach()[keep].clone().requires_grad_(True) for name, value in self.params.items()}

    def to_model(self, index: int, seed: int = 0) -> LinearTransformer:
        """Model ``index`` as a float64 CPU :class:`LinearTransformer`."""
        model = LinearTransformer(self.d, self.num_layers, self.num_heads, self.parameterization,
                                  init_scale=0.0, seed=seed, dtype=torch.float64, device="cpu")
        with torch.no_grad():
            for name, value in self.params.items():
                for layer, weights in zip(model.layers, value[index].detach().double().cpu()):
                    getattr(layer, name).copy_(weights)
        return model

    def mixing(self, layer: int, gram: torch.Tensor) -> torch.Tensor:
        """``A = sum_k P_k G Q_k`` for every model: gram (M, B, D, D) -> (M, B, D, D)."""
        D = self.d + 1
        if self.parameterization == "full":
            P, Q = self.params["P"][:, layer], self.params["Q"][:, layer]        # (M, H, D, D)
            operator = torch.einsum("mhij,mhkl->mjkil", P, Q).reshape(-1, D * D, D * D)
            M, B = gram.shape[:2]
            return torch.bmm(gram.reshape(M, B, D * D), operator).reshape(M, B, D, D)
        p, q = self.params["p"][:, layer], self.params["q"][:, layer]
        if self.parameterization == "gdpp":
            q = torch.cat([q, torch.zeros_like(q)], dim=-1)
        p_diagonal, q_diagonal = p[..., self._expand], q[..., self._expand]          # (M, H, D)
        weights = torch.einsum("mhi,mhj->mij", p_diagonal, q_diagonal)               # (M, D, D)
        return gram * weights.unsqueeze(1)

    def final_weights(self, gram: torch.Tensor) -> torch.Tensor:
        """Every model's ``w^L`` for its own tasks: gram (M, B, D, D) -> (M, B, d)."""
        d = self.d
        mixings = []
        for layer in range(self.num_layers):
            mixings.append(self.mixing(layer, gram))
            if layer + 1 < self.num_layers:
                moved = gram + mixings[-1] @ gram
                gram = moved + moved @ mixings[-1].transpose(-1, -2)
        row = mixings[-1][..., d, :].clone()
        row[..., d] += 1
        for mixing in reversed(mixings[:-1]):
            row = row + (row.unsqueeze(-1) * mixing).sum(-2)
        return -row[..., :d]


class _TaskStream:
    """Fresh tasks for every model of the stack, each from its own noise law, drawn on the device."""

    def __init__(self, noises: Sequence[NoiseDistribution], d: int, n: int, dtype, device, seed: int,
                 stretched: Sequence[bool] = ()):
        self.d, self.n, self.dtype, self.device = d, n, dtype, device
        self.generator = torch.Generator(device=device)
        self.generator.manual_seed(seed)
        self.set_noises(noises, stretched)

    @classmethod
    def for_specs(cls, specs: Sequence[ModelSpec], d: int, n: int, dtype, device, seed: int) -> "_TaskStream":
        """The stream of a sweep: each model's noise law, and whether its inputs are stretched."""
        return cls([spec.noise for spec in specs], d, n, dtype, device, seed, [spec.stretched for spec in specs])

    def set_noises(self, noises: Sequence[NoiseDistribution], stretched: Sequence[bool] = ()) -> None:
        """The active models' noise laws, and which of them draw stretched inputs (none by default)."""
        self.stretched = torch.tensor([bool(flag) for flag in stretched] or [False] * len(noises),
                                      dtype=torch.bool, device=self.device)
        width = max((len(noise.levels) if isinstance(noise, CategoricalNoise) else 1) for noise in noises)
        table, counts, uniform = [], [], []
        for noise in noises:
            if isinstance(noise, CategoricalNoise):
                levels = list(noise.levels)
            elif isinstance(noise, UniformNoise):
                levels = [noise.sigma_max]
            else:
                levels = [noise.sigma]
            counts.append(len(levels))
            table.append(levels + [0.0] * (width - len(levels)))
            uniform.append(isinstance(noise, UniformNoise))
        self.table = torch.tensor(table, dtype=self.dtype, device=self.device)
        self.counts = torch.tensor(counts, dtype=self.dtype, device=self.device)
        self.uniform = torch.tensor(uniform, device=self.device)

    def sample(self, batch_size: int):
        """(gram (M, B, D, D), w (M, B, d), weight (M, B)) for every model: a plain model's tasks weigh 1, a
        stretched one's their importance weights (:func:`~icl_course.data.stretch`)."""
        M, B, n, d = self.table.shape[0], batch_size, self.n, self.d
        options = {"generator": self.generator, "dtype": self.dtype, "device": self.device}
        u = torch.rand(M, B, **options)
        index = torch.minimum((u * self.counts[:, None]).long(), self.counts[:, None].long() - 1)
        categorical = torch.gather(self.table, 1, index)
        sigma = torch.where(self.uniform[:, None], u * self.table[:, :1], categorical)
        w = torch.randn(M, B, d, **options)
        X = torch.randn(M, B, n, d, **options)
        weight = torch.ones(M, B, dtype=self.dtype, device=self.device)
        if bool(self.stretched.any()):   # a stack without stretched models draws exactly what it always drew
            rows = self.stretched.nonzero().squeeze(-1)
            inputs, importance = stretch(X[rows].reshape(-1, n, d).double(), STRETCH_SCALES, STRETCH_FRACTION,
                                         self.generator)
            X = X.index_copy(0, rows, inputs.reshape(len(rows), B, n, d).to(self.dtype))
            weight = weight.index_copy(0, rows, importance.reshape(len(rows), B).to(self.dtype))
        y = (X @ w.unsqueeze(-1)).squeeze(-1) + sigma.unsqueeze(-1) * torch.randn(M, B, n, **options)
        tokens = torch.cat([X, y.unsqueeze(-1)], dim=-1)
        return tokens.transpose(-1, -2) @ tokens, w, weight


def _atomic_save(payload: dict, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    os.close(handle)
    try:
        torch.save(payload, temporary)
        os.replace(temporary, path)
    except OSError as error:
        raise OSError(f"could not write the sweep checkpoint {path} ({error.strerror or error}); the previous "
                      "checkpoint, if any, is unchanged. Free some disk space and run again to resume.") from error
    finally:
        if os.path.exists(temporary):
            os.remove(temporary)


class _SweepState:
    """A sweep in training: the stack, its task stream, and one row of state per model still in it.

    ``active`` are the spec indices of the models in the stack (all of them on a fresh start); every
    tensor but ``steps`` (per spec, CPU) has one row per active model.
    """

    def __init__(self, specs: Sequence[ModelSpec], stack: ModelStack, stream: _TaskStream, median_window: int,
                 backoff: float = 0.5):
        M, device = len(specs), stack.device
        self.backoff = backoff
        self.specs, self.stack, self.stream, self.median_window = list(specs), stack, stream, median_window
        self.active = list(range(M))
        self.steps = torch.zeros(M, dtype=torch.long)
        self.adam = AdamState.zeros(stack.params)
        self.recent = torch.full((M, median_window), float("nan"), dtype=torch.float64, device=device)
        self.bad_run = torch.zeros(M, dtype=torch.long, device=device)
        self.skipped = torch.zeros(M, dtype=torch.long, device=device)
        self.window_sum = torch.zeros(M, dtype=torch.float64, device=device)
        self.window_count = torch.zeros(M, dtype=torch.float64, device=device)
        self.window_bad = torch.zeros(M, dtype=torch.long, device=device)
        self.rate_factor = torch.ones(M, dtype=torch.float64, device=device)
        self.restarts = {spec.name: [] for spec in specs}
        self.histories = {spec.name: [] for spec in specs}
        self.snapshot = self.current_state()
        self.results: dict[str, SweepResult] = {}
        self.elapsed_before = 0.0
        self.started = time.perf_counter()
        self.refresh_schedule()

    def current_state(self) -> dict:
        """A copy of what a restart restores, for every active model: weights, Adam state, running median,
        and the step it was taken at."""
        return {"params": {name: value.detach().clone() for name, value in self.stack.params.items()},
                "adam": AdamState({k: v.clone() for k, v in self.adam.moments.items()},
                                  {k: v.clone() for k, v in self.adam.squares.items()}, self.adam.steps.clone()),
                "recent": self.recent.clone(), "step": self.steps[torch.tensor(self.active, dtype=torch.long)].clone()}

    def take_snapshot(self, rows: torch.Tensor) -> None:
        """Remember the state of the active models at ``rows`` ((M,) bool), for a restart to go back to."""
        self._copy_rows(rows, to_snapshot=True)

    def _copy_rows(self, rows: torch.Tensor, to_snapshot: bool) -> None:
        shot = self.snapshot
        pairs = [(shot["params"][name], value.data) for name, value in self.stack.params.items()]
        pairs += [(shot["adam"].moments[name], self.adam.moments[name]) for name in self.adam.moments]
        pairs += [(shot["adam"].squares[name], self.adam.squares[name]) for name in self.adam.squares]
        pairs += [(shot["adam"].steps, self.adam.steps), (shot["recent"], self.recent)]
        with torch.no_grad():
            for saved, live in pairs:
                mask = rows.view((-1,) + (1,) * (live.dim() - 1))
                if to_snapshot:
                    saved.copy_(torch.where(mask, live, saved))
                else:
                    live.copy_(torch.where(mask, saved, live))
        if to_snapshot:
            now = self.steps[torch.tensor(self.active, dtype=torch.long)]
            shot["step"] = torch.where(rows.cpu(), now, shot["step"])

    def restart(self, positions: list) -> None:
        """Send the models at ``positions`` back to their snapshot, at ``backoff`` times their rate."""
        rows = torch.zeros(len(self.active), dtype=torch.bool, device=self.stack.device)
        rows[positions] = True
        self._copy_rows(rows, to_snapshot=False)
        self.bad_run = torch.where(rows, torch.zeros_like(self.bad_run), self.bad_run)
        self.rate_factor = torch.where(rows, self.rate_factor * self.backoff, self.rate_factor)
        for position in positions:
            i = self.active[position]
            self.restarts[self.specs[i].name].append(
                (int(self.steps[i]), int(self.snapshot["step"][position]), float(self.rate_factor[position])))

    def elapsed(self) -> float:
        return self.elapsed_before + time.perf_counter() - self.started

    def refresh_schedule(self) -> None:
        """The active models' schedules as (M,) tensors."""
        chosen, device = [self.specs[i] for i in self.active], self.stack.device
        self.base_rate, self.total_steps, self.warmup = (
            torch.tensor(values, dtype=torch.float64, device=device)
            for values in ([s.learning_rate for s in chosen], [s.num_steps for s in chosen],
                           [s.warmup_steps for s in chosen]))
        self.cosine = torch.tensor([s.schedule == "cosine" for s in chosen], device=device)

    def step(self, batch_size: int, clip_norm: Optional[float], spike_factor: float, final_fraction: float) -> None:
        """One step of every active model; a model whose loss breaks the spike rule skips it."""
        stack, device = self.stack, self.stack.device
        step_now = self.steps[torch.tensor(self.active, dtype=torch.long)].to(device=device, dtype=torch.float64)
        rate = self.base_rate * self.rate_factor * schedule_factor(step_now, self.total_steps, self.warmup,
                                                                   self.cosine, final_fraction)
        gram, w, weight = self.stream.sample(batch_size)
        per_model = 0.5 * (weight * ((stack.final_weights(gram) - w) ** 2).sum(-1)).mean(-1)  # (M,)
        loss_values = per_model.detach().double()
        good = ~spiked(loss_values, torch.nanmedian(self.recent, dim=1).values, spike_factor)
        for value in stack.params.values():
            value.grad = None
        torch.where(torch.isfinite(loss_values), per_model, torch.zeros_like(per_model)).sum().backward()
        with torch.no_grad():
            grads = {name: torch.nan_to_num(value.grad, nan=0.0, posinf=0.0, neginf=0.0)
                     for name, value in stack.params.items()}
            if clip_norm is not None:
                norm = torch.sqrt(sum((g.double() ** 2).flatten(1).sum(1) for g in grads.values()))
                scale = torch.clamp(clip_norm / (norm + 1e-12), max=1.0)
            else:
                scale = torch.ones_like(loss_values)
            clipped = {name: g * scale.to(g.dtype).view((-1,) + (1,) * (g.dim() - 1)) for name, g in grads.items()}
            updates, self.adam = adam_step(clipped, self.adam, rate, good)
            for name, value in stack.params.items():
                value.sub_(updates[name])
            slot = int(self.steps[self.active[0]]) % self.median_window
            self.recent[:, slot] = torch.where(good, loss_values, self.recent[:, slot])
            self.bad_run = torch.where(good, torch.zeros_like(self.bad_run), self.bad_run + 1)
            self.skipped = self.skipped + (~good).long()
            self.window_sum = self.window_sum + torch.where(good, loss_values, torch.zeros_like(loss_values))
            self.window_count = self.window_count + good.double()
            self.window_bad = self.window_bad + (~good).long()
        for i in self.active:
            self.steps[i] += 1

    def log(self, patience: int, spike_factor: float, restarts: int = 0) -> tuple[torch.Tensor, dict]:
        """Close the logging window: each active model's mean loss over it (in its history), and
        ``{position: ("diverged", why)}`` of the models whose patience ran out and that have no restart
        left (the others restart, :meth:`restart`).  A model whose last step was taken, and at least half of its
        window's steps, is snapshotted."""
        # a window whose every step was skipped has no mean (not 0, which would read as a perfect model)
        means = torch.where(self.window_count > 0, self.window_sum / self.window_count.clamp(min=1),
                            torch.full_like(self.window_sum, float("nan"))).cpu()
        runs = self.bad_run.cpu()
        for position, i in enumerate(self.active):
            self.histories[self.specs[i].name].append((int(self.steps[i]), float(means[position])))
        if restarts:   # a state worth going back to: its last step was taken, and most of the window's
            self.take_snapshot((self.bad_run == 0) & (self.window_bad.double() <= self.window_count))
        self.window_sum.zero_()
        self.window_count.zero_()
        self.window_bad.zero_()
        diverged, again = {}, []
        for position, i in enumerate(self.active):
            if int(runs[position]) < patience:
                continue
            if len(self.restarts[self.specs[i].name]) < restarts:
                again.append(position)
                continue
            went_back = f" (after {restarts} restarts at a lower rate)" if restarts else ""
            diverged[position] = ("diverged", f"{int(runs[position])} steps in a row had a non-finite loss or "
                                  f"one above {spike_factor:g}x the running median (at step {int(self.steps[i])})"
                                  f"{went_back}")
        if again:
            self.restart(again)
        return means, diverged

    def leave(self, leaving: dict, on_leave: Optional[Callable[[SweepResult], None]]) -> None:
        """Remove the stack rows ``leaving`` (``{position: (status, message)}``), recording their results."""
        skipped = self.skipped.cpu()
        for position in sorted(leaving):
            spec = self.specs[self.active[position]]
            history = self.histories[spec.name]
            final = history[-1][1] if history else float("nan")
            status, message = leaving[position]
            result = SweepResult(spec.name, self.stack.to_model(position, spec.seed), status,
                                 int(self.steps[self.active[position]]), final, self.elapsed(), history,
                                 int(skipped[position]), message, list(self.restarts[spec.name]))
            self.results[spec.name] = result
            if on_leave is not None:
                on_leave(result)
        keep = [position for position in range(len(self.active)) if position not in leaving]
        index = torch.tensor(keep, dtype=torch.long, device=self.stack.device)
        self.active = [self.active[position] for position in keep]
        if not self.active:
            return
        self.stack.select(index)
        self.adam = self.adam.select(index)
        self.recent, self.bad_run, self.skipped = self.recent[index], self.bad_run[index], self.skipped[index]
        self.window_sum, self.window_count = self.window_sum[index], self.window_count[index]
        self.window_bad, self.rate_factor = self.window_bad[index], self.rate_factor[index]
        shot = self.snapshot
        self.snapshot = {"params": {name: value[index] for name, value in shot["params"].items()},
                         "adam": shot["adam"].select(index), "recent": shot["recent"][index],
                         "step": shot["step"][index.cpu()]}
        self.stream.set_noises([self.specs[i].noise for i in self.active],
                              [self.specs[i].stretched for i in self.active])
        self.refresh_schedule()

    def state_dict(self, configuration: dict) -> dict:
        """Everything a resumed sweep needs (the format of version 1 checkpoints)."""
        return {
            "format": SWEEP_FORMAT, "version": SWEEP_VERSION, "configuration": configuration,
            "active": list(self.active), "steps": self.steps.clone(),
            "params": {name: value.detach().cpu() for name, value in self.stack.params.items()},
            "moments": {name: value.cpu() for name, value in self.adam.moments.items()},
            "squares": {name: value.cpu() for name, value in self.adam.squares.items()},
            "adam_steps": self.adam.steps.cpu(), "recent": self.recent.cpu(), "bad_run": self.bad_run.cpu(),
            "skipped": self.skipped.cpu(), "window_sum": self.window_sum.cpu(),
            "window_count": self.window_count.cpu(),
            "window_bad": self.window_bad.cpu(), "rate_factor": self.rate_factor.cpu(),
            "restarts": {key: [list(entry) for entry in value] for key, value in self.restarts.items()},
            "snapshot": {"params": {name: value.cpu() for name, value in self.snapshot["params"].items()},
                         "moments": {name: value.cpu() for name, value in self.snapshot["adam"].moments.items()},
                         "squares": {name: value.cpu() for name, value in self.snapshot["adam"].squares.items()},
                         "adam_steps": self.snapshot["adam"].steps.cpu(), "recent": self.snapshot["recent"].cpu(),
                         "step": self.snapshot["step"].clone()},
            "histories": {key: [list(entry) for entry in value] for key, value in self.histories.items()},
            "elapsed": self.elapsed(), "generator": self.stream.generator.get_state(),
            "results": {name: {"state": result.model.state_dict(), "status": result.status,
                               "steps": result.steps, "final_loss": result.final_loss,
                               "wall_time": result.wall_time, "skipped": result.skipped_steps,
                               "message": result.message, "seed": self.specs[self.index_of(name)].seed,
                               "restarts": [list(entry) for entry in result.restarts]}
                        for name, result in self.results.items()},
        }

    def index_of(self, name: str) -> int:
        return next(index for index, spec in enumerate(self.specs) if spec.name == name)

    def load(self, saved: dict, shape: tuple) -> None:
        """Continue from a checkpoint's :meth:`state_dict` (``shape``: ``(d, num_layers, num_heads,
        parameterization)`` for the models that already left)."""
        device, dtype = self.stack.device, self.stack.dtype
        self.active = list(saved["active"])
        self.steps = saved["steps"].clone()
        self.stack.params = {name: value.to(device=device, dtype=dtype).requires_grad_(True)
                             for name, value in saved["params"].items()}
        self.adam = AdamState({name: value.to(device=device, dtype=dtype) for name, value in saved["moments"].items()},
                              {name: value.to(device=device, dtype=dtype) for name, value in saved["squares"].items()},
                              saved["adam_steps"].to(device))
        self.recent, self.bad_run = saved["recent"].to(device), saved["bad_run"].to(device)
        self.skipped = saved["skipped"].to(device)
        self.window_sum, self.window_count = saved["window_sum"].to(device), saved["window_count"].to(device)
        self.histories = {key: [tuple(entry) for entry in value] for key, value in saved["histories"].items()}
        # checkpoints written before restarts existed have none of their state: none had restarted
        self.window_bad = saved.get("window_bad", torch.zeros_like(self.bad_run.cpu())).to(device)
        self.rate_factor = saved.get("rate_factor", torch.ones(len(self.active), dtype=torch.float64)).to(device)
        self.restarts = {spec.name: [tuple(entry) for entry in saved.get("restarts", {}).get(spec.name, [])]
                         for spec in self.specs}
        shot = saved.get("snapshot")
        if shot is None:
            self.snapshot = self.current_state()
        else:
            self.snapshot = {"params": {name: value.to(device=device, dtype=dtype)
                                        for name, value in shot["params"].items()},
                             "adam": AdamState({name: value.to(device=device, dtype=dtype)
                                                for name, value in shot["moments"].items()},
                                               {name: value.to(device=device, dtype=dtype)
                                                for name, value in shot["squares"].items()},
                                               shot["adam_steps"].to(device)),
                             "recent": shot["recent"].to(device), "step": shot["step"].clone()}
        self.elapsed_before = saved["elapsed"]
        self.stream.set_noises([self.specs[i].noise for i in self.active],
                              [self.specs[i].stretched for i in self.active])
        self.stream.generator.set_state(saved["generator"])
        for name, entry in saved["results"].items():
            model = LinearTransformer(*shape, init_scale=0.0, seed=entry["seed"], dtype=torch.float64, device="cpu")
            model.load_state_dict(entry["state"])
            self.results[name] = SweepResult(name, model, entry["status"], entry["steps"], entry["final_loss"],
                                             entry["wall_time"], self.histories.get(name, []), entry["skipped"],
                                             entry["message"], [tuple(item) for item in entry.get("restarts", [])])
        self.refresh_schedule()
        self.started = time.perf_counter()   # the clock of this call; elapsed_before holds the earlier ones


def _read_sweep_checkpoint(path: Path, configuration: dict) -> dict:
    try:
        saved = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:
        raise CheckpointError(f"{path} could not be read as a sweep checkpoint ({type(error).__name__}); "
                              "delete it to start this sweep over") from None
    if not isinstance(saved, dict) or saved.get("format") != SWEEP_FORMAT:
        raise CheckpointError(f"{path} is not a sweep checkpoint; pass another path")
    if saved["configuration"] != configuration:
        differ = [key for key in configuration if saved["configuration"].get(key) != configuration[key]]
        raise CheckpointError(f"{path} belongs to another sweep (it differs in {', '.join(differ)}); "
                              "pass another checkpoint path, or delete the file to start over")
    return saved


def _initial_models(specs: Sequence[ModelSpec], d: int, num_layers: int, num_heads: int, parameterization: str,
                    init_scale: float) -> list[LinearTransformer]:
    """Each spec's starting weights: its seed's initialisation, or its ``init``."""
    models = []
    for spec in specs:
        model = LinearTransformer(d, num_layers, num_heads, parameterization, init_scale, spec.seed,
                                  dtype=torch.float64, device="cpu")
        if spec.init is not None:
            if spec.init.config["num_layers"] != num_layers or spec.init.config["parameterization"] != parameterization:
                raise ValueError(f"{spec.name}: init must be a {num_layers}-layer {parameterization!r} model")
            model.load_state_dict({key: value.double().cpu() for key, value in spec.init.state_dict().items()})
        models.append(model)
    return models


def _check_sweep(specs: Sequence[ModelSpec], batch_size: int, checkpoint_every: int, log_every: int,
                 patience: int, restarts: int, backoff: float) -> None:
    if not specs:
        raise ValueError("train_sweep needs at least one ModelSpec")
    names = [spec.name for spec in specs]
    if len(set(names)) != len(names):
        raise ValueError("every ModelSpec needs a unique name")
    for value, name in ((batch_size, "batch_size"), (checkpoint_every, "checkpoint_every"),
                        (log_every, "log_every"), (patience, "patience")):
        check_count(value, name)
    check_count(restarts, "restarts", minimum=0)
    if not (isinstance(backoff, (int, float)) and 0 < backoff < 1):
        raise ValueError(f"backoff must be a factor between 0 and 1 (the rate after a restart), got {backoff!r}")


def _show(means: torch.Tensor, state: _SweepState, current: int, bar, progress) -> None:
    """Hand a logging window's means to the progress bar or the ``progress`` callable."""
    if bar is not None and len(state.active):
        shown = ", ".join(f"{float(m):.3g}" for m in means[: min(4, len(state.active))])
        bar.set_postfix_str(f"loss {shown}{' ...' if len(state.active) > 4 else ''}")
    if callable(progress) and progress is not True:
        progress(current, {state.specs[i].name: float(means[p]) for p, i in enumerate(state.active)})


def train_sweep(specs: Sequence[ModelSpec], d: int = 10, n: int = 20, num_layers: int = 1,
                parameterization: str = "diag", num_heads: int = 1, batch_size: int = 2048,
                init_scale: float = 0.02, clip_norm: Optional[float] = 1.0, final_fraction: float = 0.0,
                spike_factor: float = 100.0, patience: int = 50, median_window: int = 64,
                restarts: int = 0, backoff: float = 0.5,
                dtype: str | torch.dtype = torch.float32, device: str | torch.device = "auto",
                seed: int = 0, checkpoint: Optional[str | os.PathLike] = None, checkpoint_every: int = 1000,
                log_every: int = 50, progress: bool | Callable = True,
                on_leave: Optional[Callable[[SweepResult], None]] = None) -> dict:
    """Train every model of ``specs`` together; returns ``{name: SweepResult}``.

    Args:
        specs: the models (their names must be unique); all share ``d``, ``num_layers``,
            ``parameterization`` and ``num_heads``.
        batch_size: fresh tasks per model per step.
        clip_norm: each model's gradient is clipped to this global norm (None: no clipping).
        final_fraction: the cosine schedule ends at this fraction of the base rate.
        spike_factor, patience, median_window: the spike-tolerant divergence rule (module docstring).
        restarts, backoff: how many times a model whose patience runs out goes back to its last healthy
            window's state, at ``backoff`` times its rate, before it counts as diverged (0: never; the
            result's ``restarts`` lists them).
        dtype, device: where and in which precision the stack trains.
        seed: seeds the task stream.
        checkpoint: a file the whole stack is saved to every ``checkpoint_every`` steps and resumed
            from when it exists (models that already left are not trained again).
        log_every: steps between history entries (and between divergence checks).
        progress: show a tqdm bar (True), or a callable ``progress(step, active_losses)``.
        on_leave: called with each :class:`SweepResult` the moment its model leaves the stack.
    """
    specs = list(specs)
    _check_sweep(specs, batch_size, checkpoint_every, log_every, patience, restarts, backoff)
    dtype, device = resolve_dtype(dtype), resolve_device(device)
    stack = ModelStack(_initial_models(specs, d, num_layers, num_heads, parameterization, init_scale),
                       dtype=dtype, device=device)
    # what a checkpoint must match to be resumed (without restarts, that of the checkpoints written before them)
    configuration = dict(d=d, n=n, num_layers=num_layers, parameterization=parameterization, num_heads=num_heads,
                         batch_size=batch_size, init_scale=init_scale, clip_norm=clip_norm,
                         final_fraction=final_fraction, spike_factor=spike_factor, patience=patience,
                         dtype=str(dtype), seed=seed, models=[spec.key() for spec in specs],
                         **({"restarts": restarts, "backoff": backoff} if restarts else {}))
    state = _SweepState(specs, stack, _TaskStream.for_specs(specs, d, n, dtype, device, seed), median_window,
                        backoff)
    path = None if checkpoint is None else Path(checkpoint)
    if path is not None and path.exists():
        state.load(_read_sweep_checkpoint(path, configuration), (d, num_layers, num_heads, parameterization))

    def describe() -> str:
        return f"{parameterization} L={num_layers} ({len(state.active)} models)"
    bar = None
    if progress is True:
        from tqdm.auto import tqdm
        bar = tqdm(total=max(spec.num_steps for spec in specs), dynamic_ncols=True, desc=describe(),
                   initial=int(state.steps[torch.tensor(state.active, dtype=torch.long)].min()) if state.active else 0)
    last_saved = int(state.steps.max())
    try:
        while state.active:
            state.step(batch_size, clip_norm, spike_factor, final_fraction)
            current = int(state.steps[state.active[0]])
            if bar is not None:
                bar.update(1)
            finished = [p for p, i in enumerate(state.active) if int(state.steps[i]) >= specs[i].num_steps]
            leaving = {}
            if current % log_every == 0 or finished:
                means, leaving = state.log(patience, spike_factor, restarts)
                _show(means, state, current, bar, progress)
            for position in finished:
                leaving.setdefault(position, ("finished", ""))
            if leaving:
                state.leave(leaving, on_leave)
                if bar is not None:
                    bar.set_description(describe())
            if state.active and path is not None and current - last_saved >= checkpoint_every:
                _atomic_save(state.state_dict(configuration), path)
                last_saved = current
    finally:
        if bar is not None:
            bar.close()
    if path is not None:
        _atomic_save(state.state_dict(configuration), path)
    return {spec.name: state.results[spec.name] for spec in specs if spec.name in state.results}
