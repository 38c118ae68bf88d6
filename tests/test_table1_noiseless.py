"""The light-tailed GD++ fits of Table 1's noiseless column (icl_course.table1.noiseless) and their place in a run."""

import json
from dataclasses import replace

import pytest
import torch

from icl_course.checkpoints import load_checkpoint
from icl_course.data import RegressionTasks
from icl_course.evaluate import Estimate, query_averaged_loss
from icl_course.models import LinearTransformer
from icl_course.table1 import BUDGETS, NoiselessFit, Table1Error, pick_candidate, run_table1
from icl_course.table1.budget import _check_noiseless_fit
from icl_course.table1.noiseless import (
    CheckTasks,
    FitTasks,
    deeper_starts,
    fit_gdpp,
    gdpp_model,
    gdpp_weights,
    light_tailed_fit,
)
from icl_course.table1.select import WIDENED, choose
from icl_course.theory import gdpp_residual

SMALL = NoiselessFit(depths=(3,), rare_weights=(10.0, 30.0), fit_tasks=4000, pool_tasks=200_000,
                     check_tasks=40_000, check_samples=2, adam_steps=50, rounds=1, iterations=20)
#: a 2-layer noiseless GD++ (w_xx, w_yx per layer): the shipped cpu run's, rounded (0.34, the paper's 0.341)
TWO_LAYERS = torch.tensor([[-0.012, 0.004], [-0.034, -0.141]], dtype=torch.float64)


def test_gdpp_weights_and_gdpp_model_are_inverse_and_keep_the_function():
    trained = LinearTransformer(10, 3, 1, "gdpp", init_scale=0.3, seed=4, dtype=torch.float64, device="cpu")
    rebuilt = gdpp_model(gdpp_weights(trained))
    batch = RegressionTasks(10, 20, 0.0, dtype=torch.float64, device="cpu").sample(50, seed=1)
    assert torch.allclose(rebuilt.final_weights(batch), trained.final_weights(batch), rtol=1e-10, atol=1e-12)
    assert torch.equal(gdpp_weights(rebuilt), gdpp_weights(trained))
    with pytest.raises(ValueError, match="gdpp"):
        gdpp_weights(LinearTransformer(10, 1, 1, "diag", dtype=torch.float64, device="cpu"))
    with pytest.raises(ValueError, match=r"\(2, L\)"):
        gdpp_model(torch.zeros(3, 2))


def test_the_check_tasks_give_the_models_own_losses_through_the_spectrum():
    weights = TWO_LAYERS
    check = CheckTasks(3000, seed=5, chunk_size=3000)
    batch = RegressionTasks(10, 20, 0.0, dtype=torch.float64, device="cpu").sample(3000, torch.Generator()
                                                                                    .manual_seed(5))
    with torch.no_grad():
        losses = query_averaged_loss(gdpp_model(weights).final_weights(batch), batch)
    direct, spectral = Estimate.from_samples(losses), check.estimate(weights)
    assert spectral.mean == pytest.approx(direct.mean, rel=1e-9)
    assert spectral.trimmed_mean == pytest.approx(direct.trimmed_mean, rel=1e-9)
    assert spectral.stderr == pytest.approx(direct.stderr, rel=1e-6)
    # an exploding model is a non-finite estimate, never a winner
    assert check.estimate(torch.full((2, 2), 1e200, dtype=torch.float64)).mean == float("inf")
    # several samples: each its own estimate, and together the one sample they make
    halves = CheckTasks(1500, seed=5, samples=2, chunk_size=3000)
    first, second = halves.estimates(weights)
    assert first.num_tasks == second.num_tasks == 1500
    assert first.mean == pytest.approx(Estimate.from_samples(losses[:1500]).mean, rel=1e-9)
    assert second.trimmed_mean == pytest.approx(Estimate.from_samples(losses[1500:]).trimmed_mean, rel=1e-9)
    assert halves.estimate(weights).mean == pytest.approx(direct.mean, rel=1e-9)


