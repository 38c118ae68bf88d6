"""Where tensors live and how randomness is seeded.

Every sampler, model and trainer in the course takes a ``device`` (a
``torch.device``, a string such as ``"cpu"`` or ``"cuda"``, or ``"auto"``), a
``dtype`` and a seed or a ``torch.Generator``.  Random numbers are always drawn
on the CPU from a CPU generator and then moved, so a seed gives the same tasks
on a laptop, on Colab's GPU and on Apple silicon.
"""

from __future__ import annotations

import torch

__all__ = ["resolve_device", "available_device", "resolve_dtype", "make_generator", "check_count"]

_DTYPES = {
    "float32": torch.float32,
    "float64": torch.float64,
    "float": torch.float32,
    "double": torch.float64,
}


def resolve_device(device: str | torch.device | None = "auto") -> torch.device:
    """Turn ``"auto"`` (or None) into CUDA, then Apple MPS, then CPU; pass others through.

    >>> resolve_device("cpu")
    device(type='cpu')
    """
    if device is None or (isinstance(device, str) and device == "auto"):
        if torch.cuda.is_available():
            return torch.device("cuda", torch.cuda.current_device())
        mps = getattr(torch.backends, "mps", None)
        if mps is not None and mps.is_available():
            return torch.device("mps", 0)
        return torch.device("cpu")
    try:
        device = torch.device(device)
    except (RuntimeError, TypeError) as error:
        raise ValueError(
            f"device {device!r} is not a device torch knows; use 'auto', 'cpu', 'cuda' or 'mps'"
        ) from error
    # a parameter moved to "cuda" reports "cuda:0": name the GPU so that the two compare equal
    if device.type == "cuda" and device.index is None and torch.cuda.is_available():
        device = torch.device("cuda", torch.cuda.current_device())
    elif device.type == "mps" and device.index is None:
        device = torch.device("mps", 0)
    return device


def available_device(device: str | torch.device | None = "auto") -> torch.device:
    """:func:`resolve_device`, refusing a CUDA or MPS device that this torch cannot see (with what to pass instead)."""
    device = resolve_device(device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("device 'cuda' was asked for, but torch sees no CUDA GPU; use 'auto' or 'cpu'")
    mps = getattr(torch.backends, "mps", None)
    if device.type == "mps" and not (mps is not None and mps.is_available()):
        raise ValueError("device 'mps' was asked for, but torch sees no Apple GPU; use 'auto' or 'cpu'")
    return device


def resolve_dtype(dtype: str | torch.dtype) -> torch.dtype:
    """Accept ``torch.float32``/``torch.float64`` or their names; reject everything else."""
    if isinstance(dtype, str):
        if dtype not in _DTYPES:
            raise ValueError(f"dtype {dtype!r} is not supported; use 'float32' or 'float64'")
        return _DTYPES[dtype]
    if dtype not in (torch.float32, torch.float64):
        raise ValueError(f"dtype {dtype} is not supported; use torch.float32 or torch.float64")
    return dtype


def make_generator(seed: int | torch.Generator | None = 0) -> torch.Generator:
    """A CPU ``torch.Generator`` seeded with ``seed`` (a generator is returned as it is)."""
    if isinstance(seed, torch.Generator):
        return seed
    if seed is None:
        seed = 0
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise TypeError(f"seed must be an int or a torch.Generator, got {type(seed).__name__}")
    generator = torch.Generator(device="cpu")
    generator.manual_seed(seed)
    return generator


def check_count(value, name: str, minimum: int = 1) -> int:
    """``value`` if it is an integer of at least ``minimum`` (not a bool), else a clear ``ValueError``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        kind = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
        raise ValueError(f"{name} must be {kind}, got {value!r}")
    return value
