"""Chapter 5's numbers, pinned on the shipped results (icl_course/pretrained/ch5_memformers.pt).

The chapter checks each claim of its prose once; these tests pin the numbers behind them more tightly, so a
retrained file that moves them is noticed.  Bands: a family's seeds and a baseline, each mean with 4 standard
errors (``memformer.loss_band``)."""

import pytest
import torch

from icl_course import memformer

PAPER_DEPTHS = 4   # the depths of the paper's figures; from 5 layers on CG is exact
PRECONDITIONED = ("linear transformer", "CGD-like + A_l", "LFOM (tied gates)", "LFOM (per-layer gates)")


@pytest.fixture(scope="module")
def results():
    return memformer.load_experiments()


def band(results, setting, name):
    return memformer.loss_band(results, setting, name)


def test_every_one_layer_model_sits_on_its_closed_form_optimum(results):
    for setting in memformer.SETTINGS:
        for family in memformer.MODELS:
            run = results["models"][setting][family][1]
            best = memformer.one_layer_optimum(setting, family)
            assert ((run["mean"][:, 0] - best).abs() < 4 * run["stderr"][:, 0]).all(), (setting, family)


def test_families_with_a_preconditioner_lose_the_same_on_rotated_and_isotropic_data(results):
    # x -> U D z, w -> U D^-1 z' maps one setting onto the other for every model with a full A_l, so their
    # optima agree: trained models that agree have found them (the scalar family has no such map)
    for family in PRECONDITIONED:
        rotated, isotropic = (memformer.final_losses(results, s, family)[0].mean(0) for s in memformer.SETTINGS)
        shift = (rotated / isotropic).tolist()
        for depth, ratio in zip(results["recipe"]["depths"], shift):   # 6 layers too, after 8 000 stretched steps
            assert abs(ratio - 1) < 0.05, (family, depth, ratio)


def test_seeds_agree_and_training_curves_are_flat(results):
    for setting in memformer.SETTINGS:
        for family in memformer.MODELS:
            means, errors = memformer.final_losses(results, setting, family)
            assert (means.max(0).values / means.min(0).values < 1.05).all(), (setting, family)
            for depth, run in results["models"][setting][family].items():
                late = (run["curve"][:, -6] - run["curve"][:, -1]) / run["curve"][:, -1]
                assert depth > PAPER_DEPTHS or (late.abs() < 0.15).all(), (setting, family, depth)


def test_trained_models_are_no_worse_than_the_tuned_gd_they_contain(results):
    for setting in memformer.SETTINGS:
        gd_low, gd_high = band(results, setting, "GD (tuned steps)")
        for family in memformer.MODELS:
            low, high = band(results, setting, family)
            assert (low < gd_high).all(), (setting, family)


def test_the_pinned_numbers(results):
    def mean(setting, name):
        low, high = memformer.loss_band(results, setting, name, width=0)
        return ((low + high) / 2)[:PAPER_DEPTHS]

    torch.testing.assert_close(mean("rotated", "CG"), torch.tensor([0.99, 0.578, 0.272, 0.100], dtype=torch.float64),
                               rtol=0.02, atol=0)
    torch.testing.assert_close(mean("rotated", "CGD-like + A_l"),
                               torch.tensor([0.577, 0.180, 0.067, 0.028], dtype=torch.float64), rtol=0.05, atol=0)
    torch.testing.assert_close(mean("rotated", "CGD-like (scalars)"),
                               torch.tensor([1.12, 0.779, 0.582, 0.432], dtype=torch.float64), rtol=0.05, atol=0)
    torch.testing.assert_close(mean("isotropic", "CG"),
                               torch.tensor([0.455, 0.0844, 0.0117, 0.00085], dtype=torch.float64), rtol=0.03, atol=0)


def test_cg_is_exact_from_d_steps_on_and_no_trained_model_is(results):
    """Section 7 at 5 and 6 layers: CG has run d = 5 steps, its loss is rounding; the trained models are far above.
    Those depths trained 8 000 steps on stretched tasks and were scored on them, with standard errors of a few
    percent (section 6); the baselines of as many steps, tuned on 200 000 stretched tasks, match the models that
    contain them."""
    assert results["recipe"]["depths"] == (1, 2, 3, 4, 5, 6)
    for setting in memformer.SETTINGS:
        assert results["baselines"][setting]["CG"]["mean"][4:].max() < 1e-20
        for family in memformer.MODELS:
            assert memformer.final_losses(results, setting, family)[0][:, 4:].min() > 1e-3, (setting, family)
    for setting in memformer.SETTINGS:
        for family in memformer.MODELS:
            for depth, run in results["models"][setting][family].items():
                # (a run from before the recipe had stretched depths has neither key: plain, 2 000 steps)
                assert run.get("stretched", False) == (depth >= 5), (setting, family, depth)
                assert run.get("num_steps", 2000) == (8000 if depth >= 5 else 2000), (setting, family, depth)
            means, errors = memformer.final_losses(results, setting, family)
            assert (errors[:, 4:] < 0.03 * means[:, 4:]).all(), (setting, family)
    # tuned GD holds the best polynomial of 5 and 6 steps in Sigma, which the scalar CGD-like model computes too:
    # tuned on enough stretched tasks, the two end level (tuned on 10 000, GD was 4-11% above on isotropic data)
    for setting in memformer.SETTINGS:
        gd = results["baselines"][setting]["GD (tuned steps)"]
        scalar = memformer.final_losses(results, setting, "CGD-like (scalars)")[0].mean(0)
        assert ((scalar[4:] / gd["mean"][4:] - 1).abs() < 0.03).all(), setting
    torch.testing.assert_close(results["baselines"]["isotropic"]["GD (tuned steps)"]["mean"][4:],
                               torch.tensor([0.01246, 0.00595], dtype=torch.float64), rtol=0.03, atol=0)


