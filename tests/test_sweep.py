import pytest
import torch

from icl_course import CategoricalNoise, LinearTransformer, RegressionTasks, UniformNoise
from icl_course.checkpoints import CheckpointError
from icl_course.evaluate import adjusted_loss
from icl_course.linalg import symmetric_eigh
from icl_course.sweep import ModelSpec, ModelStack, _TaskStream, train_sweep


@pytest.mark.parametrize("variant", ["diag", "gdpp", "full"])
def test_the_stack_computes_what_each_model_computes(variant):
    models = [LinearTransformer(4, 3, 2, variant, init_scale=0.1, seed=seed, dtype=torch.float64, device="cpu")
              for seed in range(3)]
    stack = ModelStack(models, dtype=torch.float64, device="cpu")
    batches = [RegressionTasks(4, 7, 0.5, dtype=torch.float64, device="cpu").sample(5, seed=s) for s in range(3)]
    gram = torch.stack([batch.gram for batch in batches])
    stacked = stack.final_weights(gram)
    for index, (model, batch) in enumerate(zip(models, batches)):
        torch.testing.assert_close(stacked[index], model(batch).weights, rtol=1e-10, atol=1e-12)
        exported = stack.to_model(index)
        torch.testing.assert_close(exported(batch).weights, model(batch).weights, rtol=1e-12, atol=1e-14)


def test_each_model_draws_from_its_own_noise_law():
    stream = _TaskStream([UniformNoise(2), CategoricalNoise([1, 3]), UniformNoise(0)], 3, 40, torch.float64,
                         torch.device("cpu"), seed=0)
    gram, w, weight = stream.sample(4000)
    # the residual energy of least squares estimates sigma^2 (n - d) per task
    Sigma, alpha, energy = gram[..., :3, :3], gram[..., :3, 3], gram[..., 3, 3]
    explained = (alpha.unsqueeze(-2) @ torch.linalg.solve(Sigma, alpha.unsqueeze(-1))).flatten(-3)
    sigma_squared = (energy - explained) / (40 - 3)
    assert sigma_squared[0].mean() == pytest.approx(4 / 3, rel=0.05)       # E[sigma^2] of U(0, 2)
    assert sigma_squared[1].mean() == pytest.approx(5.0, rel=0.05)         # (1 + 9) / 2
    assert sigma_squared[2].abs().max() < 1e-8
    assert w.shape == (3, 4000, 3)
    assert torch.equal(weight, torch.ones(3, 4000, dtype=torch.float64))   # no model stretched: every task weighs 1


def _specs(num_steps=(60, 40), rates=(1e-2, 1e-2)):
    return [ModelSpec(f"m{k}", UniformNoise(k + 1), seed=k, num_steps=steps, learning_rate=rate, warmup_steps=5)
            for k, (steps, rate) in enumerate(zip(num_steps, rates))]


def test_models_finish_at_their_own_step_and_training_helps():
    left = []
    results = train_sweep(_specs(), d=4, n=8, num_layers=2, batch_size=256, device="cpu", progress=False,
                          log_every=10, on_leave=lambda result: left.append(result.name))
    assert left == ["m1", "m0"]                                    # the shorter run leaves first
    assert [results[name].steps for name in ("m0", "m1")] == [60, 40]
    for name, result in results.items():
        assert result.status == "finished"
        assert result.history[-1][1] < result.history[0][1]      # the loss came down
    tasks = RegressionTasks(4, 8, UniformNoise(1), dtype=torch.float64, device="cpu")
    untrained = LinearTransformer(4, 2, 1, "diag", seed=0, dtype=torch.float64, device="cpu")
    trained = adjusted_loss(results["m0"].model, tasks, num_tasks=4000)
    assert trained.mean + 4 * trained.stderr < adjusted_loss(untrained, tasks, num_tasks=4000).mean


def test_a_diverging_model_leaves_without_stopping_the_others():
    specs = _specs(num_steps=(40, 40), rates=(1e-2, 1e3))
    results = train_sweep(specs, d=4, n=8, num_layers=3, batch_size=64, device="cpu", progress=False,
                          log_every=5, patience=5, clip_norm=None)
    assert results["m1"].status == "diverged" and results["m1"].steps < 40
    assert "in a row" in results["m1"].message
    assert results["m0"].status == "finished" and results["m0"].steps == 40


