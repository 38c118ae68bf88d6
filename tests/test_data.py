import pytest
import torch

from icl_course import CategoricalNoise, FixedNoise, RegressionTasks, UniformNoise, context_gram
from icl_course.data import StretchedTasks
from icl_course.evaluate import expected_loss
from icl_course.linalg import symmetric_eigh


def test_tokens_hold_context_then_query(float64_tasks):
    batch = float64_tasks(d=3, n=5).sample(7, seed=0)
    tokens = batch.tokens
    assert tokens.shape == (7, 6, 4)
    assert torch.equal(tokens[:, :5, :3], batch.X)
    assert torch.equal(tokens[:, :5, 3], batch.y)
    assert torch.equal(tokens[:, 5, :3], batch.x_t)
    assert torch.all(tokens[:, 5, 3] == 0)


def test_noiseless_labels_are_linear_and_query_target_has_no_noise(float64_tasks):
    batch = float64_tasks(noise=0.0).sample(50, seed=1)
    assert torch.allclose(batch.y, torch.einsum("bnd,bd->bn", batch.X, batch.w), atol=1e-12)
    assert torch.allclose(batch.y_t, (batch.x_t * batch.w).sum(-1), atol=1e-12)


def test_label_noise_has_the_requested_variance(float64_tasks):
    batch = float64_tasks(d=3, n=20, noise=2.0).sample(20_000, seed=2)
    residuals = batch.y - torch.einsum("bnd,bd->bn", batch.X, batch.w)
    variance = residuals.var().item()
    standard_error = 4.0 * (2 / residuals.numel()) ** 0.5
    assert abs(variance - 4.0) < 4 * standard_error
    assert torch.all(batch.sigma == 2.0)


def test_gram_blocks_are_sigma_alpha_and_label_energy(float64_tasks):
    batch = float64_tasks().sample(6, seed=3)
    gram, d = batch.gram, batch.d
    assert torch.allclose(gram[:, :d, :d], batch.Sigma)
    assert torch.allclose(gram[:, :d, d], batch.alpha)
    assert torch.allclose(gram[:, d, d], batch.label_energy)
    assert torch.allclose(context_gram(batch.X, batch.y), gram)


def test_seeds_reproduce_tasks_and_dtypes_agree():
    float32 = RegressionTasks(5, 8, UniformNoise(2), device="cpu")
    float64 = RegressionTasks(5, 8, UniformNoise(2), dtype=torch.float64, device="cpu")
    first, again, other = float32.sample(10, seed=4), float32.sample(10, seed=4), float32.sample(10, seed=5)
    assert torch.equal(first.X, again.X) and torch.equal(first.y, again.y)
    assert not torch.allclose(first.X, other.X)
    assert torch.allclose(float64.sample(10, seed=4).y.float(), first.y)


def test_a_generator_advances_between_batches():
    tasks = RegressionTasks(2, 3, device="cpu")
    generator = torch.Generator().manual_seed(0)
    assert not torch.equal(tasks.sample(4, generator).X, tasks.sample(4, generator).X)


@pytest.mark.parametrize("noise, second_moment", [
    (FixedNoise(1.5), 2.25), (UniformNoise(3), 3.0), (CategoricalNoise([1, 3]), 5.0),
])
def test_noise_laws_match_their_second_moment(noise, second_moment):
    levels = noise.sample(200_000, torch.Generator().manual_seed(0))
    assert noise.second_moment == pytest.approx(second_moment)
    assert (levels**2).mean().item() == pytest.approx(second_moment, rel=0.02)
    assert levels.min() >= 0 and levels.max() <= noise.largest


def test_categorical_noise_draws_only_its_levels_equally_often():
    levels = CategoricalNoise([1, 3, 5]).sample(30_000, torch.Generator().manual_seed(1))
    counts = torch.stack([(levels == value).sum() for value in (1.0, 3.0, 5.0)])
    assert counts.sum() == 30_000
    assert torch.all((counts - 10_000).abs() < 400)


