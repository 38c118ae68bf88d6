import pytest
import torch

from icl_course import CheckpointError, expected_loss
from icl_course.models import LinearSelfAttention
from icl_course.shipped import RECIPES, checkpoint_path, load_pretrained, main, make_tasks, recipe, train_pretrained


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_every_recipe_ships_a_checkpoint_that_matches_it(name):
    model, history = load_pretrained(name, device="cpu")
    spec = recipe(name)
    assert all(model.config[key] == value for key, value in spec["model"].items())
    assert len(history.losses) == spec["train"]["num_steps"]
    assert checkpoint_path(name).stat().st_size < 1_000_000
    # it learned something: far below the loss of predicting zero, d/2
    loss = expected_loss(model, make_tasks(name, device="cpu"), num_tasks=5000)
    assert loss.mean < 0.5 * spec["model"]["d"] / 2


def test_unknown_names_list_the_known_ones():
    with pytest.raises(ValueError, match="available: ch1_full_2_layers"):
        recipe("gpt-5")


def test_retraining_a_short_recipe_resumes_from_its_file(tmp_path, monkeypatch):
    monkeypatch.setitem(RECIPES, "tiny", {
        "about": "test", "model": {"d": 2, "num_layers": 1, "parameterization": "diag", "seed": 0},
        "tasks": {"d": 2, "n": 6, "noise": {"uniform": 1.0}},
        "train": {"num_steps": 6, "batch_size": 16, "learning_rate": 1e-2}})
    path = tmp_path / "tiny.pt"
    model, history = train_pretrained("tiny", path, device="cpu", progress=False)
    again, resumed = train_pretrained("tiny", path, device="cpu", progress=False)
    assert resumed.losses == history.losses and resumed.resumed_at == 6
    assert torch.equal(model.layers[0].p, again.layers[0].p)


def test_command_line_lists_models(capsys):
    main(["--list"])
    assert "ch1_full_2_layers" in capsys.readouterr().out


def test_layer_from_matrices_checks_shapes():
    layer = LinearSelfAttention.from_matrices(torch.eye(3), 2 * torch.eye(3))
    assert layer.num_heads == 1 and torch.equal(layer.Q[0], 2 * torch.eye(3))
    with pytest.raises(ValueError, match=r"P and Q must both have shape"):
        LinearSelfAttention.from_matrices(torch.eye(3), torch.eye(4))


def test_missing_shipped_checkpoint_says_how_to_make_it(monkeypatch, tmp_path):
    import icl_course.shipped as shipped
    monkeypatch.setattr(shipped, "DIRECTORY", tmp_path)
    with pytest.raises(CheckpointError, match="python -m icl_course.shipped ch1_full_2_layers"):
        load_pretrained("ch1_full_2_layers")
