"""Regression pins that used to sit in the chapters' cells: properties of the package the chapters rely on,
checked here so that each chapter keeps one visible check per claim of its prose."""

import torch

from icl_course import RegressionTasks, per_layer_loss, query_averaged_loss
from icl_course.shipped import load_pretrained


def test_chapter_3_the_evaluator_draws_the_stream_a_chapter_draws_by_hand():
    """Chapter 3 scores the shipped 3-layer model on tasks it samples from a seeded generator, in slices;
    ``per_layer_loss`` with that seed must see the very same tasks (its first chunk equals the hand-made one)."""
    trained, _ = load_pretrained("ch1_full_3_layers", device="cpu")
    trained = trained.double()
    tasks = RegressionTasks(10, 20, dtype=torch.float64)
    generator = torch.Generator().manual_seed(2024)
    with torch.no_grad():
        batch = tasks.sample(20_000, generator)
        by_hand = torch.cat([query_averaged_loss(trained(batch[start:start + 5_000]).layer_weights,
                                                 batch[start:start + 5_000]) for start in range(0, 20_000, 5_000)])
    estimates = per_layer_loss(trained, tasks, num_tasks=20_000, chunk_size=20_000, seed=2024)
    assert len(estimates) == 3
    for layer, estimate in enumerate(estimates):
        assert abs(estimate.mean - by_hand[:, layer].mean().item()) < 1e-9 * estimate.mean
    # and another seed draws other tasks
    other = per_layer_loss(trained, tasks, num_tasks=20_000, chunk_size=20_000, seed=2025)
    assert abs(other[0].mean - estimates[0].mean) > 1e-6 * estimates[0].mean


def test_chapter_3_the_best_linear_cosine_with_a_square_at_the_chapters_sample_sizes():
    """Chapter 3, section 3: the best cosine of linear labels with ``x(1)^2`` on the chapter's own samples
    (200 tasks, d = 10, seeded by n): about 0.75 at n = 20 and about 0.11 at n = 1000 (the chapter checks the
    claim itself, the ``sqrt(d/n)`` decay)."""
    from icl_course import theory

    cosines = {}
    for length in (20, 1000):
        sample = RegressionTasks(10, length, dtype=torch.float64).sample(200, seed=length)
        cosines[length] = theory.best_linear_cosine(sample.X, sample.X[..., 0] ** 2).mean().item()
    assert abs(cosines[20] - 0.75) < 0.03 and 0.09 < cosines[1000] < 0.13
