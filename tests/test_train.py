
import pytest
import torch

from icl_course import (
    CheckpointError,
    LinearTransformer,
    RegressionTasks,
    TrainingDiverged,
    load_checkpoint,
    theory,
    train,
)
from icl_course.evaluate import expected_loss
from icl_course.train import learning_rate_factor


def small_setup(**model_kwargs):
    tasks = RegressionTasks(4, 10, 0.0, device="cpu")
    model = LinearTransformer(4, device="cpu", **{"num_layers": 1, "parameterization": "diag", **model_kwargs})
    return model, tasks


def test_one_layer_training_reaches_the_one_step_optimum():
    model, tasks = small_setup()
    history = train(model, tasks, 400, batch_size=512, learning_rate=2e-2, progress=False)
    loss = expected_loss(model, tasks, num_tasks=50_000)
    optimum = theory.one_step_loss(4, 10)
    assert history.losses[-1] < history.losses[0] / 2
    assert optimum - 4 * loss.stderr <= loss.mean <= optimum * 1.01 + 4 * loss.stderr


class Interrupt(Exception):
    pass


class InterruptingTasks(RegressionTasks):
    """A sampler that raises after a number of batches, like a Colab session that dies."""

    def __init__(self, *args, stop_after, **kwargs):
        super().__init__(*args, **kwargs)
        self.remaining = stop_after

    def sample(self, num_tasks, seed=None):
        if self.remaining == 0:
            raise Interrupt
        self.remaining -= 1
        return super().sample(num_tasks, seed)

    def __repr__(self):  # the checkpoint compares samplers by their description
        return "RegressionTasks(d=4, n=10, noise=sigma=0.5)"


def test_an_interrupted_run_resumes_to_exactly_the_same_result(tmp_path):
    settings = dict(num_steps=40, batch_size=64, learning_rate=1e-2, checkpoint_every=10, progress=False)
    reference, tasks = small_setup(num_layers=2)
    tasks = RegressionTasks(4, 10, 0.5, device="cpu")
    expected = train(reference, tasks, **settings)

    path = tmp_path / "run.pt"
    interrupted, _ = small_setup(num_layers=2)
    with pytest.raises(Interrupt):
        train(interrupted, InterruptingTasks(4, 10, 0.5, device="cpu", stop_after=25), checkpoint=path, **settings)
    assert load_checkpoint(path).training_state["step"] == 20

    resumed, _ = small_setup(num_layers=2)
    history = train(resumed, tasks, checkpoint=path, **settings)
    assert history.resumed_at == 20
    assert history.losses == expected.losses
    for a, b in zip(resumed.parameters(), reference.parameters()):
        assert torch.equal(a, b)

    # a finished run returns at once with its history and the same weights
    again, _ = small_setup(num_layers=2)
    assert train(again, tasks, checkpoint=path, **settings).losses == expected.losses
    assert all(torch.equal(a, b) for a, b in zip(again.parameters(), reference.parameters()))


def test_a_checkpoint_of_another_run_is_refused_not_overwritten(tmp_path):
    model, tasks = small_setup()
    path = tmp_path / "run.pt"
    train(model, tasks, 5, batch_size=32, progress=False, checkpoint=path)
    before = path.read_bytes()
    with pytest.raises(CheckpointError, match="learning_rate: checkpoint has 0.001, this call has 0.01"):
        train(model, tasks, 5, batch_size=32, learning_rate=1e-2, progress=False, checkpoint=path)
    other, _ = small_setup(num_layers=2)
    with pytest.raises(CheckpointError, match="num_layers: checkpoint has 1, this call has 2"):
        train(other, tasks, 5, batch_size=32, progress=False, checkpoint=path)
    assert path.read_bytes() == before


def test_divergence_is_reported_and_leaves_no_checkpoint(tmp_path):
    model, tasks = small_setup(parameterization="full", init_scale=0.5)
    path = tmp_path / "run.pt"
    with pytest.raises(TrainingDiverged, match="Lower learning_rate"):
        train(model, tasks, 200, batch_size=64, learning_rate=10.0, clip_norm=None, progress=False,
              checkpoint=path, checkpoint_every=1000)
    assert not path.exists()


def test_a_single_loss_spike_does_not_stop_a_run():
    """One batch with an ill-conditioned task spikes the loss; only a lasting explosion is divergence."""
    model, tasks = small_setup()

    class OneSpike:
        """The same tasks, except that the batch of step 5 has weights and labels 100 times larger."""

        def __init__(self, inner):
            self.inner, self.calls = inner, 0
            self.d, self.dtype, self.device = inner.d, inner.dtype, inner.device

        def sample(self, size, generator):
            batch = self.inner.sample(size, generator)
            self.calls += 1
            if self.calls == 6:
                batch = type(batch)(batch.X, 100 * batch.y, batch.x_t, 100 * batch.y_t, 100 * batch.w, batch.sigma)
            return batch

    history = train(model, OneSpike(tasks), 20, batch_size=32, learning_rate=1e-3, progress=False)
    assert history.num_steps == 20 and history.losses[5] > 1e3 * history.losses[0]
    spiky = OneSpike(tasks)
    with pytest.raises(TrainingDiverged, match="diverged at step 5"):
        train(small_setup()[0], spiky, 20, batch_size=32, learning_rate=1e-3, progress=False,
              divergence_patience=1)


def test_learning_rate_schedules():
    assert learning_rate_factor(0, 100, "cosine", 0) == 1.0
    assert learning_rate_factor(50, 100, "cosine", 0) == pytest.approx(0.5)
    assert learning_rate_factor(99, 100, "cosine", 0) < 1e-3
    assert learning_rate_factor(4, 100, "cosine", 10) == pytest.approx(0.5)
    assert learning_rate_factor(70, 100, "constant", 0) == 1.0


@pytest.mark.parametrize("change, message", [
    (dict(schedule="linear"), "unknown schedule 'linear'"),
    (dict(num_steps=-1), "num_steps must be an integer >= 0"),
    (dict(batch_size=0), "batch_size must be a positive integer"),
    (dict(divergence_patience=0), "divergence_patience must be a positive integer"),
    (dict(learning_rate=0.0), "learning_rate must be positive"),
    (dict(sampler=RegressionTasks(5, 10, device="cpu")), "built for d=4 but the sampler draws d=5"),
    (dict(sampler=RegressionTasks(4, 10, dtype=torch.float64, device="cpu")), "same dtype= and device="),
])
def test_bad_training_arguments(change, message):
    model, tasks = small_setup()
    arguments = dict(model=model, sampler=tasks, num_steps=3, progress=False)
    arguments.update(change)
    with pytest.raises(ValueError, match=message):
        train(**arguments)


def test_a_gpu_named_without_its_index_is_the_device_its_parameters_report(monkeypatch):
    """``"cuda"`` resolves to ``cuda:<current>`` (what a parameter moved there reports), so that ``train`` does not
    refuse a sampler made with ``device="cuda"`` for a model moved to ``"cuda"`` (it did, on a GPU)."""
    from icl_course.runtime import resolve_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    assert resolve_device("cuda") == resolve_device("auto") == torch.device("cuda", 1)
    assert resolve_device("cuda:0") == torch.device("cuda", 0)
    assert resolve_device("mps") == torch.device("mps", 0)
    assert resolve_device("cpu") == torch.device("cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("cuda") == torch.device("cuda")    # left as asked: available_device then refuses it
