"""Are the noiseless column's heavy tails undertraining, or do the best models have them too?

On noiseless tasks a GD++ model leaves ``r(lambda)`` of ``w`` along each eigen-direction of ``X^T X``
(:func:`icl_course.theory.gdpp_residual`), so its expected loss is ``1/2 E[sum_k r(lambda_k)^2]``: a function of
the spectrum alone, cheap enough to minimise outright.  For each depth this script

1. draws ``--fit-tasks`` tasks as :class:`~icl_course.data.StretchedTasks` (the rare spectra on purpose,
   weighted back, truncated at the selection's ``STRETCHED_CAP``: beyond it every deep polynomial explodes), and
   minimises the weighted mean over their eigenvalues with L-BFGS in float64 over the layers' ``w_xx`` and
   ``w_yx``, from the run's GD++ of the cell and from the best fit one layer shallower with a pass-through
   layer first or before the last (as the ``cpu`` budget deepens; from each of the ``--keep`` best fits there),
   and from ``--random-starts`` random weights
   (most of which explode at 5 layers and more); it keeps the lowest;
2. scores the fitted model and the run's GD++ on ``--eval-tasks`` other stretched tasks (that truncated
   expectation, with a small standard error) and on a plain million (the table's own evaluation: mean, standard
   error, and the gap to the mean without the worst 0.01% of the tasks, the table's heavy-tail test).

With ``--adam-steps N`` it first trains the run's noiseless ``--adam-variant`` of ``--adam-depth`` layers on for
N unclipped steps at 1e-4, once on plain batches and once on stretched ones
(``ModelSpec(..., stretched=True)``: the same expected loss, the rare tasks in every batch), and scores both on
the plain million.

    python research/noiseless_optimum.py --depths 3 4 5 6 7
    python research/noiseless_optimum.py --depths 3 4 5 6 --save icl_course/pretrained/noiseless_gdpp_fits.json
    python research/noiseless_optimum.py --depths 5 --adam-steps 3000 --adam-depth 5

research/README.md has the tables and what they mean for the ``cpu`` run.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import torch

from icl_course import LinearTransformer
from icl_course.data import RegressionTasks, StretchedTasks
from icl_course.evaluate import Estimate, expected_loss
from icl_course.sweep import ModelSpec, train_sweep
from icl_course.table1 import load_table1_model
from icl_course.table1.noiseless import gdpp_model, gdpp_weights
from icl_course.table1.paper import PAPER, D, N
from icl_course.table1.select import STRETCHED_CAP
from icl_course.theory import gdpp_residual


class Spectra:
    """The eigenvalues of ``X^T X`` of stretched noiseless tasks, each with its task's weight over the count."""

    def __init__(self, num_tasks: int, seed: int):
        tasks = StretchedTasks(D, N, 0.0, largest_eigenvalue_cap=STRETCHED_CAP, dtype=torch.float64,
                               device="cpu").sample(num_tasks, seed=seed)
        kept = tasks.importance_weight > 0
        self.eigenvalues = torch.linalg.eigvalsh(tasks.X[kept].transpose(-1, -2) @ tasks.X[kept])   # (B, d)
        self.weight = tasks.importance_weight[kept]
        self.num_tasks = num_tasks

    def objective(self, weights: torch.Tensor) -> torch.Tensor:
        """The weighted mean over tasks of ``1/2 sum_k r(lambda_k)^2``."""
        per_task = 0.5 * (gdpp_residual(self.eigenvalues, weights[0], weights[1]) ** 2).sum(-1)
        return (self.weight * per_task).sum() / self.num_tasks

    def estimate(self, weights: torch.Tensor) -> Estimate:
        """The same mean with its standard error (the weighted values of every task drawn, zeros included)."""
        with torch.no_grad():
            per_task = 0.5 * (gdpp_residual(self.eigenvalues, weights[0], weights[1]) ** 2).sum(-1)
        values = torch.zeros(self.num_tasks, dtype=torch.float64)
        values[:per_task.numel()] = self.weight * per_task
        return Estimate.from_samples(values)


