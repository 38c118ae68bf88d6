"""The exact eigenvalue law of X^T X and the expected losses computed from it (icl_course.spectra)."""

import math
from fractions import Fraction

import pytest
import torch

from icl_course import RegressionTasks, memformer, spectra
from icl_course.evaluate import Estimate, per_layer_loss, query_averaged_loss
from icl_course.optimizers import gradient_descent


@pytest.mark.parametrize("d, n", [(5, 20), (2, 7), (3, 4)])
def test_the_density_has_the_wishart_moments(d, n):
    moments = spectra.eigenvalue_moments(d, n, 4)
    # real Wishart W_d(n, I): E tr W = n d, E tr W^2 = n d (n + d + 1),
    # E tr W^3 = n d (n^2 + d^2 + 3 n d + 3 n + 3 d + 4); one eigenvalue's moments are these over d
    assert moments[0] == 1 and moments[1] == n and moments[2] == n * (n + d + 1)
    assert moments[3] == n * (n * n + d * d + 3 * n * d + 3 * n + 3 * d + 4)
    s = torch.linspace(0, 40 * n, 400_001, dtype=torch.float64)
    values = spectra.density(s, d, n)
    assert values.min() >= 0
    assert torch.trapezoid(values, s).item() == pytest.approx(1, abs=1e-6)   # the rule's own error


