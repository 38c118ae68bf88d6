"""The course's closed forms, as functions a notebook can assert against.

Chapters add to this module; each function names the paper and equation it makes
executable.
"""

from __future__ import annotations

from .data import NoiseLike, as_noise

__all__ = ["optimal_one_step_coefficient", "one_step_loss"]


def optimal_one_step_coefficient(d: int, n: int, noise: NoiseLike = 0.0) -> float:
    """The best ``c`` in the one-layer prediction ``y_hat = c <alpha, x_t>``.

    For ``x ~ N(0, I_d)``, ``w ~ N(0, I_d)`` and noise with ``E[sigma^2] = s2`` the loss
    ``1/2 E||c alpha - w||^2`` uses ``E<alpha, w> = n d`` and
    ``E||alpha||^2 = n d (n + d + 1) + n d s2`` (Wishart second moment), so

        c* = 1 / (n + d + 1 + E[sigma^2]).

    In GD terms ``c = eta / n``: the noiseless optimum is ``eta* = n / (n + d + 1)``
    (Mahankali et al. 2023, seed 004; COURSE.md chapter 2).
    """
    return 1.0 / (n + d + 1 + as_noise(noise).second_moment)


def one_step_loss(d: int, n: int, noise: NoiseLike = 0.0, coefficient: float | None = None) -> float:
    """``1/2 E[(c <alpha, x_t> - y_t)^2]`` in closed form (``c`` defaults to the optimum).

    ``= d/2 * (1 - 2 c n + c^2 n (n + d + 1 + E[sigma^2]))``; at ``c*`` this is
    ``d/2 * (1 - n / (n + d + 1 + E[sigma^2]))``: the one-layer row of Table 1 before the
    oracle's loss is subtracted.
    """
    second_moment = as_noise(noise).second_moment
    if coefficient is None:
        coefficient = optimal_one_step_coefficient(d, n, noise)
    c = coefficient
    return 0.5 * d * (1 - 2 * c * n + c**2 * n * (n + d + 1 + second_moment))
