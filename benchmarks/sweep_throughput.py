"""Models trained per second: 10 Diag models of 3 layers trained together against one after another.

Both sides train the same ten models (``d = 10``, ``n = 20``, one head, Adam, cosine schedule,
batch 2048, ten noise settings of Table 1) for the same number of steps:

* ``together``: one :func:`icl_course.sweep.train_sweep` call with ten specs (one batched
  forward and backward per step for all ten);
* ``one after another (train)``: :func:`icl_course.train` once per model, the package's trainer
  for a single model;
* ``one after another (sweep of 1)``: ``train_sweep`` once per model, to separate what batching
  gains from what the sweep's on-device task stream gains.

The three alternate in rounds and the medians are reported, because a shared machine's speed
drifts.  Run:  python benchmarks/sweep_throughput.py [--device cpu] [--steps 100] [--rounds 3] [--threads 2]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from icl_course import LinearTransformer, RegressionTasks, train
from icl_course.sweep import ModelSpec, train_sweep
from icl_course.table1 import COLUMNS, column_noise


def specs(steps: int):
    return [ModelSpec(f"m{k}", column_noise(column), seed=k, num_steps=steps, learning_rate=1e-3, warmup_steps=10)
            for k, column in enumerate(COLUMNS)]


def together(steps, batch, device, dtype, layers):
    train_sweep(specs(steps), num_layers=layers, parameterization="diag", batch_size=batch, device=device,
                dtype=dtype, progress=False)


def one_after_another_train(steps, batch, device, dtype, layers):
    for spec in specs(steps):
        model = LinearTransformer(10, layers, 1, "diag", seed=spec.seed, dtype=dtype, device=device)
        sampler = RegressionTasks(10, 20, spec.noise, dtype=dtype, device=device)
        train(model, sampler, steps, batch_size=batch, learning_rate=spec.learning_rate, warmup_steps=10,
              progress=False)


def one_after_another_sweep(steps, batch, device, dtype, layers):
    for spec in specs(steps):
        train_sweep([spec], num_layers=layers, parameterization="diag", batch_size=batch, device=device,
                    dtype=dtype, progress=False)


def timed(function, *args):
    if str(args[2]).startswith("cuda"):
        torch.cuda.synchronize()
    start = time.perf_counter()
    function(*args)
    if str(args[2]).startswith("cuda"):
        torch.cuda.synchronize()
    return time.perf_counter() - start


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--batch", type=int, default=2048)
    parser.add_argument("--layers", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    sides = {"together": together, "one after another (train)": one_after_another_train,
             "one after another (sweep of 1)": one_after_another_sweep}
    for function in sides.values():   # warm-up: allocator, kernels, thread pools
        function(5, args.batch, args.device, dtype, args.layers)
    seconds = {name: [] for name in sides}
    for _ in range(args.rounds):
        for name, function in sides.items():
            seconds[name].append(timed(function, args.steps, args.batch, args.device, dtype, args.layers))
    print(f"10 Diag models of {args.layers} layers, {args.steps} steps each, batch {args.batch}, {args.dtype}, "
          f"device {args.device} ({torch.cuda.get_device_name() if args.device.startswith('cuda') else 'CPU'}), "
          f"threads {torch.get_num_threads()}, torch {torch.__version__}, {args.rounds} rounds (median)")
    print("| how | seconds | models per second | steps per second (all models) | speedup of together |")
    print("| --- | --- | --- | --- | --- |")
    reference = statistics.median(seconds["together"])
    for name, values in seconds.items():
        median = statistics.median(values)
        print(f"| {name} | {median:.2f} | {10 / median:.3g} | {10 * args.steps / median:.0f} | "
              f"{median / reference:.1f}x |")


if __name__ == "__main__":
    main()
