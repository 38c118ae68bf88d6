import pytest
import torch

from icl_course import (
    Estimate,
    RegressionTasks,
    UniformNoise,
    adjusted_loss,
    expected_loss,
    gd_construction,
    gradient_descent,
    least_squares,
    noise_profile,
    oracle_ridge,
    per_layer_loss,
    query_averaged_loss,
    sampled_query_loss,
    theory,
)


def zero_predictor(batch):
    return torch.zeros_like(batch.w)


def test_query_averaged_loss_is_the_mean_of_sampled_query_losses(float64_tasks):
    S = torch.tensor([[1.5, 0.3], [0.3, 0.5]], dtype=torch.float64)
    for covariance in (None, S):
        batch = float64_tasks(d=2, n=6, covariance=covariance).sample(200_000, seed=0)
        weights = least_squares(batch.X, batch.y)
        sampled = sampled_query_loss((weights * batch.x_t).sum(-1), batch)
        exact = query_averaged_loss(weights, batch)
        difference = sampled - exact
        assert abs(difference.mean()) < 4 * difference.std() / len(difference) ** 0.5
        assert exact.var() < sampled.var()  # the point of averaging the query out


def test_expected_loss_of_predicting_zero_is_half_the_dimension():
    # 1/2 ||w||^2 with w ~ N(0, I_d): mean d/2, variance d/2
    tasks = RegressionTasks(6, 4, device="cpu")
    estimate = expected_loss(zero_predictor, tasks, num_tasks=40_000, chunk_size=15_000)
    assert abs(estimate.mean - 3.0) < 4 * estimate.stderr
    assert estimate.stderr == pytest.approx((3.0 / 40_000) ** 0.5, rel=0.05)
    assert estimate.num_tasks == 40_000


def test_adjusted_loss_of_the_oracle_is_zero_and_of_others_positive():
    tasks = RegressionTasks(4, 10, UniformNoise(2), dtype=torch.float64, device="cpu")
    assert adjusted_loss(oracle_ridge, tasks, num_tasks=1000).mean == 0.0
    estimate = adjusted_loss(least_squares, tasks, num_tasks=20_000)
    assert estimate.mean > 4 * estimate.stderr


def test_per_layer_loss_follows_gradient_descent():
    tasks = RegressionTasks(3, 12, 0.0, dtype=torch.float64, device="cpu")
    model = gd_construction(3, 12, 0.5, num_layers=4)
    layers = per_layer_loss(model, tasks, num_tasks=5000)
    expected = [expected_loss(lambda b, k=k: gradient_descent(b.X, b.y, 0.5, 4)[:, k], tasks, num_tasks=5000)
                for k in range(1, 5)]
    for measured, reference in zip(layers, expected):
        assert measured.mean == pytest.approx(reference.mean, rel=1e-9)
    assert all(a.mean > b.mean for a, b in zip(layers, layers[1:]))


def test_noise_profile_of_least_squares_grows_from_zero():
    tasks = RegressionTasks(3, 12, UniformNoise(2), dtype=torch.float64, device="cpu")
    profile = noise_profile(least_squares, tasks, [0.0, 1.0, 2.0], num_tasks=5000)
    assert abs(profile[0].mean) < 1e-12
    assert 0 < profile[1].mean < profile[2].mean


def test_one_step_closed_form_matches_monte_carlo():
    noise = UniformNoise(3)
    tasks = RegressionTasks(5, 12, noise, dtype=torch.float64, device="cpu")
    best = theory.optimal_one_step_coefficient(5, 12, noise)
    assert best == pytest.approx(1 / (12 + 5 + 1 + 3))
    for coefficient in (best, 0.5 * best, 1.5 * best):
        estimate = expected_loss(lambda b: coefficient * b.alpha, tasks, num_tasks=60_000)
        closed_form = theory.one_step_loss(5, 12, noise, coefficient)
        assert abs(estimate.mean - closed_form) < 4 * estimate.stderr
        if coefficient != best:
            assert closed_form > theory.one_step_loss(5, 12, noise)


