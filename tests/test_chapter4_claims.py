"""Pins behind chapter 4's text that hold by construction or by transcription, moved out of the notebook.

The chapter keeps one visible check per claim of its own; what it quotes from the paper, and the identities that
every single-head diagonal model satisfies, are pinned here.
"""

import json

import pytest
import torch

from icl_course import table1
from icl_course.mixed_noise import (
    DEPTH_PROFILE_MODELS,
    DEPTH_PROFILE_RUN,
    DEPTH_PROFILE_SIGMAS,
    compute_depth_profiles,
    compute_head_comparison,
    diagonal_weights_table,
    load_results,
)


@pytest.mark.parametrize("run", ["clipped", "cpu"])
def test_the_shipped_single_head_models_satisfy_the_rank_one_identity(run):
    for variant in ("diag", "gdpp"):   # one head: w_ab = p_a q_b, so w_xx w_yy = w_xy w_yx
        table = diagonal_weights_table(table1.load_table1_model(variant, 2, "5", run))
        assert torch.allclose(table[:, 0] * table[:, 3], table[:, 1] * table[:, 2], rtol=1e-9, atol=1e-15)
    assert (table[:, 1] == 0).all() and (table[:, 3] == 0).all()   # GD++: no w_xy, no w_yy


def test_the_paper_numbers_chapter_4_quotes():
    column = table1.COLUMNS.index
    assert table1.PAPER["gdpp"][1][column("4")] == 1.015 and table1.PAPER["gdpp"][1][column("5")] == 0.907
    assert table1.PAPER["gdpp"][5][column("5")] == 0.344 and table1.PAPER_BASELINES["ConstRR"][column("5")] == 0.365
    assert table1.PAPER["diag"][3][column("7")] == 0.123
    assert [table1.PAPER["diag"][4][column(c)] for c in "4567"] == [0.050, 0.059, 0.065, 0.073]
    assert [table1.PAPER_BASELINES["AdaRR"][column(c)] for c in "4567"] == [0.053, 0.068, 0.081, 0.092]


def test_the_shipped_depth_profiles_are_the_deep_evaluation_chapter_4_draws():
    profiles = load_results()["depth_profiles"]
    assert profiles["run"] == DEPTH_PROFILE_RUN and profiles["sigmas"] == list(DEPTH_PROFILE_SIGMAS)
    assert profiles["num_tasks"] >= 1_000_000             # models of 7 layers: a million tasks per level
    for variant, depth, column in DEPTH_PROFILE_MODELS:
        entry = next(model for model in profiles["models"].values()
                     if (model["variant"], model["depth"], model["column"]) == (variant, depth, column))
        assert len(entry["layers"]) == len(DEPTH_PROFILE_SIGMAS)
        assert all(len(per_layer) == depth and all(value["num_tasks"] == profiles["num_tasks"] for value in per_layer)
                   for per_layer in entry["layers"])


def test_compute_depth_profiles_adds_its_entry_and_keeps_the_others(tmp_path):
    path = tmp_path / "evaluations.json"
    path.write_text(json.dumps({"tails": {"kept": 1}}))
    written = compute_depth_profiles(300, path, log=lambda message: None, models=(("diag", 2, "5"),),
                                     sigmas=(0.0, 3.0), chunk_size=200, tuning_tasks=500)
    stored = load_results(path)
    assert stored["tails"] == {"kept": 1} and stored["depth_profiles"] == json.loads(json.dumps(written))
    (model,) = written["models"].values()
    assert [len(per_layer) for per_layer in model["layers"]] == [2, 2]
    assert written["baselines"]["5"]["AdaRR"][0]["mean"] == pytest.approx(0.0, abs=1e-9)   # exact at sigma = 0
    assert written["baselines"]["5"]["TunedRR"][1]["num_tasks"] == 300


def test_compute_head_comparison_adds_its_entry_and_the_shipped_one_is_full_size(tmp_path):
    path = tmp_path / "evaluations.json"
    written = compute_head_comparison(path, log=lambda message: None, num_steps=5, num_tasks=400)
    assert load_results(path)["heads"] == json.loads(json.dumps(written))
    assert set(written["scores"]) == {"trained", "one head", "two heads"}
    shipped = load_results()["heads"]
    assert shipped["run"] == DEPTH_PROFILE_RUN and shipped["num_tasks"] >= 100_000 and shipped["num_steps"] >= 1000
