"""Training any model on any task sampler, with checkpoints that resume.

One function, :func:`train`: Adam on fresh tasks every step, optional gradient clipping,
an optional cosine learning-rate schedule with warm-up, a progress bar that works in a
terminal and in a notebook, a loss history, and a clear error when a run diverges.

The loss is the exact query-averaged loss ``1/2 (w^L - w)^T S (w^L - w)`` (see
:mod:`icl_course.evaluate`): the same objective as sampling a query, without its noise.

With ``checkpoint="run.pt"`` the run saves every ``checkpoint_every`` steps and, when the
file already exists, resumes from it: the weights, the optimiser, the random generator and
the history are restored, so an interrupted run continues as if it had never stopped and a
finished one returns at once.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Optional

import torch

from .checkpoints import CheckpointError, read_checkpoint, save_checkpoint
from .data import RegressionTasks
from .evaluate import query_averaged_loss
from .models import LinearTransformer
from .runtime import check_count, make_generator
from .trainer_core import SCHEDULES, schedule_factor, spiked

__all__ = ["train", "TrainingHistory", "TrainingDiverged", "learning_rate_factor"]


class TrainingDiverged(RuntimeError):
    """The loss or a gradient became NaN or infinite, or the loss exploded."""


@dataclass
class TrainingHistory:
    """The per-step record of a run: ``losses[k]`` is the batch loss at step ``k``."""

    losses: list = field(default_factory=list)
    learning_rates: list = field(default_factory=list)
    resumed_at: Optional[int] = None

    @property
    def num_steps(self) -> int:
        """How many steps the record holds (those of earlier runs of a resumed training included)."""
        return len(self.losses)

    def smoothed(self, window: int = 50) -> torch.Tensor:
        """The losses averaged over a trailing window (for plots), shape (num_steps,)."""
        losses = torch.tensor(self.losses, dtype=torch.float64)
        if len(losses) == 0:
            return losses
        cumulative = torch.cat([torch.zeros(1, dtype=torch.float64), losses.cumsum(0)])
        index = torch.arange(1, len(losses) + 1)
        start = (index - window).clamp(min=0)
        return (cumulative[index] - cumulative[start]) / (index - start)

    def as_dict(self) -> dict:
        """The losses and learning rates as plain lists (what a checkpoint stores)."""
        return {"losses": list(self.losses), "learning_rates": list(self.learning_rates)}


def learning_rate_factor(step: int, num_steps: int, schedule: str, warmup_steps: int) -> float:
    """The multiplier of the base learning rate at ``step``: linear warm-up, then the schedule (a cosine
    to 0); :func:`icl_course.trainer_core.schedule_factor` for one model, the sweep's schedule too."""
    def number(value):
        return torch.tensor([value], dtype=torch.float64)

    return float(schedule_factor(number(step), number(num_steps), number(warmup_steps),
                                 torch.tensor([schedule == "cosine"]))[0])


def _settings_differ(saved: dict, current: dict) -> list[str]:
    return [f"{key}: checkpoint has {saved.get(key)!r}, this call has {value!r}"
            for key, value in current.items() if saved.get(key) != value]


def _check_arguments(model, sampler, num_steps, batch_size, learning_rate, schedule,
                     divergence_patience) -> None:
    check_count(num_steps, "num_steps", minimum=0)
    check_count(batch_size, "batch_size")
    check_count(divergence_patience, "divergence_patience")
    if schedule not in SCHEDULES:
        raise ValueError(f"unknown schedule {schedule!r}; choose one of {', '.join(SCHEDULES)}")
    if not learning_rate > 0:
        raise ValueError(f"learning_rate must be positive, got {learning_rate!r}")
    if sampler.d != model.d:
        raise ValueError(f"the model was built for d={model.d} but the sampler draws d={sampler.d}")
    if sampler.dtype != model.dtype or sampler.device != model.device:
        raise ValueError(
            f"the sampler makes {sampler.dtype} tasks on {sampler.device} but the model is {model.dtype} "
            f"on {model.device}; create both with the same dtype= and device="
        )


def _resume(checkpoint, model, optimizer, generator, settings: dict) -> tuple[int, TrainingHistory]:
    """Restore a run from ``checkpoint`` when it exists: (the step to continue at, the history)."""
    if checkpoint is None or not os.path.exists(checkpoint):
        return 0, TrainingHistory()
    payload = read_checkpoint(checkpoint)
    state = payload.get("training_state") or {}
    problems = _settings_differ(payload["model_config"], model.config)
    problems += _settings_differ(state.get("settings", {}), settings)
    if problems:
        raise CheckpointError(
            f"{checkpoint} belongs to another run ({'; '.join(problems)}). Pass a new checkpoint "
            "path, or delete the file to start over."
        )
    model.load_state_dict(payload["model_state"])
    optimizer.load_state_dict(state["optimizer"])
    generator.set_state(state["generator"])
    history = TrainingHistory(losses=list(state["history"]["losses"]),
                              learning_rates=list(state["history"]["learning_rates"]),
                              resumed_at=state["step"])
    return state["step"], history


