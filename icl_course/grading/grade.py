"""Grade a class's exercise notebooks with one command, on top of nbgrader.

    icl-course grade SUBMISSIONS_DIR --out DIR        (or: python -m icl_course.grading.grade ...)

What it does, in order:

1. **Finds the submissions.** Two layouts are accepted under ``SUBMISSIONS_DIR``:

   * nbgrader's ``[submitted/]<student>/<assignment>/<notebook>.ipynb``: the student is the first
     folder (after an optional ``submitted``);
   * a flat folder of ``<student>_<anything>.ipynb``, as learning-management systems download them
     (Canvas writes ``name_LATE_12345_67890_01_linear....ipynb``): the student is the part of the
     file name before the first underscore.

   ``.ipynb_checkpoints`` and other hidden folders are skipped.
2. **Recognises the assignment from the notebook itself**, not from its name: the nbgrader
   checksums of its locked cells are compared with those of every answer key in ``solutions/``.
   When a student hands in two notebooks of one assignment, the newer is graded (nbgrader's
   ``timestamp.txt`` beside it, else the file's modification time) and the other is reported.
3. **Repairs harmless defects** on a copy: duplicate cell ids (as JupyterLab's split-cell makes),
   another Python kernel name, stored outputs of any size (all outputs are cleared: the notebook is
   executed again anyway).  Malformed files (not JSON, not a notebook, another course's notebook)
   get zero points and a message saying why.
4. **Runs the notebook under nbgrader's autograde**, each submission in a course folder of its
   own, in its own process and kernel, with a time limit per cell and per notebook and a memory
   limit.  Locked cells that were edited or deleted are restored from the answer key (nbgrader's
   checksums and ``add_missing_cells``), outputs are truncated (nbgrader's ``LimitOutput``), and
   the hidden tests run: they *record* the learner's functions' outputs on inputs that this process
   drew beforehand from a seed that only it knows and wrote into the submission's course folder
   (:func:`icl_course.grading.protocol.write_cases` and :func:`~icl_course.grading.protocol.record`).
   The sandbox shows the kernel a copy of the package in which the reference functions of the
   assignment's tasks raise an error (:mod:`icl_course.grading.stripped`): an answer that calls
   them, or reads their source, earns nothing for its task.
5. **Decides the points in this process**, after the kernel has exited: the recorded outputs are
   loaded as plain tensors and numbers and verified against the package's reference functions
   (:func:`icl_course.grading.protocol.verify_recorded`).  Nothing the learner's code did inside its kernel
   (patched comparisons, redefined helpers, fake "passed" lines, a swallowed exception, an exited
   kernel) changes that verdict.  Answer cells that name the package's own reference functions are
   listed in the ``review`` column (without the sandbox those functions still answer).
6. **Writes** ``DIR/grades.csv`` (one row per student and assignment: ``student``, ``assignment``,
   one column per task, ``total``, ``max_total``, ``status``, ``errors`` (the cells that raised or ran
   past the cell time limit, with the error's type), ``review``, ``file``) and
   ``DIR/feedback/<student>/<assignment>.html``: nbgrader's feedback page of the executed notebook,
   with these points, a comment under every answer saying what failed, and the hidden tests
   removed (``--hidden-tests-in-feedback`` keeps them).

Submissions are never modified: they are read once, copied, and their hashes are checked again at
the end.  Everything is written under ``--out``; running again with the same ``--out`` gives the
same result (the grading seed is kept there).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import csv
import functools
import hashlib
import html
import json
import os
import re
import secrets
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import uuid
import warnings
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import nbformat

from . import protocol
from .exercises import run_nbgrader, source_copy
from .registry import CHECKS
from .safe_html import clean_outputs, sanitise_page
from .sandbox import ControlGroup, memory_file_system, package_folder, sandbox_problem, sandboxed
from .stripped import strip_package, withheld_names
from .untrusted import UnsafeFile, read_untrusted

__all__ = ["Submission", "AnswerKey", "find_submissions", "default_solutions", "grade", "main"]

MARKER = ".icl-course-grading"
# In a source checkout (the course's repository, installed with `pip install -e .`) the answer keys
# sit beside the package.  An installed wheel ships no answer keys: then --solutions is required.
CHECKOUT_SOLUTIONS = Path(__file__).resolve().parents[2] / "solutions"
DEFAULT_JOBS = min(4, os.cpu_count() or 1)
NO_SANDBOX_COST = ("a learner's code can then read and write every file you can, including --out with "
                   "other students' records and the grading secret, signal your processes, start processes "
                   "that outlive grading, use the network and call the package's reference functions for the "
                   "tasks being graded")


@dataclass
class Task:
    """One graded task of an answer key: its points and the trusted checks that decide them."""

    number: int
    points: float
    checks: list
    giveaways: tuple


@dataclass
class AnswerKey:
    """What grading needs from one solution notebook."""

    assignment: str
    checksums: dict
    tasks: dict

    @property
    def max_total(self) -> float:
        return sum(task.points for task in self.tasks.values())


MAX_NOTEBOOK_BYTES = 20 * 2**20   # a notebook with its outputs; anything larger is not graded
# what the grader reads back from a course folder after the sandbox (nbgrader truncates long text
# outputs, but not images); a larger file is reported, not read
MAX_EXECUTED_BYTES = 2 * MAX_NOTEBOOK_BYTES
MAX_GRADEBOOK_BYTES = 16 * 2**20
# the scratch course folders in memory: "icl-course-<grader's pid>-<random>" (see _remove_stale_scratch)
SCRATCH_PREFIX = "icl-course-"
_SAFE_FOLDER = re.compile(r"[a-z0-9][a-z0-9._-]{0,63}")


@dataclass
class Submission:
    """One notebook handed in, and what grading made of it.

    ``student`` is the identity exactly as the submissions folder gives it (case and script kept);
    ``folder`` is the name of its folders under ``--out`` (see :func:`student_folder`).
    """

    path: Path
    student: str
    assignment: Optional[str] = None
    status: str = "pending"
    scores: dict = field(default_factory=dict)      # task number -> points earned
    comments: dict = field(default_factory=dict)    # task number -> what failed
    review: list = field(default_factory=list)      # answer cells that use reference functions
    errors: list = field(default_factory=list)      # cells of the executed notebook that raised or timed out
    max_total: Optional[float] = None

    @property
    def folder(self) -> str:
        return student_folder(self.student)


def student_folder(student: str) -> str:
    """A file and nbgrader name for ``student``: the identity itself when it is a plain lower-case
    name, otherwise an ASCII rendering plus a hash of the exact identity, so that ``Alice`` and
    ``alice``, or two names in another script, never share a folder."""
    if _SAFE_FOLDER.fullmatch(student):
        return student
    ascii_part = re.sub(r"[^a-z0-9.-]+", "-", student.lower()).strip("-.")[:40] or "student"
    return f"{ascii_part}-{hashlib.sha256(student.encode()).hexdigest()[:8]}"


def _skipped(path: Path, root: Path, reason: str) -> Submission:
    return Submission(path=path, student=_identity(path, root), status=f"skipped: {reason}")


def _identity(path: Path, root: Path) -> str:
    folders = list(path.relative_to(root).parts[:-1])
    if folders and folders[0] == "submitted":
        folders = folders[1:]
    return folders[0] if folders else path.name.split("_")[0].removesuffix(".ipynb")


def find_submissions(root: Path) -> list[Submission]:
    """Every notebook under ``root`` with its student, by the layout rules in the module doc.

    Only regular files are read, never through a symbolic link (a link could point at another
    student's notebook or outside the folder); links, FIFOs, devices, hidden notebooks and files
    over ``MAX_NOTEBOOK_BYTES`` come back with a ``skipped: ...`` status instead of being ignored.
    """
    root = Path(root)
    found = []
    for folder, directories, files in os.walk(root, followlinks=False):
        here = Path(folder)
        for name in sorted(directories):
            if (here / name).is_symlink():
                found.append(_skipped(here / name, root, "a symbolic link to a folder (not followed)"))
        for name in sorted(files):
            path = here / name
            information = path.lstat()
            if not name.endswith(".ipynb") and stat.S_ISREG(information.st_mode):
                continue  # timestamp.txt and other companions of a submission
            hidden = any(part.startswith(".") for part in path.relative_to(root).parts)
            if stat.S_ISLNK(information.st_mode):
                found.append(_skipped(path, root, "a symbolic link (not followed)"))
            elif not stat.S_ISREG(information.st_mode):
                found.append(_skipped(path, root, "not a regular file (a FIFO, socket or device)"))
            elif hidden:
                found.append(_skipped(path, root, "a hidden file or one in a hidden folder "
                                                  "(.ipynb_checkpoints holds autosaves, not submissions)"))
            elif information.st_size > MAX_NOTEBOOK_BYTES:
                found.append(_skipped(path, root, f"{information.st_size / 2**20:.0f} MiB, more than the "
                                                  f"{MAX_NOTEBOOK_BYTES // 2**20} MiB a notebook may have"))
            else:
                found.append(Submission(path=path, student=_identity(path, root)))
    return sorted(found, key=lambda submission: str(submission.path))


def _read_submission(path: Path) -> str:
    """The text of a regular file, opened without following links and read with a size cap."""
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
    descriptor = os.open(path, flags)
    with os.fdopen(descriptor, "rb") as handle:
        if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
            raise ValueError("not a regular file")
        data = handle.read(MAX_NOTEBOOK_BYTES + 1)
    if len(data) > MAX_NOTEBOOK_BYTES:
        raise ValueError("larger than a notebook may be")
    return data.decode("utf-8")


def _report_collisions(found: list[Submission]) -> None:
    """Two identities that would share a folder are both reported, never merged."""
    owners = {}
    for submission in found:
        owners.setdefault(submission.folder, set()).add(submission.student)
    for submission in found:
        others = owners[submission.folder] - {submission.student}
        if others and not submission.status.startswith("skipped"):
            submission.status = (f"skipped: the identity {submission.student!r} collides with "
                                 f"{sorted(others)} in the folder name {submission.folder!r}; rename one")


def _handed_in_at(path: Path) -> float:
    """nbgrader's ``timestamp.txt`` beside the notebook when there is one, else the file's time."""
    stamp = path.parent / "timestamp.txt"
    if stamp.is_file():
        try:
            from nbgrader.utils import parse_utc
            return parse_utc(stamp.read_text().strip()).timestamp()
        except Exception:  # an unreadable stamp: fall back on the file's own time
            pass
    return path.stat().st_mtime


def _nbgrader_metadata(cell) -> dict:
    metadata = cell.get("metadata", {}).get("nbgrader")
    return metadata if isinstance(metadata, dict) else {}


def _locked_checksums(notebook) -> dict:
    return {_nbgrader_metadata(cell)["grade_id"]: _nbgrader_metadata(cell).get("checksum")
            for cell in notebook.cells
            if _nbgrader_metadata(cell).get("locked") and "grade_id" in _nbgrader_metadata(cell)}


def _answer_key(assignment: str, source, release) -> AnswerKey:
    """Tasks, points and trusted checks from the answer key; checksums from the released exercise."""
    tasks = {}
    for cell in source.cells:
        metadata = _nbgrader_metadata(cell)
        if metadata.get("grade") and metadata.get("grade_id", "").endswith("_check"):
            number = int(re.findall(r"\d+", metadata["grade_id"])[0])
            names = protocol.recorded_names(cell.source)
            unknown = [name for name in names if name not in CHECKS]
            if unknown:
                raise ValueError(f"task {number} records {unknown}, which no catalogue in icl_course.grading defines")
            giveaways = tuple(sorted({word for name in names for word in CHECKS[name].giveaways}))
            tasks[number] = Task(number, float(metadata.get("points", 0)), names, giveaways)
    return AnswerKey(assignment, _locked_checksums(release), tasks)


def _recognise(notebook, keys: dict) -> Optional[str]:
    """The assignment whose locked-cell checksums the notebook shares most (more than half of them)."""
    mine = _locked_checksums(notebook)
    best, best_share = None, 0.5
    for name, key in keys.items():
        share = sum(mine.get(cell) == value for cell, value in key.checksums.items()) / max(1, len(key.checksums))
        if share > best_share:
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
    seen = set()
    for cell in notebook.cells:  # a graded cell copied and pasted: the copy runs, but is not graded twice
        grade_id = _nbgrader_metadata(cell).get("grade_id")
        if grade_id in seen:
            del cell.metadata["nbgrader"]
            fixes.append(f"a copy of the graded cell {grade_id!r} kept as an ordinary cell")
        elif grade_id:
            seen.add(grade_id)
    kernel = notebook.metadata.get("kernelspec", {}).get("name")
    if kernel != "python3":
        notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
        fixes.append(f"kernel {kernel!r} replaced by python3")
    return sorted(set(fixes))


def _hashes(root: Path) -> dict:
    """A fingerprint of every entry under ``root``: regular files by content, others by kind and target."""
    hashes = {}
    for folder, directories, files in os.walk(root, followlinks=False):
        for name in directories + files:
            path = Path(folder) / name
            information = path.lstat()
            if stat.S_ISREG(information.st_mode):
                hashes[str(path)] = hashlib.sha256(path.read_bytes()).hexdigest()
            elif stat.S_ISLNK(information.st_mode):
                hashes[str(path)] = f"link to {os.readlink(path)}"
            elif not stat.S_ISDIR(information.st_mode):
                hashes[str(path)] = f"special file {stat.S_IFMT(information.st_mode)}"
    return hashes


MAX_PROCESSES = 512    # processes and threads of one submission, all together (a kernel needs a few dozen)


def _limit_resources(bytes_limit: int, group: "ControlGroup | None" = None):
    def apply():
        import resource
        if group is not None:
            group.enter()
        resource.setrlimit(resource.RLIMIT_AS, (bytes_limit, bytes_limit))
        # a second line under the sandbox: no single file larger than the memory limit
        resource.setrlimit(resource.RLIMIT_FSIZE, (bytes_limit, bytes_limit))
    return apply


def _autograde(course: Path, assignment: str, student: str, notebook_timeout: float, memory_bytes: int,
               answers: Path, sandbox: bool = True, package: Optional[Path] = None) -> tuple:
    """Run nbgrader autograde for one submission in its own process group; returns ``(problem, executed)``:
    '' or what went wrong, and the executed notebook (read as untrusted input) or None.

    With ``sandbox`` the whole run (nbgrader, the kernel, whatever the learner's code starts) is
    inside :func:`icl_course.grading.sandbox.sandboxed`, which sees only this course folder and
    ``package`` (the stripped copy of the package) in place of the package.
    """
    path = os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")
    # no seed: the kernel reads the inputs that write_cases put in ``answers``
    variables = {protocol.ANSWERS_VARIABLE: str(answers), "PATH": path}
    command = [sys.executable, "-m", "nbgrader", "autograde", assignment, "--student", student, "--force",
               "--log-level=WARN"]
    if sandbox:
        command = sandboxed(command, writable=course, hidden=("source",), environment=variables, package=package)
        environment = dict(os.environ)
    else:
        environment = dict(os.environ, **variables)
    # one memory and process-count limit for everything the submission starts, where Linux allows it
    group = ControlGroup.create(f"icl-course-{os.getpid()}-{secrets.token_hex(4)}", memory_bytes, MAX_PROCESSES) \
        if os.name == "posix" else None
    process = subprocess.Popen(
        command, cwd=course, env=environment, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True, preexec_fn=_limit_resources(memory_bytes, group) if os.name == "posix" else None)
    try:
        output, _ = process.communicate(timeout=notebook_timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.communicate()
        return f"stopped after the notebook time limit ({notebook_timeout:g} s)", None
    finally:
        try:  # the kernel and anything it started share the process group: none may outlive grading
            os.killpg(process.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        out_of_memory = group is not None and group.out_of_memory()
        out_of_processes = group is not None and group.out_of_processes()
        if group is not None:
            group.close()
    executed, unreadable = _read_executed(course, Path("autograded") / student / assignment / f"{assignment}.ipynb")
    return _run_problem(process.returncode, executed, answers, output, out_of_memory, out_of_processes, memory_bytes,
                        unreadable), executed


def _read_executed(course: Path, relative: Path) -> tuple:
    """``(notebook, "")`` for nbgrader's executed notebook, read as untrusted input
    (:func:`icl_course.grading.untrusted.read_untrusted`), ``(None, "")`` when there is none, and
    ``(None, why)`` when what is there was not read or not parsed."""
    try:
        data = read_untrusted(course, relative, MAX_EXECUTED_BYTES)
    except FileNotFoundError:
        return None, ""
    except (OSError, UnsafeFile) as error:
        return None, f"the executed notebook was not read ({error})"
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return nbformat.reads(data.decode("utf-8"), as_version=4), ""
    except Exception as error:  # nbgrader wrote it, but the learner's code could write there too
        return None, f"the executed notebook could not be read ({type(error).__name__})"


# The error output nbgrader puts in a cell that ran past the cell time limit (set in _write_config, so
# that it does not depend on nbgrader's default).
CELL_TIMEOUT_ERROR = "CellTimeoutError"
# Exceptions that nbgrader logs when the kernel could not be started (a port taken meanwhile, a slow start).
KERNEL_START_FAILURES = ("Kernel didn't respond", "Kernel died before replying to kernel_info",
                         "Address already in use")
# the last line of a traceback, as nbgrader logs it (indented): "    nbclient.exceptions.DeadKernelError: Kernel died"
_EXCEPTION_LINE = re.compile(r"^[ \t]*(?:\w+\.)*(\w+(?:Error|Exception)): ?(.*)$", re.M)


def _run_problem(returncode: int, executed, answers: Path, log: str, out_of_memory: bool,
                 out_of_processes: bool, memory_bytes: int, unreadable: str = "") -> str:
    """What stopped or troubled one autograde run, in a line for ``status``; '' when nothing did.

    The signals, most trusted first: the control group's counters (kept by Linux, outside the
    sandbox); nbgrader's return code and whether it kept the executed notebook
    (it removes it when a run fails); the error outputs it wrote into that notebook; the answers
    recorded.  nbgrader's log, which mixes nbgrader's messages with whatever the learner's processes
    write to the terminal, is read last, and only to name the exception of a run that failed.
    """
    if unreadable:   # something the learner's code left in place of the executed notebook
        return unreadable
    failed = returncode != 0 or executed is None
    if failed and out_of_memory:
        return (f"the submission reached its memory limit ({memory_bytes / 2**30:g} GiB for all its processes "
                "together) and was stopped (the answers recorded before that count)")
    if failed and out_of_processes:
        return (f"the submission reached its limit of {MAX_PROCESSES} processes and threads and was stopped (the "
                "answers recorded before that count)")
    if failed:
        exceptions = _EXCEPTION_LINE.findall(log)
        name, message = exceptions[-1] if exceptions else ("", "")
        if name == "DeadKernelError":
            return "the kernel stopped during execution (the answers recorded before it stopped count)"
        # a kernel that recorded an answer did start: running the learner's code again would be wrong
        recorded = answers.is_dir() and any(answers.glob("*.pt"))   # cases/ holds the inputs, not answers
        if not recorded and any(text in message for text in KERNEL_START_FAILURES):
            return "the kernel could not start"
        if name:
            return f"autograding failed: {name}: {message}"[:200]
        return f"autograding failed (nbgrader exited with status {returncode} and kept no executed notebook)"
    return "a cell exceeded the cell time limit" if _timed_out_cells(executed) else ""


def _cells_that_raised(notebook) -> list[str]:
    """``"task1_answer: NameError"``, ``"cell 7: CellTimeoutError"``: each code cell of the executed notebook
    that ended in an error, named by its nbgrader id (else its position among all cells, from 1), with the
    error's type.  The points do not depend on it; the instructor sees at once whose notebook did not run
    cleanly, even when the recorded functions earned full points."""
    found = []
    for position, cell in enumerate(notebook.cells, start=1):
        if cell.get("cell_type") != "code":
            continue
        names = [str(output.get("ename", "Error"))[:60] for output in cell.get("outputs", [])
                 if output.get("output_type") == "error"]
        if names:
            where = _nbgrader_metadata(cell).get("grade_id") or f"cell {position}"
            found.append(f"{str(where)[:60]}: {', '.join(dict.fromkeys(names))}")
    return found


def _timed_out_cells(notebook) -> int:
    """How many cells of the executed notebook nbgrader interrupted at the cell time limit."""
    return sum(output.get("output_type") == "error" and output.get("ename") == CELL_TIMEOUT_ERROR
               for cell in notebook.cells if cell.cell_type == "code" for output in cell.get("outputs", []))


def _write_config(course: Path, cell_timeout: float) -> None:
    (course / "nbgrader_config.py").write_text(
        "c = get_config()\n"
        "c.CourseDirectory.course_id = 'icl-course'\n"
        f"c.Execute.timeout = {int(cell_timeout)}\n"
        "c.Execute.interrupt_on_timeout = True\n"
        f"c.Execute.error_on_timeout = {{'ename': {CELL_TIMEOUT_ERROR!r}, 'evalue': 'the cell time limit', "
        f"'traceback': ['{CELL_TIMEOUT_ERROR}: the cell ran past the cell time limit ({int(cell_timeout)} s)']}}\n"
        "c.OverwriteCells.add_missing_cells = True\n"
    )


def _remove_stale_scratch(folder: Optional[Path]) -> list[Path]:
    """Remove the scratch course folders that an interrupted grading run left in ``folder`` (the memory file
    system): those named after a grader process that no longer runs.  Returns what was removed."""
    removed = []
    if folder is None:
        return removed
    for entry in Path(folder).glob(f"{SCRATCH_PREFIX}*"):
        found = re.fullmatch(rf"{re.escape(SCRATCH_PREFIX)}(\d+)-\w+", entry.name)
        try:
            information = entry.lstat()
        except OSError:
            continue
        if not found or not stat.S_ISDIR(information.st_mode) or information.st_uid != os.getuid():
            continue
        try:
            os.kill(int(found.group(1)), 0)
            continue   # that grader still runs (or its pid was reused: then the folder waits for a later run)
        except ProcessLookupError:
            pass
        except PermissionError:
            continue
        shutil.rmtree(entry, ignore_errors=True)
        removed.append(entry)
    return removed


# the grading process's own address space, beyond what it has mapped when grading starts: it reads
# every file from a course folder with a size cap, so this is a second line, never reached in use
GRADER_MEMORY_BYTES = 8 * 2**30


@contextlib.contextmanager
def _memory_cap(extra_bytes: int):
    """While grading, this process's address space may grow by at most ``extra_bytes`` (a soft limit: the
    sandboxed children set their own, see :func:`_limit_resources`)."""
    try:
        import resource
    except ImportError:   # not on Linux: nothing to set
        yield
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    try:
        mapped = int(re.search(r"^VmSize:\s+(\d+) kB", Path("/proc/self/status").read_text(), re.M).group(1)) * 1024
    except (OSError, AttributeError):
        yield
        return
    cap = mapped + int(extra_bytes)
    for limit in (soft, hard):
        if limit != resource.RLIM_INFINITY:
            cap = min(cap, limit)
    resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def _prepare(out: Path) -> str:
    """Check that ``out`` may be written, mark it as ours, and return its grading secret."""
    marker = out / MARKER
    if out.exists() and any(out.iterdir()) and not marker.exists():
        raise ValueError(f"{out} exists and was not made by icl-course grade: choose an empty or new folder")
    found = re.search(r"^secret: ([0-9a-f]{32,})$", marker.read_text(), re.M) if marker.exists() else None
    secret = found.group(1) if found else secrets.token_hex(16)
    out.mkdir(parents=True, exist_ok=True)
    marker.write_text("made by icl-course grade; safe to delete.\n"
                      "The secret below draws the grading inputs; keep it to regrade with the same ones.\n"
                      f"secret: {secret}\n")
    for stale in ("nbgrader", "feedback"):
        shutil.rmtree(out / stale, ignore_errors=True)
    return secret


def _seed(secret: str, student: str, assignment: str) -> int:
    return int(hashlib.sha256(f"{secret}/{student}/{assignment}".encode()).hexdigest()[:8], 16)


def default_solutions() -> Path:
    """The answer keys of the course's own checkout, or a clear error where there is none."""
    if CHECKOUT_SOLUTIONS.is_dir() and any(CHECKOUT_SOLUTIONS.glob("*.ipynb")):
        return CHECKOUT_SOLUTIONS
    raise ValueError("this installation of icl-course has no answer keys beside it (they are not part of the "
                     "package that learners install): pass --solutions PATH/TO/solutions from a checkout of the "
                     "course's repository")


