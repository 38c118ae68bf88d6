"""Table 1 of Vladymyrov et al. (2024) by one command: ``icl-course table1 --budget quick --out DIR``.

The table compares linear transformers of depth 1 to 7 (GD++, Diag and Full, one head) with three
noise-adaptive ridge baselines on ten mixed-noise problems (``d = 10``, ``n = 20``): uniform
``sigma ~ U(0, sigma_max)`` for ``sigma_max = 0..7`` and categorical ``sigma`` in ``{1, 3}`` or
``{1, 3, 5}``.  Every number is an *adjusted* loss, the loss minus that of the ridge regression told
each task's ``sigma``.

What :func:`run_table1` does, and what it writes under ``out``:

1. trains every (variant, depth, column, seed) model of the budget with :func:`~icl_course.sweep.train_sweep`
   (one stack per variant and depth; a deeper model may start from the trained shallower one with a
   fresh last layer); each model is saved under ``models/`` the moment it finishes.  A depth with
   ``unclipped_steps`` then goes on without gradient clipping or the spike rule at a low constant rate,
   the phase that removes the heavy tails of deep models (clipping mutes the rare ill-conditioned tasks
   whose gradient would tame them); with ``nested_init``, Diag instead starts from the trained GD++
   model of its cell and Full from Diag (:func:`~icl_course.models.widen`), and trains only that phase,
   at ``nested_learning_rate`` where the budget gives one for the variant (``nested_init=("full",)``
   nests Full alone: Diag then trains both phases from random weights);
   a depth with ``deepen`` (a :class:`Deepening`) adds candidates that start from the trained model one
   layer shallower (its first seed's, or the one that shallower cell keeps) with a pass-through layer
   inserted (:func:`~icl_course.models.deepen`), and the variants nested above them follow; a depth
   without seeds trains only those;
2. tunes ConstRR and TunedRR on one sample per column, keeps the best candidate (seed or start) of each
   cell on that sample (for a cell of 3 layers or more: on ``eval_tasks_deep`` tasks of it, and among the
   candidates whose standard error there is at most 1% of their mean, if any: the others have heavy
   tails), and scores models and baselines on a fresh sample, paired with the oracle on the very same
   tasks (``evaluation/``), in chunks;
3. writes ``results.json``, ``results.csv``, ``table.md`` (each of our numbers beside the paper's),
   ``figure.png`` (adjusted loss against depth) and ``models.pt`` (every selected model in one file);
   ``results.json`` also records the configuration and ``seconds``, the wall time of every call on
   ``out`` that got this far.

Killed at any moment and run again with the same ``out``, it redoes no finished model or column and
loses at most ``checkpoint_every`` steps of a stack in training.  ``out`` remembers its configuration
(``config.json``) and refuses a run with another.
"""

from __future__ import annotations

import csv
import json
import math
import os
import platform
import shutil
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Optional, Sequence

import torch

from .baselines import AdaRR, ConstRR, TunedRR
from .checkpoints import CheckpointError, load_checkpoint, save_checkpoint
from .data import CategoricalNoise, RegressionTasks, UniformNoise
from .evaluate import adjusted_losses
from .models import NESTED, LinearTransformer, deepen, widen
from .runtime import resolve_device
from .sweep import ModelSpec, train_sweep

__all__ = ["PAPER", "PAPER_BASELINES", "COLUMNS", "VARIANTS", "BUDGETS", "SHIPPED", "Budget", "Deepening",
           "Table1Error", "column_noise", "run_table1", "merge_runs", "load_results", "load_table1_model",
           "markdown_table", "plot_table1", "main"]

D, N = 10, 20

#: the ten noise settings, as column labels
COLUMNS = ("0", "1", "2", "3", "4", "5", "6", "7", "{1,3}", "{1,3,5}")
COLUMN_IDS = ("u0", "u1", "u2", "u3", "u4", "u5", "u6", "u7", "c13", "c135")
#: the three trained variants: package parameterisation -> the paper's name
VARIANTS = {"gdpp": "GD++", "diag": "Diag", "full": "Full"}
BASELINES = ("ConstRR", "AdaRR", "TunedRR")


def column_noise(column: str):
    """The noise law of a column label ("0".."7", "{1,3}", "{1,3,5}")."""
    if column == "{1,3}":
        return CategoricalNoise([1, 3])
    if column == "{1,3,5}":
        return CategoricalNoise([1, 3, 5])
    if column not in COLUMNS:
        raise ValueError(f"unknown column {column!r}; the columns are {', '.join(COLUMNS)}")
    return UniformNoise(int(column))


# Vladymyrov et al. (2024), appendix B, Table 1 (adjusted loss; columns as COLUMNS): variant -> depth -> row.
# The paper evaluated on 100 000 tasks; its numbers carry about 1% Monte-Carlo error.  GD++ at
# sigma_max = 5 from 3 layers on reads 0.344, below ConstRR's 0.365, which GD++ matches in every other
# column: probably a typo, so no check should rest on it.
PAPER = {
    "gdpp": {
        1: (1.768, 1.639, 1.396, 1.175, 1.015, 0.907, 0.841, 0.806, 1.007, 0.819),
        2: (0.341, 0.295, 0.243, 0.265, 0.347, 0.366, 0.440, 0.530, 0.305, 0.427),
        3: (0.019, 0.021, 0.071, 0.161, 0.259, 0.344, 0.454, 0.530, 0.222, 0.422),
        4: (9.91e-05, 0.014, 0.066, 0.160, 0.258, 0.344, 0.454, 0.530, 0.222, 0.422),
        5: (1.14e-07, 0.014, 0.066, 0.161, 0.265, 0.344, 0.454, 0.530, 0.222, 0.422),
        6: (2.37e-10, 0.009, 0.066, 0.161, 0.265, 0.344, 0.454, 0.530, 0.222, 0.422),
        7: (2.65e-12, 0.009, 0.066, 0.161, 0.265, 0.344, 0.454, 0.530, 0.222, 0.422),
    },
    "diag": {
        1: (1.767, 1.639, 1.396, 1.175, 1.015, 0.906, 0.841, 0.806, 1.007, 0.819),
        2: (0.265, 0.214, 0.173, 0.188, 0.219, 0.242, 0.254, 0.259, 0.201, 0.246),
        3: (0.013, 0.015, 0.048, 0.087, 0.109, 0.118, 0.121, 0.123, 0.098, 0.119),
        4: (1.19e-04, 0.006, 0.024, 0.041, 0.050, 0.059, 0.065, 0.073, 0.043, 0.062),
        5: (1.81e-07, 0.004, 0.016, 0.029, 0.041, 0.051, 0.058, 0.062, 0.026, 0.051),
        6: (2.57e-10, 0.003, 0.014, 0.028, 0.040, 0.048, 0.054, 0.059, 0.020, 0.047),
        7: (2.50e-12, 0.002, 0.014, 0.027, 0.040, 0.047, 0.052, 0.059, 0.018, 0.046),
    },
    "full": {
        1: (1.768, 1.640, 1.397, 1.176, 1.016, 0.907, 0.842, 0.806, 1.008, 0.820),
        2: (0.264, 0.215, 0.173, 0.188, 0.220, 0.245, 0.259, 0.263, 0.202, 0.276),
        3: (0.012, 0.015, 0.049, 0.075, 0.101, 0.117, 0.124, 0.127, 0.076, 0.113),
        4: (1.63e-04, 0.005, 0.021, 0.038, 0.052, 0.065, 0.068, 0.076, 0.032, 0.061),
        5: (1.79e-07, 0.002, 0.015, 0.026, 0.038, 0.048, 0.059, 0.065, 0.016, 0.048),
        6: (2.71e-10, 0.002, 0.014, 0.025, 0.036, 0.044, 0.052, 0.059, 0.011, 0.043),
        7: (2.50e-12, 0.002, 0.010, 0.025, 0.035, 0.047, 0.050, 0.057, 0.010, 0.035),
    },
}
PAPER_BASELINES = {
    "ConstRR": (0, 0.009, 0.066, 0.161, 0.265, 0.365, 0.454, 0.530, 0.222, 0.422),
    "AdaRR": (0, 0.003, 0.016, 0.034, 0.053, 0.068, 0.081, 0.092, 0.051, 0.084),
    "TunedRR": (0, 0.002, 0.010, 0.023, 0.037, 0.049, 0.060, 0.068, 0.021, 0.054),
}


