import random

import pytest
import torch
from reference import attention_layer_by_the_formula

from icl_course import LinearTransformer, RegressionTasks, gd_construction, gradient_descent
from icl_course.models import PARAMETERIZATIONS, LinearSelfAttention


def random_model(parameterization, d=3, num_layers=2, num_heads=3, seed=0):
    return LinearTransformer(d, num_layers, num_heads, parameterization, init_scale=0.3, seed=seed,
                             dtype=torch.float64, device="cpu")


@pytest.mark.parametrize("parameterization", PARAMETERIZATIONS)
def test_every_parameterization_matches_the_layer_formula(parameterization, float64_tasks):
    model = random_model(parameterization)
    batch = float64_tasks(d=3, n=5).sample(3, seed=1)
    history = model.transform_tokens(batch.tokens)
    tokens = batch.tokens
    output = model(batch)
    for index, layer in enumerate(model.layers):
        P, Q = layer.head_matrices()
        tokens = attention_layer_by_the_formula(tokens, P, Q)
        assert torch.allclose(history[index + 1], tokens, rtol=1e-12, atol=1e-12)
        # the Gram-matrix forward pass reads the same prediction off the query token
        assert torch.allclose(output.layer_predictions[:, index], -tokens[:, -1, -1], rtol=1e-10, atol=1e-12)
    assert torch.allclose(model.final_weights(batch), output.weights, rtol=1e-10, atol=1e-12)


def test_parameterizations_have_the_documented_structure():
    d = 3
    diag = LinearSelfAttention(d, 2, "diag", init_scale=1.0).requires_grad_(False)
    P, Q = diag.head_matrices()
    for k in range(2):
        assert torch.equal(P[k], torch.diag(torch.tensor([diag.p[k, 0]] * d + [diag.p[k, 1]])))
        assert torch.equal(Q[k], torch.diag(torch.tensor([diag.q[k, 0]] * d + [diag.q[k, 1]])))
    gdpp = LinearSelfAttention(d, 1, "gdpp", init_scale=1.0)
    assert gdpp.head_matrices()[1][0, d, d] == 0  # GD++: q_y = 0
    gd = LinearSelfAttention(d, 1, "gd", init_scale=1.0)
    P, Q = gd.head_matrices()
    assert torch.count_nonzero(P) == 1 and torch.count_nonzero(Q[:, d]) == 0 and torch.count_nonzero(Q[:, :, d]) == 0


def test_diagonal_weights_are_the_four_products_of_chapter_4(float64_tasks):
    layer = LinearSelfAttention(3, 2, "diag", init_scale=0.5, dtype=torch.float64)
    weights = layer.diagonal_weights()
    batch = float64_tasks(d=3, n=6).sample(4, seed=2)
    after = layer(batch.tokens)
    Sigma, alpha, energy = batch.Sigma, batch.alpha, batch.label_energy
    X, y = batch.X, batch.y
    # x_i <- x_i + w_xx Sigma x_i + w_xy y_i alpha ;  y_i <- y_i + w_yx <alpha, x_i> + w_yy lambda y_i
    expected_x = X + weights["w_xx"] * X @ Sigma + weights["w_xy"] * y.unsqueeze(-1) * alpha.unsqueeze(1)
    expected_y = (y + weights["w_yx"] * torch.einsum("bnd,bd->bn", X, alpha)
                  + weights["w_yy"] * energy.unsqueeze(-1) * y)
    assert torch.allclose(after[:, :-1, :3], expected_x, atol=1e-12)
    assert torch.allclose(after[:, :-1, 3], expected_y, atol=1e-12)