def test_the_fit_tasks_are_a_stratified_sample_of_the_plain_law_with_every_rare_task():
    tasks = FitTasks(SMALL, seed=8)
    smallest, largest = tasks.eigenvalues[:, 0], tasks.eigenvalues[:, -1]
    assert torch.equal(tasks.rare, (smallest < SMALL.smallest) | (largest > SMALL.largest))
    share = SMALL.fit_tasks / SMALL.pool_tasks
    assert torch.equal(tasks.weight, torch.where(tasks.rare, 1.0, 1 / share).double())
    # weighted back, the sample counts the pool, and each rare task stands for itself
    assert tasks.weight.sum().item() == pytest.approx(SMALL.pool_tasks, rel=4 * (1 / SMALL.fit_tasks) ** 0.5)
    assert 0 < tasks.rare.sum() < 0.2 * len(tasks.rare)
    # at rare weight 0 (no guard either) the objective is the model's plain expected loss: the check tasks' mean
    check = CheckTasks(100_000, seed=9)
    plain = check.estimate(TWO_LAYERS)
    allowed = 4 * plain.stderr + 0.02 * plain.mean   # the fit sample's own error: about 1% on 4 000 tasks
    assert tasks.objective(TWO_LAYERS, 0.0).item() == pytest.approx(plain.mean, abs=allowed)
    # the guard grid runs from the rare threshold to the cap, beyond the largest eigenvalue of the pool
    assert tasks.grid.min().item() == SMALL.largest and tasks.grid.max().item() == SMALL.cap > largest.max().item()


def test_deeper_starts_keep_the_function_or_copy_a_layer():
    starts = deeper_starts(TWO_LAYERS)
    assert len(starts) == 4 and all(start.shape == (2, 3) for start in starts.values())
    assert len(deeper_starts(TWO_LAYERS[:, :1])) == 2   # one layer: first and last are the same
    spectrum = torch.linspace(0.1, 100, 50, dtype=torch.float64)
    shallow = gdpp_residual(spectrum, *TWO_LAYERS)
    for name, start in starts.items():
        if name.startswith("pass-through"):
            assert torch.allclose(gdpp_residual(spectrum, *start), shallow, rtol=1e-12, atol=1e-14)
        else:
            assert (start[:, 1:] == TWO_LAYERS).all() or (start[:, :-1] == TWO_LAYERS).all()


def test_a_fit_lowers_its_weighted_objective_and_the_kept_one_is_light_tailed():
    tasks = FitTasks(SMALL, seed=3)
    start = deeper_starts(TWO_LAYERS)["copy of layer 1"]
    fitted = fit_gdpp(tasks, start, 30.0, SMALL)
    assert tasks.objective(fitted, 30.0) < 0.5 * tasks.objective(start, 30.0)
    check = CheckTasks(SMALL.check_tasks, seed=6, samples=SMALL.check_samples)
    best = light_tailed_fit(deeper_starts(TWO_LAYERS), SMALL, tasks, check)
    assert len(best["check"]) == SMALL.check_samples   # light-tailed on every sample
    assert not any(Estimate(*entry).heavy_tailed(SMALL.check_stderr, SMALL.check_trimmed_gap)
               for entry in best["check"])
    assert best["mean"] == pytest.approx(check.estimate(best["weights"]).mean, rel=1e-12)
    # the starts compete as they are, but here a fit wins, well below every start and the two-layer model
    assert best["rare_weight"] in SMALL.rare_weights
    assert best["mean"] < 0.5 * min(check.estimate(start).mean for start in deeper_starts(TWO_LAYERS).values())
    assert best["mean"] < 0.2 * check.estimate(TWO_LAYERS).mean


def test_the_kept_fit_passes_on_every_check_sample_not_only_the_first():
    """The staged check: a model that passes on the first sample but fails on a later one is not kept, even with
    the lowest mean; a model heavy on the first sample is never checked on the others."""
    light, heavy = Estimate(1.0, 0.001, 1000, 0.99), Estimate(0.5, 0.5, 1000, 0.01)
    script = {"low, fails later": [Estimate(0.5, 0.001, 1000, 0.495), heavy],   # (mean on the first sample, ...)
              "middle, light": [light, light],
              "lowest, heavy first": [heavy, light]}

    class ScriptedChecks:
        def __init__(self):
            self.full_checks = []

        def estimates(self, weights, samples=None):
            name = next(name for name, start in starts.items() if torch.equal(start, weights))
            if samples is None:
                self.full_checks.append(name)
            return script[name][:samples]

    starts = {name: torch.full((2, 2), float(index)) for index, name in enumerate(script)}
    checks = ScriptedChecks()
    kept = light_tailed_fit(starts, replace(SMALL, rare_weights=()), fit_tasks=None, check_tasks=checks)
    assert kept["start"] == "middle, light" and kept["rare_weight"] is None and kept["mean"] == 1.0
    assert checks.full_checks == ["low, fails later", "middle, light"]   # in the order of the first mean
    script["middle, light"] = [light, heavy]
    assert light_tailed_fit(starts, replace(SMALL, rare_weights=()), None, ScriptedChecks()) is None


