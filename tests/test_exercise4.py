"""Exercise 4 (mixed noise and adaptive step sizes): its trusted checks accept the answer key, agree with
the package's own references, and name the typical mistakes."""

import math

import pytest
import torch
from conftest import ROOT, answer_key_functions, verify_on_grading_inputs

from icl_course import checks
from icl_course.baselines import BayesOptimal, least_squares, noise_variance_estimate
from icl_course.data import CategoricalNoise, RegressionTasks
from icl_course.grading import checking, protocol, registry
from icl_course.grading.chapter4 import chapter_4_checks, reference_diag_layer, reference_noise_posterior
from icl_course.hints import HINTS
from icl_course.models import diagonal_construction
from icl_course.theory import two_noise_construction

SOLUTION = ROOT / "solutions" / "04_mixed_noise_and_adaptive_step_sizes.ipynb"
NAMES = ["noise_estimate", "adjusted_loss_per_task", "diag_layer", "two_noise_weights", "noise_posterior"]
FLOAT64 = dict(dtype=torch.float64)


@pytest.fixture(scope="module")
def answers():
    """The answer key's functions."""
    return answer_key_functions([SOLUTION])


run = verify_on_grading_inputs


def test_the_chapter_is_registered_with_hints_for_every_task():
    catalogue = chapter_4_checks()
    assert [(check.chapter, check.task, check.name) for check in catalogue] == \
        [(4, task, name) for task, name in enumerate(NAMES, start=1)]
    assert all(registry.CHECKS[check.name].chapter == 4 for check in catalogue)
    assert all(check.giveaways for check in catalogue)
    for name in NAMES:
        assert len(HINTS[name]) == 3 and len(set(HINTS[name])) == 3, name
    assert [row[1] for row in checks.progress(4).rows] == NAMES


@pytest.mark.parametrize("seed", [0, 1, 7, 2024, 31337])
def test_the_answer_key_passes_on_fresh_grading_inputs(answers, seed):
    for name in NAMES:
        run(name, answers[name], seed)


def test_grading_inputs_have_the_promised_shapes():
    for seed in range(30):
        for case in registry.CHECKS["noise_estimate"].grading_cases(seed):
            n, d = case.arguments["X"].shape[1:]
            assert 1 <= d <= 8 and n > d
        for case in registry.CHECKS["noise_posterior"].grading_cases(seed):
            assert 2 <= len(case.arguments["levels"]) <= 4 and 1.0 not in case.arguments["levels"]
        for case in registry.CHECKS["two_noise_weights"].grading_cases(seed):
            assert case.arguments["sigma_1"] != case.arguments["sigma_2"]
    draws = [registry.CHECKS["diag_layer"].grading_cases(seed)[-1].arguments["tokens"] for seed in (3, 4)]
    assert draws[0].shape != draws[1].shape or not torch.equal(*draws)


# -- the references of the checks agree with the package -------------------------------------------

def test_the_diag_layer_reference_is_the_model_of_diagonal_construction():
    generator = torch.Generator().manual_seed(0)
    d, n = 3, 7
    X, y, x_t = (torch.randn(*shape, generator=generator, **FLOAT64) for shape in ((5, n, d), (5, n), (5, d)))
    weights = dict(w_xx=-0.1, w_xy=0.05, w_yx=-0.2, w_yy=0.03)
    tokens = torch.cat([torch.cat([X, y.unsqueeze(-1)], -1),
                        torch.cat([x_t, torch.zeros(5, 1, **FLOAT64)], -1).unsqueeze(1)], 1)
    moved = reference_diag_layer(tokens, **weights)
    model = diagonal_construction(d, [weights])
    with torch.no_grad():
        assert torch.allclose(model(X, y, x_t).prediction, -moved[:, -1, -1], atol=1e-12)
        assert torch.allclose(model.transform_tokens(tokens)[1], moved, atol=1e-12)
        # a second layer reads the moved context, and the query's label slot is no longer 0
        second = dict(w_xx=0.02, w_xy=-0.04, w_yx=0.1, w_yy=-0.05)
        two = diagonal_construction(d, [weights, second])
        assert torch.allclose(two(X, y, x_t).prediction, -reference_diag_layer(moved, **second)[:, -1, -1],
                              atol=1e-12)


