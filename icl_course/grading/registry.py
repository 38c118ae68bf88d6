"""Every graded check of the course by name, built in one place from the chapters' catalogues.

A chapter's catalogue is the module ``icl_course.grading.chapterN`` with a function
``chapter_N_checks() -> list[Check]`` (see :mod:`icl_course.grading.checking`).  To register a new
chapter's catalogue, add its number to :data:`CHAPTERS`; nothing else changes.
"""

from __future__ import annotations

import importlib
from typing import Iterable

from .checking import Check

__all__ = ["CHAPTERS", "CHECKS", "catalogue", "build_registry"]

CHAPTERS = (1, 2, 3, 4, 5)   # the chapters with graded exercises


def catalogue(chapter: int) -> list[Check]:
    """The checks of ``chapter``: ``icl_course.grading.chapter{chapter}.chapter_{chapter}_checks()``."""
    module = importlib.import_module(f"{__package__}.chapter{chapter}")
    function = getattr(module, f"chapter_{chapter}_checks", None)
    if function is None:
        raise ImportError(f"{module.__name__} must define chapter_{chapter}_checks() -> list[Check]")
    return function()


def build_registry(chapters: Iterable[int] = CHAPTERS) -> dict[str, Check]:
    """``{name: check}`` for every check of ``chapters``, refusing a check filed under another chapter
    or a name used twice (the name is how notebooks, records and grading find a check)."""
    registry: dict[str, Check] = {}
    for chapter in chapters:
        for check in catalogue(chapter):
            if check.chapter != chapter:
                raise ValueError(f"the check {check.name!r} of icl_course.grading.chapter{chapter} says it belongs "
                                 f"to chapter {check.chapter}")
            if check.name in registry:
                raise ValueError(f"two checks are named {check.name!r} (chapters {registry[check.name].chapter} "
                                 f"and {chapter}); names must be unique across the course")
            registry[check.name] = check
    return registry


CHECKS: dict[str, Check] = build_registry()