def test_models_with_every_entry_of_p_and_q_trained(results):
    """Sections 9 and 10: 12 000 steps (and 1 500, 3 000, 6 000 as the convergence check; the CGD-like models also
    24 000 at 3-4 layers and 48 000 at 4, with 5 heads at 3 layers 48 000 and 96 000; the LFOM 24 000 at 4 layers); one
    layer on the GD form's
    closed form; the quasi-Newton LFOM far below the GD-form one at 2-3 layers, and at 4 trained and scored on
    stretched tasks; 1 and 5 heads level at 1-2 layers; at 3 layers one head converged and 5 heads, four times as
    long, 1-5% below it.  The CGD-like models have not converged at 4 layers (nor 5 heads at 3), so a retrained file
    may move those means: their bands are wide."""
    assert results["full_attention_steps"] == 12_000
    assert sorted(results["full_attention_lengths"]) == [1500, 3000, 6000, 24000, 48000, 96000]
    assert set(results["full_attention_lengths"][24000]) == {"heads", "quasi_newton"}
    assert all(sorted(runs) == [3, 4] for runs in results["full_attention_lengths"][24000]["heads"].values())
    assert all(sorted(runs) == [4] for runs in results["full_attention_lengths"][24000]["quasi_newton"].values())
    assert {key: sorted(runs) for key, runs in results["full_attention_lengths"][48000]["heads"].items()} == \
        {1: [4], 5: [3, 4]}
    assert {key: sorted(runs) for key, runs in results["full_attention_lengths"][96000]["heads"].items()} == {5: [3]}
    with pytest.raises(KeyError, match=r"choose one of \[1, 5\]"):
        memformer.training_lengths(results, "heads", 3)
    assert all(sorted(results[part][key]) == list(memformer.FULL_ATTENTION_DEPTHS)
               for part, keys in (("heads", (1, 5)), ("quasi_newton", memformer.SETTINGS)) for key in keys)
    best = memformer.one_layer_optimum("rotated", "CGD-like + A_l")

    def means(runs):
        return memformer.run_losses(runs)[0]
    for part, keys in (("heads", (1, 5)), ("quasi_newton", memformer.SETTINGS)):
        for key in keys:
            one = results[part][key][1]
            assert ((one["mean"][:, 0] - best).abs() < 4 * one["stderr"][:, 0]).all(), (part, key)
            steps, by_length, errors = memformer.training_lengths(results, part, key)
            assert steps[:4] == [1500, 3000, 6000, 12000] and by_length.shape == errors.shape == (len(steps), 3, 4)
            assert torch.equal(by_length[3], means(results[part][key]))
            # converged at 1-2 layers: doubling the training from 6 000 steps moves no seed's loss by 3%
            assert ((by_length[3, :, :2] / by_length[2, :, :2] - 1).abs() < 0.03).all(), (part, key)
    for setting in memformer.SETTINGS:
        quasi = means(results["quasi_newton"][setting])
        gd_form = memformer.final_losses(results, setting, "LFOM (tied gates)")[0]
        cg = results["baselines"][setting]["CG"]["mean"][:4]
        assert (quasi.max(0).values[1:3] < 0.2 * gd_form.min(0).values[1:3]).all(), setting
        assert (quasi.max(0).values[1:3] < cg[1:3]).all(), setting
        torch.testing.assert_close(quasi.mean(0)[:3], torch.tensor([0.577, 0.028, 0.0017], dtype=torch.float64),
                                   rtol=0.1, atol=0)
    # the 4-layer quasi-Newton LFOM: trained and scored on stretched tasks, pinned within 3%; not converged (rotated
    # 2.4 times isotropic at 12 000 steps, level with it at 24 000; isotropic seeds parting ways), so a retrained file
    # may move these
    for setting, expected in (("rotated", 0.00179), ("isotropic", 0.00074)):
        four = results["quasi_newton"][setting][4]
        assert four["stretched"] and four["num_steps"] == 12_000, setting
        assert not any(results["quasi_newton"][setting][depth].get("stretched", False) for depth in (1, 2, 3))
        assert (four["stderr"][:, -1] < 0.03 * four["mean"][:, -1]).all(), setting
        torch.testing.assert_close(four["mean"][:, -1].mean(), torch.tensor(expected, dtype=torch.float64), rtol=0.15,
                                   atol=0)
    for setting, expected in (("rotated", 0.00105), ("isotropic", 0.00101)):   # 24 000 steps, seed means
        longer = results["full_attention_lengths"][24000]["quasi_newton"][setting][4]
        assert longer["stretched"] and longer["num_steps"] == 24_000, setting
        assert (longer["stderr"][:, -1] < 0.05 * longer["mean"][:, -1]).all(), setting
        torch.testing.assert_close(longer["mean"][:, -1].mean(), torch.tensor(expected, dtype=torch.float64),
                                   rtol=0.15, atol=0)
    steps, one_head, _, one_change = memformer.longest_training(results, "heads", 1)
    _, five_heads, _, five_change = memformer.longest_training(results, "heads", 5)
    assert steps == [12000, 12000, 24000, 48000] and memformer.longest_training(results, "heads", 5)[0] == \
        [12000, 12000, 96000, 48000]
    torch.testing.assert_close(one_head.mean(0), torch.tensor([0.577, 0.0280, 3.25e-4, 3.9e-6], dtype=torch.float64),
                               rtol=0.1, atol=0)
    torch.testing.assert_close(five_heads.mean(0), torch.tensor([0.577, 0.0277, 3.15e-4, 6.2e-6], dtype=torch.float64),
                               rtol=0.1, atol=0)
    # 3 layers: one head flat from 12 000 to 24 000 steps; 5 heads after 96 000 1-5% below it and still falling;
    # 4 layers: both falling
    assert one_change[:, 2].median().abs() < 0.03 and five_change[:, 2].median() < -0.04
    assert 0.95 < five_heads[:, 2].mean() / one_head[:, 2].mean() < 0.99
    assert (one_change[:, 3] < -0.3).all() and (five_change[:, 3] < -0.3).all()
    # the quasi-Newton reading of the 3-layer isotropic model: layers 1-2 move the inputs by (I - c_l Sigma_hat)
    model = memformer.load_full_attention_model(results, "quasi_newton", "isotropic", 3)
    P, Q = model.P.detach()[:, 0, :5, :5], model.Q.detach()[:, 0, :5, :5]
    c = [float(P[layer].trace() / 5 * -torch.linalg.eigvalsh((Q[layer] + Q[layer].T) / 2).mean()) for layer in (0, 1)]
    assert 0.7 < c[0] < 0.85 and 2.6 < c[1] < 3.2, c