class _DivergenceRule:
    """Stop on a non-finite loss, or when the loss breaks the spike rule
    (:func:`~icl_course.trainer_core.spiked`) against the first loss for ``patience`` steps in a row.
    Deep models see single-batch spikes (one ill-conditioned task, amplified by the polynomial the model
    computes) that training recovers from; a rule that stopped at the first spike would end good runs.
    Unlike the sweep, which skips a spiked step and measures against the running median, one model
    takes every step: the shipped chapter-1 models were trained so."""

    def __init__(self, factor: float, patience: int, reference: Optional[float]):
        self.factor, self.patience, self.reference, self.bad_steps = factor, patience, reference, 0

    def check(self, step: int, value: float, learning_rate: float) -> None:
        self.reference = value if self.reference is None else self.reference
        exploded = bool(spiked(torch.tensor([value], dtype=torch.float64),
                               torch.tensor([max(self.reference, 1e-12)], dtype=torch.float64), self.factor))
        self.bad_steps = self.bad_steps + 1 if exploded else 0
        if not math.isfinite(value) or self.bad_steps >= self.patience:
            raise TrainingDiverged(
                f"training diverged at step {step}: the loss is {value:.3g} (it started at "
                f"{self.reference:.3g}). Lower learning_rate (now {learning_rate:g}), set clip_norm, "
                "or add warmup_steps; the last good checkpoint, if any, is unchanged."
            )


def _optimizer_step(model, optimizer, loss, clip_norm, step: int, value: float) -> None:
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    if clip_norm is not None:
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), clip_norm)
        if not torch.isfinite(norm):
            raise TrainingDiverged(
                f"a gradient became NaN or infinite at step {step} (loss {value:.3g}); lower "
                "learning_rate or use float64"
            )
    optimizer.step()


def train(model: LinearTransformer, sampler: RegressionTasks, num_steps: int,
          batch_size: int = 2048, learning_rate: float = 1e-3, schedule: str = "cosine",
          warmup_steps: int = 0, clip_norm: Optional[float] = 1.0, seed: int = 0,
          checkpoint: Optional[str | os.PathLike] = None, checkpoint_every: int = 500,
          metadata: Optional[dict] = None, progress: bool = True,
          divergence_factor: float = 1e3, divergence_patience: int = 10) -> TrainingHistory:
    """Train ``model`` in place with Adam on fresh tasks from ``sampler``.

    Args:
        model: any :class:`~icl_course.models.LinearTransformer`.
        sampler: a :class:`~icl_course.data.RegressionTasks`; its dtype and device must be the model's.
        num_steps: total optimiser steps (a resumed run counts the steps already done).
        batch_size: tasks per step, each step draws a fresh batch.
        learning_rate: Adam's base learning rate.
        schedule: ``"cosine"`` (decay to 0 at ``num_steps``) or ``"constant"``.
        warmup_steps: steps of linear warm-up before the schedule.
        clip_norm: clip the global gradient norm to this value; None disables clipping.
        seed: seeds the task stream; the model's own seed fixed its initialisation.
        checkpoint: a file to save to every ``checkpoint_every`` steps and to resume from.
        metadata: saved with the checkpoint (for example the command that made it).
        progress: show a tqdm progress bar.
        divergence_factor: a loss above this multiple of the first loss counts as exploded ...
        divergence_patience: ... and this many exploded steps in a row stop the run (a NaN or
            infinite loss stops it at once).  Single batches of deep models can spike.

    Returns a :class:`TrainingHistory`; raises :class:`TrainingDiverged` with advice when the
    loss becomes NaN, infinite or explodes (no checkpoint of the diverged state is written).
    """
    _check_arguments(model, sampler, num_steps, batch_size, learning_rate, schedule, divergence_patience)
    settings = {"num_steps": num_steps, "batch_size": batch_size, "learning_rate": learning_rate,
                "schedule": schedule, "warmup_steps": warmup_steps, "clip_norm": clip_norm,
                "seed": seed, "sampler": repr(sampler)}
    optimizer = torch.optim.Adam(model.parameters(), lr=learning_rate)
    generator = make_generator(seed)
    start, history = _resume(checkpoint, model, optimizer, generator, settings)

    def save(step: int) -> None:
        if checkpoint is None:
            return
        state = {"step": step, "optimizer": optimizer.state_dict(), "generator": generator.get_state(),
                 "history": history.as_dict(), "settings": settings}
        save_checkpoint(checkpoint, model, training_state=state, metadata=metadata)

    from tqdm.auto import tqdm

    divergence = _DivergenceRule(divergence_factor, divergence_patience,
                                 history.losses[0] if history.losses else None)
    model.train()
    with tqdm(total=num_steps, initial=start, disable=not progress, desc="training",
              dynamic_ncols=True) as bar:
        for step in range(start, num_steps):
            rate = learning_rate * learning_rate_factor(step, num_steps, schedule, warmup_steps)
            for group in optimizer.param_groups:
                group["lr"] = rate
            batch = sampler.sample(batch_size, generator)
            loss = query_averaged_loss(model.final_weights(batch), batch).mean()
            value = loss.item()
            divergence.check(step, value, learning_rate)
            _optimizer_step(model, optimizer, loss, clip_norm, step, value)
            history.losses.append(value)
            history.learning_rates.append(rate)
            bar.update(1)
            if step % 50 == 0:
                bar.set_postfix(loss=f"{value:.4g}")
            if (step + 1) % checkpoint_every == 0 and step + 1 < num_steps:
                save(step + 1)
    model.eval()
    if start < num_steps or (checkpoint is not None and not os.path.exists(checkpoint)):
        save(num_steps)
    return history
