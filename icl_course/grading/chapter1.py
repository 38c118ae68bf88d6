"""The graded checks of chapter 1, linear attention is gradient descent.

``merged_form``, ``linear_attention``, ``gd_matrices``, ``transformer_prediction`` and ``best_step_size``,
each verified against :mod:`icl_course.models` and :mod:`icl_course.optimizers`.
"""

from __future__ import annotations

import torch

from ..data import RegressionTasks
from ..models import LinearSelfAttention, gd_construction
from ..optimizers import gradient_descent
from .checking import (
    FLOAT64,
    Case,
    Check,
    close,
    expect_number,
    expect_pair,
    expect_tensor,
    fail,
    generator_from,
    mismatch,
    normal,
    plural,
)

__all__ = ["chapter_1_checks"]

def _merged_form_case(D: int, k: int, v: int, generator: torch.Generator) -> Case:
    W_K, W_Q, W_V, W_P = (normal(generator, *shape) for shape in ((k, D), (k, D), (v, D), (D, v)))
    return Case(dict(W_K=W_K, W_Q=W_Q, W_V=W_V, W_P=W_P), dict(tokens=normal(generator, 3, 6, D)))


def _verify_merged_form(case: Case, output) -> None:
    W_K, W_Q, W_V, W_P = (case.arguments[key] for key in ("W_K", "W_Q", "W_V", "W_P"))
    D = W_P.shape[0]
    P, Q = expect_pair(output, "merged_form")
    P, Q = expect_tensor(P, (D, D), "P"), expect_tensor(Q, (D, D), "Q")
    tokens = case.context["tokens"]
    context = tokens[:, :-1]
    scores = (tokens @ W_Q.T) @ (context @ W_K.T).transpose(1, 2)
    four_matrix_head = tokens + scores @ (context @ W_V.T) @ W_P.T
    with torch.no_grad():
        merged_head = LinearSelfAttention.from_matrices(P, Q)(tokens)
    if not close(merged_head, four_matrix_head):
        fail(f"for D={D}: the head with your (P, Q) moves tokens differently from the four-matrix head; the "
             f"furthest entry [task, token, coordinate]{mismatch(merged_head, four_matrix_head)}")


def _linear_attention_case(B: int, n: int, D: int, generator: torch.Generator) -> Case:
    return Case(dict(tokens=normal(generator, B, n + 1, D), P=normal(generator, D, D), Q=normal(generator, D, D)))


def _verify_linear_attention(case: Case, output) -> None:
    tokens, P, Q = (case.arguments[key] for key in ("tokens", "P", "Q"))
    result = expect_tensor(output, tokens.shape, "linear_attention(tokens, P, Q)")
    with torch.no_grad():
        expected = LinearSelfAttention.from_matrices(P, Q)(tokens)
    if close(result, expected):
        return
    reads_query = tokens + tokens @ (P @ tokens.transpose(1, 2) @ tokens @ Q).transpose(1, 2)
    if close(result, reads_query):
        fail(f"for {case.label}: your sum over j includes the query token; it runs over the n context tokens, "
                 "not the query")
    fail(f"for {case.label}: the layer does not follow e_i + sum_j (e_j^T Q e_i) P e_j; the furthest entry "
         f"[task, token, coordinate]{mismatch(result, expected)}")


def _gd_matrices_case(d: int, n: int, eta: float, seed: int) -> Case:
    return Case(dict(d=d, n=n, eta=eta), dict(seed=seed))


def _verify_gd_matrices(case: Case, output) -> None:
    d, n, eta = (case.arguments[key] for key in ("d", "n", "eta"))
    P, Q = expect_pair(output, "gd_matrices")
    P, Q = expect_tensor(P, (d + 1, d + 1), "P"), expect_tensor(Q, (d + 1, d + 1), "Q")
    batch = RegressionTasks(d, n, noise=0.5, **FLOAT64).sample(16, seed=case.context["seed"])
    with torch.no_grad():
        after = LinearSelfAttention.from_matrices(P, Q)(batch.tokens)
    w_1 = gradient_descent(batch.X, batch.y, eta, 1)[:, 1]
    gd_prediction = (w_1 * batch.x_t).sum(-1)
    if not close(-after[:, -1, -1], gd_prediction):
        if close(after[:, -1, -1], gd_prediction):   # diagnose only what is wrong
            fail(f"for d={d}, n={n}, eta={eta:g}: the sign is flipped: the query's last coordinate becomes "
                 "+<w_1, x_t> instead of -<w_1, x_t>: the prediction (minus it) is that of a step up the loss")
        fail(f"for d={d}, n={n}, eta={eta:g}: the query's prediction is not that of one GD step; the furthest "
             f"of 16 tasks{mismatch(-after[:, -1, -1], gd_prediction)}")
    residuals = batch.y - torch.einsum("bnd,bd->bn", batch.X, w_1)
    if not close(after[:, :-1, -1], residuals):
        fail(f"for d={d}, n={n}, eta={eta:g}: the context labels should become the residuals y_i - <w_1, x_i>; "
             f"the furthest [task, token]{mismatch(after[:, :-1, -1], residuals)}")


