"""Chapter 5's GD-form models at 5 and 6 layers: plain tasks against stretched ones, for scoring and for training.

Two questions behind ``RECIPE["stretched_depths"]`` and ``RECIPE["stretched_num_steps"]`` in ``icl_course.memformer``:

- ``score``: is a 5- or 6-layer model's mean on a million plain fresh tasks an estimate at all?  Scores every seed of
  one family and setting of the shipped file on the same ``--samples`` plain samples of ``--tasks`` tasks and on as
  many samples of :func:`icl_course.memformer.stretched_tasks` (weighted back to the paper's law).
- ``train``: what do plain or stretched batches and ``--steps`` Adam steps give?  Trains one family at depths 5 and 6
  (``--depths``) on one setting (3 seeds, the recipe otherwise; ``--full``: every entry of ``P`` and ``Q``, as the
  quasi-Newton LFOM), then scores each model on a million stretched tasks.
- ``lfom-lengths``: the shipped quasi-Newton LFOM of ``--depth`` layers at every training length, on stretched tasks
  (its 4-layer plain mean got worse with longer training: is that its tail?).

    python research/stretched_depths.py score --family "CGD-like + A_l" --setting isotropic --depth 5
    python research/stretched_depths.py train --family "CGD-like + A_l" --setting rotated --steps 4000 --stretched

Each run prints one line per model: its mean and the standard error in percent of it.
"""

from __future__ import annotations

import argparse
import time

import torch

from icl_course import memformer


def _samplers(setting: str) -> tuple[list, list]:
    seeds = list(memformer.RECIPE["seeds"])
    everything = memformer.setting_samplers(seeds)
    index = memformer.SETTINGS.index(setting)
    return seeds, everything[index * len(seeds):(index + 1) * len(seeds)]


def score_shipped(family: str, setting: str, depth: int, samples: int, tasks: int, results=None) -> dict:
    """``{"plain": [per seed: [(mean, stderr) per sample]], "stretched": [...]}`` for the shipped models."""
    results = results or memformer.load_experiments()
    seeds, samplers = _samplers(setting)
    out = {"plain": [], "stretched": []}
    for position in range(len(seeds)):
        model = memformer.load_model(results, setting, family, depth, position)
        plain = samplers[position]
        for kind, sampler in (("plain", plain), ("stretched", memformer.stretched_tasks(plain))):
            rows = [memformer.score(model, sampler, tasks, seed=9_000 + sample) for sample in range(samples)]
            out[kind].append([(mean[-1].item(), stderr[-1].item()) for mean, stderr in rows])
    return out


def train_and_score(family: str, setting: str, steps: int, stretched: bool, tasks: int, depths=(5, 6),
                    recipe: dict | None = None, attention: str | None = None) -> dict:
    """``{depth: [(mean, stderr) per seed]}`` on ``tasks`` stretched tasks, for models trained ``steps`` steps on
    plain or stretched batches (the recipe's other settings; ``attention="full"``: every entry of ``P`` and ``Q``)."""
    seeds, samplers = _samplers(setting)
    r = dict(recipe or memformer.RECIPE, depths=tuple(depths), num_steps=steps, stretched_num_steps=steps,
             stretched_depths=tuple(depths) if stretched else ())
    groups = memformer.train_groups(family, samplers, seeds, r, 1, attention)
    out = {}
    for depth, run in groups[0].items():
        out[depth] = []
        for position in range(len(seeds)):
            model = memformer.build(family, depth, attention=attention)
            model.load_state_dict(memformer.unstack(run["weights"], position))
            mean, stderr = memformer.score(model, memformer.stretched_tasks(samplers[position]), tasks,
                                           seed=9_000 + position)
            out[depth].append((mean[-1].item(), stderr[-1].item()))
    return out


