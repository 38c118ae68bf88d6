"""Seconds per optimiser step of one Table 1 stack (every model one (variant, depth) of a budget trains together:
ten columns times its seeds and deepened candidates), per variant and depth, at the budget's batch and precision.
Run it before a long ``icl-course table1 --budget gpu`` to predict its training time:

    python benchmarks/table1_gpu_timing.py --device cuda --steps 200

Prints one line per (variant, depth) and the predicted training time of the whole budget: each stack's steps
(its clipped phase, as the run's progress bar counts it, then its unclipped phase) times its measured time per
step, linear in depth between the measured depths.  Scoring (1 000 000 tasks per deep cell) is not in it.
"""

from __future__ import annotations

import argparse
import time

import torch

from icl_course.runtime import resolve_device
from icl_course.sweep import ModelSpec, train_sweep
from icl_course.table1 import BUDGETS, COLUMNS, VARIANTS, column_noise
from icl_course.table1.budget import clipped_steps, deepened_tags


def stack_size(budget, depth: int, variant: str) -> int:
    """How many models the (variant, depth) stack trains: per column, its seeds and its deepened candidates."""
    per_column = len(budget.seeds_at(depth)) + len(deepened_tags(budget, depth, variant, VARIANTS))
    return len(COLUMNS) * max(1, per_column)


def stack_steps(budget, depth: int, variant: str) -> int:
    """The steps the (variant, depth) stack trains: its clipped phase, then its unclipped phase."""
    return clipped_steps(budget, depth, variant, VARIANTS) + budget.settings(depth)["unclipped_steps"]


def seconds_per_step(variant: str, depth: int, steps: int, device, budget) -> float:
    settings = budget.settings(depth)
    specs = [ModelSpec(f"m{k}", column_noise(COLUMNS[k % len(COLUMNS)]), seed=k, num_steps=steps,
                       learning_rate=settings["learning_rate"], warmup_steps=0)
             for k in range(stack_size(budget, depth, variant))]
    run = lambda count: train_sweep(  # noqa: E731
        [ModelSpec(spec.name, spec.noise, spec.seed, count, spec.learning_rate) for spec in specs],
        d=10, n=20, num_layers=depth, parameterization=variant, batch_size=budget.batch_size,
        dtype=settings["dtype"], device=device, progress=False)
    run(10)  # warm-up: kernels, allocator
    if device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    run(steps)
    if device.type == "cuda":
        torch.cuda.synchronize()
    return (time.perf_counter() - start) / steps


def predicted_seconds(measured: dict, budget) -> float:
    """Training seconds of ``budget`` from ``{(variant, depth): seconds per step}``, linear in depth between the
    measured depths (a step is a loop over layers)."""
    total = 0.0
    for variant in VARIANTS:
        known = sorted(depth for v, depth in measured if v == variant)
        for depth in budget.depths:
            below = max([k for k in known if k <= depth], default=known[0])
            above = min([k for k in known if k >= depth], default=known[-1])
            share = 0 if above == below else (depth - below) / (above - below)
            per_step = (1 - share) * measured[variant, below] + share * measured[variant, above]
            total += per_step * stack_steps(budget, depth, variant)
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="auto")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--budget", default="gpu", choices=list(BUDGETS))
    parser.add_argument("--depths", type=int, nargs="+", default=[1, 3, 7])
    arguments = parser.parse_args()
    device = resolve_device(arguments.device)
    budget = BUDGETS[arguments.budget]
    measured = {}
    for variant in VARIANTS:
        for depth in arguments.depths:
            measured[variant, depth] = seconds_per_step(variant, depth, arguments.steps, device, budget)
            print(f"{variant:5s} {depth} layers: {1000 * measured[variant, depth]:.2f} ms per step "
                  f"({stack_size(budget, depth, variant)} models, {stack_steps(budget, depth, variant)} steps)",
                  flush=True)
    total = predicted_seconds(measured, budget)
    print(f"predicted training time of --budget {budget.name}: {total / 60:.1f} min on {device}")


if __name__ == "__main__":
    main()