def test_the_density_matches_sampled_eigenvalues():
    X = torch.randn(200_000, 20, 5, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    eigenvalues = torch.linalg.eigvalsh(X.transpose(-1, -2) @ X).flatten()
    edges = torch.tensor([0.0, 5, 10, 20, 30, 45, 1e9], dtype=torch.float64)
    s = torch.linspace(0, 400, 800_001, dtype=torch.float64)
    rho = spectra.density(s)
    for low, high in zip(edges[:-1], edges[1:]):
        inside = (s >= low) & (s <= high)
        exact = torch.trapezoid(rho[inside], s[inside]).item()
        sampled = ((eigenvalues >= low) & (eigenvalues < high)).double().mean().item()
        error = math.sqrt(exact * (1 - exact) / eigenvalues.numel() * 5)   # 5 eigenvalues of a task: not independent
        assert abs(sampled - exact) < 4 * error, (low.item(), high.item(), sampled, exact)


def test_tail_counts_agree_with_the_density():
    assert spectra.eigenvalues_above(0) == 5
    s = torch.linspace(60, 600, 1_000_001, dtype=torch.float64)
    assert spectra.eigenvalues_above(60) == pytest.approx(5 * torch.trapezoid(spectra.density(s), s).item(),
                                                         rel=1e-8)   # the trapezoid rule's error
    assert spectra.eigenvalues_above(100) < spectra.eigenvalues_above(80) < spectra.eigenvalues_above(60)


@pytest.mark.parametrize("num_nodes", [8, 41, 64])
def test_the_gauss_rule_is_exact_to_its_degree(num_nodes):
    nodes, weights = spectra.gauss_rule(5, 20, num_nodes)
    assert (weights > 0).all() and (nodes > 0).all() and (nodes.diff() > 0).all()
    moments = spectra.eigenvalue_moments(5, 20, 2 * num_nodes + 1)
    for k in (0, 1, 2, num_nodes, 2 * num_nodes - 1):
        # in the log domain: at degree 127 the nodes' powers are beyond float64
        log_terms = torch.log(weights) + k * torch.log(nodes)
        quadrature = torch.logsumexp(log_terms, 0).item()
        exact = math.log(moments[k].numerator) - math.log(moments[k].denominator)
        assert quadrature == pytest.approx(exact, abs=1e-11), k


def test_sizes_without_a_finite_density_are_refused():
    with pytest.raises(ValueError, match="n - d is odd"):
        spectra.eigenvalue_density(10, 20)
    with pytest.raises(ValueError, match="n >= d"):
        spectra.eigenvalue_density(5, 2)
    with pytest.raises(ValueError, match="at most"):
        spectra.gauss_rule(5, 20, spectra.MAX_NODES + 1)
    with pytest.raises(ValueError, match="6 layers|nodes"):
        spectra.gdpp_memformer_loss(*(torch.zeros(6, dtype=torch.float64),) * 4)
    with pytest.raises(ValueError, match="one length"):
        spectra.gdpp_memformer_residuals(torch.ones(3), torch.zeros(2), torch.zeros(3), torch.ones(3), torch.zeros(3))


def test_the_best_shared_residual_at_one_step_is_the_closed_form():
    best = spectra.best_shared_residual(1)
    d, n = 5, 20
    assert best["exact"] == Fraction(d * (d + 1), 2 * (n + d + 1))      # chapter 5, section 1
    assert best["loss"] == pytest.approx(memformer.one_layer_optimum("isotropic", "CGD-like (scalars)"), rel=1e-12)


def test_the_best_shared_residual_is_reached_by_gd_with_its_steps():
    tasks = RegressionTasks(5, 20, dtype=torch.float64, device="cpu")
    batch = tasks.sample(100_000, seed=3)
    previous = math.inf
    for steps in (2, 3):
        best = spectra.best_shared_residual(steps)
        assert (best["roots"] > 0).all() and best["loss"] < previous
        previous = best["loss"]
        path = gradient_descent(batch.X, batch.y, best["gd_steps"], steps)
        sampled = Estimate.from_samples(query_averaged_loss(path[:, -1], batch))
        assert abs(sampled.mean - best["loss"]) < 4 * sampled.stderr
        # any other steps lose more, exactly
        other = best["gd_steps"] * 1.05
        nodes, weights = spectra.gauss_rule(5, 20, 16)
        residual = torch.prod(1 - other[:, None] * nodes[None] / 20, 0)
        assert 2.5 * (weights * residual**2).sum() > best["loss"]


def test_gdpp_memformer_residuals_are_the_token_forward():
    w_xx = torch.tensor([-0.3, -1.2, 0.4], dtype=torch.float64)
    w_yx = torch.tensor([-0.5, -1.4, -7.0], dtype=torch.float64)
    alpha = torch.tensor([1.0, 0.8, 1.1], dtype=torch.float64)
    gamma = torch.tensor([0.0, -0.05, 0.2], dtype=torch.float64)
    model = spectra.gdpp_memformer(w_xx, w_yx, alpha, gamma, num_heads=2)
    batch = RegressionTasks(5, 20, dtype=torch.float64, device="cpu").sample(500, seed=1)
    eigenvalues, vectors = torch.linalg.eigh(batch.Sigma)                          # Sigma = X^T X
    residuals = spectra.gdpp_memformer_residuals(eigenvalues, w_xx, w_yx, alpha, gamma)   # (L, B, d)
    components = (vectors.transpose(-1, -2) @ batch.w.unsqueeze(-1)).squeeze(-1)      # w in the eigenbasis
    by_spectrum = batch.w[None] - (vectors[None] @ (residuals * components[None]).unsqueeze(-1)).squeeze(-1)
    with torch.no_grad():
        by_tokens = model(batch).layer_weights.transpose(0, 1)
    assert (by_spectrum - by_tokens).abs().max() < 1e-10


def test_gdpp_memformer_loss_is_the_sampled_loss():
    w_xx = torch.tensor([-0.3, -1.4], dtype=torch.float64)
    w_yx = torch.tensor([-0.4, -3.0], dtype=torch.float64)
    alpha, gamma = torch.ones(2, dtype=torch.float64), torch.tensor([0.0, 0.1], dtype=torch.float64)
    exact = spectra.gdpp_memformer_loss(w_xx, w_yx, alpha, gamma)
    model = spectra.gdpp_memformer(w_xx, w_yx, alpha, gamma)
    sampled = per_layer_loss(model, RegressionTasks(5, 20, dtype=torch.float64, device="cpu"), 200_000, seed=2)
    for estimate, value in zip(sampled, exact):
        assert abs(estimate.mean - value.item()) < 4 * estimate.stderr
    # without memory and with alpha = 1 it is chapter 4's GD++ residual on X^T X / n
    nodes, _ = spectra.gauss_rule(5, 20, 16)
    from icl_course.theory import gdpp_residual
    plain = spectra.gdpp_memformer_residuals(nodes, w_xx, w_yx, alpha, torch.zeros(2, dtype=torch.float64))[-1]
    assert torch.allclose(plain, gdpp_residual(nodes / 20, w_xx, w_yx), rtol=1e-12, atol=1e-14)


def test_the_fit_is_a_strict_local_minimum_at_two_layers():
    fit = spectra.fit_gdpp_memformer(2, restarts=4, seed=0)
    assert fit["gradient"] < 1e-8 and fit["hessian_eigenvalues"].min() > 0
    assert fit["loss"] == pytest.approx(fit["losses"][-1].item())
    # it beats the best shared residual of 2 steps (inputs that move are worth more than a preconditioner)
    assert fit["loss"] < spectra.best_shared_residual(2)["loss"] / 5
    # and a nudge of any weight raises the exact loss
    for name in ("w_xx", "w_yx", "gamma"):
        for index in range(2):
            if (name, index) in (("w_xx", 1), ("gamma", 0)):
                continue      # these two do nothing (the fit's docstring)
            moved = {key: fit[key].clone() for key in ("w_xx", "w_yx", "alpha", "gamma")}
            moved[name][index] += 1e-3
            assert spectra.gdpp_memformer_loss(**moved)[-1] > fit["loss"]


def test_gdpp_part_of_a_gdpp_memformer_is_itself():
    w_xx, w_yx = torch.tensor([-0.2, -0.9]), torch.tensor([-0.5, -2.0])
    alpha, gamma = torch.tensor([0.7, 1.3]), torch.tensor([0.0, 0.3])
    model = spectra.gdpp_memformer(w_xx, w_yx, alpha, gamma, num_heads=3)
    part = spectra.gdpp_part(model)
    for name, value in (("w_xx", w_xx), ("w_yx", w_yx), ("alpha", alpha), ("gamma", gamma)):
        assert torch.allclose(part[name], value.double())
    assert part["rest"].abs().max() < 1e-15
    with torch.no_grad():
        model.Q[0, 1, 2, 3] = 0.5          # a head whose P is 0 adds nothing, whatever its Q
    assert spectra.gdpp_part(model)["rest"].abs().max() < 1e-15
    with torch.no_grad():
        model.Q[0, 0, 2, 3] = 0.5          # an entry outside the GD++ form, in the head that works
    assert spectra.gdpp_part(model)["rest"][0] > 0.01 and spectra.gdpp_part(model)["rest"][1] == 0
    with pytest.raises(ValueError, match="attention='full'"):
        spectra.gdpp_part(memformer.Memformer(5, 20, attention="gd"))


def test_the_invariant_part_keeps_the_label_corner_and_drops_the_rest():
    model = memformer.Memformer(5, 20, num_layers=2, num_heads=2, attention="full", init_scale=0.3, dtype="float64")
    part = spectra.invariant_part(model)
    for name in ("P", "Q"):
        before, after = getattr(model, name).detach(), getattr(part, name).detach()
        assert torch.allclose(after[..., 5, 5], before[..., 5, 5])                     # the label corner stays
        mean = before[..., :5, :5].diagonal(dim1=-2, dim2=-1).mean(-1)
        assert torch.allclose(after[..., :5, :5], mean[..., None, None] * torch.eye(5, dtype=torch.float64))
        assert after[..., :5, 5].abs().max() == 0 and after[..., 5, :5].abs().max() == 0
    # a model already in that form is its own invariant part; its GD++ part drops q_y only
    assert torch.equal(spectra.invariant_part(part).P, part.P) and torch.equal(spectra.invariant_part(part).Q, part.Q)
    with torch.no_grad():
        part.Q[..., 5, 5] = 0
    assert spectra.gdpp_part(part)["rest"].abs().max() < 1e-15


def test_the_shipped_fits_are_strict_minima_of_the_exact_loss():
    fits = spectra.load_optima()
    assert "icl_course.spectra" in fits["command"]
    previous = math.inf
    for depth in (1, 2, 3, 4):
        fit = fits[depth]
        weights = {key: fit[key] for key in ("w_xx", "w_yx", "alpha", "gamma")}
        loss = spectra.gdpp_memformer_loss(**weights)[-1].item()
        assert loss == pytest.approx(fit["loss"], rel=1e-10) and loss < previous
        previous = loss
        check = spectra.minimum_check(**weights)
        assert check["gradient"] < 1e-8 and check["hessian_eigenvalues"].min() > 0
        assert loss <= spectra.best_shared_residual(depth)["loss"] * (1 + 1e-12)
    assert fits[4]["loss"] == pytest.approx(4.75894e-6, rel=1e-5)          # the pin of the shipped run


def test_a_corrupt_fits_file_says_what_to_do(tmp_path):
    path = tmp_path / "fits.json"
    path.write_text("{not json")
    with pytest.raises(ValueError, match="python -m icl_course.spectra"):
        spectra.load_optima(path)
    path.write_text('{"depths": {"1": 3}}')
    with pytest.raises(ValueError, match="not a file of GD"):
        spectra.load_optima(path)


def test_eigenvalue_beyond_inverts_the_tail_count():
    for count in (1e-2, 1e-6, 1 / 3.24e8):
        x = spectra.eigenvalue_beyond(count)
        assert spectra.eigenvalues_above(x) == pytest.approx(count, rel=1e-9)
    assert 83 < spectra.eigenvalue_beyond(1e-6) < 83.2          # what a million tasks see, at d = 5, n = 20
    with pytest.raises(ValueError, match="between 0 and d"):
        spectra.eigenvalue_beyond(0)


def test_tasks_with_eigenvalue_have_it_and_keep_the_rest():
    batch = spectra.tasks_with_eigenvalue(150.0, num_tasks=50, seed=3)
    eigenvalues = torch.linalg.eigvalsh(batch.Sigma)
    assert torch.allclose(eigenvalues[:, -1], torch.full((50,), 150.0, dtype=torch.float64), rtol=1e-12)
    assert (eigenvalues[:, -2] < 100).all()                       # the others as drawn
    assert torch.allclose(batch.y, (batch.X @ batch.w.unsqueeze(-1)).squeeze(-1)) and (batch.sigma == 0).all()
    assert torch.allclose(batch.y_t, (batch.x_t * batch.w).sum(-1))
    again = spectra.tasks_with_eigenvalue(150.0, num_tasks=50, seed=3)
    assert torch.equal(again.X, batch.X) and torch.equal(again.w, batch.w)
    with pytest.raises(ValueError, match="positive"):
        spectra.tasks_with_eigenvalue(-1.0)


def test_the_loss_density_integrates_to_the_exact_loss():
    w_xx, w_yx = torch.tensor([-0.3, -1.4], dtype=torch.float64), torch.tensor([-0.4, -3.0], dtype=torch.float64)
    alpha, gamma = torch.ones(2, dtype=torch.float64), torch.tensor([0.0, 0.1], dtype=torch.float64)
    s = torch.linspace(0, 600, 600_001, dtype=torch.float64)
    integral = torch.trapezoid(spectra.loss_density(s, w_xx, w_yx, alpha, gamma), s).item()
    assert integral == pytest.approx(spectra.gdpp_memformer_loss(w_xx, w_yx, alpha, gamma)[-1].item(), rel=1e-6)
