"""Do more heads lower the expected loss? Chapter 5's every-entry models trained on from the exact GD++ optimum.

Trained on plain batches, chapter 5's CGD-like models with every entry of ``P`` and ``Q`` free have expected losses
carried by tasks no sample holds (section 11: at 3 layers 0.05, at 4 layers 10^22, against million-task means of
3e-4 and 6e-7), so a comparison of 1 and 5 heads there compares typical tasks.  This one starts both from a model
whose expected loss is known exactly and small: the GD++ Memformer that minimises it
(``icl_course.spectra.load_optima``, which one head writes), and trains on **stretched** batches
(``memformer.stretched_tasks``: every batch meets the rare large eigenvalues, weighted back), on the isotropic data
(for this family the rotated data are the same problem in other coordinates, exactly):

- ``one``: the optimum itself as a 1-head model (the control; the 1-head family is larger than the GD++ form, so
  it may still move);
- ``five``: the optimum as the first of 5 heads, four new heads with ``P_k = 0`` and small random ``Q_k``
  (``memformer.widen_heads``): the same function at the start.

Three runs each (seeds 0-2: their own batches and new heads), Adam with the recipe's warm-up, cosine decay and
clipping at peak rate ``--learning-rate``.  ``score`` evaluates every model beside the optimum on the same million
stretched tasks (paired differences) and, as a check on the tail, the exact expected loss of each model's GD++ part
(``spectra.gdpp_part``), which the stretched sample cannot fake.

    python research/heads_from_the_optimum.py train heads_3.pt --depth 3 --steps 24000 --learning-rate 0.0005
    python research/heads_from_the_optimum.py score heads_3.pt

research/README.md has the commands as run, their times and the findings.
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing
import pathlib
import time

import torch

from icl_course import memformer, spectra
from icl_course.evaluate import paired_losses

FAMILY, HEADS, SEEDS = "CGD-like + A_l", 5, (0, 1, 2)


def starts(depth: int) -> dict:
    """The exact GD++ optimum of ``depth`` layers as stacked state dicts (seeds first): one head, and five."""
    fit = spectra.load_optima()[depth]
    one = spectra.gdpp_memformer(fit["w_xx"], fit["w_yx"], fit["alpha"], fit["gamma"]).state_dict()
    one = {key: value[None].expand(len(SEEDS), *value.shape).clone() for key, value in one.items()}
    return {"one": one, "five": memformer.widen_heads(one, HEADS, seed=70_000 + depth, how="new")}


def train_job(job) -> tuple:
    name, depth, start, steps, learning_rate = job
    torch.set_num_threads(1)
    samplers = [memformer.paper_tasks("isotropic") for _ in SEEDS]
    recipe = dict(memformer.full_attention_recipe("heads", steps), depths=(depth,), learning_rate=learning_rate)
    begin = time.perf_counter()
    trained = memformer.train_models(FAMILY, (depth,), samplers, list(SEEDS), recipe, attention="full",
                                     num_heads=1 if name == "one" else HEADS, start=start, stretched=True,
                                     batch_seed=80_000 + depth)
    weights, curve = trained[depth]
    return name, {"weights": weights, "curve": curve, "seconds": time.perf_counter() - begin}


def train(out: pathlib.Path, depth: int, steps: int, learning_rate: float, processes: int) -> None:
    jobs = [(name, depth, start, steps, learning_rate) for name, start in starts(depth).items()]
    record = {"depth": depth, "steps": steps, "learning_rate": learning_rate, "torch": str(torch.__version__),
              "processes": processes, "runs": {}}
    begin = time.perf_counter()
    with contextlib.nullcontext() if processes == 1 else multiprocessing.get_context("spawn").Pool(processes) as pool:
        for name, run in (map if pool is None else pool.imap_unordered)(train_job, jobs):
            record["runs"][name] = run
            print(f"{name}: {run['seconds']:.0f} s, curve (stretched, weighted) from "
                  f"{[f'{v:.3g}' for v in run['curve'][:, 0].tolist()]} to "
                  f"{[f'{v:.3g}' for v in run['curve'][:, -1].tolist()]}", flush=True)
            torch.save(record, out)
    record["seconds"] = time.perf_counter() - begin
    torch.save(record, out)


def score(path: pathlib.Path, num_tasks: int) -> None:
    if not path.is_file():
        raise SystemExit(f"{path}: no such file; give the file that `train` wrote")
    record = torch.load(path, map_location="cpu", weights_only=True)
    if "runs" not in record or "depth" not in record:
        raise SystemExit(f"{path}: not a file of this script's `train`")
    depth = record["depth"]
    fit = spectra.load_optima()[depth]
    models = {"optimum": spectra.gdpp_memformer(fit["w_xx"], fit["w_yx"], fit["alpha"], fit["gamma"])}
    for name, run in record["runs"].items():
        for index, seed in enumerate(SEEDS):
            model = memformer.build(FAMILY, depth, 1 if name == "one" else HEADS, "full")
            model.load_state_dict(memformer.unstack(run["weights"], index))
            models[f"{name} {seed}"] = model
    begin = time.perf_counter()
    tasks = memformer.stretched_tasks(memformer.paper_tasks("isotropic"))
    losses, differences = paired_losses(models, tasks, "optimum", num_tasks, seed=90_000 + depth,
                                        pairs=[(f"five {seed}", f"one {seed}") for seed in SEEDS])
    exact = {name: spectra.gdpp_memformer_loss(**{key: part[key] for key in ("w_xx", "w_yx", "alpha", "gamma")})[-1]
             .item() for name, part in ((name, spectra.gdpp_part(model)) for name, model in models.items())}
    rest = {name: spectra.gdpp_part(model)["rest"].max().item() for name, model in models.items()}
    record["scores"] = {"num_tasks": num_tasks, "seconds": time.perf_counter() - begin,
                        "losses": {name: (e.mean, e.stderr, e.trimmed_mean) for name, e in losses.items()},
                        "differences": {name: (e.mean, e.stderr) for name, e in differences.items()},
                        "exact_gdpp_part": exact, "rest": rest, "exact_optimum": fit["loss"]}
    torch.save(record, path)
    print(f"{depth} layers, {num_tasks:,} stretched tasks ({record['scores']['seconds']:.0f} s); the optimum exactly "
          f"{fit['loss']:.4g}")
    for name, estimate in losses.items():
        gap = differences.get(name)
        print(f"  {name:8s} {estimate.mean:.4g} ± {estimate.stderr:.2g}"
              + (f"   - optimum: {100 * gap.mean / fit['loss']:+.2f}% ± {100 * gap.stderr / fit['loss']:.2f}%"
                 if gap is not None else "")
              + f"   GD++ part exactly {exact[name]:.4g}, rest {rest[name]:.1%}")
    for seed in SEEDS:
        gap = differences[f"five {seed} - one {seed}"]
        print(f"  five {seed} - one {seed}: {100 * gap.mean / fit['loss']:+.2f}% "
              f"± {100 * gap.stderr / fit['loss']:.2f}% of the optimum's loss")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    trainer = commands.add_parser("train", help="train one and five heads from the optimum into FILE")
    trainer.add_argument("file", type=pathlib.Path)
    trainer.add_argument("--depth", type=int, choices=(2, 3, 4), required=True)
    trainer.add_argument("--steps", type=int, default=24_000)
    trainer.add_argument("--learning-rate", type=float, default=0.0005)
    trainer.add_argument("--processes", type=int, default=2)
    scorer = commands.add_parser("score", help="score a FILE that `train` wrote, into the same file")
    scorer.add_argument("file", type=pathlib.Path)
    scorer.add_argument("--tasks", type=int, default=1_000_000)
    args = parser.parse_args(argv)
    if args.command == "train":
        train(args.file, args.depth, args.steps, args.learning_rate, args.processes)
    else:
        score(args.file, args.tasks)


if __name__ == "__main__":
    main()
