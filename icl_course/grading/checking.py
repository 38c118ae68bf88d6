"""What a check is, and the helpers its ``verify`` is built from.

A :class:`Check` is the graded property of one exercise function: example inputs (what the self-check
shows), a way to draw fresh inputs from a seed (what grading uses), and ``verify``, which compares one
output with the package's reference functions and raises :class:`CheckFailed` saying what is wrong.
Each chapter's catalogue (:mod:`icl_course.grading.chapter1` and so on) builds its checks from this
module alone: it imports nothing else of :mod:`icl_course.grading`, so the catalogues, the registry that
collects them (:mod:`icl_course.grading.registry`) and the runtime that runs them
(:mod:`icl_course.grading.protocol`) import one another in one direction only.

Every comparison helper is written so that NaN or an infinity never passes (see :func:`close`).
"""

from __future__ import annotations

import math
import numbers
import random
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy
import torch

__all__ = ["Case", "Check", "CheckFailed", "FLOAT64", "fail", "expect_tensor", "expect_number", "expect_pair",
           "describe", "close", "mismatch", "plural", "generator_from", "normal"]

FLOAT64 = dict(dtype=torch.float64, device="cpu")


class CheckFailed(AssertionError):
    """An output does not have the graded property; the message says which and why."""


@dataclass
class Case:
    """One call of a learner's function: its keyword ``arguments`` and what ``verify`` needs besides."""

    arguments: dict
    context: dict = field(default_factory=dict)

    @property
    def label(self) -> str:
        """The case for a message: its numbers and its tensors' shapes, ``B=2, n=5, tokens of shape (2, 6, 3)``."""
        shown = {key: value for key, value in self.arguments.items() if isinstance(value, (int, float))}
        shapes = {key: tuple(value.shape) for key, value in self.arguments.items() if isinstance(value, torch.Tensor)}
        parts = [f"{key}={value:g}" if isinstance(value, float) else f"{key}={value}" for key, value in shown.items()]
        parts += [f"{key} of shape {shape}" for key, shape in shapes.items()]
        return ", ".join(parts)


@dataclass(frozen=True)
class Check:
    """The graded property of one exercise function.

    ``examples()`` gives the self-check's cases; ``draw(rng)`` gives fresh cases from a
    ``random.Random``; ``verify(case, output)`` raises :class:`CheckFailed` when the output is wrong.
    ``giveaways`` are package names whose use in the answer cell the grader reports; those that the
    package defines as functions, classes or methods are withheld from the graded kernel by the
    sandbox (:mod:`icl_course.grading.stripped`).
    """

    chapter: int
    task: int
    name: str
    examples: Callable[[], list]
    draw: Callable[[random.Random], list]
    verify: Callable[[Case, Any], None]
    giveaways: tuple = ()

    def grading_cases(self, seed: int) -> list[Case]:
        """The examples, then fresh cases drawn from ``seed`` (the same on every machine)."""
        return self.examples() + self.draw(random.Random(f"{self.name}:{int(seed)}"))


# -- helpers for verify ------------------------------------------------------------------------

def fail(message: str):
    """Raise :class:`CheckFailed` with ``message`` (what is wrong, for the learner)."""
    raise CheckFailed(message)


def expect_tensor(value, shape: tuple, what: str) -> torch.Tensor:
    """``value`` as float64 when it is a finite floating-point tensor of ``shape``; otherwise fail saying why."""
    if not isinstance(value, torch.Tensor):
        fail(f"{what} must be a torch tensor, got {describe(value)}")
    if tuple(value.shape) != tuple(shape):
        fail(f"{what} must have shape {tuple(shape)}, got {tuple(value.shape)}")
    if not value.is_floating_point():
        fail(f"{what} must be a floating-point tensor, got {value.dtype}")
    if not torch.isfinite(value).all():
        fail(f"{what} contains NaN or infinite values")
    return value.to(torch.float64)


def expect_number(value, what: str, integer: bool = False) -> float:
    """``value`` as a float when it is a finite Python number (an ``int`` with ``integer``); otherwise fail."""
    allowed = numbers.Integral if integer else numbers.Real
    if isinstance(value, bool) or not isinstance(value, allowed):
        fail(f"{what} must be a Python {'int' if integer else 'float'}, got {describe(value)}"
              + (" (use .item())" if isinstance(value, torch.Tensor) else ""))
    if not math.isfinite(value):
        fail(f"{what} is {value}")
    return float(value)


def expect_pair(value, what: str) -> tuple:
    """``value`` as a tuple when it is a pair; otherwise fail."""
    if not isinstance(value, (tuple, list)) or len(value) != 2:
        fail(f"{what} must return a pair, got {describe(value)}")
    return tuple(value)


def plural(count: int, noun: str) -> str:
    """``"1 layer"``, ``"3 layers"``."""
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


def describe(value) -> str:
    """What ``value`` is, for a message: ``a tensor of shape (3, 4)``, ``a tuple of length 3``, ``a float``."""
    if isinstance(value, torch.Tensor):
        return f"a tensor of shape {tuple(value.shape)}"
    if isinstance(value, (tuple, list)):
        return f"a {type(value).__name__} of length {len(value)}"
    if isinstance(value, str) and value.startswith("<"):
        return value.strip("<>")
    return f"a {type(value).__name__}"


def close(got: torch.Tensor, expected: torch.Tensor, tolerance: float = 1e-7) -> bool:
    """Whether ``got`` is within ``tolerance`` of ``expected``, relative to ``expected``'s largest entry.

    Written so that NaN or an infinity anywhere is never close: every comparison is "is within", which
    is False for NaN, and both tensors must be finite first."""
    got, expected = torch.as_tensor(got), torch.as_tensor(expected)
    if not (torch.isfinite(got).all() and torch.isfinite(expected).all()):
        return False
    return bool((got - expected).abs().max() <= tolerance * (1 + expected.abs().max()))


def mismatch(got: torch.Tensor, expected: torch.Tensor) -> str:
    """Where ``got`` is furthest from ``expected``, for a message: ``at [1, 3]: expected 0.25, got 0.5``."""
    error = (got - expected).abs().nan_to_num(nan=math.inf)
    index = tuple(int(i) for i in numpy.unravel_index(int(error.argmax()), tuple(error.shape)))
    where = f" at [{', '.join(map(str, index))}]" if index else ""
    return f"{where}: expected {expected[index].item():.6g}, got {got[index].item():.6g}"


def generator_from(rng: random.Random) -> torch.Generator:
    """A CPU torch generator seeded from ``rng``: a case drawn from a seed is the same on every machine."""
    return torch.Generator().manual_seed(rng.getrandbits(62))


def normal(generator: torch.Generator, *shape) -> torch.Tensor:
    """Standard normal float64 CPU entries of ``shape``, drawn from ``generator``."""
    return torch.randn(*shape, generator=generator, **FLOAT64)
