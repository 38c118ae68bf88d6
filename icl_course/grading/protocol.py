"""The check protocol's runtime: how a learner's function is verified, in the kernel and by the grader.

Every function a learner writes in ``exercises/`` has a :class:`~icl_course.grading.checking.Check`
(:mod:`icl_course.grading.checking`: what a check is, and the helpers its ``verify`` is built from).
Each chapter's checks are in its catalogue, :mod:`icl_course.grading.chapter1` and so on, and
:mod:`icl_course.grading.registry` collects them by name; this module runs them.  The exercise
notebooks reach it through :mod:`icl_course.checks`:

* ``checks.self_check("merged_form", merged_form)`` (visible): verifies the examples in the
  learner's own kernel, so that the learner sees at once what is wrong;
* ``checks.hint("merged_form")`` opens the task's next hint, and ``checks.progress(1)`` shows which
  of chapter 1's tasks passed their self-check in this kernel;
* ``checks.record("merged_form", merged_form)`` (in the hidden tests).  Under grading,
  :mod:`icl_course.grading.grade` puts ``ICL_COURSE_ANSWERS`` (a folder) in the kernel's environment,
  and ``record`` only calls the function on the inputs it finds there and saves the outputs beside
  them.  Elsewhere (the answer keys under nbval) it verifies them on the spot.

Under grading the kernel draws nothing: before the kernel starts, the grader draws every graded
check's inputs from a seed that only it knows and writes their argument values, plain tensors and
numbers, to ``cases/<name>.pt`` in that folder (:func:`write_cases`).  The kernel thus needs neither
the seed nor the case generators, some of which call the very reference functions that the sandbox
withholds from it (:mod:`icl_course.grading.stripped`); the self-checks of those checks print a note
instead of running.
The grader then, in its own process and after the kernel has exited, draws the same inputs from
the same seed, loads the outputs with ``torch.load(weights_only=True)`` (tensors, numbers and
tuples; no code runs) and calls :func:`verify_recorded`.  A learner's code can change anything in
its own kernel, this module's copy included, but not what the grader's process computes: points
depend only on whether the outputs have the graded properties.
"""

from __future__ import annotations

import ast
import copy
import io
import numbers
import os
import random
import re
import textwrap
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from ..hints import HINTS
from .checking import Check, CheckFailed, fail
from .registry import CHECKS

__all__ = ["SelfCheckFailed", "self_check", "record", "verify_recorded", "recorded_names", "giveaways_used", "hint",
           "progress", "Progress", "find", "registered", "portable", "write_cases", "ANSWERS_VARIABLE",
           "CASES_FOLDER"]

ANSWERS_VARIABLE = "ICL_COURSE_ANSWERS"
CASES_FOLDER = "cases"    # in the answers folder: the grading inputs that the grader wrote for the kernel
LOCAL_SEED = 0            # the grading inputs that the answer keys verify under nbval
MAX_RECORD_BYTES = 32 * 2**20


class SelfCheckFailed(AssertionError):
    """What a learner sees when a self-check fails: the message alone, without a traceback.

    IPython shows the lines of ``_render_traceback_`` instead of the traceback when an exception
    has that method; the frames inside this module would only hide the message.
    """

    def _render_traceback_(self) -> list[str]:
        # Lines wrapped here, at spaces: JupyterLab's output CSS (word-break: break-all) would otherwise
        # break a long line in the middle of a word ("d / ivides").
        lines = textwrap.wrap(f"Self-check failed: {self}", width=_WRAP, break_long_words=False,
                              break_on_hyphens=False)
        return [lines[0].replace("Self-check failed", "\x1b[1;31mSelf-check failed\x1b[0m", 1), *lines[1:]]


_WRAP = 72   # columns: fits the output area of a notebook in a window of 600 pixels and more


# -- the three places a check runs ------------------------------------------------------------

def registered() -> dict[str, Check]:
    """Every check of the course by name (:data:`icl_course.grading.registry.CHECKS`)."""
    return CHECKS


