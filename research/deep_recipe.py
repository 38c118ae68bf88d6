"""What trains linear transformers of 3 layers and more reliably?  Recipes side by side, on one GPU.

Every recipe trains several seeds of the same model on one noise setting of Table 1 (Vladymyrov
et al. 2024; ``sigma ~ U(0, 5)`` by default), all recipes of one shape, precision and clipping as one
stack (:func:`icl_course.sweep.train_sweep`), and every model is scored on 1 000 000 fresh tasks
(float64, in chunks, paired with the oracle ridge).  A recipe is: learning rate, schedule, warm-up,
final fraction of the cosine, precision, clipping, and initialisation (small random weights, larger
random weights, or the trained model one layer shallower with a fresh last layer).

Run (GPU):  python research/deep_recipe.py --device cuda --steps 8000 --out results/
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from icl_course import LinearTransformer, RegressionTasks
from icl_course.evaluate import adjusted_losses
from icl_course.sweep import ModelSpec, train_sweep
from icl_course.table1 import COLUMNS, PAPER, append_layer, column_noise

# name: (learning rate, schedule, warm-up, final fraction, dtype, clip, init)
RECIPES = {
    "paper: 1e-4 constant": (1e-4, "constant", 0, 0.0, "float32", None, "random"),
    "1e-3 cosine": (1e-3, "cosine", 500, 0.01, "float32", 1.0, "random"),
    "3e-3 cosine": (3e-3, "cosine", 500, 0.01, "float32", 1.0, "random"),
    "1e-3 cosine, init 0.1": (1e-3, "cosine", 500, 0.01, "float32", 1.0, "random0.1"),
    "1e-3 cosine, float64": (1e-3, "cosine", 500, 0.01, "float64", 1.0, "random"),
    "1e-3 cosine, float64, grown": (1e-3, "cosine", 500, 0.01, "float64", 1.0, "grown"),
    "3e-4 cosine, float64, grown": (3e-4, "cosine", 500, 0.01, "float64", 1.0, "grown"),
    "3e-3 cosine, float64, grown": (3e-3, "cosine", 500, 0.01, "float64", 1.0, "grown"),
}


def run_stack(entries, variant, depth, dtype, clip, steps, device, batch, seed):
    """entries: [(label, recipe, seed, init model or None)] -> {name: SweepResult}."""
    specs = []
    for label, recipe, model_seed, init in entries:
        rate, schedule, warmup, _, _, _, _ = recipe
        specs.append(ModelSpec(f"{label}|{model_seed}", column_noise(COLUMN), seed=model_seed, num_steps=steps,
                               learning_rate=rate, warmup_steps=warmup, schedule=schedule, init=init))
    final_fraction = entries[0][1][3]
    return train_sweep(specs, num_layers=depth, parameterization=variant, batch_size=batch, clip_norm=clip,
                       final_fraction=final_fraction, dtype=dtype, device=device, seed=seed, progress=False,
                       log_every=100)


def main(argv=None):
    global COLUMN
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--column", default="5", choices=COLUMNS)
    parser.add_argument("--variants", nargs="+", default=["diag", "full"])
    parser.add_argument("--depths", nargs="+", type=int, default=[3, 4])
    parser.add_argument("--steps", type=int, default=8000)
    parser.add_argument("--shallow-steps", type=int, default=4000)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--batch", type=int, default=2048)
    parser.add_argument("--eval-tasks", type=int, default=1_000_000)
    parser.add_argument("--recipes", nargs="+", default=list(RECIPES))
    parser.add_argument("--out", default="recipe-results")
    args = parser.parse_args(argv)
    COLUMN = args.column
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    column = COLUMNS.index(args.column)
    sampler = RegressionTasks(10, 20, column_noise(args.column), dtype=torch.float64, device=args.device)
    rows, keep = [], {}
    for variant in args.variants:
        # the shallowest depth grows from a 2-layer model trained with the 2-layer recipe
        shallow = run_stack([("2 layers", (5e-3, "cosine", 200, 0.01, "float32", 1.0, "random"), s, None)
                             for s in range(args.seeds)], variant, min(args.depths) - 1, "float32", 1.0,
                            args.shallow_steps, args.device, args.batch, 7)
        previous = {s: shallow[f"2 layers|{s}"].model for s in range(args.seeds)}
        for depth in sorted(args.depths):
            groups = {}
            for label in args.recipes:
                recipe = RECIPES[label]
                for s in range(args.seeds):
                    init = None
                    if recipe[6] == "grown":
                        init = append_layer(previous[s], seed=s)
                    elif recipe[6] == "random0.1":
                        init = LinearTransformer(10, depth, 1, variant, 0.1, seed=s, dtype=torch.float64, device="cpu")
                    groups.setdefault((recipe[4], recipe[5], recipe[3]), []).append((label, recipe, s, init))
            results = {}
            for (dtype, clip, _), entries in groups.items():
                started = time.perf_counter()
                stack = run_stack(entries, variant, depth, dtype, clip, args.steps, args.device, args.batch, depth)
                seconds = time.perf_counter() - started
                for result in stack.values():
                    result.seconds = seconds
                results.update(stack)
            models = {name: result.model.to(args.device) for name, result in results.items()}
            started = time.perf_counter()
            scores = adjusted_losses(models, sampler, num_tasks=args.eval_tasks, seed=4242)
            evaluation_seconds = time.perf_counter() - started
            for name, result in results.items():
                label, seed = name.split("|")
                score = scores[name]
                rows.append({"variant": variant, "depth": depth, "recipe": label, "seed": int(seed),
                             "adjusted_loss": score.mean, "stderr": score.stderr, "num_tasks": score.num_tasks,
                             "status": result.status, "steps": result.steps, "skipped": result.skipped_steps,
                             "train_loss": result.final_loss, "stack_seconds": round(result.seconds, 1),
                             "paper": PAPER[variant][depth][column]})
                keep[f"{variant}-L{depth}-{label}-s{seed}"] = {key: value.cpu() for key, value in
                                                               result.model.state_dict().items()}
            print(f"{variant} L={depth}: scored {len(results)} models in {evaluation_seconds:.0f} s", flush=True)
            # the next depth grows from this depth's best model per seed among the grown recipes, else any
            for s in range(args.seeds):
                candidates = {name: scores[name].mean for name in results if name.endswith(f"|{s}")}
                best = min(candidates, key=candidates.get)
                previous[s] = results[best].model.to("cpu")
        (out / "recipes.json").write_text(json.dumps(rows, indent=1))
    torch.save(keep, out / "recipe_models.pt")
    print("| variant | L | recipe | seeds: adjusted loss ± se (1M tasks) | median | paper | diverged |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for variant in args.variants:
        for depth in sorted(args.depths):
            for label in args.recipes:
                mine = [row for row in rows if (row["variant"], row["depth"], row["recipe"]) == (variant, depth, label)]
                if not mine:
                    continue
                cells = ", ".join(f"{row['adjusted_loss']:.4f} ± {row['stderr']:.4f}" for row in mine)
                median = statistics.median(row["adjusted_loss"] for row in mine)
                diverged = sum(row["status"] != "finished" for row in mine)
                print(f"| {variant} | {depth} | {label} | {cells} | {median:.4f} | {mine[0]['paper']} | {diverged} |")


COLUMN = "5"

if __name__ == "__main__":
    main()