class Table1Error(RuntimeError):
    """Bad input to the Table 1 command, said in words (no finished result is lost)."""


def _per_depth(value, depth: int):
    if isinstance(value, dict):
        return value[str(depth)] if str(depth) in value else value[depth]
    return value


def _by_variant(value) -> bool:
    """Whether a dict setting is keyed by variant (the same for every depth) rather than by depth."""
    return isinstance(value, dict) and bool(value) and all(key in NESTED for key in value)


def _nested_rates(value) -> dict:
    """``{variant: rate}`` of the nested variants that do not train at the unclipped rate."""
    if value is None:
        return {}
    if isinstance(value, dict) and all(variant in NESTED[1:] and not isinstance(rate, bool)
                                       and isinstance(rate, (int, float)) and 0 < rate < math.inf
                                       for variant, rate in value.items()):
        return dict(value)
    raise Table1Error(f"nested_learning_rate takes None or a dict from 'diag' or 'full' to a positive rate "
                      f"(per depth), e.g. {{'full': 1e-5}}; got {value!r}")


def _nested_variants(value) -> tuple:
    """The variants that start from their smaller variant: ``True`` means Diag and Full, ``False`` none."""
    if isinstance(value, bool):
        return ("diag", "full") if value else ()
    if isinstance(value, (list, tuple)) and all(variant in ("diag", "full") for variant in value):
        return tuple(variant for variant in ("diag", "full") if variant in value)
    raise Table1Error(f"nested_init takes True, False or a list of the variants that start from the smaller "
                      f"one ('diag' from GD++, 'full' from Diag); got {value!r}")


@dataclass(frozen=True)
class Deepening:
    """Extra candidates of a depth that start from the trained model one layer shallower.

    For every variant in ``variants`` and every cell, one candidate per entry of ``positions``: the
    cell's model of one layer less (its first seed) with a layer inserted before layer ``position`` that
    passes the tokens through (:func:`~icl_course.models.deepen`), so training starts from that model's
    loss rather than from scratch.  Each trains ``steps`` clipped steps (warm-up, then the budget's
    schedule from ``learning_rate``) and then the depth's unclipped phase, and competes with the cell's
    other candidates on the tuning sample.  A variant that nests from a deepened one (``nested_init``)
    gets one candidate per deepened model too.  Named ``{variant}-L{depth}-{column}-s{seed}-d{position}``.

    ``start="selected"`` starts instead from the shallower cell's selected candidate, picked before the
    deeper stacks train, on the tuning tasks and by the rule the evaluation uses (so it is the model the
    table reports one row up; the name keeps the first seed, the checkpoint's ``deepened_from`` says which
    model it was); the choice is saved under ``selections/``.
    """

    variants: tuple = ("diag",)
    positions: tuple = (0, 1)
    steps: int = 2000
    learning_rate: float = 1e-3
    warmup_steps: int = 100
    start: str = "seed"


def _deepening_dict(value) -> Optional[dict]:
    if not isinstance(value, Deepening):
        return value
    data = {key: list(item) if isinstance(item, tuple) else item for key, item in asdict(value).items()}
    if data["start"] == "seed":   # runs made before the setting existed keep their configuration
        del data["start"]
    return data


@dataclass(frozen=True)
class Budget:
    """How much training and evaluation a run of the table gets.

    Per-depth settings are dicts ``{depth: value}`` (or one value for all depths).
    """

    name: str
    depths: tuple
    steps: object                 # optimiser steps per model
    learning_rate: object         # Adam's base rate
    batch_size: int = 2048
    seeds: object = (0,)          # model seeds per cell; the best on the tuning sample is kept
    warmup_steps: object = 0
    schedule: str = "cosine"
    final_fraction: float = 0.0   # the cosine ends at this fraction of the base rate
    clip_norm: Optional[float] = 1.0
    dtype: object = "float32"
    init_from_shallower: bool = True
    unclipped_steps: object = 0   # a last phase without clipping or the spike rule, for heavy tails ...
    unclipped_learning_rate: float = 1e-4   # ... at this constant rate (benchmarks/README.md)
    nested_init: object = False   # True: Diag starts from the trained GD++ of its cell, Full from Diag (unclipped
    #                               only); or the variants that do, e.g. ("full",) keeps a clipped Diag
    nested_learning_rate: object = None   # the nested variants' constant rate, e.g. {"full": 1e-5}; a variant
    #                                       left out (or None) trains at unclipped_learning_rate
    deepen: object = None         # a Deepening: more candidates, started from the model one layer shallower
    tuning_tasks: int = 100_000   # tunes the baselines and picks the best candidate of a cell of 1-2 layers ...
    eval_tasks: int = 100_000     # scores everything, for columns whose models are all shallower than 3
    eval_tasks_deep: int = 1_000_000   # ... and for columns with a model of 3 layers or more, whose cells also
    #                                    pick their candidate on this many tuning tasks (heavy tails)
    chunk_size: int = 50_000
    checkpoint_every: int = 1000
    description: str = ""

    def settings(self, depth: int) -> dict:
        return {"steps": int(_per_depth(self.steps, depth)),
                "learning_rate": float(_per_depth(self.learning_rate, depth)),
                "warmup_steps": int(_per_depth(self.warmup_steps, depth)),
                "dtype": str(_per_depth(self.dtype, depth)),
                "unclipped_steps": int(_per_depth(self.unclipped_steps, depth)),
                "nested_init": _nested_variants(_per_depth(self.nested_init, depth)),
                "nested_learning_rate": _nested_rates(self.nested_learning_rate if _by_variant(
                    self.nested_learning_rate) else _per_depth(self.nested_learning_rate, depth)),
                "deepen": _per_depth(self.deepen, depth)}

    def seeds_at(self, depth: int) -> tuple:
        """The seeds trained for every cell of ``depth``."""
        return tuple(_per_depth(self.seeds, depth))

    def as_dict(self) -> dict:
        data = asdict(self)
        for key in ("steps", "learning_rate", "warmup_steps", "dtype", "seeds", "unclipped_steps", "nested_init"):
            if isinstance(data[key], dict):
                data[key] = {str(depth): value for depth, value in data[key].items()}
        if isinstance(data["nested_init"], dict):
            data["nested_init"] = {depth: list(value) if isinstance(value, (list, tuple)) else value
                                   for depth, value in data["nested_init"].items()}
        elif isinstance(data["nested_init"], (list, tuple)):
            data["nested_init"] = list(data["nested_init"])
        # runs made before these settings existed keep their configuration
        if self.nested_learning_rate is None:
            del data["nested_learning_rate"]
        elif isinstance(self.nested_learning_rate, dict):
            data["nested_learning_rate"] = {str(depth): value for depth, value in self.nested_learning_rate.items()}
        if self.deepen is None:
            del data["deepen"]
        else:
            data["deepen"] = ({str(depth): _deepening_dict(value) for depth, value in self.deepen.items()}
                              if isinstance(self.deepen, dict) else _deepening_dict(self.deepen))
        data["depths"] = list(self.depths)
        data["seeds"] = ({depth: list(seeds) for depth, seeds in data["seeds"].items()}
                         if isinstance(data["seeds"], dict) else list(self.seeds))
        return data


