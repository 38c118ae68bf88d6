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
        loss = theory.preconditioned_one_step_loss(B, eye, 12, 1.5, weights)
        assert loss == pytest.approx(theory.one_step_loss(4, 12, 1.5))


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
    mean = tasks.sample(50_000, seed=0).w.mean(0)
    assert torch.allclose(mean, torch.tensor([1.0, -2.0, 0.5], dtype=torch.float64), atol=0.03)
    with pytest.raises(ValueError, match=r"weight_mean must have shape \(3,\)"):
        RegressionTasks(3, 5, weight_mean=[1.0, 2.0])



def implicit_tokens(implicit, layer, batch, sign=-1.0, M=None):
    """The tokens after ``layer`` as Theorem 4.1 writes them: (x_context, y_context, x_query, y_query)."""
    M = implicit.M[:, layer] if M is None else M
    u, a, w = implicit.u[:, layer], implicit.a[:, layer], implicit.w[:, layer]
    x_context = batch.X @ M.transpose(-1, -2) + batch.y.unsqueeze(-1) * u.unsqueeze(1)
    y_context = a.unsqueeze(-1) * batch.y - (batch.X @ w.unsqueeze(-1)).squeeze(-1)
    return x_context, y_context, (M @ batch.x_t.unsqueeze(-1)).squeeze(-1), -(w * batch.x_t).sum(-1)


def random_full_model(d, num_layers, num_heads, seed):
    return LinearTransformer(d, num_layers=num_layers, num_heads=num_heads, parameterization="full",
                             init_scale=0.15, seed=seed, dtype=torch.float64, device="cpu")


def test_implicit_linear_model_follows_every_token_through_every_layer(float64_tasks):
    """Theorem 4.1 against explicit tokens, on random multi-layer, multi-head full weights (b != 0)."""
    model = random_full_model(4, num_layers=3, num_heads=2, seed=3)
    batch = float64_tasks(d=4, n=9, noise=0.5).sample(6, seed=1)
    implicit = theory.implicit_linear_model(model, batch.X, batch.y)
    for layer, tokens in enumerate(model.transform_tokens(batch.tokens)[1:]):
        x_context, y_context, x_query, y_query = implicit_tokens(implicit, layer, batch)
        for got, expected in ((tokens[:, :-1, :-1], x_context), (tokens[:, :-1, -1], y_context),
                              (tokens[:, -1, :-1], x_query), (tokens[:, -1, -1], y_query)):
            torch.testing.assert_close(got, expected, rtol=1e-11, atol=1e-11)
    torch.testing.assert_close(implicit.w, model(batch).layer_weights, rtol=1e-12, atol=1e-12)


def test_the_printed_plus_sign_of_the_M_update_is_a_typo(float64_tasks):
    """Vladymyrov et al. (2024) print M <- (I + A) M + b w^T (their A, b are our T_xx, t_xy); with
    that sign the second layer's tokens disagree."""
    model = random_full_model(3, num_layers=2, num_heads=1, seed=5)
    batch = float64_tasks(d=3, n=7).sample(4, seed=2)
    implicit = theory.implicit_linear_model(model, batch.X, batch.y)
    tokens = model.transform_tokens(batch.tokens)[2]
    first_layer_tokens = model.transform_tokens(batch.tokens)[1][:, :-1]
    mixing = model.layers[1].mixing(first_layer_tokens.transpose(1, 2) @ first_layer_tokens)
    T_xx, t_xy = mixing[:, :3, :3], mixing[:, :3, 3]
    M_1, w_1 = implicit.M[:, 0], implicit.w[:, 0]
    typo = M_1 + T_xx @ M_1 + t_xy.unsqueeze(-1) * w_1.unsqueeze(-2)
    x_context_typo = implicit_tokens(implicit, 1, batch, M=typo)[0]
    assert (tokens[:, :-1, :-1] - x_context_typo).abs().max() > 1e-3
    torch.testing.assert_close(tokens[:, :-1, :-1], implicit_tokens(implicit, 1, batch)[0], rtol=1e-11, atol=1e-11)


