"""Many linear transformers of the same shape trained as one.

A sweep such as Table 1 of Vladymyrov et al. (2024) is dozens of small models of one shape that
differ only in their noise law, seed and learning rate.  Trained one after another, each step of
each model is a handful of tiny operations, and the fixed cost of launching them dominates.  Here
every parameter carries a leading *model axis*: ``M`` models are one set of tensors of shape
``(M, L, H, ...)``, each model draws its own batch of tasks from its own noise law, and one
batched forward and backward pass per step trains them all.  Each model keeps its own learning-rate
schedule, its own gradient clipping and its own Adam state, so the result is what ``M`` separate
runs of Adam would give (the task stream differs, the algorithm does not).

Models leave the stack when they finish (each may have its own number of steps) or diverge, and
the others go on.  Divergence is judged per model with a spike-tolerant rule: a step whose loss is
not finite, or larger than ``spike_factor`` times the model's running median, is *skipped* for that
model (no update, Adam state untouched) and counted; ``patience`` skipped steps in a row and the
model has diverged.  Deep models see single batches with one ill-conditioned task that spike the
loss by orders of magnitude; skipping them keeps good runs alive.

The forward pass is the one of :class:`~icl_course.models.LinearTransformer`, on each task's
``(d+1) x (d+1)`` Gram matrix: ``A_l = sum_k P_k G Q_k``, ``G <- (I + A_l) G (I + A_l)^T``, and the
last row of ``(I + A_L) ... (I + A_1)`` gives the implicit weights ``w^L``.  The loss is the exact
query-averaged ``1/2 ||w^L - w||^2``.

>>> specs = [ModelSpec(f"m{s}", UniformNoise(s), seed=s, num_steps=500, learning_rate=3e-3) for s in range(8)]
>>> results = train_sweep(specs, d=10, n=20, num_layers=2, parameterization="diag")
>>> results["m3"].model          # a LinearTransformer, ready for icl_course.evaluate
"""

from __future__ import annotations

import math
import os
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional, Sequence

import torch

from .checkpoints import CheckpointError
from .data import CategoricalNoise, FixedNoise, NoiseDistribution, UniformNoise, as_noise
from .models import LinearTransformer
from .runtime import check_count, resolve_device, resolve_dtype

__all__ = ["ModelSpec", "SweepResult", "ModelStack", "train_sweep", "SCHEDULES", "noise_key"]