def fit(spectra: Spectra, start: torch.Tensor, rounds: int, iterations: int) -> tuple[float, torch.Tensor]:
    """L-BFGS from ``start`` on the logarithm of the loss (its scale runs from 1e-2 to 1e-9 over the depths),
    in rounds; a round that leaves a non-finite loss is undone and ends the fit."""
    weights = start.clone().requires_grad_()
    optimiser = torch.optim.LBFGS([weights], lr=1, max_iter=iterations, history_size=50,
                                  line_search_fn="strong_wolfe", tolerance_grad=1e-40, tolerance_change=1e-40)

    def closure():
        optimiser.zero_grad()
        loss = torch.log(spectra.objective(weights))
        loss.backward()
        return loss
    with torch.no_grad():
        best = (spectra.objective(weights).item(), weights.detach().clone())
    for _ in range(rounds):
        optimiser.step(closure)
        with torch.no_grad():
            value = spectra.objective(weights).item()
        if not math.isfinite(value):
            break
        if value < best[0]:
            best = (value, weights.detach().clone())
    return best


def pass_through(weights: torch.Tensor, position: int) -> torch.Tensor:
    """(2, L) -> (2, L + 1): a layer with ``w_xx = w_yx = 0`` (it changes nothing) inserted before ``position``."""
    zero = torch.zeros(2, 1, dtype=weights.dtype)
    return torch.cat([weights[:, :position], zero, weights[:, position:]], dim=1)


def plain_score(model: LinearTransformer, num_tasks: int) -> Estimate:
    plain = RegressionTasks(D, N, 0.0, dtype=torch.float64, device="cpu")
    return expected_loss(model, plain, num_tasks=num_tasks, seed=2024)


def tail(estimate: Estimate) -> str:
    gap = 1 - estimate.trimmed_mean / estimate.mean
    return f"{estimate.mean:.3g} ± {estimate.stderr / estimate.mean:.1%}, trimmed {gap:.1%} below"