def test_small_batch_fits_are_finished_and_stay_above_cg_at_ten_tasks(results):
    """Section 7's small-batch comparison: at B = 10 every fit has a vanishing gradient and no L-BFGS restart beats
    it, and it stays above CG on its own batch at every depth; at B = 1 it is at or below CG on its one task."""
    small = results["small_batch"]
    assert small[10]["gradient_norm"].max() < 1e-5
    assert (small[10]["batch"] <= small[10]["restarts_best"] * (1 + 1e-6)).all()
    assert (small[10]["batch"] > small[10]["cg_batch"]).all()
    torch.testing.assert_close((small[10]["batch"] / small[10]["cg_batch"]).mean(0)[:PAPER_DEPTHS],
                               torch.tensor([1.05, 1.53, 2.20, 3.84], dtype=torch.float64), rtol=0.02, atol=0)
    assert (small[1]["batch"] <= small[1]["cg_batch"])[:, :PAPER_DEPTHS].all()   # from d = 5 steps CG is exact
    assert (small[1]["batch"][:, :3] <= small[1]["restarts_best"][:, :3] * (1 + 1e-4)).all()   # finished to 3 layers
    assert (small[1]["restarts_best"][:, 3] < 0.8 * small[1]["batch"][:, 3]).any()              # not quite at 4