def test_gd_construction_runs_gradient_descent_for_random_settings():
    rng = random.Random(0)
    for trial in range(8):
        d, n, num_layers = rng.randint(1, 8), rng.randint(2, 30), rng.randint(1, 6)
        eta = rng.uniform(0.05, 1.0)
        batch = RegressionTasks(d, n, rng.uniform(0, 1), dtype=torch.float64, device="cpu").sample(16, seed=trial)
        model = gd_construction(d, n, eta, num_layers)
        iterates = gradient_descent(batch.X, batch.y, eta, num_layers)  # (B, L+1, d)
        output = model(batch)
        scale = iterates.abs().max()
        assert torch.allclose(output.layer_weights, iterates[:, 1:], atol=1e-10 * scale, rtol=0)
        tokens = model.transform_tokens(batch.tokens)
        for layer in range(1, num_layers + 1):
            residuals = batch.y - torch.einsum("bnd,bd->bn", batch.X, iterates[:, layer])
            assert torch.allclose(tokens[layer][:, :-1, d], residuals, atol=1e-10 * scale)
            assert torch.equal(tokens[layer][:, :, :d], batch.tokens[:, :, :d])  # inputs untouched
            assert torch.allclose(-tokens[layer][:, -1, d], (iterates[:, layer] * batch.x_t).sum(-1),
                                  atol=1e-10 * scale)


def test_preconditioned_gd_construction(float64_tasks):
    tasks = float64_tasks(d=4, n=12)
    batch = tasks.sample(8, seed=3)
    preconditioner = torch.randn(4, 4, generator=torch.Generator().manual_seed(0), dtype=torch.float64) * 0.3
    model = gd_construction(4, 12, 0.4, 3, preconditioner=preconditioner)
    expected = gradient_descent(batch.X, batch.y, 0.4, 3, preconditioner=preconditioner)[:, 1:]
    assert torch.allclose(model(batch).layer_weights, expected, atol=1e-12)


def test_prediction_is_linear_in_the_query(float64_tasks):
    model = random_model("full")
    batch = float64_tasks(d=3, n=5).sample(4, seed=5)
    doubled = model(batch.X, batch.y, 2 * batch.x_t).prediction
    assert torch.allclose(doubled, 2 * model(batch).prediction)


def test_heads_add_up(float64_tasks):
    two_heads = random_model("full", num_layers=1, num_heads=2)
    batch = float64_tasks(d=3, n=5).sample(3, seed=6)
    gram = batch.gram
    layer = two_heads.layers[0]
    P, Q = layer.head_matrices()
    assert torch.allclose(layer.mixing(gram), P[0] @ gram @ Q[0] + P[1] @ gram @ Q[1], atol=1e-12)


def test_initialisation_is_seeded():
    first, second = LinearTransformer(4, 2, seed=7, device="cpu"), LinearTransformer(4, 2, seed=7, device="cpu")
    assert all(torch.equal(a, b) for a, b in zip(first.parameters(), second.parameters()))
    assert not torch.equal(first.layers[0].P, LinearTransformer(4, 2, seed=8, device="cpu").layers[0].P)


@pytest.mark.parametrize("call, message", [
    (lambda m, b: LinearTransformer(3, parameterization="softmax"),
     "unknown parameterization 'softmax'; choose one of full, diag, gdpp, gd"),
    (lambda m, b: LinearTransformer(3, num_layers=0), "num_layers must be a positive integer"),
    (lambda m, b: m(b.X[:, :, :2], b.y), "built for d=3"),
    (lambda m, b: m(b.X, b.y[:, :2]), r"expected X of shape \(B, n, d\)"),
    (lambda m, b: m(b.X.float(), b.y.float()), "sample with the same dtype"),
    (lambda m, b: m(b.X), "pass a TaskBatch"),
    (lambda m, b: m(b.X, b.y, b.x_t[:, :2]), "expected x_t of shape"),
    (lambda m, b: m.layers[0].diagonal_weights(), "needs a 'diag' or 'gdpp' layer"),
    (lambda m, b: m.transform_tokens(b.X), "expected tokens of shape"),
    (lambda m, b: gd_construction(3, 5, 0.1, preconditioner=torch.eye(2)), "preconditioner must have shape"),
])
def test_bad_inputs_raise_clear_errors(call, message, float64_tasks):
    model = random_model("full")
    batch = float64_tasks(d=3, n=5).sample(2, seed=0)
    with pytest.raises(ValueError, match=message):
        call(model, batch)