def test_covariances_shape_inputs_and_weights():
    S = torch.tensor([[2.0, 0.5, 0.0], [0.5, 1.0, 0.2], [0.0, 0.2, 0.5]], dtype=torch.float64)
    tasks = RegressionTasks(3, 10, covariance=S, weight_covariance=torch.linalg.inv(S),
                            dtype=torch.float64, device="cpu")
    batch = tasks.sample(40_000, seed=6)
    inputs = batch.X.reshape(-1, 3)
    assert torch.allclose(inputs.T @ inputs / inputs.shape[0], S, atol=0.03)
    assert torch.allclose(batch.w.T @ batch.w / batch.num_tasks, torch.linalg.inv(S), atol=0.1)
    assert torch.equal(batch.covariance, S)


def test_batches_slice_and_move():
    batch = RegressionTasks(2, 3, device="cpu").sample(10, seed=0)
    assert batch[:4].num_tasks == 4 and torch.equal(batch[:4].w, batch.w[:4])
    assert batch.to(dtype=torch.float64).X.dtype == torch.float64


@pytest.mark.parametrize("make, message", [
    (lambda: RegressionTasks(0, 5), "d must be a positive integer"),
    (lambda: RegressionTasks(3, -1), "n must be a positive integer"),
    (lambda: RegressionTasks(2, 5, noise=-1.0), "sigma must be a finite number >= 0"),
    (lambda: RegressionTasks(2, 5, noise="loud"), "noise must be a number"),
    (lambda: RegressionTasks(2, 5, covariance=torch.eye(3)), r"covariance must have shape \(2, 2\)"),
    (lambda: RegressionTasks(2, 5, covariance=torch.tensor([[1.0, 2.0], [2.0, 1.0]])), "positive definite"),
    (lambda: RegressionTasks(2, 5, covariance=torch.tensor([[1.0, 0.5], [0.0, 1.0]])), "symmetric"),
    (lambda: CategoricalNoise([]), "at least one noise level"),
    (lambda: UniformNoise(float("nan")), "finite"),
    (lambda: RegressionTasks(2, 5, dtype=torch.float16), "dtype"),
    (lambda: RegressionTasks(2, 5, device="gpu0"), "not a device"),
    (lambda: RegressionTasks(2, 5).sample(0), "num_tasks must be a positive integer"),
    (lambda: StretchedTasks(2, 5, scales=(0.5, 1.0)), "positive factors other than 1"),
    (lambda: StretchedTasks(2, 5, fraction=1.0), "strictly between 0 and 1"),
    (lambda: StretchedTasks(2, 5, largest_eigenvalue_cap=0), "largest_eigenvalue_cap must be a positive number"),
])
def test_bad_arguments_say_what_is_wrong(make, message):
    with pytest.raises((ValueError, TypeError), match=message):
        make()


