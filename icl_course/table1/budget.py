"""The budgets of a Table 1 run, checked, and the plan of each stack of models it trains.

A :class:`Budget` says how much training and evaluation a run gets (``BUDGETS`` holds the named ones:
``quick``, ``cpu``, ``gpu``, ``paper``); :func:`check_run` turns a command's arguments into a checked
budget, and :func:`plan_stack` says, without training or reading anything, which models one stack
(one variant, one depth) trains and where each starts from.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from typing import Optional, Sequence

from ..data import CategoricalNoise, UniformNoise
from ..models import NESTED
from .noiseless import NoiselessFit
from .paper import COLUMNS, VARIANTS, model_name


class Table1Error(RuntimeError):
    """Bad input to the Table 1 command, said in words (no finished result is lost)."""


def column_noise(column: str):
    """The noise law of a column label ("0".."7", "{1,3}", "{1,3,5}")."""
    if column == "{1,3}":
        return CategoricalNoise([1, 3])
    if column == "{1,3,5}":
        return CategoricalNoise([1, 3, 5])
    if column not in COLUMNS:
        raise ValueError(f"unknown column {column!r}; the columns are {', '.join(COLUMNS)}")
    return UniformNoise(int(column))


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
    gets one candidate per deepened model too, unless it nests only from the model its smaller cell keeps
    (``Budget.nest_from = "selected"``).  Named ``{variant}-L{depth}-{column}-s{seed}-d{position}``.

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

    Per-depth settings are dicts ``{depth: value}`` (or one value for all depths).  Why the named budgets
    have the settings they have (learning rates, the unclipped phase, nested and deepened starts, scoring
    deep cells on a million tasks) is in the dated entries of ``research/README.md`` in the repository,
    each with its question, command and finding.
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
    unclipped_learning_rate: float = 1e-4   # ... at this constant rate (research/README.md)
    nested_init: object = False   # True: Diag starts from the trained GD++ of its cell, Full from Diag (unclipped
    #                               only); or the variants that do, e.g. ("full",) keeps a clipped Diag
    nested_learning_rate: object = None   # the nested variants' constant rate, e.g. {"full": 1e-5}; a variant
    #                                       left out (or None) trains at unclipped_learning_rate
    nest_from: object = "each"    # "each": a nested variant starts one model from each candidate of its smaller
    #                               variant's cell; "selected": one per cell, from the model that cell keeps
    #                               (named ``...-nested``; research/README.md, the fifth entry of 2026-11-27)
    deepen: object = None         # a Deepening: more candidates, started from the model one layer shallower
    noiseless_fit: object = None  # a NoiselessFit: light-tailed GD++ fits as candidates of the noiseless column
    widened_candidates: bool = True   # a Diag (Full) cell is offered the model its GD++ (Diag) cell keeps, widened,
    #                                   and keeps it unless a trained candidate is clearly lower (select.keeps_widened)
    tuning_tasks: int = 100_000   # tunes the baselines and picks the best candidate of a cell of 1-2 layers ...
    eval_tasks: int = 100_000     # scores everything, for columns whose models are all shallower than 3
    eval_tasks_deep: int = 1_000_000   # ... and for columns with a model of 3 layers or more, whose cells also
    #                                    pick their candidate on this many tuning tasks (heavy tails)
    chunk_size: int = 50_000
    checkpoint_every: int = 1000
    description: str = ""

    def settings(self, depth: int) -> dict:
        """The per-depth settings at ``depth``, checked and in plain types (steps, rate, warm-up, dtype,
        unclipped steps, nested variants and rates, the :class:`Deepening`)."""
        return {"steps": int(_per_depth(self.steps, depth)),
                "learning_rate": float(_per_depth(self.learning_rate, depth)),
                "warmup_steps": int(_per_depth(self.warmup_steps, depth)),
                "dtype": str(_per_depth(self.dtype, depth)),
                "unclipped_steps": int(_per_depth(self.unclipped_steps, depth)),
                "nested_init": _nested_variants(_per_depth(self.nested_init, depth)),
                "nested_learning_rate": _nested_rates(self.nested_learning_rate if _by_variant(
                    self.nested_learning_rate) else _per_depth(self.nested_learning_rate, depth)),
                "deepen": _per_depth(self.deepen, depth),
                "nest_from": _per_depth(self.nest_from, depth)}

    def seeds_at(self, depth: int) -> tuple:
        """The seeds trained for every cell of ``depth``."""
        return tuple(_per_depth(self.seeds, depth))

    def as_dict(self) -> dict:
        """The budget as JSON-ready data, as a run's ``config.json`` records it."""
        data = asdict(self)
        for key in ("steps", "learning_rate", "warmup_steps", "dtype", "seeds", "unclipped_steps", "nested_init",
                    "nest_from"):
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
        if self.widened_candidates is True:   # runs made before the setting existed keep their configuration
            del data["widened_candidates"]
        if self.nest_from == "each":
            del data["nest_from"]
        if self.noiseless_fit is None:
            del data["noiseless_fit"]
        else:
            data["noiseless_fit"] = {key: list(value) if isinstance(value, tuple) else value
                                     for key, value in asdict(self.noiseless_fit).items()}
        if self.deepen is None:
            del data["deepen"]
        else:
            data["deepen"] = ({str(depth): _deepening_dict(value) for depth, value in self.deepen.items()}
                              if isinstance(self.deepen, dict) else _deepening_dict(self.deepen))
        data["depths"] = list(self.depths)
        data["seeds"] = ({depth: list(seeds) for depth, seeds in data["seeds"].items()}
                         if isinstance(data["seeds"], dict) else list(self.seeds))
        return data


