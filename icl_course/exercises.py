"""Exercise notebooks generated from their solutions: one source of truth.

A solution notebook in ``solutions/`` marks each answer with

    ### BEGIN SOLUTION
    ...the answer...
    ### END SOLUTION

and may hold checks that only the instructor runs between ``### BEGIN HIDDEN TESTS`` and
``### END HIDDEN TESTS``.  The exercise notebook is the same notebook with each answer replaced by
``raise NotImplementedError()`` (markdown answers by ``YOUR ANSWER HERE``), hidden tests removed and
outputs cleared, the same convention as nbgrader's, so the learner's notebook keeps every
visible self-check.

    python -m icl_course.exercises            # write exercises/ from solutions/
    python -m icl_course.exercises --check    # exit 1 if a committed exercise is out of date
"""

from __future__ import annotations

import argparse
import copy
import re
import sys
from pathlib import Path

import nbformat

__all__ = ["make_exercise", "generate", "UNFINISHED"]

UNFINISHED = "raise NotImplementedError()"
_SOLUTION = re.compile(r"^([ \t]*)### BEGIN SOLUTION[^\n]*\n.*?^[ \t]*### END SOLUTION[^\n]*(\n|$)", re.M | re.S)
_HIDDEN = re.compile(r"^[ \t]*### BEGIN HIDDEN TESTS[^\n]*\n.*?^[ \t]*### END HIDDEN TESTS[^\n]*(\n|$)", re.M | re.S)


def _strip_code(source: str) -> str:
    source = _HIDDEN.sub("", source)
    return _SOLUTION.sub(lambda match: f"{match.group(1)}# YOUR CODE HERE\n{match.group(1)}{UNFINISHED}\n",
                         source).rstrip("\n")


def _strip_markdown(source: str) -> str:
    return _SOLUTION.sub("YOUR ANSWER HERE\n", source).rstrip("\n")


def make_exercise(solution: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """The learner's notebook for a solution notebook: answers stubbed, hidden tests removed."""
    exercise = copy.deepcopy(solution)
    for cell in exercise.cells:
        if cell.cell_type == "code":
            cell.source = _strip_code(cell.source)
            cell.outputs = []
            cell.execution_count = None
        elif cell.cell_type == "markdown":
            cell.source = _strip_markdown(cell.source)
        cell.pop("attachments", None) if cell.cell_type == "code" else None
        cell.metadata.pop("execution", None)
    return exercise


def _render(notebook: nbformat.NotebookNode) -> str:
    return nbformat.writes(notebook) + "\n"


def generate(solutions: Path, exercises: Path, check: bool = False) -> list[Path]:
    """Write (or with ``check``, compare) ``exercises/NAME`` for every ``solutions/NAME``.

    Returns the exercise files that were written, or that are out of date when checking.
    """
    changed = []
    for source in sorted(Path(solutions).glob("*.ipynb")):
        target = Path(exercises) / source.name
        text = _render(make_exercise(nbformat.read(source, as_version=4)))
        if not target.exists() or target.read_text() != text:
            changed.append(target)
            if not check:
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_text(text)
    return changed


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m icl_course.exercises", description=__doc__.splitlines()[0])
    parser.add_argument("--solutions", default="solutions", type=Path)
    parser.add_argument("--exercises", default="exercises", type=Path)
    parser.add_argument("--check", action="store_true", help="only report exercises that are out of date")
    arguments = parser.parse_args(argv)
    if not arguments.solutions.is_dir():
        parser.error(f"no folder {arguments.solutions}: run this from the repository root")
    changed = generate(arguments.solutions, arguments.exercises, arguments.check)
    for path in changed:
        print(("out of date: " if arguments.check else "wrote ") + str(path))
    return 1 if arguments.check and changed else 0


if __name__ == "__main__":
    sys.exit(main())