def test_estimate_formats_with_its_error():
    assert str(Estimate(0.12345, 0.0012, 10)) == "0.1235 ± 0.0012"
    assert f"{Estimate(0.12345, 0.0012, 10):.3f}" == "0.123 ± 0.001"


def test_too_few_tasks_for_a_standard_error():
    with pytest.raises(ValueError, match="at least 2"):
        expected_loss(zero_predictor, RegressionTasks(2, 3, device="cpu"), num_tasks=1)
    batch = RegressionTasks(2, 3, device="cpu").sample(4)
    with pytest.raises(ValueError, match="do not fit"):
        query_averaged_loss(torch.zeros(4, 3), batch)


def test_loss_difference_is_paired():
    from icl_course import loss_difference
    tasks = RegressionTasks(4, 10, 0.5, dtype=torch.float64, device="cpu")
    same = loss_difference(oracle_ridge, oracle_ridge, tasks, num_tasks=1000)
    assert same.mean == 0.0 and same.stderr == 0.0
    gap = loss_difference(least_squares, oracle_ridge, tasks, num_tasks=20_000)
    separate = expected_loss(least_squares, tasks, num_tasks=20_000)
    assert 0 < gap.mean and gap.stderr < separate.stderr


def test_deep_models_are_evaluated_on_a_million_tasks_by_default():
    from icl_course import LinearTransformer
    from icl_course.evaluate import default_num_tasks
    shallow = LinearTransformer(3, num_layers=2, parameterization="diag", seed=0, device="cpu")
    deep = LinearTransformer(3, num_layers=3, parameterization="diag", seed=0, device="cpu")
    assert default_num_tasks(zero_predictor) == default_num_tasks(shallow) == 100_000
    assert default_num_tasks(deep) == default_num_tasks(zero_predictor, deep) == 1_000_000
    tasks = RegressionTasks(3, 6, 0.5, device="cpu")
    assert expected_loss(zero_predictor, tasks, chunk_size=50_000).num_tasks == 100_000
    assert adjusted_loss(deep, tasks, chunk_size=250_000).num_tasks == 1_000_000
    with pytest.raises(ValueError, match="at least 2"):
        expected_loss(zero_predictor, tasks, num_tasks=0)


def test_estimate_from_samples_is_the_mean_and_its_standard_error():
    values = torch.tensor([1.0, 2.0, 3.0, 6.0], dtype=torch.float64)
    estimate = Estimate.from_samples(values)
    assert estimate.mean == 3.0 and estimate.num_tasks == 4
    assert estimate.stderr == pytest.approx(float(values.std()) / 2)
    with pytest.raises(ValueError, match="at least 2"):
        Estimate.from_samples([1.0])


def test_mean_and_stderr_is_the_estimate_of_every_entry():
    from icl_course.evaluate import mean_and_stderr

    samples = torch.randn(500, 3, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(0)) ** 3
    mean, stderr = mean_and_stderr(samples)
    assert mean.shape == stderr.shape == (3, 2)
    for i in range(3):
        for j in range(2):
            estimate = Estimate.from_samples(samples[:, i, j])
            # equal up to the order of the sums (a strided reduction rounds differently in the last bit)
            assert estimate.mean == pytest.approx(mean[i, j].item(), rel=1e-12)
            assert estimate.stderr == pytest.approx(stderr[i, j].item(), rel=1e-12)
    with pytest.raises(ValueError, match="at least 2 samples"):
        mean_and_stderr(samples[:1])


