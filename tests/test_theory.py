import pytest
import torch

from icl_course import LinearTransformer, RegressionTasks, expected_loss, theory


def random_covariance(d, seed):
    generator = torch.Generator().manual_seed(seed)
    rotation, _ = torch.linalg.qr(torch.randn(d, d, generator=generator, dtype=torch.float64))
    return rotation @ torch.diag(torch.rand(d, generator=generator, dtype=torch.float64) * 2 + 0.1) @ rotation.T


@pytest.mark.parametrize("weights", ["identity", "inverse"])
def test_preconditioned_loss_matches_monte_carlo_and_is_minimal(weights):
    d, n, sigma = 3, 9, 0.7
    S = random_covariance(d, 0)
    prior = None if weights == "identity" else torch.linalg.inv(S)
    tasks = RegressionTasks(d, n, sigma, covariance=S, weight_covariance=prior, dtype=torch.float64, device="cpu")
    best = theory.optimal_preconditioner(S, n, sigma, weights)
    for B in (best, 0.8 * best, best + 0.05 * torch.ones(d, d, dtype=torch.float64)):
        estimate = expected_loss(lambda b: b.alpha @ B.T, tasks, num_tasks=100_000)
        closed = theory.preconditioned_one_step_loss(B, S, n, sigma, weights)
        assert abs(estimate.mean - closed) < 4 * estimate.stderr
        if B is not best:
            assert closed > theory.preconditioned_one_step_loss(best, S, n, sigma, weights)


def test_isotropic_preconditioner_is_the_one_step_coefficient():
    eye = torch.eye(4, dtype=torch.float64)
    for weights in ("identity", "inverse"):
        B = theory.optimal_preconditioner(eye, 12, 1.5, weights)
        assert torch.allclose(B, theory.optimal_one_step_coefficient(4, 12, 1.5) * eye)
        assert theory.preconditioned_one_step_loss(B, eye, 12, 1.5, weights) == pytest.approx(theory.one_step_loss(4, 12, 1.5))


def test_identity_prior_is_not_a_multiple_of_the_inverse_covariance():
    S = torch.diag(torch.tensor([1.0, 0.1], dtype=torch.float64))
    B = theory.optimal_preconditioner(S, 20, 0.0, "identity")
    assert torch.allclose(B.diagonal(), 1 / (21 * S.diagonal() + 1.1))  # 1 / ((n+1) s + tr S) per eigenvalue
    ratio = (B @ S).diagonal()
    assert ratio[0] / ratio[1] > 1.4  # B S would be a multiple of I for a multiple of S^-1


def test_bilinear_form_reproduces_the_prediction():
    model = LinearTransformer(4, 1, 3, "full", init_scale=0.3, dtype=torch.float64, device="cpu")
    form = theory.one_layer_bilinear_form(model.layers[0])
    batch = RegressionTasks(4, 7, 0.5, dtype=torch.float64, device="cpu").sample(6, seed=0)
    by_form = (((batch.alpha @ form["B"].T) * batch.x_t).sum(-1)
               + torch.einsum("tab,abj,tj->t", batch.Sigma, form["Sigma_terms"], batch.x_t)
               + batch.label_energy * (batch.x_t @ form["label_energy_term"]))
    assert torch.allclose(by_form, model(batch).prediction, atol=1e-10)


def test_gd_construction_reads_as_c_times_identity():
    from icl_course import gd_construction
    form = theory.one_layer_bilinear_form(gd_construction(3, 10, 0.5).layers[0])
    assert torch.allclose(form["B"], 0.05 * torch.eye(3, dtype=torch.float64))
    assert form["Sigma_terms"].abs().max() == 0 and form["label_energy_term"].abs().max() == 0


def test_bad_arguments():
    with pytest.raises(ValueError, match="weights must be 'identity'"):
        theory.optimal_preconditioner(torch.eye(2), 5, 0.0, "prior")
    with pytest.raises(ValueError, match="square"):
        theory.optimal_preconditioner(torch.ones(2, 3), 5)


def test_weight_mean_shifts_the_weights():
    tasks = RegressionTasks(3, 5, weight_mean=[1.0, -2.0, 0.5], dtype=torch.float64, device="cpu")
    assert torch.allclose(tasks.sample(50_000, seed=0).w.mean(0), torch.tensor([1.0, -2.0, 0.5], dtype=torch.float64), atol=0.03)
    with pytest.raises(ValueError, match=r"weight_mean must have shape \(3,\)"):
        RegressionTasks(3, 5, weight_mean=[1.0, 2.0])
