"""Grade a class's exercise notebooks with one command, on top of nbgrader.

    icl-course grade SUBMISSIONS_DIR --out DIR        (or: python -m icl_course.grade ...)

What it does, in order:

1. **Finds the submissions.** Two layouts are accepted under ``SUBMISSIONS_DIR``:

   * nbgrader's ``[submitted/]<student>/<assignment>/<notebook>.ipynb``: the student is the first
     folder (after an optional ``submitted``);
   * a flat folder of ``<student>_<anything>.ipynb``, as learning-management systems download them
     (Canvas writes ``name_LATE_12345_67890_01_linear....ipynb``): the student is the part of the
     file name before the first underscore.

   ``.ipynb_checkpoints`` folders are skipped.
2. **Recognises the assignment from the notebook itself**, not from its name: the nbgrader
   checksums of its locked cells are compared with those of every exercise in ``solutions/``.
3. **Repairs harmless defects** on a copy: duplicate cell ids (as JupyterLab's split-cell makes),
   another Python kernel name, stored outputs of any size (all outputs are cleared: the notebook is
   executed again anyway).  Malformed files (not JSON, not a notebook, another course's notebook)
   get zero points and a message saying why.
4. **Autogrades with nbgrader**, each submission in its own process and kernel, with a time limit
   per cell and per notebook and a memory limit; locked cells that were edited or deleted are
   restored from the source (nbgrader's checksums and ``add_missing_cells``), and the hidden tests
   run.  A broken, hanging or crashing submission is reported and the batch goes on.
5. **Writes** ``DIR/grades.csv`` (one row per student and assignment: ``student``, ``assignment``,
   one column per task, ``total``, ``max_total``, ``status``) and ``DIR/feedback/<student>/<assignment>.html``,
   the graded notebook with the hidden tests removed (``--hidden-tests-in-feedback`` keeps them).

Submissions are never modified: they are read once, copied, and their hashes are checked again at
the end.  Everything is written under ``--out``; running again gives the same result.
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import uuid
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import nbformat

from .exercises import _nbgrader, _source_copy

__all__ = ["Submission", "find_submissions", "grade", "main"]

MARKER = ".icl-course-grading"
REPOSITORY = Path(__file__).resolve().parents[1]


@dataclass
class Submission:
    """One notebook handed in, and what grading made of it."""

    path: Path
    student: str
    assignment: Optional[str] = None
    status: str = "pending"
    scores: dict = field(default_factory=dict)


def _student_name(text: str) -> str:
    name = re.sub(r"[^A-Za-z0-9.-]+", "-", text).strip("-.").lower()
    return name or "unknown"


def find_submissions(root: Path) -> list[Submission]:
    """Every ``.ipynb`` under ``root`` with its student, by the layout rules in the module doc."""
    root = Path(root)
    found = []
    for path in sorted(root.rglob("*.ipynb")):
        parts = path.relative_to(root).parts
        if any(part.startswith(".") for part in parts):
            continue  # .ipynb_checkpoints and other hidden folders
        folders = list(parts[:-1])
        if folders and folders[0] == "submitted":
            folders = folders[1:]
        student = folders[0] if folders else path.stem.split("_")[0]
        found.append(Submission(path=path, student=_student_name(student)))
    return found


def _locked_checksums(notebook) -> dict:
    return {cell.metadata["nbgrader"]["grade_id"]: cell.metadata["nbgrader"].get("checksum")
            for cell in notebook.cells
            if isinstance(cell.metadata.get("nbgrader"), dict) and cell.metadata["nbgrader"].get("locked")
            and "grade_id" in cell.metadata["nbgrader"]}


def _recognise(notebook, references: dict) -> Optional[str]:
    """The assignment whose locked-cell checksums the notebook shares most (at least half of them)."""
    mine = _locked_checksums(notebook)
    best, best_share = None, 0.5
    for name, theirs in references.items():
        share = sum(mine.get(key) == value for key, value in theirs.items()) / max(1, len(theirs))
        if share > best_share or (share == best_share and best is None and share > 0.5):
            best, best_share = name, share
    return best


def _read(text: str):
    """Parse a submission; returns the notebook and the repairs its raw JSON needed."""
    raw = json.loads(text)
    if not isinstance(raw, dict) or not isinstance(raw.get("cells"), list):
        raise ValueError("no list of cells")
    fixes = []
    ids = [cell.get("id") for cell in raw["cells"] if isinstance(cell, dict)]
    if len(set(ids)) < len(ids):
        fixes.append("duplicate cell ids renumbered")
        seen = set()
        for cell in raw["cells"]:
            if cell.get("id") in seen:
                cell["id"] = uuid.uuid4().hex[:8]
            seen.add(cell.get("id"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        notebook = nbformat.reads(json.dumps(raw), as_version=4)
    return notebook, fixes


def _repair(notebook) -> list[str]:
    """Fix what a learner did not do on purpose; returns what was fixed."""
    fixes = []
    stored = sum(len(json.dumps(cell.get("outputs", []))) for cell in notebook.cells if cell.cell_type == "code")
    if stored > 1_000_000:
        fixes.append(f"{stored / 1e6:.0f} MB of stored outputs removed")
    for cell in notebook.cells:  # outputs are never graded: the notebook runs again
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    kernel = notebook.metadata.get("kernelspec", {}).get("name")
    if kernel != "python3":
        notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
        fixes.append(f"kernel {kernel!r} replaced by python3")
    return sorted(set(fixes))


def _hashes(root: Path) -> dict:
    return {str(path): hashlib.sha256(path.read_bytes()).hexdigest() for path in sorted(Path(root).rglob("*"))
            if path.is_file()}


def _limit_memory(bytes_limit: int):
    def apply():
        import resource
        resource.setrlimit(resource.RLIMIT_AS, (bytes_limit, bytes_limit))
    return apply


def _autograde(course: Path, assignment: str, student: str, notebook_timeout: float, memory_bytes: int) -> str:
    """Run nbgrader autograde for one submission in its own process group; '' on success."""
    environment = dict(os.environ, PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))
    process = subprocess.Popen(
        [sys.executable, "-m", "nbgrader", "autograde", assignment, "--student", student, "--force",
         "--log-level=WARN"],
        cwd=course, env=environment, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True, preexec_fn=_limit_memory(memory_bytes) if os.name == "posix" else None)
    try:
        output, _ = process.communicate(timeout=notebook_timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.communicate()
        return f"stopped after the notebook time limit ({notebook_timeout:g} s)"
    if process.returncode != 0:
        last = [line for line in output.splitlines() if line.strip()][-1:] or ["no output"]
        return f"autograding failed: {last[0][:200]}"
    if "Timeout" in output or "timed out" in output.lower():
        return "a cell exceeded the cell time limit"
    return ""


def _write_config(course: Path, cell_timeout: float, hidden_tests_in_feedback: bool) -> None:
    # feedback is made from the autograded notebook, which holds the hidden tests: strip them unless asked
    feedback = ("" if hidden_tests_in_feedback else
                "from nbgrader.preprocessors import GetGrades, ClearHiddenTests\n"
                "from nbconvert.preprocessors import CSSHTMLHeaderPreprocessor\n"
                "c.GenerateFeedback.preprocessors = [GetGrades, ClearHiddenTests, CSSHTMLHeaderPreprocessor]\n")
    (course / "nbgrader_config.py").write_text(
        "c = get_config()\n"
        "c.CourseDirectory.course_id = 'icl-course'\n"
        f"c.Execute.timeout = {int(cell_timeout)}\n"
        "c.Execute.interrupt_on_timeout = True\n"
        "c.OverwriteCells.add_missing_cells = True\n" + feedback
    )


def grade(submissions: Path, out: Path, solutions: Optional[Path] = None, cell_timeout: float = 60,
          notebook_timeout: float = 600, memory_gib: float = 4.0, progress: bool = True,
          hidden_tests_in_feedback: bool = False) -> list[Submission]:
    """Grade every notebook under ``submissions``; write ``grades.csv`` and feedback under ``out``."""
    from tqdm.auto import tqdm

    submissions, out = Path(submissions).resolve(), Path(out).resolve()
    solutions = Path(solutions).resolve() if solutions else REPOSITORY / "solutions"
    if not submissions.is_dir():
        raise ValueError(f"{submissions} is not a folder of submissions")
    if not solutions.is_dir() or not list(solutions.glob("*.ipynb")):
        raise ValueError(f"no solution notebooks in {solutions}: pass --solutions")
    if out == submissions or submissions in out.parents or out in submissions.parents:
        raise ValueError("--out must be outside the submissions folder (grading never writes there)")
    if out.exists() and any(out.iterdir()) and not (out / MARKER).exists():
        raise ValueError(f"{out} exists and was not made by icl-course grade: choose an empty or new folder")
    before = _hashes(submissions)

    workspace = out / "nbgrader"
    if workspace.exists():
        shutil.rmtree(workspace)
    workspace.mkdir(parents=True)
    (out / MARKER).write_text("made by icl-course grade; safe to delete\n")
    _write_config(workspace, cell_timeout, hidden_tests_in_feedback)
    references = {}
    for source in sorted(solutions.glob("*.ipynb")):
        folder = workspace / "source" / source.stem
        folder.mkdir(parents=True)
        try:
            nbformat.write(_source_copy(source), folder / source.name)
            _nbgrader(["generate_assignment", source.stem, "--force", "--log-level=WARN"], workspace)
        except Exception as error:  # an unreadable answer key must stop the run with its name, not a traceback
            raise ValueError(f"the answer key {source} cannot be used: {str(error).splitlines()[0][:300]}") from None
        references[source.stem] = _locked_checksums(
            nbformat.read(workspace / "release" / source.stem / source.name, as_version=4))

    found = find_submissions(submissions)
    taken = set()
    for submission in found:
        try:
            notebook, fixes = _read(submission.path.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as error:
            submission.status = f"not a notebook ({type(error).__name__})"
            continue
        except Exception as error:  # nbformat raises several types for malformed notebooks
            submission.status = f"malformed notebook ({type(error).__name__}: {str(error)[:80]})"
            continue
        submission.assignment = _recognise(notebook, references)
        if submission.assignment is None:
            submission.status = "not recognised as any exercise of this course"
            continue
        if (submission.student, submission.assignment) in taken:
            submission.status = "a second submission of the same assignment by the same student: ignored"
            submission.assignment = None
            continue
        taken.add((submission.student, submission.assignment))
        fixes = sorted(set(fixes + _repair(notebook)))
        target = workspace / "submitted" / submission.student / submission.assignment / f"{submission.assignment}.ipynb"
        target.parent.mkdir(parents=True, exist_ok=True)
        nbformat.write(notebook, target)
        submission.status = "graded" + (f" ({'; '.join(fixes)})" if fixes else "")

    memory = int(memory_gib * 2**30)
    runnable = [s for s in found if s.assignment is not None]
    for submission in tqdm(runnable, desc="grading", disable=not progress):
        problem = _autograde(workspace, submission.assignment, submission.student, notebook_timeout, memory)
        if problem:
            submission.status = problem
    _collect_scores(workspace, runnable)
    for assignment in sorted({s.assignment for s in runnable}):
        _nbgrader(["generate_feedback", assignment, "--force", "--log-level=WARN"], workspace)
    _write_outputs(out, workspace, found, references)
    if _hashes(submissions) != before:
        raise RuntimeError("a submission file changed during grading; this is a bug, please report it")
    if progress:
        _print_summary(found)
    return found


def _collect_scores(workspace: Path, submissions: list[Submission]) -> None:
    from nbgrader.api import Gradebook, MissingEntry

    with Gradebook(f"sqlite:///{workspace / 'gradebook.db'}") as gradebook:
        for submission in submissions:
            try:
                notebook = gradebook.find_submission_notebook(submission.assignment, submission.assignment,
                                                              submission.student)
            except MissingEntry:
                submission.scores = {}
                if submission.status.startswith("graded"):
                    submission.status = "autograding produced no result"
                continue
            submission.scores = {grade.name: (grade.score, grade.max_score) for grade in notebook.grades
                                 if grade.name.endswith("_check")}


def _write_outputs(out: Path, workspace: Path, found: list[Submission], references: dict) -> None:
    tasks = sorted({key for reference in references.values() for key in reference if key.endswith("_check")},
                   key=lambda name: int(re.findall(r"\d+", name)[0]))
    columns = [name.replace("_check", "") for name in tasks]
    (out / "feedback").mkdir(exist_ok=True)
    with open(out / "grades.csv", "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["student", "assignment", *columns, "total", "max_total", "status", "file"])
        for submission in sorted(found, key=lambda s: (s.student, s.assignment or "", str(s.path))):
            row = [submission.scores.get(name, (0.0, None))[0] or 0.0 for name in tasks]
            maximum = sum(value for _, value in submission.scores.values() if value) if submission.scores else ""
            writer.writerow([submission.student, submission.assignment or "", *[f"{v:g}" for v in row],
                             f"{sum(row):g}", maximum if maximum == "" else f"{maximum:g}", submission.status,
                             submission.path.name])
            if submission.assignment:
                source = workspace / "feedback" / submission.student / submission.assignment / f"{submission.assignment}.html"
                if source.exists():
                    target = out / "feedback" / submission.student / f"{submission.assignment}.html"
                    target.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copyfile(source, target)


def _print_summary(found: list[Submission]) -> None:
    print(f"\n{len(found)} notebooks")
    failed_tasks = {}
    for submission in found:
        total = sum(score for score, _ in submission.scores.values())
        maximum = sum(value for _, value in submission.scores.values())
        print(f"  {submission.student:16s} {submission.assignment or '-':45s} {total:5g} / {maximum:<5g} {submission.status}")
        for name, (score, value) in submission.scores.items():
            if score < value:
                failed_tasks[(submission.assignment, name)] = failed_tasks.get((submission.assignment, name), 0) + 1
    for (assignment, name), count in sorted(failed_tasks.items(), key=lambda item: -item[1])[:5]:
        print(f"  most failed: {assignment} {name.replace('_check', '')}: {count} students")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="icl-course grade", description="Grade a class's exercise notebooks.")
    parser.add_argument("submissions", type=Path, help="folder of submitted notebooks (see the layouts in the docs)")
    parser.add_argument("--out", type=Path, required=True, help="folder for grades.csv and feedback/")
    parser.add_argument("--solutions", type=Path, help="answer keys (default: the course's solutions/)")
    parser.add_argument("--cell-timeout", type=float, default=60, help="seconds per cell (default 60)")
    parser.add_argument("--notebook-timeout", type=float, default=600, help="seconds per notebook (default 600)")
    parser.add_argument("--memory-limit", type=float, default=4.0, help="GiB per submission (default 4)")
    parser.add_argument("--hidden-tests-in-feedback", action="store_true",
                        help="keep the hidden tests in the feedback HTML (by default they are removed)")
    arguments = parser.parse_args(argv)
    try:
        grade(arguments.submissions, arguments.out, arguments.solutions, arguments.cell_timeout,
              arguments.notebook_timeout, arguments.memory_limit,
              hidden_tests_in_feedback=arguments.hidden_tests_in_feedback)
    except ValueError as error:
        parser.error(str(error))
    print(f"grades: {arguments.out / 'grades.csv'}; feedback: {arguments.out / 'feedback'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
