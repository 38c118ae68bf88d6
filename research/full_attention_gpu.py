"""Chapter 5's models with every entry of P and Q trained longer, on a GPU, one process per depth.

The chapter's two full-attention parts (``icl_course.memformer.FULL_ATTENTION``: the CGD-like Memformer with 1
and 5 heads on the rotated data, Dutta and Sra's Figure 5; the tied-gate LFOM on both settings, their Figure 3)
had not converged after the recipe's 6 000 Adam steps on a CPU.  Such models are launch-bound on a GPU (a step
is hundreds of tiny kernels), so one process per (part, key, depth) runs side by side, and every group is
trained at two lengths, ``steps`` and ``steps // 2``: where doubling the training moves the fresh-task loss by
less than the spread of the seeds, the model has converged.

The models of one group are those of :func:`icl_course.memformer.run_experiments` for that depth: the same
recipe (Adam, warm-up, cosine decay, clipping, batch 500) but ``num_steps``, the same seeds and the same task
stream (training each depth alone draws the same batches as training all depths at once).

    python research/full_attention_gpu.py time --device cuda              # ms per step, all groups side by side
    python research/full_attention_gpu.py train --device cuda --steps 3000 --out trained_3000.pt
    python research/full_attention_gpu.py train --device cuda --steps 12000 --out trained_12000.pt
    python research/full_attention_gpu.py score trained_3000.pt trained_12000.pt   # on the CPU: the shipped file

(the shipped file was made by exactly these, on one H200: 94 s and 354 s of training; then the heads' deepest models
were trained longer on the development CPU, 2 processes side by side, and merged in:

    python research/full_attention_gpu.py train --device cpu --processes 2 --steps 48000 --parts heads --depths 4 \
        --out trained_48000.pt                       # 3 856 s; scoring 382 s
    python research/full_attention_gpu.py score trained_48000.pt
    python research/full_attention_gpu.py train --device cpu --processes 2 --steps 24000 --parts heads --depths 3 \
        --out trained_24000.pt                       # 1 452 s; scoring 87 s
    python research/full_attention_gpu.py score trained_24000.pt
    python research/full_attention_gpu.py train --device cpu --processes 2 --steps 48000 --parts heads --depths 3 \
        --heads 5 --out trained_48000.pt             # 1 409 s; scoring 52 s
    python research/full_attention_gpu.py score trained_48000.pt
    python research/full_attention_gpu.py train --device cpu --processes 2 --steps 96000 --parts heads --depths 3 \
        --heads 5 --out trained_96000.pt             # 4 645 s (a slower day: the 48 000 above took 2 372); scoring 81 s
    python research/full_attention_gpu.py score trained_96000.pt

and the 4-layer quasi-Newton LFOM again on stretched batches (``FULL_ATTENTION_STRETCHED``), one process:

    python research/full_attention_gpu.py train --device cpu --processes 1 --steps 12000 --parts quasi_newton \
        --depths 4 --out trained_12000.pt           # 1 322 s
    python research/full_attention_gpu.py train --device cpu --processes 1 --steps 3000 --parts quasi_newton \
        --depths 4 --out trained_3000.pt            # 334 s
    python research/full_attention_gpu.py score trained_12000.pt trained_3000.pt   # 261 s
    python research/full_attention_gpu.py train --device cpu --processes 2 --steps 24000 --parts quasi_newton \
        --depths 4 --out trained_24000.pt           # 2 620 s (its 12 000-step models are the shipped ones)
    python research/full_attention_gpu.py score trained_24000.pt                    # 147 s

``--parts``, ``--depths`` and ``--heads`` train some groups only; ``score`` merges each (part, key, depth) at its
length).
The depths of ``memformer.FULL_ATTENTION_STRETCHED`` (the quasi-Newton LFOM's 4 layers) train on stretched batches
and are scored on stretched tasks, as ``run_experiments`` does; a file's runs say which (``"stretched"``).
``score`` scores every model on fresh tasks on the CPU in float64 (as ``run_experiments`` does) and writes into
``icl_course/pretrained/ch5_memformers.pt`` the longest training that covers every group (``results["heads"]``,
``results["quasi_newton"]``, ``full_attention_steps``) and every other one beside it
(``results["full_attention_lengths"][steps]``), the convergence check.  ``--seconds S`` instead of ``--steps``
times the groups first and picks the most steps that fit (it overestimates: the 100 timed steps include each
process's start).
"""

