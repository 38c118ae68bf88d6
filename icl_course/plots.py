"""Figures shared by the notebooks: one look, labelled axes, error bars where there is noise."""

from __future__ import annotations

import logging
from typing import Mapping, Sequence

import matplotlib.pyplot as plt
import torch

from .evaluate import Estimate

__all__ = ["setup_notebook", "plot_estimates", "plot_task_fits"]

COLORS = {
    "least squares": "#4c72b0", "oracle ridge": "#222222", "ridge": "#222222", "ConstRR": "#dd8452",
    "AdaRR": "#55a868", "TunedRR": "#c44e52", "truth": "#8c8c8c",
    # chapter 3: the optimisers GD++ is compared with, a trained model, and a task's eigenvalues
    "gradient descent": "#4c72b0", "trained model": "#c44e52", "GD++": "#8172b3",
    "Newton's iteration": "#937860", "conjugate gradient": "#da8bc3", "eigenvalues": "#dd8452",
}


def setup_notebook() -> None:
    """PNG figures (stable under nbval, unlike SVG) and a compact, readable style."""
    try:
        from matplotlib_inline.backend_inline import set_matplotlib_formats
        set_matplotlib_formats("png")
    except ImportError:  # not in IPython: nothing to configure
        pass
    # matplotlib logs one "findfont" line per missing font family while it builds its font cache;
    # in a notebook they land in stderr above the first figure and say nothing about the course
    logging.getLogger("matplotlib.font_manager").setLevel(logging.ERROR)
    plt.rcParams.update({
        "figure.figsize": (6.4, 3.6), "figure.dpi": 100, "axes.grid": True, "grid.alpha": 0.3,
        "axes.spines.top": False, "axes.spines.right": False, "legend.frameon": False,
    })


def plot_estimates(ax, xs: Sequence[float], curves: Mapping[str, Sequence[Estimate]], xlabel: str,
                   ylabel: str, title: str | None = None, log: bool = False):
    """One line per entry of ``curves`` (name -> Estimates at ``xs``) with 2-standard-error bars."""
    for name, estimates in curves.items():
        means = [estimate.mean for estimate in estimates]
        errors = [2 * estimate.stderr for estimate in estimates]
        ax.errorbar(xs, means, yerr=errors, marker="o", markersize=3, capsize=2, label=name,
                    color=COLORS.get(name))
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if log:
        ax.set_yscale("log")
    if title:
        ax.set_title(title)
    ax.legend()
    return ax


def plot_task_fits(batch, weights: Mapping[str, torch.Tensor], queries: torch.Tensor, axes=None):
    """Task 0 of ``batch``: its true weights beside each learner's, and predictions on ``queries``.

    Shapes: ``weights`` name -> (d,), ``queries`` (m, d).  Returns the two axes.
    """
    if axes is None:
        _, axes = plt.subplots(1, 2, figsize=(9.6, 3.6))
    left, right = axes
    d = batch.d
    truth = batch.w[0].detach().cpu()
    series = {"truth": truth, **{name: value.detach().cpu() for name, value in weights.items()}}
    width = 0.8 / len(series)
    for index, (name, value) in enumerate(series.items()):
        left.bar((torch.arange(d) + (index - (len(series) - 1) / 2) * width).numpy(), value.numpy(), width,
                 label=name, color=COLORS.get(name))
    left.set_xticks(range(d), [f"$w_{{{i + 1}}}$" for i in range(d)] if d <= 12 else None)
    left.set_xlabel("coordinate of the weight vector")
    left.set_ylabel("value")
    left.set_title(f"one task: d={d}, n={batch.n}, sigma={float(batch.sigma[0]):.2g}")
    left.legend(fontsize=8)
    targets = (queries.cpu() @ truth).numpy()
    for name, value in weights.items():
        value = value.detach().cpu()
        loss = 0.5 * float(((value - truth) ** 2).sum())
        right.scatter(targets, (queries.cpu() @ value).numpy(), s=8, alpha=0.6, label=f"{name}: loss {loss:.3g}",
                      color=COLORS.get(name))
    bound = float(abs(targets).max()) * 1.1
    right.plot([-bound, bound], [-bound, bound], color=COLORS["truth"], linewidth=1, label="y_hat = y_t")
    right.set_xlabel("true target $y_t = \\langle w, x_t \\rangle$")
    right.set_ylabel("prediction $\\hat y$")
    right.set_title("fresh queries (loss = 1/2 E[(y_hat - y_t)^2])")
    right.legend(fontsize=8)
    return axes
