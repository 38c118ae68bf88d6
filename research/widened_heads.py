"""Do more heads help once one head is trained? Chapter 5's 5-head model widened from its trained 1-head model.

Dutta and Sra (2024, Figure 5) find that 5 heads beat 1. Trained from scratch, 5 heads at 3 layers needed 96 000 Adam
steps to come level with one head's 24 000, and at 4 layers neither converges in 48 000; so a comparison from scratch
mixes the class's capacity with how fast each trains.  This one holds the training equal.  For each depth and seed,
three models train on from the same start, with the same steps and the same fresh batches (``--starts``; the
shipped run trained the third at 2 and 3 layers only):

- ``one``: the trained 1-head model itself (the control: where it has converged, further training leaves it there);
- ``five``: a 5-head model whose first head is that model and whose four new heads start with ``P_k = 0`` (so it
  computes the very same function) and small random ``Q_k`` (so that the new ``P_k`` get a gradient);
- ``split``: the trained head shared out over 5 heads (same ``Q``, ``P / 5`` plus noise summing to zero): the same
  function again, with every head as large as the others.

A 5-head model can always switch its extra heads off, so it should end at or below the control: by how much, on
the tasks that scored the start (paired differences), is what extra heads buy.  All train with the recipe (Adam,
warm-up, cosine decay, clipping, batches of 500 plain tasks) at a peak rate ``--learning-rate`` (a tenth of the
recipe's: the start is already trained) on a stream of batches that training never met.

    python research/widened_heads.py train widened_heads.pt --steps 24000 --learning-rate 0.005 --depths 3 4 \
        --starts one five                                                        # 2 508 s
    python research/widened_heads.py train widened_heads_2.pt --steps 24000 --learning-rate 0.005 --depths 2 \
        --starts one five                                                        # 1 132 s
    python research/widened_heads.py train widened_heads_split.pt --steps 24000 --learning-rate 0.005 --depths 2 3 \
        --starts split                                                           # 1 200 s
    python research/widened_heads.py score widened_heads.pt widened_heads_2.pt widened_heads_split.pt    # 227 s

(the shipped results, made so on a 2-core CPU, 2 processes side by side, the calls partly overlapping; all three
starts of a depth train on the same batches, so files made apart are still paired.)

``--continued`` trains a next stage: each model of the last shipped stage (``results["widened_heads"][depth]``, then
``results["widened_heads_continued"][depth]``) on from where it ended, on another stream of batches, with a warm-up
and cosine decay of its own.  Where a stage has converged the control stays put; where it still fell, this says
whether it goes on falling:

    python research/widened_heads.py train widened_heads_4_continued.pt --steps 24000 --learning-rate 0.005 \
        --depths 4 --starts one five --continued                                 # 1 037 s
    python research/widened_heads.py score widened_heads_4_continued.pt          # 218 s
    python research/widened_heads.py train widened_heads_4_third.pt --steps 24000 --learning-rate 0.005 \
        --depths 4 --starts one five --continued                                 # 1 004 s
    python research/widened_heads.py score widened_heads_4_third.pt              # 235 s

and three times more the same way, into ``widened_heads_4_fourth.pt``, ``_fifth.pt`` and ``_sixth.pt`` (957, 993 and
1 050 s to train, 217, 242 and 251 s to score): the shipped later stages at 4 layers, one after the other, the CPU
otherwise idle, 192 000 steps of the 1-head model in all.  Then eight stages at a tenth of that peak rate (in each
stage at 0.005 the loss on the curve's tasks rose 23 times or more before the cosine brought it back):

    python research/widened_heads.py train low_rate_one.pt --steps 24000 --learning-rate 0.0005 --depths 4 \
        --starts one --continued                                                 # 1 022 s (1 process)
    python research/widened_heads.py train low_rate_five.pt --steps 24000 --learning-rate 0.0005 --depths 4 \
        --starts five --continued                                                # 958 s (1 process)
    python research/widened_heads.py score low_rate_one.pt low_rate_five.pt      # 125 s
    python research/widened_heads.py train low_rate_8.pt --steps 24000 --learning-rate 0.0005 --depths 4 \
        --starts one five --continued                                            # 1 023 s
    python research/widened_heads.py score low_rate_8.pt                         # 128 s

and the same into ``low_rate_9.pt`` (997 s, 128 s), ``low_rate_10.pt`` (about 1 000 s; the log's 1 601 s shared the CPU
with a stray second run for its first 17 minutes; 132 s), ``low_rate_11.pt`` (995 s, 118 s), ``low_rate_12.pt`` (964 s,
129 s), ``low_rate_13.pt`` (1 043 s, 128 s) and ``low_rate_14.pt`` (971 s, 121 s): 384 000 steps of the
1-head model in all.

``--whitened`` lets Adam step in the coordinates where each seed's inputs are white
(``memformer.train_models(whitened=True)``): the same models and loss, another path.  For this family the change of
coordinates is exact (its memory gates are scalars, so they commute with it), so a whitened stage on the rotated
data is a plain stage on the isotropic problem, written back in the rotated coordinates.  The stage's record keeps
``"whitened"`` and the command that redoes it says ``--whitened``:

    python research/widened_heads.py train white_15.pt --steps 24000 --learning-rate 0.0005 --depths 4 \
        --starts one five --continued --whitened                                 # 2 781 s
    python research/widened_heads.py score white_15.pt                           # 238 s

and the same into ``white_16.pt`` (2 899 s, 268 s), ``white_17.pt`` (2 098 s and 1 648 s to train on two 2-core
CPUs, the same models both times; about 240 s and 152 s to score), ``white_18.pt`` (1 758 s, 197 s),
``white_19.pt`` (1 705 s, 210 s), ``white_20.pt`` (1 725 s, 224 s), ``white_21.pt`` (1 456 s, 176 s),
``white_22.pt`` (1 540 s, 161 s), ``white_23.pt`` (1 525 s, 170 s), ``white_24.pt`` (1 399 s, 166 s) and
``white_25.pt`` (1 630 s, 180 s): the eleven shipped whitened stages from 384 000 steps to 648 000 (on 2-core CPUs
about half as fast as the one that ran the stages before them).

``score`` writes (or replaces) ``results["widened_heads"][depth]`` for the depths in the file (for a later stage,
``results["widened_heads_continued"][depth][start_steps]``, which also holds the ends of the stage before,
``"NAME (before)"``, scored again on the same tasks, and what the stage moved them, ``"NAME - NAME (before)"``, paired):
``"start_steps"``, ``"steps"``, ``"learning_rate"``, the ``"start"`` loss and each trained model's per seed (mean,
stderr, and in files scored since 2026-11-28 the mean without the worst 100 tasks of the million and that mean's
stderr: ``evaluate.Estimate.trimmed_mean``), the paired ``"five - one"``, ``"split - one"`` and ``"one - start"``
differences per seed (mean, stderr), each model's ``"curve"`` and ``"weights"``.  Scoring the same files again
replaces their stage and their entry in ``results["redone"]``.
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing
import pathlib
import time

import torch

from icl_course import memformer
from icl_course.evaluate import paired_losses

FAMILY, HEADS = memformer.FULL_ATTENTION["heads"][0], 5
DEPTHS = (2, 3, 4)


def start_weights(results: dict, depth: int) -> tuple[int, dict]:
    """The 1-head models of ``depth`` after their longest training: (steps, state dict with the seeds first)."""
    steps = memformer.longest_training(results, "heads", 1)[0][memformer.FULL_ATTENTION_DEPTHS.index(depth)]
    runs = results if steps == results["full_attention_steps"] else results["full_attention_lengths"][steps]
    return steps, {key: value.clone() for key, value in runs["heads"][1][depth]["weights"].items()}


def widened(weights: dict, heads: int, seed: int, how: str = "five") -> dict:
    """``weights`` (seeds first) of 1-head models as ``heads``-head ones computing the same functions
    (:func:`icl_course.memformer.widen_heads`): ``how="five"``, the trained head and new heads from ``P_k = 0``;
    ``how="split"``, the trained head shared out over the heads."""
    if how not in ("five", "split"):
        raise ValueError(f"how is 'five' (new heads from zero) or 'split' (the trained head shared out); got {how!r}")
    return memformer.widen_heads(weights, heads, seed, "new" if how == "five" else how)


STARTS = ("one", "five", "split")   # the 1-head model itself, and its two 5-head widenings (see `widened`)


def train_job(job) -> tuple:
    depth, name, start, steps, learning_rate, stage, whitened = job
    heads = 1 if name == "one" else HEADS
    torch.set_num_threads(1)
    seeds = list(memformer.RECIPE["seeds"])
    samplers = memformer.setting_samplers(seeds)[:len(seeds)]          # the rotated data, one U per seed
    recipe = dict(memformer.full_attention_recipe("heads", steps), depths=(depth,), learning_rate=learning_rate)
    begin = time.perf_counter()
    trained = memformer.train_models(FAMILY, (depth,), samplers, seeds, recipe, attention="full", num_heads=heads,
                                     start=start, batch_seed=50_000 + 1_000 * stage + depth, whitened=whitened)
    weights, curve = trained[depth]
    return depth, name, {"weights": weights, "curve": curve, "seconds": time.perf_counter() - begin}


def shipped_stages(results: dict, depth: int) -> dict:
    """The shipped widened runs of ``depth``, first stage and later ones, by the 1-head model's steps at their end."""
    first = results.get("widened_heads", {}).get(depth)
    if first is None:
        raise SystemExit(f"depth {depth}: the shipped results hold no widened run to continue; train and score one")
    stages = {first["start_steps"] + first["steps"]: first}
    for start, stage in results.get("widened_heads_continued", {}).get(depth, {}).items():
        stages[start + stage["steps"]] = stage
    return stages