def score_lengths(setting: str, depth: int, tasks: int, results=None) -> dict:
    """The shipped quasi-Newton LFOM (every entry of ``P`` and ``Q``) of ``depth`` layers at every training length
    the file has for that depth, on ``tasks`` stretched tasks: ``{steps: [(mean, stderr) per seed]}``."""
    results = results or memformer.load_experiments()
    seeds, samplers = _samplers(setting)
    family = memformer.FULL_ATTENTION["quasi_newton"][0]
    trained = {results["full_attention_steps"]: results["quasi_newton"], **{
        steps: parts["quasi_newton"] for steps, parts in results.get("full_attention_lengths", {}).items()
        if depth in parts.get("quasi_newton", {}).get(setting, {})}}   # longer trainings cover some depths only
    out = {}
    for steps in sorted(trained):
        run = trained[steps][setting][depth]
        out[steps] = []
        for position in range(len(seeds)):
            model = memformer.build(family, depth, attention="full")
            model.load_state_dict(memformer.unstack(run["weights"], position))
            mean, stderr = memformer.score(model, memformer.stretched_tasks(samplers[position]), tasks,
                                           seed=9_000 + position)
            out[steps].append((mean[-1].item(), stderr[-1].item()))
    return out


def _line(values) -> str:
    return ", ".join(f"{mean:.4g} ± {100 * stderr / mean:.1f}%" for mean, stderr in values)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("what", choices=("score", "train", "lfom-lengths"))
    parser.add_argument("--family", default="CGD-like + A_l", choices=list(memformer.MODELS))
    parser.add_argument("--setting", default="isotropic", choices=list(memformer.SETTINGS))
    parser.add_argument("--depth", type=int, default=5, choices=(1, 2, 3, 4, 5, 6),
                        help="score: the shipped depth (5 or 6); lfom-lengths: 1-4")
    parser.add_argument("--samples", type=int, default=3, help="score: samples of each kind")
    parser.add_argument("--tasks", type=int, default=1_000_000, help="tasks per sample")
    parser.add_argument("--steps", type=int, default=4000, help="train: Adam steps")
    parser.add_argument("--stretched", action="store_true", help="train: on stretched batches (default: plain)")
    parser.add_argument("--full", action="store_true", help="train: every entry of P and Q (the quasi-Newton LFOM)")
    parser.add_argument("--depths", type=int, nargs="+", default=[5, 6], help="train: the depths")
    parser.add_argument("--learning-rate", type=float, default=memformer.RECIPE["learning_rate"],
                        help="train: Adam's peak rate (default: the recipe's)")
    arguments = parser.parse_args()
    if arguments.what == "lfom-lengths" and arguments.depth not in memformer.FULL_ATTENTION_DEPTHS:
        parser.error(f"lfom-lengths scores the quasi-Newton LFOM, which the file holds at depths "
                     f"{', '.join(map(str, memformer.FULL_ATTENTION_DEPTHS))} only; got --depth {arguments.depth}")
    torch.set_num_threads(1)
    begin = time.perf_counter()
    if arguments.what == "score":
        scores = score_shipped(arguments.family, arguments.setting, arguments.depth, arguments.samples, arguments.tasks)
        for kind, per_seed in scores.items():
            for position, values in enumerate(per_seed):
                print(f"seed {position}, {kind:9s} samples: {_line(values)}", flush=True)
    elif arguments.what == "lfom-lengths":
        for steps, values in score_lengths(arguments.setting, arguments.depth, arguments.tasks).items():
            print(f"quasi-Newton LFOM, {arguments.setting}, {arguments.depth} layers, {steps} plain steps: "
                  f"{_line(values)}", flush=True)
    else:
        trained = train_and_score(arguments.family, arguments.setting, arguments.steps, arguments.stretched,
                                  arguments.tasks, arguments.depths,
                                  dict(memformer.RECIPE, learning_rate=arguments.learning_rate),
                                  attention="full" if arguments.full else None)
        for depth, values in trained.items():
            print(f"{arguments.family}, {arguments.setting}, {depth} layers, {arguments.steps} steps on "
                  f"{'stretched' if arguments.stretched else 'plain'} batches at rate {arguments.learning_rate:g}: "
                  f"{_line(values)}", flush=True)
    print(f"{time.perf_counter() - begin:.0f} s", flush=True)
