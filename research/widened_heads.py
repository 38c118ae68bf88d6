"""Do more heads help once one head is trained? Chapter 5's 5-head model widened from its trained 1-head model.

Dutta and Sra (2024, Figure 5) find that 5 heads beat 1. Trained from scratch, 5 heads at 3 layers needed 96 000 Adam
steps to come level with one head's 24 000, and at 4 layers neither converges in 48 000; so a comparison from scratch
mixes the class's capacity with how fast each trains.  This one holds the training equal.  For each depth and seed,
two models train on from the same start, with the same steps and the same fresh batches:

- the trained 1-head model itself (the control: where it has converged, further training leaves it where it is);
- a 5-head model whose first head is that model and whose four new heads start with ``P_k = 0`` (so it computes the
  very same function) and small random ``Q_k`` (so that the new ``P_k`` get a gradient).

A 5-head model can always switch its new heads off, so it can only end at or below the control: by how much, on
the million fresh tasks that scored the start (paired differences), is what extra heads buy.  Both train with the
recipe (Adam, warm-up, cosine decay, clipping, batches of 500 plain tasks) at a peak rate ``--learning-rate`` (a
tenth of the recipe's: the start is already trained) on a stream of batches that training never met.

    python research/widened_heads.py train widened_heads.pt --steps 24000 --depths 3 4   # 2 processes, CPU
    python research/widened_heads.py score widened_heads.pt     # into icl_course/pretrained/ch5_memformers.pt

``score`` writes (or replaces) ``results["widened_heads"][depth]`` for the depths in the file: ``"start_steps"``,
``"steps"``, ``"learning_rate"``, the ``"start"``, ``"one"`` and ``"five"`` losses per seed (mean, stderr), the paired
``"five - one"`` and ``"one - start"`` differences per seed (mean, stderr), each model's ``"curve"`` and the new
models' ``"weights"``.
"""

from __future__ import annotations

import argparse
import multiprocessing
import pathlib
import time

import torch

from icl_course import memformer
from icl_course.evaluate import paired_losses
from icl_course.runtime import make_generator

FAMILY, HEADS = memformer.FULL_ATTENTION["heads"][0], 5
DEPTHS = (2, 3, 4)


def start_weights(results: dict, depth: int) -> tuple[int, dict]:
    """The 1-head models of ``depth`` after their longest training: (steps, state dict with the seeds first)."""
    steps = memformer.longest_training(results, "heads", 1)[0][memformer.FULL_ATTENTION_DEPTHS.index(depth)]
    runs = results if steps == results["full_attention_steps"] else results["full_attention_lengths"][steps]
    return steps, {key: value.clone() for key, value in runs["heads"][1][depth]["weights"].items()}


def widened(weights: dict, heads: int, seed: int) -> dict:
    """``weights`` (seeds first) of 1-head models as ``heads``-head ones computing the same functions: the new heads
    have ``P_k = 0`` and ``Q_k`` of standard deviation 0.01 (seeded)."""
    P, Q = weights["P"], weights["Q"]                     # (seeds, layers, 1, 6, 6)
    extra = (*P.shape[:2], heads - 1, *P.shape[3:])
    noise = 0.01 * torch.randn(extra, generator=make_generator(seed), dtype=Q.dtype)
    return dict(weights, P=torch.cat([P, torch.zeros(extra, dtype=P.dtype)], 2), Q=torch.cat([Q, noise], 2))


def train_job(job) -> tuple:
    depth, heads, start, steps, learning_rate = job
    torch.set_num_threads(1)
    seeds = list(memformer.RECIPE["seeds"])
    samplers = memformer._samplers(seeds)[:len(seeds)]          # the rotated data, one U per seed
    recipe = dict(memformer.full_attention_recipe("heads", steps), depths=(depth,), learning_rate=learning_rate)
    begin = time.perf_counter()
    trained = memformer.train_models(FAMILY, (depth,), samplers, seeds, recipe, attention="full", num_heads=heads,
                                     start=start, batch_seed=50_000 + depth)
    weights, curve = trained[depth]
    return depth, heads, {"weights": weights, "curve": curve, "seconds": time.perf_counter() - begin}