def test_next_gram_is_the_gram_matrix_of_the_moved_tokens(float64_tasks):
    from icl_course.models import next_gram
    batch = float64_tasks(d=4, n=9).sample(6, seed=3)
    model = LinearTransformer(4, num_layers=2, num_heads=2, parameterization="full", init_scale=0.3, seed=2,
                              dtype=torch.float64, device="cpu")
    tokens = model.transform_tokens(batch.tokens)
    gram = batch.gram
    for layer, after in zip(model.layers, tokens[1:]):
        gram = next_gram(gram, layer.mixing(gram))
        context = after[:, :-1]
        torch.testing.assert_close(gram, context.transpose(1, 2) @ context, rtol=1e-12, atol=1e-12)


def test_deepen_keeps_the_function_with_one_more_layer_that_can_learn():
    from icl_course.models import deepen

    batch = RegressionTasks(10, 20, 1.0, dtype=torch.float64).sample(64, torch.Generator().manual_seed(4))
    for parameterization in ("gdpp", "diag", "full"):
        model = LinearTransformer(10, 2, 2, parameterization, init_scale=0.1, seed=6, dtype=torch.float64)
        for position in (0, 1):
            deeper = deepen(model, position)
            assert deeper.num_layers == 3 and deeper.config["parameterization"] == parameterization
            # the same prediction; the layers after the new one see the tokens the old ones saw
            torch.testing.assert_close(deeper(batch).weights, model(batch).weights, rtol=1e-12, atol=1e-12)
            kept = [index for index in range(3) if index != position]
            torch.testing.assert_close(deeper(batch).layer_weights[:, kept], model(batch).layer_weights,
                                       rtol=1e-12, atol=1e-12)
            # the new layer's p (P) is zero but gets a gradient, so training can use the layer
            new = deeper.layers[position]
            weight = new.P if parameterization == "full" else new.p
            assert torch.count_nonzero(weight) == 0
            ((deeper(batch).weights - batch.w) ** 2).sum().backward()
            assert weight.grad.abs().max() > 0
    with pytest.raises(ValueError, match="position must be 0..1 for a 2-layer model"):
        deepen(model, 2)
    with pytest.raises(ValueError, match="deepen takes a gdpp, diag, full model, not 'gd'"):
        deepen(LinearTransformer(10, 2, 1, "gd"), 0)


def test_widen_keeps_the_function_and_frees_the_new_weights():
    from icl_course.models import widen

    batch = RegressionTasks(10, 20, 1.0, dtype=torch.float64).sample(64, torch.Generator().manual_seed(3))
    gdpp = LinearTransformer(10, 3, 2, "gdpp", init_scale=0.3, seed=5, dtype=torch.float64)
    diag = widen(gdpp, "diag")
    full = widen(diag, "full")
    for wide in (diag, full, widen(gdpp, "full"), widen(gdpp, "gdpp"), widen(diag, "diag")):
        # the same implicit weights at every layer, to rounding
        torch.testing.assert_close(wide(batch).layer_weights, gdpp(batch).layer_weights, rtol=1e-12, atol=1e-12)
    assert diag.config["parameterization"] == "diag" and full.config["num_heads"] == 2
    assert torch.equal(diag.layers[0].q[:, 1], torch.zeros(2, dtype=torch.float64))   # q_y = 0: GD++
    # the wider model trains the weights the smaller one lacked (q_y gets a gradient)
    loss = ((diag(batch).weights - batch.w) ** 2).sum()
    loss.backward()
    assert diag.layers[0].q.grad[:, 1].abs().max() > 0
    with pytest.raises(ValueError, match="cannot be widened to 'diag'"):
        widen(full, "diag")