def test_implicit_linear_model_rejects_mismatched_shapes(float64_tasks):
    model = random_full_model(3, num_layers=1, num_heads=1, seed=0)
    batch = float64_tasks(d=3, n=7).sample(2, seed=0)
    with pytest.raises(ValueError, match="expected X"):
        theory.implicit_linear_model(model, batch.X[0], batch.y)


def test_a_gdpp_layer_maps_each_eigenvalue_to_lambda_times_one_minus_gamma_lambda_squared(float64_tasks):
    """The eigenvalue map against an explicit GD++ layer (w_xx = -gamma, w_yx = 0) on real tokens."""
    batch = float64_tasks(d=4, n=12).sample(3, seed=6)
    Sigma = batch.X.transpose(1, 2) @ batch.X
    gamma = 0.02
    model = LinearTransformer(4, num_layers=1, parameterization="gdpp", init_scale=0.0, dtype=torch.float64,
                              device="cpu")
    with torch.no_grad():
        model.layers[0].p.copy_(torch.tensor([[1.0, 0.0]], dtype=torch.float64))
        model.layers[0].q.copy_(torch.tensor([[-gamma]], dtype=torch.float64))
    assert float(model.layers[0].diagonal_weights()["w_xx"].detach()) == -gamma
    context = model.transform_tokens(batch.tokens)[1][:, :-1, :-1]
    after = torch.linalg.eigvalsh(context.transpose(1, 2) @ context)
    expected = theory.gdpp_spectrum(torch.linalg.eigvalsh(Sigma), 1, gamma)[:, 1]
    torch.testing.assert_close(after, expected.sort(-1).values, rtol=1e-10, atol=1e-10)


def test_theorem_5_1_condition_number_shrinks_then_squares():
    """With gamma = 1/(3 lambda_max): kappa -> at most 4/9 kappa / (1 - 1/(3 kappa))^2 while large, and
    1 + eps -> at most 1 + 2 eps^2 once small: doubly logarithmic in the accuracy."""
    for kappa in (1e4, 1e2, 10.0, 2.0):
        spectrum = torch.tensor([1.0, (1 + kappa) / 2, kappa], dtype=torch.float64)
        after = theory.condition_number(theory.gdpp_spectrum(spectrum, 1)[1])
        assert after <= 4 / 9 * kappa / (1 - 1 / (3 * kappa)) ** 2 * (1 + 1e-12)
    for eps in (0.3, 0.1, 1e-2, 1e-3):
        spectrum = torch.tensor([1.0, 1.0 + eps / 2, 1.0 + eps], dtype=torch.float64)
        assert theory.condition_number(theory.gdpp_spectrum(spectrum, 1)[1]) - 1 <= 2 * eps**2
    layers = theory.condition_number(theory.gdpp_spectrum(torch.tensor([1.0, 1e6], dtype=torch.float64), 40))
    reached = [int((layers - 1 > eps).sum()) for eps in (1e-2, 1e-4, 1e-8)]
    assert reached[1] - reached[0] <= 2 and reached[2] - reached[1] <= 2  # squaring: eps^2 costs about one layer


def dense_condition_after_one_layer(kappa, gamma_scale, points=200_001):
    spectrum = torch.linspace(1.0, kappa, points, dtype=torch.float64)
    return theory.condition_number(theory.gdpp_spectrum(spectrum, 1, gamma_scale=gamma_scale)[1]).item()


@pytest.mark.parametrize("kappa", [1.0, 1.05, 2.0, 100.0, 1e4])
def test_one_layer_condition_number_in_closed_form_matches_a_dense_spectrum(kappa):
    for gamma_scale in (0.3, 1.0, 1.04, 1.5, 2.7, 2.95):
        closed = theory.gdpp_one_layer_condition(kappa, gamma_scale)
        assert closed == pytest.approx(dense_condition_after_one_layer(kappa, gamma_scale), rel=1e-8)
    with pytest.raises(ValueError, match="gamma_scale < 3"):
        theory.gdpp_one_layer_condition(kappa, 3.0)