def find(name: str) -> Check:
    """The check called ``name``; a ``KeyError`` that lists the names when there is none."""
    checks = registered()
    if name not in checks:
        raise KeyError(f"no check named {name!r}; the checks are {sorted(checks)}")
    return checks[name]


def portable(value, depth: int = 0):
    """``value`` as plain tensors, numbers and tuples, which ``torch.load(weights_only=True)`` reads."""
    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu").as_subclass(torch.Tensor).clone()
    if isinstance(value, (bool, str)) or value is None:
        return value if not isinstance(value, str) else value[:200]
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        return float(value)
    if isinstance(value, (tuple, list)) and depth < 2 and len(value) <= 16:
        return tuple(portable(item, depth + 1) for item in value)
    if type(value).__module__ == "numpy" and hasattr(value, "shape"):
        return torch.as_tensor(value.copy())
    return f"<an object of type {type(value).__name__}>"


def self_check(name: str, function: Callable) -> None:
    """Verify ``function`` on the examples of the check ``name`` and on cases drawn with a local seed.

    Raises :class:`SelfCheckFailed` (an ``AssertionError``) saying what is wrong; prints
    ``name: passed`` otherwise.  The drawn cases come from a seed of their own, never from the
    grading seed, which only the instructor's grading run knows.
    """
    directory = os.environ.get(ANSWERS_VARIABLE)
    if directory and (Path(directory) / CASES_FOLDER / f"{name}.pt").exists():
        # the grader records and verifies this check itself, and the references that a self-check
        # compares with are withheld from this kernel: here it could only fail for the wrong reason.
        # (A check that the grader does not record still runs: nbgrader's score in the kernel counts.)
        print(f"{name}: self-check not run while your work is graded (the grader checks the recorded outputs)")
        return
    check = find(name)
    cases = check.examples() + check.draw(random.Random(f"{name}:self-check"))
    _OUTCOMES[name] = "failed: the function raised an error"   # until every case has passed
    for case in cases:
        output = portable(function(**copy.deepcopy(case.arguments)))
        try:
            check.verify(case, output)
        except CheckFailed as failure:
            _OUTCOMES[name] = f"failed: {str(failure).splitlines()[0][:160]}"
            stuck = f" (stuck? checks.hint({name!r}) opens a hint)" if name in HINTS else ""
            raise SelfCheckFailed(f"{name}: {failure}{stuck}") from None
    _OUTCOMES[name] = "passed"
    print(f"{name}: passed ({len(cases)} cases)")


# what the self-checks of this kernel found, and how many hints each task has opened
_OUTCOMES: dict[str, str] = {}
_HINTS_SHOWN: dict[str, int] = {}


def hint(name: str) -> None:
    """Print the next hint of the task ``name`` (the first call the first hint, and so on).

    The first hint points the way; the last one nearly gives the answer.  ``checks.hint(name)``
    after the last one shows them all again and says that there are no more.
    """
    find(name)
    hints = HINTS.get(name, ())
    if not hints:
        print(f"{name}: this task has no hints")
        return
    before = _HINTS_SHOWN.get(name, 0)
    shown = min(before + 1, len(hints))
    _HINTS_SHOWN[name] = shown
    for number in range(1, shown + 1):
        print(f"hint {number} of {len(hints)}: {hints[number - 1]}")
    if shown < len(hints):
        print(f"(call checks.hint({name!r}) again for the next)")
    elif before >= len(hints):
        print(f"(no more hints: all {len(hints)} are shown above. Compare your function with the last one "
              "line by line on the self-check's example, or ask your instructor.)")
    else:
        print("(that was the last hint for this task)")


