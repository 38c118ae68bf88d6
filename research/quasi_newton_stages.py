"""Chapter 5's 4-layer quasi-Newton LFOM trained on in stages, each stage scored paired against where it started.

The 4-layer LFOM with every entry of P and Q free (``memformer.FULL_ATTENTION["quasi_newton"]``, trained and scored
on stretched tasks) had not converged after 24 000 steps from scratch: on rotated data its seeds still fell by a
third from 12 000 steps, on isotropic data they parted ways (research/README.md, 2026-11-27, third entry).  Training
from scratch for longer starts a new warm-up and decay and may end in another basin; a stage here instead trains
each shipped model on from where it ended (``memformer.train_models(start=...)``), on a stream of stretched batches
it has not met, with a warm-up and a cosine decay of its own at a lower peak rate, and then scores its end beside
its start on the very million stretched tasks that scored the start (``memformer.score_groups``'s seed).  So what a
stage moved comes with a paired standard error, far smaller than either loss's: the test of "has it stopped moving".

    python research/quasi_newton_stages.py train qn_stage_1.pt --steps 12000 --learning-rate 0.005    # 471 s
    python research/quasi_newton_stages.py score qn_stage_1.pt                                      # 120 s

and the same into ``qn_stage_2.pt`` and ``qn_stage_3.pt`` (597 s and 464 s to train, about 2 minutes each to score),
then three times at ``--learning-rate 0.0005`` into ``qn_stage_4.pt``, ``qn_stage_5.pt`` and ``qn_stage_6.pt`` (464 s,
467 s and 569 s, the last beside short notebook runs): the shipped stages, on a 2-core CPU, to 96 000 steps in all.
The shipped branch from the 3 000-step models, sixteen stages at 0.0005 to 195 000 steps:

    python research/quasi_newton_stages.py train qn_branch_1.pt --steps 12000 --learning-rate 0.0005 --from 3000
    python research/quasi_newton_stages.py score qn_branch_1.pt

and the same into ``qn_branch_2.pt``, ``qn_branch_3.pt`` and ``qn_branch_4.pt`` (592, 479, 469 and 454 s to train, the
first beside short notebook runs; 114-145 s to score), then ``qn_branch_5.pt`` with ``--device cuda`` on one H200
(384 s) and ``qn_branch_6.pt`` to ``qn_branch_14.pt`` on the CPU again (508, 478, 482, 690, 693, 762, 800, 711 and
655 s; the last six on a slower 2-core machine, scored in 157-196 s), then two stages with Adam in white coordinates,
``qn_branch_15.pt`` and ``qn_branch_16.pt`` with ``--whitened`` (1 605 and 1 532 s on a 2-core CPU about half as fast;
225-280 s to score). The shipped branches from
the 1 500- and 6 000-step models, to see whether that start was lucky, five stages each (the first on the H200, side by
side with ``qn_branch_5.pt``, 383 s; the later ones on the CPU, 2 processes side by side, 476-620 s; each scored on the
CPU in about 2 minutes):

    python research/quasi_newton_stages.py train qn_branch_1500_1.pt --steps 12000 --learning-rate 0.0005 --from 1500 \
        --device cuda
    python research/quasi_newton_stages.py score qn_branch_1500_1.pt

then ``qn_branch_1500_2.pt`` to ``qn_branch_1500_5.pt`` without ``--device``, and the same with 6000.

``train`` runs one process per setting (rotated, isotropic), each with its 3 seeds; the first stage starts from the
longest shipped training, each later one from the last shipped stage.  The stages ended 1.8 to 2.1 times above the
best 3 000-step run from scratch (isotropic seed 2), so the long training settled in a worse basin; ``--from 3000``
starts a branch from the shipped 3 000-step trainings instead (every seed and setting), and each later stage with
the same ``--from`` goes on from that branch's last stage.  ``--device cuda`` trains on a GPU (the tasks are still
drawn on the CPU, and ``score`` runs there; the command that redoes a stage names the device it trained on); such
models are launch-bound, so a GPU gains by running several branches side by side, not by a faster step.
``--whitened`` lets Adam step in the coordinates where each seed's inputs are white
(``memformer.train_models(whitened=True)``: the same models and loss; on isotropic data a plain stage); the stage's
record keeps ``"whitened"`` and the command that redoes it says ``--whitened``.
``score`` writes
``results["quasi_newton_stages"][start_steps]``: ``"steps"``, ``"learning_rate"`` and per setting ``"before"``,
``"after"`` and ``"after - before"`` (seeds, 2: mean and standard error over a million stretched tasks), the stage's
``"curve"`` (seeds, checkpoints: its own check tasks) and the ``"weights"`` it ended with; a branch's stages go to
``results["quasi_newton_branches"][origin][start_steps]``.  Scoring the same file
again replaces its stage and its entry in ``results["redone"]``.
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

PART, DEPTH, KEY, BRANCHES = "quasi_newton", 4, "quasi_newton_stages", "quasi_newton_branches"
FAMILY = memformer.FULL_ATTENTION[PART][0]
SETTINGS = memformer.SETTINGS


def shipped_stages(results: dict, origin: int | None = None) -> dict:
    """The 4-layer LFOM's shipped trainings, by their steps at the end: the longest from scratch, then each later
    stage; each ``{setting: {"weights" (seeds first), "curve"}}``.  With ``origin``, the branch that starts from the
    shipped training of ``origin`` steps from scratch instead, then each of that branch's stages."""
    column = memformer.FULL_ATTENTION_DEPTHS.index(DEPTH)
    lengths = {memformer.longest_training(results, PART, setting)[0][column] for setting in SETTINGS}
    if len(lengths) != 1:
        raise SystemExit(f"the settings' longest trainings differ ({sorted(lengths)} steps); train both as long")
    longest = lengths.pop()
    steps = longest if origin is None else origin
    runs = results if steps == results["full_attention_steps"] else results["full_attention_lengths"].get(steps, {})
    if origin is not None:
        shipped = sorted(length for length, trainings in [(results["full_attention_steps"], results),
                                                          *results["full_attention_lengths"].items()]
                         if all(DEPTH in trainings.get(PART, {}).get(setting, {}) for setting in SETTINGS))
        if origin == longest or origin not in shipped:
            raise SystemExit(f"--from {origin}: branch from one of the shorter shipped 4-layer trainings "
                             f"({', '.join(f'{length}' for length in shipped if length != longest)} steps); "
                             f"leave --from out to go on from the longest ({longest} steps)")
    stages = {steps: {setting: runs[PART][setting][DEPTH] for setting in SETTINGS}}
    later = results.get(KEY, {}) if origin is None else results.get(BRANCHES, {}).get(origin, {})
    for start, stage in sorted(later.items()):
        stages[start + stage["steps"]] = {setting: stage[setting] for setting in SETTINGS}
    return stages