BUDGETS = {
    "quick": Budget(
        "quick", depths=(1, 2, 3), steps={1: 150, 2: 300, 3: 300}, learning_rate=1e-2, batch_size=256,
        warmup_steps=20, tuning_tasks=4000, eval_tasks=20_000, eval_tasks_deep=20_000, chunk_size=20_000,
        checkpoint_every=100,
        description="a pipeline check for CI (minutes): small batches, few steps, 20 000 evaluation tasks"),
    "cpu": Budget(
        # 4 layers train only from the 3-layer models the table keeps: GD++ and Diag with a pass-through layer
        # (before layer 0 or 2), Full nested from that Diag; no seed trains from random weights there
        "cpu", depths=(1, 2, 3, 4), steps={1: 1000, 2: 3000, 3: 5000, 4: 5000},
        learning_rate={1: 1e-2, 2: 1e-2, 3: 5e-3, 4: 5e-3}, seeds={1: (0,), 2: (0, 1), 3: (0, 1), 4: ()},
        batch_size=512, warmup_steps={1: 50, 2: 200, 3: 500, 4: 500}, final_fraction=0.01, dtype="float32",
        init_from_shallower=False, unclipped_steps={1: 0, 2: 2000, 3: 3000, 4: 3000}, unclipped_learning_rate=1e-4,
        nested_init={1: False, 2: ("full",), 3: True, 4: ("full",)},
        nested_learning_rate={1: None, 2: None, 3: {"full": 1e-5}, 4: {"full": 1e-5}},
        deepen={1: None, 2: None, 3: Deepening(),
                4: Deepening(variants=("gdpp", "diag"), positions=(0, 2), start="selected")},
        tuning_tasks=100_000, eval_tasks=100_000, eval_tasks_deep=1_000_000, chunk_size=10_000, checkpoint_every=500,
        description="depths 1-4 on a 2-core CPU in under an hour, the recipe of benchmarks/README.md"),
    "gpu": Budget(
        "gpu", depths=(1, 2, 3, 4, 5, 6, 7), seeds=(0, 1),
        steps={1: 2000, 2: 6000, 3: 12000, 4: 12000, 5: 12000, 6: 12000, 7: 12000},
        learning_rate={1: 1e-2, 2: 5e-3, 3: 2e-3, 4: 1e-3, 5: 1e-3, 6: 1e-3, 7: 1e-3},
        batch_size=2048, warmup_steps={1: 50, 2: 200, 3: 500, 4: 500, 5: 500, 6: 500, 7: 500},
        final_fraction=0.01, dtype={1: "float32", 2: "float32", 3: "float64", 4: "float64", 5: "float64",
                                    6: "float64", 7: "float64"},
        tuning_tasks=100_000, eval_tasks=100_000, eval_tasks_deep=1_000_000, checkpoint_every=1000,
        description="the whole table on one GPU in minutes: our recipe (benchmarks/README.md)"),
    "paper": Budget(
        "paper", depths=(1, 2, 3, 4, 5, 6, 7), seeds=(0, 1, 2, 3, 4), steps=200_000, learning_rate=1e-4,
        batch_size=2048, schedule="constant", clip_norm=None, init_from_shallower=False,
        tuning_tasks=100_000, eval_tasks=100_000, eval_tasks_deep=1_000_000, checkpoint_every=5000,
        description="the paper's budget (Adam, lr 1e-4, batch 2048, 200 000 steps, best of 5 seeds) for a GPU"),
}


def _model_name(variant: str, depth: int, column: str, seed: int) -> str:
    return f"{variant}-L{depth}-{COLUMN_IDS[COLUMNS.index(column)]}-s{seed}"


def _cell_name(variant: str, depth: int) -> str:
    return f"{VARIANTS[variant]} {depth} layer{'s' if depth > 1 else ''}"


# ----------------------------------------------------------------------------- files


def _write_text(path: Path, text: str) -> None:
    temporary = path.with_name(path.name + ".tmp")
    try:
        temporary.write_text(text)
        os.replace(temporary, path)
    except OSError as error:
        if temporary.exists():
            temporary.unlink()
        raise Table1Error(f"could not write {path} ({error.strerror or error}); finished models and columns "
                          f"under {path.parent} are kept. Free some disk space and run the same command "
                          "again to resume.") from None


def _write_json(path: Path, data) -> None:
    _write_text(path, json.dumps(data, indent=1, sort_keys=False) + "\n")


def _settings_of(config) -> object:
    """A run's configuration without the budget's description: words, which a later version may change
    without changing what the run trains, so they must not make its folder refuse to resume."""
    if isinstance(config, dict) and isinstance(config.get("budget"), dict):
        budget = {key: value for key, value in config["budget"].items() if key != "description"}
        return dict(config, budget=budget)
    return config


def _prepare_out(out: Path, config: dict) -> None:
    if out.exists() and not out.is_dir():
        raise Table1Error(f"--out {out} is a file; pass a folder (it will be created if missing)")
    try:
        out.mkdir(parents=True, exist_ok=True)
        for sub in ("models", "evaluation", "sweeps"):
            (out / sub).mkdir(exist_ok=True)
    except OSError as error:
        raise Table1Error(f"could not create the folder {out} ({error.strerror or error})") from None
    saved_path = out / "config.json"
    if saved_path.exists():
        try:
            saved = json.loads(saved_path.read_text())
        except (OSError, ValueError):
            raise Table1Error(f"{saved_path} is unreadable; this folder was not made by `icl-course table1` "
                              "or is damaged. Pass a new --out.") from None
        if _settings_of(saved) != _settings_of(config):
            saved, config = _settings_of(saved), _settings_of(config)
            differ = sorted(key for key in set(saved) | set(config) if saved.get(key) != config.get(key))
            raise Table1Error(
                f"{out} holds a Table 1 run of another configuration (it differs in: {', '.join(differ)}; "
                f"that run used budget {saved.get('budget', {}).get('name')!r}). Pass a new --out, or delete "
                f"{out} to start over.")
    else:
        if any((out / "models").iterdir()):
            raise Table1Error(f"{out}/models holds checkpoints but no config.json; pass a new --out")
        _write_json(saved_path, config)


# ----------------------------------------------------------------------------- training


def _load_trained(path: Path, variant: str, depth: int, key: dict) -> tuple[LinearTransformer, dict]:
    checkpoint = load_checkpoint(path, device="cpu", num_layers=depth, parameterization=variant)
    saved = checkpoint.metadata.get("spec")
    if saved is not None and saved != key:
        raise CheckpointError(f"{path} was trained with another configuration ({saved} instead of {key}); "
                              "delete it, or pass a new --out")
    return checkpoint.model, checkpoint.metadata