def test_the_theorem_step_is_the_best_single_layer_only_as_kappa_goes_to_one():
    """Chapter 3's widget: above gamma lambda_max = 1/3 one layer does *better* while kappa is large."""
    scales = torch.linspace(0.05, 2.99, 589, dtype=torch.float64).tolist()
    for kappa in (1.001, 1.1, 2.0, 100.0, 1e4):
        best = theory.gdpp_best_one_layer_scale(kappa)
        at_best = theory.gdpp_one_layer_condition(kappa, best)
        assert at_best <= min(theory.gdpp_one_layer_condition(kappa, s) for s in scales) * (1 + 1e-12)
        assert best > 1 and at_best < theory.gdpp_one_layer_condition(kappa, 1.0)
    # the best step tends to the theorem's like 1 + (kappa - 1) / 2, and to gamma lambda_max = 1 for large kappa
    assert (theory.gdpp_best_one_layer_scale(1.001) - 1) / 0.001 == pytest.approx(0.5, rel=0.01)
    assert theory.gdpp_best_one_layer_scale(1.0) == 1.0 and theory.gdpp_best_one_layer_scale(1e8) > 2.999
    # the review's numbers at kappa = 100 (20 eigenvalues spread geometrically, as in the widget)
    spectrum = torch.logspace(0, 2, 20, dtype=torch.float64)
    one_layer = [theory.condition_number(theory.gdpp_spectrum(spectrum, 1, gamma_scale=s)[1]).item()
                 for s in (1.0, 1.5, 1.8)]
    assert [round(value, 1) for value in one_layer] == [44.7, 29.8, 24.8]
    best = theory.gdpp_best_one_layer_scale(100.0)
    assert theory.gdpp_one_layer_condition(100.0, best) == pytest.approx(16.74, abs=0.01)


def test_only_the_theorem_step_squares_the_distance_to_one():
    """With a fixed gamma_scale s per layer, near kappa = 1 the map is monotone decreasing for s > 1 and
    increasing for s < 1 and kappa' - 1 ~ |1 - s| / (1 - s/3) (kappa - 1): linear for s != 1,
    neutral at s = 3/2, growing beyond; only s = 1 removes the first-order term."""
    spectrum = torch.logspace(0, 2, 20, dtype=torch.float64)                 # kappa = 100

    def distances(gamma_scale, num_layers):
        spectra = theory.gdpp_spectrum(spectrum, num_layers, gamma_scale=gamma_scale)
        return (theory.condition_number(spectra) - 1).tolist()

    assert distances(1.0, 11)[-1] < 1e-12                                    # squares: done in 11 layers
    for gamma_scale in (0.8, 1.2):                                           # linear, at the predicted rate
        path = distances(gamma_scale, 30)
        rate = abs(1 - gamma_scale) / (1 - gamma_scale / 3)
        assert path[20] / path[19] == pytest.approx(rate, rel=0.02) and path[10] > 1e-7
    assert distances(1.5, 40)[-1] > 1e-2                                     # neutral: crawls
    assert distances(1.8, 40)[-1] > 0.4                                      # stalls far from 1
    # choosing each layer's step as the one-layer optimum beats the theorem's fixed 1/3
    greedy, layers = torch.logspace(0, 6, 20, dtype=torch.float64), 0
    while theory.condition_number(greedy) - 1 > 1e-10:
        scale = theory.gdpp_best_one_layer_scale(theory.condition_number(greedy).item())
        greedy, layers = theory.gdpp_spectrum(greedy, 1, gamma_scale=scale)[1], layers + 1
    assert layers + 1 < theory.gdpp_layers_needed(1e6, 1e-10) - 5


