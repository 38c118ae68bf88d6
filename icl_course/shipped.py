"""Trained models shipped with the package, and the recipes that made them.

The files live in the data folder ``icl_course/pretrained/``; this module reads and remakes them.

Training that takes more than about 20 seconds on a laptop CPU is not run when a notebook
executes: the notebook loads the checkpoint here instead, and shows the training cell that
made it (switched off by default).  Every checkpoint is reproducible from its recipe:

    python -m icl_course.shipped NAME            # retrain NAME, write it into the package
    python -m icl_course.shipped NAME --out f.pt # or anywhere else
    python -m icl_course.shipped --list

Training uses a GPU when there is one (``device="auto"``); the shipped files were made on a
CPU, and :func:`load_pretrained` checks that a file matches its recipe.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Optional

from .checkpoints import CheckpointError, load_checkpoint
from .data import CategoricalNoise, FixedNoise, NoiseDistribution, RegressionTasks, UniformNoise
from .models import LinearTransformer
from .train import TrainingHistory, train

__all__ = ["RECIPES", "recipe", "checkpoint_path", "load_pretrained", "train_pretrained", "make_tasks"]

DIRECTORY = Path(__file__).resolve().parent / "pretrained"

# name -> what to build, what to train it on, and how.  Chapter prefixes keep names unique.
RECIPES: dict[str, dict] = {
    "ch1_full_2_layers": {
        "about": "chapter 1: a 2-layer full linear transformer on noiseless isotropic tasks",
        "model": {"d": 10, "num_layers": 2, "num_heads": 1, "parameterization": "full", "init_scale": 0.02, "seed": 0},
        "tasks": {"d": 10, "n": 20, "noise": 0.0},
        "train": {"num_steps": 2000, "batch_size": 2048, "learning_rate": 2e-2, "warmup_steps": 100,
                  "schedule": "cosine", "clip_norm": 1.0, "seed": 0},
    },
    "ch1_full_3_layers": {
        "about": "chapter 1: a 3-layer full linear transformer on noiseless isotropic tasks",
        "model": {"d": 10, "num_layers": 3, "num_heads": 1, "parameterization": "full", "init_scale": 0.02, "seed": 0},
        "tasks": {"d": 10, "n": 20, "noise": 0.0},
        "train": {"num_steps": 3000, "batch_size": 2048, "learning_rate": 2e-2, "warmup_steps": 100,
                  "schedule": "cosine", "clip_norm": 1.0, "seed": 0},
    },
}


def recipe(name: str) -> dict:
    """The recipe of a shipped model; an unknown name lists the known ones."""
    if name not in RECIPES:
        raise ValueError(f"no pretrained model named {name!r}; available: {', '.join(sorted(RECIPES))}")
    return RECIPES[name]


def checkpoint_path(name: str) -> Path:
    """Where the package keeps the checkpoint of ``name``."""
    recipe(name)
    return DIRECTORY / f"{name}.pt"


def _noise(spec) -> NoiseDistribution:
    if isinstance(spec, dict) and set(spec) == {"uniform"}:
        return UniformNoise(spec["uniform"])
    if isinstance(spec, dict) and set(spec) == {"categorical"}:
        return CategoricalNoise(spec["categorical"])
    return FixedNoise(spec)


def make_tasks(name: str, dtype="float32", device="auto") -> RegressionTasks:
    """The task sampler a shipped model was trained on."""
    tasks = dict(recipe(name)["tasks"])
    return RegressionTasks(tasks.pop("d"), tasks.pop("n"), _noise(tasks.pop("noise")), dtype=dtype,
                           device=device, **tasks)


def load_pretrained(name: str, device="auto") -> tuple[LinearTransformer, TrainingHistory]:
    """The shipped model ``name`` and its training history (for loss curves)."""
    path = checkpoint_path(name)
    if not path.exists():
        raise CheckpointError(
            f"the package has no checkpoint for {name!r} at {path}; recreate it with "
            f"`python -m icl_course.shipped {name}`"
        )
    checkpoint = load_checkpoint(path, device=device, **recipe(name)["model"])
    history = (checkpoint.training_state or {}).get("history", {})
    return checkpoint.model, TrainingHistory(losses=list(history.get("losses", [])),
                                             learning_rates=list(history.get("learning_rates", [])))


def train_pretrained(name: str, path: Optional[str | Path] = None, device="auto",
                     progress: bool = True) -> tuple[LinearTransformer, TrainingHistory]:
    """Train ``name`` from its recipe and save it (resuming if ``path`` holds a partial run)."""
    spec = recipe(name)
    path = Path(path) if path is not None else checkpoint_path(name)
    model = LinearTransformer(**spec["model"], device=device)
    history = train(model, make_tasks(name, device=model.device), checkpoint=path, progress=progress,
                    metadata={"recipe": name, "command": f"python -m icl_course.shipped {name}"},
                    **spec["train"])
    return model, history


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m icl_course.shipped",
                                     description="Retrain a model that ships with the course.")
    parser.add_argument("name", nargs="?", help="which model (see --list)")
    parser.add_argument("--out", help="where to write the checkpoint (default: inside the package)")
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda or mps (default: auto)")
    parser.add_argument("--list", action="store_true", help="list the shipped models")
    arguments = parser.parse_args(argv)
    if arguments.list or not arguments.name:
        for key in sorted(RECIPES):
            print(f"{key:24s} {RECIPES[key]['about']}")
        return
    try:
        recipe(arguments.name)
    except ValueError as error:
        parser.error(str(error))
    _, history = train_pretrained(arguments.name, arguments.out, arguments.device)
    print(f"final training loss {history.losses[-1]:.4g}; saved to {arguments.out or checkpoint_path(arguments.name)}")


if __name__ == "__main__":
    main()
