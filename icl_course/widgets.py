"""Sliders for the notebooks (ipywidgets).  Each widget wraps a plain function that draws
one figure, so a notebook can also call that function once for a static, reproducible
picture."""

from __future__ import annotations

import matplotlib.pyplot as plt
import torch

from .baselines import least_squares, ridge
from .data import RegressionTasks
from .plots import plot_task_fits

__all__ = ["show_task_fits", "task_explorer"]


def show_task_fits(n: int = 20, d: int = 5, sigma: float = 0.5, seed: int = 0):
    """Sample one task and draw the least-squares and oracle-ridge fits (chapter 0).

    With ``n < d`` least squares is undefined and is left out; with ``sigma = 0`` as well,
    the oracle ridge is its limit ``ridge_lambda -> 0``, the minimum-norm interpolant.
    Returns the figure.
    """
    tasks = RegressionTasks(d, n, sigma, dtype=torch.float64, device="cpu")
    batch = tasks.sample(1, seed=seed)
    weights = {}
    if n >= d:
        weights["least squares"] = least_squares(batch.X, batch.y)[0]
    if sigma > 0:
        weights["oracle ridge"] = ridge(batch.X, batch.y, sigma**2)[0]
    else:
        weights["oracle ridge"] = (torch.linalg.pinv(batch.X[0]) @ batch.y[0])
    queries = tasks.sample(200, seed=seed + 1).x_t
    figure, axes = plt.subplots(1, 2, figsize=(9.6, 3.6))
    plot_task_fits(batch, weights, queries, axes)
    figure.tight_layout()
    return figure


def task_explorer(n: int = 20, d: int = 5, sigma: float = 0.5, seed: int = 0):
    """Sliders for ``n``, ``d``, ``sigma`` and the seed around :func:`show_task_fits`."""
    import ipywidgets as widgets

    def draw(n, d, sigma, seed):
        show_task_fits(n, d, sigma, seed)
        plt.show()

    return widgets.interactive(
        draw,
        n=widgets.IntSlider(value=n, min=1, max=60, description="n"),
        d=widgets.IntSlider(value=d, min=1, max=12, description="d"),
        sigma=widgets.FloatSlider(value=sigma, min=0.0, max=5.0, step=0.25, description="sigma"),
        seed=widgets.IntSlider(value=seed, min=0, max=20, description="seed"),
    )