def test_the_comparison_figure_draws_cg_past_d_steps_on_the_lower_edge_with_its_value(results):
    """CG's 1e-26 after 5 steps would squash every other curve into a line: it is drawn on the panel's lower edge,
    as a downward triangle, with its value written beside it; the trained families keep their own scale."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from icl_course.plots import plot_memformer_comparison

    figure = plot_memformer_comparison(results)
    try:
        top_left = figure.axes[0]
        notes = [text.get_text() for text in top_left.texts]
        assert len(notes) == 2 and all(float(note) < 1e-20 for note in notes)
        bottom = top_left.get_ylim()[0]
        lowest_model = min(memformer.final_losses(results, "rotated", family)[0].mean(0).log10().min()
                           for family in memformer.MODELS)
        assert lowest_model - 1.5 < bottom < lowest_model      # the scale is the models', not CG's 1e-26
    finally:
        plt.close(figure)


def test_heads_at_equal_training(results):
    """Section 10, heads at equal training: the trained 1-head models and their two 5-head widenings trained 24 000
    more steps on the same batches, scored paired on the start's tasks.  Pins of the shipped run (a rerun of
    research/widened_heads.py should land near them): at 2 layers one head stays put and 5 heads end about 2% lower;
    at 3 layers 5 heads are within 0.5% of one head; at 4 layers one head still falls by well over half."""
    widened = results["widened_heads"]
    assert sorted(widened) == [2, 3, 4] and [widened[depth]["start_steps"] for depth in (2, 3, 4)] == \
        [12_000, 24_000, 48_000]
    assert all(widened[depth]["steps"] == 24_000 and widened[depth]["learning_rate"] == 0.005 for depth in widened)
    assert sorted(widened[2]["weights"]) == sorted(widened[3]["weights"]) == ["five", "one", "split"]
    torch.testing.assert_close(widened[2]["five"][:, 0], torch.tensor([0.02820, 0.02703, 0.02696],
                                                                       dtype=torch.float64), rtol=2e-3, atol=0)
    torch.testing.assert_close(widened[3]["one"][:, 0], torch.tensor([3.054e-4, 3.147e-4, 3.173e-4],
                                                                      dtype=torch.float64), rtol=2e-3, atol=0)
    for depth in widened:   # each paired difference is the difference of the two losses on the same tasks
        for name in [key for key in ("five", "split") if key in widened[depth]]:
            torch.testing.assert_close(widened[depth][f"{name} - one"][:, 0],
                                       widened[depth][name][:, 0] - widened[depth]["one"][:, 0], rtol=1e-6, atol=1e-12)
    relative = widened[2]["five - one"][:, 0] / widened[2]["one"][:, 0]
    assert (-0.025 < relative).all() and (relative < -0.019).all()
    assert (widened[3]["five - one"][:, 0].abs() < 0.005 * widened[3]["one"][:, 0]).all()
    assert (widened[4]["one - start"][:, 0] < -0.5 * widened[4]["start"][:, 0]).all()


def test_heads_at_four_layers_stage_after_stage(results):
    """Section 10, the later stages at 4 layers: one head and 5 heads trained 24 000 more steps five times at a peak
    rate of 0.005, then eight times at 0.0005, each stage from the last one's end, scored paired on the same million
    tasks per seed.  Pins of the shipped run: one head falls by 15-29%, 6-18%, up to 9%, +3% to -12%, 3.3-3.7%, then
    at the lower rate 5.9-7.8%, 0.9-4.2%, +0.6% to -2.2%, -0.3% to -1.6%, -0.2% to -0.6%, -0.7% to -1.5%, -0.4% to
    -1.0% and +0.04% to -0.9%; 5 heads end 2-10% above it after 192 000 steps; after 360 000 level in seed 0 and 12.8%
    and 2.7% above in seeds 1 and 2, after 384 000 -0.4%, 12.5% and 1.7% (-1.9% to +17% without the worst 100 tasks of
    the million)."""
    stages = {begin: stage for begin, stage in results["widened_heads_continued"][4].items()
              if not stage.get("whitened")}           # Adam in the given coordinates (the whitened stages: below)
    assert sorted(stages) == list(range(72_000, 360_001, 24_000))
    assert all(stage["steps"] == 24_000 and stage["learning_rate"] == (0.005 if begin < 192_000 else 0.0005)
               for begin, stage in stages.items())
    # each stage starts where the one before ended: the same models, scored on the same tasks, read the same
    torch.testing.assert_close(stages[72_000]["one (before)"], results["widened_heads"][4]["one"], rtol=1e-12, atol=0)
    for begin in sorted(stages)[1:]:
        for name in ("one", "five"):   # (mean, stderr); from the seventh stage each also has its trimmed mean
            earlier = stages[begin - 24_000][name]
            torch.testing.assert_close(stages[begin][f"{name} (before)"][:, :earlier.shape[1]], earlier, rtol=1e-12,
                                       atol=0)
            # and its curve goes on from the last point of the stage before
            torch.testing.assert_close(stages[begin]["curve"][name][:, 0], stages[begin - 24_000]["curve"][name][:, -1],
                                       rtol=1e-9, atol=0)
    torch.testing.assert_close(stages[96_000]["one"][:, 0], torch.tensor([7.449e-7, 8.340e-7, 9.000e-7],
                                                                          dtype=torch.float64), rtol=2e-3, atol=0)
    torch.testing.assert_close(stages[168_000]["one"][:, 0], torch.tensor([7.33e-7, 6.89e-7, 7.56e-7],
                                                                           dtype=torch.float64), rtol=5e-3, atol=0)
    torch.testing.assert_close(stages[240_000]["one"][:, 0], torch.tensor([6.577e-7, 6.126e-7, 6.936e-7],
                                                                           dtype=torch.float64), rtol=2e-3, atol=0)
    torch.testing.assert_close(stages[288_000]["one"][:, 0], torch.tensor([6.539e-7, 6.003e-7, 6.870e-7],
                                                                           dtype=torch.float64), rtol=2e-3, atol=0)
    torch.testing.assert_close(stages[336_000]["one"][:, 0], torch.tensor([6.379e-7, 5.908e-7, 6.768e-7],
                                                                           dtype=torch.float64), rtol=2e-3, atol=0)
    torch.testing.assert_close(stages[360_000]["one"][:, 0], torch.tensor([6.356e-7, 5.910e-7, 6.707e-7],
                                                                           dtype=torch.float64), rtol=2e-3, atol=0)
    for begin, low, high in ((72_000, -0.30, -0.14), (96_000, -0.18, -0.05), (120_000, -0.095, 0.0),
                             (144_000, -0.13, 0.035), (168_000, -0.038, -0.032), (192_000, -0.079, -0.058),
                             (216_000, -0.043, -0.0085), (240_000, -0.023, 0.007), (264_000, -0.017, -0.003),
                             (288_000, -0.007, -0.0015), (312_000, -0.016, -0.0065), (336_000, -0.01, -0.0035),
                             (360_000, -0.0095, 0.001)):
        fall = stages[begin]["one - one (before)"][:, 0] / stages[begin]["one (before)"][:, 0]
        assert (low < fall).all() and (fall < high).all()
    gap = stages[168_000]["five - one"][:, 0] / stages[168_000]["one"][:, 0]
    assert (0.02 < gap).all() and (gap < 0.1).all()
    gap = stages[240_000]["five - one"][:, 0] / stages[240_000]["one"][:, 0]
    assert (0.013 < gap).all() and (gap < 0.135).all()
    gap = stages[288_000]["five - one"][:, 0] / stages[288_000]["one"][:, 0]
    torch.testing.assert_close(gap, torch.tensor([-0.0023, 0.1254, 0.0304], dtype=torch.float64), rtol=0, atol=5e-4)
    gap = stages[336_000]["five - one"][:, 0] / stages[336_000]["one"][:, 0]
    torch.testing.assert_close(gap, torch.tensor([-0.0021, 0.1280, 0.0271], dtype=torch.float64), rtol=0, atol=5e-4)
    end = stages[360_000]
    gap = end["five - one"][:, 0] / end["one"][:, 0]
    torch.testing.assert_close(gap, torch.tensor([-0.0044, 0.1251, 0.0168], dtype=torch.float64), rtol=0, atol=5e-4)
    # the trimmed means (the worst 100 tasks of the million left out) and their errors, from the seventh stage on
    assert all(stages[begin][name].shape == (3, 4) for begin in range(192_000, 360_001, 24_000)
               for name in ("one", "five"))
    trimmed_gap = end["five"][:, 2] / end["one"][:, 2] - 1
    torch.testing.assert_close(trimmed_gap, torch.tensor([-0.0188, 0.1660, 0.0132], dtype=torch.float64), rtol=0,
                               atol=5e-4)
    assert ((end["one"][:, 2] < 0.6 * end["one"][:, 0]) & (end["one"][:, 3] < 0.02 * end["one"][:, 2])).all()
    # the flat stages task by task (research/stage_tails.py): the same tasks as the score, so the same mean change; in
    # the first the loss still fell on 57-71% of them while the 100 worst before it rose as a group; from 288 000 steps
    # it fell on 80% of seed 1's tasks but 36% of seed 2's (one head), from 336 000 on 22-41%, and from 360 000 on 34%
    # of seed 0's but 70% of seed 1's and seed 2's
    assert sorted(results["stage_tails"]) == list(range(240_000, 360_001, 24_000))
    for begin, tails_of in results["stage_tails"].items():
        for name, tails in tails_of.items():
            stage = stages[begin]
            torch.testing.assert_close(tails["mean change"], stage[f"{name} - {name} (before)"][:, 0]
                                       / stage[f"{name} (before)"][:, 0], rtol=1e-6, atol=0)
        assert any(entry["command"] == f"python research/stage_tails.py {begin}" for entry in results["redone"])
    for name in ("one", "five"):
        tails = results["stage_tails"][240_000][name]
        assert (0.56 < tails["fell"][:, 0]).all() and (tails["fell"][:, 0] < 0.71).all()
        assert (tails["from worst"] >= 0).all() and (tails["from rest"] < -0.015).all()
    torch.testing.assert_close(results["stage_tails"][288_000]["one"]["fell"][:, 0],
                               torch.tensor([0.594, 0.797, 0.362], dtype=torch.float64), rtol=0, atol=1e-3)
    torch.testing.assert_close(results["stage_tails"][336_000]["one"]["fell"][:, 0],
                               torch.tensor([0.407, 0.218, 0.313], dtype=torch.float64), rtol=0, atol=1e-3)
    torch.testing.assert_close(results["stage_tails"][360_000]["one"]["fell"][:, 0],
                               torch.tensor([0.339, 0.697, 0.701], dtype=torch.float64), rtol=0, atol=1e-3)


def test_heads_at_four_layers_whitened_after_the_plain_stages(results):
    """Section 10, eleven more stages of the 4-layer one head and 5 heads with Adam in white coordinates
    (``research/widened_heads.py --continued --whitened``) from the plain stages' end at 384 000 steps.  Pins of
    the shipped run: one head -4.9% to -7.1% (2.2-4.8 paired errors), then -0.1% to -1.9% and -0.55% to -1.5%
    (within 1.6), then within 0.6% (0.7 errors) twice, then -0.3% to -1.1%, then +1.35%, -0.9%, +0.6%, then
    -2.7%, +0.8%, +0.3%, then +0.9%, -2.0%, -0.7%, then +0.8%, +1.0%, +1.3%, then -0.9%, -1.0%, -1.0%; 5 heads
    -3.7% to -6.3%, then +0.04% to -2.7% and -2.2% to -4.9%, then within 1.5% (1.3 errors) twice, then -0.6% to
    -2.6%, then +1.8%, -0.9%, +0.4%, then -3.7%, +0.1%, -0.8%, then +1.8%, +0.1%, -0.8%, then +0.6%, -1.2%,
    +1.0%, then -1.9%, -1.2%, -1.5%; 5 heads - 1 head -1.0%, +9.3%, +1.9% after the third, -1.45%, +9.4%, +0.3%
    after the fifth, -1.5%, +6.9%, +0.1% after the sixth, -1.1%, +6.9%, -0.15% after the seventh, -2.2%, +6.1%,
    -1.3% after the eighth, -1.2%, +8.3%, -1.4% after the ninth, -1.4%, +5.9%, -1.6% after the tenth, -2.4%,
    +5.7%, -2.1% at the end."""
    stages = results["widened_heads_continued"][4]
    whitened = sorted(begin for begin, stage in stages.items() if stage.get("whitened"))
    assert whitened == list(range(384_000, 624_001, 24_000)) and max(stages) == 624_000
    assert all(stages[begin]["steps"] == 24_000 and stages[begin]["learning_rate"] == 0.0005 for begin in whitened)
    for begin in whitened:   # each goes on from the stage before: the same models, read the same on the same tasks
        for name in ("one", "five"):
            torch.testing.assert_close(stages[begin][f"{name} (before)"], stages[begin - 24_000][name], rtol=1e-12,
                                       atol=0)
            torch.testing.assert_close(stages[begin]["curve"][name][:, 0], stages[begin - 24_000]["curve"][name][:, -1],
                                       rtol=1e-9, atol=0)

    def change(begin, name):
        return stages[begin][f"{name} - {name} (before)"][:, 0] / stages[begin][f"{name} (before)"][:, 0]

    expected = {   # each stage's change per seed, as a fraction of the loss before it
        (384_000, "one"): [-0.0488, -0.0695, -0.0711],
        (408_000, "one"): [-0.0186, -0.0010, -0.0069],
        (384_000, "five"): [-0.0366, -0.0447, -0.0629],
        (408_000, "five"): [-0.0274, -0.0115, 0.0004],
        (432_000, "one"): [-0.0151, -0.0055, -0.0078],
        (432_000, "five"): [-0.0243, -0.0492, -0.0219],
        (456_000, "one"): [0.0048, -0.0058, -0.0023],
        (456_000, "five"): [-0.0010, 0.0054, -0.0118],
        (480_000, "one"): [-0.0041, -0.0053, 0.0040],
        (480_000, "five"): [-0.0028, -0.0150, -0.0020],
        (504_000, "one"): [-0.0111, -0.0034, -0.0045],
        (504_000, "five"): [-0.0113, -0.0260, -0.0061],
        (528_000, "one"): [0.0135, -0.0087, 0.0064],
        (528_000, "five"): [0.0176, -0.0092, 0.0036],
        (552_000, "one"): [-0.0266, 0.0084, 0.0028],
        (552_000, "five"): [-0.0374, 0.0006, -0.0084],
        (576_000, "one"): [0.0090, -0.0195, -0.0068],
        (576_000, "five"): [0.0185, 0.0010, -0.0077],
        (600_000, "one"): [0.0078, 0.0101, 0.0126],
        (600_000, "five"): [0.0060, -0.0120, 0.0099],
        (624_000, "one"): [-0.0089, -0.0100, -0.0103],
        (624_000, "five"): [-0.0191, -0.0118, -0.0147],
    }
    for (begin, name), values in expected.items():
        torch.testing.assert_close(change(begin, name), torch.tensor(values, dtype=torch.float64), rtol=0, atol=5e-4)
    for begin, gap in ((432_000, [-0.0100, 0.0927, 0.0186]), (480_000, [-0.0145, 0.0942, 0.0029]),
                       (504_000, [-0.0147, 0.0694, 0.0013]), (528_000, [-0.0107, 0.0688, -0.0015]),
                       (552_000, [-0.0217, 0.0606, -0.0126]), (576_000, [-0.0125, 0.0827, -0.0136]),
                       (600_000, [-0.0143, 0.0591, -0.0162]),
                       (624_000, [-0.0244, 0.0572, -0.0206])):
        end = stages[begin]
        torch.testing.assert_close(end["five - one"][:, 0] / end["one"][:, 0],
                                   torch.tensor(gap, dtype=torch.float64), rtol=0, atol=5e-4)
    for name in ("white_17.pt", "white_18.pt", "white_19.pt", "white_20.pt", "white_21.pt", "white_22.pt",
                 "white_23.pt", "white_24.pt", "white_25.pt"):
        assert any(entry["command"].endswith("--continued --whitened && python research/widened_heads.py score "
                                             + name) for entry in results["redone"])


def test_quasi_newton_at_four_layers_stage_after_stage(results):
    """Section 9, the 4-layer LFOM with every entry free trained on from its 24 000-step end: three stages of 12 000
    steps at a peak rate of 0.005, then three at 0.0005, each from the last one's end, scored paired on the million
    stretched tasks that scored its start.  Pins of the shipped run: after 84 000 steps seeds 0 and 2 at 5.0e-4 and
    5.4e-4 (rotated) and 4.8e-4 and 5.3e-4 (isotropic), that stage lowering them by 1.4-2.7%; after 96 000 at 4.9e-4
    and 5.3e-4 (rotated, 1.6% lower) and 4.8e-4 and 5.2e-4 (isotropic, 0.5-0.7% lower)."""
    stages = results["quasi_newton_stages"]
    assert sorted(stages) == list(range(24_000, 84_001, 12_000))
    assert [stages[begin]["learning_rate"] for begin in sorted(stages)] == [0.005] * 3 + [0.0005] * 3
    shipped = results["full_attention_lengths"][24_000]["quasi_newton"]
    for setting in ("rotated", "isotropic"):
        # the first stage starts from the shipped 24 000-step models: its "before" is their score, on the same tasks
        torch.testing.assert_close(stages[24_000][setting]["before"][:, 0], shipped[setting][4]["mean"][:, -1],
                                   rtol=1e-9, atol=0)
        for begin in sorted(stages)[1:]:   # each later stage starts where the one before ended, and reads the same
            torch.testing.assert_close(stages[begin][setting]["before"], stages[begin - 12_000][setting]["after"],
                                       rtol=1e-12, atol=0)
    torch.testing.assert_close(stages[72_000]["rotated"]["after"][[0, 2], 0],
                               torch.tensor([5.012e-4, 5.384e-4], dtype=torch.float64), rtol=2e-3, atol=0)
    torch.testing.assert_close(stages[72_000]["isotropic"]["after"][[0, 2], 0],
                               torch.tensor([4.790e-4, 5.270e-4], dtype=torch.float64), rtol=2e-3, atol=0)
    for setting in ("rotated", "isotropic"):
        stage = stages[72_000][setting]
        change = stage["after - before"][[0, 2], 0] / stage["before"][[0, 2], 0]
        assert (-0.0275 < change).all() and (change < -0.0135).all()
    torch.testing.assert_close(stages[84_000]["rotated"]["after"][[0, 2], 0],
                               torch.tensor([4.934e-4, 5.299e-4], dtype=torch.float64), rtol=2e-3, atol=0)
    torch.testing.assert_close(stages[84_000]["isotropic"]["after"][[0, 2], 0],
                               torch.tensor([4.768e-4, 5.234e-4], dtype=torch.float64), rtol=2e-3, atol=0)
    for setting, low, high in (("rotated", -0.016, -0.015), ("isotropic", -0.007, -0.0045)):
        stage = stages[84_000][setting]
        change = stage["after - before"][[0, 2], 0] / stage["before"][[0, 2], 0]
        assert (low < change).all() and (change < high).all()


def test_quasi_newton_at_four_layers_from_three_thousand_steps(results):
    """Section 9, the same stages (12 000 steps at 0.0005 each) from the shipped 3 000-step 4-layer LFOMs instead,
    every seed and setting, each scored paired on the million stretched tasks that scored its start.  Pins of the
    shipped run: after 171 000 steps isotropic seed 2 at 7.7e-5 (from 2.6e-4), rotated seed 2 at 1.7e-4 (from
    3.1e-3)."""
    branch = {begin: stage for begin, stage in results["quasi_newton_branches"][3_000].items()
              if not stage.get("whitened")}      # Adam in the given coordinates; the whitened stages after them: below
    assert sorted(branch) == list(range(3_000, 159_001, 12_000))
    assert all(stage["steps"] == 12_000 and stage["learning_rate"] == 0.0005 and stage["origin"] == 3_000
               for stage in branch.values())
    shipped = results["full_attention_lengths"][3_000]["quasi_newton"]
    for setting in ("rotated", "isotropic"):
        torch.testing.assert_close(branch[3_000][setting]["before"][:, 0], shipped[setting][4]["mean"][:, -1],
                                   rtol=1e-9, atol=0)
        for begin in sorted(branch)[1:]:
            torch.testing.assert_close(branch[begin][setting]["before"], branch[begin - 12_000][setting]["after"],
                                       rtol=1e-12, atol=0)
    torch.testing.assert_close(branch[159_000]["rotated"]["after"][[0, 2], 0],
                               torch.tensor([1.161e-3, 1.675e-4], dtype=torch.float64), rtol=3e-3, atol=0)
    torch.testing.assert_close(branch[159_000]["isotropic"]["after"][[0, 2], 0],
                               torch.tensor([4.725e-4, 7.728e-5], dtype=torch.float64), rtol=3e-3, atol=0)
    # the best seed fell in each of the first seven stages: the first four beyond 4.5 paired errors each, the next
    # three by 1.6-3.9; then seven within 1.6 both ways (three of them rises), as did isotropic seed 0 in those seven
    # stages (seed 1 within 2.6: it fell by 2.5 in the thirteenth)
    changes = [branch[begin]["isotropic"]["after - before"][2] for begin in sorted(branch)]
    assert all(mean < -4.5 * error for mean, error in changes[:4])
    assert all(-4 * error < mean < -1.5 * error for mean, error in changes[4:7])
    assert all(abs(mean) < 1.6 * error for mean, error in changes[7:]) and sum(mean > 0 for mean, _ in changes[7:]) == 3
    # (stages, seeds, 2)
    late = torch.stack([branch[begin]["isotropic"]["after - before"] for begin in sorted(branch)[7:]])
    assert (late[:, [0, 2], 0].abs() < 1.6 * late[:, [0, 2], 1]).all()
    assert (late[:, 1, 0].abs() < 2.6 * late[:, 1, 1]).all()
    # the rotated seed 2 still falls, by about 2% and more than 8 paired errors in each of the last three stages
    for begin in sorted(branch)[-3:]:
        change, before = branch[begin]["rotated"]["after - before"][2], branch[begin]["rotated"]["before"][2, 0]
        assert change[0] < -8 * change[1] and -0.024 < change[0] / before < -0.02


def test_quasi_newton_at_four_layers_whitened_after_the_plain_stages(results):
    """Section 9, two more stages of the branch from 3 000 steps with Adam in white coordinates
    (``train_models(whitened=True)``), from the plain stages' end at 171 000 steps.  Pins of the shipped run: rotated
    seed 2 -5.2% (1.4 paired errors) then +6.2% (0.8), its own error 2.6% -> 4.7% -> 11.4% of its loss; rotated seed 0
    -27%; the isotropic control (a plain stage, S = I) within 1.7 paired errors."""
    branch = results["quasi_newton_branches"][3_000]
    whitened = sorted(begin for begin, stage in branch.items() if stage.get("whitened"))
    assert whitened == [171_000, 183_000] and max(branch) == 183_000
    assert all(branch[begin]["steps"] == 12_000 and branch[begin]["learning_rate"] == 0.0005 for begin in whitened)
    for setting in ("rotated", "isotropic"):
        for begin in whitened:
            torch.testing.assert_close(branch[begin][setting]["before"], branch[begin - 12_000][setting]["after"],
                                       rtol=1e-12, atol=0)
    change = {begin: branch[begin]["rotated"]["after - before"][2] / branch[begin]["rotated"]["before"][2, 0]
              for begin in whitened}
    torch.testing.assert_close(change[171_000], torch.tensor([-0.0523, 0.0361], dtype=torch.float64), rtol=2e-2,
                               atol=0)
    torch.testing.assert_close(change[183_000], torch.tensor([0.0622, 0.0787], dtype=torch.float64), rtol=2e-2,
                               atol=0)
    seed_0 = branch[171_000]["rotated"]["after - before"][0, 0] / branch[171_000]["rotated"]["before"][0, 0]
    assert -0.27 < seed_0 < -0.265
    own = [branch[159_000]["rotated"]["after"][2]] + [branch[begin]["rotated"]["after"][2] for begin in whitened]
    assert [round(100 * (error / mean).item(), 1) for mean, error in own] == [2.6, 4.7, 11.4]
    for begin in whitened:
        control = branch[begin]["isotropic"]["after - before"]
        assert (control[:, 0].abs() < 1.75 * control[:, 1]).all()


def test_quasi_newton_at_four_layers_from_other_starts(results):
    """Section 9, the same stages from the shipped 1 500- and 6 000-step 4-layer LFOMs, five each.  Pins of the
    shipped run: after them seven of the eight isotropic runs other than the 3 000-step seed 2 stand at 4.8e-4 to
    6.6e-4 and the eighth at 1.6e-3, 5.75 times or more above that seed after its own five stages (8.3e-5)."""
    shipped = results["full_attention_lengths"]
    after = {}
    for origin in (1_500, 6_000):
        branch = results["quasi_newton_branches"][origin]
        assert sorted(branch) == [origin + 12_000 * stage for stage in range(5)]
        assert all(stage["steps"] == 12_000 and stage["learning_rate"] == 0.0005 and stage["origin"] == origin
                   for stage in branch.values())
        for setting in ("rotated", "isotropic"):
            torch.testing.assert_close(branch[origin][setting]["before"][:, 0],
                                       shipped[origin]["quasi_newton"][setting][4]["mean"][:, -1], rtol=1e-9, atol=0)
            for begin in sorted(branch)[1:]:
                torch.testing.assert_close(branch[begin][setting]["before"], branch[begin - 12_000][setting]["after"],
                                           rtol=1e-12, atol=0)
        after[origin] = branch[origin + 48_000]["isotropic"]["after"][:, 0]
    torch.testing.assert_close(after[1_500], torch.tensor([4.813e-4, 6.57e-4, 5.231e-4], dtype=torch.float64),
                               rtol=3e-3, atol=0)
    torch.testing.assert_close(after[6_000][[0, 2]], torch.tensor([4.802e-4, 5.256e-4], dtype=torch.float64),
                               rtol=3e-3, atol=0)
    lucky = results["quasi_newton_branches"][3_000][51_000]["isotropic"]["after"][2, 0]
    others = torch.cat([after[1_500], after[6_000],
                        results["quasi_newton_branches"][3_000][51_000]["isotropic"]["after"][:2, 0]])
    assert (others > 5.75 * lucky).all()
