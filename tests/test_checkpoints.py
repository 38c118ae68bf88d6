import pytest
import torch

from icl_course import CheckpointError, LinearTransformer, RegressionTasks, load_checkpoint, load_model, save_checkpoint


@pytest.fixture
def saved(tmp_path):
    model = LinearTransformer(3, num_layers=2, num_heads=2, parameterization="full", init_scale=0.2, device="cpu")
    path = save_checkpoint(tmp_path / "model.pt", model, metadata={"command": "python make.py"})
    return model, path


def test_round_trip_keeps_weights_config_and_metadata(saved):
    model, path = saved
    checkpoint = load_checkpoint(path, device="cpu", num_layers=2)
    batch = RegressionTasks(3, 6, device="cpu").sample(5, seed=0)
    assert torch.equal(checkpoint.model(batch).prediction, model(batch).prediction)
    assert checkpoint.model.config == model.config
    assert checkpoint.metadata == {"command": "python make.py"}
    assert [p.name for p in path.parent.iterdir()] == ["model.pt"]  # no temporary file left


def test_missing_file(tmp_path):
    with pytest.raises(CheckpointError, match="no checkpoint at .*nothing.pt"):
        load_model(tmp_path / "nothing.pt")


def test_truncated_file(saved):
    _, path = saved
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    with pytest.raises(CheckpointError, match="truncated or not a checkpoint file"):
        load_model(path)


def test_text_file(tmp_path):
    path = tmp_path / "notes.pt"
    path.write_text("these are my notes")
    with pytest.raises(CheckpointError, match="truncated or not a checkpoint file"):
        load_model(path)


def test_foreign_torch_file(tmp_path):
    path = tmp_path / "other.pt"
    torch.save({"weights": torch.zeros(3)}, path)
    with pytest.raises(CheckpointError, match="not an icl-course checkpoint"):
        load_model(path)


def test_mismatched_expectations(saved):
    _, path = saved
    with pytest.raises(CheckpointError, match="parameterization: checkpoint has 'full', expected 'diag'"):
        load_model(path, parameterization="diag")


def test_weights_that_do_not_fit_the_config(saved, tmp_path):
    _, path = saved
    payload = torch.load(path, weights_only=True)
    payload["model_state"].pop("layers.1.Q")
    broken = tmp_path / "broken.pt"
    torch.save(payload, broken)
    with pytest.raises(CheckpointError, match="does not match the model it describes"):
        load_model(broken)


def test_folder_instead_of_file(tmp_path):
    with pytest.raises(CheckpointError, match="is a folder"):
        load_model(tmp_path)
