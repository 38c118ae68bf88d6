"""Figures shared by the notebooks: one look, labelled axes, error bars where there is noise."""

from __future__ import annotations

import logging
import math
from typing import Mapping, Sequence

import matplotlib.pyplot as plt
import torch

from .baselines import least_squares, ridge
from .data import FixedNoise, RegressionTasks, UniformNoise
from .evaluate import Estimate, query_averaged_loss
from .memformer import MODELS, SETTINGS, Memformer, cg_coefficients, final_losses, paper_tasks
from .models import LinearTransformer, gd_construction
from .optimizers import conjugate_gradient, gradient_descent
from .table1.budget import column_noise
from .table1.paper import BASELINES, COLUMNS, PAPER, VARIANTS

__all__ = ["setup_notebook", "readable_log_axis", "plot_estimates", "plot_task_fits", "show_task_fits",
           "show_gd_and_transformer", "show_one_step_loss", "show_gdpp_spectrum", "show_diag_profile",
           "show_cg_coefficients", "plot_memformer_comparison", "plot_table1"]

COLORS = {
    "least squares": "#4c72b0", "oracle ridge": "#222222", "ridge": "#222222", "ConstRR": "#dd8452",
    "AdaRR": "#55a868", "TunedRR": "#c44e52", "truth": "#8c8c8c",
    # chapter 3: the optimisers GD++ is compared with, a trained model, and a task's eigenvalues
    "gradient descent": "#4c72b0", "trained model": "#c44e52", "GD++": "#8172b3",
    "Newton's iteration": "#937860", "conjugate gradient": "#da8bc3", "eigenvalues": "#dd8452",
    # chapter 4: the trained variants of Table 1 and the Bayes-optimal learner
    # (blue for Diag: chapter 4 shows no least squares or gradient descent, and green is AdaRR's)
    "Diag": "#1f77b4", "Full": "#da8bc3", "Bayes-optimal": "#937860", "Bayes": "#937860", "paper": "#8c8c8c",
    "GD++ 2": "#8172b3", "GD++ 5": "#8172b3", "Diag 2": "#7fb3e0", "Diag 3": "#1f77b4", "Diag 5": "#0b3c6e",
    "Full 5": "#da8bc3",
}


