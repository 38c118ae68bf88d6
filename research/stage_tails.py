"""What moves when a later stage of chapter 5's 4-layer heads barely moves the mean: the typical task or the tail?

For one later stage of ``results["widened_heads_continued"][4]`` (its start, in the 1-head model's steps), each seed's
1-head and 5-head models before and after the stage are run on the very tasks that scored them (the million of
``widened_heads.py score``), task by task.  Printed per model: the change of the mean; the share of the mean the
worst 100 tasks carry; the median of the per-task ratio after / before; the fraction of tasks whose loss fell (with
its standard error); and the change split into the 100 tasks that were worst before the stage and the rest (both in
% of the mean before; the split by the tasks worst before leans towards falls, as the worst of a sample regress).
The same numbers go into ``results["stage_tails"][begin][name]``, tensors with one row per seed: ``"mean change"``,
``"worst share"``, ``"median ratio"``, ``"fell"`` (fraction, stderr), ``"from worst"``, ``"from rest"`` (fractions
of the mean before).

    python research/stage_tails.py 240000          # 110 s on a 2-core CPU
"""

from __future__ import annotations

import argparse
import math
import time

import torch

from icl_course import memformer
from icl_course.evaluate import query_averaged_loss
from icl_course.runtime import make_generator

DEPTH, HEADS, CHUNK = 4, {"one": 1, "five": 5}, 50_000


def per_task_losses(stages: dict, begin: int, position: int, seed: int, sampler) -> dict:
    """``{(name, "before" | "after"): (N,) losses}`` on the million tasks that scored the stage (its seed)."""
    family = memformer.FULL_ATTENTION["heads"][0]
    earlier = {end: stage for end, stage in ((b + s["steps"], s) for b, s in stages.items())}
    models = {}
    for name, heads in HEADS.items():
        for when, stage in (("before", earlier[begin]), ("after", stages[begin])):
            model = memformer.build(family, DEPTH, heads, "full")
            model.load_state_dict(memformer.unstack(stage["weights"][name], position))
            models[name, when] = model
    generator = make_generator(7_000 + 31 * seed + DEPTH)      # widened_heads.py score's tasks
    losses = {key: [] for key in models}
    with torch.no_grad():
        for _ in range(memformer.eval_count(DEPTH) // CHUNK):
            batch = sampler.sample(CHUNK, generator)
            for key, model in models.items():
                losses[key].append(query_averaged_loss(model(batch).weights, batch))
    return {key: torch.cat(values) for key, values in losses.items()}


def main(begin: int, results_path) -> None:
    begin_time = time.perf_counter()
    results = memformer.load_experiments(results_path)
    stages = results["widened_heads_continued"][DEPTH]
    if begin not in stages or begin - stages[begin]["steps"] not in stages:
        raise SystemExit(f"give a later stage that follows another later stage; shipped: {sorted(stages)[1:]}")
    seeds = list(memformer.RECIPE["seeds"])
    samplers = memformer.setting_samplers(seeds)[:len(seeds)]
    rows = {name: [] for name in HEADS}
    for position, seed in enumerate(seeds):
        losses = per_task_losses(stages, begin, position, seed, samplers[position])
        for name in HEADS:
            before, after = losses[name, "before"], losses[name, "after"]
            mean = before.mean()
            assert torch.isclose(mean, stages[begin][f"{name} (before)"][position, 0], rtol=1e-9)  # the shipped score
            worst = before.argsort(descending=True)[:100]
            rest = torch.ones_like(before, dtype=torch.bool)
            rest[worst] = False
            fell = (after < before).double()
            rows[name].append([after.mean() / mean - 1, after.sort(descending=True).values[:100].sum() / after.sum(),
                               (after / before).median(), fell.mean(), fell.std() / math.sqrt(fell.numel()),
                               (after[worst] - before[worst]).sum() / before.sum(),
                               (after[rest] - before[rest]).sum() / before.sum()])
            print(f"seed {seed}, {name}: mean {100 * (after.mean() / mean - 1):+.2f}%, worst 100 carry "
                  f"{after.sort(descending=True).values[:100].sum() / after.sum():.2f} of it; median ratio "
                  f"{(after / before).median():.3f}; fell on {100 * fell.mean():.2f}% "
                  f"± {100 * fell.std() / math.sqrt(fell.numel()):.2f}% of tasks; change from the 100 worst before "
                  f"{100 * (after[worst] - before[worst]).sum() / before.sum():+.2f}%, from the rest "
                  f"{100 * (after[rest] - before[rest]).sum() / before.sum():+.2f}%", flush=True)
    keys = ("mean change", "worst share", "median ratio", "fell", "from worst", "from rest")
    summary = {}
    for name, values in rows.items():
        table = torch.tensor([[float(value) for value in row] for row in values], dtype=torch.float64)
        columns = {"mean change": [0], "worst share": [1], "median ratio": [2], "fell": [3, 4], "from worst": [5],
                   "from rest": [6]}
        summary[name] = {key: table[:, columns[key]].squeeze(-1) for key in keys}
    results.setdefault("stage_tails", {})[begin] = summary
    command = f"python research/stage_tails.py {begin}"
    results["redone"] = [entry for entry in results.get("redone", []) if entry["command"] != command] + [{
        "command": command, "parts": ["stage_tails"], "seconds": time.perf_counter() - begin_time,
        "where": f"a 2-core CPU, torch {torch.__version__}"}]
    torch.save(results, results_path)
    print(f"wrote {results_path}", flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("begin", type=int, help="the stage's start, in the 1-head model's steps (e.g. 240000)")
    parser.add_argument("--results", default=str(memformer.PRETRAINED))
    arguments = parser.parse_args()
    main(arguments.begin, arguments.results)
