"""Chapter 4's evaluations (icl_course.mixed_noise): the four weights, the effective step, heavy tails."""

import json

import pytest
import torch

from icl_course import FixedNoise, LinearTransformer, RegressionTasks, UniformNoise, adjusted_loss, oracle_ridge
from icl_course.mixed_noise import (
    PROFILE_SIGMAS,
    compute_results,
    diagonal_weights_table,
    effective_step,
    load_results,
    per_task_adjusted_losses,
    tail_summary,
)
from icl_course.models import diagonal_construction

D, N = 4, 12


def test_the_weights_table_reads_what_the_construction_set():
    layers = [dict(w_xx=-0.1, w_xy=2e-3), dict(w_yx=-0.3, w_yy=-4e-3)]
    table = diagonal_weights_table(diagonal_construction(D, layers))
    expected = torch.tensor([[-0.1, 2e-3, 0, 0], [0, 0, -0.3, -4e-3]], dtype=torch.float64)
    assert torch.allclose(table, expected, rtol=1e-12, atol=1e-15)


def test_the_weights_table_sums_heads_and_rejects_other_parameterisations():
    model = LinearTransformer(D, num_layers=2, num_heads=3, parameterization="diag", init_scale=0.5, seed=1)
    layer = model.layers[1]
    expected = (layer.p[:, 1] * layer.q[:, 0]).sum()        # w_yx = sum over heads of p_y q_x
    assert torch.isclose(diagonal_weights_table(model)[1, 2], expected.double().detach())
    with pytest.raises(ValueError, match="diag"):
        diagonal_weights_table(LinearTransformer(D, num_layers=1, parameterization="full"))


def test_effective_step_is_the_step_of_one_gradient_step_and_shrinks_for_ridge():
    batch = RegressionTasks(D, N, noise=1.0, dtype=torch.float64).sample(64, seed=0)
    assert torch.allclose(effective_step(0.07 * batch.alpha, batch), torch.full((64,), 0.07, dtype=torch.float64))
    one_step = diagonal_construction(D, [dict(w_yx=-0.05)])     # the prediction's step is -w_yx
    assert torch.allclose(effective_step(one_step(batch), batch), torch.full((64,), 0.05, dtype=torch.float64))
    tasks = RegressionTasks(D, N, dtype=torch.float64)
    quiet, noisy = (effective_step(oracle_ridge(sample), sample).median()
                    for sample in (tasks.with_noise(FixedNoise(sigma)).sample(2000, seed=1) for sigma in (0.1, 3.0)))
    assert noisy < 0.7 * quiet


def test_per_task_losses_are_the_tasks_of_the_paired_estimate():
    model = diagonal_construction(D, [dict(w_yx=-0.05), dict(w_yy=-1e-3)])
    tasks = RegressionTasks(D, N, noise=UniformNoise(2), dtype=torch.float64, device="cpu")
    losses, features = per_task_adjusted_losses(model, tasks, 3000, chunk_size=1000, seed=7)
    estimate = adjusted_loss(model, tasks, num_tasks=3000, chunk_size=1000, seed=7)
    assert losses.shape == (3000,) and abs(float(losses.mean()) - estimate.mean) < 1e-12
    batch = tasks.sample(1000, seed=7)                         # the first chunk, drawn again
    assert torch.allclose(features["label_energy"][:1000], batch.label_energy)
    assert torch.allclose(features["sigma"][:1000], batch.sigma)
    assert (features["smallest_eigenvalue"] <= features["largest_eigenvalue"]).all()


def test_tail_summary_separates_a_heavy_tail_from_the_typical_task():
    losses = torch.full((1000,), 0.1, dtype=torch.float64)
    losses[17] = 1e6
    features = {"label_energy": torch.arange(1000, dtype=torch.float64)}
    summary = tail_summary(losses, features, worst=1)
    assert summary["largest"] == [1e6] and summary["worst_label_energy"] == [17.0]
    assert abs(summary["mean_without_worst"] - 0.1) < 1e-12 and summary["median"] == pytest.approx(0.1)
    assert summary["share_of_mean_from_worst"] == pytest.approx(1e6 / (1e6 + 999 * 0.1))
    assert summary["mean"] == pytest.approx(losses.mean().item()) and summary["stderr"] > 900


def test_load_results_says_what_is_wrong(tmp_path):
    with pytest.raises(FileNotFoundError, match="python -m icl_course.mixed_noise"):
        load_results(tmp_path / "missing.json")
    corrupt = tmp_path / "corrupt.json"
    corrupt.write_text("{not json")
    with pytest.raises(ValueError, match="not a valid results file"):
        load_results(corrupt)


def test_the_shipped_results_cover_what_chapter_4_reads():
    results = load_results()
    assert results["num_tasks"] >= 1_000_000 and results["sigmas"] == list(PROFILE_SIGMAS)
    for name in ("Diag 3", "Diag 5"):                      # deep models: the full count at every level
        assert all(entry["num_tasks"] == results["num_tasks"] for entry in results["profiles"][name])
    assert all(len(values) == len(PROFILE_SIGMAS) for values in results["profiles"].values())
    assert all(len(values) == 5 for values in results["per_layer"].values())
    assert len(results["floor"]) == 10 and all(tail["num_tasks"] >= 1_000_000 for tail in results["tails"].values())


@pytest.mark.slow
def test_compute_results_writes_what_load_results_reads(tmp_path):
    path = tmp_path / "evaluations.json"
    written = compute_results(num_tasks=400, path=path, log=lambda message: None, tuning_tasks=2000)
    assert json.loads(path.read_text()) == load_results(path) and written["num_tasks"] == 400
    assert written["profiles"]["Bayes"][0]["mean"] >= -1e-9     # nobody beats the oracle at sigma = 0