def _grown(model: LinearTransformer, seed: int, init_scale: float = 0.02) -> LinearTransformer:
    """``model`` with one more layer, freshly initialised, appended at the end."""
    config = model.config
    deeper = LinearTransformer(config["d"], config["num_layers"] + 1, config["num_heads"], config["parameterization"],
                               init_scale, seed=seed, dtype=torch.float64, device="cpu")
    with torch.no_grad():
        for source, target in zip(model.layers, deeper.layers):
            for name, value in source.named_parameters():
                getattr(target, name).copy_(value.double())
    return deeper


def _train_all(out: Path, budget: Budget, variants, columns, device, progress, log) -> dict:
    """Train every model not yet on disk; returns {model name: info dict}.

    A depth with ``unclipped_steps`` trains in two phases: the clipped phase writes
    ``models/NAME.clipped.pt``, and the unclipped phase continues from it into ``models/NAME.pt``.
    Either phase resumes from its own sweep checkpoint.
    """
    infos = {}
    stacks = [(depth, variant) for depth in budget.depths for variant in variants]
    # a budget changed from a named one (or made by hand) cannot be rerun by its name alone
    command = f"icl-course table1 --budget {budget.name}" if BUDGETS.get(budget.name) == budget \
        else f"run_table1 with the budget {budget.name!r} recorded in config.json"

    def clipped_steps(depth, variant):
        """The clipped phase the bar counts: none for a stack that starts from its smaller variant."""
        settings = budget.settings(depth)
        position = NESTED.index(variant)
        widened = variant in settings["nested_init"] and NESTED[position - 1] in variants
        deepening = settings["deepen"]
        deepened = deepening.steps if deepening is not None and variant in deepening.variants \
            and depth - 1 in budget.depths else 0
        return max(0 if widened or not budget.seeds_at(depth) else settings["steps"], deepened)

    total = sum(clipped_steps(depth, variant) + budget.settings(depth)["unclipped_steps"] for depth, variant in stacks)
    bar = None
    if progress:
        from tqdm.auto import tqdm
        bar = tqdm(total=total, desc="Table 1", dynamic_ncols=True, unit="step")

    def train_stack(specs, paths, depth, variant, settings, phase, finish):
        """One sweep: ``specs`` trained as one stack; ``finish(result, spec)`` writes each model that leaves."""
        unclipped = phase == "unclipped"
        label = f"{VARIANTS[variant]} L={depth}{', unclipped' if unclipped else ''}"
        started = time.perf_counter()
        sweep_file = out / "sweeps" / f"{variant}-L{depth}{'-unclipped' if unclipped else ''}.pt"
        last = [0]

        def saved(result):
            try:
                finish(result, next(spec for spec in specs if spec.name == result.name))
            except OSError as error:
                raise Table1Error(f"could not write {paths[result.name]} ({error.strerror or error}); "
                                  "finished models are kept. Free some disk space and rerun to resume.") from None

        def report(step, losses):
            if bar is not None:
                bar.update(step - last[0])
                last[0] = step
                shown = " ".join(f"{value:.3g}" for value in list(losses.values())[:5])
                bar.set_postfix_str(f"{label}, {len(losses)} in flight, loss {shown}")

        # a sweep checkpoint written for another selection of models is stale: start that stack over
        try:
            train_sweep(specs, d=D, n=N, num_layers=depth, parameterization=variant,
                        batch_size=budget.batch_size, clip_norm=None if unclipped else budget.clip_norm,
                        spike_factor=math.inf if unclipped else 100.0,
                        final_fraction=budget.final_fraction, dtype=settings["dtype"], device=device,
                        seed=1000 * depth + sorted(VARIANTS).index(variant) + (500 if unclipped else 0),
                        checkpoint=sweep_file, checkpoint_every=budget.checkpoint_every,
                        log_every=50, progress=report, on_leave=saved)
        except OSError as error:
            raise Table1Error(f"could not write the sweep checkpoint {sweep_file} "
                              f"({error.strerror or error}); finished models are kept. Free some disk "
                              "space and rerun to resume.") from None
        if sweep_file.exists():
            sweep_file.unlink()
        log(f"trained {label}: {len(specs)} models in {time.perf_counter() - started:.0f} s")
        return last[0]

    def deepened_tags(depth, variant) -> dict:
        """``{name suffix: position}`` of the deepened candidates of ``variant`` at ``depth`` (position None:
        nested from a deepened smaller variant)."""
        deepening = budget.settings(depth)["deepen"]
        if deepening is None or depth - 1 not in budget.depths:
            return {}
        if variant in deepening.variants:
            return {f"-d{position}": position for position in deepening.positions}
        position = NESTED.index(variant)
        if position and variant in budget.settings(depth)["nested_init"] and NESTED[position - 1] in variants:
            return {tag: None for tag in deepened_tags(depth, NESTED[position - 1])}
        return {}

    def finished(name):
        return name in infos and infos[name]["status"] == "finished"

    def select_shallower(variant, depth, column):
        """The candidate the cell (variant, depth, column) keeps: the start of a deeper model."""
        candidates = [name for name, info in infos.items()
                      if (info["variant"], info["depth"], info["column"]) == (variant, depth, column)]
        return _cell_choice(out, budget, column, f"{variant}-L{depth}", candidates, infos, device)[0]

    try:
        for depth, variant in stacks:
            settings = budget.settings(depth)
            two_phases = settings["unclipped_steps"] > 0
            specs, paths, first_paths, spec_columns, nested, deepened, widened_from = [], {}, {}, {}, {}, {}, {}
            tags = deepened_tags(depth, variant)
            entries = [(seed, "") for seed in budget.seeds_at(depth)]
            if tags:
                entries += [(budget.seeds_at(depth - 1)[0], tag) for tag in tags]
            for column in columns:
                for seed, tag in entries:
                    name = _model_name(variant, depth, column, seed) + tag
                    spec_columns[name] = column
                    paths[name] = out / "models" / f"{name}.pt"
                    first_paths[name] = out / "models" / f"{name}.clipped.pt" if two_phases else paths[name]
                    position = NESTED.index(variant)
                    source = _model_name(NESTED[position - 1], depth, column, seed) + tag if position else None
                    if tags.get(tag) is not None:
                        # the shallower model's function with a pass-through layer, then both phases
                        shallower = _model_name(variant, depth - 1, column, seed)
                        if settings["deepen"].start == "selected":
                            shallower = select_shallower(variant, depth - 1, column)
                        if not finished(shallower):
                            log(f"{name} is not trained: its start, {shallower}, did not finish")
                            continue
                        deepening = settings["deepen"]
                        deepened[name] = f"{shallower}, a new layer before layer {tags[tag]}"
                        specs.append(ModelSpec(name, column_noise(column), seed=seed, num_steps=deepening.steps,
                                               learning_rate=deepening.learning_rate,
                                               warmup_steps=deepening.warmup_steps, schedule=budget.schedule,
                                               init=deepen(infos[shallower]["model"], tags[tag])))
                        continue
                    if variant in settings["nested_init"] and finished(source):
                        # the smaller model's function, then only the unclipped phase (benchmarks/README.md)
                        nested[name] = ModelSpec(name, column_noise(column), seed=seed,
                                                 num_steps=settings["unclipped_steps"],
                                                 learning_rate=settings["nested_learning_rate"].get(
                                                     variant, budget.unclipped_learning_rate),
                                                 schedule="constant",
                                                 init=widen(infos[source]["model"], variant))
                        widened_from[name] = source
                        specs.append(nested[name])
                        continue
                    if tag:     # the deepened model it would start from is missing
                        continue
                    init = None
                    shallower = _model_name(variant, depth - 1, column, seed)
                    if budget.init_from_shallower and depth > 1 and shallower in infos \
                            and infos[shallower]["status"] == "finished":
                        init = _grown(infos[shallower]["model"], seed)
                    specs.append(ModelSpec(name, column_noise(column), seed=seed, num_steps=settings["steps"],
                                           learning_rate=settings["learning_rate"],
                                           warmup_steps=settings["warmup_steps"], schedule=budget.schedule,
                                           init=init))

            def metadata_of(result, spec):
                return {"spec": spec.key(), "status": result.status, "steps": result.steps,
                        "final_loss": result.final_loss, "wall_time": result.wall_time,
                        "skipped_steps": result.skipped_steps, "message": result.message,
                        "budget": budget.name, "device": str(device), "dtype": settings["dtype"],
                        "command": command, "history": result.history}

            def finish_clipped(result, spec, deepened=deepened):
                metadata = metadata_of(result, spec)
                if result.name in deepened:
                    metadata["deepened_from"] = deepened[result.name]
                save_checkpoint(first_paths[result.name], result.model, metadata=metadata)

            missing = [spec for spec in specs if spec.name not in nested and not paths[spec.name].exists()
                       and not first_paths[spec.name].exists()]
            done = train_stack(missing, first_paths, depth, variant, settings, "clipped", finish_clipped) \
                if missing else 0
            if bar is not None:
                bar.update(max(0, clipped_steps(depth, variant) - done))
            if two_phases:
                first = {spec.name: _load_trained(first_paths[spec.name], variant, depth, spec.key())
                         for spec in specs if spec.name not in nested and not paths[spec.name].exists()}
                second = [spec for spec in specs if spec.name in nested and not paths[spec.name].exists()]
                for spec in specs:
                    if spec.name not in first:
                        continue
                    model, metadata = first[spec.name]
                    if metadata["status"] != "finished":   # nothing to polish: it goes on as it is
                        save_checkpoint(paths[spec.name], model, metadata=metadata)
                        continue
                    second.append(ModelSpec(spec.name, spec.noise, seed=spec.seed,
                                            num_steps=settings["unclipped_steps"],
                                            learning_rate=budget.unclipped_learning_rate, schedule="constant",
                                            init=model))

                def finish_unclipped(result, spec, first=first, nested=nested, widened_from=widened_from):
                    if result.name in nested:
                        metadata = dict(metadata_of(result, spec), widened_from=widened_from[result.name])
                        save_checkpoint(paths[result.name], result.model, metadata=metadata)
                        return
                    metadata = dict(first[result.name][1])
                    offset = metadata["steps"]
                    metadata.update(
                        status=result.status, steps=offset + result.steps, final_loss=result.final_loss,
                        wall_time=metadata["wall_time"] + result.wall_time, message=result.message,
                        unclipped={"steps": result.steps, "learning_rate": budget.unclipped_learning_rate,
                                   "clipped_final_loss": metadata["final_loss"]},
                        history=metadata["history"] + [[offset + step, value] for step, value in result.history])
                    save_checkpoint(paths[result.name], result.model, metadata=metadata)

                done = train_stack(second, paths, depth, variant, settings, "unclipped", finish_unclipped) \
                    if second else 0
                if bar is not None:
                    bar.update(settings["unclipped_steps"] - done)
            for spec in specs:
                model, metadata = _load_trained(paths[spec.name], variant, depth, spec.key())
                infos[spec.name] = {"model": model, "status": metadata["status"], "metadata": metadata,
                                    "path": paths[spec.name], "variant": variant, "depth": depth,
                                    "column": spec_columns[spec.name], "seed": spec.seed}
    finally:
        if bar is not None:
            bar.close()
    return infos