def _load_keys(solutions: Path, template: Path) -> dict:
    """Generate every assignment in the template course folder; return the answer keys."""
    keys = {}
    for source in sorted(solutions.glob("*.ipynb")):
        folder = template / "source" / source.stem
        folder.mkdir(parents=True)
        try:
            notebook = source_copy(source)
            nbformat.write(notebook, folder / source.name)
            run_nbgrader(["generate_assignment", source.stem, "--force", "--log-level=WARN"], template)
            release = nbformat.read(template / "release" / source.stem / source.name, as_version=4)
            keys[source.stem] = _answer_key(source.stem, notebook, release)
        except Exception as error:  # an unreadable answer key must stop the run with its name, not a traceback
            raise ValueError(f"the answer key {source} cannot be used: {str(error).splitlines()[0][:300]}") from None
    return keys


def grade(submissions: Path, out: Path, solutions: Optional[Path] = None, cell_timeout: float = 60,
          notebook_timeout: float = 600, memory_gib: float = 4.0, progress: bool = True,
          hidden_tests_in_feedback: bool = False, jobs: int = DEFAULT_JOBS,
          sandbox: bool = True) -> list[Submission]:
    """Grade every notebook under ``submissions``; write ``grades.csv`` and feedback under ``out``.

    ``jobs`` submissions run at the same time, each in its own process with its own limits and,
    unless ``sandbox=False``, in its own operating-system sandbox (:mod:`icl_course.grading.sandbox`);
    where none can be made, grading stops with the reason instead of running unprotected.
    """
    from tqdm.auto import tqdm

    submissions, out = Path(submissions).resolve(), Path(out).resolve()
    solutions = Path(solutions).resolve() if solutions else default_solutions()
    if not submissions.is_dir():
        raise ValueError(f"{submissions} is not a folder of submissions")
    if not solutions.is_dir() or not list(solutions.glob("*.ipynb")):
        raise ValueError(f"no solution notebooks in {solutions}: pass --solutions")
    for name, value in (("cell timeout", cell_timeout), ("notebook timeout", notebook_timeout),
                        ("memory limit", memory_gib), ("number of jobs", jobs)):
        if not value > 0:
            raise ValueError(f"the {name} must be positive, got {value}")
    if out == submissions or submissions in out.parents or out in submissions.parents:
        raise ValueError("--out must be outside the submissions folder (grading never writes there)")
    problem = sandbox_problem() if sandbox else None
    if problem:
        raise ValueError(f"no sandbox can be made here: {problem}. Grade on Linux with bubblewrap, or pass "
                         f"--no-sandbox to run the learners' code with your own rights ({NO_SANDBOX_COST})")
    if not sandbox and progress:
        print(f"warning: --no-sandbox: {NO_SANDBOX_COST}")
    probe = ControlGroup.create(f"icl-course-probe-{os.getpid()}", 2**30, MAX_PROCESSES)
    if probe is None and progress:
        print(f"warning: {ControlGroup.problem}, so each submission gets per-process limits only (address "
              f"space and file size), not one memory and process-count limit for all its processes together. "
              f"Run as root, or where systemd delegates the memory and pids controllers, to get them.")
    elif probe is not None:
        probe.close()
    # with one limit for all of a submission's processes, its files go to memory too (see _grade_one),
    # where there is room for every job's limit (a container's /dev/shm may hold only megabytes)
    stale = _remove_stale_scratch(memory_file_system())   # left by a grading run that was interrupted
    if stale and progress:
        print(f"removed {len(stale)} scratch folders that an interrupted grading run left in {stale[0].parent}")
    in_memory = memory_file_system() if sandbox and probe is not None else None
    if in_memory is not None and shutil.disk_usage(in_memory).free < memory_gib * 2**30 * max(1, int(jobs)):
        if progress:
            print(f"warning: {in_memory} has less room than {max(1, int(jobs))} x the memory limit, so the "
                  "course folders stay on disk, where only each file is capped at the memory limit")
        in_memory = None
    secret = _prepare(out)
    before = _hashes(submissions)

    template = out / "nbgrader" / "template"
    template.mkdir(parents=True)
    _write_config(template, cell_timeout)
    keys = _load_keys(solutions, template)
    untrusted = [f"{name} task {task.number}" for name, key in keys.items() for task in key.tasks.values()
                 if not task.checks]
    if untrusted and progress:
        print("warning: no trusted check records these tasks, so their points come from the student's "
              f"kernel: {', '.join(untrusted)}")

    found = find_submissions(submissions)
    _report_collisions(found)
    recognised = []
    for submission in found:
        if submission.status.startswith("skipped"):
            continue
        try:
            notebook, fixes = _read(_read_submission(submission.path))
        except (UnicodeDecodeError, json.JSONDecodeError) as error:
            submission.status = f"not a notebook ({type(error).__name__})"
            continue
        except OSError as error:
            submission.status = f"skipped: could not be read ({type(error).__name__})"
            continue
        except Exception as error:  # nbformat raises several types for malformed notebooks
            submission.status = f"malformed notebook ({type(error).__name__}: {str(error)[:80]})"
            continue
        submission.assignment = _recognise(notebook, keys)
        if submission.assignment is None:
            submission.status = "not recognised as any exercise of this course"
            continue
        fixes = sorted(set(fixes + _repair(notebook)))
        submission.status = "graded" + (f" ({'; '.join(fixes)})" if fixes else "")
        recognised.append((submission, notebook))

    runnable = _newest_per_student(recognised)
    packages = _stripped_packages(out, keys, {submission.assignment for submission, _ in runnable}) if sandbox else {}
    settings = dict(template=template, out=out, secret=secret, notebook_timeout=notebook_timeout,
                    memory_bytes=int(memory_gib * 2**30), hidden_tests_in_feedback=hidden_tests_in_feedback,
                    sandbox=sandbox, packages=packages, in_memory=in_memory)
    with _memory_cap(GRADER_MEMORY_BYTES), ThreadPoolExecutor(max_workers=max(1, int(jobs))) as pool:
        # each job waits on its own nbgrader process
        futures = [pool.submit(_grade_one_safely, submission, notebook, keys[submission.assignment], **settings)
                   for submission, notebook in runnable]
        for future in tqdm(as_completed(futures), total=len(futures), desc="grading", disable=not progress):
            future.result()

    _write_grades(out, found, keys)
    if _hashes(submissions) != before:
        raise RuntimeError("a submission file changed during grading; this is a bug, please report it")
    if progress:
        _print_summary(found)
    return found