#: the name ending of a model nested from the model its smaller variant's cell keeps (``Budget.nest_from``)
NESTED_FROM_KEPT = "-nested"

_DEEP = (4, 5, 6, 7)   # the depths that only deepen the shallower model the table keeps

BUDGETS = {
    "quick": Budget(
        "quick", depths=(1, 2, 3), steps={1: 150, 2: 300, 3: 300}, learning_rate=1e-2, batch_size=256,
        warmup_steps=20, tuning_tasks=4000, eval_tasks=20_000, eval_tasks_deep=20_000, chunk_size=20_000,
        checkpoint_every=100,
        description="a pipeline check for CI (minutes): small batches, few steps, 20 000 evaluation tasks"),
    "cpu": Budget(
        # from 4 layers on, no model trains from random weights: GD++ and Diag start from the model the table
        # keeps one layer shallower with a pass-through layer before its first or its last layer (deepened
        # again at every depth), and Full nests from the Diag model its cell keeps
        "cpu", depths=(1, 2, 3, 4, 5, 6, 7), steps={1: 1000, 2: 3000, 3: 5000, **dict.fromkeys(_DEEP, 5000)},
        learning_rate={1: 1e-2, 2: 1e-2, 3: 5e-3, **dict.fromkeys(_DEEP, 5e-3)},
        seeds={1: (0,), 2: (0, 1), 3: (0, 1), **dict.fromkeys(_DEEP, ())},
        batch_size=512, warmup_steps={1: 50, 2: 200, 3: 500, **dict.fromkeys(_DEEP, 500)}, final_fraction=0.01,
        dtype="float32", init_from_shallower=False,
        unclipped_steps={1: 0, 2: 2000, 3: 3000, **dict.fromkeys(_DEEP, 3000)}, unclipped_learning_rate=1e-4,
        nested_init={1: False, 2: ("full",), 3: True, **dict.fromkeys(_DEEP, ("full",))},
        nested_learning_rate={1: None, 2: None, 3: {"full": 1e-5}, **dict.fromkeys(_DEEP, {"full": 1e-5})},
        deepen={1: None, 2: None, 3: Deepening(),
                **{depth: Deepening(variants=("gdpp", "diag"), positions=(0, depth - 2), start="selected")
                   for depth in _DEEP}},
        nest_from={1: "each", 2: "each", 3: "each", **dict.fromkeys(_DEEP, "selected")},
        tuning_tasks=100_000, eval_tasks=100_000, eval_tasks_deep=1_000_000, chunk_size=10_000, checkpoint_every=500,
        noiseless_fit=NoiselessFit(),
        description="depths 1-7 on a 2-core CPU in just under three hours (resumable), the recipe of "
                    "research/README.md"),
    "gpu": Budget(
        # the cpu recipe scaled up: four times the batch, twice the steps, a third seed where seeds train
        "gpu", depths=(1, 2, 3, 4, 5, 6, 7), steps={1: 2000, 2: 6000, 3: 10000, **dict.fromkeys(_DEEP, 10000)},
        learning_rate={1: 1e-2, 2: 1e-2, 3: 5e-3, **dict.fromkeys(_DEEP, 5e-3)},
        seeds={1: (0, 1), 2: (0, 1, 2), 3: (0, 1, 2), **dict.fromkeys(_DEEP, ())},
        batch_size=2048, warmup_steps={1: 100, 2: 400, 3: 1000, **dict.fromkeys(_DEEP, 1000)}, final_fraction=0.01,
        dtype="float32", init_from_shallower=False,
        unclipped_steps={1: 0, 2: 4000, 3: 6000, **dict.fromkeys(_DEEP, 6000)}, unclipped_learning_rate=1e-4,
        nested_init={1: False, 2: ("full",), 3: True, **dict.fromkeys(_DEEP, ("full",))},
        nested_learning_rate={1: None, 2: None, 3: {"full": 1e-5}, **dict.fromkeys(_DEEP, {"full": 1e-5})},
        deepen={1: None, 2: None, 3: Deepening(steps=4000),
                **{depth: Deepening(variants=("gdpp", "diag"), positions=(0, depth - 2), steps=4000, start="selected")
                   for depth in _DEEP}},
        nest_from={1: "each", 2: "each", 3: "each", **dict.fromkeys(_DEEP, "selected")},
        tuning_tasks=100_000, eval_tasks=100_000, eval_tasks_deep=1_000_000, chunk_size=50_000, checkpoint_every=1000,
        noiseless_fit=NoiselessFit(),
        description="the cpu recipe scaled up (batch 2048, twice the steps, three seeds) for one GPU"),
    "paper": Budget(
        # the paper's own training as the seeds' candidates; from 4 layers on, every variant also gets two
        # candidates deepened from the model the table keeps one layer shallower, trained the same way, and the
        # light-tail rule picks among all of them
        "paper", depths=(1, 2, 3, 4, 5, 6, 7), seeds=(0, 1, 2, 3, 4), steps=200_000, learning_rate=1e-4,
        batch_size=2048, schedule="constant", clip_norm=None, init_from_shallower=False,
        deepen={1: None, 2: None, 3: None,
                **{depth: Deepening(variants=("gdpp", "diag", "full"), positions=(0, depth - 2), steps=50_000,
                                    learning_rate=1e-4, warmup_steps=0, start="selected") for depth in _DEEP}},
        tuning_tasks=100_000, eval_tasks=100_000, eval_tasks_deep=1_000_000, checkpoint_every=5000,
        noiseless_fit=NoiselessFit(),
        description="the paper's budget (Adam, lr 1e-4, batch 2048, 200 000 steps, best of 5 seeds) for a GPU, "
                    "with candidates deepened from the shallower model the table keeps from 4 layers on"),
}


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




