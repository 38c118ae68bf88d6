"""Memformers (Dutta et al. 2024) and the momentum baselines, in float64."""

import subprocess
import sys

import pytest
import torch

from icl_course.data import RegressionTasks
from icl_course.memformer import Memformer, cg_coefficients, momentum_coefficients
from icl_course.optimizers import conjugate_gradient, gradient_descent, momentum_descent, tune_momentum
from icl_course.train import train

D_DIAG = torch.tensor([1.0, 1.0, 0.5, 0.25, 1.0], dtype=torch.float64)


def _covariance(seed=0):
    U, _ = torch.linalg.qr(torch.randn(5, 5, generator=torch.Generator().manual_seed(seed), dtype=torch.float64))
    return U @ torch.diag(D_DIAG**2) @ U.T


@pytest.fixture
def batch():
    return RegressionTasks(5, 20, covariance=_covariance(), dtype="float64", device="cpu").sample(64, seed=1)


def test_gd_parameterisation_runs_preconditioned_gd(batch):
    model = Memformer(5, 20, num_layers=3, attention="gd", memory="none", dtype="float64", init_scale=0.1)
    out = model(batch)
    w = torch.zeros(batch.num_tasks, 5, dtype=torch.float64)
    Sigma, alpha = batch.Sigma / 20, batch.alpha / 20
    for layer in range(3):
        A = model.A[layer].sum(0).detach()
        gradient = (Sigma @ w.unsqueeze(-1)).squeeze(-1) - alpha
        w = w - gradient @ A.T
        torch.testing.assert_close(out.layer_weights[:, layer], w, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(out.layer_predictions, (out.layer_weights @ batch.x_t.unsqueeze(-1)).squeeze(-1))
    eta = 0.7
    gd_model = Memformer(5, 20, num_layers=3, attention="gd", memory="none", init_step=eta, dtype="float64")
    torch.testing.assert_close(gd_model(batch).layer_weights,
                               gradient_descent(batch.X, batch.y, eta, 3)[:, 1:], rtol=1e-12, atol=1e-12)


def test_cgd_memformer_with_each_tasks_cg_coefficients_is_cg(batch):
    model = Memformer(5, 20, num_layers=6, attention="identity", memory="cgd", dtype="float64")
    a, beta = cg_coefficients(batch.X, batch.y, 6)
    out = model(batch, alpha=a, gamma=beta)
    cg = conjugate_gradient(batch.X, batch.y, 6)[:, 1:]
    torch.testing.assert_close(out.layer_weights, cg, rtol=1e-9, atol=1e-10)
    exact = torch.linalg.solve(batch.Sigma, batch.alpha)
    torch.testing.assert_close(out.layer_weights[:, 4], exact, rtol=1e-8, atol=1e-8)  # d = 5 steps
    # shared coefficients (the mean over tasks) are not exact after 5 layers
    shared = model(batch, alpha=a.mean(0), gamma=beta.mean(0)).layer_weights[:, 4]
    assert ((shared - exact) ** 2).sum(-1).mean() > 1e-6


def test_cgd_memformer_runs_momentum(batch):
    eta, mu = torch.tensor([0.5, 0.8, 0.6]), torch.tensor([0.0, 0.4, 0.3])
    alpha, gamma = momentum_coefficients(eta, mu)
    model = Memformer(5, 20, num_layers=3, attention="identity", memory="cgd", dtype="float64")
    torch.testing.assert_close(model(batch, alpha=alpha, gamma=gamma).layer_weights,
                               momentum_descent(batch.X, batch.y, eta.double(), mu.double(), 3)[:, 1:])


def test_tied_gates_are_momentum_one_and_untied_are_not(batch):
    tied = Memformer(5, 20, num_layers=4, attention="gd", memory="lfom", tied=True, dtype="float64",
                     init_scale=0.1)
    with torch.no_grad():  # gates equal along each row, so the update is a step on w
        tied.gates.copy_(tied.gates[:, :, :1].expand_as(tied.gates))
    w = torch.cat([torch.zeros(batch.num_tasks, 1, 5, dtype=torch.float64), tied(batch).layer_weights], 1)
    Sigma, alpha = batch.Sigma / 20, batch.alpha / 20
    for layer in range(4):
        gradient = (Sigma @ w[:, layer].unsqueeze(-1)).squeeze(-1) - alpha
        step = -gradient @ tied.A[layer].sum(0).T.detach() * tied.gates[layer, 5, 0].detach()
        previous = w[:, layer] - w[:, layer - 1] if layer > 0 else 0.0
        torch.testing.assert_close(w[:, layer + 1], w[:, layer] + previous + step, rtol=1e-10, atol=1e-12)
    untied = Memformer(5, 20, num_layers=3, attention="gd", memory="lfom", tied=False, dtype="float64")
    gd = Memformer(5, 20, num_layers=3, attention="gd", memory="none", dtype="float64")
    torch.testing.assert_close(untied(batch).layer_weights, gd(batch).layer_weights)  # starts as GD
    tied_gd = Memformer(5, 20, num_layers=3, attention="gd", memory="lfom", tied=True, dtype="float64")
    assert (tied_gd(batch).layer_weights - gd(batch).layer_weights).abs().max() > 1e-3


def test_per_layer_gates_are_every_gate_equal_to_its_layers_and_momentum_their_ratio(batch):
    """``tied="layer"`` (Gamma_j^(l) = Gamma_l for j <= l) is the untied model with those gates, and with gates equal
    along each row of Z it is momentum with coefficient Gamma_l / Gamma_(l-1) and step Gamma_l A_l."""
    per_layer = Memformer(5, 20, num_layers=4, attention="gd", memory="lfom", tied="layer", dtype="float64",
                          init_scale=0.1, seed=2)
    every = Memformer(5, 20, num_layers=4, attention="gd", memory="lfom", tied=False, dtype="float64")
    with torch.no_grad():
        per_layer.gates.copy_(per_layer.gates[:, :, :1].expand_as(per_layer.gates))
        every.A.copy_(per_layer.A)
        every.gates.zero_()
        for layer in range(4):
            every.gates[layer, :layer + 1] = per_layer.gates[layer]
        w = torch.cat([torch.zeros(batch.num_tasks, 1, 5, dtype=torch.float64), per_layer(batch).layer_weights], 1)
    torch.testing.assert_close(w[:, 1:], every(batch).layer_weights, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(w[:, 1:], per_layer(batch, tokens=True).layer_weights, rtol=1e-10, atol=1e-12)
    Sigma, alpha, gate = batch.Sigma / 20, batch.alpha / 20, per_layer.gates[:, 5, 0].detach()
    for layer in range(4):
        gradient = (Sigma @ w[:, layer].unsqueeze(-1)).squeeze(-1) - alpha
        step = -gradient @ per_layer.A[layer].sum(0).T.detach() * gate[layer]
        momentum = gate[layer] / gate[layer - 1] * (w[:, layer] - w[:, layer - 1]) if layer > 0 else 0.0
        torch.testing.assert_close(w[:, layer + 1], w[:, layer] + momentum + step, rtol=1e-10, atol=1e-12)
    for wrong in ("entry", 1, 0):
        with pytest.raises(ValueError, match="tied is True"):
            Memformer(5, 20, memory="lfom", tied=wrong)


def test_momentum_and_nesterov_converge(batch):
    exact = torch.linalg.solve(batch.Sigma, batch.alpha)
    for nesterov in (False, True):
        eta, mu = tune_momentum(batch, 8, nesterov=nesterov)
        assert 0 < mu < 1 and eta > 0   # eight steps on this data: an ordinary momentum
        path = momentum_descent(batch.X, batch.y, eta, mu, 3000, nesterov=nesterov)
        torch.testing.assert_close(path[:, -1], exact, rtol=1e-6, atol=1e-6)


def test_nesterov_two_step_momentum_is_tuned_inside_its_range():
    """At two steps Nesterov's best momentum is above 1 on chapter 5's data: the tuner must reach it
    (a stationary point of the tuning loss), not stop at a cap, and it must beat the capped value."""
    from icl_course.memformer import paper_tasks
    from icl_course.optimizers import _mean_weight_loss
    sample = paper_tasks("isotropic").sample(2000, seed=3).to(dtype=torch.float64)
    eta, mu = tune_momentum(sample, 2, nesterov=True)
    assert 1.1 < mu < 2
    point = torch.tensor([eta, mu], dtype=torch.float64, requires_grad=True)
    loss = _mean_weight_loss(momentum_descent(sample.X, sample.y, point[0], point[1], 2, nesterov=True)[:, -1], sample)
    loss.backward()
    assert point.grad.abs().max() < 1e-5
    capped = momentum_descent(sample.X, sample.y, tune_momentum_capped(sample), 1.0, 2, nesterov=True)[:, -1]
    assert loss.item() < 0.99 * _mean_weight_loss(capped, sample).item()


def tune_momentum_capped(sample):
    """The best step size for two Nesterov steps with the momentum held at the old cap, mu = 1 (grid search)."""
    from icl_course.optimizers import _mean_weight_loss
    etas = torch.linspace(0.2, 1.2, 501, dtype=torch.float64)
    losses = [_mean_weight_loss(momentum_descent(sample.X, sample.y, eta, 1.0, 2, nesterov=True)[:, -1], sample)
              for eta in etas]
    return float(etas[int(torch.stack(losses).argmin())])


def test_training_lowers_the_loss():
    tasks = RegressionTasks(5, 20, covariance=_covariance(), device="cpu")
    model = Memformer(5, 20, num_layers=2, attention="identity", memory="cgd", device="cpu")
    history = train(model, tasks, 60, batch_size=256, learning_rate=0.02, progress=False)
    assert history.losses[-1] < 0.8 * history.losses[0]


def test_clear_errors(batch):
    model = Memformer(5, 20, num_layers=2, memory="lfom", dtype="float64")
    with pytest.raises(ValueError, match="n=20"):
        model(batch.X[:, :10], batch.y[:, :10])
    with pytest.raises(ValueError, match="d=5"):
        model(batch.X[..., :4], batch.y)
    with pytest.raises(ValueError, match="memory='cgd' only"):
        model(batch, alpha=torch.ones(2))
    cgd = Memformer(5, 20, num_layers=2, attention="identity", dtype="float64")
    with pytest.raises(ValueError, match="shape"):
        cgd(batch, alpha=torch.ones(3))
    with pytest.raises(ValueError, match="unknown memory"):
        Memformer(5, 20, memory="lstm")
    with pytest.raises(ValueError, match="float32"):
        Memformer(5, 20)(batch)


def test_chapter_5_checks_accept_the_reference_and_reject_mistakes():
    import random

    from icl_course.grading import checking, protocol
    from icl_course.grading.chapter5 import chapter_5_checks, reference_memformer_layer
    from icl_course.memformer import momentum_coefficients

    answers = {
        "cg_iterates": lambda X, y, num_steps: conjugate_gradient(X, y, num_steps),
        "memformer_layer": reference_memformer_layer,
        "momentum_alpha_gamma": momentum_coefficients,
    }
    wrong = {
        "cg_iterates": lambda X, y, num_steps: gradient_descent(X, y, 1.0, num_steps),
        "memformer_layer": lambda Z, register, A, alpha, gamma: reference_memformer_layer(Z, register, A, alpha, 0.0),
        "momentum_alpha_gamma": lambda eta, mu: (eta.clone(), mu.clone()),   # right only for a constant eta
    }
    for check in chapter_5_checks():
        cases = check.examples() + check.draw(random.Random(0))
        for case in cases:
            check.verify(case, protocol.portable(answers[check.name](**case.arguments)))
        with pytest.raises(checking.CheckFailed):
            for case in cases:
                check.verify(case, protocol.portable(wrong[check.name](**case.arguments)))


# the scalar CGD-like model has A_l = I, so no heads: it is checked with one
@pytest.mark.parametrize("family, heads", [("linear transformer", 1), ("linear transformer", 3),
                                           ("CGD-like (scalars)", 1), ("CGD-like + A_l", 1), ("CGD-like + A_l", 3),
                                           ("LFOM (tied gates)", 1), ("LFOM (tied gates)", 3),
                                           ("LFOM (per-layer gates)", 2)])
def test_the_cheap_recursions_are_the_token_matrix(batch, family, heads):
    from icl_course import memformer

    model = memformer.build(family, 4, num_heads=heads, seed=heads)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(0.2 * torch.randn(parameter.shape, generator=torch.Generator().manual_seed(5),
                                             dtype=torch.float64))
        cheap, tokens = model(batch).layer_weights, model(batch, tokens=True).layer_weights
    torch.testing.assert_close(cheap, tokens, rtol=1e-10, atol=1e-12)
    untied = Memformer(5, 20, num_layers=3, memory="lfom", tied=False, init_scale=0.3, dtype="float64")
    with torch.no_grad():
        torch.testing.assert_close(untied(batch).layer_weights, untied(batch, tokens=True).layer_weights)


def test_the_paper_task_law_whitens_the_labels_and_the_one_layer_optimum_is_the_closed_form():
    from icl_course import memformer

    rotated = memformer.paper_tasks("rotated", seed=3)
    S, W = rotated.covariance, rotated.weight_covariance
    torch.testing.assert_close(S @ W, torch.eye(5, dtype=torch.float64), rtol=0, atol=1e-12)   # w ~ N(0, S^-1)
    torch.testing.assert_close(torch.linalg.eigvalsh(S), torch.tensor([1 / 16, 1 / 4, 1, 1, 1], dtype=torch.float64))
    # one layer: the best A is n / (n + d + 1) S^-1 and the loss d (d + 1) / (2 (n + d + 1)) in both settings
    best = 5 * 6 / (2 * 26)
    for setting in memformer.SETTINGS:
        assert memformer.one_layer_optimum(setting, "CGD-like + A_l") == pytest.approx(best, rel=1e-12)
    assert memformer.one_layer_optimum("isotropic", "CGD-like (scalars)") == pytest.approx(best, rel=1e-12)
    assert memformer.one_layer_optimum("rotated", "CGD-like (scalars)") > 1.9 * best   # A = I cannot undo S
    # ... and a Monte-Carlo fit of the one-layer model agrees with the closed form
    batch = rotated.sample(200_000, seed=4)
    b = batch.alpha / 20
    A = torch.linalg.lstsq(b, batch.w).solution.T                 # least squares of w on b: E[w b^T] E[b b^T]^-1
    error = b @ A.T - batch.w
    loss = 0.5 * ((error @ S) * error).sum(-1).mean()
    assert loss.item() == pytest.approx(best, rel=0.02)
    with pytest.raises(ValueError, match="unknown setting"):
        memformer.paper_tasks("skewed")


def test_a_change_of_coordinates_is_absorbed_exactly_unless_the_gates_act_on_single_input_rows():
    from icl_course import memformer

    isotropic = memformer.paper_tasks("isotropic").sample(256, seed=6)
    C = memformer.rotated_coordinates(3)
    # the rotated law is the isotropic one seen through C: x' = C x, w' = C^-T w, labels unchanged
    rotated = memformer.paper_tasks("rotated", seed=3)
    torch.testing.assert_close(C @ C.T, rotated.covariance, rtol=0, atol=1e-12)
    torch.testing.assert_close(torch.linalg.inv(C).T @ torch.linalg.inv(C), rotated.weight_covariance, rtol=0,
                               atol=1e-12)
    moved = (isotropic.X @ C.T, isotropic.y, isotropic.x_t @ C.T)

    def gap(model):   # the largest difference of the predictions, relative to the largest prediction
        with torch.no_grad():
            prediction = model(isotropic).prediction
            mapped = memformer.change_coordinates(model, C)(*moved).prediction
        return ((prediction - mapped).abs().max() / prediction.abs().max()).item()

    noise = torch.Generator().manual_seed(7)
    models = {family: memformer.build(family, 3) for family in ("linear transformer", "CGD-like + A_l",
                                                                 "LFOM (tied gates)", "LFOM (per-layer gates)")}
    models["LFOM, every entry"] = memformer.build("LFOM (tied gates)", 3, attention="full")
    for model in models.values():
        with torch.no_grad():
            for parameter in model.parameters():
                parameter.add_(0.1 * torch.randn(parameter.shape, generator=noise, dtype=torch.float64))
    full = models.pop("LFOM, every entry")
    for name, model in models.items():          # the GD form: the input rows are never updated, any gates
        assert gap(model) < 1e-10, name
    # every entry of P free: the gates of the input rows differ between rows, and the mapped model is another one,
    # unless C is diagonal (a stretch scales each input row alone, as the gates do)
    assert gap(full) > 1e-2
    stretch = torch.diag(torch.tensor([2.0, 0.5, 1.5, 0.25, 3.0], dtype=torch.float64))
    with torch.no_grad():
        stretched = memformer.change_coordinates(full, stretch)(isotropic.X @ stretch, isotropic.y,
                                                                isotropic.x_t @ stretch).prediction
        assert ((stretched - full(isotropic).prediction).abs().max() / full(isotropic).prediction.abs().max()) < 1e-10
    with torch.no_grad():
        full.gates[:, :5] = full.gates[:, :5].mean(1, keepdim=True)   # equal within each column: exact again
    assert gap(full) < 1e-10
    # A_l = I absorbs a rotation (CG's steps are the same in rotated coordinates) but not a stretch
    scalars = memformer.build("CGD-like (scalars)", 3)
    U = memformer.rotation(3)
    assert (scalars(isotropic).prediction - memformer.change_coordinates(scalars, U)(
        isotropic.X @ U.T, isotropic.y, isotropic.x_t @ U.T).prediction).abs().max() < 1e-10
    with pytest.raises(ValueError, match="orthogonal C"):
        memformer.change_coordinates(scalars, C)
    with pytest.raises(ValueError, match="invertible"):
        memformer.change_coordinates(full, torch.diag(torch.tensor([1.0, 1.0, 1.0, 1.0, 0.0])))
    with pytest.raises(ValueError, match="invertible"):
        memformer.change_coordinates(full, torch.full((5, 5), float("nan")))
    with pytest.raises(ValueError, match=r"\(5, 5\) matrix"):
        memformer.change_coordinates(full, torch.eye(4))
    with pytest.raises(TypeError, match="rewrites a Memformer"):
        memformer.change_coordinates(torch.nn.Linear(5, 1), C)


def test_train_models_trains_every_depth_and_seed_at_once_and_lowers_the_fresh_task_loss():
    from icl_course import memformer

    recipe = dict(memformer.RECIPE, num_steps=60, batch_size=64, curve_every=30, curve_tasks=400)
    samplers = [memformer.paper_tasks("rotated", 0), memformer.paper_tasks("isotropic")]
    trained = memformer.train_models("CGD-like + A_l", (1, 2), samplers, [0, 1], recipe)
    for depth, (weights, curve) in trained.items():
        assert weights["A"].shape == (2, depth, 1, 5, 5) and curve.shape == (2, 3)
        assert (curve[:, -1] < 0.8 * curve[:, 0]).all()
        model = memformer.build("CGD-like + A_l", depth)
        model.load_state_dict(memformer.unstack(weights, 1))


def test_train_models_trains_on_a_gpu_the_same_models_and_refuses_one_it_cannot_see(tmp_path):
    from icl_course import memformer

    recipe = dict(memformer.RECIPE, num_steps=20, batch_size=32, curve_every=10, curve_tasks=100)
    samplers = [memformer.paper_tasks("rotated", 0)]
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="torch sees no CUDA GPU; use 'auto' or 'cpu'"):
            memformer.train_models("LFOM (tied gates)", (1,), samplers, [0], recipe, device="cuda")
        with pytest.raises(ValueError, match="no CUDA GPU"):   # before any tuning starts
            memformer.run_experiments(tmp_path / "never.pt", recipe=recipe, device="cuda")
        assert not (tmp_path / "never.pt").exists()
        pytest.skip("no CUDA GPU to compare with")
    on_cpu = memformer.train_models("LFOM (tied gates)", (1, 2), samplers, [0], recipe)
    on_gpu = memformer.train_models("LFOM (tied gates)", (1, 2), samplers, [0], recipe, device="cuda")
    for depth in (1, 2):   # the same tasks in the same order, float64 on both: the same models to rounding
        assert torch.allclose(on_gpu[depth][1], on_cpu[depth][1], rtol=1e-6)
        for key, value in on_cpu[depth][0].items():
            assert on_gpu[depth][0][key].device.type == "cpu"
            assert torch.allclose(on_gpu[depth][0][key], value, rtol=1e-5, atol=1e-9), key


def test_the_shipped_experiments_hold_every_model_at_every_depth_scored_on_enough_tasks():
    from icl_course import memformer

    results = memformer.load_experiments()
    recipe = results["recipe"]
    assert recipe == memformer.RECIPE and set(recipe["depths"]) >= {1, 2, 3, 4} and len(recipe["seeds"]) >= 3
    for setting in memformer.SETTINGS:
        assert set(results["baselines"][setting]) == set(memformer.BASELINES)
        for family in memformer.MODELS:
            assert sorted(results["models"][setting][family]) == list(recipe["depths"])
            for depth, run in results["models"][setting][family].items():
                assert run["mean"].shape == run["stderr"].shape == (len(recipe["seeds"]), depth)
                # from 5 layers on scored on stretched tasks, where a plain million cannot pin the mean (section 6)
                assert (run["stderr"] > 0).all() and (run["stderr"] < 0.1 * run["mean"]).all(), (setting, family, depth)
                assert run.get("stretched", False) == memformer.stretched(depth, recipe)
                assert memformer.load_model(results, setting, family, depth, seed=2).num_layers == depth
    assert memformer.eval_count(2) == recipe["shallow_eval_tasks"] and memformer.eval_count(3) == 1_000_000
    for size, part in results["small_batch"].items():   # Dutta et al.'s small-batch fits, B = 1 and 10
        assert size in (1, 10) and set(part) == {"batch", "cg_batch", "fresh", "fresh_stderr", "gradient_norm",
                                                 "restarts_best"}
        assert all(values.shape == (len(recipe["seeds"]), len(recipe["depths"])) for values in part.values())


def test_experiments_resume_from_their_file_and_refuse_another_recipe(tmp_path, monkeypatch):
    from icl_course import memformer

    tiny = dict(memformer.RECIPE, depths=(1, 2), seeds=(0,), num_steps=3, batch_size=16, curve_every=3,
                curve_tasks=50, eval_tasks=500, shallow_eval_tasks=300, tune_tasks=100, baseline_tasks=300)
    path = tmp_path / "experiments.pt"
    first = memformer.run_experiments(path, recipe=tiny)
    assert all(len(first["models"][s][f]) == 2 for s in memformer.SETTINGS for f in memformer.MODELS)
    # the two experiments with every entry of P and Q trained: 1 and 5 heads, and the LFOM that may update inputs
    assert set(first["heads"]) == {1, 5} and set(first["quasi_newton"]) == set(memformer.SETTINGS)
    five = memformer.load_full_attention_model(first, "heads", 5, 2)
    assert five.config["num_heads"] == 5 and five.attention == "full" and tuple(five.P.shape[:2]) == (2, 5)
    quasi = memformer.load_full_attention_model(first, "quasi_newton", "isotropic", 1)
    assert quasi.memory == "lfom" and quasi.attention == "full" and quasi.num_layers == 1
    assert first["quasi_newton"]["rotated"][2]["mean"].shape == (1, 2)
    with pytest.raises(KeyError, match="made by `--redo heads`"):
        memformer.load_full_attention_model(first, "heads", 3, 2)

    def no_training(family, *args, **kwargs):
        raise AssertionError(f"a finished model was trained again: {family}")
    monkeypatch.setattr(memformer, "train_models", no_training)
    again = memformer.run_experiments(path, recipe=tiny)
    assert torch.equal(again["models"]["rotated"]["LFOM (tied gates)"][2]["mean"],
                       first["models"]["rotated"]["LFOM (tied gates)"][2]["mean"])
    assert torch.equal(again["heads"][5][2]["mean"], first["heads"][5][2]["mean"])
    with pytest.raises(AssertionError, match="trained again"):   # a part named in redo is trained afresh
        memformer.run_experiments(path, recipe=tiny, redo=("quasi_newton",))
    with pytest.raises(ValueError, match="another recipe"):
        memformer.run_experiments(path, recipe=dict(tiny, num_steps=4))
    older = torch.load(path, weights_only=True)          # a file made before a family joined MODELS
    for setting in memformer.SETTINGS:
        del older["models"][setting]["LFOM (per-layer gates)"]
    torch.save(older, path)
    with pytest.raises(AssertionError, match=r"trained again: LFOM \(per-layer gates\)"):   # that family first
        memformer.run_experiments(path, recipe=tiny)


def test_stretched_depths_train_and_score_on_weighted_tasks_and_a_resume_trains_only_them(tmp_path):
    """``RECIPE["stretched_depths"]``: those depths train on stretched batches weighted back, are scored on
    ``stretched_tasks`` and so are the baselines of as many steps; a file made without them resumes by training
    those depths again and nothing else."""
    from icl_course import memformer
    from icl_course.runtime import make_generator

    factors = memformer._factors([memformer.paper_tasks("rotated", 0), memformer.paper_tasks("isotropic")])
    X, y, w = memformer._stacked_batches(factors, 20_000, make_generator(5))
    X_s, y_s, w_s, weight = memformer._stacked_batches(factors, 20_000, make_generator(5), stretched=True)
    assert torch.equal(w_s, w) and weight.shape == (2, 20_000) and weight.max() <= 2
    assert abs(weight.mean() - 1) < 4 * weight.std() / 40_000 ** 0.5                  # weights average to one
    unchanged = (X_s == X).flatten(2).all(-1)          # the tasks not stretched are the plain ones, to the bit
    assert 0.4 < unchanged.float().mean() < 0.6
    assert torch.allclose(y_s, (X_s @ w_s.unsqueeze(-1)).squeeze(-1))
    recipe = dict(memformer.RECIPE, num_steps=4, batch_size=16, curve_every=2, curve_tasks=50)
    with pytest.raises(ValueError, match="fixed batch"):
        memformer.train_models("CGD-like (scalars)", (1,), [memformer.paper_tasks("rotated", 0)], [0], recipe,
                               fixed_batch=4, stretched=True)
    tiny = dict(memformer.RECIPE, depths=(1, 2), seeds=(0,), num_steps=3, batch_size=16, curve_every=3,
                curve_tasks=50, eval_tasks=500, shallow_eval_tasks=300, tune_tasks=100, baseline_tasks=300,
                stretched_depths=(), stretched_num_steps=6)
    path = tmp_path / "experiments.pt"
    first = memformer.run_experiments(path, recipe=tiny)
    assert not memformer.stretched(2, tiny) and memformer.stretched(2, dict(tiny, stretched_depths=(2,)))
    again = memformer.run_experiments(path, recipe=dict(tiny, stretched_depths=(2,)))
    for setting in memformer.SETTINGS:
        for family in memformer.MODELS:
            one, two = (again["models"][setting][family][depth] for depth in (1, 2))
            assert torch.equal(one["mean"], first["models"][setting][family][1]["mean"]) and not one["stretched"]
            assert two["stretched"] and not torch.equal(two["mean"], first["models"][setting][family][2]["mean"])
            assert (one["num_steps"], two["num_steps"]) == (3, 6) and two["curve"].shape[-1] == 6 // 3 + 1
        for method in memformer.BASELINES:   # one step as before; two steps tuned and scored on stretched tasks
            before, after = first["baselines"][setting][method], again["baselines"][setting][method]
            assert before["mean"][0] == after["mean"][0] and before["mean"][1] != after["mean"][1]
    assert any(", 2 layers" in part for part in again["seconds"])
    assert memformer.training_steps(2, dict(tiny, stretched_depths=(2,))) == 6
    assert memformer.training_steps(1, tiny) == 3
    late = memformer.late_fall(again["models"]["rotated"]["CGD-like + A_l"])      # each depth over its own curve
    assert late.shape == (1, 2) and late.isfinite().all()
    # more tuning tasks for the stretched steps: the baselines are tuned again, those of one step to the bit
    more = memformer.run_experiments(path, recipe=dict(tiny, stretched_depths=(2,), stretched_tune_tasks=400))
    for setting in memformer.SETTINGS:
        for family in memformer.MODELS:
            assert torch.equal(more["models"][setting][family][2]["mean"], again["models"][setting][family][2]["mean"])
        for method in memformer.BASELINES[1:]:
            before, after = again["baselines"][setting][method], more["baselines"][setting][method]
            assert before["mean"][0] == after["mean"][0] and before["mean"][1] != after["mean"][1], method


def test_full_attention_depths_train_stretched_where_the_part_says_and_a_resume_trains_only_those(tmp_path,
                                                                                                  monkeypatch):
    """``FULL_ATTENTION_STRETCHED``: those depths of a full-attention part train on stretched batches and are scored
    on stretched tasks; a file whose part was trained otherwise trains again only those depths, and the GPU script
    trains and scores them the same way."""
    import importlib.util
    import pathlib

    from icl_course import memformer

    tiny = dict(memformer.RECIPE, depths=(1, 2), seeds=(0,), num_steps=3, batch_size=16, curve_every=3,
                curve_tasks=50, eval_tasks=500, shallow_eval_tasks=300, tune_tasks=100, baseline_tasks=300)
    recipe = memformer.full_attention_recipe("quasi_newton", 12, tiny)
    assert recipe["num_steps"] == recipe["stretched_num_steps"] == 12 and recipe["depths"] == (1, 2)
    assert memformer.full_attention_recipe("quasi_newton")["stretched_depths"] == (4,)
    with pytest.raises(ValueError, match="unknown part 'head'"):
        memformer.full_attention_recipe("head")
    path = tmp_path / "experiments.pt"
    first = memformer.run_experiments(path, recipe=tiny)
    assert not any(run["stretched"] for runs in first["quasi_newton"].values() for run in runs.values())
    monkeypatch.setattr(memformer, "FULL_ATTENTION_STRETCHED", {"heads": (), "quasi_newton": (2,)})
    trained = []
    original = memformer.train_models

    def recording(family, depths, *args, **kwargs):
        trained.append((family, tuple(depths), kwargs.get("attention"), kwargs.get("stretched")))
        return original(family, depths, *args, **kwargs)
    monkeypatch.setattr(memformer, "train_models", recording)
    again = memformer.run_experiments(path, recipe=tiny)
    assert trained == [("LFOM (tied gates)", (2,), "full", True)]       # that depth of that part, nothing else
    for setting in memformer.SETTINGS:
        one, two = (again["quasi_newton"][setting][depth] for depth in (1, 2))
        assert torch.equal(one["mean"], first["quasi_newton"][setting][1]["mean"]) and not one["stretched"]
        assert two["stretched"] and not torch.equal(two["mean"], first["quasi_newton"][setting][2]["mean"])
    assert torch.equal(again["heads"][5][2]["mean"], first["heads"][5][2]["mean"])
    assert "quasi_newton, 2 layers" in again["seconds"]
    trained.clear()
    memformer.run_experiments(path, recipe=tiny)                       # nothing left to train
    assert trained == []
    # the GPU script: the same stretched models, scored on stretched tasks
    script_path = pathlib.Path(__file__).resolve().parents[1] / "research" / "full_attention_gpu.py"
    spec = importlib.util.spec_from_file_location("full_attention_gpu", script_path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    monkeypatch.setattr(memformer, "RECIPE", tiny)
    monkeypatch.setattr(script, "GROUPS", [("quasi_newton", None, 2)])
    alone = script.train_group("quasi_newton", None, 2, 3, "cpu")["runs"]["isotropic"][2]
    assert alone["stretched"] and all(torch.equal(alone["weights"][key], value)
                                      for key, value in again["quasi_newton"]["isotropic"][2]["weights"].items())
    script.train(4, "cpu", tmp_path / "trained_4.pt", processes=1)
    monkeypatch.setattr(memformer, "load_experiments", lambda path: torch.load(path, weights_only=True))
    script.score([tmp_path / "trained_4.pt"], path)
    scored = torch.load(path, weights_only=True)["full_attention_lengths"][4]["quasi_newton"]["isotropic"][2]
    model = memformer.build("LFOM (tied gates)", 2, attention="full")
    model.load_state_dict(memformer.unstack(scored["weights"], 0))
    sampler = memformer.stretched_tasks(memformer.setting_samplers([0])[1])
    mean, stderr = memformer.score(model, sampler, memformer.eval_count(2, tiny), seed=7_000 + 2)
    assert torch.equal(scored["mean"][0], mean) and torch.equal(scored["stderr"][0], stderr)


def test_missing_damaged_or_foreign_results_and_unknown_models_get_clear_messages(tmp_path):
    from icl_course import memformer

    with pytest.raises(FileNotFoundError, match="make them with `python -m icl_course.memformer --out"):
        memformer.load_experiments(tmp_path / "nowhere.pt")
    (tmp_path / "damaged.pt").write_bytes(b"not a torch file")
    with pytest.raises(ValueError, match="damaged or was not made by run_experiments"):
        memformer.load_experiments(tmp_path / "damaged.pt")
    torch.save({"weights": torch.zeros(2)}, tmp_path / "foreign.pt")
    with pytest.raises(ValueError, match="is not a file of chapter 5 results"):
        memformer.load_experiments(tmp_path / "foreign.pt")
    with pytest.raises(ValueError, match="damaged or was not made by run_experiments"):
        memformer.run_experiments(tmp_path / "damaged.pt")
    results = memformer.load_experiments()
    with pytest.raises(KeyError, match="no trained model .* a depth of \\(1, 2, 3, 4"):
        memformer.load_model(results, "rotated", "CGD-like + A_l", 9)
    with pytest.raises(KeyError, match="unknown family"):
        memformer.build("LSTM", 2)


def test_the_gpu_script_trains_each_depth_as_the_experiment_does_and_scores_every_length(tmp_path, monkeypatch):
    """research/full_attention_gpu.py trains one (part, key, depth) per process: the same models, to the bit, as
    training all depths at once (one task stream per sampler), and its `score` writes the longest training as the
    parts and the shorter ones beside them."""
    import importlib.util
    import pathlib

    from icl_course import memformer

    path = pathlib.Path(__file__).resolve().parents[1] / "research" / "full_attention_gpu.py"
    spec = importlib.util.spec_from_file_location("full_attention_gpu", path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    tiny = dict(memformer.RECIPE, depths=(1, 2), seeds=(0, 1, 2), num_steps=4, batch_size=16, curve_every=2,
                curve_tasks=50, eval_tasks=200, shallow_eval_tasks=200)
    monkeypatch.setattr(memformer, "RECIPE", tiny)
    monkeypatch.setattr(script, "GROUPS", [group for group in script.GROUPS if group[2] <= 2])
    alone = script.train_group("heads", 5, 2, 4, "cpu")["runs"][5][2]
    seeds = list(tiny["seeds"])
    rotated = memformer.setting_samplers(seeds)[:3]
    together = memformer.train_groups("CGD-like + A_l", rotated, seeds, tiny, 1, "full", 5)[0][2]
    assert all(torch.equal(alone["weights"][key], value) for key, value in together["weights"].items())
    assert torch.equal(alone["curve"], together["curve"])
    # the packing of jobs onto processes: two equal jobs and their halves on two processes take 1.5 of one job
    assert script.steps_within(3750.0, {"a": 0.25, "b": 0.25}, 2) == 10_000
    assert script.steps_within(3700.0, {"a": 0.25, "b": 0.25}, 2) == 9000
    assert script.steps_within(3750.0, {"a": 0.25, "b": 0.25}, 1) == 5000      # one process: all four in a row
    results_path = tmp_path / "results.pt"
    memformer.run_experiments(results_path, recipe=dict(tiny, num_steps=2))
    trained = []
    for steps in (4, 8):
        script.train(steps, "cpu", tmp_path / f"trained_{steps}.pt", processes=1)
        trained.append(tmp_path / f"trained_{steps}.pt")
    monkeypatch.setattr(memformer, "load_experiments", lambda path: torch.load(path, weights_only=True))
    script.score(trained, results_path)
    results = torch.load(results_path, weights_only=True)
    assert results["full_attention_steps"] == 8 and sorted(results["full_attention_lengths"]) == [2, 4]
    steps, means, errors = memformer.training_lengths(results, "quasi_newton", "isotropic")
    assert steps == [2, 4, 8] and means.shape == errors.shape == (3, 3, 2) and (errors > 0).all()
    assert "--steps 4" in results["redone"][-1]["command"] and "--steps 8" in results["redone"][-1]["command"]
    # a few groups trained longer: new lengths for those depths only, the rest kept
    before = torch.load(results_path, weights_only=True)
    script.train(16, "cpu", tmp_path / "trained_16.pt", processes=1, groups=script.chosen_groups(["heads"], [2]))
    script.score([tmp_path / "trained_16.pt"], results_path)
    results = torch.load(results_path, weights_only=True)
    assert results["full_attention_steps"] == 8 and sorted(results["full_attention_lengths"]) == [2, 4, 16]
    assert all(torch.equal(results["heads"][key][2]["weights"][name], value)   # 8 steps again: the same models
               for key in (1, 5) for name, value in before["heads"][key][2]["weights"].items())
    steps, means, errors = memformer.training_lengths(results, "heads", 5)
    assert steps == [2, 4, 8, 16] and means.shape == (4, 3, 2)
    assert means[3, :, 0].isnan().all() and (means[3, :, 1] > 0).all() and (errors[3, :, 1] > 0).all()
    assert memformer.training_lengths(results, "quasi_newton", "rotated")[0] == [2, 4, 8]
    longest, finals, _, change = memformer.longest_training(results, "heads", 5)     # each depth's longest training
    assert longest == [8, 16] and torch.equal(finals[:, 1], means[3, :, 1])
    assert torch.equal(finals[:, 0], means[2, :, 0])
    assert torch.allclose(change[:, 1], means[3, :, 1] / means[2, :, 1] - 1)
    assert torch.allclose(change[:, 0], means[2, :, 0] / means[1, :, 0] - 1)
    assert "--steps 16 --parts heads --depths 2" in results["redone"][-1]["command"]
    with pytest.raises(SystemExit, match="unknown part"):
        script.chosen_groups(["head"], None)
    assert script.chosen_groups(["heads"], [2], [5]) == [("heads", 5, 2)]       # one number of heads only
    assert script.chosen_groups(None, [2], [5]) == [("heads", 5, 2), ("quasi_newton", None, 2)]
    with pytest.raises(SystemExit, match=r"heads must be among \(1, 5\)"):
        script.chosen_groups(["heads"], None, [3])
    one_key = {"steps": 16, "device": "cpu", "processes": 2, 16: {"heads": {5: {2: {}}}}}
    assert script._command(one_key).endswith("--processes 2 --steps 16 --parts heads --depths 2 --heads 5 "
                                             "--out trained_16.pt")


def test_the_stretched_depths_script_scores_and_trains_both_ways():
    """research/stretched_depths.py: the shipped 5-layer models on plain and stretched samples, and a tiny training
    on plain and on stretched batches (which differ)."""
    import importlib.util
    import pathlib

    from icl_course import memformer

    path = pathlib.Path(__file__).resolve().parents[1] / "research" / "stretched_depths.py"
    spec = importlib.util.spec_from_file_location("stretched_depths", path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    scores = script.score_shipped("CGD-like (scalars)", "isotropic", 5, samples=2, tasks=300)
    assert [len(scores[kind]) for kind in ("plain", "stretched")] == [3, 3]
    assert all(len(values) == 2 and all(0 < stderr < mean for mean, stderr in values)
               for per_seed in scores.values() for values in per_seed)
    tiny = dict(memformer.RECIPE, batch_size=16, curve_every=2, curve_tasks=50)
    plain = script.train_and_score("CGD-like (scalars)", "rotated", 4, False, 300, depths=(2,), recipe=tiny)
    stretched = script.train_and_score("CGD-like (scalars)", "rotated", 4, True, 300, depths=(2,), recipe=tiny)
    assert len(plain[2]) == len(stretched[2]) == 3 and plain[2] != stretched[2]
    assert script._line([(0.5, 0.01), (2e-4, 1e-5)]) == "0.5 ± 2.0%, 0.0002 ± 5.0%"   # the research notes' format
    faster = script.train_and_score("CGD-like (scalars)", "rotated", 4, False, 300, depths=(2,),
                                    recipe=dict(tiny, learning_rate=0.2))
    assert faster[2] != plain[2]                                     # --learning-rate reaches the training
    refused = subprocess.run([sys.executable, str(path), "lfom-lengths", "--depth", "5"], capture_output=True,
                             text=True)
    assert refused.returncode == 2 and "depths 1, 2, 3, 4 only" in refused.stderr and "Traceback" not in refused.stderr
    lengths = script.score_lengths("isotropic", 1, tasks=200)      # the quasi-Newton LFOM at every training length
    assert sorted(lengths) == [1500, 3000, 6000, 12000] and all(len(values) == 3 for values in lengths.values())
    assert sorted(script.score_lengths("isotropic", 4, tasks=200)) == [1500, 3000, 6000, 12000, 24000]   # 4 longer
    full = script.train_and_score("LFOM (tied gates)", "rotated", 2, True, 200, depths=(1,), recipe=tiny,
                                  attention="full")
    assert len(full[1]) == 3 and all(mean > 0 for mean, _ in full[1])


def test_train_models_goes_on_from_a_start_on_its_own_batches_and_refuses_a_start_that_does_not_fit():
    from icl_course import memformer

    recipe = dict(memformer.RECIPE, num_steps=30, batch_size=64, curve_every=10, curve_tasks=400)
    samplers = [memformer.paper_tasks("rotated", 0), memformer.paper_tasks("rotated", 1)]
    first, first_curve = memformer.train_models("CGD-like + A_l", (2,), samplers, [0, 1], recipe)[2]
    # no steps: the start comes back as it went in, and the curve's one point is its loss
    same, curve = memformer.train_models("CGD-like + A_l", (2,), samplers, [0, 1], dict(recipe, num_steps=0),
                                         start=first)[2]
    assert all(torch.equal(same[key], value) for key, value in first.items())
    assert torch.allclose(curve[:, 0], first_curve[:, -1], rtol=1e-12)
    further, further_curve = memformer.train_models("CGD-like + A_l", (2,), samplers, [0, 1], recipe, start=first,
                                                    batch_seed=123)[2]
    assert torch.allclose(further_curve[:, 0], first_curve[:, -1], rtol=1e-12)   # it starts where the first ended
    assert (further_curve[:, -1] < first_curve[:, -1]).all()                     # and goes on down
    other, _ = memformer.train_models("CGD-like + A_l", (2,), samplers, [0, 1], recipe, start=first, batch_seed=124)[2]
    again, _ = memformer.train_models("CGD-like + A_l", (2,), samplers, [0, 1], recipe, start=first, batch_seed=123)[2]
    assert torch.equal(again["A"], further["A"]) and not torch.equal(other["A"], further["A"])
    with pytest.raises(ValueError, match="one depth"):
        memformer.train_models("CGD-like + A_l", (1, 2), samplers, [0, 1], recipe, start=first)
    with pytest.raises(ValueError, match="start does not fit 2 models of 'CGD-like \\+ A_l' with 3 layers"):
        memformer.train_models("CGD-like + A_l", (3,), samplers, [0, 1], recipe, start=first)


def test_whitened_training_returns_the_given_coordinates_and_is_plain_training_on_isotropic_data():
    """``train_models(whitened=True)``: no steps give the start back, the curve is the loss of the weights in the
    given coordinates, on S = I it is plain training, and on rotated data Adam's path differs from plain training."""
    from icl_course import memformer

    recipe = dict(memformer.RECIPE, num_steps=20, batch_size=64, curve_every=10, curve_tasks=400)
    rotated, isotropic = [memformer.paper_tasks("rotated", 0)], [memformer.paper_tasks("isotropic")]
    for family, attention, key in (("LFOM (tied gates)", "full", "P"), ("CGD-like + A_l", None, "A")):
        first, first_curve = memformer.train_models(family, (2,), rotated, [0], recipe, attention=attention)[2]
        same, curve = memformer.train_models(family, (2,), rotated, [0], dict(recipe, num_steps=0), start=first,
                                             attention=attention, whitened=True)[2]
        assert all(torch.allclose(same[k], v, rtol=1e-12, atol=1e-13) for k, v in first.items())
        assert torch.allclose(curve[:, 0], first_curve[:, -1], rtol=1e-10)
        plain, plain_curve = memformer.train_models(family, (2,), rotated, [0], recipe, start=first,
                                                    attention=attention, batch_seed=5)[2]
        white, white_curve = memformer.train_models(family, (2,), rotated, [0], recipe, start=first,
                                                    attention=attention, batch_seed=5, whitened=True)[2]
        assert (white[key] - plain[key]).abs().max() > 1e-4 * plain[key].abs().max()   # another path,
        model = memformer.build(family, 2, attention=attention)                      # in the given coordinates:
        model.load_state_dict(memformer.unstack(white, 0))
        checks = memformer._stacked_batches(memformer._factors(rotated), recipe["curve_tasks"],
                                            memformer.make_generator(20_000))
        error = model(checks[0][0], checks[1][0]).weights - checks[2][0]
        loss = 0.5 * torch.einsum("bi,ij,bj->b", error, rotated[0].covariance, error).mean()
        assert torch.allclose(loss, white_curve[0, -1], rtol=1e-10)
        iso_plain = memformer.train_models(family, (2,), isotropic, [0], recipe, attention=attention)[2]
        iso_white = memformer.train_models(family, (2,), isotropic, [0], recipe, attention=attention, whitened=True)[2]
        assert all(torch.allclose(iso_white[0][k], v, rtol=1e-12, atol=1e-14) for k, v in iso_plain[0].items())
    with pytest.raises(ValueError, match="has neither"):
        memformer.train_models("CGD-like (scalars)", (1,), rotated, [0], recipe, whitened=True)


def test_the_widened_heads_script_widens_without_changing_the_function_and_scores_paired(tmp_path, monkeypatch):
    """research/widened_heads.py: both 5-head starts compute the 1-head model's function; tiny runs from two files
    train from them and are scored together, with the paired differences equal to the differences of the losses."""
    import importlib.util
    import pathlib

    from icl_course import memformer

    path = pathlib.Path(__file__).resolve().parents[1] / "research" / "widened_heads.py"
    spec = importlib.util.spec_from_file_location("widened_heads", path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    results = memformer.load_experiments()
    steps, start = script.start_weights(results, 3)
    assert steps == memformer.longest_training(results, "heads", 1)[0][2]
    five, split = script.widened(start, 5, seed=1), script.widened(start, 5, seed=1, how="split")
    batch = memformer.paper_tasks("rotated", 1).sample(200, seed=2)
    one_head = memformer.build(script.FAMILY, 3, 1, "full")
    one_head.load_state_dict(memformer.unstack(start, 1))
    for weights in (five, split):
        five_heads = memformer.build(script.FAMILY, 3, 5, "full")
        five_heads.load_state_dict(memformer.unstack(weights, 1))
        assert (one_head(batch).weights - five_heads(batch).weights).abs().max() < 1e-12
    assert (five["Q"][:, :, 1:].abs() > 0).all() and (five["P"][:, :, 1:] == 0).all()
    sizes = split["P"].flatten(-2).norm(dim=-1)                               # (seeds, layers, heads): all alike
    assert (sizes.max(-1).values < 1.2 * sizes.min(-1).values).all() and not torch.equal(split["P"][:, :, 0],
                                                                                          split["P"][:, :, 1])
    with pytest.raises(ValueError, match="how is 'five'"):
        script.widened(start, 5, seed=1, how="spread")
    # tiny runs through both commands, two files (the split start trained later), on a copy of the results
    results_path = tmp_path / "results.pt"
    torch.save({key: value for key, value in results.items() if key != "widened_heads"}, results_path)
    monkeypatch.setattr(memformer, "RECIPE", dict(memformer.RECIPE, curve_every=2, curve_tasks=100,
                                                  eval_tasks=300, shallow_eval_tasks=300))
    monkeypatch.setattr(memformer, "load_experiments", lambda path=results_path: torch.load(path, weights_only=True))
    files = []
    for names in (("one", "five"), ("split",)):
        out = tmp_path / f"trained_{len(files)}.pt"
        script.train(4, 0.005, out, processes=1, depths=[3], starts=names)
        files.append(out)
    script.score(files, results_path)
    scored = torch.load(results_path, weights_only=True)
    widened = scored["widened_heads"][3]
    assert widened["start_steps"] == steps and widened["steps"] == 4 and widened["start"].shape == (3, 4)
    for name in ("start", "one", "five", "split"):   # (mean, stderr, mean without the worst task of 300, its stderr)
        loss = widened[name]
        assert (loss[:, 2] < loss[:, 0]).all() and (0 < loss[:, 3]).all() and (loss[:, 3] < loss[:, 1]).all()
    assert widened["five - one"].shape == (3, 2)
    for name in ("five", "split"):
        assert torch.allclose(widened[f"{name} - one"][:, 0], widened[name][:, 0] - widened["one"][:, 0], rtol=1e-8)
    assert torch.allclose(widened["one - start"][:, 0], widened["one"][:, 0] - widened["start"][:, 0], rtol=1e-8)
    assert widened["weights"]["split"]["P"].shape == (3, 3, 5, 6, 6)
    command = scored["redone"][-1]["command"]
    assert "train trained_0.pt --steps 4 --learning-rate 0.005 --depths 3 --starts one five" in command
    assert "train trained_1.pt --steps 4 --learning-rate 0.005 --depths 3 --starts split" in command
    assert command.endswith("score trained_0.pt trained_1.pt")
    assert " s with 1 process, " in scored["redone"][-1]["where"]
    # another depth scored later joins the first; a depth without its 1-head run is refused
    script.train(2, 0.005, tmp_path / "two.pt", processes=1, depths=[2], starts=("one", "five"))
    script.score([tmp_path / "two.pt"], results_path)
    widened = torch.load(results_path, weights_only=True)["widened_heads"]
    assert sorted(widened) == [2, 3] and widened[3]["steps"] == 4 and widened[2]["steps"] == 2
    with pytest.raises(SystemExit, match="no file holds the 1-head model"):
        script.score([files[1]], results_path)
    # a second stage trains each scored model on from where it ended, and scores it beside that end, paired
    with pytest.raises(SystemExit, match="holds no 'split' models to continue"):
        script.train(2, 0.005, tmp_path / "none.pt", processes=1, depths=[2], starts=("split",), continued=True)
    script.train(2, 0.005, tmp_path / "second.pt", processes=1, depths=[3], starts=("one", "five"), continued=True)
    second = torch.load(tmp_path / "second.pt", weights_only=True)
    assert second["start_steps"][3] == steps + 4
    for name in ("one", "five"):   # the first curve point is the first stage's last: the same model, the same tasks
        assert torch.allclose(second["runs"][3][name]["curve"][:, 0], widened[3]["curve"][name][:, -1], rtol=1e-12)
    with pytest.raises(SystemExit, match="not both at once"):
        script.score([files[0], tmp_path / "second.pt"], results_path)
    with pytest.raises(SystemExit, match="missing.pt: no such file"):
        script.score([tmp_path / "missing.pt"], results_path)
    script.score([tmp_path / "second.pt"], results_path)
    scored = torch.load(results_path, weights_only=True)
    continued, first = scored["widened_heads_continued"][3][steps + 4], scored["widened_heads"][3]
    for name in ("one", "five"):   # the first stage's ends, scored again on the same tasks, read as before
        assert torch.allclose(continued[f"{name} (before)"], first[name], rtol=1e-12)
        assert torch.allclose(continued[f"{name} - {name} (before)"][:, 0],
                              continued[name][:, 0] - continued[f"{name} (before)"][:, 0], rtol=1e-8)
    assert torch.allclose(continued["five - one"][:, 0], continued["five"][:, 0] - continued["one"][:, 0], rtol=1e-8)
    assert scored["redone"][-1]["command"].startswith("python research/widened_heads.py train second.pt --steps 2 "
                                                      "--learning-rate 0.005 --depths 3 --starts one five --continued")
    # a third stage goes on from the second's end, on batches of its own, and is kept beside it
    script.train(2, 0.005, tmp_path / "third.pt", processes=1, depths=[3], starts=("one",), continued=True)
    third = torch.load(tmp_path / "third.pt", weights_only=True)
    assert third["start_steps"][3] == steps + 6
    assert torch.allclose(third["runs"][3]["one"]["curve"][:, 0], second["runs"][3]["one"]["curve"][:, -1], rtol=1e-12)
    assert not torch.equal(third["runs"][3]["one"]["weights"]["P"], second["runs"][3]["one"]["weights"]["P"])
    with pytest.raises(SystemExit, match="from different stages, or one whitened and one not; score each stage"):
        script.score([tmp_path / "second.pt", tmp_path / "third.pt"], results_path)
    script.score([tmp_path / "third.pt"], results_path)
    stages = torch.load(results_path, weights_only=True)["widened_heads_continued"][3]
    assert sorted(stages) == [steps + 4, steps + 6]
    assert torch.allclose(stages[steps + 6]["one (before)"], stages[steps + 4]["one"], rtol=1e-12)
    # the same file scored again replaces its stage and its record, and reads the same
    recorded = len(torch.load(results_path, weights_only=True)["redone"])
    script.score([tmp_path / "third.pt"], results_path)
    again = torch.load(results_path, weights_only=True)
    assert len(again["redone"]) == recorded and again["redone"][-1]["command"].endswith("score third.pt")
    assert torch.equal(again["widened_heads_continued"][3][steps + 6]["one"], stages[steps + 6]["one"])
    # research/stage_tails.py on the third stage (it follows the second): task by task on the tasks that scored it
    tails_path = pathlib.Path(__file__).resolve().parents[1] / "research" / "stage_tails.py"
    spec = importlib.util.spec_from_file_location("stage_tails", tails_path)
    tails_script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tails_script)
    with pytest.raises(SystemExit, match="give a later stage that follows another later stage"):
        tails_script.main(steps + 4, results_path, depth=3)      # the first later stage follows the first run
    third_stage = again["widened_heads_continued"][3][steps + 6]
    tails_script.main(steps + 6, results_path, depth=3)
    tails = torch.load(results_path, weights_only=True)["stage_tails"][steps + 6]["one"]
    torch.testing.assert_close(tails["mean change"], third_stage["one - one (before)"][:, 0]
                               / third_stage["one (before)"][:, 0], rtol=1e-6, atol=0)   # the score's tasks
    # the change splits exactly into the 100 tasks worst before the stage and the rest
    torch.testing.assert_close(tails["from worst"] + tails["from rest"], tails["mean change"], rtol=1e-9, atol=1e-12)
    assert ((0 <= tails["fell"][:, 0]) & (tails["fell"][:, 0] <= 1) & (tails["fell"][:, 1] > 0)).all()
    assert ((0 < tails["worst share"]) & (tails["worst share"] <= 1)).all() and (tails["median ratio"] > 0).all()
    # the third stage trained the 1-head model alone, so only it is compared
    assert sorted(torch.load(results_path, weights_only=True)["stage_tails"][steps + 6]) == ["one"]
    # a whitened stage: the same start and batches as a plain one, another path (the data are rotated); the flag is
    # kept in the file, the stage's record and the command, and a whitened file is not scored with a plain one
    script.train(2, 0.0005, tmp_path / "white.pt", processes=1, depths=[3], starts=("one",), continued=True,
                 whitened=True)
    script.train(2, 0.0005, tmp_path / "plain.pt", processes=1, depths=[3], starts=("one",), continued=True)
    white, plain = (torch.load(tmp_path / name, weights_only=True) for name in ("white.pt", "plain.pt"))
    assert white["whitened"] and not plain["whitened"] and white["start_steps"][3] == steps + 8
    torch.testing.assert_close(white["runs"][3]["one"]["curve"][:, 0], plain["runs"][3]["one"]["curve"][:, 0],
                               rtol=1e-12, atol=0)                        # the same start, in the given coordinates
    assert not torch.allclose(white["runs"][3]["one"]["weights"]["P"], plain["runs"][3]["one"]["weights"]["P"],
                              rtol=1e-6, atol=0)
    with pytest.raises(SystemExit, match="one whitened and one not"):
        script.score([tmp_path / "white.pt", tmp_path / "plain.pt"], results_path)
    script.score([tmp_path / "white.pt"], results_path)
    whitened = torch.load(results_path, weights_only=True)
    assert whitened["widened_heads_continued"][3][steps + 8]["whitened"]
    assert not whitened["widened_heads_continued"][3][steps + 6]["whitened"]
    assert whitened["redone"][-1]["command"].endswith("--depths 3 --starts one --continued --whitened && python "
                                                      "research/widened_heads.py score white.pt")


@pytest.mark.parametrize("how", ["new", "split"])
def test_widen_heads_keeps_the_function_and_refuses_what_it_cannot_widen(how):
    from icl_course import memformer

    one = [memformer.build("CGD-like + A_l", 2, 1, "full", seed=seed) for seed in (0, 1)]
    with torch.no_grad():   # away from the start, so that every block of P and Q matters
        for model in one:
            for parameter in (model.P, model.Q):
                parameter.add_(0.3 * torch.randn(parameter.shape, generator=torch.Generator().manual_seed(5),
                                                 dtype=torch.float64))
    stacked = {key: torch.stack([model.state_dict()[key] for model in one]) for key in one[0].state_dict()}
    wide = memformer.widen_heads(stacked, 5, seed=3, how=how)
    batch = memformer.paper_tasks("rotated", 0).sample(100, seed=1)
    for index, model in enumerate(one):
        five = memformer.build("CGD-like + A_l", 2, 5, "full")
        five.load_state_dict(memformer.unstack(wide, index))
        assert (five(batch).layer_weights - model(batch).layer_weights).abs().max() < 1e-10
    sizes = wide["P"].flatten(-2).norm(dim=-1)                           # (models, layers, heads)
    if how == "split":   # every head as large as the others, and no two alike
        assert (sizes.max(-1).values < 1.3 * sizes.min(-1).values).all()
        assert not torch.equal(wide["P"][:, :, 0], wide["P"][:, :, 1])
    else:                # the trained head, then heads that add nothing yet
        assert torch.equal(wide["P"][:, :, 0], stacked["P"][:, :, 0]) and (sizes[:, :, 1:] == 0).all()
    with pytest.raises(ValueError, match="how is 'new'"):
        memformer.widen_heads(stacked, 5, how="zero")
    with pytest.raises(ValueError, match="stacked 1-head weights"):
        memformer.widen_heads(wide, 5)


def test_the_quasi_newton_stages_script_trains_on_from_the_shipped_models_and_scores_paired(tmp_path, monkeypatch):
    """research/quasi_newton_stages.py: a tiny stage starts from the longest shipped 4-layer LFOM, a second from the
    first's end; each is scored beside its start on the start's own tasks, so "before" is the shipped number."""
    import importlib.util
    import pathlib

    from icl_course import memformer

    path = pathlib.Path(__file__).resolve().parents[1] / "research" / "quasi_newton_stages.py"
    spec = importlib.util.spec_from_file_location("quasi_newton_stages", path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    results = memformer.load_experiments()
    stages = script.shipped_stages(results)
    first = max(stages)
    steps = memformer.longest_training(results, "quasi_newton", "isotropic")[0][3]
    assert first == steps + sum(stage["steps"] for stage in results.get("quasi_newton_stages", {}).values())
    results_path = tmp_path / "results.pt"
    torch.save({key: value for key, value in results.items()
                if key not in ("quasi_newton_stages", "quasi_newton_branches")}, results_path)
    shipped = script.shipped_stages(torch.load(results_path, weights_only=True))
    assert sorted(shipped) == [steps]
    monkeypatch.setattr(memformer, "RECIPE", dict(memformer.RECIPE, curve_every=2, curve_tasks=100, eval_tasks=300))
    monkeypatch.setattr(memformer, "load_experiments", lambda path=results_path: torch.load(path, weights_only=True))
    script.train(2, 0.005, tmp_path / "one.pt", processes=1)
    trained = torch.load(tmp_path / "one.pt", weights_only=True)
    assert trained["start_steps"] == steps and sorted(trained["runs"]) == sorted(memformer.SETTINGS)
    with pytest.raises(SystemExit, match="missing.pt: no such file"):
        script.score(tmp_path / "missing.pt", results_path)
    script.score(tmp_path / "one.pt", results_path)
    scored = torch.load(results_path, weights_only=True)
    stage = scored["quasi_newton_stages"][steps]
    for setting in memformer.SETTINGS:
        # "before" is the shipped model on its own scoring tasks (the million there, 300 here: the same first 300)
        shipped_model = memformer.build(script.FAMILY, 4, 1, "full")
        shipped_model.load_state_dict(memformer.unstack(shipped[steps][setting]["weights"], 0))
        sampler = memformer.setting_samplers(list(memformer.RECIPE["seeds"]))[memformer.SETTINGS.index(setting) * 3]
        mean, _ = memformer.score(shipped_model, memformer.stretched_tasks(sampler), 300, seed=7_000 + 4)
        torch.testing.assert_close(stage[setting]["before"][0, 0], mean[-1], rtol=1e-9, atol=0)
        torch.testing.assert_close(stage[setting]["after - before"][:, 0],
                                   stage[setting]["after"][:, 0] - stage[setting]["before"][:, 0], rtol=1e-8, atol=0)
        assert (stage[setting]["after - before"][:, 1] > 0).all() and stage[setting]["curve"].shape == (3, 2)
        assert not torch.equal(stage[setting]["weights"]["P"], shipped[steps][setting]["weights"]["P"])
    assert scored["redone"][-1]["command"] == ("python research/quasi_newton_stages.py train one.pt --steps 2 "
                                               "--learning-rate 0.005 && python research/quasi_newton_stages.py "
                                               "score one.pt")
    # a second stage goes on from the first's end; a file from a stage that is not shipped is refused
    script.train(2, 0.005, tmp_path / "two.pt", processes=1)
    second = torch.load(tmp_path / "two.pt", weights_only=True)
    assert second["start_steps"] == steps + 2
    assert torch.equal(second["runs"]["rotated"]["start"]["P"], stage["rotated"]["weights"]["P"])
    torch.save({key: value for key, value in scored.items() if key != "quasi_newton_stages"}, results_path)
    with pytest.raises(SystemExit, match="goes on from"):
        script.score(tmp_path / "two.pt", results_path)
    torch.save(scored, results_path)
    script.score(tmp_path / "two.pt", results_path)
    script.score(tmp_path / "two.pt", results_path)        # scored again: the same stage and record, replaced
    again = torch.load(results_path, weights_only=True)
    assert sorted(again["quasi_newton_stages"]) == [steps, steps + 2]
    assert len(again["redone"]) == len(scored["redone"]) + 1
    torch.testing.assert_close(again["quasi_newton_stages"][steps + 2]["isotropic"]["before"],
                               stage["isotropic"]["after"], rtol=1e-12, atol=0)
    # a branch from a shorter shipped training: its own stages, its own key, the longest refused as an origin
    with pytest.raises(SystemExit, match="--from 24000: branch from one of the shorter"):
        script.shipped_stages(again, 24_000)
    origin = 3_000
    script.train(2, 0.0005, tmp_path / "branch.pt", processes=1, origin=origin)
    branch = torch.load(tmp_path / "branch.pt", weights_only=True)
    scratch = again["full_attention_lengths"][origin]["quasi_newton"]
    assert branch["start_steps"] == origin and branch["origin"] == origin
    assert torch.equal(branch["runs"]["isotropic"]["start"]["P"], scratch["isotropic"][4]["weights"]["P"])
    script.score(tmp_path / "branch.pt", results_path)
    branched = torch.load(results_path, weights_only=True)
    assert sorted(branched["quasi_newton_stages"]) == [steps, steps + 2]       # the main line is untouched
    assert sorted(branched["quasi_newton_branches"]) == [origin]
    assert sorted(script.shipped_stages(branched, origin)) == [origin, origin + 2]
    assert branched["redone"][-1]["command"].startswith("python research/quasi_newton_stages.py train branch.pt "
                                                        "--steps 2 --learning-rate 0.0005 --from 3000 && ")
    for setting in memformer.SETTINGS:
        model = memformer.build(script.FAMILY, 4, 1, "full")
        model.load_state_dict(memformer.unstack(scratch[setting][4]["weights"], 1))
        sampler = memformer.setting_samplers(list(memformer.RECIPE["seeds"]))[memformer.SETTINGS.index(setting) * 3 + 1]
        seed = list(memformer.RECIPE["seeds"])[1]
        mean, _ = memformer.score(model, memformer.stretched_tasks(sampler), 300, seed=7_000 + 31 * seed + 4)
        torch.testing.assert_close(branched["quasi_newton_branches"][origin][origin][setting]["before"][1, 0],
                                   mean[-1], rtol=1e-9, atol=0)
    # where a stage trained goes into its record and, for a GPU, into the command that redoes it
    assert branch["device"] == "cpu" and branched["redone"][-1]["where"].startswith("trained on a 2-core CPU (")
    torch.save(dict(branch, device="cuda", where="NVIDIA H200"), tmp_path / "on_a_gpu.pt")
    script.score(tmp_path / "on_a_gpu.pt", results_path)
    record = torch.load(results_path, weights_only=True)["redone"][-1]
    assert "--from 3000 --device cuda && python research/quasi_newton_stages.py score on_a_gpu.pt" in record["command"]
    assert record["where"].startswith("trained on NVIDIA H200 (") and "scored on a 2-core CPU" in record["where"]
    # a whitened stage: the flag in the stage's record and the command; on isotropic data it is a plain stage
    script.train(2, 0.0005, tmp_path / "white.pt", processes=1, origin=origin, whitened=True)
    white = torch.load(tmp_path / "white.pt", weights_only=True)
    assert white["whitened"] and white["start_steps"] == origin + 2
    script.train(2, 0.0005, tmp_path / "plain.pt", processes=1, origin=origin)
    plain = torch.load(tmp_path / "plain.pt", weights_only=True)
    assert torch.allclose(white["runs"]["isotropic"]["weights"]["P"], plain["runs"]["isotropic"]["weights"]["P"],
                          rtol=1e-12, atol=1e-14)
    assert not torch.allclose(white["runs"]["rotated"]["weights"]["P"], plain["runs"]["rotated"]["weights"]["P"],
                              rtol=1e-6, atol=0)
    script.score(tmp_path / "white.pt", results_path)
    whitened = torch.load(results_path, weights_only=True)
    assert whitened["quasi_newton_branches"][origin][origin + 2]["whitened"]
    assert not whitened["quasi_newton_branches"][origin][origin]["whitened"]
    assert whitened["redone"][-1]["command"].endswith("--from 3000 --whitened && python "
                                                      "research/quasi_newton_stages.py score white.pt")
    if not torch.cuda.is_available():
        with pytest.raises(SystemExit, match="--device cuda: .* torch sees no CUDA GPU"):
            script.train(2, 0.0005, tmp_path / "none.pt", processes=1, origin=origin, device="cuda")