def _stripped_packages(out: Path, keys: dict, assignments: set) -> dict:
    """For each assignment to grade, a copy of the package without its tasks' reference functions,
    which the sandbox mounts in place of the package (outside every course folder: read-only there)."""
    real = package_folder()
    packages = {}
    for assignment in sorted(assignments):
        checks = [CHECKS[name] for task in keys[assignment].tasks.values() for name in task.checks]
        packages[assignment] = strip_package(real, out / "nbgrader" / "packages" / assignment / "icl_course",
                                             withheld_names(checks, real))
    return packages


def _grade_one_safely(submission: Submission, notebook, key: AnswerKey, **settings) -> None:
    """:func:`_grade_one`, but a failure of this one submission is reported, never stops the batch."""
    try:
        _grade_one(submission, notebook, key, **settings)
    except Exception as error:
        submission.scores = {number: 0.0 for number in key.tasks}
        submission.status = f"could not be graded ({type(error).__name__}: {str(error)[:150]})"


def _grade_one(submission: Submission, notebook, key: AnswerKey, template: Path, out: Path, secret: str,
               notebook_timeout: float, memory_bytes: int, hidden_tests_in_feedback: bool,
               sandbox: bool = True, packages: Optional[dict] = None, in_memory: Optional[Path] = None) -> None:
    """Autograde one submission in a course folder of its own, then score it and write its feedback.

    With ``in_memory`` (a memory file system; only when a control group holds each submission) the
    course folder lives there while the learner's code runs, so that what it writes is charged to
    the submission's memory limit; afterwards only nbgrader's executed notebook and gradebook are
    copied to ``out`` (each is no larger than that limit), and the rest is dropped.
    """
    kept = out / "nbgrader" / "students" / submission.folder / submission.assignment
    scratch = Path(tempfile.mkdtemp(prefix=f"{SCRATCH_PREFIX}{os.getpid()}-", dir=in_memory)) if in_memory else None
    course = scratch / "course" if scratch else kept
    try:
        _grade_in(course, submission, notebook, key, template, out, secret, notebook_timeout, memory_bytes,
                  hidden_tests_in_feedback, sandbox, packages)
    finally:
        if scratch:
            relative = Path("autograded") / submission.folder / submission.assignment / f"{submission.assignment}.ipynb"
            for part, limit in ((relative, MAX_EXECUTED_BYTES), (Path("gradebook.db"), MAX_GRADEBOOK_BYTES)):
                try:   # input like any other: no link followed, a regular file, size-capped
                    data = read_untrusted(course, part, limit)
                except (OSError, UnsafeFile):
                    continue
                (kept / part).parent.mkdir(parents=True, exist_ok=True)
                (kept / part).write_bytes(data)
            shutil.rmtree(scratch, ignore_errors=True)


