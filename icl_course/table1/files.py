"""The files of a Table 1 run: its folder, written atomically, resumed only by a run of the same configuration."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

from .budget import Table1Error


def write_text(path: Path, text: str) -> None:
    temporary = path.with_name(path.name + ".tmp")
    try:
        temporary.write_text(text)
        os.replace(temporary, path)
    except OSError as error:
        if temporary.exists():
            temporary.unlink()
        raise Table1Error(f"could not write {path} ({error.strerror or error}); finished models and columns "
                          f"under {path.parent} are kept. Free some disk space and run the same command "
                          "again to resume.") from None


def write_json(path: Path, data) -> None:
    write_text(path, json.dumps(data, indent=1, sort_keys=False) + "\n")


def _settings_of(config) -> object:
    """A run's configuration without the budget's description: words, which a later version may change
    without changing what the run trains, so they must not make its folder refuse to resume."""
    if isinstance(config, dict) and isinstance(config.get("budget"), dict):
        budget = {key: value for key, value in config["budget"].items() if key != "description"}
        return dict(config, budget=budget)
    return config


def prepare_out(out: Path, config: dict) -> None:
    if out.exists() and not out.is_dir():
        raise Table1Error(f"--out {out} is a file; pass a folder (it will be created if missing)")
    try:
        out.mkdir(parents=True, exist_ok=True)
        for sub in ("models", "evaluation", "sweeps"):
            (out / sub).mkdir(exist_ok=True)
    except OSError as error:
        raise Table1Error(f"could not create the folder {out} ({error.strerror or error})") from None
    saved_path = out / "config.json"
    if saved_path.exists():
        try:
            saved = json.loads(saved_path.read_text())
        except (OSError, ValueError):
            raise Table1Error(f"{saved_path} is unreadable; this folder was not made by `icl-course table1` "
                              "or is damaged. Pass a new --out.") from None
        if _settings_of(saved) != _settings_of(config):
            saved, config = _settings_of(saved), _settings_of(config)
            differ = sorted(key for key in set(saved) | set(config) if saved.get(key) != config.get(key))
            raise Table1Error(
                f"{out} holds a Table 1 run of another configuration (it differs in: {', '.join(differ)}; "
                f"that run used budget {saved.get('budget', {}).get('name')!r}). Pass a new --out, or delete "
                f"{out} to start over.")
    else:
        if any((out / "models").iterdir()):
            raise Table1Error(f"{out}/models holds checkpoints but no config.json; pass a new --out")
        write_json(saved_path, config)


def seconds_so_far(out: Path) -> float:
    """The wall time recorded by an earlier call on ``out`` (0 if it has no readable results.json)."""
    try:
        seconds = json.loads((out / "results.json").read_text())["config"]["seconds"]
    except (OSError, ValueError, KeyError, TypeError, UnicodeDecodeError):
        return 0.0
    return float(seconds) if isinstance(seconds, (int, float)) and math.isfinite(seconds) else 0.0