def stage_weights(stage: dict, depth: int, name: str) -> dict:
    """The ``name`` models a shipped stage ended with, to train on further or to score beside the next stage."""
    if name not in stage["weights"]:
        raise SystemExit(f"depth {depth}: the shipped stage holds no {name!r} models to continue (it holds "
                         f"{sorted(stage['weights'])}); train and score that first")
    return {key: value.clone() for key, value in stage["weights"][name].items()}


def train(steps: int, learning_rate: float, out: pathlib.Path, processes: int, depths, starts=STARTS,
          continued: bool = False, whitened: bool = False) -> None:
    results = memformer.load_experiments()
    jobs, start_steps = [], {}
    for depth in depths:
        start_steps[depth], weights = start_weights(results, depth)
        if continued:   # a next stage: each model from where the last shipped stage left it, on batches of its own
            stages = shipped_stages(results, depth)
            start_steps[depth] = max(stages)
            jobs += [(depth, name, stage_weights(stages[max(stages)], depth, name), steps, learning_rate, len(stages),
                      whitened) for name in starts]
            continue
        jobs += [(depth, name, weights if name == "one" else widened(weights, HEADS, 60_000 + depth, name), steps,
                  learning_rate, 0, whitened) for name in starts]
    jobs.sort(key=lambda job: -job[0] * (1 if job[1] == "one" else HEADS))      # the slowest first
    trained = {"steps": steps, "learning_rate": learning_rate, "start_steps": start_steps, "continued": continued,
               "whitened": whitened, "torch": str(torch.__version__), "processes": min(processes, len(jobs)),
               "runs": {}}
    begin = time.perf_counter()
    # one process: the jobs run here, one after another; more: spawned (a forked process would share torch's threads)
    with contextlib.nullcontext() if processes == 1 else multiprocessing.get_context("spawn").Pool(processes) as pool:
        for depth, name, run in (map if pool is None else pool.imap_unordered)(train_job, jobs):
            trained["runs"].setdefault(depth, {})[name] = run
            print(f"depth {depth}, {name}: {run['seconds']:.0f} s, last curve "
                  f"{[f'{v:.3g}' for v in run['curve'][:, -1].tolist()]}", flush=True)
            torch.save(trained, out)
    trained["seconds"] = time.perf_counter() - begin
    torch.save(trained, out)
    print(f"done in {trained['seconds']:.0f} s", flush=True)