def _grade_in(course: Path, submission: Submission, notebook, key: AnswerKey, template: Path, out: Path,
              secret: str, notebook_timeout: float, memory_bytes: int, hidden_tests_in_feedback: bool,
              sandbox: bool, packages: Optional[dict]) -> None:
    shutil.copytree(template, course)  # no kernel can reach another submission's gradebook or answer key
    target = course / "submitted" / submission.folder / submission.assignment / f"{submission.assignment}.ipynb"
    target.parent.mkdir(parents=True)
    nbformat.write(notebook, target)
    answers = course / "answers"
    seed = _seed(secret, submission.student, submission.assignment)
    submission.max_total = key.max_total
    names = [name for task in key.tasks.values() for name in task.checks]
    for _ in range(2):  # once more only if the kernel could not start (a port taken meanwhile)
        shutil.rmtree(answers, ignore_errors=True)
        answers.mkdir()
        protocol.write_cases(names, answers, seed)   # the kernel gets the inputs, never the seed
        problem, executed = _autograde(course, submission.assignment, submission.folder, notebook_timeout,
                                       memory_bytes, answers, sandbox, (packages or {}).get(submission.assignment))
        if "could not start" not in problem:
            break
    if problem:
        submission.status = problem
    submission.errors = _cells_that_raised(executed) if executed is not None else []
    _score(submission, key, answers, seed, course)
    submission.review = [f"task {number} uses {', '.join(names)}" for number, names in
                         _giveaways(notebook, key).items()]
    shutil.rmtree(answers, ignore_errors=True)
    # the executed notebook as read once, safely, after the sandbox; else the notebook as handed in
    _write_feedback(out / "feedback" / submission.folder / f"{submission.assignment}.html",
                    executed if executed is not None else notebook, submission, key, hidden_tests_in_feedback)


