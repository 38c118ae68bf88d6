"""Sliders for the notebooks (ipywidgets).  Each widget wraps a plain function of
:mod:`icl_course.plots` that draws one figure, so a notebook can also call that function once for
a static, reproducible picture (the figure functions are re-exported here for the notebooks)."""

from __future__ import annotations

import math

import matplotlib.pyplot as plt

from . import plots
from .plots import show_diag_profile, show_gd_and_transformer, show_gdpp_spectrum, show_one_step_loss, show_task_fits

__all__ = ["explorer", "show_task_fits", "task_explorer", "show_gd_and_transformer", "gd_explorer",
           "show_one_step_loss", "step_size_explorer", "show_gdpp_spectrum", "gdpp_explorer",
           "show_diag_profile", "diag_explorer", "coefficient_explorer"]


def explorer(show, **controls):
    """An ``ipywidgets.interactive`` that redraws ``show(**values)`` whenever a control settles on a
    new value (the ``controls`` are widgets or ipywidgets' abbreviations: a tuple for a slider, a list
    for a drop-down).

    A slider sends its value when it is released (or moved by a key), a text box when Enter is pressed
    or it loses focus: a figure redrawn on every step of a drag or every key typed falls behind the
    hand and shows half-drawn states.  The labels get one width, so that the sliders line up."""
    import ipywidgets as widgets

    def draw(**values):
        show(**values)
        plt.show()

    interactive = widgets.interactive(draw, **controls)
    for control in interactive.kwargs_widgets:
        if hasattr(control, "continuous_update"):
            control.continuous_update = False
        if hasattr(control, "style") and hasattr(control.style, "description_width"):
            control.style.description_width = _LABEL_WIDTH
            control.layout.width = _CONTROL_WIDTH   # the label's room comes on top of the slider's
    return interactive


# wide enough for the longest label below ("layer 1: w_xy (x 10^-4)" as typeset maths)
_LABEL_WIDTH = "12em"
_CONTROL_WIDTH = "34em"


def task_explorer(d: int = 5, n: int = 20, sigma: float = 0.5, seed: int = 0):
    """Sliders for ``n``, ``d``, ``sigma`` and the seed around :func:`show_task_fits`."""
    import ipywidgets as widgets

    return explorer(
        show_task_fits,
        n=widgets.IntSlider(value=n, min=1, max=60, description="examples $n$"),
        d=widgets.IntSlider(value=d, min=1, max=12, description="dimension $d$"),
        sigma=widgets.FloatSlider(value=sigma, min=0.0, max=5.0, step=0.25, description=r"label noise $\sigma$"),
        seed=widgets.IntSlider(value=seed, min=0, max=20, description="random seed"),
    )


def gd_explorer(eta: float = 0.6, d: int = 10, n: int = 20, sigma: float = 0.0):
    """Sliders for the step size, ``n``, ``d`` and the noise around :func:`show_gd_and_transformer`."""
    import ipywidgets as widgets

    return explorer(
        show_gd_and_transformer,
        eta=widgets.FloatSlider(value=eta, min=0.05, max=2.5, step=0.05, description=r"step size $\eta$"),
        n=widgets.IntSlider(value=n, min=2, max=80, description="examples $n$"),
        d=widgets.IntSlider(value=d, min=1, max=20, description="dimension $d$"),
        sigma=widgets.FloatSlider(value=sigma, min=0.0, max=3.0, step=0.25, description=r"label noise $\sigma$"),
    )


def step_size_explorer(d: int = 10, n: int = 20, sigma: float = 1.0):
    """Sliders for ``n``, ``d`` and ``sigma`` around :func:`show_one_step_loss`."""
    import ipywidgets as widgets

    return explorer(
        show_one_step_loss,
        n=widgets.IntSlider(value=n, min=2, max=80, description="examples $n$"),
        d=widgets.IntSlider(value=d, min=1, max=20, description="dimension $d$"),
        sigma=widgets.FloatSlider(value=sigma, min=0.0, max=5.0, step=0.25, description=r"label noise $\sigma$"),
    )


def gdpp_explorer(kappa: float = 100.0, gamma_scale: float = 1.0, num_layers: int = 6):
    """Sliders for the condition number, ``gamma`` (in units of ``1/(3 lambda_max)``) and the depth
    around :func:`show_gdpp_spectrum`."""
    import ipywidgets as widgets

    return explorer(
        show_gdpp_spectrum,
        kappa=widgets.FloatLogSlider(value=kappa, base=10, min=0.5, max=6, step=0.25,
                                     description=r"condition number $\kappa$"),
        gamma_scale=widgets.FloatSlider(value=gamma_scale, min=0.1, max=3.0, step=0.1,
                                        description=r"$\gamma$ (units of $1/(3\lambda_{\max})$)"),
        num_layers=widgets.IntSlider(value=num_layers, min=1, max=15, description="layers $L$"),
        d=widgets.fixed(20),
    )