def test_a_model_whose_patience_runs_out_restarts_from_its_last_healthy_window_at_a_lower_rate():
    options = dict(d=4, n=8, num_layers=3, batch_size=64, device="cpu", progress=False, log_every=5, patience=5,
                   clip_norm=None)
    # 1e3 blows up at once; after one restart at 1e-5 of it, the rate is the one m0 trains at
    results = train_sweep(_specs(num_steps=(40, 40), rates=(1e-2, 1e3)), restarts=1, backoff=1e-5, **options)
    rescued = results["m1"]
    assert rescued.status == "finished" and rescued.steps == 40 and len(rescued.restarts) == 1
    step, went_back_to, factor = rescued.restarts[0]
    assert factor == 1e-5 and went_back_to % 5 == 0 and step - went_back_to >= 5
    assert all(torch.isfinite(value).all() for value in rescued.model.parameters())
    assert rescued.history[-1][1] < rescued.history[0][1]          # it trains after the restart
    # halving is not enough for 1e3: after its restarts the model is given up, and the message says so
    given_up = train_sweep(_specs(num_steps=(40, 40), rates=(1e-2, 1e3)), restarts=2, **options)["m1"]
    assert given_up.status == "diverged" and len(given_up.restarts) == 2 and "after 2 restarts" in given_up.message
    assert [entry[2] for entry in given_up.restarts] == [0.5, 0.25]
    with pytest.raises(ValueError, match="backoff"):
        train_sweep(_specs(), restarts=1, backoff=1.5, **options)
    with pytest.raises(ValueError, match="restarts"):
        train_sweep(_specs(), restarts=-1, **options)


def test_an_interrupted_sweep_with_a_restart_resumes_exactly(tmp_path):
    options = dict(d=4, n=8, num_layers=3, batch_size=64, device="cpu", log_every=5, checkpoint_every=10,
                   patience=5, clip_norm=None, restarts=1, backoff=1e-5)
    specs = dict(num_steps=(40, 40), rates=(1e-2, 1e3))
    reference = train_sweep(_specs(**specs), progress=False, **options)
    assert reference["m1"].restarts and reference["m1"].restarts[0][0] < 20   # restarted before the stop
    _stop_at_step_25(_specs(**specs), tmp_path / "sweep.pt", options)
    resumed = train_sweep(_specs(**specs), checkpoint=tmp_path / "sweep.pt", progress=False, **options)
    assert resumed["m1"].restarts == reference["m1"].restarts
    _assert_same_models(resumed, reference)


def _stop_at_step_25(specs, path, options):
    """Train with a checkpoint at ``path`` and stop at step 25, as an interrupted run would."""
    class Stop(Exception):
        pass

    def stop_at_25(step, losses):
        if step == 25:
            raise Stop

    with pytest.raises(Stop):
        train_sweep(specs, checkpoint=path, progress=stop_at_25, **options)


def _assert_same_models(results, reference):
    for name in reference:
        for mine, theirs in zip(results[name].model.parameters(), reference[name].model.parameters()):
            torch.testing.assert_close(mine, theirs, rtol=0, atol=0)


def test_an_interrupted_sweep_resumes_exactly(tmp_path):
    options = dict(d=4, n=8, num_layers=2, batch_size=64, device="cpu", log_every=5, checkpoint_every=10)
    reference = train_sweep(_specs(), progress=False, **options)
    _stop_at_step_25(_specs(), tmp_path / "sweep.pt", options)
    # a checkpoint written before restarts existed (none of their state) resumes the same way
    saved = torch.load(tmp_path / "sweep.pt", weights_only=True)
    for key in ("window_bad", "rate_factor", "restarts", "snapshot"):
        del saved[key]
    torch.save(saved, tmp_path / "older.pt")
    for path in ("sweep.pt", "older.pt"):
        _assert_same_models(train_sweep(_specs(), checkpoint=tmp_path / path, progress=False, **options), reference)
    with pytest.raises(CheckpointError, match="belongs to another sweep"):
        train_sweep(_specs(rates=(1e-2, 3e-3)), checkpoint=tmp_path / "sweep.pt", progress=False, **options)