def test_gdpp_spectrum_gamma_scale_is_a_multiple_of_the_theorem_step():
    spectrum = torch.tensor([[1.0, 3.0, 9.0], [2.0, 4.0, 5.0]], dtype=torch.float64)
    scaled = theory.gdpp_spectrum(spectrum, 3, gamma_scale=1.5)
    by_hand = spectrum
    for layer in range(1, 4):
        by_hand = by_hand * (1 - 1.5 / (3 * by_hand.max(-1, keepdim=True).values) * by_hand) ** 2
        torch.testing.assert_close(scaled[:, layer], by_hand, rtol=1e-14, atol=0)


def test_a_w_xy_layer_turns_the_next_step_into_minus_w_yx_times_one_plus_w_xy_lambda(float64_tasks):
    from icl_course.models import diagonal_construction
    batch = float64_tasks(d=4, n=9, noise=1.0).sample(16, seed=4)
    w_xy, w_yx = -0.01, -0.3
    model = diagonal_construction(4, [{"w_xy": w_xy}, {"w_yx": w_yx}])
    step = -w_yx * (1 + w_xy * batch.label_energy)          # smaller steps for noisier (larger lambda) tasks
    torch.testing.assert_close(model(batch).prediction, step * (batch.alpha * batch.x_t).sum(-1),
                               rtol=1e-12, atol=1e-12)
    weights = model.layers[0].diagonal_weights()
    expected = {"w_xx": 0.0, "w_xy": w_xy, "w_yx": 0.0, "w_yy": 0.0}
    assert {name: float(value.detach()) for name, value in weights.items()} == expected


def test_theorem_5_2_two_layers_approach_ridge_for_two_noise_levels():
    """||w^2 - w_ridge||^2 shrinks like 1/n with x ~ N(0, I/n) and sigma in {1, 3}."""
    from icl_course import CategoricalNoise, ridge
    from icl_course.models import diagonal_construction
    distances = []
    for n in (50, 200, 800):
        model = diagonal_construction(5, theory.two_noise_construction(n, 1.0, 3.0))
        tasks = RegressionTasks(5, n, CategoricalNoise([1, 3]), covariance=torch.eye(5, dtype=torch.float64) / n,
                                dtype=torch.float64, device="cpu")
        batch = tasks.sample(2000, seed=n)
        distances.append(((model(batch).weights - ridge(batch.X, batch.y, batch.sigma**2)) ** 2).sum(-1).mean().item())
    assert distances[1] < distances[0] / 3 and distances[2] < distances[1] / 3 and distances[2] < 0.03
    with pytest.raises(ValueError, match="two different"):
        theory.two_noise_construction(10, 1.0, 1.0)


def test_construction_helpers_name_what_is_wrong(float64_tasks):
    from icl_course.models import diagonal_construction
    with pytest.raises(ValueError, match="unknown weights \\['w_zz'\\]"):
        diagonal_construction(3, [{"w_zz": 1.0}])
    with pytest.raises(ValueError, match="kappa >= 1 and eps > 0"):
        theory.gdpp_layers_needed(0.5, 1e-3)
    assert theory.gdpp_layers_needed(1.0, 1e-3) == 1  # already conditioned: only the final GD step
    batch = float64_tasks(d=3, n=8).sample(4, seed=0)
    with pytest.raises(ValueError, match="expected X"):
        theory.best_linear_cosine(batch.X, batch.y[0])
    # the labels themselves lie in the span of X when they are linear: cosine 1
    noiseless = float64_tasks(d=3, n=8, noise=0.0).sample(4, seed=0)
    torch.testing.assert_close(theory.best_linear_cosine(noiseless.X, noiseless.y), torch.ones(4, dtype=torch.float64))