@dataclass
class Progress:
    """A chapter's tasks and what their self-checks found in this kernel (a table in Jupyter)."""

    chapter: int
    rows: list  # (task, name, status, hints opened)

    @property
    def passed(self) -> int:
        """How many of the chapter's tasks passed their self-check in this kernel."""
        return sum(status == "passed" for _, _, status, _ in self.rows)

    def __str__(self) -> str:
        lines = [f"chapter {self.chapter}: {self.passed} of {len(self.rows)} tasks passed their self-check"]
        lines += [f"  task {task}  {name:28s} {status}" + (f"  ({hints} hints)" if hints else "")
                  for task, name, status, hints in self.rows]
        return "\n".join(lines)

    __repr__ = __str__

    def _repr_html_(self) -> str:
        from html import escape
        cells = "".join(
            f"<tr><td>{task}</td><td><code>{escape(name)}</code></td><td>{'&#10004; ' if status == 'passed' else ''}"
            f"{escape(status)}</td><td>{hints or ''}</td></tr>" for task, name, status, hints in self.rows)
        return (f"<p>Chapter {self.chapter}: {self.passed} of {len(self.rows)} tasks passed their self-check "
                f"in this kernel.</p><table><thead><tr><th>task</th><th>function</th><th>self-check</th>"
                f"<th>hints opened</th></tr></thead><tbody>{cells}</tbody></table>")


def progress(chapter: int) -> Progress:
    """The tasks of ``chapter`` with what their self-checks found in this kernel: passed, failed (and
    why, in a line), or not run yet.  Grading decides the points on its own; this is for the learner."""
    tasks = sorted((check.task, check.name) for check in registered().values() if check.chapter == chapter)
    if not tasks:
        chapters = sorted({check.chapter for check in registered().values()})
        raise ValueError(f"no graded tasks in chapter {chapter!r}; the chapters with tasks are {chapters}")
    return Progress(chapter, [(task, name, _OUTCOMES.get(name, "not run yet"), _HINTS_SHOWN.get(name, 0))
                              for task, name in tasks])


def record(name: str, function: Callable) -> None:
    """Hidden tests: save ``function``'s outputs for grading, or verify them outside grading (see module doc)."""
    directory = os.environ.get(ANSWERS_VARIABLE)
    if not directory:
        check = find(name)
        for case in check.grading_cases(LOCAL_SEED):
            check.verify(case, portable(function(**copy.deepcopy(case.arguments))))
        return
    entries = []
    for arguments in _load_cases(Path(directory), name):
        try:
            entries.append(("output", portable(function(**copy.deepcopy(arguments)))))
        except Exception as error:  # the grader reports it; the other cases still count as failed
            entries.append(("error", f"{type(error).__name__}: {error}"[:300]))
    torch.save(entries, Path(directory) / f"{name}.pt")


def _plain(value) -> bool:
    """Whether ``torch.load(weights_only=True)`` gives ``value`` back as it is: tensors, numbers, strings
    and tuples, lists and dicts of them."""
    if isinstance(value, (tuple, list)):
        return all(_plain(item) for item in value)
    if isinstance(value, dict):
        return all(isinstance(key, str) and _plain(item) for key, item in value.items())
    return value is None or isinstance(value, (torch.Tensor, bool, int, float, str))


def write_cases(names: list[str], directory: Path, seed: int) -> None:
    """The grader's side of :func:`record`: the argument values of every grading case of the checks
    ``names``, drawn from ``seed``, saved as ``directory/cases/<name>.pt`` for the learner's kernel.

    Only the arguments are written, never a case's ``context`` (what ``verify`` needs besides) nor the
    seed: the kernel learns nothing it could not see in the arguments its function receives.
    """
    folder = Path(directory) / CASES_FOLDER
    folder.mkdir(parents=True, exist_ok=True)
    for name in names:
        arguments = [case.arguments for case in find(name).grading_cases(seed)]
        if not _plain(arguments):  # a catalogue bug: the kernel could not load the file safely
            raise TypeError(f"the grading cases of {name!r} have arguments that are not plain tensors and numbers")
        torch.save(arguments, folder / f"{name}.pt")


def _load_cases(directory: Path, name: str) -> list[dict]:
    """The arguments that :func:`write_cases` saved for ``name`` (plain values: nothing in the file runs)."""
    path = directory / CASES_FOLDER / f"{name}.pt"
    if not path.exists():
        raise FileNotFoundError(f"no grading inputs for {name!r} in {path.parent}: the grader writes them "
                                "before the notebook runs")
    return torch.load(path, map_location="cpu", weights_only=True)


