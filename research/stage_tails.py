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
    python research/stage_tails.py 264000          # 115 s
    python research/stage_tails.py 288000          # 102 s
    python research/stage_tails.py 312000          # 111 s
    python research/stage_tails.py 336000          # 96 s
    python research/stage_tails.py 360000          # 99 s (beside a short notebook run)

(``--depth`` picks another depth's stages; the shipped ones are at 4 layers.)
"""

from __future__ import annotations

import argparse
import math
import time

import torch

from icl_course import memformer
from icl_course.evaluate import query_averaged_loss
from icl_course.runtime import make_generator

HEADS, CHUNK = {"one": 1, "five": 5}, 50_000


def compared(stages: dict, begin: int) -> list:
    """The models (``"one"``, ``"five"``) that both the stage starting at ``begin`` and the one before it trained."""
    before = next(stage for start, stage in stages.items() if start + stage["steps"] == begin)
    return [name for name in HEADS if name in stages[begin]["weights"] and name in before["weights"]]


def per_task_losses(stages: dict, begin: int, position: int, seed: int, sampler, depth: int = 4) -> dict:
    """``{(name, "before" | "after"): (N,) losses}`` on the million tasks that scored the stage (its seed)."""
    family = memformer.FULL_ATTENTION["heads"][0]
    earlier = {end: stage for end, stage in ((b + s["steps"], s) for b, s in stages.items())}
    models = {}
    for name in compared(stages, begin):
        heads = HEADS[name]
        for when, stage in (("before", earlier[begin]), ("after", stages[begin])):
            model = memformer.build(family, depth, heads, "full")
            model.load_state_dict(memformer.unstack(stage["weights"][name], position))
            models[name, when] = model
    generator = make_generator(7_000 + 31 * seed + depth)      # widened_heads.py score's tasks, in its chunks
    losses = {key: [] for key in models}
    with torch.no_grad():
        for done in range(0, memformer.eval_count(depth), CHUNK):
            batch = sampler.sample(min(CHUNK, memformer.eval_count(depth) - done), generator)
            for key, model in models.items():
                losses[key].append(query_averaged_loss(model(batch).weights, batch))
    return {key: torch.cat(values) for key, values in losses.items()}


def main(begin: int, results_path, depth: int = 4) -> None:
    begin_time = time.perf_counter()
    results = memformer.load_experiments(results_path)
    stages = results.get("widened_heads_continued", {}).get(depth, {})
    if begin not in stages or begin - stages[begin]["steps"] not in stages:
        raise SystemExit(f"give a later stage that follows another later stage; shipped: {sorted(stages)[1:]}")
    seeds = list(memformer.RECIPE["seeds"])
    samplers = memformer.setting_samplers(seeds)[:len(seeds)]
    rows = {name: [] for name in compared(stages, begin)}
    for position, seed in enumerate(seeds):
        losses = per_task_losses(stages, begin, position, seed, samplers[position], depth)
        for name in rows:
            before, after = losses[name, "before"], losses[name, "after"]
            mean = before.mean()
            shipped = stages[begin][f"{name} (before)"][position, 0]
            if not torch.isclose(mean, shipped, rtol=1e-9):
                raise SystemExit(f"seed {seed}, {name!r}: these tasks do not give the stage's shipped score "
                                 f"({float(mean):.6g}, not {float(shipped):.6g}); score the stage again with "
                                 "widened_heads.py score")
            worst = before.argsort(descending=True)[:100]
            rest = torch.ones_like(before, dtype=torch.bool)
            rest[worst] = False
            fell = (after < before).double()
            row = [after.mean() / mean - 1, after.sort(descending=True).values[:100].sum() / after.sum(),
                   (after / before).median(), fell.mean(), fell.std() / math.sqrt(fell.numel()),
                   (after[worst] - before[worst]).sum() / before.sum(),
                   (after[rest] - before[rest]).sum() / before.sum()]
            rows[name].append([float(value) for value in row])
            change, share, ratio, fraction, error, from_worst, from_rest = rows[name][-1]
            print(f"seed {seed}, {name}: mean {100 * change:+.2f}%, worst 100 carry {share:.2f} of it; median ratio "
                  f"{ratio:.3f}; fell on {100 * fraction:.2f}% ± {100 * error:.2f}% of tasks; change from the 100 "
                  f"worst before {100 * from_worst:+.2f}%, from the rest {100 * from_rest:+.2f}%", flush=True)
    keys = ("mean change", "worst share", "median ratio", "fell", "from worst", "from rest")
    summary = {}
    for name, values in rows.items():
        table = torch.tensor(values, dtype=torch.float64)
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
    parser.add_argument("--depth", type=int, default=4)
    arguments = parser.parse_args()
    main(arguments.begin, arguments.results, arguments.depth)