def test_the_trimmed_mean_leaves_out_the_worst_hundredth_of_a_percent_chunk_by_chunk():
    from icl_course.evaluate import _monte_carlo, trimmed_count

    assert trimmed_count(1_000_000) == 100 and trimmed_count(20_000) == 2 and trimmed_count(50) == 1
    seen = []

    def per_task(batch):   # a light-tailed column and a heavy-tailed one (cubes of the label energy)
        energy = (batch.y.double() ** 2).mean(-1)
        seen.append(energy)
        return torch.stack([energy, energy**4], dim=-1)
    light, heavy = _monte_carlo(per_task, RegressionTasks(3, 5, UniformNoise(1)), 25_000, 7_000, seed=1)
    energy = torch.cat(seen)
    for estimate, values in ((light, energy), (heavy, energy**4)):
        worst = values.sort().values[-2:]          # 25 000 tasks: the 2 worst
        assert estimate.trimmed_mean == pytest.approx(float((values.sum() - worst.sum()) / (25_000 - 2)), rel=1e-9)
        assert estimate.trimmed_mean == pytest.approx(Estimate.from_samples(values).trimmed_mean, rel=1e-9)
        # its error: the kept tasks' standard deviation over the root of their count, chunked or not
        kept = values.sort().values[:-2]
        assert estimate.trimmed_stderr == pytest.approx(float(kept.std() / (25_000 - 2) ** 0.5), rel=1e-6)
        assert estimate.trimmed_stderr == pytest.approx(Estimate.from_samples(values).trimmed_stderr, rel=1e-6)
    assert light.trimmed_stderr < light.stderr and heavy.trimmed_stderr < 0.7 * heavy.stderr   # the tail left out
    assert not light.heavy_tailed() and heavy.heavy_tailed()
    # ten tasks in a hundred thousand carrying 6% of the mean: a standard error under 2% of the mean, yet a tail
    values = torch.ones(100_000, dtype=torch.float64)
    values[:10] = 601.0
    tail = Estimate.from_samples(values)
    assert tail.stderr < 0.02 * tail.mean and tail.trimmed_mean == pytest.approx(1.0) and tail.heavy_tailed()
    assert Estimate(float("nan"), 0.0, 10).heavy_tailed() and not Estimate(1.0, 0.01, 10).heavy_tailed()
    # one task at 1e22 among ones (a 5-layer Table 1 model had such a task): the trimmed mean is still the ones'
    # mean, not the total minus the worst, which rounds to 0 (the shipped run once recorded 0.0 for that cell)
    values = torch.ones(20_000, dtype=torch.float64)
    values[12_345] = 1e22
    assert Estimate.from_samples(values).trimmed_mean == 1.0
    served = []

    def in_order(batch):   # the same values, chunk by chunk (the large one is in the second of three chunks)
        start = sum(served)
        served.append(batch.y.shape[0])
        return values[start:start + batch.y.shape[0]]
    (chunked,) = _monte_carlo(in_order, RegressionTasks(3, 5), 20_000, 7_000, seed=0)
    assert chunked.trimmed_mean == 1.0 and chunked.mean > 1e17 and served == [7_000, 7_000, 6_000]
    assert chunked.trimmed_stderr == 0.0 and Estimate.from_samples(values).trimmed_stderr == 0.0   # all ones kept


def test_paired_adjusted_losses_are_the_losses_and_their_differences_on_the_same_tasks():
    from icl_course.baselines import TunedRR
    from icl_course.evaluate import adjusted_losses, loss_difference, paired_adjusted_losses
    from icl_course.models import LinearTransformer, widen

    sampler = RegressionTasks(10, 20, 1.0, dtype=torch.float64, device="cpu")
    gdpp = LinearTransformer(10, 2, parameterization="gdpp", init_scale=0.05, seed=3, dtype=torch.float64,
                             device="cpu")
    predictors = {"gdpp": gdpp, "full": widen(gdpp, "full"), "tuned": TunedRR().fit(sampler.sample(500, seed=1))}
    losses, differences = paired_adjusted_losses(predictors, sampler, "gdpp", num_tasks=3000, chunk_size=1000,
                                                 seed=5)
    alone = adjusted_losses(predictors, sampler, num_tasks=3000, chunk_size=1000, seed=5)
    assert {name: (score.mean, score.stderr) for name, score in losses.items()} == \
        {name: (score.mean, score.stderr) for name, score in alone.items()}
    assert set(differences) == {"full", "tuned"}
    # the same function widened: a difference of rounding only
    assert abs(differences["full"].mean) < 1e-12 * losses["gdpp"].mean and differences["full"].stderr < 1e-12
    paired = loss_difference(predictors["tuned"], gdpp, sampler, num_tasks=3000, chunk_size=1000, seed=5)
    assert differences["tuned"].mean == pytest.approx(paired.mean, rel=1e-9)
    assert differences["tuned"].mean == pytest.approx(losses["tuned"].mean - losses["gdpp"].mean, rel=1e-9)
    assert differences["tuned"].stderr == pytest.approx(paired.stderr, rel=1e-6)
    with pytest.raises(ValueError, match="reference 'diag' is not one of the predictors"):
        paired_adjusted_losses(predictors, sampler, "diag", num_tasks=10)