def _newest_per_student(recognised: list) -> list:
    """One notebook per student and assignment: the newest; the others are reported as superseded."""
    newest = {}
    for submission, notebook in recognised:
        slot = (submission.student, submission.assignment)
        if slot not in newest or _handed_in_at(submission.path) > _handed_in_at(newest[slot][0].path):
            newest[slot] = (submission, notebook)
    kept = {id(pair[0]) for pair in newest.values()}
    for submission, _ in recognised:
        if id(submission) not in kept:
            winner = newest[(submission.student, submission.assignment)][0]
            submission.status = f"not graded: {winner.path.name} is a newer submission of the same assignment"
            submission.assignment = None
    return [pair for pair in recognised if id(pair[0]) in kept]


def _score(submission: Submission, key: AnswerKey, answers: Path, seed: int, course: Path) -> None:
    """Points per task from the recorded outputs, verified here, outside the student's kernel."""
    verdicts = protocol.verify_recorded([name for task in key.tasks.values() for name in task.checks], answers, seed,
                                        root=course)
    kernel_scores = _kernel_scores(course, submission) if any(not task.checks for task in key.tasks.values()) else {}
    for number, task in sorted(key.tasks.items()):
        if task.checks:
            failures = [verdicts[name] for name in task.checks if verdicts[name]]
            submission.scores[number] = 0.0 if failures else task.points
            submission.comments[number] = "\n\n".join(failures) if failures else "All grading checks passed."
        else:
            submission.scores[number] = min(task.points, kernel_scores.get(number, 0.0))
            submission.comments[number] = "Scored by the checks in the notebook."
    # a link, FIFO or oversized file left in place of a record is the grader's concern too, not only the task's
    refused = [verdict.split(RECORD_REFUSED, 1)[1].strip() for verdict in verdicts.values()
               if RECORD_REFUSED in verdict]
    if refused:
        submission.status += f"; records not read: {'; '.join(refused)}"