def test_bad_specs_get_clear_messages():
    with pytest.raises(ValueError, match="unique name"):
        train_sweep([ModelSpec("a", 1.0), ModelSpec("a", 2.0)], progress=False, device="cpu")
    with pytest.raises(ValueError, match="unknown schedule"):
        ModelSpec("a", 1.0, schedule="linear")
    with pytest.raises(ValueError, match="learning_rate must be positive"):
        ModelSpec("a", 1.0, learning_rate=0)
    with pytest.raises(ValueError, match="sweep trains"):
        train_sweep([ModelSpec("a", 1.0)], parameterization="gd", progress=False, device="cpu")


def test_a_stack_without_stretched_models_draws_what_it_always_drew():
    stream = _TaskStream([UniformNoise(2), UniformNoise(0)], 3, 8, torch.float64, torch.device("cpu"), seed=3)
    gram, w, weight = stream.sample(50)
    generator = torch.Generator().manual_seed(3)    # the draws, in their order, of a stream before stretching
    u = torch.rand(2, 50, generator=generator, dtype=torch.float64)
    expected_w = torch.randn(2, 50, 3, generator=generator, dtype=torch.float64)
    X = torch.randn(2, 50, 8, 3, generator=generator, dtype=torch.float64)
    sigma = u * torch.tensor([[2.0], [0.0]], dtype=torch.float64)
    y = (X @ expected_w.unsqueeze(-1)).squeeze(-1) \
        + sigma.unsqueeze(-1) * torch.randn(2, 50, 8, generator=generator, dtype=torch.float64)
    tokens = torch.cat([X, y.unsqueeze(-1)], dim=-1)
    assert torch.equal(w, expected_w) and torch.equal(gram, tokens.transpose(-1, -2) @ tokens)
    assert torch.equal(weight, torch.ones_like(weight))


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_a_stretched_model_meets_rare_spectra_and_weights_them_back(device):
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("no CUDA GPU: the stretched draws on a GPU (data.stretch on the inputs' device) are not run")
    stream = _TaskStream([UniformNoise(0), UniformNoise(0)], 4, 10, torch.float64, torch.device(device), seed=0,
                         stretched=[False, True])
    gram, w, weight = stream.sample(40_000)
    smallest = symmetric_eigh(gram[..., :4, :4], eigenvectors=False)[..., 0]     # (2, B)
    rare = torch.quantile(smallest[0], 0.001)                                     # one plain task in a thousand
    assert torch.equal(weight[0], torch.ones_like(weight[0]))
    assert (smallest[1] < rare).double().mean() > 0.02                            # twenty times as often
    assert 0 < weight[1].min() and weight[1].max() <= 2.0                         # at most 1 / (1 - fraction)
    # weighted back, the stretched tasks have the plain law: E[weight] = 1 and the same mean smallest eigenvalue
    assert abs(weight[1].mean() - 1) < 4 * weight[1].std() / 200
    plain, weighted = smallest[0], weight[1] * smallest[1]
    error = (plain.var() / 40_000 + weighted.var() / 40_000).sqrt()
    assert abs(weighted.mean() - plain.mean()) < 4 * error
    # the labels follow the stretched inputs: noiseless, y = X w exactly
    alpha = gram[1, :, :4, 4]
    assert torch.allclose(alpha, (gram[1, :, :4, :4] @ w[1].unsqueeze(-1)).squeeze(-1), rtol=1e-9, atol=1e-9)


def test_a_stretched_model_resumes_exactly_and_a_plain_checkpoint_refuses_it(tmp_path):
    options = dict(d=4, n=8, num_layers=2, batch_size=64, device="cpu", log_every=5, checkpoint_every=10)

    def specs(stretched=True):
        return [ModelSpec("plain", 0.0, seed=0, num_steps=40, learning_rate=1e-2),
                ModelSpec("stretched", 0.0, seed=0, num_steps=40, learning_rate=1e-2, stretched=stretched)]
    assert "stretched" not in specs()[0].key() and specs()[1].key()["stretched"] is True
    reference = train_sweep(specs(), progress=False, **options)
    assert all(result.status == "finished" for result in reference.values())
    _stop_at_step_25(specs(), tmp_path / "sweep.pt", options)
    _assert_same_models(train_sweep(specs(), checkpoint=tmp_path / "sweep.pt", progress=False, **options), reference)
    _stop_at_step_25(specs(stretched=False), tmp_path / "plain.pt", options)
    with pytest.raises(CheckpointError, match="belongs to another sweep"):
        train_sweep(specs(), checkpoint=tmp_path / "plain.pt", progress=False, **options)
