"""Exercise notebooks generated from their answer keys by nbgrader: one source of truth.

A notebook in ``solutions/`` is an nbgrader *source* notebook:

* an **answer cell** holds the answer between ``### BEGIN SOLUTION`` and ``### END SOLUTION`` and
  carries nbgrader metadata ``solution: true`` with ``grade_id`` ``taskK_answer``;
* the **self-check cell** under it starts with ``# self-check, task K``; it is locked, graded, worth
  the points that the heading ``## Task K: ... (N points)`` announces, and may hold checks that only
  grading runs between ``### BEGIN HIDDEN TESTS`` and ``### END HIDDEN TESTS``;
* every other cell is locked (read-only): grading restores it from the source if a learner edits it.

:func:`mark_cells` writes that metadata from the markers, so a chapter author only writes the
markers.  :func:`generate` runs ``nbgrader generate_assignment`` in a scratch course directory and
copies the released notebooks to ``exercises/``: answers become ``raise NotImplementedError()``,
hidden tests disappear, outputs are cleared, and nbgrader's checksums are kept for grading.

    python -m icl_course.grading.exercises            # write exercises/ from solutions/ (make exercises)
    python -m icl_course.grading.exercises --check    # exit 1 if a committed exercise is out of date
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import nbformat

__all__ = ["UNFINISHED", "mark_cells", "task_points", "generate", "source_copy", "run_nbgrader", "GenerationError"]

UNFINISHED = "raise NotImplementedError()"
_SELF_CHECK = re.compile(r"^# self-check, task (\d+)")
_TASK_HEADING = re.compile(r"^## Task (\d+):.*\((\d+) points?\)", re.M)


class GenerationError(RuntimeError):
    """A solution notebook is not a valid source notebook, or nbgrader failed on it."""


def task_points(notebook: nbformat.NotebookNode) -> dict[int, int]:
    """Points per task, read from the headings ``## Task K: ... (N points)``."""
    points = {}
    for cell in notebook.cells:
        if cell.cell_type == "markdown":
            for task, value in _TASK_HEADING.findall(cell.source):
                points[int(task)] = int(value)
    return points


def mark_cells(notebook: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """Write nbgrader metadata on every cell from the markers described above (in place)."""
    points = task_points(notebook)
    answers = 0
    for index, cell in enumerate(notebook.cells):
        if cell.cell_type == "code" and "### BEGIN SOLUTION" in cell.source:
            answers += 1
            metadata = {"solution": True, "grade": False, "locked": False, "grade_id": f"task{answers}_answer"}
        elif cell.cell_type == "code" and _SELF_CHECK.match(cell.source):
            task = int(_SELF_CHECK.match(cell.source).group(1))
            if task not in points:
                raise GenerationError(f"task {task} has a self-check but no heading '## Task {task}: ... (N points)'")
            metadata = {"solution": False, "grade": True, "locked": True, "points": points[task],
                        "grade_id": f"task{task}_check"}
        else:
            metadata = {"solution": False, "grade": False, "locked": True, "grade_id": f"cell{index}_locked"}
        cell.metadata["nbgrader"] = {**metadata, "schema_version": 3}
    checks = sorted(int(cell.metadata["nbgrader"]["grade_id"][4:].split("_")[0]) for cell in notebook.cells
                    if cell.metadata["nbgrader"]["grade"])
    if checks != list(range(1, answers + 1)) or sorted(points) != checks:
        raise GenerationError(
            f"every task needs one answer cell, one self-check cell and a heading with its points; found "
            f"{answers} answer cells, self-checks for tasks {checks} and headings for tasks {sorted(points)}"
        )
    return notebook


def source_copy(path: Path) -> nbformat.NotebookNode:
    """The solution as nbgrader should see it: outputs and per-run execution metadata removed."""
    notebook = nbformat.read(path, as_version=4)
    for cell in notebook.cells:
        cell.metadata.pop("execution", None)
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    return notebook


def run_nbgrader(arguments: list[str], course: Path) -> None:
    """Run ``nbgrader ARGUMENTS`` in the course folder ``course``; a clear error when it fails."""
    # nbgrader calls the `alembic` executable of its own environment
    environment = dict(os.environ, PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))
    result = subprocess.run([sys.executable, "-m", "nbgrader", *arguments], cwd=course, env=environment,
                            capture_output=True, text=True)
    if result.returncode != 0:
        raise GenerationError(f"nbgrader {' '.join(arguments)} failed:\n{result.stdout[-3000:]}{result.stderr[-3000:]}")


def generate(solutions: Path, exercises: Path, check: bool = False) -> list[Path]:
    """Write (or with ``check``, compare) ``exercises/NAME`` for every ``solutions/NAME``.

    Each notebook is its own nbgrader assignment, named after the file.  Returns the exercise
    files that were written, or that are out of date when checking.
    """
    changed = []
    with tempfile.TemporaryDirectory(prefix="icl-course-generate-") as scratch:
        course = Path(scratch)
        (course / "nbgrader_config.py").write_text("c = get_config()\nc.CourseDirectory.course_id = 'icl-course'\n")
        for source in sorted(Path(solutions).glob("*.ipynb")):
            assignment = source.stem
            folder = course / "source" / assignment
            folder.mkdir(parents=True)
            nbformat.write(source_copy(source), folder / source.name)
            run_nbgrader(["generate_assignment", assignment, "--force", "--log-level=WARN"], course)
            text = (course / "release" / assignment / source.name).read_text()
            target = Path(exercises) / source.name
            if not target.exists() or target.read_text() != text:
                changed.append(target)
                if not check:
                    target.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copyfile(course / "release" / assignment / source.name, target)
                    os.chmod(target, 0o644)
    return changed


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m icl_course.grading.exercises", description=__doc__.splitlines()[0])
    parser.add_argument("--solutions", default="solutions", type=Path)
    parser.add_argument("--exercises", default="exercises", type=Path)
    parser.add_argument("--check", action="store_true", help="only report exercises that are out of date")
    arguments = parser.parse_args(argv)
    if not arguments.solutions.is_dir():
        parser.error(f"no folder {arguments.solutions}: run this from the repository root")
    try:
        changed = generate(arguments.solutions, arguments.exercises, arguments.check)
    except GenerationError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    for path in changed:
        print(("out of date: " if arguments.check else "wrote ") + str(path))
    return 1 if arguments.check and changed else 0


if __name__ == "__main__":
    sys.exit(main())