# how protocol.verify_recorded words a record that read_untrusted refused
RECORD_REFUSED = "the recorded outputs were not read:"


def _kernel_scores(course: Path, submission: Submission) -> dict:
    """nbgrader's own scores (decided in the student's kernel), for tasks without a trusted check.

    The gradebook is input like any other file of the course folder: read without following links and
    size-capped, into a private copy that the database library then opens."""
    from nbgrader.api import Gradebook

    try:
        data = read_untrusted(course, "gradebook.db", MAX_GRADEBOOK_BYTES)
    except (OSError, UnsafeFile):
        return {}
    with tempfile.TemporaryDirectory(prefix="icl-course-gradebook-") as private:
        private_copy = Path(private) / "gradebook.db"
        private_copy.write_bytes(data)
        try:
            with Gradebook(f"sqlite:///{private_copy}") as gradebook:
                notebook = gradebook.find_submission_notebook(submission.assignment, submission.assignment,
                                                              submission.folder)
                return {int(re.findall(r"\d+", grade.name)[0]): float(grade.auto_score or 0)
                        for grade in notebook.grades if grade.name.endswith("_check")}
        except Exception:  # no entry (autograding did not finish) or not a gradebook: no points
            return {}


def _giveaways(notebook, key: AnswerKey) -> dict:
    used = {}
    for cell in notebook.cells:
        grade_id = _nbgrader_metadata(cell).get("grade_id", "")
        match = re.fullmatch(r"task(\d+)_answer", grade_id)
        if match and int(match.group(1)) in key.tasks:
            names = protocol.giveaways_used(cell.source, key.tasks[int(match.group(1))].giveaways)
            if names:
                used[int(match.group(1))] = names
    return used