from __future__ import annotations

import argparse
import multiprocessing
import pathlib
import time

import torch

from icl_course import memformer

DEPTHS = memformer.FULL_ATTENTION_DEPTHS
GROUPS = [(part, key, depth) for part, (_, keys) in memformer.FULL_ATTENTION.items()
          for key in (keys if part == "heads" else (None,)) for depth in DEPTHS]


def train_group(part: str, key, depth: int, steps: int, device: str) -> dict:
    """One depth of one part trained for ``steps``: ``{key: {depth: {"weights", "curve"}}}`` and its seconds."""
    family, keys = memformer.FULL_ATTENTION[part]
    seeds = list(memformer.RECIPE["seeds"])
    samplers = memformer.setting_samplers(seeds)
    recipe = memformer.full_attention_recipe(part, steps, dict(memformer.RECIPE, depths=(depth,)))
    start = time.perf_counter()
    if part == "heads":
        groups = memformer.train_groups(family, samplers[:len(seeds)], seeds, recipe, 1, "full", key, device)
        runs = {key: groups[0]}
    else:
        groups = memformer.train_groups(family, samplers, seeds, recipe, len(keys), "full", 1, device)
        runs = dict(zip(keys, groups))
    return {"runs": runs, "seconds": time.perf_counter() - start}


def _worker(job):
    part, key, depth, steps, device = job
    torch.set_num_threads(1)
    if device.startswith("cuda"):   # start CUDA before the clock: its start-up is no part of a step
        torch.ones(8, 8, device=device, dtype=torch.float64).matmul(torch.ones(8, 8, device=device,
                                                                               dtype=torch.float64)).sum().item()
    return job, train_group(part, key, depth, steps, device)


def _jobs(steps_list, device, groups=None):
    # the slowest first, so that the pool's last minutes are not one long job alone
    jobs = [(part, key, depth, steps, device) for steps in steps_list for part, key, depth in groups or GROUPS]
    return sorted(jobs, key=lambda job: -(job[2] * (job[1] or 2) * job[3]))


class _InProcess:
    """A pool of one: the jobs run here, one after another (``--processes 1``)."""

    def __enter__(self):
        return self

    def __exit__(self, *exception):
        return False

    def imap_unordered(self, function, jobs):
        return map(function, jobs)


def _pool(processes: int):
    # spawn, not fork: CUDA cannot be forked
    return _InProcess() if processes == 1 else multiprocessing.get_context("spawn").Pool(processes)


def chosen_groups(parts=None, depths=None, heads=None) -> list:
    """The groups of ``GROUPS`` in ``parts`` (names of ``memformer.FULL_ATTENTION``), ``depths`` and, for the heads
    part, ``heads`` (numbers of heads; None: all)."""
    unknown = set(parts or ()) - set(memformer.FULL_ATTENTION)
    if unknown:
        raise SystemExit(f"unknown part {sorted(unknown)}: choose among {list(memformer.FULL_ATTENTION)}")
    if set(depths or ()) - set(DEPTHS):
        raise SystemExit(f"depths must be among {DEPTHS}; got {depths}")
    if set(heads or ()) - set(memformer.FULL_ATTENTION["heads"][1]):
        raise SystemExit(f"heads must be among {memformer.FULL_ATTENTION['heads'][1]}; got {heads}")
    return [(part, key, depth) for part, key, depth in GROUPS
            if (not parts or part in parts) and (not depths or depth in depths)
            and (part != "heads" or not heads or key in heads)]