def test_the_answer_keys_diag_layer_matches_the_model(answers):
    generator = torch.Generator().manual_seed(1)
    tokens = torch.randn(3, 9, 5, generator=generator, **FLOAT64)
    weights = dict(w_xx=0.03, w_xy=-0.02, w_yx=0.07, w_yy=-0.01)
    with torch.no_grad():
        expected = diagonal_construction(4, [weights]).transform_tokens(tokens)[1]
    assert torch.allclose(answers["diag_layer"](tokens, **weights), expected, atol=1e-12)


def test_the_posterior_reference_is_that_of_the_bayes_optimal_learner():
    levels = [0.3, 1.5, 2.0]
    batch = RegressionTasks(4, 6, CategoricalNoise(levels), **FLOAT64, device="cpu").sample(32, seed=0)
    expected = BayesOptimal(CategoricalNoise(levels)).posterior(batch)
    assert torch.allclose(reference_noise_posterior(batch.X, batch.y, levels), expected, atol=1e-10)
    # fewer examples than dimensions: X X^T is singular, the posterior is still defined
    wide = RegressionTasks(6, 3, CategoricalNoise(levels), **FLOAT64, device="cpu").sample(8, seed=1)
    assert torch.allclose(reference_noise_posterior(wide.X, wide.y, levels),
                          BayesOptimal(CategoricalNoise(levels)).posterior(wide), atol=1e-10)


def test_the_answer_keys_posterior_agrees_with_bayes_optimal(answers):
    levels = [1.0, 3.0]
    batch = RegressionTasks(5, 12, CategoricalNoise(levels), **FLOAT64, device="cpu").sample(64, seed=2)
    posterior = answers["noise_posterior"](batch.X, batch.y, levels)
    assert torch.allclose(posterior, BayesOptimal(CategoricalNoise(levels)).posterior(batch), atol=1e-10)
    assert torch.allclose(posterior.sum(-1), torch.ones(64, **FLOAT64))


def test_the_two_noise_weights_solve_both_equations_and_have_a_closed_form(answers):
    n, sigma_1, sigma_2 = 300, 1.0, 3.0
    w_yx, w_yy = answers["two_noise_weights"](n, sigma_1, sigma_2)
    assert isinstance(w_yx, float) and isinstance(w_yy, float)
    reference = two_noise_construction(n, sigma_1, sigma_2)
    assert math.isclose(w_yx, reference[0]["w_yx"], rel_tol=1e-12)
    assert math.isclose(w_yy, reference[1]["w_yy"], rel_tol=1e-12)
    for sigma in (sigma_1, sigma_2):
        assert math.isclose(-(1 + n * sigma**2 * w_yy) * w_yx, 1 / (1 + sigma**2), rel_tol=1e-12)
    a, b = sigma_1**2, sigma_2**2   # the closed form the last hint gives
    assert math.isclose(w_yx, -(1 + a + b) / ((1 + a) * (1 + b)), rel_tol=1e-12)
    assert math.isclose(w_yy, -1 / (n * (1 + a + b)), rel_tol=1e-12)


def test_the_answer_keys_noise_estimate_is_the_package_s(answers):
    batch = RegressionTasks(3, 10, CategoricalNoise([0.5, 2.0]), **FLOAT64, device="cpu").sample(16, seed=3)
    assert torch.allclose(answers["noise_estimate"](batch.X, batch.y), noise_variance_estimate(batch.X, batch.y),
                          rtol=1e-10)


def test_the_answer_keys_adjusted_loss_is_that_of_the_evaluation_code(answers):
    from icl_course.baselines import oracle_ridge
    from icl_course.evaluate import query_averaged_loss
    batch = RegressionTasks(4, 9, CategoricalNoise([1.0, 3.0]), **FLOAT64, device="cpu").sample(16, seed=4)
    w_hat = least_squares(batch.X, batch.y)
    expected = query_averaged_loss(w_hat, batch) - query_averaged_loss(oracle_ridge(batch), batch)
    got = answers["adjusted_loss_per_task"](w_hat, batch.X, batch.y, batch.w, batch.sigma)
    assert torch.allclose(got, expected, atol=1e-12)


# -- typical mistakes fail with a message that names them --------------------------------------------

def _residual_sum(X, y):
    residuals = y - (X @ torch.linalg.lstsq(X, y.unsqueeze(-1)).solution).squeeze(-1)
    return (residuals**2).sum(-1)


def _oracle_gap(w_hat, X, y, w, sigma, variance):
    d = X.shape[-1]
    Sigma, alpha = X.transpose(1, 2) @ X, X.transpose(1, 2) @ y.unsqueeze(-1)
    w_oracle = torch.linalg.solve(Sigma + variance.reshape(-1, 1, 1) * torch.eye(d, **FLOAT64), alpha).squeeze(-1)
    return ((w_hat - w) ** 2).sum(-1), ((w_oracle - w) ** 2).sum(-1)