# The four weights differ by orders of magnitude (Sigma and alpha are sums over n tokens, lambda a sum
# of squares), so each slider moves its weight in a unit of its own, named in its label.
_DIAG_UNITS = {"w_xx": 1e-2, "w_xy": 1e-4, "w_yx": 1e-2, "w_yy": 1e-4}
_DIAG_TEX = {name: f"w_{{{name[2:]}}}" for name in _DIAG_UNITS}


def diag_explorer(layer_1: dict | None = None, layer_2: dict | None = None, sigma_max: float = 5.0):
    """Sliders for the weights of a two-layer ``diag`` model and the largest noise level ``sigma_max``
    around :func:`show_diag_profile` (chapter 4).  Defaults: the shipped two-layer Diag model trained on
    ``U(0, 5)``, rounded to the sliders' steps.

    All four weights of layer 1 have sliders; of layer 2 only ``w_yx`` and ``w_yy``: the last layer's
    ``w_xx`` and ``w_xy`` move the tokens' ``x`` after the last read, so no prediction depends on them.
    """
    import ipywidgets as widgets

    if layer_1 is None or layer_2 is None:
        from .mixed_noise import diagonal_weights_table
        from .table1 import load_table1_model

        table = diagonal_weights_table(load_table1_model("diag", 2, "5"))
        names = tuple(_DIAG_UNITS)
        layer_1 = dict(zip(names, table[0].tolist())) if layer_1 is None else layer_1
        layer_2 = dict(zip(names, table[1].tolist())) if layer_2 is None else layer_2

    def slider(layer: int, name: str, value: float):
        unit = _DIAG_UNITS[name]
        scaled = value / unit
        low, high = (-abs(scaled) * 3 - 1, 1.0) if scaled < 0 else (-1.0, abs(scaled) * 3 + 1)
        scale = f"$\\times 10^{{{round(math.log10(unit))}}}$"
        return widgets.FloatSlider(value=round(scaled, 1), min=round(low, 1), max=round(high, 1), step=0.1,
                                   description=f"layer {layer}: ${_DIAG_TEX[name]}$ ({scale})")

    moved = [(1, name) for name in _DIAG_UNITS] + [(2, "w_yx"), (2, "w_yy")]
    controls = {f"{name}_{layer}": slider(layer, name, float((layer_1, layer_2)[layer - 1].get(name, 0.0)))
                for layer, name in moved}

    def show(sigma_max, **scaled):
        weights = [{name: scaled[f"{name}_{layer}"] * unit for name, unit in _DIAG_UNITS.items()
                    if f"{name}_{layer}" in scaled} for layer in (1, 2)]
        return show_diag_profile(weights[0], weights[1], sigma_max=sigma_max)

    return explorer(show, sigma_max=widgets.FloatSlider(value=sigma_max, min=0.5, max=7.0, step=0.5,
                                                         description=r"largest noise $\sigma_{\max}$"), **controls)


# -- chapter 5 ------------------------------------------------------------------------------------

def coefficient_explorer(alpha=(0.5, 0.5, 0.5), gamma=(0.0, 0.3, 0.3), setting: str = "rotated"):
    """Sliders for three layers' step sizes ``alpha_l`` and direction weights ``gamma_l`` around
    :func:`icl_course.plots.show_cg_coefficients` (chapter 5).

    The sliders start at the given values rounded to their step of 0.05 and clipped to their range: a
    value between two steps would show one number and draw another, and a key press from it lands on
    a step the learner did not ask for."""
    import ipywidgets as widgets

    def show(**values):
        return plots.show_cg_coefficients([values[f"alpha_{k}"] for k in (1, 2, 3)],
                                          [values[f"gamma_{k}"] for k in (1, 2, 3)], setting=setting)

    def slider(value, low, high, description):
        start = min(max(round(float(value) * 20) / 20, low), high)
        return widgets.FloatSlider(value=start, min=low, max=high, step=0.05, description=description,
                                   style={"description_width": "initial"})

    controls = {f"alpha_{k}": slider(alpha[k - 1], 0.0, 3.0, f"step size, layer {k}") for k in (1, 2, 3)}
    controls.update({f"gamma_{k}": slider(gamma[k - 1], -0.5, 1.5, f"direction weight, layer {k}")
                     for k in (1, 2, 3)})
    return explorer(show, **controls)