def _layers_case(d: int, n: int, eta: float, num_layers: int, seed: int) -> Case:
    batch = RegressionTasks(d, n, noise=0.3, **FLOAT64).sample(16, seed=seed)
    P, Q = (matrix[0].detach().clone() for matrix in gd_construction(d, n, eta).layers[0].head_matrices())
    return Case(dict(tokens=batch.tokens, P=P, Q=Q, num_layers=num_layers), dict(batch=batch, eta=eta))


def _verify_transformer_prediction(case: Case, output) -> None:
    batch, eta, num_layers = case.context["batch"], case.context["eta"], case.arguments["num_layers"]
    prediction = expect_tensor(output, (batch.X.shape[0],), "transformer_prediction (one prediction per task)")
    w_L = gradient_descent(batch.X, batch.y, eta, num_layers)[:, -1]
    expected = (w_L * batch.x_t).sum(-1)
    layers, steps = plural(num_layers, "layer"), plural(num_layers, "GD step")
    if not close(prediction, expected):
        if close(prediction, -expected):   # diagnose only what is wrong
            fail(f"the sign is flipped ({case.label}): your predictions are minus those of {steps}; the "
                 f"furthest task{mismatch(prediction, expected)}")
        fail(f"with the GD weights, {layers} should give the prediction of {steps} ({case.label}); the "
             f"furthest task{mismatch(prediction, expected)}")


def _best_step_size_reference(d: int, n: int, num_tasks: int, seed: int) -> float:
    batch = RegressionTasks(d, n, **FLOAT64).sample(num_tasks, seed=seed)
    step = batch.alpha / n                      # w_1 = eta * step: the loss is a quadratic in eta
    return float((step * batch.w).sum() / (step * step).sum())


def _verify_best_step_size(case: Case, output) -> None:
    eta = expect_number(output, "best_step_size")
    best = _best_step_size_reference(**case.arguments)
    d, n = case.arguments["d"], case.arguments["n"]
    if abs(eta - best) <= 2e-3 * abs(best):
        return
    if abs(eta * n - best) <= 2e-3 * abs(best):
        fail(f"for {case.label}: {eta:.5f} is n = {n} times smaller than the best step {best:.5f}: it is the "
             "coefficient c = eta / n on alpha, not the step eta")
    if abs(eta - n / (n + d + 1)) <= 1e-9:
        fail(f"for {case.label}: {eta:.5f} is n / (n + d + 1), the limit for infinitely many tasks; the step with "
             f"the smallest mean loss on the sampled tasks is {best:.5f}")
    fail(f"for {case.label}: eta = {eta:.5f}, but the step with the smallest mean loss on these tasks is "
         f"{best:.5f} (within 0.2% is enough)")


def chapter_1_checks() -> list[Check]:
    """The graded checks of chapter 1, in task order."""
    def merged_examples():
        return [_merged_form_case(4, 3, 2, torch.Generator().manual_seed(0))]

    def merged_draw(rng):
        return [_merged_form_case(rng.randint(2, 7), rng.randint(1, 5), rng.randint(1, 5), generator_from(rng))
                for _ in range(5)]

    def attention_examples():
        return [_linear_attention_case(2, 5, 3, torch.Generator().manual_seed(0))]

    def attention_draw(rng):
        return [_linear_attention_case(rng.randint(1, 5), rng.randint(1, 15), rng.randint(2, 6), generator_from(rng))
                for _ in range(5)]

    def gd_examples():
        return [_gd_matrices_case(3, 8, 0.5, seed=0)]

    def gd_draw(rng):
        return [_gd_matrices_case(rng.randint(1, 6), rng.randint(2, 30), round(rng.uniform(0.1, 1.2), 3),
                                  rng.getrandbits(31)) for _ in range(5)]

    def layers_examples():
        return [_layers_case(3, 10, 0.6, num_layers, seed=num_layers) for num_layers in (1, 2, 4)]

    def layers_draw(rng):
        return [_layers_case(rng.randint(1, 5), rng.randint(4, 30), round(rng.uniform(0.2, 0.8), 3),
                             rng.randint(2, 6), rng.getrandbits(31)) for _ in range(4)]

    def step_examples():
        return [Case(dict(d=10, n=20, num_tasks=20_000, seed=0))]

    def step_draw(rng):
        cases = []
        for _ in range(3):
            d = rng.randint(2, 8)
            cases.append(Case(dict(d=d, n=rng.randint(d, 40), num_tasks=rng.choice((500, 2000)),
                                   seed=rng.getrandbits(31))))
        return cases

    return [
        Check(1, 1, "merged_form", merged_examples, merged_draw, _verify_merged_form),
        Check(1, 2, "linear_attention", attention_examples, attention_draw, _verify_linear_attention,
              giveaways=("LinearSelfAttention", "LinearTransformer", "from_matrices", "transform_tokens")),
        Check(1, 3, "gd_matrices", gd_examples, gd_draw, _verify_gd_matrices, giveaways=("gd_construction",)),
        Check(1, 4, "transformer_prediction", layers_examples, layers_draw, _verify_transformer_prediction,
              giveaways=("gradient_descent", "gd_construction", "LinearTransformer", "LinearSelfAttention")),
        Check(1, 5, "best_step_size", step_examples, step_draw, _verify_best_step_size,
              giveaways=("theory", "optimal_one_step_coefficient", "tune_step_sizes")),
    ]