def test_a_w_xy_layer_then_a_w_yx_layer_steps_by_minus_w_yx_times_one_plus_w_xy_lambda():
    """Vladymyrov et al. (2024), section 5.2: the exact adaptive step, and how far the paper's
    residual form is from it."""
    from icl_course import UniformNoise, least_squares
    from icl_course.models import diagonal_construction
    d, n, w_xy, w_yx = 4, 12, 0.01, -0.05
    batch = RegressionTasks(d, n, noise=UniformNoise(2), dtype=torch.float64).sample(64, seed=3)
    model = diagonal_construction(d, [{"w_xy": w_xy}, {"w_yx": w_yx}])
    exact, paper = theory.adaptive_step_size(w_xy, w_yx, batch.X, batch.y)
    with torch.no_grad():
        prediction = model(batch).prediction
    assert torch.allclose(prediction, exact * (batch.alpha * batch.x_t).sum(-1), rtol=1e-10, atol=1e-12)
    assert not torch.allclose(prediction, paper * (batch.alpha * batch.x_t).sum(-1), rtol=1e-3)
    explained = ((batch.X @ least_squares(batch.X, batch.y).unsqueeze(-1)).squeeze(-1) ** 2).sum(-1)
    assert torch.allclose(exact - paper, -w_yx * w_xy * explained, rtol=1e-9)
    assert (exact > paper).all()      # here w_yx < 0 < w_xy: the paper's form understates the step


def test_theory_takes_a_second_moment_directly():
    from icl_course import UniformNoise
    from icl_course.theory import one_step_loss, optimal_one_step_coefficient, optimal_preconditioner

    prior = UniformNoise(3)
    assert optimal_one_step_coefficient(10, 20, second_moment=3.0) == optimal_one_step_coefficient(10, 20, prior)
    assert one_step_loss(10, 20, coefficient=0.02, second_moment=3.0) == one_step_loss(10, 20, prior, 0.02)
    S = torch.diag(torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64))
    assert torch.equal(optimal_preconditioner(S, 20, second_moment=3.0), optimal_preconditioner(S, 20, prior))
    with pytest.raises(ValueError, match="not both"):
        one_step_loss(10, 20, noise=1.0, second_moment=1.0)
    with pytest.raises(ValueError, match=">= 0"):
        optimal_one_step_coefficient(10, 20, second_moment=-1.0)


def test_gdpp_residual_is_what_a_gdpp_model_leaves_of_w_on_noiseless_tasks(float64_tasks):
    """w^L = F(X^T X) w: a task's loss is 1/2 sum_k r(lambda_k)^2 (u_k^T w)^2, to rounding, for any GD++."""
    model = LinearTransformer(6, num_layers=4, parameterization="gdpp", init_scale=0.3, seed=3, dtype=torch.float64,
                              device="cpu")
    weights = [layer.diagonal_weights() for layer in model.layers]
    w_xx, w_yx = (torch.stack([w[key] for w in weights]).detach() for key in ("w_xx", "w_yx"))
    assert (w_xx != 0).all() and (w_yx != 0).all()
    batch = float64_tasks(d=6, n=9, noise=0.0).sample(200, seed=8)
    with torch.no_grad():
        direct = 0.5 * ((model.final_weights(batch) - batch.w) ** 2).sum(-1)
    eigenvalues, vectors = torch.linalg.eigh(batch.X.transpose(1, 2) @ batch.X)
    along = (vectors.transpose(1, 2) @ batch.w.unsqueeze(-1)).squeeze(-1)
    via_residual = 0.5 * (theory.gdpp_residual(eigenvalues, w_xx, w_yx) ** 2 * along**2).sum(-1)
    torch.testing.assert_close(via_residual, direct, rtol=1e-9, atol=1e-14)
    # one layer is one GD step of size -w_yx: r = 1 + w_yx lambda
    lam = torch.linspace(0, 5, 11, dtype=torch.float64)
    torch.testing.assert_close(theory.gdpp_residual(lam, [-0.3], [-0.2]), 1 - 0.2 * lam)
    with pytest.raises(ValueError, match="same length"):
        theory.gdpp_residual(lam, [0.1, 0.2], [0.1])