# ----------------------------------------------------------------------------- evaluation


def _pick_candidate(scores: dict, deep: bool) -> str:
    """The candidate of a cell with the lowest mean on the tuning sample (``scores``: name -> Estimate).

    For a deep cell, scored on a million tasks, only among the candidates whose standard error is at most
    1% of their mean, if there are any: a larger one is the mark of a heavy tail, whose mean that many
    tasks do not pin down (a few tasks in a million carry it).  A mean that is not finite never wins.
    """
    if deep:
        light = {name: score for name, score in scores.items() if score.stderr <= 0.01 * abs(score.mean)}
        scores = light or scores
    means = {name: (score.mean if math.isfinite(score.mean) else math.inf) for name, score in scores.items()}
    return min(means, key=means.get)


def _cell_choice(out: Path, budget: Budget, column: str, cell: str, candidates: list, infos: dict,
                 device) -> tuple:
    """The candidate a cell keeps and ``{name: [mean, stderr, tasks]}``, the tuning scores it was picked by.

    Every candidate is scored on the column's tuning tasks (a cell of 3 layers or more on ``eval_tasks_deep``
    of them: a deep model's mean can hang on one task in a million) and :func:`_pick_candidate` chooses.  The
    choice is saved in ``selections/`` and read back while the candidates stay the same: a deeper model
    that starts from it and the evaluation see the same one.
    """
    usable = [name for name in candidates if infos[name]["status"] == "finished"] or candidates
    if len(usable) == 1:
        return usable[0], {}
    path = out / "selections" / f"{cell}-{COLUMN_IDS[COLUMNS.index(column)]}.json"
    if path.exists():
        saved = json.loads(path.read_text())
        if saved.get("candidates") == usable:
            return saved["selected"], saved["scores"]
    models = {name: infos[name]["model"].to(device) for name in usable}
    deep_cell = infos[usable[0]]["depth"] >= 3
    sampler = RegressionTasks(D, N, column_noise(column), dtype=torch.float64, device=device)
    scores = adjusted_losses(models, sampler, chunk_size=budget.chunk_size, seed=700 + COLUMNS.index(column),
                             num_tasks=max(budget.tuning_tasks, budget.eval_tasks_deep) if deep_cell
                             else budget.tuning_tasks)
    chosen = _pick_candidate(scores, deep_cell)
    scores = {name: [score.mean, score.stderr, score.num_tasks] for name, score in scores.items()}
    path.parent.mkdir(parents=True, exist_ok=True)
    _write_json(path, {"cell": cell, "column": column, "candidates": usable, "selected": chosen, "scores": scores})
    return chosen, scores


