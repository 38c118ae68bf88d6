"""Learning rates for one Table 1 cell on a CPU budget: several rates and seeds trained as one stack.

Every model starts from small random weights and trains with Adam (batch ``--batch``, linear warm-up,
cosine decay to 1% of the rate, gradient clipping at norm 1, the sweep's spike rule unless
``--spike-factor inf``), then all are scored on ``--eval-tasks`` fresh tasks paired with the oracle
ridge (Vladymyrov et al. 2024's adjusted loss), with standard errors.  The evidence behind the
``cpu`` budget of ``icl_course.table1`` (research/README.md):

    python research/learning_rates.py --variant full --depth 2 --steps 3000 --rates 2e-2 1e-2 2e-3 \
        --eval-tasks 100000
    python research/learning_rates.py --variant diag --depth 3 --steps 6000 --rates 2e-3 5e-3 1e-2
"""

from __future__ import annotations

import argparse
import time

import torch

from icl_course import RegressionTasks
from icl_course.evaluate import adjusted_losses
from icl_course.sweep import ModelSpec, train_sweep
from icl_course.table1 import COLUMNS, PAPER, column_noise


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variant", default="diag", choices=list(PAPER))
    parser.add_argument("--depth", type=int, default=3)
    parser.add_argument("--column", default="5", choices=COLUMNS)
    parser.add_argument("--steps", type=int, default=6000)
    parser.add_argument("--batch", type=int, default=512)
    parser.add_argument("--warmup", type=int, default=500)
    parser.add_argument("--rates", nargs="+", type=float, default=[2e-3, 5e-3])
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--spike-factor", type=float, default=100.0)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--eval-tasks", type=int, default=1_000_000)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args(argv)

    noise = column_noise(args.column)
    specs = [ModelSpec(f"lr {rate:g}, seed {seed}", noise, seed=seed, num_steps=args.steps, learning_rate=rate,
                       warmup_steps=args.warmup) for rate in args.rates for seed in range(args.seeds)]
    started = time.perf_counter()
    results = train_sweep(specs, num_layers=args.depth, parameterization=args.variant, batch_size=args.batch,
                          final_fraction=0.01, spike_factor=args.spike_factor, dtype=args.dtype,
                          device=args.device, seed=7, progress=False)
    paper = PAPER[args.variant][args.depth][COLUMNS.index(args.column)]
    print(f"{args.variant}, {args.depth} layers, sigma_max = {args.column}: {len(specs)} models trained in "
          f"{time.perf_counter() - started:.0f} s (the paper: {paper})")
    sampler = RegressionTasks(10, 20, noise, dtype=torch.float64, device=args.device)
    scores = adjusted_losses({name: result.model for name, result in results.items()}, sampler,
                             num_tasks=args.eval_tasks, seed=123)
    print("| model | adjusted loss | spikes skipped | final training loss |")
    print("| --- | --- | --- | --- |")
    for name, score in scores.items():
        result = results[name]
        print(f"| {name} | {score} | {result.skipped_steps} | {result.final_loss:.3f} |")


if __name__ == "__main__":
    main()