def train(steps: int, device: str, out: pathlib.Path, processes: int, groups=None) -> None:
    begin = time.perf_counter()
    groups = GROUPS if groups is None else groups
    trained = {"steps": steps, "half_steps": steps // 2, "device": device, "torch": str(torch.__version__),
               "seconds": {}, steps: {}, steps // 2: {}}
    if device.startswith("cuda"):
        trained["device_name"] = torch.cuda.get_device_name()
    with _pool(processes) as pool:
        for (part, _, _, length, _), result in pool.imap_unordered(_worker, _jobs((steps, steps // 2), device,
                                                                                  groups)):
            for key, group in result["runs"].items():
                for depth, run in group.items():
                    trained[length].setdefault(part, {}).setdefault(key, {})[depth] = run
                    trained["seconds"][f"{part} {key} {depth} {length}"] = result["seconds"]
                    print(f"{part} {key} depth {depth}, {length} steps: {result['seconds']:.0f} s, last curve "
                          f"{[round(v, 5) for v in run['curve'][:, -1].tolist()]}", flush=True)
            torch.save(trained, out)
    trained["total_seconds"], trained["processes"] = time.perf_counter() - begin, processes
    torch.save(trained, out)
    print(f"done in {trained['total_seconds']:.0f} s", flush=True)


def time_steps(device: str, steps: int, processes: int) -> dict:
    """Seconds per step of every group, all trained side by side for ``steps`` steps: ``{(part, key, depth): s}``."""
    begin, seconds = time.perf_counter(), {}
    with _pool(processes) as pool:
        for (part, key, depth, _, _), result in pool.imap_unordered(_worker, _jobs((steps,), device)):
            seconds[part, key, depth] = result["seconds"] / steps
            print(f"{part} {key} depth {depth}: {1000 * seconds[part, key, depth]:.1f} ms per step", flush=True)
    print(f"all groups side by side, {steps} steps: {time.perf_counter() - begin:.1f} s", flush=True)
    return seconds


def steps_within(seconds: float, per_step: dict, processes: int) -> int:
    """The most steps (a multiple of 1 000) whose two lengths, ``steps`` and ``steps // 2`` for every group,
    fit in ``seconds`` on ``processes`` side by side: longest job first onto the least loaded process, each
    job costing its measured time per step (measured side by side, so contention is in it)."""
    costs = sorted([cost for cost in per_step.values()] + [cost / 2 for cost in per_step.values()], reverse=True)
    loads = [0.0] * processes
    for cost in costs:
        loads[loads.index(min(loads))] += cost
    return int(seconds / max(loads) // 1000 * 1000)


def _command(trained: dict) -> str:
    """The ``train`` command that made one file (its parts and depths read from what it holds)."""
    parts = sorted(trained[trained["steps"]])
    depths = sorted({depth for part in parts for runs in trained[trained["steps"]][part].values() for depth in runs})
    heads = sorted(trained[trained["steps"]].get("heads", {}))
    narrowed = ("" if parts == sorted(memformer.FULL_ATTENTION) else " --parts " + " ".join(parts)) + \
        ("" if depths == sorted({depth for _, _, depth in GROUPS}) else " --depths " + " ".join(map(str, depths))) + \
        ("" if heads in ([], list(memformer.FULL_ATTENTION["heads"][1])) else " --heads " + " ".join(map(str, heads)))
    processes = f" --processes {trained['processes']}" if trained.get("processes", len(GROUPS)) != len(GROUPS) else ""
    return (f"python research/full_attention_gpu.py train --device {trained['device']}{processes} --steps "
            f"{trained['steps']}{narrowed} --out trained_{trained['steps']}.pt")


def _side_by_side(trained: dict) -> str:
    """How a ``train`` file's groups ran (files made before it was recorded ran one process per group)."""
    processes = trained.get("processes")
    if processes == 1:
        return "one process, one group after another"
    return f"{processes} processes side by side" if processes else "one process per depth and length side by side"


def score(paths: list[pathlib.Path], results_path: pathlib.Path) -> None:
    """Score every model that the ``train`` files in ``paths`` hold, on the CPU, and merge them into the results,
    each (part, key, depth) at its number of steps.  The longest length the files hold for every group of both parts
    becomes ``results[part]`` (``results["full_attention_steps"]``; the length shipped there before moves among the
    shorter ones); every other length goes to ``results["full_attention_lengths"][steps][part][key][depth]``,
    replacing only the models of the same length, part, key and depth.  So a file of a few groups trained longer
    (``train --parts heads --depths 3 4``) adds lengths for those depths and keeps the rest."""
    files = [torch.load(path, map_location="cpu", weights_only=True) for path in paths]
    results = memformer.load_experiments(results_path)
    seeds = list(memformer.RECIPE["seeds"])
    samplers = memformer.setting_samplers(seeds)
    begin = time.perf_counter()
    scored = {}
    for trained in files:
        for length in (trained["steps"], trained["half_steps"]):
            for part, (family, keys) in memformer.FULL_ATTENTION.items():
                for key, runs in trained[length].get(part, {}).items():
                    group = {depth: runs[depth] for depth in sorted(runs)}
                    index = 0 if part == "heads" else keys.index(key)
                    recipe = dict(memformer.RECIPE, stretched_depths=tuple(   # as each depth was trained
                        depth for depth, run in group.items() if run.get("stretched", False)))
                    memformer.score_groups([{}] * index + [group], family, samplers, seeds, recipe, "full",
                                           key if part == "heads" else 1)
                    print(f"{part} {key}, {length} steps, depths {list(group)}: "
                          f"{[round(group[d]['mean'][:, -1].mean().item(), 6) for d in group]}", flush=True)
                    scored.setdefault(length, {}).setdefault(part, {}).setdefault(key, {}).update(group)
    every = [(part, key, depth) for part, (_, keys) in memformer.FULL_ATTENTION.items() for key in keys
             for depth in sorted({depth for _, _, depth in GROUPS})]
    complete = [length for length, parts in scored.items()
                if all(depth in parts.get(part, {}).get(key, {}) for part, key, depth in every)]
    lengths = results.setdefault("full_attention_lengths", {})
    shipped = results.get("full_attention_steps")
    if complete and max(complete) != shipped:
        if shipped is not None:   # the old longest training stays, as one of the lengths
            lengths[shipped] = {part: results[part] for part in memformer.FULL_ATTENTION if part in results}
        shipped = results["full_attention_steps"] = max(complete)
    for length, parts in scored.items():
        for part, keys in parts.items():
            for key, group in keys.items():
                target = results if length == shipped else lengths.setdefault(length, {})
                target.setdefault(part, {}).setdefault(key, {}).update(group)
    lengths.pop(shipped, None)
    for part in memformer.FULL_ATTENTION:   # the CPU's time for the parts replaced; their own is in "redone"
        results.get("seconds", {}).pop(part, None)
    where = "; ".join(f"--steps {file['steps']}: {file['total_seconds']:.0f} s on "
                      f"{file.get('device_name', file['device'])} (torch {file['torch']}), {_side_by_side(file)}"
                      for file in files)
    results["redone"] = results.get("redone", []) + [{
        "command": " && ".join(_command(trained) for trained in files)
        + " && python research/full_attention_gpu.py score "
        + " ".join(f"trained_{trained['steps']}.pt" for trained in files),
        "parts": sorted({part for parts in scored.values() for part in parts}),
        "seconds": sum(trained["total_seconds"] for trained in files) + time.perf_counter() - begin,
        "where": f"trained ({where}); scored on a 2-core CPU "
                 f"({time.perf_counter() - begin:.0f} s)"}]
    torch.save(results, results_path)
    print(f"wrote {results_path}", flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("what", choices=("time", "train", "score"))
    parser.add_argument("paths", nargs="*", help="score: the files `train` wrote (the longest training is shipped)")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--steps", type=int, default=40_000)
    parser.add_argument("--seconds", type=float, default=None,
                        help="train: instead of --steps, the most steps whose training fits in this many seconds")
    parser.add_argument("--processes", type=int, default=len(GROUPS))
    parser.add_argument("--parts", nargs="*", default=None, help="train: only these parts (default: both)")
    parser.add_argument("--depths", nargs="*", type=int, default=None, help="train: only these depths (default: 1-4)")
    parser.add_argument("--heads", nargs="*", type=int, default=None,
                        help="train: of the heads part, only these numbers of heads (default: 1 and 5)")
    parser.add_argument("--out", default="full_attention_trained.pt")
    parser.add_argument("--results", default=str(memformer.PRETRAINED))
    arguments = parser.parse_args()
    if arguments.what == "time":
        time_steps(arguments.device, min(arguments.steps, 200), arguments.processes)
    elif arguments.what == "train":
        if arguments.seconds:   # the longest training that fits, measured first on this machine
            per_step = time_steps(arguments.device, 100, arguments.processes)
            arguments.steps = steps_within(arguments.seconds, per_step, arguments.processes)
            print(f"{arguments.steps} steps fit in {arguments.seconds:.0f} s", flush=True)
            if arguments.steps < 2000:
                raise SystemExit("fewer than 2 000 steps fit: give more --seconds")
        train(arguments.steps, arguments.device, pathlib.Path(arguments.out), arguments.processes,
              chosen_groups(arguments.parts, arguments.depths, arguments.heads))
    else:
        if not arguments.paths:
            parser.error("score needs the files that `train` wrote")
        score([pathlib.Path(path) for path in arguments.paths], pathlib.Path(arguments.results))