def _evaluate_column(out: Path, budget: Budget, column: str, cells: dict, infos: dict, device, log) -> dict:
    """Tune the baselines, pick each cell's best seed, score everything paired with the oracle."""
    index = COLUMNS.index(column)
    path = out / "evaluation" / f"{COLUMN_IDS[index]}.json"
    names = {cell: [name for name in cell_models] for cell, cell_models in cells.items()}
    if path.exists():
        saved = json.loads(path.read_text())
        if saved.get("candidates") == names:
            return saved
    started = time.perf_counter()
    noise = column_noise(column)
    tuning_sampler = RegressionTasks(D, N, noise, dtype=torch.float64, device="cpu")
    tuning = tuning_sampler.sample(budget.tuning_tasks, seed=500 + index)
    constant, tuned = ConstRR().fit(tuning), TunedRR().fit(tuning)
    sampler = RegressionTasks(D, N, noise, dtype=torch.float64, device=device)
    selection, tuning_scores = {}, {}
    for cell, candidates in names.items():
        selection[cell], scores = _cell_choice(out, budget, column, cell, candidates, infos, device)
        tuning_scores.update(scores)
    predictors = {"ConstRR": constant, "AdaRR": AdaRR(), "TunedRR": tuned}
    predictors.update({cell: infos[name]["model"].to(device) for cell, name in selection.items()})
    deep = any(infos[name]["depth"] >= 3 for name in selection.values())
    num_tasks = budget.eval_tasks_deep if deep else budget.eval_tasks
    scores = adjusted_losses(predictors, sampler, num_tasks=num_tasks, chunk_size=budget.chunk_size,
                             seed=900 + index)
    for name in selection.values():
        infos[name]["model"].to("cpu")
    result = {"column": column, "candidates": names, "selected": selection, "tuning_scores": tuning_scores,
              "scores": {name: [score.mean, score.stderr, score.num_tasks] for name, score in scores.items()},
              "baselines": {"ConstRR": constant.ridge_lambda, "TunedRR": [tuned.factor, tuned.cap]},
              "device": str(device), "seconds": time.perf_counter() - started}
    _write_json(path, result)
    log(f"scored column {column} on {num_tasks} tasks in {result['seconds']:.0f} s")
    return result


# ----------------------------------------------------------------------------- outputs


def _rows(budget: Budget, variants, columns, evaluations: dict, infos: dict, out: Path) -> list[dict]:
    rows = []
    for column in columns:
        evaluation = evaluations[column]
        index = COLUMNS.index(column)
        for cell, selected in evaluation["selected"].items():
            info = infos[selected]
            mean, stderr, num_tasks = evaluation["scores"][cell]
            paper = PAPER[info["variant"]][info["depth"]][index]
            metadata = info["metadata"]
            rows.append({"model": VARIANTS[info["variant"]], "variant": info["variant"], "depth": info["depth"],
                         "column": column, "noise": column_noise(column).label, "adjusted_loss": mean,
                         "stderr": stderr, "num_tasks": num_tasks, "paper": paper, "budget": budget.name,
                         "seed": info["seed"], "steps": metadata["steps"], "status": metadata["status"],
                         "wall_time_s": round(metadata["wall_time"], 2), "device": metadata["device"],
                         "dtype": metadata["dtype"],
                         "checkpoint": str(Path(info["path"]).relative_to(out))})
        for name in BASELINES:
            mean, stderr, num_tasks = evaluation["scores"][name]
            rows.append({"model": name, "variant": name, "depth": None, "column": column,
                         "noise": column_noise(column).label, "adjusted_loss": mean, "stderr": stderr,
                         "num_tasks": num_tasks, "paper": PAPER_BASELINES[name][index], "budget": budget.name,
                         "seed": None, "steps": None, "status": "closed form", "wall_time_s": None,
                         "device": evaluation["device"], "dtype": "float64", "checkpoint": None})
    return rows


def _format(value: float) -> str:
    if value == 0:
        return "0"
    if abs(value) < 1e-3 or abs(value) >= 1e4:   # heavy-tailed cells reach 1e44: keep them one word wide
        return f"{value:.2e}"
    return f"{value:.3f}"


def markdown_table(rows: Sequence[dict]) -> str:
    """Our adjusted losses beside the paper's: one row per model, ``ours ± stderr (paper)`` per column."""
    columns = [column for column in COLUMNS if any(row["column"] == column for row in rows)]
    keys = []
    for row in rows:
        key = (row["variant"], row["depth"])
        if key not in keys:
            keys.append(key)
    keys.sort(key=lambda key: (key[1] is None, key[1] or 0, list(VARIANTS).index(key[0]) if key[0] in VARIANTS
                               else BASELINES.index(key[0])))
    lines = ["| model | " + " | ".join(columns) + " |", "| --- |" + " --- |" * len(columns)]
    for variant, depth in keys:
        label = _cell_name(variant, depth) if depth is not None else variant
        cells = []
        for column in columns:
            row = next((row for row in rows if (row["variant"], row["depth"], row["column"])
                        == (variant, depth, column)), None)
            if row is None:
                cells.append("")
                continue
            mark = "" if row["status"] in ("finished", "closed form") else " (diverged)"
            cells.append(f"{_format(row['adjusted_loss'])} ± {_format(row['stderr'])} "
                         f"({_format(row['paper'])}){mark}")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def plot_table1(rows: Sequence[dict], path=None):
    """Adjusted loss against depth per model (ours solid, the paper's dashed), baselines as horizontal lines."""
    import matplotlib
    if path is not None:
        matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    from .plots import COLORS

    columns = [column for column in COLUMNS if any(row["column"] == column for row in rows)]
    figure, axes = plt.subplots(2, math.ceil(len(columns) / 2), figsize=(3.2 * math.ceil(len(columns) / 2), 6),
                                squeeze=False, sharex=True)
    colors = {variant: COLORS[name] for variant, name in VARIANTS.items()}
    for ax, column in zip(axes.flat, columns):
        for variant in VARIANTS:
            mine = sorted((row for row in rows if row["variant"] == variant and row["column"] == column),
                          key=lambda row: row["depth"])
            if not mine:
                continue
            depths = [row["depth"] for row in mine]
            ax.errorbar(depths, [max(row["adjusted_loss"], 1e-13) for row in mine],
                        yerr=[row["stderr"] for row in mine], color=colors[variant], marker="o", ms=3,
                        label=f"{VARIANTS[variant]} (ours)")
            paper = [PAPER[variant][depth][COLUMNS.index(column)] for depth in range(1, 8)]
            ax.plot(range(1, 8), [max(value, 1e-13) for value in paper], color=colors[variant], ls="--", lw=0.8,
                    label=f"{VARIANTS[variant]} (paper)")
        for name in BASELINES:
            row = next((row for row in rows if row["variant"] == name and row["column"] == column), None)
            if row is not None and row["adjusted_loss"] > 0:
                ax.axhline(row["adjusted_loss"], color=COLORS.get(name), lw=1, ls=":", label=name)
        ax.set_yscale("log")
        ax.set_title(f"sigma in {column_noise(column).label}", fontsize=9)
        ax.set_xlabel("layers")
        ax.set_ylabel("adjusted loss")
    for ax in list(axes.flat)[len(columns):]:
        ax.axis("off")
    legend = {}   # from every panel: a baseline at 0 (AdaRR, TunedRR when sigma = 0) is drawn in none of some
    for ax in axes.flat:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            legend.setdefault(label, handle)
    handles, labels = list(legend.values()), list(legend)
    figure.legend(handles, labels, loc="lower center", ncol=min(len(labels), 9), fontsize=8)
    figure.tight_layout(rect=(0, 0.06, 1, 1))
    if path is not None:
        try:
            figure.savefig(path, dpi=110)
        except OSError as error:
            raise Table1Error(f"could not write {path} ({error.strerror or error})") from None
        plt.close(figure)
    return figure