def test_paired_losses_are_plain_losses_and_their_paired_differences():
    import copy

    from icl_course.evaluate import expected_loss, paired_losses
    from icl_course.models import LinearTransformer

    sampler = RegressionTasks(5, 20, 0.5, dtype=torch.float64, device="cpu")
    model = LinearTransformer(5, 2, parameterization="gdpp", init_scale=0.05, seed=3, dtype=torch.float64,
                              device="cpu")
    nudged = copy.deepcopy(model)
    with torch.no_grad():
        for parameter in nudged.parameters():
            parameter.mul_(1.02)
    predictors = {"model": model, "nudged": nudged}
    losses, differences = paired_losses(predictors, sampler, "model", num_tasks=3000, chunk_size=1000, seed=5)
    for name, predictor in predictors.items():   # no oracle taken off: each is the plain expected loss
        alone = expected_loss(predictor, sampler, num_tasks=3000, chunk_size=1000, seed=5)
        assert losses[name].mean == pytest.approx(alone.mean, rel=1e-12)
        assert losses[name].stderr == pytest.approx(alone.stderr, rel=1e-9)
    assert set(differences) == {"nudged"}
    assert differences["nudged"].mean == pytest.approx(losses["nudged"].mean - losses["model"].mean, rel=1e-9)
    # two predictors that err on the same tasks: the difference's error is far below either loss's
    assert differences["nudged"].stderr < 0.2 * losses["nudged"].stderr
    adjusted, _ = paired_losses(predictors, sampler, None, num_tasks=3000, chunk_size=1000, seed=5, adjusted=True)
    assert all(adjusted[name].mean < losses[name].mean for name in predictors)     # the oracle's loss taken off
    with pytest.raises(ValueError, match="reference 'other' is not one of the predictors"):
        paired_losses(predictors, sampler, "other", num_tasks=10)
    # further pairs come from the same pass: the same numbers as a call with that pair's base as the reference
    _, with_pairs = paired_losses(predictors, sampler, None, num_tasks=3000, chunk_size=1000, seed=5,
                                  pairs=[("model", "nudged")])
    _, alone = paired_losses(predictors, sampler, "nudged", num_tasks=3000, chunk_size=1000, seed=5)
    assert set(with_pairs) == {"model - nudged"}
    assert with_pairs["model - nudged"].mean == pytest.approx(alone["model"].mean, rel=1e-12)
    assert with_pairs["model - nudged"].stderr == pytest.approx(alone["model"].stderr, rel=1e-9)
    assert with_pairs["model - nudged"].mean == pytest.approx(-differences["nudged"].mean, rel=1e-9)
    with pytest.raises(ValueError, match=r"each of pairs is \(name, base\)"):
        paired_losses(predictors, sampler, "model", num_tasks=10, pairs=[("model", "other")])
    for malformed in (3, "ab", ("model",)):   # not a pair at all: the same message, not a TypeError from tuple()
        with pytest.raises(ValueError, match=r"each of pairs is \(name, base\)"):
            paired_losses(predictors, sampler, "model", num_tasks=10, pairs=[malformed])