def readable_log_axis(axis) -> None:
    """Ticks of a logarithmic ``axis`` (``ax.xaxis`` or ``ax.yaxis``) at 1, 2 and 5 times the powers of ten,
    written as plain numbers (0.2, 1, 50).  Matplotlib's default labels every minor tick of an axis that
    spans less than two decades as ``3 x 10^-1``, ``4 x 10^-1``, ... which crowds it."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    axis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    axis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
    axis.set_minor_formatter(NullFormatter())


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
    left.set_title(f"one task: $d$ = {d}, $n$ = {batch.n}, $\\sigma$ = {float(batch.sigma[0]):.2g}")
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
    right.set_title("fresh queries (loss $\\frac{1}{2}E[(\\hat y - y_t)^2]$)")
    right.legend(fontsize=8)
    return axes


# -- the figures behind the widgets (icl_course.widgets puts sliders on them) ----------------------

def show_task_fits(d: int = 5, n: int = 20, sigma: float = 0.5, seed: int = 0):
    """Sample one task and draw the least-squares and oracle-ridge fits (chapter 0).

    With ``n < d`` least squares is undefined and is left out; with ``sigma = 0`` as well,
    the oracle ridge is its limit ``ridge_lambda -> 0``, the minimum-norm interpolant.
    Returns the figure.
    """
    tasks = RegressionTasks(d, n, sigma, dtype=torch.float64, device="cpu")
    batch = tasks.sample(1, seed=seed)
    weights = {}
    if n >= d:
        weights["least squares"] = least_squares(batch)[0]
    if sigma > 0:
        weights["oracle ridge"] = ridge(batch, sigma**2)[0]
    else:
        weights["oracle ridge"] = (torch.linalg.pinv(batch.X[0]) @ batch.y[0])
    queries = tasks.sample(200, seed=seed + 1).x_t
    figure, axes = plt.subplots(1, 2, figsize=(9.6, 3.6))
    plot_task_fits(batch, weights, queries, axes)
    figure.tight_layout()
    return figure


def show_gd_and_transformer(eta: float = 0.6, d: int = 10, n: int = 20, sigma: float = 0.0,
                            num_steps: int = 8, num_tasks: int = 2000, seed: int = 0):
    """GD's loss per step beside the GD-constructed transformer's loss per layer (chapter 1).

    Left: ``1/2 E||w_k - w||^2`` for ``k = 0..num_steps`` GD steps with step ``eta`` (line) and
    the loss of layer ``k`` of :func:`~icl_course.models.gd_construction` (markers).  Right: the
    last layer's predictions against the last GD iterate's, one point per task.  Returns the figure.
    """
    tasks = RegressionTasks(d, n, sigma, dtype=torch.float64, device="cpu")
    batch = tasks.sample(num_tasks, seed=seed)
    iterates = gradient_descent(batch.X, batch.y, eta, num_steps)
    with torch.no_grad():
        output = gd_construction(d, n, eta, num_steps)(batch)
    gd_losses = query_averaged_loss(iterates, batch).mean(0)
    layer_losses = query_averaged_loss(output.layer_weights, batch).mean(0)
    figure, (left, right) = plt.subplots(1, 2, figsize=(10, 3.6))
    left.plot(range(num_steps + 1), gd_losses.numpy(), color="#4c72b0", label="gradient descent")
    left.plot(range(1, num_steps + 1), layer_losses.numpy(), "o", color="#c44e52", markersize=5,
              label="constructed transformer")
    left.set_yscale("log")
    readable_log_axis(left.yaxis)
    left.set_xlabel("GD steps = transformer layers")
    left.set_ylabel("loss $\\frac{1}{2}E[(\\hat y - y_t)^2]$")
    left.set_title(f"$\\eta$ = {eta:g}, $n$ = {n}, $d$ = {d}, $\\sigma$ = {sigma:g}")
    left.legend()
    gd_predictions = (iterates[:200, -1] * batch.x_t[:200]).sum(-1)
    right.scatter(gd_predictions.numpy(), output.prediction[:200].numpy(), s=8, color="#c44e52")
    bound = float(gd_predictions.abs().max()) * 1.1 if len(gd_predictions) else 1.0
    bound = bound if bound == bound and bound < 1e6 else 1e6  # a diverging eta: keep the axes finite
    right.plot([-bound, bound], [-bound, bound], color="#8c8c8c", linewidth=1)
    right.set_xlabel(f"GD's prediction after {num_steps} steps")
    right.set_ylabel(f"transformer's prediction, {num_steps} layers")
    right.set_title("every point lies on the diagonal")
    figure.tight_layout()
    return figure


def show_one_step_loss(d: int = 10, n: int = 20, sigma: float = 1.0, train_steps: int = 200, seed: int = 0):
    """The loss of one GD step as a function of ``eta``, its optimum, and a trained layer's step (chapter 2).

    The curve is the closed form :func:`~icl_course.theory.one_step_loss` with ``c = eta / n``;
    the dashed line marks ``eta* = n / (n + d + 1 + sigma^2)``; the red marker is the step
    ``eta = -n w_yx`` that a one-layer ``diag`` model learns in ``train_steps`` Adam steps.
    Returns the figure.
    """
    from . import theory
    from .train import train

    best = n * theory.optimal_one_step_coefficient(d, n, sigma)
    etas = torch.linspace(0.0, 2.2 * best, 200, dtype=torch.float64)
    losses = [theory.one_step_loss(d, n, sigma, float(eta) / n) for eta in etas]
    model = LinearTransformer(d, 1, 1, "diag", init_scale=0.1, seed=seed, device="cpu")
    train(model, RegressionTasks(d, n, sigma, device="cpu"), train_steps, batch_size=1024,
          learning_rate=2e-2, progress=False, seed=seed)
    learned = -n * model.layers[0].diagonal_weights()["w_yx"].item()
    figure, ax = plt.subplots(figsize=(6.4, 3.6))
    ax.plot(etas.numpy(), losses, color="#4c72b0", label="closed form $\\frac{d}{2}(1 - 2cn + c^2 n(n+d+1+\\sigma^2))$")
    ax.axvline(best, color="#4c72b0", linestyle="--", label=f"optimum $\\eta^*$ = {best:.3f}")
    ax.plot([learned], [theory.one_step_loss(d, n, sigma, learned / n)], "o", color="#c44e52", markersize=8,
            label=f"trained layer: $\\eta$ = {learned:.3f}")
    ax.set_xlabel("step size $\\eta$ (prediction $\\frac{\\eta}{n}\\langle \\alpha, x_t \\rangle$)")
    ax.set_ylabel("loss $\\frac{1}{2}E[(\\hat y - y_t)^2]$")
    ax.set_title(f"$n$ = {n}, $d$ = {d}, $\\sigma$ = {sigma:g}")
    ax.set_ylim(0, max(losses[0], losses[-1]) * 1.05)
    ax.legend(fontsize=8)
    figure.tight_layout()
    return figure


def show_gdpp_spectrum(kappa: float = 100.0, gamma_scale: float = 1.0, num_layers: int = 6, d: int = 20):
    """GD++ preconditioning, layer by layer (chapter 3; Vladymyrov et al. 2024, Theorem 5.1).

    ``d`` eigenvalues spread geometrically over ``[1, kappa]``; every layer uses
    ``gamma = gamma_scale / (3 lambda_max)`` of its current spectrum (``gamma_scale = 1`` is the
    theorem's choice; :func:`~icl_course.theory.gdpp_best_one_layer_scale` is the best single layer).
    Left: the map ``lambda -> lambda (1 - gamma lambda)^2`` of the first layer; middle: the spectrum
    after each layer; right: the condition number per layer.  Returns the figure.
    """
    from . import theory

    eigenvalues = torch.logspace(0, torch.log10(torch.tensor(float(kappa))).item(), d, dtype=torch.float64)
    spectra = theory.gdpp_spectrum(eigenvalues, num_layers, gamma_scale=gamma_scale)
    figure, axes = plt.subplots(1, 3, figsize=(12, 3.5))
    grid = torch.linspace(0, float(eigenvalues.max()), 300, dtype=torch.float64)
    gamma = gamma_scale / (3 * eigenvalues.max())
    axes[0].plot(grid, grid * (1 - gamma * grid) ** 2, color=COLORS["GD++"])
    axes[0].plot(eigenvalues, eigenvalues * (1 - gamma * eigenvalues) ** 2, "o", color=COLORS["eigenvalues"],
                 markersize=4, label="the task's eigenvalues")
    axes[0].set_xlabel("eigenvalue $\\lambda$ of $\\Sigma$")
    axes[0].set_ylabel("$\\lambda(1 - \\gamma\\lambda)^2$")
    best = theory.gdpp_best_one_layer_scale(float(kappa)) / 3
    axes[0].set_title(f"one layer: $\\gamma\\lambda_{{\\max}}$ = {gamma_scale / 3:.2f} (best for one: {best:.2f})",
                      fontsize=10)
    axes[0].legend(fontsize=8)
    for layer, values in enumerate(spectra):
        axes[1].plot([layer] * d, (values / values.max()).clamp_min(1e-300), ".", color=COLORS["eigenvalues"])
    axes[1].set_yscale("log")
    axes[1].set_xlabel("layer $l$")
    axes[1].set_ylabel("eigenvalues of $\\Sigma^l$ / largest")
    conditions = theory.condition_number(spectra)
    axes[2].semilogy(range(num_layers + 1), conditions - 1, "o-", color=COLORS["GD++"])
    axes[2].set_xlabel("layer $l$")
    axes[2].set_ylabel("condition number $-$ 1")
    axes[2].set_title(f"input condition number $\\kappa$ = {kappa:g}")
    figure.tight_layout()
    return figure


def show_diag_profile(layer_1: Mapping[str, float], layer_2: Mapping[str, float], sigma_max: float = 5.0,
                      d: int = 10, n: int = 20, num_tasks: int = 1000, seed: int = 0):
    """A two-layer ``diag`` model given by its four weights per layer, across noise levels (chapter 4).

    ``layer_1``, ``layer_2``: dicts with any of ``w_xx, w_xy, w_yx, w_yy``
    (:func:`~icl_course.models.diagonal_construction`).  Left: the per-noise profile, the adjusted loss at
    fixed ``sigma`` from 0 to ``sigma_max + 1`` with 2-standard-error bars (Vladymyrov et al. 2024, Fig. 2),
    the part outside ``U(0, sigma_max)`` shaded; right: the median effective step ``<w_hat, alpha>/||alpha||^2``
    of the model and of the oracle ridge.  The same ``num_tasks`` tasks at every level, only the noise
    scaled.  Returns the figure.
    """
    from .baselines import oracle_ridge
    from .mixed_noise import effective_step
    from .models import diagonal_construction

    model = diagonal_construction(d, [dict(layer_1), dict(layer_2)])
    # FixedNoise draws nothing from the generator, so one seed gives the same X, w, x_t and unit noise at
    # every level: only sigma changes (common random numbers)
    tasks = RegressionTasks(d, n, dtype=torch.float64, device="cpu")
    sigmas = torch.linspace(0, sigma_max + 1, 9, dtype=torch.float64).tolist()
    profile, model_steps, oracle_steps = [], [], []
    with torch.no_grad():
        for sigma in sigmas:
            batch = tasks.with_noise(FixedNoise(sigma)).sample(num_tasks, seed)
            weights, oracle = model(batch).weights, oracle_ridge(batch)
            profile.append(Estimate.from_samples(query_averaged_loss(weights, batch)
                                                 - query_averaged_loss(oracle, batch)))
            model_steps.append(float(effective_step(weights, batch).median()))
            oracle_steps.append(float(effective_step(oracle, batch).median()))
        mixed = tasks.with_noise(UniformNoise(sigma_max)).sample(num_tasks, seed + 1)
        overall = Estimate.from_samples(query_averaged_loss(model(mixed).weights, mixed)
                                        - query_averaged_loss(oracle_ridge(mixed), mixed))
    figure, axes = plt.subplots(1, 2, figsize=(11, 3.6))
    plot_estimates(axes[0], sigmas, {"Diag 2": profile}, "noise level $\\sigma$ of the task",
                   "adjusted loss", title=f"mean over U(0, {sigma_max:g}): {overall:.3g}")
    axes[0].set_ylim(bottom=min(0.0, min(estimate.mean for estimate in profile)))
    axes[1].plot(sigmas, model_steps, "o-", ms=3, color=COLORS["Diag 2"], label="Diag 2")
    axes[1].plot(sigmas, oracle_steps, "o-", ms=3, color=COLORS["oracle ridge"], label="oracle ridge")
    axes[1].set_xlabel("noise level $\\sigma$ of the task")
    axes[1].set_ylabel("effective step (median)")
    axes[1].legend()
    for ax in axes:
        ax.axvspan(sigma_max, sigma_max + 1, color=COLORS["truth"], alpha=0.15, lw=0)
    figure.subplots_adjust(left=0.08, right=0.98, bottom=0.15, top=0.9, wspace=0.28)  # tight_layout: 1 s a redraw
    return figure


# -- chapter 5: shared Memformer coefficients against conjugate gradient's per-task ones -----------

def show_cg_coefficients(alpha=(0.5, 0.5, 0.5), gamma=(0.0, 0.3, 0.3), setting: str = "rotated",
                         num_tasks: int = 4000, seed: int = 0):
    """A CGD-like Memformer (``A_l = I``) with the given ``alpha_l, gamma_l`` beside CG (chapter 5).

    Left: ``log10`` of the loss ``1/2 E (w^l - w)^T S (w^l - w)`` after each layer, against CG run on each
    task with its own coefficients, on Dutta et al.'s tasks (:func:`icl_course.memformer.paper_tasks`).
    Right: the chosen ``alpha_l`` (squares) and ``gamma_l`` (triangles) over the middle 90% of CG's
    per-task step sizes ``a`` and direction weights ``beta`` at the same step.  Returns the figure.
    """
    L = len(alpha)
    batch = paper_tasks(setting).sample(num_tasks, seed=seed)
    model = Memformer(batch.d, batch.n, L, attention="identity", memory="cgd", dtype=torch.float64)
    with torch.no_grad():
        ours = query_averaged_loss(model(batch, alpha=torch.tensor(alpha), gamma=torch.tensor(gamma)).layer_weights,
                                   batch).mean(0)
    cg = query_averaged_loss(conjugate_gradient(batch.X, batch.y, L)[:, 1:], batch).mean(0)
    a, beta = cg_coefficients(batch.X, batch.y, L)
    figure, (left, right) = plt.subplots(1, 2, figsize=(9.6, 3.4))
    layers = torch.arange(1, L + 1)
    left.plot(layers, ours.log10(), "o-", color="C1", label="Memformer (shared coefficients)")
    left.plot(layers, cg.log10(), "s--", color="C0", label="CG (each task its own)")
    left.set(xlabel="layer / step l", ylabel="log10 loss (fresh tasks)", title="loss per layer",
             xticks=layers.tolist())
    left.legend(fontsize=8)
    for values, chosen, offset, marker, name in ((a, alpha, -0.12, "s", "step size"),
                                                 (beta, gamma, 0.12, "^", "direction weight")):
        low, high = values.quantile(0.05, dim=0), values.quantile(0.95, dim=0)
        right.vlines(layers + offset, low, high, color="0.6", lw=6)
        right.plot(layers + offset, chosen, marker, color="C1", label=f"chosen {name}")
    right.set(xlabel="layer l", ylabel="coefficient", title="chosen (orange) vs CG's 5-95% range (grey)",
              xticks=layers.tolist())
    right.legend(fontsize=8)
    figure.tight_layout()
    return figure


_BASELINE_STYLE = {"CG": ("k", "s", "--"), "GD (tuned steps)": ("0.45", "v", "--"),
                   "momentum": ("#8c564b", "^", ":"), "Nesterov": ("#bcbd22", "D", ":")}


def plot_memformer_comparison(results: dict):
    """Chapter 5's main figure from :func:`icl_course.memformer.load_experiments` results.

    One column per setting (rotated, isotropic).  Top: ``log10`` loss on fresh tasks against depth for the
    tuned baselines (dashed / dotted) and the trained families (solid; the mean over seeds, bars from the
    lowest to the highest seed).  Bottom: every curve divided by tuned GD's loss at the same depth, which
    separates lines that crowd on the top row.  A baseline far below everything else (CG once it has run
    ``d`` steps: exact to rounding) is drawn on the panel's lower edge as a downward triangle, with its value
    written beside it.  The legend sits below the panels.  Returns the figure.
    """
    depths = list(results["recipe"]["depths"])
    figure, axes = plt.subplots(2, 2, figsize=(11, 6.6), sharex=True)
    for column, setting in enumerate(SETTINGS):
        baselines = results["baselines"][setting]
        reference = baselines["GD (tuned steps)"]["mean"][:len(depths)]
        rows = ([], [])   # per row: (label, style, x, centre, bars) of every curve
        for name, (color, marker, style) in _BASELINE_STYLE.items():
            values = baselines[name]["mean"][:len(depths)]
            for row, shown in enumerate((values.log10(), values / reference)):
                rows[row].append((name, dict(marker=marker, ls=style, color=color, ms=5), depths, shown, None))
        for index, family in enumerate(MODELS):
            means = final_losses(results, setting, family)[0]          # (seeds, depths)
            for row, shown in enumerate((means.log10(), means / reference)):
                centre = shown.mean(0)
                bars = torch.stack([centre - shown.min(0).values, shown.max(0).values - centre])
                shift = 0.06 * (index - (len(MODELS) - 1) / 2)
                rows[row].append((family, dict(color=f"C{index}", marker="o", ms=4, capsize=2),
                                  [k + shift for k in depths], centre, bars))
        for row, curves in enumerate(rows):
            ax = axes[row, column]
            # the lower edge: a decade (top row) or a factor 10 (bottom row) below every curve but the exact ones
            values = torch.cat([curve[3] for curve in curves])
            lowest = values[values > (-12 if row == 0 else 1e-10)].min()
            floor = float(lowest - 1) if row == 0 else float(lowest / 10)
            for label, style, x, shown, bars in curves:
                below = shown < floor
                drawn = torch.where(below, torch.full_like(shown, floor), shown)
                if bars is None:
                    ax.plot(x, drawn, label=label, **style)
                else:
                    # a (2, depths) array: matplotlib 3.7 reads a list of two tensors as two scalars
                    ax.errorbar(x, drawn.numpy(), bars.numpy(), label=label, **style)
                for k in torch.nonzero(below).flatten().tolist():
                    ax.plot(x[k], floor, marker="v", color=style["color"], ms=9, ls="none")
                    value = 10 ** shown[k] if row == 0 else shown[k]
                    ax.annotate(f"{value:.0e}", (x[k], floor), textcoords="offset points", xytext=(-4, 8),
                                fontsize=7, color=style["color"], ha="right")
        axes[0, column].set(title=f"{setting} data", ylabel="log10 loss (fresh tasks)")
        axes[1, column].set(xlabel="layers L (steps for the baselines)", ylabel="loss / tuned GD's loss",
                            yscale="log", xticks=depths)
        axes[1, column].axhline(1.0, color="0.45", lw=0.8)
    handles, labels = axes[0, 0].get_legend_handles_labels()
    figure.legend(handles, labels, loc="lower center", ncol=4, fontsize=9, frameon=False)
    figure.tight_layout(rect=(0, 0.08, 1, 1))
    return figure


def plot_table1(rows: Sequence[dict], path=None):
    """Table 1 of Vladymyrov et al. (2024) as a figure: adjusted loss against depth, one panel per column.

    ``rows`` are those of :func:`icl_course.table1.run_table1` or :func:`icl_course.table1.load_results`; ours
    solid with error bars, the paper's dashed, the baselines as horizontal lines.  With ``path`` the figure
    is saved there (PNG) and closed.
    """
    columns = [column for column in COLUMNS if any(row["column"] == column for row in rows)]
    figure, axes = plt.subplots(2, math.ceil(len(columns) / 2), figsize=(3.2 * math.ceil(len(columns) / 2), 6),
                                squeeze=False, sharex=True)
    colors = {variant: COLORS[name] for variant, name in VARIANTS.items()}
    for ax, column in zip(axes.flat, columns):
        for variant in VARIANTS:
            mine = sorted((row for row in rows if row["variant"] == variant and row["column"] == column),
                          key=lambda row: row["depth"])
            if not mine:
                continue
            depths = [row["depth"] for row in mine]
            ax.errorbar(depths, [max(row["adjusted_loss"], 1e-13) for row in mine],
                        yerr=[row["stderr"] for row in mine], color=colors[variant], marker="o", ms=3,
                        label=f"{VARIANTS[variant]} (ours)")
            paper = [PAPER[variant][depth][COLUMNS.index(column)] for depth in range(1, 8)]
            ax.plot(range(1, 8), [max(value, 1e-13) for value in paper], color=colors[variant], ls="--", lw=0.8,
                    label=f"{VARIANTS[variant]} (paper)")
        for name in BASELINES:
            row = next((row for row in rows if row["variant"] == name and row["column"] == column), None)
            if row is not None and row["adjusted_loss"] > 0:
                ax.axhline(row["adjusted_loss"], color=COLORS.get(name), lw=1, ls=":", label=name)
        ax.set_yscale("log")
        ax.set_title(f"sigma in {column_noise(column).label}", fontsize=9)
        ax.set_xlabel("layers")
        ax.set_ylabel("adjusted loss")
    for ax in list(axes.flat)[len(columns):]:
        ax.axis("off")
    legend = {}   # from every panel: a baseline at 0 (AdaRR, TunedRR when sigma = 0) is drawn in none of some
    for ax in axes.flat:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            legend.setdefault(label, handle)
    handles, labels = list(legend.values()), list(legend)
    figure.legend(handles, labels, loc="lower center", ncol=min(len(labels), 9), fontsize=8)
    figure.tight_layout(rect=(0, 0.06, 1, 1))
    if path is not None:
        figure.savefig(path, dpi=110)
        plt.close(figure)
    return figure
