"""A trained model of a Table 1 run, one candidate for its cell."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..models import LinearTransformer


@dataclass
class Candidate:
    """One trained model of a run: a candidate for the cell (variant, depth, column) it belongs to.

    ``metadata`` is its checkpoint's (status, steps, wall time, the command that made it, ...).
    """

    name: str
    variant: str
    depth: int
    column: str
    seed: int
    path: Path
    model: LinearTransformer
    metadata: dict

    @property
    def status(self) -> str:
        """``"finished"`` or ``"diverged"``."""
        return self.metadata["status"]

    @property
    def finished(self) -> bool:
        """Whether it trained to its last step (a diverged model competes only when no other can)."""
        return self.status == "finished"

    @property
    def cell(self) -> str:
        """The cell it competes for, e.g. ``diag-L2`` (with its column)."""
        return f"{self.variant}-L{self.depth}"