def train_job(job) -> tuple:
    setting, start, steps, learning_rate, batch_seed, device, whitened = job
    torch.set_num_threads(1)
    seeds, index = list(memformer.RECIPE["seeds"]), SETTINGS.index(setting)
    samplers = memformer.setting_samplers(seeds)[index * len(seeds):(index + 1) * len(seeds)]
    recipe = dict(memformer.full_attention_recipe(PART, steps), depths=(DEPTH,), learning_rate=learning_rate)
    begin = time.perf_counter()
    trained = memformer.train_models(FAMILY, (DEPTH,), samplers, seeds, recipe, attention="full", stretched=True,
                                     start=start, batch_seed=batch_seed + index, device=device, whitened=whitened)
    weights, curve = trained[DEPTH]
    return setting, {"weights": weights, "curve": curve, "start": start, "seconds": time.perf_counter() - begin}


def train(steps: int, learning_rate: float, out: pathlib.Path, processes: int = 2, origin: int | None = None,
          device: str = "cpu", whitened: bool = False) -> None:
    try:
        device = memformer.available_device(device)
    except ValueError as error:
        raise SystemExit(f"--device {device}: {error}") from None
    where = (torch.cuda.get_device_name(device) if device.type == "cuda" else
             "a 2-core CPU" if device.type == "cpu" else str(device))
    stages = shipped_stages(memformer.load_experiments(), origin)
    start_steps = max(stages)
    # each stage of each branch meets a stream of batches of its own
    batch_seed = (80_000 if origin is None else 1_000_000 + 100 * origin) + 1_000 * len(stages)
    jobs = [(setting, {k: v.clone() for k, v in stages[start_steps][setting]["weights"].items()}, steps,
             learning_rate, batch_seed, str(device), whitened) for setting in SETTINGS]
    trained = {"steps": steps, "learning_rate": learning_rate, "start_steps": start_steps, "origin": origin,
               "torch": str(torch.__version__), "processes": min(processes, len(jobs)), "where": where,
               "device": device.type, "whitened": whitened, "runs": {}}
    begin = time.perf_counter()
    # spawned, not forked: a forked process would share torch's threads
    with contextlib.nullcontext() if processes == 1 else multiprocessing.get_context("spawn").Pool(processes) as pool:
        for setting, run in (map if pool is None else pool.imap_unordered)(train_job, jobs):
            trained["runs"][setting] = run
            print(f"{setting}: {run['seconds']:.0f} s, curve {[f'{v:.3g}' for v in run['curve'][:, 0].tolist()]} -> "
                  f"{[f'{v:.3g}' for v in run['curve'][:, -1].tolist()]}", flush=True)
            torch.save(trained, out)
    trained["seconds"] = time.perf_counter() - begin
    torch.save(trained, out)
    print(f"done in {trained['seconds']:.0f} s", flush=True)


