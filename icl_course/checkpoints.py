"""Saving and loading models with their configuration and training state.

A checkpoint is one file written by ``torch.save`` and read with ``weights_only=True``
(it holds tensors, numbers, strings, lists and dicts only, never pickled code):

* ``format``, ``version``: what wrote it;
* ``model_config``: the arguments that rebuild the model (:func:`~icl_course.models.build_model`);
* ``model_state``: the weights;
* ``training_state``: optimiser, random generator, step and loss history (or None);
* ``metadata``: free-form notes, such as the command that produced it.

Files are written to a temporary name and renamed, so an interrupted save never leaves a
half-written checkpoint behind.  Every failure to read says which file and why.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import torch

from .models import LinearTransformer, build_model

__all__ = ["CheckpointError", "Checkpoint", "save_checkpoint", "read_checkpoint", "load_checkpoint",
           "load_model"]

FORMAT = "icl-course-checkpoint"
VERSION = 1


class CheckpointError(RuntimeError):
    """A checkpoint is missing, unreadable, or does not match what was asked for."""


@dataclass
class Checkpoint:
    """A loaded checkpoint: the rebuilt ``model`` plus what was saved beside it."""

    model: LinearTransformer
    training_state: Optional[dict]
    metadata: dict
    path: Path


def save_checkpoint(path: str | os.PathLike, model: LinearTransformer,
                    training_state: Optional[dict] = None, metadata: Optional[dict] = None) -> Path:
    """Write ``model`` (and optionally its training state and metadata) to ``path`` atomically."""
    path = Path(path)
    if not isinstance(model, LinearTransformer):
        raise TypeError(f"save_checkpoint saves a LinearTransformer, got {type(model).__name__}")
    payload = {
        "format": FORMAT,
        "version": VERSION,
        "model_config": dict(model.config),
        "model_state": {key: value.detach().cpu() for key, value in model.state_dict().items()},
        "training_state": training_state,
        "metadata": dict(metadata or {}),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    os.close(handle)
    try:
        torch.save(payload, temporary)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(temporary, 0o666 & ~umask)  # mkstemp creates private files; a checkpoint is not
        os.replace(temporary, path)
    finally:
        if os.path.exists(temporary):
            os.remove(temporary)
    return path


def read_checkpoint(path: str | os.PathLike) -> dict:
    """Read and validate a checkpoint file; returns the raw dict described in the module doc."""
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"no checkpoint at {path}: check the path, or train a model to create it")
    if path.is_dir():
        raise CheckpointError(f"{path} is a folder, not a checkpoint file")
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # torch raises several types for truncated or foreign files
        raise CheckpointError(
            f"{path} could not be read as a checkpoint: it is truncated or not a checkpoint file "
            f"({type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}). "
            "Delete it and train again, or copy it again from its source."
        ) from None
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        raise CheckpointError(f"{path} is a torch file but not an icl-course checkpoint (no '{FORMAT}' marker)")
    if payload.get("version") != VERSION:
        raise CheckpointError(
            f"{path} has checkpoint version {payload.get('version')!r}; this icl_course reads version "
            f"{VERSION}. Install the course version that wrote it, or retrain."
        )
    for key in ("model_config", "model_state"):
        if not isinstance(payload.get(key), dict):
            raise CheckpointError(f"{path} is damaged: its '{key}' entry is missing")
    return payload


def load_checkpoint(path: str | os.PathLike, device: str | torch.device = "auto",
                    **expected_config: Any) -> Checkpoint:
    """Rebuild the model saved at ``path`` and return it with its training state and metadata.

    Keyword arguments name configuration values the caller relies on (for example
    ``num_layers=3, parameterization="diag"``); a checkpoint that differs raises
    :class:`CheckpointError` saying which values differ.
    """
    payload = read_checkpoint(path)
    config = payload["model_config"]
    differences = [f"{key}: checkpoint has {config.get(key)!r}, expected {value!r}"
                   for key, value in expected_config.items() if config.get(key) != value]
    if differences:
        raise CheckpointError(f"{path} holds a different model; " + "; ".join(differences))
    try:
        model = build_model(config, device=device)
        model.load_state_dict(payload["model_state"])
    except (TypeError, ValueError, RuntimeError) as error:
        raise CheckpointError(
            f"{path} does not match the model it describes ({str(error).splitlines()[0]}); "
            "it was written by an incompatible version or damaged"
        ) from None
    return Checkpoint(model=model, training_state=payload.get("training_state"),
                      metadata=payload.get("metadata") or {}, path=Path(path))


def load_model(path: str | os.PathLike, device: str | torch.device = "auto",
               **expected_config: Any) -> LinearTransformer:
    """Just the model from :func:`load_checkpoint`, ready to evaluate."""
    return load_checkpoint(path, device, **expected_config).model
