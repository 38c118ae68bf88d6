import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from icl_course.widgets import (  # noqa: E402
    coefficient_explorer,
    diag_explorer,
    gd_explorer,
    gdpp_explorer,
    show_diag_profile,
    show_gd_and_transformer,
    show_gdpp_spectrum,
    show_one_step_loss,
    show_task_fits,
    step_size_explorer,
    task_explorer,
)


@pytest.mark.parametrize("show, arguments", [
    (show_task_fits, {}), (show_task_fits, {"n": 3, "d": 5, "sigma": 0.0}),
    (show_gd_and_transformer, {}), (show_gd_and_transformer, {"eta": 2.4}),
    (show_one_step_loss, {"train_steps": 20}),
    (show_gdpp_spectrum, {}), (show_gdpp_spectrum, {"gamma_scale": 3.0, "kappa": 1e6}),
    (show_diag_profile, {"layer_1": {"w_yx": -0.05}, "layer_2": {"w_yy": -1e-3, "w_yx": -0.02}, "num_tasks": 200}),
])
def test_every_figure_has_labelled_axes(show, arguments):
    figure = show(**arguments)
    for axes in figure.axes:
        assert axes.get_xlabel() and axes.get_ylabel()
    plt.close(figure)


@pytest.mark.parametrize("explorer", [task_explorer, gd_explorer, step_size_explorer, gdpp_explorer, diag_explorer,
                                      coefficient_explorer])
def test_explorers_offer_sliders(explorer):
    import ipywidgets
    widget = explorer()
    # the children, not widget.kwargs: ipywidgets 7 fills kwargs only at the first redraw
    controls = [child for child in widget.children if isinstance(child, ipywidgets.ValueWidget)]
    assert len(controls) >= 3
    plt.close("all")


@pytest.mark.parametrize("explorer", [task_explorer, gd_explorer, step_size_explorer, gdpp_explorer, diag_explorer,
                                      coefficient_explorer])
def test_explorers_redraw_when_a_value_settles_and_label_their_sliders_in_words_or_maths(explorer):
    import re
    widget = explorer()
    controls = [control for control in widget.kwargs_widgets if hasattr(control, "continuous_update")]
    assert controls and not any(control.continuous_update for control in controls)
    for control in controls:
        # outside $...$ (typeset by JupyterLab) no code: no w_xx, sigma_max, x1e-02
        words = re.sub(r"\$[^$]*\$", "", control.description)
        assert control.description.count("$") % 2 == 0, control.description
        assert not re.search(r"[_^]|\de-?\d|\b(sigma|eta|kappa|gamma|lambda)\b", words), control.description
    assert len({control.style.description_width for control in controls}) == 1, "the sliders line up"
    plt.close("all")


def test_the_coefficient_sliders_start_on_their_step_grid_inside_their_range():
    # a trained value between two steps would show one number and draw another
    widget = coefficient_explorer(alpha=(1.1238, 3.7, 0.859), gamma=(-0.0108, 0.2798, 2.0))
    values = {control.description: control.value for control in widget.kwargs_widgets}
    assert list(values.values()) == [1.1, 3.0, 0.85, 0.0, 0.3, 1.5]
    for control in widget.kwargs_widgets:
        assert abs(control.value / control.step - round(control.value / control.step)) < 1e-9
    plt.close("all")
