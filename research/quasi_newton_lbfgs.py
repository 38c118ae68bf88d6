"""Is the 4-layer quasi-Newton LFOM's slow fall Adam's noise?  Full-batch L-BFGS on a fixed sample says what it costs.

The stages of ``quasi_newton_stages.py`` move chapter 5's 4-layer LFOM about 2% per 12 000 Adam steps in its best seed.
This script takes one shipped model (the end of a branch, ``--from``, or of the stages from 24 000 steps), fits it with
L-BFGS in float64 (strong Wolfe line search, no learning rate) on a fixed sample of ``--tasks`` stretched tasks
(importance-weighted, drawn with a seed no training or scoring used), prints the sample's loss and gradient norm
every ``--iterations``, and then scores the fit beside its start, paired, on the million stretched tasks that scored
the start.  A fall on the sample that the million does not see is the sample's own tasks being fitted, not the
expected loss.

    python research/quasi_newton_lbfgs.py --from 3000 --setting isotropic --seed 2 --tasks 20000 --rounds 12   # 8 min

research/README.md (2026-11-29) has what it found.  Nothing it writes is shipped.
"""

from __future__ import annotations

import argparse
import time

import torch
from quasi_newton_stages import DEPTH, FAMILY, shipped_stages

from icl_course import memformer
from icl_course.evaluate import paired_losses, query_averaged_loss


def main(origin: int | None, setting: str, seed: int, num_tasks: int, iterations: int, rounds: int) -> None:
    torch.set_num_threads(1)
    seeds = list(memformer.RECIPE["seeds"])
    if seed not in seeds or setting not in memformer.SETTINGS:
        raise SystemExit(f"--seed is one of {seeds} and --setting one of {', '.join(memformer.SETTINGS)}")
    if min(num_tasks, iterations, rounds) < 1:
        raise SystemExit(f"--tasks, --iterations and --rounds must be positive; "
                         f"got {num_tasks}, {iterations}, {rounds}")
    position = seeds.index(seed)
    stages = shipped_stages(memformer.load_experiments(), origin)
    start = memformer.unstack(stages[max(stages)][setting]["weights"], position)
    models = {name: memformer.build(FAMILY, DEPTH, 1, "full") for name in ("before", "after")}
    for model in models.values():
        model.load_state_dict(start)
    sampler = memformer.setting_samplers(seeds)[memformer.SETTINGS.index(setting) * len(seeds) + position]
    tasks = memformer.stretched_tasks(sampler)
    batch = tasks.sample(num_tasks, seed=555_000 + seed)   # no training stream or scoring uses these seeds
    model = models["after"]

    def sample_loss():
        return (query_averaged_loss(model(batch).weights, batch) * batch.importance_weight).mean()

    optimizer = torch.optim.LBFGS(model.parameters(), max_iter=iterations, history_size=50,
                                  line_search_fn="strong_wolfe", tolerance_grad=1e-14, tolerance_change=1e-16)

    def closure():
        optimizer.zero_grad()
        loss = sample_loss()
        loss.backward()
        return loss

    with torch.no_grad():
        first = sample_loss().item()
    begin = time.perf_counter()
    print(f"{setting} seed {seed} after {max(stages):,} steps: {first:.4g} on {num_tasks:,} fixed tasks", flush=True)
    for round_ in range(rounds):
        optimizer.step(closure)
        loss = sample_loss()
        gradient = torch.autograd.grad(loss, list(model.parameters()))
        norm = torch.sqrt(sum((g ** 2).sum() for g in gradient)).item()
        print(f"round {round_ + 1}: {loss.item():.4g} ({loss.item() / first - 1:+.2%}), gradient norm {norm:.3g}, "
              f"{optimizer.state[optimizer._params[0]]['func_evals']} evaluations, {time.perf_counter() - begin:.0f} s",
              flush=True)
    losses, differences = paired_losses(models, tasks, "before", memformer.eval_count(DEPTH),
                                        seed=7_000 + 31 * seed + DEPTH)
    print(", ".join(f"{name} {estimate.mean:.4g} ± {estimate.stderr:.2g}" for name, estimate in losses.items())
          + f"; after - before {differences['after'].mean:.3g} ± {differences['after'].stderr:.2g} "
          f"on {memformer.eval_count(DEPTH):,} stretched tasks", flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--from", dest="origin", type=int, default=None,
                        help="the branch from this many steps (as quasi_newton_stages.py); default: the stages "
                             "from the longest training")
    parser.add_argument("--setting", default="isotropic")
    parser.add_argument("--seed", type=int, default=2)
    parser.add_argument("--tasks", type=int, default=20_000)
    parser.add_argument("--iterations", type=int, default=100, help="L-BFGS iterations per round")
    parser.add_argument("--rounds", type=int, default=12)
    arguments = parser.parse_args()
    main(arguments.origin, arguments.setting, arguments.seed, arguments.tasks, arguments.iterations, arguments.rounds)