def test_a_noiseless_fit_setting_is_checked_and_survives_config_json():
    for bad, words in ((dict(depths=(1,)), "depths"), (dict(rare_weights=()), "rare_weights"),
                       (dict(smallest=-1.0), "smallest"), (dict(fit_tasks=1), "fit_tasks"),
                       (dict(rounds=True), "rounds"), (dict(adam_steps=-1), "adam_steps"),
                       (dict(check_samples=0), "check_samples"),
                       (dict(adam_learning_rate=0.0), "adam_learning_rate"), (dict(pool_tasks=1), "pool_tasks"),
                       (dict(guard=-1.0), "guard"), (dict(cap=70.0), "cap")):
        with pytest.raises(Table1Error, match=words):
            run_table1("unused", replace(BUDGETS["quick"], noiseless_fit=replace(SMALL, **bad)))
    with pytest.raises(Table1Error, match="NoiselessFit"):
        run_table1("unused", replace(BUDGETS["quick"], noiseless_fit={"depths": [3]}))
    _check_noiseless_fit(replace(SMALL, guard=0.0))   # no guard grid: allowed, and it leaves the tasks' mean alone
    tasks, unguarded = FitTasks(SMALL, seed=3), FitTasks(replace(SMALL, guard=0.0), seed=3)
    assert unguarded.objective(TWO_LAYERS, 30.0) < tasks.objective(TWO_LAYERS, 30.0)
    guard_term = SMALL.guard * 30.0 * (gdpp_residual(tasks.grid, *TWO_LAYERS) ** 2).mean()
    assert unguarded.objective(TWO_LAYERS, 30.0).item() == pytest.approx(
        (tasks.objective(TWO_LAYERS, 30.0) - guard_term).item(), rel=1e-12)
    data = replace(BUDGETS["quick"], noiseless_fit=SMALL).as_dict()
    assert json.loads(json.dumps(data)) == data and data["noiseless_fit"]["depths"] == [3]
    assert "noiseless_fit" not in BUDGETS["quick"].as_dict()   # runs made before the setting keep their config


def test_plain_scores_that_pass_the_heavy_tail_test_come_first():
    stretched = {"trained": Estimate(1e-6, 1e-8, 1000), "fit": Estimate(1e-4, 1e-7, 1000)}
    plain = {"trained": Estimate(2e-6, 1e-7, 1000, 1e-6), "fit": Estimate(1e-4, 1e-7, 1000, 0.99e-4)}
    assert pick_candidate(stretched, True, True) == "trained"
    assert pick_candidate(stretched, True, True, plain) == "fit"
    # when none passes, the stretched rule decides
    plain["fit"] = Estimate(1e-4, 1e-5, 1000, 0.5e-4)
    assert pick_candidate(stretched, True, True, plain) == "trained"


def test_a_run_offers_the_fit_to_every_variant_of_the_noiseless_cell_and_resumes_it(tmp_path):
    options = dict(depths=(1, 2, 3), columns=["0"], progress=False, verbose=False, steps=40, batch_size=64,
                   seeds=(0,), tuning_tasks=1000, eval_tasks=2000, eval_tasks_deep=3000, chunk_size=1000,
                   checkpoint_every=10, learning_rate=1e-2, warmup_steps=5, noiseless_fit=SMALL)
    out = tmp_path / "run"
    rows = run_table1(out, "quick", device="cpu", **options)
    names = {variant: f"{variant}-L3-u0-s0-fit" for variant in ("gdpp", "diag", "full")}
    models = {variant: load_checkpoint(out / "models" / f"{name}.pt", device="cpu") for variant, name in names.items()}
    batch = RegressionTasks(10, 20, 0.0, dtype=torch.float64, device="cpu").sample(100, seed=2)
    reference = models["gdpp"].model.final_weights(batch)
    for variant, checkpoint in models.items():   # one function, in three parameterisations
        assert checkpoint.model.config["parameterization"] == variant
        assert torch.allclose(checkpoint.model.final_weights(batch), reference, rtol=1e-9, atol=1e-12)
        assert checkpoint.metadata["fitted_from"] == ["gdpp-L2-u0-s0", "gdpp-L3-u0-s0"]
    fit = models["gdpp"].metadata["fit"]
    assert not any(Estimate(*entry).heavy_tailed(SMALL.check_stderr, SMALL.check_trimmed_gap) for entry in fit["check"])
    # each 3-layer cell chose on stretched and on plain tasks, by the rule
    for variant in ("gdpp", "diag", "full"):
        saved = json.loads((out / "selections" / f"{variant}-L3-u0.json").read_text())
        assert names[variant] in saved["candidates"] and saved["tuning"].endswith(" and plain")
        plain = {name: Estimate(*score[:2], int(score[2]), score[3]) for name, score in saved["plain_scores"].items()}
        stretched = {name: Estimate(*score[:2], int(score[2])) for name, score in saved["scores"].items()}
        # first among the trained candidates and the fit, then against the smaller cell's model widened
        widened = next((name for name in saved["candidates"] if name.endswith(WIDENED)), None)
        assert (widened is None) == (variant == "gdpp")
        differences = {name: Estimate(*score[:2], int(score[2]))
                       for name, score in saved.get("differences", {}).items()}
        assert saved["selected"] == choose(stretched, True, True, plain, differences, widened)
        trained = {name: score for name, score in stretched.items() if name != widened}
        assert saved["selected"] in (widened, pick_candidate(trained, True, True,
                                                             {name: plain[name] for name in trained}))
    # a second call fits nothing again and gives the same table
    written = (out / "models" / f"{names['gdpp']}.pt").stat().st_mtime
    assert [dict(row, wall_time_s=None) for row in run_table1(out, "quick", device="cpu", **options)] == \
        [dict(row, wall_time_s=None) for row in rows]
    assert (out / "models" / f"{names['gdpp']}.pt").stat().st_mtime == written