def _diag_variant(tokens, w_xx, w_xy, w_yx, w_yy, read_query=False, late_labels=False):
    x, y = tokens[..., :-1], tokens[..., -1]
    read = tokens if read_query else tokens[:, :-1]
    X, labels = read[..., :-1], read[..., -1]
    Sigma, alpha, energy = X.transpose(1, 2) @ X, (X * labels.unsqueeze(-1)).sum(1), (labels**2).sum(1)
    new_x = x + w_xx * x @ Sigma + w_xy * y.unsqueeze(-1) * alpha.unsqueeze(1)
    source = new_x if late_labels else x
    new_y = y + w_yx * (source @ alpha.unsqueeze(-1)).squeeze(-1) + w_yy * energy.unsqueeze(-1) * y
    return torch.cat([new_x, new_y.unsqueeze(-1)], -1)


def _posterior_variant(X, y, levels, squared=True, log_determinant=True, normalised=True):
    n = X.shape[1]
    levels = torch.tensor(levels, **FLOAT64)
    variances = levels**2 if squared else levels
    C = (X @ X.transpose(1, 2)).unsqueeze(1) + variances.reshape(-1, 1, 1) * torch.eye(n, **FLOAT64)
    quadratic = (y[:, None, None, :] @ torch.linalg.solve(C, y[:, None, :, None])).reshape(C.shape[:2])
    log_likelihood = -0.5 * (quadratic + (torch.logdet(C) if log_determinant else 0))
    return torch.softmax(log_likelihood, -1) if normalised else log_likelihood.exp()


def _weights(n, sigma_1, sigma_2, sign=1):
    first, second = two_noise_construction(n, sigma_1, sigma_2)
    return sign * first["w_yx"], second["w_yy"]


MISTAKES = [
    ("noise_estimate", lambda X, y: _residual_sum(X, y) / X.shape[1], "degrees of freedom"),
    ("noise_estimate", lambda X, y: (_residual_sum(X, y) / (X.shape[1] - X.shape[2])).sqrt(), "standard deviation"),
    ("noise_estimate", lambda X, y: (_residual_sum(X, y) / X.shape[1]).sqrt(), "averaged over all n"),
    ("noise_estimate", lambda X, y: (y**2).sum(-1) / (X.shape[1] - X.shape[2]),
     r"least-squares residuals; the furthest task at \[\d\]: expected [-\d.e]+, got [-\d.e]+"),
    ("adjusted_loss_per_task",
     lambda w_hat, X, y, w, sigma: torch.sub(*_oracle_gap(w_hat, X, y, w, sigma, sigma**2)), "twice"),
    ("adjusted_loss_per_task",
     lambda w_hat, X, y, w, sigma: 0.5 * torch.sub(*_oracle_gap(w_hat, X, y, w, sigma, sigma)), "sigma\\^2, not sigma"),
    ("adjusted_loss_per_task",
     lambda w_hat, X, y, w, sigma: -0.5 * torch.sub(*_oracle_gap(w_hat, X, y, w, sigma, sigma**2)), "sign is flipped"),
    ("adjusted_loss_per_task", lambda w_hat, X, y, w, sigma: 0.5 * ((w_hat - w) ** 2).sum(-1), "subtract the oracle"),
    ("diag_layer", lambda tokens, **weights: _diag_variant(tokens, **weights, read_query=True), "context tokens only"),
    ("diag_layer", lambda tokens, **weights: _diag_variant(tokens, **weights, late_labels=True),
     "already-updated inputs"),
    ("diag_layer", lambda tokens, **weights: 2 * tokens - _diag_variant(tokens, **weights), "sign is flipped"),
    ("diag_layer", lambda tokens, **weights: _diag_variant(tokens, **weights) - tokens, "add the residual"),
    ("diag_layer", lambda tokens, w_xx, w_xy, w_yx, w_yy: _diag_variant(tokens, w_xx, w_yx, w_xy, w_yy),
     "w_xy and w_yx are swapped"),
    ("two_noise_weights", lambda n, sigma_1, sigma_2: _weights(n, sigma_1, sigma_2, sign=-1),
     "paper, which drops a minus"),
    ("two_noise_weights", lambda n, sigma_1, sigma_2: _weights(n, sigma_1**0.5, sigma_2**0.5),
     "variances sigma\\^2, not sigma"),
    ("two_noise_weights", lambda n, sigma_1, sigma_2: _weights(n, sigma_1, sigma_2)[::-1], "order \\(w_yx, w_yy\\)"),
    ("two_noise_weights", lambda n, sigma_1, sigma_2: (-1.0, 0.0), r"does not solve.*; expected \(-"),
    ("noise_posterior", lambda X, y, levels: _posterior_variant(X, y, levels, log_determinant=False),
     "log-determinant term is missing"),
    ("noise_posterior", lambda X, y, levels: _posterior_variant(X, y, levels, squared=False), "sigma_k\\^2 I"),
    ("noise_posterior", lambda X, y, levels: _posterior_variant(X, y, levels, normalised=False), "sum to 1"),
]