def _command(trained: dict) -> str:
    """The ``train`` command that made one file."""
    depths = " ".join(map(str, sorted(trained["runs"])))
    names = sorted({name for runs in trained["runs"].values() for name in runs}, key=STARTS.index)
    chosen = "" if tuple(names) == STARTS else " --starts " + " ".join(names)
    return (f"python research/widened_heads.py train FILE --steps {trained['steps']} --learning-rate "
            f"{trained['learning_rate']:g} --depths {depths}{chosen}" + (" --continued" if trained.get("continued")
                                                                         else "")
            + (" --whitened" if trained.get("whitened") else ""))


def _side_by_side(trained: dict) -> str:
    """How many processes trained one file's jobs at once (files written before this was kept: 2)."""
    processes = trained.get("processes", 2)
    return "1 process" if processes == 1 else f"{processes} processes side by side"


def score(paths: list[pathlib.Path], results_path: pathlib.Path) -> None:
    """Score every model the ``train`` files in ``paths`` hold (each depth's runs may come from several files, trained
    with the same steps and rate) beside its start, on that start's million tasks, into ``results_path``."""
    for path in paths:
        if not path.is_file():
            raise SystemExit(f"{path}: no such file; give the files that `train` wrote")
    files = [torch.load(path, map_location="cpu", weights_only=True) for path in paths]
    if len({bool(trained.get("continued")) for trained in files}) > 1:
        raise SystemExit("score either first-stage files or --continued ones, not both at once")
    continued = bool(files[0].get("continued"))
    results = memformer.load_experiments(results_path)
    seeds = list(memformer.RECIPE["seeds"])
    samplers = memformer.setting_samplers(seeds)[:len(seeds)]
    begin, out, by_depth = time.perf_counter(), {}, {}
    for trained in files:
        for depth, runs in trained["runs"].items():
            whitened = bool(trained.get("whitened"))
            first = by_depth.setdefault(depth, {"steps": trained["steps"], "learning_rate": trained["learning_rate"],
                                                "start_steps": trained["start_steps"][depth], "whitened": whitened,
                                                "runs": {}})
            if (first["steps"], first["learning_rate"], first["start_steps"], first["whitened"]) != \
                    (trained["steps"], trained["learning_rate"], trained["start_steps"][depth], whitened):
                raise SystemExit(f"depth {depth}: the files were trained with different steps or rates, from "
                                 f"different stages, or one whitened and one not; score each stage on its own")
            first["runs"].update(runs)
    for depth, group in sorted(by_depth.items()):
        runs = group["runs"]
        if "one" not in runs:
            raise SystemExit(f"depth {depth}: no file holds the 1-head model trained on (the paired reference)")
        _, start = start_weights(results, depth)
        names = sorted(runs, key=STARTS.index)
        earlier = {}
        if continued:   # the models this stage started from: the shipped stage that ended at its start
            stages = shipped_stages(results, depth)
            if group["start_steps"] not in stages:
                raise SystemExit(f"depth {depth}: the file goes on from {group['start_steps']:,} steps, where no "
                                 f"shipped stage ends ({', '.join(f'{end:,}' for end in sorted(stages))})")
            earlier = {f"{name} (before)": stage_weights(stages[group["start_steps"]], depth, name) for name in names}
            for name in names:   # the file must have started from these very models: its first curve point is theirs
                if not torch.allclose(runs[name]["curve"][:, 0], stages[group["start_steps"]]["curve"][name][:, -1],
                                      rtol=1e-9):
                    raise SystemExit(f"depth {depth}: the {name!r} models of the file did not start from the shipped "
                                     f"stage that ends at {group['start_steps']:,} steps; train the stage again")
        rows = {name: [] for name in ("start", *earlier, *names, *(f"{name} - one" for name in names if name != "one"),
                                      "one - start", *(f"{name} - {name} (before)" for name in names if continued))}
        for position, seed in enumerate(seeds):
            models = {}
            for name, weights in (("start", start), *earlier.items(),
                                  *((name, runs[name]["weights"]) for name in names)):
                heads = 1 if name.split(" ")[0] in ("start", "one") else HEADS
                models[name] = memformer.build(FAMILY, depth, heads, "full")
                models[name].load_state_dict(memformer.unstack(weights, position))
            # the tasks that scored the start (memformer.score_groups's seed), so "start" is the shipped number
            # in the same pass, what this stage moved each model (a later stage): "NAME - NAME (before)"
            stage_pairs = [(name, f"{name} (before)") for name in names] if continued else []
            losses, differences = paired_losses(models, samplers[position], "one", memformer.eval_count(depth),
                                                seed=7_000 + 31 * seed + depth, pairs=stage_pairs)
            for name in ("start", *earlier, *names):   # and the mean without the worst 100 tasks of the million
                rows[name].append((losses[name].mean, losses[name].stderr, losses[name].trimmed_mean,
                                   losses[name].trimmed_stderr))
            for name in names:
                if name != "one":
                    rows[f"{name} - one"].append((differences[name].mean, differences[name].stderr))
            rows["one - start"].append((-differences["start"].mean, differences["start"].stderr))
            for name, before in stage_pairs:
                change = differences[f"{name} - {before}"]
                rows[f"{name} - {before}"].append((change.mean, change.stderr))
            print(f"depth {depth}, seed {seed}: " + ", ".join(f"{name} {values[-1][0]:.4g} ± {values[-1][1]:.2g}"
                                                               for name, values in rows.items()), flush=True)
        out[depth] = {"start_steps": group["start_steps"], "steps": group["steps"],
                      "learning_rate": group["learning_rate"], "whitened": group["whitened"],
                      **{name: torch.tensor(values, dtype=torch.float64) for name, values in rows.items()},
                      "curve": {name: runs[name]["curve"] for name in names},
                      "weights": {name: runs[name]["weights"] for name in names}}
    key = "widened_heads_continued" if continued else "widened_heads"
    if continued:   # each depth's later stages, by the 1-head model's steps at their start
        for depth, stage in out.items():
            results.setdefault(key, {}).setdefault(depth, {})[stage["start_steps"]] = stage
    else:
        results.setdefault(key, {}).update(out)      # a later call for other depths keeps these
    command = (" && ".join(_command(trained).replace("FILE", path.name) for trained, path in zip(files, paths))
               + " && python research/widened_heads.py score " + " ".join(path.name for path in paths))
    # the same files scored again replace their record: one entry per run
    results["redone"] = [entry for entry in results.get("redone", []) if entry["command"] != command] + [{
        "command": command,
        "parts": [key],
        "seconds": sum(trained["seconds"] for trained in files) + time.perf_counter() - begin,
        "where": "trained on a 2-core CPU (" + ", ".join(
            f"{trained['seconds']:.0f} s with {_side_by_side(trained)}" for trained in files)
        + f", torch {files[0]['torch']}); scored there ({time.perf_counter() - begin:.0f} s)"}]
    torch.save(results, results_path)
    print(f"wrote {results_path}", flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("what", choices=("train", "score"))
    parser.add_argument("paths", nargs="+", help="train: the file to write; score: the files `train` wrote")
    parser.add_argument("--steps", type=int, default=24_000)
    parser.add_argument("--learning-rate", type=float, default=0.005)
    parser.add_argument("--depths", nargs="*", type=int, default=list(DEPTHS))
    parser.add_argument("--starts", nargs="*", default=list(STARTS), help=f"train: which of {STARTS} (default: all)")
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--continued", action="store_true",
                        help="train: a later stage, each model from where the last shipped stage left it")
    parser.add_argument("--whitened", action="store_true", help="train: Adam steps in the coordinates where each "
                        "seed's inputs are white (memformer.train_models(whitened=True)); the same models and loss")
    parser.add_argument("--results", default=str(memformer.PRETRAINED))
    arguments = parser.parse_args()
    if set(arguments.depths) - set(DEPTHS):
        parser.error(f"depths must be among {DEPTHS}")
    if set(arguments.starts) - set(STARTS):
        parser.error(f"starts must be among {STARTS}")
    if arguments.what == "train":
        if len(arguments.paths) != 1:
            parser.error("train writes one file")
        train(arguments.steps, arguments.learning_rate, pathlib.Path(arguments.paths[0]), arguments.processes,
              arguments.depths, tuple(arguments.starts), arguments.continued, arguments.whitened)
    else:
        score([pathlib.Path(path) for path in arguments.paths], pathlib.Path(arguments.results))