def _write_feedback(target: Path, graded, submission: Submission, key: AnswerKey,
                    hidden_tests_in_feedback: bool) -> None:
    """nbgrader's feedback page, with the points decided by :func:`_score` and a comment per answer.

    Everything the learner controls (Markdown, outputs and their metadata, exception texts in the
    comments and the status) is shown, never run: see :mod:`icl_course.grading.safe_html`.
    """
    from nbconvert import HTMLExporter
    from nbconvert.preprocessors import CSSHTMLHeaderPreprocessor
    from nbgrader.preprocessors import ClearHiddenTests

    notebook = copy.deepcopy(graded)
    for cell in notebook.cells:
        metadata = _nbgrader_metadata(cell)
        metadata.pop("comment", None)   # only the grader's comments below are shown
        match = re.fullmatch(r"task(\d+)_(check|answer)", metadata.get("grade_id", ""))
        if not match or int(match.group(1)) not in key.tasks:
            continue
        number = int(match.group(1))
        if match.group(2) == "check":
            metadata.update(score=submission.scores.get(number, 0.0), points=key.tasks[number].points)
        else:
            # shown as preformatted text: it quotes the learner's exception messages
            metadata["comment"] = f"<pre>{html.escape(submission.comments.get(number, ''))}</pre>"
    if not submission.status.startswith("graded"):
        notebook.cells.insert(0, nbformat.v4.new_markdown_cell(f"**Grading note:** {html.escape(submission.status)}."))
    total = sum(submission.scores.values())
    resources = {"nbgrader": {"notebook": submission.assignment, "score": total, "max_score": key.max_total,
                              "late_penalty": 0}}
    if not hidden_tests_in_feedback:
        notebook, resources = ClearHiddenTests().preprocess(notebook, resources)
    clean_outputs(notebook)   # plain text and base64 images only, no output metadata
    base = Path(__import__("nbgrader").__file__).parent / "server_extensions" / "formgrader"
    exporter = HTMLExporter(template_name="feedback", extra_template_basedirs=[str(base / "templates")],
                            extra_template_paths=[str(base / "static" / "node_modules" / "bootstrap" / "dist" / "css")])
    exporter.register_preprocessor(CSSHTMLHeaderPreprocessor(), enabled=True)
    page, _ = exporter.from_notebook_node(notebook, resources=resources)
    # no script, frame, handler or foreign link survives, and a policy forbids them; MathJax renders the maths
    page = sanitise_page(page, scripts=_maths_scripts(), style=FEEDBACK_STYLE)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(page, encoding="utf-8")