def test_stretched_tasks_meet_the_rare_spectra_often_and_weigh_them_back_without_bias():
    d, n = 10, 20
    stretched = StretchedTasks(d, n, noise=0.0, dtype=torch.float64).sample(100_000, seed=3)
    plain = RegressionTasks(d, n, noise=0.0, dtype=torch.float64).sample(100_000, seed=4)
    weight = stretched.importance_weight
    assert 0 < weight.min() and weight.max() <= 1 / (1 - 0.5)          # the defensive mixture's bound
    # the weighted mean of a per-task value is its mean under the plain law: the weights themselves (exactly 1 in
    # expectation) and the largest eigenvalue of Sigma, within four standard errors of the two estimates
    spread = weight.std() / 100_000 ** 0.5
    assert abs(weight.mean() - 1) < 4 * spread
    largest = {name: symmetric_eigh(batch.Sigma, eigenvectors=False)[:, -1]
               for name, batch in (("q", stretched), ("p", plain))}
    weighted, direct = largest["q"] * weight, largest["p"]
    assert abs(weighted.mean() - direct.mean()) < 4 * (weighted.var() / 1e5 + direct.var() / 1e5) ** 0.5
    # ... while tasks beyond the plain law's 1e-5 quantile of the largest eigenvalue (about 92) are common
    assert (largest["p"] > 92).float().mean() < 1e-4 < 0.05 < (largest["q"] > 92).float().mean()
    # the same tasks under a cap: those above it weigh nothing, the others as before
    capped = StretchedTasks(d, n, noise=0.0, largest_eigenvalue_cap=80.0, dtype=torch.float64).sample(100_000, seed=3)
    assert torch.equal(capped.X, stretched.X)
    assert torch.equal(capped.importance_weight, torch.where(largest["q"] <= 80.0, weight, 0.0))
    # the estimates of icl_course.evaluate weigh every task: a predictor off by |X e_1| / sqrt(n) along e_1 has the
    # loss |X e_1|^2 / (2 n), whose mean is 1/2 under the plain law and about 0.54 unweighted under the stretched one
    def off(batch):
        return batch.w + torch.nn.functional.one_hot(torch.tensor(0), d) * batch.X[:, :, :1].norm(dim=1) / n ** 0.5

    tasks = StretchedTasks(d, n, dtype=torch.float64)
    estimate = expected_loss(off, tasks, num_tasks=50_000, chunk_size=10_000, seed=5)
    assert abs(estimate.mean - 0.5) < 4 * estimate.stderr
    batch = tasks.sample(50_000, seed=6)
    assert (batch.X[:, :, 0] ** 2).sum(1).mean() / (2 * n) > 0.5 + 10 * estimate.stderr
    assert stretched[:5].importance_weight.shape == (5,) and stretched.to(dtype=torch.float32).importance_weight.dtype \
        == torch.float32


def test_stretched_tasks_with_covariances_stretch_the_standard_draws_and_keep_the_law():
    """With ``covariance`` and ``weight_covariance`` the stretch acts on the standard draws ``z`` of ``x = L z``:
    the same weights as without, the inputs mapped by ``L``, and weighted means those of the plain law."""
    d, n = 5, 20
    S = torch.diag(torch.tensor([4.0, 2.0, 1.0, 0.5, 0.25], dtype=torch.float64))
    rotation, _ = torch.linalg.qr(torch.randn(d, d, generator=torch.Generator().manual_seed(0), dtype=torch.float64))
    S = rotation @ S @ rotation.T
    W = torch.linalg.inv(S)
    standard = StretchedTasks(d, n, dtype=torch.float64).sample(100_000, seed=3)
    tasks = StretchedTasks(d, n, covariance=S, weight_covariance=W, dtype=torch.float64)
    stretched = tasks.sample(100_000, seed=3)
    L, C = torch.linalg.cholesky(S), torch.linalg.cholesky(W)
    assert torch.equal(stretched.importance_weight, standard.importance_weight)
    assert torch.allclose(stretched.X, standard.X @ L.T) and torch.allclose(stretched.w, standard.w @ C.T)
    assert torch.allclose(stretched.y, (stretched.X @ stretched.w.unsqueeze(-1)).squeeze(-1))
    assert torch.equal(stretched.covariance, S) and "covariance=S" in repr(tasks)
    plain = RegressionTasks(d, n, covariance=S, weight_covariance=W, dtype=torch.float64).sample(100_000, seed=4)
    largest = {name: symmetric_eigh(batch.Sigma, eigenvectors=False)[:, -1]
               for name, batch in (("q", stretched), ("p", plain))}
    weighted, direct = largest["q"] * stretched.importance_weight, largest["p"]
    assert abs(weighted.mean() - direct.mean()) < 4 * (weighted.var() / 1e5 + direct.var() / 1e5) ** 0.5
    assert largest["q"].mean() > direct.mean() + 10 * (direct.var() / 1e5) ** 0.5   # unweighted, it is another law