def _write_outputs(out: Path, budget: Budget, config: dict, rows: list[dict], infos: dict, selected: list) -> None:
    fields = ["model", "variant", "depth", "column", "noise", "adjusted_loss", "stderr", "num_tasks", "paper",
              "budget", "seed", "steps", "status", "wall_time_s", "device", "dtype", "checkpoint"]
    _write_json(out / "results.json", {"config": config, "rows": rows})
    temporary = out / "results.csv.tmp"
    try:
        with open(temporary, "w", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=fields)
            writer.writeheader()
            writer.writerows(rows)
        os.replace(temporary, out / "results.csv")
    except OSError as error:
        raise Table1Error(f"could not write {out / 'results.csv'} ({error.strerror or error})") from None
    header = (f"# Table 1 (Vladymyrov et al. 2024), budget `{budget.name}`\n\n"
              f"Adjusted loss (ours ± standard error, the paper's in parentheses); {budget.description}.\n\n")
    _write_text(out / "table.md", header + markdown_table(rows))
    plot_table1(rows, out / "figure.png")
    bundle = {}
    for name in selected:
        info = infos[name]
        model = info["model"]
        bundle[name] = {"config": dict(model.config),
                        "state": {key: value.detach().cpu() for key, value in model.state_dict().items()},
                        "metadata": {key: value for key, value in info["metadata"].items() if key != "history"}}
    try:
        torch.save({"format": "icl-course-table1-models", "version": 1, "models": bundle}, out / "models.pt")
    except OSError as error:
        raise Table1Error(f"could not write {out / 'models.pt'} ({error.strerror or error})") from None


# ----------------------------------------------------------------------------- the command


def merge_runs(folders: Sequence, out, budget: str = "gpu") -> tuple:
    """Gather the models that separate runs trained (each on some variants or columns) into ``out``.

    ``folders`` are ``--out`` folders of ``icl-course table1`` runs of one ``budget``, for instance
    one process per variant on one GPU (``benchmarks/table1_parallel.py``).  Every depth that those
    runs finished for all variants, columns and seeds, from the shallowest on, is copied into ``out``
    (with every deepened candidate of those depths the runs finished), whose ``config.json`` then names
    exactly those depths; scoring ``out`` with the ordinary command
    and ``--depths`` of the returned tuple trains nothing and only tunes, selects and evaluates.
    Returns the depths gathered (empty if not even 1 layer was finished everywhere).
    """
    if budget not in BUDGETS:
        raise Table1Error(f"unknown budget {budget!r}; choose one of {', '.join(BUDGETS)}")
    models = {path.name: path for folder in folders for path in Path(folder).glob("models/*.pt")}
    chosen = BUDGETS[budget]
    depths = []
    for depth in chosen.depths:
        names = [f"{_model_name(v, depth, c, s)}.pt" for v in VARIANTS for c in COLUMNS for s in chosen.seeds_at(depth)]
        if not all(name in models for name in names):
            break
        depths.append(depth)
    if not depths:
        return ()
    out = Path(out)
    config = {"budget": replace(chosen, depths=tuple(depths)).as_dict(), "variants": list(VARIANTS),
              "columns": list(COLUMNS), "d": D, "n": N}
    _prepare_out(out, config)
    for depth in depths:
        seeds = chosen.seeds_at(depth)
        for name in (f"{_model_name(v, depth, c, s)}.pt" for v in VARIANTS for c in COLUMNS for s in seeds):
            shutil.copy2(models[name], out / "models" / name)
        # the deepened candidates (and those nested from them) the runs finished, so scoring does not retrain them
        for name in (f"{_model_name(v, depth, c, s)}-d" for v in VARIANTS for c in COLUMNS for s in seeds):
            for found in models:
                if found.startswith(name) and found[len(name):-len(".pt")].isdigit():
                    shutil.copy2(models[found], out / "models" / found)
    return tuple(depths)