def continue_training(run, variant: str, depth: int, steps: int, eval_tasks: int) -> None:
    """The run's noiseless model trained on, on plain and on stretched batches; both scored on plain tasks."""
    start = load_table1_model(variant, depth, "0", run).double()
    specs = [ModelSpec(kind, 0.0, seed=1, num_steps=steps, learning_rate=1e-4, schedule="constant", init=start,
                       stretched=kind == "stretched") for kind in ("plain", "stretched")]
    started = time.perf_counter()
    results = train_sweep(specs, d=D, n=N, num_layers=depth, parameterization=variant, batch_size=512,
                          clip_norm=None, restarts=3, seed=77, progress=False, device="cpu")
    print(f"{variant} {depth} layers, {steps} more unclipped steps at 1e-4 ({time.perf_counter() - started:.0f} s); "
          f"a plain million each:")
    print(f"  the run's model: {tail(plain_score(start, eval_tasks))}")
    for name, result in results.items():
        print(f"  on {name} batches ({result.status}): {tail(plain_score(result.model.double(), eval_tasks))}")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", default="cpu", help="a shipped run ('cpu', 'clipped') or a run's --out folder")
    parser.add_argument("--depths", type=int, nargs="+", default=[3, 4, 5, 6, 7])
    parser.add_argument("--fit-tasks", type=int, default=100_000)
    parser.add_argument("--eval-tasks", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=4, help="L-BFGS rounds per start")
    parser.add_argument("--iterations", type=int, default=50, help="L-BFGS iterations per round")
    parser.add_argument("--random-starts", type=int, default=4)
    parser.add_argument("--keep", type=int, default=2, help="fits of a depth the next one deepens")
    parser.add_argument("--save", help="a JSON file for the fitted w_xx and w_yx per depth (chapter 4 reads one)")
    parser.add_argument("--adam-steps", type=int, default=0)
    parser.add_argument("--adam-variant", default="diag", choices=("gdpp", "diag", "full"))
    parser.add_argument("--adam-depth", type=int, default=5)
    args = parser.parse_args(argv)
    unknown = sorted(set(args.depths) - set(PAPER["gdpp"]))
    if unknown:
        parser.error(f"--depths {' '.join(map(str, unknown))}: Table 1 has GD++ at depths "
                     f"{', '.join(map(str, sorted(PAPER['gdpp'])))} only")
    if args.adam_steps:
        continue_training(args.run, args.adam_variant, args.adam_depth, args.adam_steps, args.eval_tasks)
    fitting, scoring = Spectra(args.fit_tasks, seed=7), Spectra(args.eval_tasks, seed=8)
    print(f"GD++, noiseless: fitted on the eigenvalues of {args.fit_tasks} stretched tasks (largest eigenvalue at "
          f"most {STRETCHED_CAP:g}); expectation on {args.eval_tasks} other stretched tasks; table: a plain million")
    print("| depth | paper | the run's GD++: expectation | its table score | fitted (start): expectation "
          "| its table score |")
    print("| --- | --- | --- | --- | --- | --- |")
    best, saved, begun = {}, {}, time.perf_counter()
    for depth in sorted(args.depths):
        run_model = load_table1_model("gdpp", depth, "0", args.run).double()
        starts = {"the run's": gdpp_weights(run_model)}
        for rank, shallower in enumerate(best.get(depth - 1, [])):
            starts.update({f"fit {rank + 1} deepened at {position}": pass_through(shallower, position)
                           for position in sorted({0, depth - 2})})
        generator = torch.Generator().manual_seed(depth)
        for k in range(args.random_starts):   # w_xx from -e^-5 to -e^-0.5, w_yx from -e^-3 to -e
            low_high = torch.tensor([[-5.0], [-3.0]]), torch.tensor([[-0.5], [1.0]])
            draw = torch.rand(2, depth, generator=generator, dtype=torch.float64)
            starts[f"random {k}"] = -torch.exp(low_high[0] + (low_high[1] - low_high[0]) * draw).double()
        started = time.perf_counter()
        fits = {name: fit(fitting, start, args.rounds, args.iterations) for name, start in starts.items()}
        ranked = sorted((name for name in fits if math.isfinite(fits[name][0])), key=lambda key: fits[key][0])
        name, best[depth] = ranked[0], [fits[key][1] for key in ranked[:args.keep]]
        seconds = time.perf_counter() - started
        print(f"| {depth} | {PAPER['gdpp'][depth][0]:.3g} | {scoring.estimate(gdpp_weights(run_model))} "
              f"| {tail(plain_score(run_model, args.eval_tasks))} | {scoring.estimate(best[depth][0])} ({name}, "
              f"{seconds:.0f} s) | {tail(plain_score(gdpp_model(best[depth][0]), args.eval_tasks))} |", flush=True)
        saved[str(depth)] = {"w_xx": best[depth][0][0].tolist(), "w_yx": best[depth][0][1].tolist(), "start": name,
                             "fitted_loss": fits[name][0]}
    if args.save:
        command = "python research/noiseless_optimum.py " + " ".join(argv if argv is not None else sys.argv[1:])
        Path(args.save).write_text(json.dumps({
            "about": "GD++ models of Table 1's noiseless column (d = 10, n = 20) fitted on their exact expected loss "
                     "(icl_course.theory.gdpp_residual); research/README.md",
            "command": command, "seconds": round(time.perf_counter() - begun), "fit_tasks": args.fit_tasks,
            "largest_eigenvalue_cap": STRETCHED_CAP, "depths": saved}, indent=1) + "\n")


if __name__ == "__main__":
    main()