def _check_depth(budget: Budget, variants, depth: int) -> None:
    try:
        settings = budget.settings(depth)
        budget.seeds_at(depth)
    except (KeyError, TypeError, ValueError):
        raise Table1Error(f"the budget's per-depth settings (steps, learning_rate, warmup_steps, dtype, seeds, "
                          f"unclipped_steps, nested_init, nested_learning_rate, deepen, nest_from) give no value "
                          f"for depth {depth}; add it, or leave that depth out") from None
    if settings["unclipped_steps"] < 0:
        raise Table1Error(f"unclipped_steps must be 0 (no unclipped phase) or more, got "
                          f"{settings['unclipped_steps']} at depth {depth}")
    if settings["nest_from"] not in ("each", "selected"):
        raise Table1Error(f"nest_from is 'each' (a nested variant starts from every candidate of its smaller variant's "
                          f"cell) or 'selected' (from the one that cell keeps), per depth; got "
                          f"{settings['nest_from']!r} at depth {depth}")
    if settings["nested_init"] and not settings["unclipped_steps"]:
        nested = " and ".join(VARIANTS[variant] for variant in settings["nested_init"])
        raise Table1Error(f"nested_init at depth {depth} trains {nested} only in the unclipped phase; "
                          "give that depth unclipped_steps > 0")
    _check_deepening(settings["deepen"], depth)
    _check_candidates(budget, variants, depth)