def test_replace_columns_keeps_the_base_and_takes_the_parts_columns(tmp_path):
    import importlib.util
    from pathlib import Path

    from icl_course.table1 import load_results, load_table1_model

    path = Path(__file__).resolve().parents[1] / "research" / "replace_columns.py"
    spec = importlib.util.spec_from_file_location("replace_columns", path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    options = dict(depths=(1, 2), progress=False, verbose=False, steps=20, batch_size=32, seeds=(0,),
                   tuning_tasks=500, eval_tasks=1000, eval_tasks_deep=1000, chunk_size=500, checkpoint_every=10)
    base = run_table1(tmp_path / "base", "quick", device="cpu", columns=["0", "1"], **options)
    part = run_table1(tmp_path / "part", "quick", device="cpu", columns=["0"], **dict(options, steps=30))
    script.main(["--base", str(tmp_path / "base"), "--part", str(tmp_path / "part"), "--out", str(tmp_path / "out")])
    rows = load_results(tmp_path / "out")
    assert rows == [row for row in part if row["column"] == "0"] + [row for row in base if row["column"] == "1"]
    for column, source in (("0", "part"), ("1", "base")):
        merged, original = (load_table1_model("diag", 2, column, tmp_path / folder) for folder in ("out", source))
        assert all(torch.equal(a, b) for a, b in zip(merged.state_dict().values(), original.state_dict().values()))
    config = json.loads((tmp_path / "out" / "results.json").read_text())["config"]
    assert [part["columns"] for part in config["parts"]] == [["1"], ["0"]] and config["columns"][:2] == ["0", "1"]
    assert (tmp_path / "out" / "figure.png").stat().st_size > 0 and "| Diag 2 layers |" in (
        tmp_path / "out" / "table.md").read_text()
    with pytest.raises(SystemExit):   # never over a folder with something in it
        script.main(["--base", str(tmp_path / "base"), "--part", str(tmp_path / "part"), "--out",
                     str(tmp_path / "out")])
    with pytest.raises(SystemExit):   # a folder that is not a finished run: a usage message, not a traceback
        script.main(["--base", str(tmp_path / "nowhere"), "--part", str(tmp_path / "part"), "--out",
                     str(tmp_path / "other")])


def test_a_fit_at_a_depth_run_alone_starts_from_that_depths_trained_gdpp(tmp_path):
    options = dict(depths=(3,), columns=["0"], variants=["gdpp"], progress=False, verbose=False, steps=30,
                   batch_size=64, seeds=(0,), tuning_tasks=1000, eval_tasks=2000, eval_tasks_deep=2000,
                   chunk_size=1000, checkpoint_every=10, learning_rate=1e-2, warmup_steps=5, noiseless_fit=SMALL)
    rows = run_table1(tmp_path / "run", "quick", device="cpu", **options)
    fit = load_checkpoint(tmp_path / "run" / "models" / "gdpp-L3-u0-s0-fit.pt", device="cpu")
    assert fit.metadata["fitted_from"] == ["gdpp-L3-u0-s0"] and [row["depth"] for row in rows if row["depth"]] == [3]
