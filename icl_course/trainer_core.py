"""The optimiser core of both trainers (:func:`icl_course.train.train` and :func:`icl_course.sweep.train_sweep`).

* :func:`schedule_factor`: the learning-rate multiplier, a linear warm-up then a cosine (to
  ``final_fraction`` of the base rate) or a constant;
* :func:`spiked`: the spike rule, a loss that is not finite or above ``factor`` times a reference
  loss; a trainer counts such steps in a row and gives up after its patience;
* :func:`adam_step`: Adam (Kingma and Ba, 2015) for a stack of models with a leading model axis, pure
  (it returns the update and the new state) and masked (a model outside the mask keeps its weights and
  its state, the way a skipped step leaves it).  ``tests/test_optim.py`` checks it against
  ``torch.optim.Adam``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

__all__ = ["SCHEDULES", "schedule_factor", "spiked", "AdamState", "adam_step"]

SCHEDULES = ("constant", "cosine")


def schedule_factor(step: torch.Tensor, num_steps: torch.Tensor, warmup_steps: torch.Tensor,
                    cosine: torch.Tensor, final_fraction: float = 0.0) -> torch.Tensor:
    """The multiplier of the base learning rate at (0-based) ``step``, per model.

    ``(step + 1) / warmup_steps`` during the warm-up; then ``f + (1 - f) (1 + cos(pi p)) / 2`` with
    ``p = (step - warmup_steps) / (num_steps - warmup_steps)`` clamped to ``[0, 1]`` and ``f = final_fraction``
    where ``cosine`` holds, 1 where it does not.  All arguments but ``final_fraction`` are tensors of one shape
    (float64 for the steps, bool for ``cosine``); returns float64 of that shape.
    """
    warm = (step + 1) / warmup_steps.clamp(min=1)
    progress = ((step - warmup_steps) / (num_steps - warmup_steps).clamp(min=1)).clamp(0, 1)
    decay = final_fraction + (1 - final_fraction) * 0.5 * (1 + torch.cos(math.pi * progress))
    decay = torch.where(cosine, decay, torch.ones_like(decay))
    return torch.where(step < warmup_steps, warm, decay)


def spiked(losses: torch.Tensor, reference: torch.Tensor, factor: float) -> torch.Tensor:
    """Which losses break the spike rule: not finite, or above ``factor`` times ``reference`` (a NaN
    reference, no history yet, flags only the non-finite).  Shapes: (M,) -> (M,) bool."""
    return ~torch.isfinite(losses) | (losses > factor * reference)


@dataclass
class AdamState:
    """Adam's state for a stack: first and second moments per parameter (shaped like it) and the number
    of updates each model took, (M,) float64 (bias corrections count only the steps a model took)."""

    moments: dict
    squares: dict
    steps: torch.Tensor

    @classmethod
    def zeros(cls, params: dict) -> "AdamState":
        """The state before the first step: zero moments shaped like ``params`` (M, ...), no steps."""
        first = next(iter(params.values()))
        return cls({name: torch.zeros_like(value) for name, value in params.items()},
                   {name: torch.zeros_like(value) for name, value in params.items()},
                   torch.zeros(first.shape[0], dtype=torch.float64, device=first.device))

    def select(self, index: torch.Tensor) -> "AdamState":
        """The state of the models at ``index`` only."""
        return AdamState({name: value[index] for name, value in self.moments.items()},
                         {name: value[index] for name, value in self.squares.items()}, self.steps[index])


def adam_step(grads: dict, state: AdamState, rate: torch.Tensor, mask: torch.Tensor,
              beta1: float = 0.9, beta2: float = 0.999, eps: float = 1e-8) -> tuple[dict, AdamState]:
    """One Adam step for a stack: ``(updates, new state)``; subtract ``updates[name]`` from each parameter.

    ``grads``: ``{name: (M, ...)}`` (already clipped); ``rate``: (M,) float64 learning rates; ``mask``: (M,)
    bool, the models that step (the others get a zero update and keep their state).  With ``m, v`` the
    moments and ``t`` the model's step count, the update is ``rate / (1 - beta1^t) * m / (sqrt(v / (1 -
    beta2^t)) + eps)``, Algorithm 1 of Kingma and Ba (2015).
    """
    steps = state.steps + mask.double()
    t = steps.clamp(min=1)
    correction1, correction2 = 1 - beta1 ** t, 1 - beta2 ** t
    moments, squares, updates = {}, {}, {}
    for name, g in grads.items():
        shape = (-1,) + (1,) * (g.dim() - 1)
        masked = mask.view(shape)
        new_moment = beta1 * state.moments[name] + (1 - beta1) * g
        new_square = beta2 * state.squares[name] + (1 - beta2) * g * g
        moments[name] = torch.where(masked, new_moment, state.moments[name])
        squares[name] = torch.where(masked, new_square, state.squares[name])
        update = (rate / correction1).to(g.dtype).view(shape) * moments[name] / (
            (squares[name] / correction2.to(g.dtype).view(shape)).sqrt() + eps)
        updates[name] = torch.where(masked, update, torch.zeros_like(update))
    return updates, AdamState(moments, squares, steps)