def _check_deepening(deepening, depth: int) -> None:
    if deepening is None:
        return
    if not isinstance(deepening, Deepening):
        raise Table1Error(f"deepen takes None or a Deepening (icl_course.table1.Deepening) per depth; got "
                          f"{deepening!r} at depth {depth}")
    if depth < 2:
        raise Table1Error("deepen at depth 1: a 1-layer model has no shallower model to start from; "
                          "give depth 1 None")
    unknown = [variant for variant in deepening.variants if variant not in VARIANTS]
    if unknown or not deepening.variants:
        raise Table1Error(f"Deepening.variants must name some of {', '.join(VARIANTS)}; got {deepening.variants!r}")
    if not deepening.positions or any(isinstance(position, bool) or not isinstance(position, int)
                                      or not 0 <= position <= depth - 2 for position in deepening.positions):
        raise Table1Error(f"Deepening.positions at depth {depth} must be layer indices 0..{depth - 2} of the "
                          f"{depth - 1}-layer model (the new layer goes before that layer); "
                          f"got {deepening.positions!r}")
    for name, minimum in (("steps", 1), ("warmup_steps", 0)):
        value = getattr(deepening, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise Table1Error(f"Deepening.{name} must be an integer >= {minimum}; got {value!r}")
    rate = deepening.learning_rate
    if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not 0 < rate < math.inf:
        raise Table1Error(f"Deepening.learning_rate must be a positive number, got {rate!r}")
    if deepening.start not in ("seed", "selected"):
        raise Table1Error(f"Deepening.start is 'seed' (the shallower model of the first seed) or 'selected' (the "
                          f"shallower cell's selected candidate); got {deepening.start!r}")


def _check_candidates(budget: Budget, variants, depth: int) -> None:
    """A depth without seeds trains only deepened candidates and those nested from them: every variant needs one."""
    if budget.seeds_at(depth):
        return
    settings, started = budget.settings(depth), set()
    deepening = settings["deepen"]
    for variant in variants:
        position = NESTED.index(variant)
        if deepening is not None and variant in deepening.variants and depth - 1 in budget.depths:
            started.add(variant)
        elif variant in settings["nested_init"] and position and NESTED[position - 1] in started:
            started.add(variant)
        else:
            raise Table1Error(f"depth {depth} has no seeds, so its {VARIANTS[variant]} models must be deepened from "
                              f"depth {depth - 1} (which the run must train too) or nested from a deepened smaller "
                              f"variant; add {variant!r} to that depth's Deepening.variants, or give it seeds")


def run_table1(out, budget: str | Budget = "quick", device: str = "auto", variants: Optional[Sequence[str]] = None,
               depths: Optional[Sequence[int]] = None, columns: Optional[Sequence[str]] = None,
               progress: bool = True, verbose: bool = True, **overrides) -> list[dict]:
    """Train, tune and score Table 1 into the folder ``out``; returns the rows of ``results.json``.

    Args:
        out: the folder for everything (created; resumed when it holds a run of the same configuration).
        budget: ``"quick"``, ``"cpu"``, ``"gpu"``, ``"paper"`` or a :class:`Budget`.
        device: ``"auto"``, ``"cpu"``, ``"cuda"``, ...
        variants, depths, columns: restrict the table (default: all of the budget).
        overrides: replace fields of the budget, e.g. ``steps=20, eval_tasks=2000`` for a test.
    """
    if isinstance(budget, str):
        if budget not in BUDGETS:
            raise Table1Error(f"unknown budget {budget!r}; choose one of {', '.join(BUDGETS)}")
        budget = BUDGETS[budget]
    try:
        budget = replace(budget, **overrides)
    except TypeError as error:
        raise Table1Error(f"unknown budget setting: {error}") from None
    variants = list(variants or VARIANTS)
    for variant in variants:
        if variant not in VARIANTS:
            raise Table1Error(f"unknown variant {variant!r}; choose among {', '.join(VARIANTS)}")
    columns = list(columns or COLUMNS)
    for column in columns:
        if column not in COLUMNS:
            raise Table1Error(f"unknown column {column!r}; the columns are {', '.join(COLUMNS)}")
    # the table's own order, whatever order they were given in: a nested start needs GD++ before Diag before Full
    variants = [variant for variant in VARIANTS if variant in variants]
    columns = [column for column in COLUMNS if column in columns]
    if depths is not None:
        for depth in depths:
            if depth not in range(1, 8):
                raise Table1Error(f"depth must be 1..7, got {depth!r}")
        budget = replace(budget, depths=tuple(sorted(set(depths))))
    for depth in budget.depths:
        try:
            budget.settings(depth), budget.seeds_at(depth)
        except (KeyError, TypeError, ValueError):
            raise Table1Error(f"the budget's per-depth settings (steps, learning_rate, warmup_steps, dtype, seeds, "
                              f"unclipped_steps, nested_init, nested_learning_rate, deepen) give no value for depth "
                              f"{depth}; add it, or leave that depth out") from None
        if budget.settings(depth)["unclipped_steps"] < 0:
            raise Table1Error(f"unclipped_steps must be 0 (no unclipped phase) or more, got "
                              f"{budget.settings(depth)['unclipped_steps']} at depth {depth}")
        if budget.settings(depth)["nested_init"] and not budget.settings(depth)["unclipped_steps"]:
            nested = " and ".join(VARIANTS[variant] for variant in budget.settings(depth)["nested_init"])
            raise Table1Error(f"nested_init at depth {depth} trains {nested} only in the unclipped phase; "
                              "give that depth unclipped_steps > 0")
        _check_deepening(budget.settings(depth)["deepen"], depth)
        _check_candidates(budget, variants, depth)
    rate = budget.unclipped_learning_rate
    if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not 0 < rate < math.inf:
        raise Table1Error(f"unclipped_learning_rate must be a positive number, got {rate!r}")
    try:
        device = resolve_device(device)
    except ValueError as error:
        raise Table1Error(str(error)) from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise Table1Error("--device cuda was asked for, but torch sees no CUDA GPU; use --device auto or cpu")
    out = Path(out)
    config = {"budget": budget.as_dict(), "variants": variants, "columns": columns, "d": D, "n": N}
    _prepare_out(out, config)

    def log(message):
        if verbose:
            print(message, file=sys.stderr)

    started = time.perf_counter()
    infos = _train_all(out, budget, variants, columns, device, progress, log)
    evaluations = {}
    for column in columns:
        cells = {}
        for name, info in infos.items():
            if info["column"] == column:
                cells.setdefault(f"{info['variant']}-L{info['depth']}", []).append(name)
        evaluations[column] = _evaluate_column(out, budget, column, cells, infos, device, log)
    rows = _rows(budget, variants, columns, evaluations, infos, out)
    selected = sorted({name for evaluation in evaluations.values() for name in evaluation["selected"].values()})
    # the run's wall time: this call's plus that of the calls before it that wrote results (a call killed
    # before writing is not counted; every model's own training time is in its row)
    seconds = time.perf_counter() - started + _seconds_so_far(out)
    config_out = dict(config, device=str(device), torch=torch.__version__, python=platform.python_version(),
                      seconds=round(seconds, 1))
    _write_outputs(out, budget, config_out, rows, infos, selected)
    shutil.rmtree(out / "sweeps", ignore_errors=True)
    return rows


def _seconds_so_far(out: Path) -> float:
    """The wall time recorded by an earlier call on ``out`` (0 if it has no readable results.json)."""
    try:
        seconds = json.loads((out / "results.json").read_text())["config"]["seconds"]
    except (OSError, ValueError, KeyError, TypeError, UnicodeDecodeError):
        return 0.0
    return float(seconds) if isinstance(seconds, (int, float)) and math.isfinite(seconds) else 0.0


#: the runs shipped with the package: budget -> folder (each has a README with the command that made it)
SHIPPED = {"gpu": Path(__file__).parent / "pretrained" / "table1",
           "cpu": Path(__file__).parent / "pretrained" / "table1_cpu"}


def _shipped_or_path(path, file_name: str) -> Path:
    if path is None or path in SHIPPED:
        path = SHIPPED[path or "gpu"] / file_name
    else:
        path = Path(path)
        path = path / file_name if path.is_dir() else path
    if not path.exists():
        raise FileNotFoundError(f"no Table 1 {file_name} at {path}; pass the --out folder of an "
                                f"`icl-course table1` run, or a shipped run: {', '.join(map(repr, SHIPPED))}")
    return path


def _damaged(path: Path) -> Table1Error:
    return Table1Error(f"{path} could not be read: it is damaged or was not written by `icl-course table1`. "
                       "Run the same command again with its --out to rewrite it (finished models are kept), or "
                       "reinstall the package if it is a shipped run.")


def load_results(path=None) -> list[dict]:
    """The rows of a ``results.json``: of a run's folder or file, or of a shipped run, ``"gpu"`` (the
    default; depths 1-5) or ``"cpu"`` (depths 1-4, this package's ``cpu`` budget)."""
    path = _shipped_or_path(path, "results.json")
    try:
        return json.loads(path.read_text())["rows"]
    except (ValueError, KeyError, TypeError, UnicodeDecodeError):
        raise _damaged(path) from None


def load_table1_model(variant: str, depth: int, column: str, path=None) -> LinearTransformer:
    """The model selected for one cell of a run (``path`` as in :func:`load_results`; default: the
    shipped ``"gpu"`` run)."""
    path = _shipped_or_path(path, "models.pt")
    try:
        bundle = torch.load(path, map_location="cpu", weights_only=True)["models"]
    except Exception:   # torch raises several types for a truncated or foreign file
        raise _damaged(path) from None
    prefix = _model_name(variant, depth, column, 0).rsplit("-s", 1)[0] + "-s"
    matches = [name for name in bundle if name.startswith(prefix)]
    if not matches:
        raise KeyError(f"no {variant} model of {depth} layers for column {column} in {path}")
    entry = bundle[matches[0]]
    model = LinearTransformer(**entry["config"], device="cpu")
    model.load_state_dict(entry["state"])
    return model


def main(argv=None) -> int:
    """``icl-course table1 --budget {quick,cpu,gpu,paper} --device auto --out DIR``."""
    import argparse

    parser = argparse.ArgumentParser(
        prog="icl-course table1",
        description="Reproduce Table 1 of Vladymyrov et al. (2024): train GD++, Diag and Full linear transformers "
                    "on ten mixed-noise problems, score them against ConstRR, AdaRR and TunedRR.")
    parser.add_argument("--budget", choices=list(BUDGETS), default="quick",
                        help="; ".join(f"{name}: {budget.description}" for name, budget in BUDGETS.items()))
    parser.add_argument("--device", default="auto", help="auto (CUDA, then MPS, then CPU), cpu, cuda, ...")
    parser.add_argument("--out", required=True, help="the output folder (resumed if it holds the same run)")
    parser.add_argument("--variants", nargs="+", choices=list(VARIANTS), help="default: all three")
    parser.add_argument("--depths", nargs="+", type=int, help="default: the budget's")
    parser.add_argument("--columns", nargs="+", choices=list(COLUMNS), help="default: all ten")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    args = parser.parse_args(argv)
    try:
        rows = run_table1(args.out, args.budget, args.device, args.variants, args.depths, args.columns,
                          progress=not args.no_progress)
    except (Table1Error, CheckpointError) as error:
        print(f"icl-course table1: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"\nicl-course table1: interrupted; run the same command again to resume from {args.out}",
              file=sys.stderr)
        return 130
    print(markdown_table(rows))
    print(f"results, table and figure in {args.out}")
    return 0