def check_run(budget: str | Budget, variants: Optional[Sequence[str]], depths: Optional[Sequence[int]],
              columns: Optional[Sequence[str]], overrides: dict) -> tuple[Budget, list, list]:
    """A run's budget (with ``overrides`` and ``depths`` applied), variants and columns, checked.

    Variants and columns come back in the table's own order, whatever order they were given in: a nested
    start needs GD++ before Diag before Full.  Raises :class:`Table1Error` saying what is wrong.
    """
    if isinstance(budget, str):
        if budget not in BUDGETS:
            raise Table1Error(f"unknown budget {budget!r}; choose one of {', '.join(BUDGETS)}")
        budget = BUDGETS[budget]
    try:
        budget = replace(budget, **overrides)
    except TypeError as error:
        raise Table1Error(f"unknown budget setting: {error}") from None
    for variant in variants or ():
        if variant not in VARIANTS:
            raise Table1Error(f"unknown variant {variant!r}; choose among {', '.join(VARIANTS)}")
    for column in columns or ():
        if column not in COLUMNS:
            raise Table1Error(f"unknown column {column!r}; the columns are {', '.join(COLUMNS)}")
    variants = [variant for variant in VARIANTS if variant in (variants or VARIANTS)]
    columns = [column for column in COLUMNS if column in (columns or COLUMNS)]
    if depths is not None:
        for depth in depths:
            if depth not in range(1, 8):
                raise Table1Error(f"depth must be 1..7, got {depth!r}")
        budget = replace(budget, depths=tuple(sorted(set(depths))))
    for depth in budget.depths:
        _check_depth(budget, variants, depth)
    rate = budget.unclipped_learning_rate
    if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not 0 < rate < math.inf:
        raise Table1Error(f"unclipped_learning_rate must be a positive number, got {rate!r}")
    _check_noiseless_fit(budget.noiseless_fit)
    if not isinstance(budget.widened_candidates, bool):
        raise Table1Error(f"widened_candidates takes True or False; got {budget.widened_candidates!r}")
    return budget, variants, columns


