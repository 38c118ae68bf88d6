"""A short run of chapter 5's 4-layer quasi-Newton LFOM, Adam in the given coordinates and in white ones, side by side.

The question behind ``memformer.train_models(whitened=True)``: after 171 000 steps rotated seed 2 of the branch from
3 000 steps still fell by about 2% a stage while its isotropic twin had stopped (research/README.md, 2026-11-29,
fourth entry).  Is that slowness the optimizer's?  Adam scales each entry's step by that entry's own gradient history,
so it is not invariant to a change of basis of ``P`` and ``Q``; whitening (``P~ = T^-1 P T``, ``Q~ = T^T Q T``)
changes nothing but the coordinates Adam steps in.  This script trains the same start for the same steps on the
same batches both ways and scores both ends paired against the start on the same stretched tasks:

    python research/whitened_probe.py --steps 3000     # about 7 minutes on a 2-core CPU

(its first run, 2026-12-01: see research/README.md).  ``--seed`` and ``--setting`` pick the model; ``--tasks`` the
size of the paired scoring sample.
"""

from __future__ import annotations

import argparse
import time

import torch
from quasi_newton_stages import BRANCHES, DEPTH, FAMILY, PART

from icl_course import memformer
from icl_course.evaluate import paired_losses


def probe(steps: int, learning_rate: float, seed: int, setting: str, tasks: int, origin: int = 3_000) -> dict:
    """Train the branch's last plain stage of ``seed`` for ``steps`` both ways; return the paired estimates."""
    torch.set_num_threads(1)
    results = memformer.load_experiments()
    plain = [begin for begin, stage in results[BRANCHES][origin].items() if not stage.get("whitened")]
    last = results[BRANCHES][origin][max(plain)]         # the branch's last stage with Adam in the given coordinates
    end = max(plain) + last["steps"]
    seeds = list(memformer.RECIPE["seeds"])
    if seed not in seeds:
        raise SystemExit(f"--seed {seed}: the shipped models have seeds {seeds}")
    position = seeds.index(seed)
    start = {key: value[position:position + 1].clone() for key, value in last[setting]["weights"].items()}
    sampler = memformer.setting_samplers(seeds)[memformer.SETTINGS.index(setting) * len(seeds) + position]
    recipe = dict(memformer.full_attention_recipe(PART, steps), depths=(DEPTH,), learning_rate=learning_rate)
    models = {"start": memformer.build(FAMILY, DEPTH, 1, "full")}
    models["start"].load_state_dict(memformer.unstack(start, 0))
    for name, whitened in (("given coordinates", False), ("white coordinates", True)):
        begin = time.perf_counter()
        weights, _ = memformer.train_models(FAMILY, (DEPTH,), [sampler], [seed], recipe, attention="full",
                                            stretched=True, start=start, batch_seed=123_456, whitened=whitened)[DEPTH]
        models[name] = memformer.build(FAMILY, DEPTH, 1, "full")
        models[name].load_state_dict(memformer.unstack(weights, 0))
        print(f"{name}: {time.perf_counter() - begin:.0f} s", flush=True)
    losses, differences = paired_losses(models, memformer.stretched_tasks(sampler), "start", tasks, seed=99)
    for name in models:
        line = f"{name:18s} {losses[name].mean:.4g} ± {losses[name].stderr:.2g}"
        if name != "start":
            change = differences[name]
            line += (f"; change {100 * change.mean / losses['start'].mean:+.2f}% "
                     f"({change.mean / change.stderr:+.1f} paired errors)")
        print(line, flush=True)
    return {"losses": losses, "differences": differences, "start_steps": end}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=3_000)
    parser.add_argument("--learning-rate", type=float, default=0.0005)
    parser.add_argument("--seed", type=int, default=2)
    parser.add_argument("--setting", choices=memformer.SETTINGS, default="rotated")
    parser.add_argument("--tasks", type=int, default=200_000)
    arguments = parser.parse_args()
    for name in ("steps", "tasks"):
        if getattr(arguments, name) <= 0:
            raise SystemExit(f"--{name} must be positive, got {getattr(arguments, name)}")
    probe(arguments.steps, arguments.learning_rate, arguments.seed, arguments.setting, arguments.tasks)