SCHEDULES = ("constant", "cosine")
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
    """

    name: str
    noise: object
    seed: int = 0
    num_steps: int = 1000
    learning_rate: float = 1e-3
    warmup_steps: int = 0
    schedule: str = "cosine"
    init: Optional[LinearTransformer] = None

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
                "init": None if self.init is None else "given"}


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


def _schedule_factor(step: torch.Tensor, num_steps: torch.Tensor, warmup: torch.Tensor,
                     cosine: torch.Tensor, final_fraction: float) -> torch.Tensor:
    """Per-model learning-rate multiplier at per-model ``step`` (all (M,) float64 tensors)."""
    warm = (step + 1) / warmup.clamp(min=1)
    progress = ((step - warmup) / (num_steps - warmup).clamp(min=1)).clamp(0, 1)
    decay = final_fraction + (1 - final_fraction) * 0.5 * (1 + torch.cos(math.pi * progress))
    decay = torch.where(cosine, decay, torch.ones_like(decay))
    return torch.where(step < warmup, warm, decay)


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

    def __init__(self, noises: Sequence[NoiseDistribution], d: int, n: int, dtype, device, seed: int):
        self.d, self.n, self.dtype, self.device = d, n, dtype, device
        self.generator = torch.Generator(device=device)
        self.generator.manual_seed(seed)
        self.set_noises(noises)

    def set_noises(self, noises: Sequence[NoiseDistribution]) -> None:
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
        """(gram (M, B, D, D), w (M, B, d)) for every model."""
        M, B, n, d = self.table.shape[0], batch_size, self.n, self.d
        options = {"generator": self.generator, "dtype": self.dtype, "device": self.device}
        u = torch.rand(M, B, **options)
        index = torch.minimum((u * self.counts[:, None]).long(), self.counts[:, None].long() - 1)
        categorical = torch.gather(self.table, 1, index)
        sigma = torch.where(self.uniform[:, None], u * self.table[:, :1], categorical)
        w = torch.randn(M, B, d, **options)
        X = torch.randn(M, B, n, d, **options)
        y = (X @ w.unsqueeze(-1)).squeeze(-1) + sigma.unsqueeze(-1) * torch.randn(M, B, n, **options)
        tokens = torch.cat([X, y.unsqueeze(-1)], dim=-1)
        return tokens.transpose(-1, -2) @ tokens, w


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


def train_sweep(specs: Sequence[ModelSpec], d: int = 10, n: int = 20, num_layers: int = 1,
                parameterization: str = "diag", num_heads: int = 1, batch_size: int = 2048,
                init_scale: float = 0.02, clip_norm: Optional[float] = 1.0, final_fraction: float = 0.0,
                spike_factor: float = 100.0, patience: int = 50, median_window: int = 64,
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
        dtype, device: where and in which precision the stack trains.
        seed: seeds the task stream.
        checkpoint: a file the whole stack is saved to every ``checkpoint_every`` steps and resumed
            from when it exists (models that already left are not trained again).
        log_every: steps between history entries (and between divergence checks).
        progress: show a tqdm bar (True), or a callable ``progress(step, active_losses)``.
        on_leave: called with each :class:`SweepResult` the moment its model leaves the stack.
    """
    specs = list(specs)
    if not specs:
        raise ValueError("train_sweep needs at least one ModelSpec")
    names = [spec.name for spec in specs]
    if len(set(names)) != len(names):
        raise ValueError("every ModelSpec needs a unique name")
    check_count(batch_size, "batch_size")
    check_count(checkpoint_every, "checkpoint_every")
    check_count(log_every, "log_every")
    check_count(patience, "patience")
    dtype, device = resolve_dtype(dtype), resolve_device(device)
    models = []
    for spec in specs:
        model = LinearTransformer(d, num_layers, num_heads, parameterization, init_scale, spec.seed,
                                  dtype=torch.float64, device="cpu")
        if spec.init is not None:
            if spec.init.config["num_layers"] != num_layers or spec.init.config["parameterization"] != parameterization:
                raise ValueError(f"{spec.name}: init must be a {num_layers}-layer {parameterization!r} model")
            model.load_state_dict({key: value.double().cpu() for key, value in spec.init.state_dict().items()})
        models.append(model)
    stack = ModelStack(models, dtype=dtype, device=device)
    configuration = {"d": d, "n": n, "num_layers": num_layers, "parameterization": parameterization,
                     "num_heads": num_heads, "batch_size": batch_size, "init_scale": init_scale,
                     "clip_norm": clip_norm, "final_fraction": final_fraction, "spike_factor": spike_factor,
                     "patience": patience, "dtype": str(dtype), "seed": seed,
                     "models": [spec.key() for spec in specs]}

    M = len(specs)
    active = list(range(M))                      # indices into specs of the models in the stack
    steps = torch.zeros(M, dtype=torch.long)     # steps taken per model (CPU)
    moments = {name: torch.zeros_like(value) for name, value in stack.params.items()}
    squares = {name: torch.zeros_like(value) for name, value in stack.params.items()}
    adam_steps = torch.zeros(M, dtype=torch.float64, device=device)
    recent = torch.full((M, median_window), float("nan"), dtype=torch.float64, device=device)
    bad_run = torch.zeros(M, dtype=torch.long, device=device)
    skipped = torch.zeros(M, dtype=torch.long, device=device)
    window_sum = torch.zeros(M, dtype=torch.float64, device=device)
    window_count = torch.zeros(M, dtype=torch.float64, device=device)
    histories = {spec.name: [] for spec in specs}
    results: dict[str, SweepResult] = {}
    elapsed_before = 0.0
    stream = _TaskStream([spec.noise for spec in specs], d, n, dtype, device, seed)

    path = None if checkpoint is None else Path(checkpoint)
    if path is not None and path.exists():
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
        active = list(saved["active"])
        steps = saved["steps"].clone()
        stack.params = {name: value.to(device=device, dtype=dtype).requires_grad_(True)
                        for name, value in saved["params"].items()}
        moments = {name: value.to(device=device, dtype=dtype) for name, value in saved["moments"].items()}
        squares = {name: value.to(device=device, dtype=dtype) for name, value in saved["squares"].items()}
        adam_steps, recent = saved["adam_steps"].to(device), saved["recent"].to(device)
        bad_run, skipped = saved["bad_run"].to(device), saved["skipped"].to(device)
        window_sum, window_count = saved["window_sum"].to(device), saved["window_count"].to(device)
        histories = {key: [tuple(entry) for entry in value] for key, value in saved["histories"].items()}
        elapsed_before = saved["elapsed"]
        stream.set_noises([specs[i].noise for i in active])
        stream.generator.set_state(saved["generator"])
        for name, entry in saved["results"].items():
            model = LinearTransformer(d, num_layers, num_heads, parameterization, 0.0, entry["seed"],
                                      dtype=torch.float64, device="cpu")
            model.load_state_dict(entry["state"])
            results[name] = SweepResult(name, model, entry["status"], entry["steps"], entry["final_loss"],
                                        entry["wall_time"], histories.get(name, []), entry["skipped"],
                                        entry["message"])

    started = time.perf_counter()

    def elapsed() -> float:
        return elapsed_before + time.perf_counter() - started

    def rows():
        """The spec indices of the models in the stack."""
        return torch.tensor(active, dtype=torch.long)

    # The state tensors have one row per model in the stack (all of them on a fresh start).
    def spec_tensor(values, kind=torch.float64):
        return torch.tensor(values, dtype=kind, device=device)

    def refresh_schedule():
        chosen = [specs[i] for i in active]
        return (spec_tensor([s.learning_rate for s in chosen]), spec_tensor([s.num_steps for s in chosen]),
                spec_tensor([s.warmup_steps for s in chosen]),
                torch.tensor([s.schedule == "cosine" for s in chosen], device=device))

    base_rate, total_steps, warmup, cosine = refresh_schedule()

    def save_state():
        if path is None:
            return
        payload = {
            "format": SWEEP_FORMAT, "version": SWEEP_VERSION, "configuration": configuration,
            "active": list(active), "steps": steps.clone(),
            "params": {name: value.detach().cpu() for name, value in stack.params.items()},
            "moments": {name: value.cpu() for name, value in moments.items()},
            "squares": {name: value.cpu() for name, value in squares.items()},
            "adam_steps": adam_steps.cpu(), "recent": recent.cpu(), "bad_run": bad_run.cpu(),
            "skipped": skipped.cpu(), "window_sum": window_sum.cpu(), "window_count": window_count.cpu(),
            "histories": {key: [list(entry) for entry in value] for key, value in histories.items()},
            "elapsed": elapsed(), "generator": stream.generator.get_state(),
            "results": {name: {"state": result.model.state_dict(), "status": result.status,
                               "steps": result.steps, "final_loss": result.final_loss,
                               "wall_time": result.wall_time, "skipped": result.skipped_steps,
                               "message": result.message, "seed": specs[names.index(name)].seed}
                        for name, result in results.items()},
        }
        _atomic_save(payload, path)

    def leave(positions: list[int], statuses: dict):
        """Remove the stack rows ``positions``, recording their results."""
        nonlocal active, moments, squares, adam_steps, recent, bad_run, skipped, window_sum, window_count
        nonlocal base_rate, total_steps, warmup, cosine
        skipped_cpu = skipped.cpu()
        for position in positions:
            spec = specs[active[position]]
            history = histories[spec.name]
            final = history[-1][1] if history else float("nan")
            status, message = statuses[position]
            result = SweepResult(spec.name, stack.to_model(position, spec.seed), status,
                                 int(steps[active[position]]), final, elapsed(), history,
                                 int(skipped_cpu[position]), message)
            results[spec.name] = result
            if on_leave is not None:
                on_leave(result)
        keep = [position for position in range(len(active)) if position not in set(positions)]
        index = torch.tensor(keep, dtype=torch.long, device=device)
        active = [active[position] for position in keep]
        if not active:
            return
        stack.select(index)
        moments = {name: value[index] for name, value in moments.items()}
        squares = {name: value[index] for name, value in squares.items()}
        adam_steps, recent, bad_run, skipped = adam_steps[index], recent[index], bad_run[index], skipped[index]
        window_sum, window_count = window_sum[index], window_count[index]
        stream.set_noises([specs[i].noise for i in active])
        base_rate, total_steps, warmup, cosine = refresh_schedule()

    bar = None
    if progress is True:
        from tqdm.auto import tqdm
        bar = tqdm(total=max(spec.num_steps for spec in specs), initial=int(steps[rows()].min()) if active else 0,
                   desc=f"{parameterization} L={num_layers} ({len(active)} models)", dynamic_ncols=True)
    beta1, beta2, eps = 0.9, 0.999, 1e-8
    last_saved = int(steps.max())
    try:
        while active:
            step_now = steps[rows()].to(device=device, dtype=torch.float64)
            rate = base_rate * _schedule_factor(step_now, total_steps, warmup, cosine, final_fraction)
            gram, w = stream.sample(batch_size)
            estimate = stack.final_weights(gram)
            per_model = 0.5 * ((estimate - w) ** 2).sum(-1).mean(-1)            # (M,)
            loss_values = per_model.detach().double()
            median = torch.nanmedian(recent, dim=1).values
            finite = torch.isfinite(loss_values)
            spike = finite & ~torch.isnan(median) & (loss_values > spike_factor * median)
            good = finite & ~spike
            for value in stack.params.values():
                value.grad = None
            torch.where(finite, per_model, torch.zeros_like(per_model)).sum().backward()
            with torch.no_grad():
                grads = {name: torch.nan_to_num(value.grad, nan=0.0, posinf=0.0, neginf=0.0)
                         for name, value in stack.params.items()}
                if clip_norm is not None:
                    norm = torch.sqrt(sum((g.double() ** 2).flatten(1).sum(1) for g in grads.values()))
                    scale = torch.clamp(clip_norm / (norm + 1e-12), max=1.0)
                else:
                    scale = torch.ones_like(loss_values)
                adam_steps = adam_steps + good.double()
                t = adam_steps.clamp(min=1)
                correction1, correction2 = 1 - beta1 ** t, 1 - beta2 ** t
                for name, value in stack.params.items():
                    shape = (-1,) + (1,) * (value.dim() - 1)
                    mask = good.view(shape)
                    g = grads[name] * scale.to(value.dtype).view(shape)
                    new_moment = beta1 * moments[name] + (1 - beta1) * g
                    new_square = beta2 * squares[name] + (1 - beta2) * g * g
                    moments[name] = torch.where(mask, new_moment, moments[name])
                    squares[name] = torch.where(mask, new_square, squares[name])
                    update = (rate / correction1).to(value.dtype).view(shape) * moments[name] / (
                        (squares[name] / correction2.to(value.dtype).view(shape)).sqrt() + eps)
                    value.sub_(torch.where(mask, update, torch.zeros_like(update)))
                slot = int(steps[active[0]]) % median_window
                recent[:, slot] = torch.where(good, loss_values, recent[:, slot])
                bad_run = torch.where(good, torch.zeros_like(bad_run), bad_run + 1)
                skipped = skipped + (~good).long()
                window_sum = window_sum + torch.where(good, loss_values, torch.zeros_like(loss_values))
                window_count = window_count + good.double()
            for i in active:
                steps[i] += 1
            current = int(steps[active[0]])
            if bar is not None:
                bar.update(1)
            finished = [p for p, i in enumerate(active) if int(steps[i]) >= specs[i].num_steps]
            logging = current % log_every == 0 or finished
            leaving = {}
            if logging:
                means = (window_sum / window_count.clamp(min=1)).cpu()
                runs = bad_run.cpu()
                for position, i in enumerate(active):
                    histories[specs[i].name].append((int(steps[i]), float(means[position])))
                window_sum.zero_()
                window_count.zero_()
                for position, i in enumerate(active):
                    if int(runs[position]) >= patience:
                        leaving[position] = ("diverged", f"{int(runs[position])} steps in a row had a "
                                             f"non-finite loss or one above {spike_factor:g}x the running median "
                                             f"(at step {int(steps[i])})")
                if bar is not None and len(active):
                    shown = ", ".join(f"{float(m):.3g}" for m in means[: min(4, len(active))])
                    bar.set_postfix_str(f"loss {shown}{' ...' if len(active) > 4 else ''}")
                if callable(progress) and progress is not True:
                    progress(current, {specs[i].name: float(means[p]) for p, i in enumerate(active)})
            for position in finished:
                leaving.setdefault(position, ("finished", ""))
            if leaving:
                leave(sorted(leaving), leaving)
                if bar is not None:
                    bar.set_description(f"{parameterization} L={num_layers} ({len(active)} models)")
            if active and current - last_saved >= checkpoint_every:
                save_state()
                last_saved = current
    finally:
        if bar is not None:
            bar.close()
    save_state()
    return {name: results[name] for name in names if name in results}