def _check_noiseless_fit(fit) -> None:
    if fit is None:
        return
    if not isinstance(fit, NoiselessFit):
        raise Table1Error(f"noiseless_fit takes None or a NoiselessFit (icl_course.table1.NoiselessFit); got {fit!r}")
    if not fit.depths or any(isinstance(depth, bool) or depth not in range(2, 8) for depth in fit.depths):
        raise Table1Error(f"NoiselessFit.depths must be depths 2..7 (each fit deepens the GD++ kept one layer "
                          f"shallower); got {fit.depths!r}")
    numbers = {"rare_weights": fit.rare_weights, "smallest": (fit.smallest,), "largest": (fit.largest,),
               "cap": (fit.cap,), "guard": (fit.guard,), "adam_learning_rate": (fit.adam_learning_rate,),
               "check_stderr": (fit.check_stderr,), "check_trimmed_gap": (fit.check_trimmed_gap,)}
    for name, values in numbers.items():
        least = 0 if name == "guard" else math.ulp(0)   # guard 0: no guard grid
        if not values or any(isinstance(value, bool) or not isinstance(value, (int, float))
                             or not least <= value < math.inf for value in values):
            kind = "a number of at least 0" if name == "guard" else "positive numbers"
            raise Table1Error(f"NoiselessFit.{name} must be {kind}; got {getattr(fit, name)!r}")
    if not fit.smallest < fit.largest < fit.cap:
        raise Table1Error(f"NoiselessFit needs smallest < largest < cap (rare tasks lie below the first or above the "
                          f"second, and the fit's guard grid runs from the second to the third); got {fit.smallest!r}, "
                          f"{fit.largest!r}, {fit.cap!r}")
    for name, least in (("fit_tasks", 2), ("pool_tasks", 2), ("check_tasks", 2), ("check_samples", 1),
                        ("adam_steps", 0), ("rounds", 1), ("iterations", 1)):
        value = getattr(fit, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise Table1Error(f"NoiselessFit.{name} must be an integer of at least {least}; got {value!r}")


# ----------------------------------------------------------------------------- the plan of a stack


@dataclass(frozen=True)
class PlannedModel:
    """One model a stack trains, and where it starts.

    ``start`` is ``"random"`` (its seed's initialisation), ``"grown"`` (the shallower model of its seed with a
    fresh last layer), ``"deepened"`` (the finished model ``source`` one layer shallower with a pass-through
    layer before layer ``position``) or ``"widened"`` (the finished smaller variant ``source`` of its cell,
    which then trains only the unclipped phase).
    """

    name: str
    column: str
    seed: int
    start: str
    source: Optional[str]
    position: Optional[int]
    num_steps: int
    learning_rate: float
    warmup_steps: int
    schedule: str


@dataclass(frozen=True)
class StackPlan:
    """What one stack (one variant, one depth) trains: ``models`` in stack order (which fixes every model's
    task stream), whether a depth has an unclipped phase, and the deepened models left out because their
    start did not finish (``{name: start}``)."""

    depth: int
    variant: str
    models: tuple
    two_phases: bool
    unstarted: dict


def naming_seed(budget: Budget, depth: int) -> int:
    """The seed in the names of the models deepened from ``depth``: its first seed, or that of the nearest
    shallower depth with seeds where ``depth`` itself only deepens (the name of a model started from a
    selected one keeps the first seed; its checkpoint says which model it was)."""
    for shallower in range(depth, 0, -1):
        if shallower in budget.depths and budget.seeds_at(shallower):
            return budget.seeds_at(shallower)[0]
    return 0


def deepened_tags(budget: Budget, depth: int, variant: str, variants: Sequence[str]) -> dict:
    """``{name suffix: position}`` of the deepened candidates of ``variant`` at ``depth`` (position None:
    nested from a deepened smaller variant)."""
    settings = budget.settings(depth)
    deepening = settings["deepen"]
    if deepening is None or depth - 1 not in budget.depths:
        return {}
    if variant in deepening.variants:
        return {f"-d{position}": position for position in deepening.positions}
    position = NESTED.index(variant)
    if position and variant in settings["nested_init"] and NESTED[position - 1] in variants \
            and settings["nest_from"] == "each":
        return {tag: None for tag in deepened_tags(budget, depth, NESTED[position - 1], variants)}
    return {}


def clipped_steps(budget: Budget, depth: int, variant: str, variants: Sequence[str]) -> int:
    """The clipped steps a stack counts (for the progress bar): none for a stack that starts from its
    smaller variant, the deepened candidates' steps where they are more than the seeds'."""
    settings = budget.settings(depth)
    position = NESTED.index(variant)
    widened = variant in settings["nested_init"] and NESTED[position - 1] in variants
    deepening = settings["deepen"]
    deepened = deepening.steps if deepening is not None and variant in deepening.variants \
        and depth - 1 in budget.depths else 0
    return max(0 if widened or not budget.seeds_at(depth) else settings["steps"], deepened)


def plan_stack(budget: Budget, depth: int, variant: str, variants: Sequence[str], columns: Sequence[str],
               done: set, shallower_choice: Optional[dict] = None,
               unfinished_smaller: Optional[dict] = None, smaller_choice: Optional[dict] = None) -> StackPlan:
    """The models one stack trains, without training or reading anything.

    Args:
        budget: the run's checked budget; ``variants``, ``columns``: the run's, in the table's order.
        done: the names of the finished models of the run so far (shallower depths, smaller variants).
        shallower_choice: ``{column: name}``, the candidate each cell one layer shallower keeps; needed
            only when the depth's :class:`Deepening` starts from the ``"selected"`` model.
        unfinished_smaller: ``{column: name}``, for a nested variant, the model the smaller variant's cell
            keeps in the columns where none of its candidates finished (the spike rule stopped them all):
            the nested variant then starts from that one rather than leave its cell empty.
        smaller_choice: ``{column: name}``, the candidate each cell of the smaller variant keeps; needed only
            when the variant nests from the ``"selected"`` model at ``depth`` (``Budget.nest_from``): it then
            trains exactly one model per cell, ``{variant}-L{depth}-{column}-s{seed}-nested``, from that one.
    """
    settings = budget.settings(depth)
    position = NESTED.index(variant)
    if position and variant in settings["nested_init"] and NESTED[position - 1] in variants \
            and settings["nest_from"] == "selected":
        rate = settings["nested_learning_rate"].get(variant, budget.unclipped_learning_rate)
        seed = naming_seed(budget, depth)
        # one model per cell, from the smaller cell's kept model (a column whose smaller cell has none gets none)
        models = tuple(PlannedModel(model_name(variant, depth, column, seed) + NESTED_FROM_KEPT, column, seed,
                                    "widened", smaller_choice[column], None, settings["unclipped_steps"], rate, 0,
                                    "constant")
                       for column in columns if column in (smaller_choice or {}))
        return StackPlan(depth, variant, models, settings["unclipped_steps"] > 0, {})
    deepening = settings["deepen"]
    tags = deepened_tags(budget, depth, variant, variants)
    entries = [(seed, "") for seed in budget.seeds_at(depth)]
    if tags:
        entries += [(naming_seed(budget, depth - 1), tag) for tag in tags]
    models, unstarted = [], {}
    for column in columns:
        for seed, tag in entries:
            name = model_name(variant, depth, column, seed) + tag
            smaller = model_name(NESTED[position - 1], depth, column, seed) + tag if position else None
            shallower = model_name(variant, depth - 1, column, seed)
            if tags.get(tag) is not None:
                # the shallower model's function with a pass-through layer, then both phases
                if deepening.start == "selected":
                    shallower = shallower_choice[column]
                if shallower not in done:
                    unstarted[name] = shallower
                    continue
                models.append(PlannedModel(name, column, seed, "deepened", shallower, tags[tag], deepening.steps,
                                           deepening.learning_rate, deepening.warmup_steps, budget.schedule))
            elif variant in settings["nested_init"] and (smaller in done or smaller == (unfinished_smaller or {}).get(
                    column)):
                # the smaller model's function, then only the unclipped phase (research/README.md); where no
                # smaller candidate finished, the one its cell keeps, so that no cell is left without a model
                rate = settings["nested_learning_rate"].get(variant, budget.unclipped_learning_rate)
                models.append(PlannedModel(name, column, seed, "widened", smaller, None,
                                           settings["unclipped_steps"], rate, 0, "constant"))
            elif not tag:   # a deepened model whose smaller variant is missing is not trained
                grown = budget.init_from_shallower and depth > 1 and shallower in done
                models.append(PlannedModel(name, column, seed, "grown" if grown else "random",
                                           shallower if grown else None, None, settings["steps"],
                                           settings["learning_rate"], settings["warmup_steps"], budget.schedule))
    return StackPlan(depth, variant, tuple(models), settings["unclipped_steps"] > 0, unstarted)
