"""Sliders for the notebooks (ipywidgets).  Each widget wraps a plain function that draws
one figure, so a notebook can also call that function once for a static, reproducible
picture."""

from __future__ import annotations

import matplotlib.pyplot as plt
import torch

from .baselines import gradient_descent, least_squares, ridge
from .data import RegressionTasks
from .evaluate import query_averaged_loss
from .models import LinearTransformer, gd_construction
from .plots import COLORS, plot_task_fits

__all__ = ["show_task_fits", "task_explorer", "show_gd_and_transformer", "gd_explorer",
           "show_one_step_loss", "step_size_explorer", "show_gdpp_spectrum", "gdpp_explorer"]


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


def _explorer(show, **controls):
    """An ``ipywidgets.interactive`` that redraws ``show(**values)`` whenever a control moves."""
    import ipywidgets as widgets

    def draw(**values):
        show(**values)
        plt.show()

    return widgets.interactive(draw, **controls)


def task_explorer(n: int = 20, d: int = 5, sigma: float = 0.5, seed: int = 0):
    """Sliders for ``n``, ``d``, ``sigma`` and the seed around :func:`show_task_fits`."""
    import ipywidgets as widgets

    return _explorer(
        show_task_fits,
        n=widgets.IntSlider(value=n, min=1, max=60, description="n"),
        d=widgets.IntSlider(value=d, min=1, max=12, description="d"),
        sigma=widgets.FloatSlider(value=sigma, min=0.0, max=5.0, step=0.25, description="sigma"),
        seed=widgets.IntSlider(value=seed, min=0, max=20, description="seed"),
    )


def show_gd_and_transformer(eta: float = 0.6, n: int = 20, d: int = 10, sigma: float = 0.0,
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
    left.set_xlabel("GD steps = transformer layers")
    left.set_ylabel("loss $\\frac{1}{2}E[(\\hat y - y_t)^2]$")
    left.set_title(f"eta={eta:g}, n={n}, d={d}, sigma={sigma:g}")
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


def gd_explorer(eta: float = 0.6, n: int = 20, d: int = 10, sigma: float = 0.0):
    """Sliders for the step size, ``n``, ``d`` and the noise around :func:`show_gd_and_transformer`."""
    import ipywidgets as widgets

    return _explorer(
        show_gd_and_transformer,
        eta=widgets.FloatSlider(value=eta, min=0.05, max=2.5, step=0.05, description="eta"),
        n=widgets.IntSlider(value=n, min=2, max=80, description="n"),
        d=widgets.IntSlider(value=d, min=1, max=20, description="d"),
        sigma=widgets.FloatSlider(value=sigma, min=0.0, max=3.0, step=0.25, description="sigma"),
    )


def show_one_step_loss(n: int = 20, d: int = 10, sigma: float = 1.0, train_steps: int = 200, seed: int = 0):
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
    ax.axvline(best, color="#4c72b0", linestyle="--", label=f"optimum eta* = {best:.3f}")
    ax.plot([learned], [theory.one_step_loss(d, n, sigma, learned / n)], "o", color="#c44e52", markersize=8,
            label=f"trained layer: eta = {learned:.3f}")
    ax.set_xlabel("step size $\\eta$ (prediction $\\frac{\\eta}{n}\\langle \\alpha, x_t \\rangle$)")
    ax.set_ylabel("loss $\\frac{1}{2}E[(\\hat y - y_t)^2]$")
    ax.set_title(f"n={n}, d={d}, sigma={sigma:g}")
    ax.set_ylim(0, max(losses[0], losses[-1]) * 1.05)
    ax.legend(fontsize=8)
    figure.tight_layout()
    return figure


def step_size_explorer(n: int = 20, d: int = 10, sigma: float = 1.0):
    """Sliders for ``n``, ``d`` and ``sigma`` around :func:`show_one_step_loss`."""
    import ipywidgets as widgets

    return _explorer(
        show_one_step_loss,
        n=widgets.IntSlider(value=n, min=2, max=80, description="n"),
        d=widgets.IntSlider(value=d, min=1, max=20, description="d"),
        sigma=widgets.FloatSlider(value=sigma, min=0.0, max=5.0, step=0.25, description="sigma"),
    )


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
    axes[0].set_title(f"one layer: $\\gamma\\lambda_{{max}}$ = {gamma_scale / 3:.2f} (best for one: {best:.2f})",
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
    axes[2].set_title(f"kappa = {kappa:g}")
    figure.tight_layout()
    return figure


def gdpp_explorer(kappa: float = 100.0, gamma_scale: float = 1.0, num_layers: int = 6):
    """Sliders for the condition number, ``gamma`` (in units of ``1/(3 lambda_max)``) and the depth
    around :func:`show_gdpp_spectrum`."""
    import ipywidgets as widgets

    return _explorer(
        show_gdpp_spectrum,
        kappa=widgets.FloatLogSlider(value=kappa, base=10, min=0.5, max=6, step=0.25, description="kappa"),
        gamma_scale=widgets.FloatSlider(value=gamma_scale, min=0.1, max=3.0, step=0.1, description="gamma x 3 l_max"),
        num_layers=widgets.IntSlider(value=num_layers, min=1, max=15, description="layers"),
        d=widgets.fixed(20),
    )