def _load_record(root: Path, relative: Path) -> list:
    """The entries that :func:`record` saved at ``root/relative``, read as untrusted input
    (:func:`icl_course.grading.untrusted.read_untrusted`: no link followed, a regular file, size-capped)."""
    from .untrusted import UnsafeFile, read_untrusted
    try:
        data = read_untrusted(root, relative, MAX_RECORD_BYTES)
    except FileNotFoundError:
        fail("no outputs were recorded (the grading cell did not run: did the notebook stop early?)")
    except UnsafeFile as problem:
        fail(f"the recorded outputs were not read: {problem}")
    buffer = io.BytesIO(data)
    if zipfile.is_zipfile(buffer):  # torch.save writes an uncompressed zip: anything else may be a zip bomb
        with zipfile.ZipFile(buffer) as archive:
            entries = archive.infolist()
        unpacked = sum(entry.file_size for entry in entries)
        if unpacked > MAX_RECORD_BYTES or any(entry.compress_type != zipfile.ZIP_STORED for entry in entries):
            fail(f"the recorded outputs would unpack to {unpacked / 2**20:.0f} MiB or are compressed, "
                  "which checks.record never writes")
    buffer.seek(0)
    try:
        entries = torch.load(buffer, map_location="cpu", weights_only=True)
    except Exception as error:  # anything but plain tensors and numbers is refused, never executed
        fail(f"the recorded outputs could not be read safely ({type(error).__name__})")
    if not isinstance(entries, (list, tuple)) or not all(
            isinstance(entry, tuple) and len(entry) == 2 and entry[0] in ("output", "error") for entry in entries):
        fail("the recorded outputs are not in the format that checks.record writes")
    return list(entries)


def verify_recorded(names: list[str], directory: Path, seed: int, root: Path | None = None) -> dict[str, str]:
    """Verify the outputs that :func:`record` saved in ``directory`` for every check in ``names``.

    Runs in the grader's process.  Returns ``{name: ""}`` for a check that passed on every case,
    otherwise ``{name: what went wrong}``; nothing the recorded file holds is ever executed.  The files
    are read from ``root`` (the course folder, by default ``directory`` itself) without following a link
    on any part of the path below it: a link, FIFO or oversized file fails its check, and says so.
    """
    root = Path(root) if root is not None else Path(directory)
    relative = Path(directory).relative_to(root)
    verdicts = {}
    for name in names:
        check = find(name)
        try:
            entries = _load_record(root, relative / f"{name}.pt")
            cases = check.grading_cases(seed)
            if len(entries) != len(cases):
                fail(f"{len(entries)} outputs were recorded for {len(cases)} grading inputs")
            for case, (kind, value) in zip(cases, entries):
                if kind == "error":
                    fail(f"{name}({case.label}) raised {value}")
                try:
                    check.verify(case, value)
                except CheckFailed:
                    raise
                except Exception as error:  # an output of an unexpected type or shape
                    fail(f"the output for {case.label} could not be checked ({type(error).__name__}: {error})")
            verdicts[name] = ""
        except CheckFailed as failure:
            verdicts[name] = f"{name}: {failure}"
    return verdicts


_RECORD_CALL = re.compile(r"""checks\.record\(\s*["'](\w+)["']""")


def recorded_names(source: str) -> list[str]:
    """The check names that a hidden-test cell's ``checks.record("name", ...)`` calls grade."""
    return _RECORD_CALL.findall(source)


def giveaways_used(source: str, names: tuple) -> list[str]:
    """Which of ``names`` (package reference functions) an answer cell's code mentions.

    Looks at every identifier, attribute and imported name, leaving out the functions the cell
    defines itself.  A heuristic for the instructor, not a proof: code can always hide a name.
    """
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return sorted(name for name in names if re.search(rf"\b{re.escape(name)}\b", source))
    seen, defined = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            seen.add(node.id)
        elif isinstance(node, ast.Attribute):
            seen.add(node.attr)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                seen.update(alias.name.split("."))
            seen.update((getattr(node, "module", None) or "").split("."))
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            defined.add(node.name)
    return sorted((seen - defined) & set(names))
