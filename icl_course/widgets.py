"""Sliders for the notebooks (ipywidgets).  Each widget wraps a plain function of
:mod:`icl_course.plots` that draws one figure, so a notebook can also call that function once for
a static, reproducible picture (the figure functions are re-exported here for the notebooks)."""

from __future__ import annotations

import matplotlib.pyplot as plt

from .plots import show_gd_and_transformer, show_gdpp_spectrum, show_one_step_loss, show_task_fits

__all__ = ["explorer", "show_task_fits", "task_explorer", "show_gd_and_transformer", "gd_explorer",
           "show_one_step_loss", "step_size_explorer", "show_gdpp_spectrum", "gdpp_explorer"]


def explorer(show, **controls):
    """An ``ipywidgets.interactive`` that redraws ``show(**values)`` whenever a control moves (the
    ``controls`` are ipywidgets' abbreviations: a tuple for a slider, a list for a drop-down)."""
    import ipywidgets as widgets

    def draw(**values):
        show(**values)
        plt.show()

    return widgets.interactive(draw, **controls)


def task_explorer(n: int = 20, d: int = 5, sigma: float = 0.5, seed: int = 0):
    """Sliders for ``n``, ``d``, ``sigma`` and the seed around :func:`show_task_fits`."""
    import ipywidgets as widgets

    return explorer(
        show_task_fits,
        n=widgets.IntSlider(value=n, min=1, max=60, description="n"),
        d=widgets.IntSlider(value=d, min=1, max=12, description="d"),
        sigma=widgets.FloatSlider(value=sigma, min=0.0, max=5.0, step=0.25, description="sigma"),
        seed=widgets.IntSlider(value=seed, min=0, max=20, description="seed"),
    )


def gd_explorer(eta: float = 0.6, n: int = 20, d: int = 10, sigma: float = 0.0):
    """Sliders for the step size, ``n``, ``d`` and the noise around :func:`show_gd_and_transformer`."""
    import ipywidgets as widgets

    return explorer(
        show_gd_and_transformer,
        eta=widgets.FloatSlider(value=eta, min=0.05, max=2.5, step=0.05, description="eta"),
        n=widgets.IntSlider(value=n, min=2, max=80, description="n"),
        d=widgets.IntSlider(value=d, min=1, max=20, description="d"),
        sigma=widgets.FloatSlider(value=sigma, min=0.0, max=3.0, step=0.25, description="sigma"),
    )


def step_size_explorer(n: int = 20, d: int = 10, sigma: float = 1.0):
    """Sliders for ``n``, ``d`` and ``sigma`` around :func:`show_one_step_loss`."""
    import ipywidgets as widgets

    return explorer(
        show_one_step_loss,
        n=widgets.IntSlider(value=n, min=2, max=80, description="n"),
        d=widgets.IntSlider(value=d, min=1, max=20, description="d"),
        sigma=widgets.FloatSlider(value=sigma, min=0.0, max=5.0, step=0.25, description="sigma"),
    )


def gdpp_explorer(kappa: float = 100.0, gamma_scale: float = 1.0, num_layers: int = 6):
    """Sliders for the condition number, ``gamma`` (in units of ``1/(3 lambda_max)``) and the depth
    around :func:`show_gdpp_spectrum`."""
    import ipywidgets as widgets

    return explorer(
        show_gdpp_spectrum,
        kappa=widgets.FloatLogSlider(value=kappa, base=10, min=0.5, max=6, step=0.25, description="kappa"),
        gamma_scale=widgets.FloatSlider(value=gamma_scale, min=0.1, max=3.0, step=0.1, description="gamma x 3 l_max"),
        num_layers=widgets.IntSlider(value=num_layers, min=1, max=15, description="layers"),
        d=widgets.fixed(20),
    )