# a readable task table (nbconvert's classic style gives tables neither borders nor padding)
FEEDBACK_STYLE = ("div.text_cell_render table, div.output_html table {border-collapse: collapse; margin: 0.5em 0}"
                  "div.text_cell_render th, div.text_cell_render td {border: 1px solid #ccc; padding: 0.3em 0.8em;"
                  " text-align: left; vertical-align: top}"
                  "div.text_cell_render th {background: #f3f3f3}"
                  ".panel-footer pre {white-space: pre-wrap; word-break: normal; overflow-wrap: anywhere}")
# MathJax 3 with SVG output (no font files) from the sphinx-mathjax-offline distribution, put inline in each
# feedback page so that the maths renders offline; without it the page shows the TeX source
MATHJAX_CONFIG = ("window.MathJax = {tex: {inlineMath: [['$', '$'], ['\\\\(', '\\\\)']], processEscapes: true},"
                  " svg: {fontCache: 'global'}, startup: {typeset: true}};")


@functools.lru_cache(maxsize=1)
def _maths_scripts() -> tuple:
    """The feedback pages' own scripts: MathJax's configuration and MathJax itself, or () where it is not installed."""
    import importlib.metadata
    try:
        distribution = importlib.metadata.distribution("sphinx-mathjax-offline")
        source = Path(distribution.locate_file("sphinx-mathjax-offline/static/mathjax/tex-svg.js")).read_text("utf-8")
    except (importlib.metadata.PackageNotFoundError, OSError, UnicodeDecodeError):
        return ()
    return (MATHJAX_CONFIG, source)


def spreadsheet_safe(text: str) -> str:
    """A CSV cell that no spreadsheet runs as a formula: a leading ``= + - @``, tab or return is quoted."""
    return "'" + text if text[:1] in ("=", "+", "-", "@", "\t", "\r") else text


def _write_grades(out: Path, found: list[Submission], keys: dict) -> None:
    numbers = sorted({number for key in keys.values() for number in key.tasks})
    with open(out / "grades.csv", "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["student", "assignment", *[f"task{number}" for number in numbers], "total", "max_total",
                         "status", "errors", "review", "file"])
        for submission in sorted(found, key=lambda s: (s.student, s.assignment or "", str(s.path))):
            row = [submission.scores.get(number, 0.0) for number in numbers]
            maximum = f"{keys[submission.assignment].max_total:g}" if submission.assignment else ""
            writer.writerow([spreadsheet_safe(submission.student), submission.assignment or "",
                             *[f"{v:g}" for v in row], f"{sum(row):g}", maximum,
                             spreadsheet_safe(submission.status), spreadsheet_safe("; ".join(submission.errors)),
                             spreadsheet_safe("; ".join(submission.review)),
                             spreadsheet_safe(submission.path.name)])


def _print_summary(found: list[Submission]) -> None:
    print(f"\n{len(found)} notebooks")
    failed_tasks = {}
    for submission in found:
        total = sum(submission.scores.values())
        maximum = f"{submission.max_total:g}" if submission.max_total is not None else "-"
        print(f"  {submission.student:16s} {submission.assignment or '-':45s} {total:5g} / {maximum:<4s} "
              f"{submission.status}"
              + (f"  [errors: {'; '.join(submission.errors)}]" if submission.errors else "")
              + (f"  [review: {'; '.join(submission.review)}]" if submission.review else ""))
        for number, comment in submission.comments.items():
            if submission.scores.get(number, 0.0) == 0.0:
                failed_tasks[(submission.assignment, number)] = failed_tasks.get((submission.assignment, number), 0) + 1
    for (assignment, number), count in sorted(failed_tasks.items(), key=lambda item: -item[1])[:5]:
        print(f"  most failed: {assignment} task {number}: {count} students")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="icl-course grade", description="Grade a class's exercise notebooks.")
    parser.add_argument("submissions", type=Path, help="folder of submitted notebooks (see the layouts in the docs)")
    parser.add_argument("--out", type=Path, required=True, help="folder for grades.csv and feedback/")
    parser.add_argument("--solutions", type=Path,
                        help="the folder of answer keys (default: solutions/ of the course's checkout)")
    parser.add_argument("--cell-timeout", type=float, default=60, help="seconds per cell (default 60)")
    parser.add_argument("--notebook-timeout", type=float, default=600, help="seconds per notebook (default 600)")
    parser.add_argument("--memory-limit", type=float, default=4.0, help="GiB per submission (default 4)")
    parser.add_argument("--jobs", type=int, default=DEFAULT_JOBS,
                        help=f"submissions graded at the same time (default {DEFAULT_JOBS}: the CPUs, at most 4)")
    parser.add_argument("--no-sandbox", action="store_true",
                        help="run the learners' code without the operating-system sandbox (not recommended)")
    parser.add_argument("--hidden-tests-in-feedback", action="store_true",
                        help="keep the hidden tests in the feedback HTML (by default they are removed)")
    arguments = parser.parse_args(argv)
    try:
        grade(arguments.submissions, arguments.out, arguments.solutions, arguments.cell_timeout,
              arguments.notebook_timeout, arguments.memory_limit,
              hidden_tests_in_feedback=arguments.hidden_tests_in_feedback, jobs=arguments.jobs,
              sandbox=not arguments.no_sandbox)
    except ValueError as error:
        parser.error(str(error))
    print(f"grades: {arguments.out / 'grades.csv'}; feedback: {arguments.out / 'feedback'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