@pytest.mark.parametrize("name, mistake, message", MISTAKES, ids=[f"{name}-{index}" for index, (name, _, _)
                                                                 in enumerate(MISTAKES)])
@pytest.mark.parametrize("seed", [0, 5])
def test_a_typical_mistake_fails_with_a_message_that_names_it(name, mistake, message, seed):
    with pytest.raises(checking.CheckFailed, match=message):
        run(name, mistake, seed)


@pytest.mark.parametrize("name, mistake, message", MISTAKES, ids=[f"{name}-{index}" for index, (name, _, _)
                                                                 in enumerate(MISTAKES)])
def test_the_self_check_already_names_the_mistake(name, mistake, message):
    """The fixed examples alone (what a learner sees first) diagnose every typical mistake."""
    check = registry.CHECKS[name]
    with pytest.raises(checking.CheckFailed, match=message):
        for case in check.examples():
            check.verify(case, protocol.portable(mistake(**case.arguments)))


def test_outputs_of_the_wrong_kind_are_named():
    with pytest.raises(checking.CheckFailed, match="Python float.*use .item"):
        run("two_noise_weights", lambda n, sigma_1, sigma_2: (torch.tensor(-0.5), -0.001), seed=0)
    with pytest.raises(checking.CheckFailed, match="pair"):
        run("two_noise_weights", lambda n, sigma_1, sigma_2: -0.5, seed=0)
    with pytest.raises(checking.CheckFailed, match="must have shape"):
        run("noise_estimate", lambda X, y: y, seed=0)
    with pytest.raises(checking.CheckFailed, match="must have shape"):
        run("noise_posterior", lambda X, y, levels: torch.ones(X.shape[0], **FLOAT64), seed=0)
    with pytest.raises(checking.CheckFailed, match="must have shape"):
        run("diag_layer", lambda tokens, w_xx, w_xy, w_yx, w_yy: tokens[:, :-1], seed=0)


def test_the_self_check_of_the_answer_key_passes_and_a_wrong_answer_points_to_the_hints(answers, capsys):
    for name in NAMES:
        checks.self_check(name, answers[name])
    assert capsys.readouterr().out.count(": passed (") == len(NAMES)
    with pytest.raises(checks.SelfCheckFailed, match=r"stuck\? checks.hint\('noise_estimate'\)"):
        checks.self_check("noise_estimate", lambda X, y: _residual_sum(X, y) / X.shape[1])


def test_recorded_outputs_are_verified_in_the_graders_process(answers, tmp_path, monkeypatch):
    monkeypatch.setenv(protocol.ANSWERS_VARIABLE, str(tmp_path))
    protocol.write_cases(NAMES, tmp_path, 13)
    for name in NAMES:
        checks.record(name, answers[name])
    checks.record("diag_layer", lambda tokens, **weights: _diag_variant(tokens, **weights, read_query=True))
    verdicts = protocol.verify_recorded(NAMES, tmp_path, 13)
    assert "context tokens only" in verdicts.pop("diag_layer")
    assert verdicts == {name: "" for name in NAMES if name != "diag_layer"}


def test_giveaways_name_the_package_references():
    source = ("from icl_course.baselines import BayesOptimal, CategoricalNoise\n"
              "def noise_posterior(X, y, levels):\n    return BayesOptimal(CategoricalNoise(levels)).posterior(X)\n")
    assert protocol.giveaways_used(source, registry.CHECKS["noise_posterior"].giveaways) == \
        ["BayesOptimal", "CategoricalNoise", "baselines"]
    source = "def two_noise_weights(n, sigma_1, sigma_2):\n    return theory.two_noise_construction(n, 1, 3)\n"
    assert protocol.giveaways_used(source, registry.CHECKS["two_noise_weights"].giveaways) == \
        ["theory", "two_noise_construction"]