def score(path: pathlib.Path, results_path: pathlib.Path) -> None:
    """Score the end of the stage in ``path`` beside its start, paired, into ``results_path``."""
    if not path.is_file():
        raise SystemExit(f"{path}: no such file; give the file that `train` wrote")
    trained = torch.load(path, map_location="cpu", weights_only=True)
    results, origin = memformer.load_experiments(results_path), trained.get("origin")
    stages, start_steps = shipped_stages(results, origin), trained["start_steps"]
    if start_steps not in stages or sorted(trained["runs"]) != sorted(SETTINGS):
        raise SystemExit(f"{path} goes on from {start_steps:,} steps with {sorted(trained['runs'])}; the shipped "
                         f"trainings end at {', '.join(f'{end:,}' for end in sorted(stages))}: train the stage again")
    seeds = list(memformer.RECIPE["seeds"])
    samplers = memformer.setting_samplers(seeds)
    whitened = trained.get("whitened", False)
    begin, stage = time.perf_counter(), {"start_steps": start_steps, "steps": trained["steps"],
                                         "learning_rate": trained["learning_rate"], "origin": origin,
                                         "whitened": whitened}
    for index, setting in enumerate(SETTINGS):
        run, before = trained["runs"][setting], stages[start_steps][setting]["weights"]
        if any(not torch.equal(run["start"][k], before[k]) for k in before):
            raise SystemExit(f"{path}: its {setting} models did not start from the shipped ones that end at "
                             f"{start_steps:,} steps; train the stage again")
        rows = {"before": [], "after": [], "after - before": []}
        for position, seed in enumerate(seeds):
            models = {}
            for name, weights in (("before", before), ("after", run["weights"])):
                models[name] = memformer.build(FAMILY, DEPTH, 1, "full")
                models[name].load_state_dict(memformer.unstack(weights, position))
            losses, differences = paired_losses(models, memformer.stretched_tasks(samplers[index * len(seeds) +
                                                                                           position]),
                                                "before", memformer.eval_count(DEPTH), seed=7_000 + 31 * seed + DEPTH)
            for name, estimate in (*losses.items(), ("after - before", differences["after"])):
                rows[name].append((estimate.mean, estimate.stderr))
            print(f"{setting}, seed {seed}: " + ", ".join(f"{name} {values[-1][0]:.4g} ± {values[-1][1]:.2g}"
                                                          for name, values in rows.items()), flush=True)
        stage[setting] = {**{name: torch.tensor(values, dtype=torch.float64) for name, values in rows.items()},
                          "curve": run["curve"], "weights": run["weights"]}
    branch = results.setdefault(KEY, {}) if origin is None else results.setdefault(BRANCHES, {}).setdefault(origin, {})
    branch[start_steps] = stage
    device = trained.get("device", "cpu")
    command = (f"python research/quasi_newton_stages.py train {path.name} --steps {trained['steps']} --learning-rate "
               f"{trained['learning_rate']:g}{'' if origin is None else f' --from {origin}'}"
               f"{'' if device == 'cpu' else f' --device {device}'}{' --whitened' if whitened else ''} && "
               f"python research/quasi_newton_stages.py score {path.name}")
    # the same file scored again replaces its record: one entry per run
    results["redone"] = [entry for entry in results.get("redone", []) if entry["command"] != command] + [{
        "command": command, "parts": [KEY if origin is None else BRANCHES],
        "seconds": trained["seconds"] + time.perf_counter() - begin,
        "where": f"trained on {trained.get('where', 'a 2-core CPU')} ({trained['seconds']:.0f} s with "
                 + ("1 process" if trained["processes"] == 1 else f"{trained['processes']} processes side by side")
                 + f", torch {trained['torch']}); scored on a 2-core CPU ({time.perf_counter() - begin:.0f} s)"}]
    torch.save(results, results_path)
    print(f"wrote {results_path}", flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("what", choices=("train", "score"))
    parser.add_argument("path", help="train: the file to write; score: the file `train` wrote")
    parser.add_argument("--steps", type=int, default=12_000)
    parser.add_argument("--learning-rate", type=float, default=0.005)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--from", dest="origin", type=int, default=None,
                        help="train: branch from the shipped 4-layer training of this many steps from scratch "
                             "(then go on from that branch's last stage) instead of the longest")
    parser.add_argument("--device", default="cpu", help="train: where the models train (cpu, cuda, auto); the "
                        "tasks are drawn on the CPU either way, and score runs on the CPU")
    parser.add_argument("--whitened", action="store_true", help="train: Adam steps in the coordinates where each "
                        "seed's inputs are white (memformer.train_models(whitened=True)); the same models and loss")
    parser.add_argument("--results", default=str(memformer.PRETRAINED))
    arguments = parser.parse_args()
    if arguments.what == "train":
        train(arguments.steps, arguments.learning_rate, pathlib.Path(arguments.path), arguments.processes,
              arguments.origin, arguments.device, arguments.whitened)
    else:
        score(pathlib.Path(arguments.path), pathlib.Path(arguments.results))