def train(steps: int, learning_rate: float, out: pathlib.Path, processes: int, depths) -> None:
    results = memformer.load_experiments()
    jobs, starts = [], {}
    for depth in depths:
        start_steps, weights = start_weights(results, depth)
        starts[depth] = start_steps
        jobs += [(depth, HEADS, widened(weights, HEADS, 60_000 + depth), steps, learning_rate),
                 (depth, 1, weights, steps, learning_rate)]
    jobs.sort(key=lambda job: -job[0] * job[1])      # the slowest first
    trained = {"steps": steps, "learning_rate": learning_rate, "start_steps": starts, "torch": str(torch.__version__),
               "runs": {}}
    begin = time.perf_counter()
    context = multiprocessing.get_context("spawn")
    with context.Pool(processes) as pool:
        for depth, heads, run in pool.imap_unordered(train_job, jobs):
            trained["runs"].setdefault(depth, {})[heads] = run
            print(f"depth {depth}, {heads} head(s): {run['seconds']:.0f} s, last curve "
                  f"{[f'{v:.3g}' for v in run['curve'][:, -1].tolist()]}", flush=True)
            torch.save(trained, out)
    trained["seconds"] = time.perf_counter() - begin
    torch.save(trained, out)
    print(f"done in {trained['seconds']:.0f} s", flush=True)


def score(path: pathlib.Path, results_path: pathlib.Path) -> None:
    trained = torch.load(path, map_location="cpu", weights_only=True)
    results = memformer.load_experiments(results_path)
    seeds = list(memformer.RECIPE["seeds"])
    samplers = memformer._samplers(seeds)[:len(seeds)]
    begin, out = time.perf_counter(), {}
    for depth, runs in sorted(trained["runs"].items()):
        _, start = start_weights(results, depth)
        rows = {name: [] for name in ("start", "one", "five", "five - one", "one - start")}
        for position, seed in enumerate(seeds):
            models = {}
            for name, heads, weights in (("start", 1, start), ("one", 1, runs[1]["weights"]),
                                         ("five", HEADS, runs[HEADS]["weights"])):
                models[name] = memformer.build(FAMILY, depth, heads, "full")
                models[name].load_state_dict(memformer.unstack(weights, position))
            # the tasks that scored the start (memformer._scored's seed), so "start" is the shipped number
            losses, differences = paired_losses(models, samplers[position], "one", memformer.eval_count(depth),
                                                seed=7_000 + 31 * seed + depth)
            for name in ("start", "one", "five"):
                rows[name].append((losses[name].mean, losses[name].stderr))
            rows["five - one"].append((differences["five"].mean, differences["five"].stderr))
            rows["one - start"].append((-differences["start"].mean, differences["start"].stderr))
            print(f"depth {depth}, seed {seed}: " + ", ".join(f"{name} {mean:.4g} ± {error:.2g}"
                                                               for name, (mean, error) in
                                                               ((n, rows[n][-1]) for n in rows)), flush=True)
        out[depth] = {"start_steps": trained["start_steps"][depth], "steps": trained["steps"],
                      "learning_rate": trained["learning_rate"],
                      **{name: torch.tensor(values, dtype=torch.float64) for name, values in rows.items()},
                      "curve": {1: runs[1]["curve"], HEADS: runs[HEADS]["curve"]},
                      "weights": {1: runs[1]["weights"], HEADS: runs[HEADS]["weights"]}}
    results.setdefault("widened_heads", {}).update(out)      # a later call for other depths keeps these
    results["redone"] = results.get("redone", []) + [{
        "command": f"python research/widened_heads.py train --steps {trained['steps']} --learning-rate "
                   f"{trained['learning_rate']:g} --depths {' '.join(map(str, sorted(trained['runs'])))} && "
                   f"python research/widened_heads.py score {path.name}",
        "parts": ["widened_heads"], "seconds": trained["seconds"] + time.perf_counter() - begin,
        "where": f"trained on a 2-core CPU, 2 processes side by side ({trained['seconds']:.0f} s, torch "
                 f"{trained['torch']}); scored there ({time.perf_counter() - begin:.0f} s)"}]
    torch.save(results, results_path)
    print(f"wrote {results_path}", flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("what", choices=("train", "score"))
    parser.add_argument("path", help="train: the file to write; score: the file `train` wrote")
    parser.add_argument("--steps", type=int, default=12_000)
    parser.add_argument("--learning-rate", type=float, default=0.005)
    parser.add_argument("--depths", nargs="*", type=int, default=list(DEPTHS))
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--results", default=str(memformer.PRETRAINED))
    arguments = parser.parse_args()
    if set(arguments.depths) - set(DEPTHS):
        parser.error(f"depths must be among {DEPTHS}")
    if arguments.what == "train":
        train(arguments.steps, arguments.learning_rate, pathlib.Path(arguments.path), arguments.processes,
              arguments.depths)
    else:
        score(pathlib.Path(arguments.path), pathlib.Path(arguments.results))
