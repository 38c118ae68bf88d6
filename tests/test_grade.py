"""End to end: grade a small class that the test makes itself, with nbgrader underneath."""

import copy
import csv
import hashlib
import html
import json
import os
import re
import shutil
import time
import zipfile
from pathlib import Path

import nbformat
import pytest
from conftest import ROOT

from icl_course.__main__ import main as command
from icl_course.grading.grade import MAX_PROCESSES, find_submissions, grade
from icl_course.grading.sandbox import ControlGroup, sandbox_problem

# Every grading run here is sandboxed where the machine can make a sandbox (CI installs bubblewrap);
# elsewhere the tests grade without it, and the sandbox's own tests say what is missing.
SANDBOX_PROBLEM = sandbox_problem()
SANDBOX = SANDBOX_PROBLEM is None

CHAPTER = "01_linear_attention_is_gradient_descent"
CHAPTER_2 = "02_one_step_of_gd_is_optimal"
CHAPTER_3 = "03_gdpp_is_a_second_order_method"
FULL = 14.0


def answered(exercise, solution, tasks):
    """The exercise with the solution's answers to ``tasks`` filled in."""
    notebook = nbformat.from_dict(exercise)
    answers = {cell.metadata["nbgrader"]["grade_id"]: cell.source for cell in solution.cells
               if cell.metadata.get("nbgrader", {}).get("solution")}
    for cell in notebook.cells:
        grade_id = cell.metadata.get("nbgrader", {}).get("grade_id", "")
        if grade_id in answers and int(grade_id[4:].split("_")[0]) in tasks:
            cell.source = "\n".join(line for line in answers[grade_id].splitlines()
                                    if "### BEGIN SOLUTION" not in line and "### END SOLUTION" not in line)
    return notebook


def find_cell(notebook, grade_id):
    return next(cell for cell in notebook.cells if cell.metadata.get("nbgrader", {}).get("grade_id") == grade_id)


def with_answer(notebook, task, source):
    """``notebook`` with the answer cell of ``task`` replaced by ``source``."""
    notebook = nbformat.from_dict(copy.deepcopy(notebook))
    find_cell(notebook, f"task{task}_answer").source = source
    return notebook


# Attacks from an answer cell, each on top of an otherwise honest notebook (see the threat model in
# icl_course/grading/grade.py).  The attacked tasks have wrong answers; each attack would make the checks that
# run in the student's kernel pass or vanish, so only a verdict taken outside the kernel catches it.
WRONG_LAYER = "def linear_attention(tokens, P, Q):\n    return tokens\n"
WRONG_STEP = "def best_step_size(d, n, num_tasks=20_000, seed=0):\n    return 0.5\n"
REDEFINE_HELPERS = WRONG_LAYER + (
    "checks.self_check = lambda name, function: print(name + ': passed')\n"
    "checks.record = lambda name, function: None\n")
PATCH_COMPARISONS = WRONG_LAYER + (
    "import numpy\n"
    "always = lambda *args, **kwargs: True\n"
    "torch.allclose = torch.equal = numpy.allclose = numpy.isclose = always\n"
    "torch.Tensor.__le__ = torch.Tensor.__lt__ = torch.Tensor.__ge__ = lambda *args: torch.tensor(True)\n"
    "import icl_course.grading.chapter1 as catalogue\n"
    "catalogue.close = checks.close = always\n")
PATCH_BUILTINS = WRONG_STEP + (
    "import builtins\n"
    "builtins.abs = lambda value: 0.0\n"
    "builtins.AssertionError = type('Quiet', (Exception,), {})\n")
HOOK_EXCEPTIONS = (
    "ip = get_ipython()\n"
    "ip.set_custom_exc((BaseException,), lambda shell, kind, value, traceback, tb_offset=None: print('passed'))\n"
    "ip.showtraceback = lambda *args, **kwargs: None\n"
    "def merged_form(W_K, W_Q, W_V, W_P):\n    raise NotImplementedError()\n"
    "raise RuntimeError('shown as passed by the hook')\n")
EXIT_KERNEL = "import os\nos._exit(0)\n"
FAKE_PRINTS = "print('\\n'.join(f'task {k}: passed' for k in range(1, 6)))\n" + WRONG_LAYER
FLOOD = "for line in range(20_000):\n    print('line', line)\n"
FORGE_RECORDS = (
    "import os, torch\n"
    "class Payload:\n"
    "    def __reduce__(self):\n"
    "        return os.system, ('touch {marker}',)\n"
    "folder = os.environ.get('ICL_COURSE_ANSWERS', '.')\n"
    "torch.save([('output', Payload())], os.path.join(folder, 'merged_form.pt'))\n"
    "torch.save([('output', torch.zeros(1))] * 6, os.path.join(folder, 'linear_attention.pt'))\n"
    "def gd_matrices(d, n, eta):\n    raise NotImplementedError()\n")
# Attacks on the grader itself, which only the operating-system sandbox stops (handed in only where
# one can be made: without it, the SIGSTOP loop would freeze the grader).  Task 2's answer is wrong
# unless an answer key or a classmate's notebook can be read; then their answers are run instead.
ESCAPE = (
    WRONG_LAYER
    + "import glob, json, os, pathlib, subprocess, sys\n"
    "found = []\n"
    "for pattern in ['{keys}/*.ipynb', '{repository}/solutions/*.ipynb', '../../../source/*/*.ipynb',\n"
    "                '{out}/nbgrader/students/*/*/autograded/*/*/*.ipynb',\n"
    "                '{out}/nbgrader/students/*/*/submitted/*/*/*.ipynb']:\n"
    "    found += glob.glob(pattern)\n"
    "for path in found:\n"
    "    for cell in json.load(open(path))['cells']:\n"
    "        source = ''.join(cell['source'])\n"
    "        if 'def linear_attention' in source and 'return tokens\\n' not in source:\n"
    "            try:\n"
    "                exec(source, globals())\n"
    "            except Exception:\n"
    "                pass\n"
    "subprocess.Popen([sys.executable, '-c', 'import time, pathlib; time.sleep(8); '\n"
    "                  'pathlib.Path(\"{out}/grades.csv\").write_text(\"sybil,hacked\"); '\n"
    "                  'pathlib.Path(\"{late}\").write_text(\"outlived grading\")'], start_new_session=True)\n"
    "for target in ('{package}/checks.py', '{out}/.icl-course-grading'):\n"
    "    try:\n"
    "        open(target, 'a').write('# sybil was here')\n"
    "    except OSError:\n"
    "        pass\n"
    "open('/tmp/sybil-was-here', 'w').write('x')\n"
    "for pid in [int(name) for name in os.listdir('/proc') if name.isdigit()]:\n"
    "    if pid not in (os.getpid(), os.getppid(), 1):\n"
    "        try:\n"
    "            os.kill(pid, 19)\n"
    "        except OSError:\n"
    "            pass\n")
GIVEAWAYS = {2: "from icl_course.models import LinearSelfAttention\n"
                "def linear_attention(tokens, P, Q):\n    return LinearSelfAttention.from_matrices(P, Q)(tokens)\n",
             3: "from icl_course import gd_construction\n"
                "def gd_matrices(d, n, eta):\n"
                "    return tuple(m[0].detach() for m in gd_construction(d, n, eta).layers[0].head_matrices())\n"}


@pytest.fixture(scope="module")
def graded_class(tmp_path_factory):
    root = tmp_path_factory.mktemp("class")
    solutions = root / "solutions"
    solutions.mkdir()
    for name in (CHAPTER, CHAPTER_2, CHAPTER_3):
        shutil.copy(ROOT / "solutions" / f"{name}.ipynb", solutions)
    solution = nbformat.read(solutions / f"{CHAPTER}.ipynb", as_version=4)
    exercise = nbformat.read(ROOT / "exercises" / f"{CHAPTER}.ipynb", as_version=4)
    full = answered(exercise, solution, range(1, 6))
    submitted = root / "submissions"

    def hand_in(relative, notebook=None, text=None):
        path = submitted / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        # json, not nbformat.write, which would repair the defects this class is made of
        path.write_text(text if text is not None else json.dumps(notebook, indent=1))
        return path

    hand_in(f"submitted/alice/{CHAPTER}/{CHAPTER}.ipynb", full)
    for later in (CHAPTER_2, CHAPTER_3):
        hand_in(f"submitted/alice/{later}/{later}.ipynb",
                answered(nbformat.read(ROOT / "exercises" / f"{later}.ipynb", as_version=4),
                         nbformat.read(solutions / f"{later}.ipynb", as_version=4), range(1, 6)))
    hand_in(f"submitted/bob/{CHAPTER}/{CHAPTER}.ipynb", exercise)
    hand_in(f"submitted/carol/{CHAPTER}/{CHAPTER}.ipynb", answered(exercise, solution, [1]))
    hand_in("template_01.ipynb", answered(exercise, solution, [1]))  # a student whose name is a folder of ours
    hand_in(f"submitted/dave/{CHAPTER}/{CHAPTER}.ipynb", text="{ this is not json")
    # a Canvas download, with a split cell's duplicate id, another kernel name and megabytes of outputs
    erin = nbformat.from_dict(copy.deepcopy(full))
    erin.cells[3].id = erin.cells[2].id
    erin.metadata["kernelspec"] = {"name": "python3-custom", "display_name": "Custom", "language": "python"}
    erin.cells[2].outputs = [nbformat.v4.new_output("stream", name="stdout", text="x" * 3_000_000)]
    hand_in("erin_LATE_12345_67890_exercise_01.ipynb", erin)
    # tampering with a locked check: it is restored from the source
    frank = nbformat.from_dict(copy.deepcopy(exercise))
    find_cell(frank, "task1_check").source = "print('task 1: passed')"
    hand_in(f"submitted/frank/{CHAPTER}/{CHAPTER}.ipynb", frank)
    # a deleted check cell is added back
    grace = nbformat.from_dict(copy.deepcopy(full))
    grace.cells.remove(find_cell(grace, "task2_check"))
    hand_in(f"submitted/grace/{CHAPTER}/{CHAPTER}.ipynb", grace)
    # an answer that never returns loses only its own task
    hand_in(f"submitted/henry/{CHAPTER}/{CHAPTER}.ipynb",
            with_answer(full, 5, "def best_step_size(d, n, num_tasks=20_000, seed=0):\n    while True:\n        pass"))
    # a cell that raises after the function is defined: full points, and grades.csv names the cell
    hand_in(f"submitted/nora/{CHAPTER}/{CHAPTER}.ipynb",
            with_answer(full, 1, find_cell(full, "task1_answer").source + "\nprint(undefined_name)\n"))
    hand_in("ivan_homework.ipynb", nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("print(1)")]))
    # the attacks
    hand_in(f"submitted/mallory/{CHAPTER}/{CHAPTER}.ipynb", with_answer(full, 2, REDEFINE_HELPERS))
    hand_in(f"submitted/oscar/{CHAPTER}/{CHAPTER}.ipynb", with_answer(full, 2, PATCH_COMPARISONS))
    hand_in(f"submitted/peggy/{CHAPTER}/{CHAPTER}.ipynb", with_answer(full, 5, PATCH_BUILTINS))
    hand_in(f"submitted/trent/{CHAPTER}/{CHAPTER}.ipynb", with_answer(exercise, 1, HOOK_EXCEPTIONS))
    hand_in(f"submitted/victor/{CHAPTER}/{CHAPTER}.ipynb", with_answer(full, 3, EXIT_KERNEL))
    hand_in(f"submitted/walter/{CHAPTER}/{CHAPTER}.ipynb", with_answer(full, 2, FAKE_PRINTS))
    hand_in(f"submitted/xavier/{CHAPTER}/{CHAPTER}.ipynb", with_answer(full, 1, full.cells[
        [cell.metadata.get("nbgrader", {}).get("grade_id") for cell in full.cells].index("task1_answer")].source
        + "\n" + FLOOD))
    # more memory than the limit: MemoryError in that cell, not a machine out of memory
    hand_in(f"submitted/zoe/{CHAPTER}/{CHAPTER}.ipynb",
            with_answer(full, 5, "blob = bytearray(6 * 2**30)\n" + WRONG_STEP))
    marker = root / "payload-ran"
    hand_in(f"submitted/yvonne/{CHAPTER}/{CHAPTER}.ipynb",
            with_answer(full, 3, FORGE_RECORDS.replace("{marker}", str(marker))))
    if SANDBOX:
        import icl_course
        escape = ESCAPE.format(keys=solutions, repository=ROOT, out=root / "out", late=root / "outlived",
                               package=Path(icl_course.__file__).parent)
        hand_in(f"submitted/sybil/{CHAPTER}/{CHAPTER}.ipynb", with_answer(full, 2, escape))
    judy = full
    for task, source in GIVEAWAYS.items():
        judy = with_answer(judy, task, source)
    hand_in(f"submitted/judy/{CHAPTER}/{CHAPTER}.ipynb", judy)
    # two notebooks of one assignment: the newer is graded
    old = hand_in("kevin_first_try.ipynb", full)
    new = hand_in("kevin_second_try.ipynb", exercise)
    os.utime(old, (2_000_000_000, 2_000_000_000))
    os.utime(new, (1_000_000_000, 1_000_000_000))

    before = {path: hashlib.sha256(path.read_bytes()).hexdigest() for path in submitted.rglob("*") if path.is_file()}
    package_before = _package_hashes()
    out = root / "out"
    grade(submitted, out, solutions=solutions, cell_timeout=10, notebook_timeout=300, progress=False, jobs=2,
          sandbox=SANDBOX)
    after = {path: hashlib.sha256(path.read_bytes()).hexdigest() for path in submitted.rglob("*") if path.is_file()}
    with open(out / "grades.csv") as handle:
        rows = list(csv.DictReader(handle))
    by_student = {row["student"]: row for row in rows if row["assignment"] == CHAPTER}
    graded = Class(root, out, by_student, rows, before, after, marker)
    graded.package_before, graded.finished = package_before, time.monotonic()
    return graded


def _package_hashes():
    import icl_course
    folder = Path(icl_course.__file__).parent
    return {path: hashlib.sha256(path.read_bytes()).hexdigest() for path in sorted(folder.rglob("*.py"))}


class Class:
    def __init__(self, root, out, rows, all_rows, before, after, marker):
        self.root, self.out, self.rows, self.all_rows = root, out, rows, all_rows
        self.before, self.after, self.marker = before, after, marker

    def total(self, student):
        return float(self.rows[student]["total"])

    def task(self, student, number):
        return float(self.rows[student][f"task{number}"])

    def autograded(self, student):
        """The notebook as nbgrader executed it in the student's kernel."""
        course = self.out / "nbgrader" / "students" / student / CHAPTER
        return course / "autograded" / student / CHAPTER / f"{CHAPTER}.ipynb"

    def kernel_score(self, student):
        """What nbgrader itself decided inside the student's kernel (not used for points)."""
        from nbgrader.api import Gradebook
        course = self.out / "nbgrader" / "students" / student / CHAPTER
        with Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gradebook:
            return gradebook.find_submission_notebook(CHAPTER, CHAPTER, student).score


def test_full_zero_and_partial_marks(graded_class):
    rows = graded_class.rows
    assert graded_class.total("alice") == FULL and float(rows["alice"]["max_total"]) == FULL
    assert graded_class.total("bob") == 0 and rows["bob"]["status"] == "graded"
    assert graded_class.total("carol") == 2 and graded_class.task("carol", 1) == 2
    assert graded_class.total("template") == 2
    later = [(row["student"], row["assignment"], float(row["total"]), float(row["max_total"]))
             for row in graded_class.all_rows if row["assignment"] in (CHAPTER_2, CHAPTER_3)]
    assert later == [("alice", CHAPTER_2, 13, 13), ("alice", CHAPTER_3, 10, 10)]


def test_layouts_and_repairs(graded_class):
    rows = graded_class.rows
    assert graded_class.total("erin") == FULL  # student taken from the Canvas file name
    for repair in ("duplicate cell ids", "kernel", "MB of stored outputs removed"):
        assert repair in rows["erin"]["status"]
    assert rows["erin"]["assignment"] == CHAPTER  # recognised from the notebook, not its name


def test_tampering_and_deleted_checks(graded_class):
    assert graded_class.task("frank", 1) == 0 and graded_class.total("frank") == 0
    assert graded_class.total("grace") == FULL


def test_a_hanging_answer_loses_only_its_task(graded_class):
    assert graded_class.task("henry", 5) == 0 and graded_class.total("henry") == FULL - 3
    assert "cell time limit" in graded_class.rows["henry"]["status"]


def test_cells_that_raised_or_timed_out_are_named_beside_the_points(graded_class):
    """nora's task 1 answer defines its function, then raises NameError: full points, and the errors column
    names the cell; henry's task 5 function never returns, so the cell that calls it runs past the cell time
    limit (nbgrader interrupts it: KeyboardInterrupt, then its own CellTimeoutError)."""
    assert graded_class.total("nora") == FULL and graded_class.rows["nora"]["errors"] == "task1_answer: NameError"
    assert re.fullmatch(r"task5_check: (KeyboardInterrupt, )?CellTimeoutError", graded_class.rows["henry"]["errors"])
    assert graded_class.rows["alice"]["errors"] == ""
    assert all(row["errors"] == "" for row in graded_class.all_rows
               if row["student"] == "alice")   # the later chapters run cleanly too


def test_malformed_files_get_zero_and_a_reason(graded_class):
    rows = {row["file"]: row for row in graded_class.all_rows}
    assert rows[f"{CHAPTER}.ipynb"] and graded_class.rows.get("dave") is None
    dave = next(row for row in graded_class.all_rows if row["student"] == "dave")
    assert dave["status"].startswith("not a notebook") and float(dave["total"]) == 0
    assert rows["ivan_homework.ipynb"]["status"] == "not recognised as any exercise of this course"


def test_redefined_check_helpers_get_no_points(graded_class):
    # from task 2 on nothing is recorded: the redefined helpers dodge every later check, and lose it
    assert [graded_class.task("mallory", k) for k in range(1, 6)] == [2, 0, 0, 0, 0]
    # nbgrader's own score in the kernel, never used: under grading the recorded checks' self-checks only
    # print a note, so it says full marks whatever the answers are
    assert graded_class.kernel_score("mallory") == FULL


# a wrong linear_attention also costs task 4, which applies it layer after layer
@pytest.mark.parametrize("student, points", [("oscar", [2, 0, 3, 0, 3]), ("peggy", [2, 3, 3, 3, 0])])
def test_patched_comparisons_and_builtins_get_no_points(graded_class, student, points):
    assert [graded_class.task(student, k) for k in range(1, 6)] == points
    assert graded_class.kernel_score(student) == FULL  # never used (see above)


def test_hooked_exception_display_gets_no_points(graded_class):
    assert graded_class.total("trent") == 0
    graded = graded_class.autograded("trent")
    answer = find_cell(nbformat.read(graded, as_version=4), "task1_answer")
    assert answer.outputs[0]["text"] == "passed\n"  # the hook was installed and ran in the kernel


def test_an_exited_kernel_keeps_only_what_was_recorded_before(graded_class):
    assert [graded_class.task("victor", k) for k in range(1, 6)] == [2, 3, 0, 0, 0]
    assert graded_class.rows["victor"]["status"].startswith("the kernel stopped during execution")


def test_fake_passed_lines_get_no_points(graded_class):
    assert [graded_class.task("walter", k) for k in range(1, 6)] == [2, 0, 3, 0, 3]


def test_huge_printed_output_is_truncated_not_fatal(graded_class):
    assert graded_class.total("xavier") == FULL
    graded = graded_class.autograded("xavier")
    answer = find_cell(nbformat.read(graded, as_version=4), "task1_answer")
    text = "".join(output.get("text", "") for output in answer.outputs)
    assert text.count("\n") <= 1001 and "Output truncated" in text


def test_the_memory_limit_stops_only_the_cell_that_exceeds_it(graded_class):
    assert graded_class.task("zoe", 5) == 0 and graded_class.total("zoe") == FULL - 3
    answer = find_cell(nbformat.read(graded_class.autograded("zoe"), as_version=4), "task5_answer")
    assert [output.get("ename") for output in answer.outputs] == ["MemoryError"]


@pytest.mark.slow
def test_the_notebook_time_limit_stops_a_slow_submission(tmp_path):
    solutions = tmp_path / "solutions"
    solutions.mkdir()
    shutil.copy(ROOT / "solutions" / f"{CHAPTER}.ipynb", solutions)
    exercise = nbformat.read(ROOT / "exercises" / f"{CHAPTER}.ipynb", as_version=4)
    slow = with_answer(exercise, 1, "import time\ntime.sleep(120)\n")
    (tmp_path / "class").mkdir()
    (tmp_path / "class" / "sam_01.ipynb").write_text(json.dumps(slow))
    found = grade(tmp_path / "class", tmp_path / "out", solutions=solutions, notebook_timeout=15, progress=False,
                  sandbox=SANDBOX)
    assert found[0].status == "stopped after the notebook time limit (15 s)" and sum(found[0].scores.values()) == 0
    assert (tmp_path / "out" / "feedback" / "sam" / f"{CHAPTER}.html").exists()


MEMORY_HOGS = """import subprocess, sys
hog = "import time; block = bytearray(int(1.2 * 2**30)); time.sleep(3)"
children = [subprocess.Popen([sys.executable, "-c", hog]) for _ in range(3)]
print("memory children:", sorted(child.wait() for child in children))
"""
PROCESS_HOGS = """import subprocess
sleepers = []
try:
    for _ in range(700):
        sleepers.append(subprocess.Popen(["sleep", "30"]))
except OSError as error:
    print("processes started:", len(sleepers), type(error).__name__)
for process in sleepers:
    process.kill()
"""


def grade_attacks(tmp_path, attacks: dict, progress: bool = False) -> dict:
    """Full answers with each student's attack code run first in one task's answer cell (``attacks``:
    student -> (task, code)), graded in the sandbox with a 3 GiB limit; skipped without a control group."""
    probe = ControlGroup.create(f"icl-course-test-{os.getpid()}", 2**30, 16)
    if probe is None:
        pytest.skip(f"no control group can be made here: {ControlGroup.problem}")
    probe.close()
    solutions = tmp_path / "solutions"
    solutions.mkdir()
    shutil.copy(ROOT / "solutions" / f"{CHAPTER}.ipynb", solutions)
    exercise = nbformat.read(ROOT / "exercises" / f"{CHAPTER}.ipynb", as_version=4)
    full = answered(exercise, nbformat.read(solutions / f"{CHAPTER}.ipynb", as_version=4), range(1, 6))
    (tmp_path / "class").mkdir()
    for name, (task, attack) in attacks.items():
        notebook = with_answer(full, task, attack + find_cell(full, f"task{task}_answer").source)
        (tmp_path / "class" / f"{name}_01.ipynb").write_text(json.dumps(notebook))
    return {submission.student: submission for submission in
            grade(tmp_path / "class", tmp_path / "out", solutions=solutions, memory_gib=3, progress=progress,
                  sandbox=True)}


@pytest.mark.slow
@pytest.mark.skipif(not SANDBOX, reason=f"no sandbox here: {SANDBOX_PROBLEM}")
def test_one_memory_and_one_process_limit_hold_for_the_whole_submission(tmp_path):
    """una's three children of 1.2 GiB each stay under the per-process limit (3 GiB) but not under the
    submission's; vera's 700 processes are more than a submission may start (MAX_PROCESSES)."""
    found = grade_attacks(tmp_path, {"una": (5, MEMORY_HOGS), "vera": (1, PROCESS_HOGS)})

    def printed(student, task):
        course = tmp_path / "out" / "nbgrader" / "students" / student / CHAPTER
        path = course / "autograded" / student / CHAPTER / f"{CHAPTER}.ipynb"
        notebook = nbformat.read(path, as_version=4)
        return "".join(output.get("text", "") for output in find_cell(notebook, f"task{task}_answer").outputs)

    una = found["una"]
    if "memory limit" in una.status:   # the out-of-memory killer chose the kernel: the run stops, and says why
        assert una.status.startswith("the submission reached its memory limit (3 GiB for all its processes")
        assert una.scores == {1: 2.0, 2: 3.0, 3: 3.0, 4: 3.0, 5: 0.0}    # the tasks recorded before it still count
    else:                              # ... or it chose a child, and the kernel went on
        killed = re.search(r"memory children: \[(.*)\]", printed("una", 5)).group(1).split(", ")
        assert "-9" in killed and sum(una.scores.values()) == FULL
    vera = found["vera"]
    if "processes" in vera.status:     # the kernel could not start a thread it needed: the run stops, and says why
        assert vera.status.startswith(f"the submission reached its limit of {MAX_PROCESSES} processes")
    else:                              # ... or only the sleepers were refused
        started = int(re.search(r"processes started: (\d+)", printed("vera", 1)).group(1))
        assert started < MAX_PROCESSES and sum(vera.scores.values()) == FULL


FILLER = """import os
folder = {folder!r}
written = 0
try:
    for index in range(8):      # 8 files of 1 GiB: each under the per-file cap, together over the limit
        with open(os.path.join(folder, f"filler-{{index}}.bin"), "wb") as handle:
            for _ in range(1024):
                handle.write(bytes(2**20))
        written += 1
except OSError as error:
    print("filler stopped:", type(error).__name__)
print("GiB written:", written)
"""


@pytest.mark.slow
@pytest.mark.skipif(not SANDBOX, reason=f"no sandbox here: {SANDBOX_PROBLEM}")
def test_files_a_submission_writes_count_against_its_one_memory_limit(tmp_path):
    """wanda fills her course folder (the kernel's working folder), xena the sandbox's /tmp: 8 GiB each
    against a 3 GiB limit.  Both are stopped at the limit, nothing of it reaches the disk or stays in
    memory afterwards, and the tasks recorded before count."""
    before = {path.name for path in Path("/dev/shm").glob("icl-course-*")}
    found = grade_attacks(tmp_path, {"wanda": (5, FILLER.format(folder=".")),
                                     "xena": (5, FILLER.format(folder="/tmp"))})
    for name in ("wanda", "xena"):
        submission = found[name]
        assert submission.status.startswith("the submission reached its memory limit (3 GiB"), (name, submission.status)
        assert submission.scores == {1: 2.0, 2: 3.0, 3: 3.0, 4: 3.0, 5: 0.0}   # tasks 1-4 were recorded before
    on_disk = sum(path.stat().st_size for path in (tmp_path / "out").rglob("*") if path.is_file())
    assert on_disk < 2**28, f"{on_disk / 2**20:.0f} MiB written under --out"
    assert {path.name for path in Path("/dev/shm").glob("icl-course-*")} == before   # the memory was given back


@pytest.mark.slow
@pytest.mark.skipif(not SANDBOX, reason=f"no sandbox here: {SANDBOX_PROBLEM}")
def test_a_memory_file_system_too_small_for_the_limit_leaves_the_course_folders_on_disk(tmp_path, monkeypatch,
                                                                                         capsys):
    """A container's /dev/shm may hold only megabytes: grading says so and keeps each submission's course
    folder under --out, where the run still grades it in full."""
    from icl_course.grading import grade as grading

    if grading.memory_file_system() is None:
        pytest.skip("no memory file system here, so there is nothing to fall back from")
    real = shutil.disk_usage
    monkeypatch.setattr(grading.shutil, "disk_usage", lambda path: real(path)._replace(free=2**20)
                        if Path(path) == grading.memory_file_system() else real(path))
    folders, make_folder = [], grading.tempfile.mkdtemp
    monkeypatch.setattr(grading.tempfile, "mkdtemp", lambda *args, **kwargs: folders.append(kwargs.get("dir"))
                        or make_folder(*args, **kwargs))
    found = grade_attacks(tmp_path, {"wendy": (1, "")}, progress=True)
    assert re.search(r"warning: \S+ has less room than \d+ x the memory limit, so the course folders stay on disk",
                     capsys.readouterr().out)
    assert grading.memory_file_system() not in folders   # no course folder was made in memory
    assert found["wendy"].scores == {1: 2.0, 2: 3.0, 3: 3.0, 4: 3.0, 5: 3.0}
    course = tmp_path / "out" / "nbgrader" / "students" / "wendy" / CHAPTER
    assert (course / "submitted" / "wendy" / CHAPTER / f"{CHAPTER}.ipynb").is_file()   # the whole course, on disk


def test_forged_answer_files_are_refused_and_never_run(graded_class):
    assert graded_class.task("yvonne", 1) == 0 and graded_class.task("yvonne", 2) == 0
    assert graded_class.task("yvonne", 3) == 0 and graded_class.total("yvonne") == FULL - 8
    assert not graded_class.marker.exists()


def test_answers_that_call_reference_functions_are_reported(graded_class):
    judy = graded_class.rows["judy"]
    if SANDBOX:   # the references raise there; task 4 builds on task 2's function
        assert [graded_class.task("judy", number) for number in range(1, 6)] == [2, 0, 0, 0, 3]
    else:         # nothing is withheld without the sandbox: the properties hold, the instructor decides
        assert graded_class.total("judy") == FULL
    assert judy["review"] == "task 2 uses LinearSelfAttention, from_matrices; task 3 uses gd_construction"
    assert graded_class.rows["alice"]["review"] == ""


# Answers that take the package's own answer instead of computing it, each reaching it another way:
# an import, the module's file run afresh, the grading catalogue's reference read with inspect.
READ_THE_FILE = (
    "import icl_course.models as models\n"
    "namespace = dict(vars(models))\n"
    "exec(compile(open(models.__file__).read(), models.__file__, 'exec'), namespace)\n"
    "def gd_matrices(d, n, eta):\n"
    "    return tuple(m[0].detach() for m in namespace['gd_construction'](d, n, eta).layers[0].head_matrices())\n")
READ_THE_CATALOGUE = (
    "import inspect\n"
    "from icl_course.grading.checking import FLOAT64\n"
    "from icl_course.grading import chapter1\n"
    "exec(inspect.getsource(chapter1._best_step_size_reference).replace('_best_step_size_reference', "
    "'best_step_size'))\n")


def grade_answers(tmp_path, chapter: str, students: dict) -> dict:
    """Grade, in the sandbox, one notebook of ``chapter`` per student: the answer key's answers with the
    student's own answer cells put in (``students``: name -> {task: source}); ``{name: Submission}``."""
    (tmp_path / "keys").mkdir()
    shutil.copy(ROOT / "solutions" / f"{chapter}.ipynb", tmp_path / "keys")
    exercise = nbformat.read(ROOT / "exercises" / f"{chapter}.ipynb", as_version=4)
    full = answered(exercise, nbformat.read(tmp_path / "keys" / f"{chapter}.ipynb", as_version=4), range(1, 6))
    (tmp_path / "class").mkdir()
    for student, answers in students.items():
        notebook = full
        for task, source in answers.items():
            notebook = with_answer(notebook, task, source)
        (tmp_path / "class" / f"{student}_{chapter[:2]}.ipynb").write_text(json.dumps(notebook))
    return {s.student: s for s in grade(tmp_path / "class", tmp_path / "out", solutions=tmp_path / "keys",
                                        progress=False, jobs=2, sandbox=True)}


@pytest.mark.slow
@pytest.mark.skipif(not SANDBOX, reason=f"no sandbox on this machine: {SANDBOX_PROBLEM}")
def test_answers_taken_from_the_package_earn_nothing_in_the_sandbox(tmp_path):
    found = grade_answers(tmp_path, CHAPTER, {"alice": {}, "uma": {3: GIVEAWAYS[3]},
                                              "rita": {3: READ_THE_FILE, 5: READ_THE_CATALOGUE}})
    assert found["alice"].scores == {1: 2.0, 2: 3.0, 3: 3.0, 4: 3.0, 5: 3.0}    # the honest answer: full marks
    assert found["uma"].scores == {1: 2.0, 2: 3.0, 3: 0.0, 4: 3.0, 5: 3.0}
    assert found["rita"].scores == {1: 2.0, 2: 3.0, 3: 0.0, 4: 3.0, 5: 0.0}
    assert "gd_construction is not available while your work is graded" in found["uma"].comments[3]
    assert "gd_construction is not available while your work is graded" in found["rita"].comments[3]
    assert "raised RuntimeError" in found["rita"].comments[5] and "not available" in found["rita"].comments[5]
    assert found["uma"].review == ["task 3 uses gd_construction"]


def test_the_newer_of_two_submissions_is_graded(graded_class):
    kevin = [row for row in graded_class.all_rows if row["student"] == "kevin"]
    graded = next(row for row in kevin if row["assignment"] == CHAPTER)
    ignored = next(row for row in kevin if row["assignment"] == "")
    assert graded["file"] == "kevin_first_try.ipynb" and float(graded["total"]) == FULL
    assert "kevin_first_try.ipynb is a newer submission" in ignored["status"]


def test_submissions_untouched_and_feedback_written(graded_class):
    out = graded_class.out
    assert graded_class.before == graded_class.after
    page = (out / "feedback" / "alice" / f"{CHAPTER}.html").read_text()
    feedback = html.unescape(re.sub(r"<[^>]+>", "", page))  # the text, without syntax-highlighting tags
    assert 'checks.self_check("merged_form", merged_form)' in feedback  # the visible self-check is shown
    assert "HIDDEN TESTS" not in feedback and "checks.record" not in feedback  # the hidden ones are not
    assert f"Score: {FULL}" in feedback and "All grading checks passed." in feedback
    page = html.unescape(re.sub(r"<[^>]+>", "", (out / "feedback" / "mallory" / f"{CHAPTER}.html").read_text()))
    assert "Score: 2.0" in page and "no outputs were recorded" in page
    assert not (out / "feedback" / "dave").exists()


def test_a_rerun_gives_the_same_grades(graded_class, tmp_path):
    """Same --out, same secret, same inputs: a second run rewrites identical grades (two students, to stay quick)."""
    submitted, solutions = tmp_path / "again", tmp_path / "solutions"
    for student in ("alice", "carol"):
        shutil.copytree(graded_class.root / "submissions" / "submitted" / student / CHAPTER,
                        submitted / student / CHAPTER)
    solutions.mkdir()
    shutil.copy(graded_class.root / "solutions" / f"{CHAPTER}.ipynb", solutions)
    out = tmp_path / "out"
    grade(submitted, out, solutions=solutions, progress=False, jobs=2, sandbox=SANDBOX)
    first, secret = (out / "grades.csv").read_text(), (out / ".icl-course-grading").read_text()
    assert [line.split(",")[7] for line in first.splitlines()[1:]] == ["14", "2"]
    grade(submitted, out, solutions=solutions, progress=False, jobs=2, sandbox=SANDBOX)
    assert (out / "grades.csv").read_text() == first and (out / ".icl-course-grading").read_text() == secret


def test_grading_refuses_to_write_into_the_submissions_or_a_foreign_folder(tmp_path):
    (tmp_path / "class").mkdir()
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me")
    with pytest.raises(ValueError, match="outside the submissions folder"):
        grade(tmp_path / "class", tmp_path / "class" / "out")
    with pytest.raises(ValueError, match="was not made by icl-course grade"):
        grade(tmp_path / "class", tmp_path / "mine")
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep me"


def test_grading_limits_must_be_positive(tmp_path, capsys):
    (tmp_path / "class").mkdir()
    for option, value in (("--jobs", "0"), ("--cell-timeout", "-1"), ("--memory-limit", "0")):
        with pytest.raises(SystemExit):
            command(["grade", str(tmp_path / "class"), "--out", str(tmp_path / "out"), option, value])
        assert "must be positive" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_layout_rules(tmp_path):
    for relative in ("submitted/Ann/01/x.ipynb", "bo/01/x.ipynb", "cy_LATE_1_2_x.ipynb", ".ipynb_checkpoints/z.ipynb"):
        (tmp_path / relative).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / relative).write_text("{}")
    found = find_submissions(tmp_path)
    assert sorted(s.student for s in found if s.status == "pending") == ["Ann", "bo", "cy"]  # as given
    assert [s.path.name for s in found if s.status.startswith("skipped: a hidden file")] == ["z.ipynb"]


def test_command_line_help(capsys):
    assert command(["--help"]) == 0
    assert "icl-course grade" in capsys.readouterr().out
    assert command(["regrade"]) == 2


@pytest.mark.slow
def test_a_broken_answer_key_is_named_not_a_traceback(tmp_path, capsys):
    (tmp_path / "class").mkdir()
    (tmp_path / "keys").mkdir()
    (tmp_path / "keys" / "broken.ipynb").write_text("not a notebook")
    with pytest.raises(ValueError, match="answer key .*broken.ipynb cannot be used"):
        grade(tmp_path / "class", tmp_path / "out", solutions=tmp_path / "keys", progress=False, sandbox=SANDBOX)
    with pytest.raises(SystemExit):
        command(["grade", str(tmp_path / "class"), "--out", str(tmp_path / "out2"),
                 "--solutions", str(tmp_path / "keys")])
    assert "broken.ipynb cannot be used" in capsys.readouterr().err


def tiny_key(hidden):
    """An instructor's own answer key: one task, checked by plain asserts or by a named trusted check."""
    from icl_course.grading.exercises import mark_cells
    return mark_cells(nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_markdown_cell("# Tiny\n\n## Task 1: doubling (2 points)"),
        nbformat.v4.new_code_cell("def double(x):\n    ### BEGIN SOLUTION\n    return 2 * x\n    ### END SOLUTION"),
        nbformat.v4.new_code_cell(f"# self-check, task 1\nassert double(1) == 2\n### BEGIN HIDDEN TESTS\n{hidden}\n"
                                  "### END HIDDEN TESTS"),
    ], metadata={"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}}))


@pytest.mark.slow
def test_a_key_without_trusted_checks_is_graded_in_the_kernel_with_a_warning(tmp_path, capsys, monkeypatch):
    (tmp_path / "keys").mkdir()
    nbformat.write(tiny_key("assert double(3) == 6"), tmp_path / "keys" / "tiny.ipynb")
    from icl_course.grading.exercises import generate
    generate(tmp_path / "keys", tmp_path / "handout")
    handout = nbformat.read(tmp_path / "handout" / "tiny.ipynb", as_version=4)
    (tmp_path / "class").mkdir()
    for student, body in (("ann", "return 2 * x"), ("ben", "return x")):
        notebook = with_answer(handout, 1, f"def double(x):\n    {body}\n")
        (tmp_path / "class" / f"{student}_tiny.ipynb").write_text(json.dumps(notebook))
    answered = with_answer(handout, 1, "def double(x):\n    return x + x\n")
    (tmp_path / "class" / "cy_tiny.ipynb").write_text(json.dumps(answered))
    import icl_course.grading.grade as grading
    write_feedback = grading._write_feedback

    def failing_for_cy(target, *arguments):  # an unexpected failure while grading one submission
        if target.parent.name == "cy":
            raise RuntimeError("disk full")
        return write_feedback(target, *arguments)

    monkeypatch.setattr(grading, "_write_feedback", failing_for_cy)
    found = grade(tmp_path / "class", tmp_path / "out", solutions=tmp_path / "keys", jobs=2, sandbox=SANDBOX)
    assert {s.student: s.scores for s in found} == {"ann": {1: 2.0}, "ben": {1: 0.0}, "cy": {1: 0.0}}
    assert "no trusted check records these tasks" in capsys.readouterr().out
    assert next(s for s in found if s.student == "cy").status == "could not be graded (RuntimeError: disk full)"


@pytest.mark.slow
def test_a_key_that_records_an_unknown_check_is_refused(tmp_path):
    (tmp_path / "keys").mkdir()
    nbformat.write(tiny_key('checks.record("tripled", double)'), tmp_path / "keys" / "tiny.ipynb")
    (tmp_path / "class").mkdir()
    with pytest.raises(ValueError, match="tiny.ipynb cannot be used: task 1 records \\['tripled'\\]"):
        grade(tmp_path / "class", tmp_path / "out", solutions=tmp_path / "keys", progress=False, sandbox=SANDBOX)


def test_an_installation_without_answer_keys_asks_for_them(tmp_path, monkeypatch):
    import icl_course.grading.grade as grading
    monkeypatch.setattr(grading, "CHECKOUT_SOLUTIONS", tmp_path / "not-here")
    (tmp_path / "class").mkdir()
    with pytest.raises(ValueError, match="no answer keys beside it .* pass --solutions"):
        grade(tmp_path / "class", tmp_path / "out")


def test_the_command_asks_for_solutions_when_the_package_has_none_beside_it(tmp_path, monkeypatch, capsys):
    import icl_course.grading.grade as grading
    assert grading.default_solutions() == ROOT / "solutions"     # in this checkout, its own answer keys
    monkeypatch.setattr(grading, "CHECKOUT_SOLUTIONS", tmp_path / "site-packages" / "solutions")
    (tmp_path / "class").mkdir()
    with pytest.raises(SystemExit) as stopped:
        command(["grade", str(tmp_path / "class"), "--out", str(tmp_path / "out")])
    assert stopped.value.code == 2
    message = capsys.readouterr().err
    assert "has no answer keys beside it" in message and "pass --solutions PATH/TO/solutions" in message
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("module", ["icl_course.grading.grade", "icl_course.grading.exercises"])
def test_the_module_commands_run(module):
    import subprocess
    import sys
    result = subprocess.run([sys.executable, "-m", module, "--help"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and "usage:" in result.stdout


# -- files a student controls are input, never instructions -----------------------------------

def test_only_regular_files_are_read_and_everything_skipped_is_reported(tmp_path):
    from icl_course.grading.grade import MAX_NOTEBOOK_BYTES
    root = tmp_path / "class"
    (root / "bob").mkdir(parents=True)
    (root / "ann_01.ipynb").write_text("{}")
    (tmp_path / "outside.ipynb").write_text("{}")
    (root / "eve_01.ipynb").symlink_to(tmp_path / "outside.ipynb")         # a link out of the folder
    (root / "mal_01.ipynb").symlink_to(root / "ann_01.ipynb")              # a link to a classmate
    (root / "linked").symlink_to(tmp_path, target_is_directory=True)        # a folder link is not followed
    os.mkfifo(root / "pip_01.ipynb")                                         # reading it would hang
    (root / ".hid_01.ipynb").write_text("{}")
    (root / "bob" / ".ipynb_checkpoints").mkdir()
    (root / "bob" / ".ipynb_checkpoints" / "01-checkpoint.ipynb").write_text("{}")
    with open(root / "big_01.ipynb", "wb") as handle:
        handle.truncate(MAX_NOTEBOOK_BYTES + 1)
    (root / "bob" / "timestamp.txt").write_text("2026-11-01 10:00:00")
    found = {submission.path.name: submission.status for submission in find_submissions(root)}
    assert found.pop("ann_01.ipynb") == "pending"
    assert found == {
        "eve_01.ipynb": "skipped: a symbolic link (not followed)",
        "mal_01.ipynb": "skipped: a symbolic link (not followed)",
        "linked": "skipped: a symbolic link to a folder (not followed)",
        "pip_01.ipynb": "skipped: not a regular file (a FIFO, socket or device)",
        ".hid_01.ipynb": found[".hid_01.ipynb"],
        "01-checkpoint.ipynb": found["01-checkpoint.ipynb"],
        "big_01.ipynb": "skipped: 20 MiB, more than the 20 MiB a notebook may have",
    }
    assert found[".hid_01.ipynb"].startswith("skipped: a hidden file")
    assert found["01-checkpoint.ipynb"].startswith("skipped: a hidden file")


def test_grading_a_folder_with_a_fifo_and_links_finishes_and_reports_them(tmp_path):
    root = tmp_path / "class"
    root.mkdir()
    os.mkfifo(root / "pip_01.ipynb")
    (root / "eve_01.ipynb").symlink_to(tmp_path)
    (root / "=cmd_01.ipynb").write_text("not a notebook")
    found = grade(root, tmp_path / "out", progress=False, sandbox=SANDBOX)
    rows = (tmp_path / "out" / "grades.csv").read_text().splitlines()
    assert {submission.status.split(":")[0] for submission in found} == {"skipped", "not a notebook (JSONDecodeError)"}
    assert any(row.startswith("'=cmd,") for row in rows), "a name starting with = is quoted for spreadsheets"


def test_identities_are_kept_as_given_and_never_share_a_folder():
    from icl_course.grading.grade import Submission, _report_collisions, student_folder
    names = ["alice", "Alice", "ALICE", "Дмитрий", "Ярослав", "李雷", "韩梅梅", "o'brien", "a b"]
    folders = [student_folder(name) for name in names]
    assert len(set(folders)) == len(names) and folders[0] == "alice"
    assert all(re.fullmatch(r"[a-z0-9][a-z0-9._-]*", folder) for folder in folders)
    found = [Submission(path=Path(f"{name}.ipynb"), student=name) for name in ("alice", "Alice", "alice-0d6e4079")]
    found[2].student = student_folder("Alice")     # a name that is literally another one's folder
    _report_collisions(found)
    assert found[0].status == "pending"
    assert found[1].status.startswith("skipped: the identity 'Alice' collides")
    assert found[2].status.startswith("skipped: the identity")


def test_spreadsheet_cells_never_start_a_formula():
    from icl_course.grading.grade import spreadsheet_safe
    for text in ("=HYPERLINK(\"x\")", "+1", "-2", "@SUM(A1)", "\tx", "\rx"):
        assert spreadsheet_safe(text).startswith("'")
    assert spreadsheet_safe("alice") == "alice" and spreadsheet_safe("") == ""


def test_a_copied_graded_cell_is_repaired_so_an_honest_learner_is_graded():
    from icl_course.grading.grade import _repair
    exercise = nbformat.read(ROOT / "exercises" / f"{CHAPTER}.ipynb", as_version=4)
    check = find_cell(exercise, "task1_check")
    exercise.cells.insert(exercise.cells.index(check) + 1, nbformat.from_dict(json.loads(json.dumps(check))))
    fixes = _repair(exercise)
    assert "a copy of the graded cell 'task1_check' kept as an ordinary cell" in fixes
    ids = [cell.metadata.get("nbgrader", {}).get("grade_id") for cell in exercise.cells]
    assert ids.count("task1_check") == 1


def test_recorded_answers_that_would_unpack_to_gigabytes_are_refused(tmp_path):
    from icl_course.grading import protocol
    bomb = tmp_path / "best_step_size.pt"
    with zipfile.ZipFile(bomb, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("archive/data.pkl", b"\0" * (64 * 2**20))        # 64 MiB of zeros, 64 KiB on disk
    assert bomb.stat().st_size < 1_000_000
    verdicts = protocol.verify_recorded(["best_step_size"], tmp_path, seed=0)
    assert "would unpack to 64 MiB or are compressed" in verdicts["best_step_size"]


# Markup that would run a script in a feedback page, from every place a learner controls: Markdown
# (raw HTML, a javascript: link, a data: link, SVG), an HTML output, an image output's metadata, an
# exception text quoted in the task's comment and the grading status; each sets window.owned.
HOSTILE_MARKDOWN = ("<script>window.owned = 1</script>\n<img src=x onerror=\"window.owned = 2\">\n\n"
                    "[click me](javascript:window.owned=3) [and me](data:text/html,<script>1</script>) "
                    "[fine](https://example.org) [top](#top)\n\n"
                    "<svg><style><img src=x onerror=\"window.owned=4\"></style></svg>\n"
                    "<a href=\"jav&#x09;ascript:window.owned=5\">tab</a> <iframe src=\"javascript:parent.owned=6\">"
                    "</iframe>\n\nmaths: $n > d$ and $a < b$")
PIXEL = ("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg==")


def hostile_feedback(tmp_path):
    """A feedback page built from a notebook that tries every way above; returns its path."""
    from icl_course.grading.grade import AnswerKey, Submission, Task, _write_feedback
    notebook = nbformat.v4.new_notebook()
    answer = nbformat.v4.new_code_cell("1", outputs=[
        nbformat.v4.new_output("display_data", data={"text/html": "<script>window.owned = 7</script>",
                                                     "text/plain": "an html output"}),
        nbformat.v4.new_output("display_data", data={"image/png": PIXEL, "text/plain": "a pixel"},
                               metadata={"image/png": {"width": "1 onerror=window.owned=8 x"}}),
        nbformat.v4.new_output("display_data", data={"image/svg+xml": "<svg onload='window.owned=9'></svg>"}),
        nbformat.v4.new_output("error", ename="ValueError", evalue="<img src=x onerror=window.owned=10>",
                               traceback=["<img src=x onerror=window.owned=11>"])])
    answer.metadata["nbgrader"] = {"grade_id": "task1_answer", "solution": True, "grade": False, "locked": False}
    decoy = nbformat.v4.new_markdown_cell("a cell of the learner's own")
    decoy.metadata["nbgrader"] = {"solution": True, "grade_id": "x", "comment": "<img src=x onerror=window.owned=12>"}
    notebook.cells = [nbformat.v4.new_markdown_cell(HOSTILE_MARKDOWN), answer, decoy]
    submission = Submission(path=tmp_path / "x.ipynb", student="mallory", assignment="tiny",
                            status="graded <img src=x onerror=window.owned=13>")
    submission.scores = {1: 0.0}
    submission.comments = {1: "merged_form(case) raised ValueError: <img src=x onerror=window.owned=14>"}
    _write_feedback(tmp_path / "page.html", notebook, submission,
                    AnswerKey("tiny", {}, {1: Task(1, 2.0, ["merged_form"], ())}), False)
    return tmp_path / "page.html"


def test_a_learners_markup_is_shown_in_the_feedback_never_run(tmp_path):
    page = hostile_feedback(tmp_path).read_text()
    body = page[page.index("<body"):]
    tags = re.findall(r"<[a-zA-Z][^>]*>", body)
    unsafe = r"^<(script|iframe|object|embed)|javascript:|\son[a-z]+="
    assert tags and not [tag for tag in tags if re.search(unsafe, tag, re.I)]
    # scripts: none, or only the grader's own, by hash (MathJax)
    policy = r"Content-Security-Policy\" content=\"default-src 'none'; script-src ('none'|('sha256-[^']+' ?)+);"
    assert re.search(policy, page)
    assert '<a href="https://example.org">fine</a>' in page and 'href="#top"' in page
    assert "onerror=window.owned=14" in html.unescape(page)       # the exception text is shown, as text
    assert f"data:image/png;base64,{PIXEL}" in page                 # an image of the notebook's own stays


def settled_owned(page, playwright_error, tries=50):
    """``window.owned`` in the document ``page`` settles on, or "left the page" once it is off ``file:``.

    A click on a link that leaves (an aborted request to the web) can commit Chromium's error page
    while we ask, which destroys the context being asked: wait for the load and ask again.
    """
    for _ in range(tries):
        try:
            page.wait_for_load_state("load")
            if not page.url.startswith("file:"):
                return "left the page"
            return page.evaluate("window.owned")
        except playwright_error as error:
            if "context was destroyed" not in str(error) and "navigat" not in str(error):
                raise
            page.wait_for_timeout(100)
    raise AssertionError(f"the page never settled after {tries} tries (now at {page.url})")


@pytest.mark.slow
def test_a_hostile_feedback_page_runs_no_script_in_a_browser(tmp_path):
    """Opened in Chromium, with every link clicked: window.owned is never set and no dialog opens."""
    pytest.importorskip("playwright")
    from playwright.sync_api import Error as PlaywrightError
    from playwright.sync_api import sync_playwright
    from test_browser import find_chromium
    if find_chromium() is None:
        pytest.skip("no Chromium on this machine")
    path = hostile_feedback(tmp_path)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=find_chromium(),
                                             args=["--no-sandbox", "--disable-gpu", "--disable-background-networking"])
        page = browser.new_page()
        dialogs = []
        page.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))
        page.route("**/*", lambda route: route.abort() if not route.request.url.startswith(("file:", "data:"))
                   else route.continue_())
        page.goto(path.as_uri())
        page.wait_for_timeout(500)
        assert page.evaluate("window.owned") is None
        for link in page.locator("a[href]").all():
            try:
                link.click(timeout=1000, no_wait_after=True)
            except Exception:  # a link hidden or leaving the page: what matters is what ran
                pass
            page.wait_for_timeout(100)
            owned = settled_owned(page, PlaywrightError)
            if owned == "left the page":
                page.go_back()
                owned = settled_owned(page, PlaywrightError)
            assert owned is None
        assert page.evaluate("window.owned") is None and dialogs == []
        assert "<img src=x onerror=window.owned=14>" in page.inner_text("body")   # shown as text
        browser.close()


COURSE_MARKDOWN = ("[![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)]"
                   "(https://colab.research.google.com/github/x/y)\n\n"
                   "With more points than dimensions ($n > d$) and $a < b$, the layer is\n\n"
                   "$$\\begin{pmatrix} w_{xx}\\Sigma & w_{xy} \\\\ 0 & w_{yy} \\end{pmatrix}$$\n\n"
                   "| task | what |\n|---|---|\n| 1 | `merged_form` |\n| 2 | `linear_attention` |\n")


def open_feedback(path, check):
    """Open the feedback page at ``path`` in Chromium, wait for MathJax, and call ``check(page, console errors)``."""
    pytest.importorskip("playwright")
    from playwright.sync_api import sync_playwright
    from test_browser import find_chromium
    if find_chromium() is None:
        pytest.skip("no Chromium on this machine")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=find_chromium(),
                                             args=["--no-sandbox", "--disable-gpu", "--disable-background-networking"])
        page = browser.new_page()
        errors = []
        page.on("console", lambda message: errors.append(message.text) if message.type == "error" else None)
        page.on("pageerror", lambda error: errors.append(str(error)))
        page.goto(path.as_uri())
        page.wait_for_function("() => !window.MathJax || (MathJax.startup && MathJax.startup.promise)", timeout=20_000)
        page.evaluate("() => window.MathJax ? MathJax.startup.promise : null")
        check(page, errors)
        browser.close()


def _reads_well(page, errors, maths=1):
    from icl_course.grading.grade import _maths_scripts
    text = page.inner_text("body")
    assert not re.search(r"&(gt|lt|amp|quot|#\d+);", text), "literal entities in the page"
    if _maths_scripts():
        assert page.locator("mjx-container").count() >= maths
        assert "\\begin{pmatrix}" not in text and "$n > d$" not in text     # rendered, not shown as TeX
    broken = page.evaluate("() => [...document.images].filter(image => !(image.complete && image.naturalWidth > 0))"
                           ".map(image => image.src)")
    assert broken == [], broken
    assert errors == [], errors


@pytest.mark.slow
def test_a_feedback_page_renders_maths_offline_with_a_readable_table_and_no_broken_image(tmp_path):
    from icl_course.grading.grade import AnswerKey, Submission, _write_feedback
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [nbformat.v4.new_markdown_cell(COURSE_MARKDOWN)]
    submission = Submission(path=tmp_path / "x.ipynb", student="alice", assignment="tiny", status="graded")
    _write_feedback(tmp_path / "page.html", notebook, submission, AnswerKey("tiny", {}, {}), False)

    def check(page, errors):
        _reads_well(page, errors, maths=3)
        assert "Open In Colab" in page.inner_text("body")        # the badge, offline, as its alt text
        cell = page.locator("th").first
        assert cell.inner_text().strip() == "task"
        padding = page.evaluate("cell => parseFloat(getComputedStyle(cell).paddingRight)", cell.element_handle())
        assert padding > 4                                    # "task" and "what" do not run together
    open_feedback(tmp_path / "page.html", check)


@pytest.mark.slow
def test_a_real_feedback_page_reads_well(graded_class):
    """alice's feedback page for chapter 1, as an instructor would hand it back: the course's maths rendered
    offline, no literal entities, no broken image, no console error."""
    open_feedback(graded_class.out / "feedback" / "alice" / f"{CHAPTER}.html",
                  lambda page, errors: _reads_well(page, errors, maths=10))


@pytest.mark.skipif(not SANDBOX, reason=f"no sandbox on this machine: {SANDBOX_PROBLEM}")
def test_the_sandbox_stops_what_no_check_in_the_kernel_can(graded_class):
    """sybil reads answer keys and classmates' notebooks, starts a process that outlives grading to
    rewrite grades.csv, edits the installed package and the grading secret, leaves a file in /tmp and
    stops every process it can see.  Inside the sandbox none of it reaches anything."""
    time.sleep(max(0.0, 12 - (time.monotonic() - graded_class.finished)))  # let the late process try
    assert graded_class.task("sybil", 2) == 0              # no answer key or classmate's answer was readable
    # the rest is graded as usual (task 4 builds on task 2's function, as for oscar)
    assert [graded_class.task("sybil", number) for number in range(1, 6)] == [2, 0, 3, 0, 3]
    assert graded_class.total("alice") == FULL             # the other kernels were never stopped
    assert not (graded_class.root / "outlived").exists()   # no process outlived its grading
    assert "hacked" not in (graded_class.out / "grades.csv").read_text()
    assert _package_hashes() == graded_class.package_before
    assert "sybil" not in (graded_class.out / ".icl-course-grading").read_text()
    assert not Path("/tmp/sybil-was-here").exists()


def test_without_a_sandbox_grading_stops_unless_asked_not_to(tmp_path, monkeypatch, capsys):
    import icl_course.grading.grade as grading
    monkeypatch.setattr(grading, "sandbox_problem", lambda: "bubblewrap (the `bwrap` program) is not installed")
    (tmp_path / "class").mkdir()
    with pytest.raises(ValueError, match="no sandbox can be made here: bubblewrap .* pass --no-sandbox"):
        grade(tmp_path / "class", tmp_path / "out")
    grade(tmp_path / "class", tmp_path / "out2", sandbox=False)
    assert "warning: --no-sandbox: a learner's code can then read and write every file" in capsys.readouterr().out


def executed(path, *outputs):
    """An executed notebook at ``path`` with one code cell holding ``outputs``, as nbgrader leaves it."""
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [nbformat.v4.new_code_cell("f()", outputs=list(outputs))]
    nbformat.write(notebook, path)
    return path


def test_the_status_of_a_run_comes_from_its_return_code_notebook_and_limits_not_from_printed_words(tmp_path):
    from icl_course.grading.grade import CELL_TIMEOUT_ERROR, _run_problem
    answers = tmp_path / "answers"
    answers.mkdir()
    words = "Timeout\nKernel died\nDeadKernel\ntimed out\nAddress already in use\nbecame unresponsive\n"

    def problem(returncode, graded, log="", memory=False, processes=False):
        notebook = nbformat.read(graded, as_version=4) if graded.exists() else None
        return _run_problem(returncode, notebook, answers, log, memory, processes, 2**30)

    clean = executed(tmp_path / "clean.ipynb", nbformat.v4.new_output("stream", name="stdout", text=words))
    assert problem(0, clean, log=words) == ""         # words a learner's code printed change nothing
    error = nbformat.v4.new_output("error", ename=CELL_TIMEOUT_ERROR, evalue="", traceback=[])
    assert problem(0, executed(tmp_path / "slow.ipynb", error)) == "a cell exceeded the cell time limit"
    missing = tmp_path / "removed-by-nbgrader.ipynb"
    assert problem(1, missing, memory=True).startswith("the submission reached its memory limit (1 GiB")
    assert problem(1, missing, processes=True).startswith(f"the submission reached its limit of {MAX_PROCESSES}")
    assert problem(0, clean, memory=True) == ""        # a child killed, the run unharmed: nothing to report
    dead = ("[AutogradeApp | ERROR] Traceback (most recent call last):\n"     # as nbgrader 0.9 logs it
            "      File \".../nbclient/client.py\", line 1009, in async_execute_cell\n"
            "        raise DeadKernelError(\"Kernel died\") from None\n"
            "    nbclient.exceptions.DeadKernelError: Kernel died\n    \n"
            "[AutogradeApp | WARNING] Removing failed assignment: /course/autograded/victor\n")
    assert problem(1, missing, log=dead).startswith("the kernel stopped during execution")
    port = "zmq.error.ZMQError: Address already in use (addr='tcp://127.0.0.1:5555')\n"
    assert problem(1, missing, log=port) == "the kernel could not start"
    (answers / "merged_form.pt").write_bytes(b"recorded")   # the kernel did run: never run it again
    assert problem(1, missing, log=port).startswith("autograding failed: ZMQError: Address already in use")
    typo = "[AutogradeApp | ERROR] Please see the the above traceback for details on the specific errors\n"
    assert problem(1, missing, log=typo) == ("autograding failed (nbgrader exited with status 1 and kept no "
                                             "executed notebook)")
    assert problem(0, missing).startswith("autograding failed")   # a run that kept no notebook failed


def test_the_cell_time_limit_error_is_ours_not_nbgraders_default(tmp_path):
    from traitlets.config import Config

    from icl_course.grading.grade import CELL_TIMEOUT_ERROR, _write_config
    _write_config(tmp_path, 7)
    config = Config()
    exec((tmp_path / "nbgrader_config.py").read_text(), {"get_config": lambda: config})
    assert config.Execute.timeout == 7 and config.Execute.interrupt_on_timeout
    assert config.Execute.error_on_timeout["ename"] == CELL_TIMEOUT_ERROR
    assert "(7 s)" in config.Execute.error_on_timeout["traceback"][0]


ROOT_ATTACK = """import os, subprocess, sys, pathlib
def attempt(*command):
    return subprocess.run(command, capture_output=True).returncode
print("CapEff:", [line.split()[1] for line in open("/proc/self/status") if line.startswith("CapEff")][0])
print("uid:", os.getuid())
print("umount source:", attempt("umount", os.path.join(os.getcwd(), "source")))
print("umount package:", attempt("umount", {package!r}))
print("remount environment:", attempt("mount", "-o", "remount,rw,bind", {environment!r}))
try:
    open(os.path.join({environment!r}, "sybil.py"), "w").write("print('owned')")
    print("write environment:", 0)
except OSError as error:
    print("write environment:", type(error).__name__)
print("cgroup:", "|".join(open("/proc/self/cgroup").read().split()))
"""


@pytest.mark.skipif(not SANDBOX, reason=f"no sandbox here: {SANDBOX_PROBLEM}")
def test_the_learners_code_has_no_capability_even_when_the_grader_is_root(tmp_path):
    """Started as root (as the README suggests, for the control group), the sandbox still runs the learner's
    code as an ordinary user without capabilities: umount, a remount and writing into the Python
    environment all fail inside, and the control group holds it."""
    import subprocess
    import sys

    from icl_course.grading.grade import _limit_resources
    from icl_course.grading.sandbox import package_folder, sandboxed
    from icl_course.grading.stripped import strip_package
    course = tmp_path / "course"
    (course / "source").mkdir(parents=True)
    (course / "source" / "key.txt").write_text("the answer key")
    copy = strip_package(package_folder(), tmp_path / "packages" / "icl_course", {"gd_construction"})
    environment = str(Path(sys.prefix).resolve())
    script = ROOT_ATTACK.format(package=str(package_folder()), environment=environment)
    group = ControlGroup.create(f"icl-course-test-root-{os.getpid()}", 2**30, 64)
    try:
        result = subprocess.run(sandboxed([sys.executable, "-c", script], writable=course, hidden=("source",),
                                          package=copy), capture_output=True, text=True, timeout=60,
                                preexec_fn=_limit_resources(2**30, group))
    finally:
        if group is not None:
            group.close()
    report = dict(line.split(": ", 1) for line in result.stdout.splitlines() if ": " in line)
    assert result.returncode == 0, result.stderr
    assert int(report["CapEff"], 16) == 0 and report["uid"] == "65534"
    assert report["umount source"] != "0" and report["umount package"] != "0"
    assert report["remount environment"] != "0" and report["write environment"] == "OSError"
    assert not (Path(environment) / "sybil.py").exists()
    if os.getuid() == 0:
        assert group is not None    # root can always make one here
    if group is not None:
        assert group.folders[0].name in report["cgroup"]   # the control group still holds the sandbox


def test_files_of_a_course_folder_are_read_as_input(tmp_path):
    """No link followed on any part of the path, no FIFO opened for long, regular files only, size-capped."""
    from icl_course.grading.untrusted import UnsafeFile, read_untrusted
    course, elsewhere = tmp_path / "course", tmp_path / "elsewhere"
    (course / "autograded" / "alice").mkdir(parents=True)
    elsewhere.mkdir()
    (elsewhere / "key.ipynb").write_text("the answer key")
    (course / "autograded" / "alice" / "fine.ipynb").write_text("a notebook")
    assert read_untrusted(course, "autograded/alice/fine.ipynb", 100) == b"a notebook"
    (course / "autograded" / "alice" / "link.ipynb").symlink_to(elsewhere / "key.ipynb")
    (course / "autograded" / "bob").symlink_to(elsewhere, target_is_directory=True)
    os.mkfifo(course / "autograded" / "alice" / "fifo.pt")
    (course / "autograded" / "alice" / "big.pt").write_bytes(bytes(101))
    for relative, kind in (("autograded/alice/link.ipynb", "a symbolic link"),
                           ("autograded/bob/key.ipynb", "autograded/bob is a symbolic link"),
                           ("autograded/alice/fifo.pt", "a FIFO"), ("autograded/alice/big.pt", "larger than"),
                           ("autograded/alice", "a folder")):
        with pytest.raises(UnsafeFile, match=kind):
            read_untrusted(course, relative, 100)
    with pytest.raises(FileNotFoundError):
        read_untrusted(course, "autograded/alice/missing.ipynb", 100)


def test_verify_recorded_refuses_a_fifo_or_a_link_and_grades_the_rest(tmp_path):
    from icl_course.grading import protocol
    from icl_course.grading.protocol import record
    course = tmp_path / "course"
    answers = course / "answers"
    answers.mkdir(parents=True)
    os.environ[protocol.ANSWERS_VARIABLE] = str(answers)
    try:
        protocol.write_cases(["fourth_moment", "gdpp_layers"], answers, seed=3)
        record("fourth_moment", lambda d: d * (d + 2))
        from icl_course import theory
        record("gdpp_layers", theory.gdpp_layers_needed)
    finally:
        del os.environ[protocol.ANSWERS_VARIABLE]
    assert protocol.verify_recorded(["fourth_moment", "gdpp_layers"], answers, 3, root=course) == \
        {"fourth_moment": "", "gdpp_layers": ""}
    (answers / "gdpp_layers.pt").rename(tmp_path / "moved.pt")
    (answers / "gdpp_layers.pt").symlink_to(tmp_path / "moved.pt")
    (answers / "fourth_moment.pt").unlink()
    os.mkfifo(answers / "fourth_moment.pt")
    started = time.monotonic()
    verdicts = protocol.verify_recorded(["fourth_moment", "gdpp_layers"], answers, 3, root=course)
    assert time.monotonic() - started < 5
    assert "fourth_moment.pt is a FIFO" in verdicts["fourth_moment"]
    assert "gdpp_layers.pt is a symbolic link" in verdicts["gdpp_layers"]


def test_an_interrupted_run_leaves_no_scratch_folder_behind(tmp_path):
    """A scratch folder named after a grader that no longer runs is removed; a running grader's is kept."""
    import subprocess

    from icl_course.grading.grade import SCRATCH_PREFIX, _remove_stale_scratch
    ended = subprocess.Popen(["true"])
    ended.wait()                      # reaped: its process id names no process now
    dead = tmp_path / f"{SCRATCH_PREFIX}{ended.pid}-abc123"
    live = tmp_path / f"{SCRATCH_PREFIX}{os.getpid()}-def456"
    other = tmp_path / "someone-else"
    for folder in (dead, live, other):
        (folder / "course").mkdir(parents=True)
    assert _remove_stale_scratch(tmp_path) == [dead]
    assert not dead.exists() and live.exists() and other.exists()


FIFO_IN_PLACE_OF_A_RECORD = """import os
folder = os.environ["ICL_COURSE_ANSWERS"]
os.remove(os.path.join(folder, "merged_form.pt"))
os.mkfifo(os.path.join(folder, "merged_form.pt"))
os.remove(os.path.join(folder, "linear_attention.pt"))
os.symlink(os.path.join(folder, "gd_matrices.pt"), os.path.join(folder, "linear_attention.pt"))
"""


@pytest.mark.slow
@pytest.mark.skipif(not SANDBOX, reason=f"no sandbox here: {SANDBOX_PROBLEM}")
def test_what_a_submission_leaves_in_its_course_folder_is_input(tmp_path, monkeypatch):
    """rhea tries root's tools from her kernel; fifi leaves a FIFO and a link in place of two records; sly's
    executed notebook is replaced by a link to the answer key (as a kernel that raced nbgrader's last write
    could leave it).  Each is graded right, and hana, honest, beside them in full."""
    import sys

    from icl_course.grading import grade as grading
    real = grading._autograde

    def racing(course, assignment, student, *args, **kwargs):
        problem, executed = real(course, assignment, student, *args, **kwargs)
        if student == "sly":
            path = course / "autograded" / student / assignment / f"{assignment}.ipynb"
            path.unlink()
            path.symlink_to(ROOT / "solutions" / f"{assignment}.ipynb")
            return real.__globals__["_read_executed"](course, path.relative_to(course))[1], None
        return problem, executed
    monkeypatch.setattr(grading, "_autograde", racing)
    root_attack = ROOT_ATTACK.format(package=str(grading.package_folder()), environment=str(Path(sys.prefix).resolve()))
    found = grade_attacks(tmp_path, {"rhea": (5, root_attack), "fifi": (5, FIFO_IN_PLACE_OF_A_RECORD),
                                     "sly": (5, ""), "hana": (5, "")})
    assert found["hana"].scores == {1: 2.0, 2: 3.0, 3: 3.0, 4: 3.0, 5: 3.0} and found["hana"].status == "graded"
    assert found["rhea"].scores == found["hana"].scores and found["rhea"].status == "graded"
    assert not (Path(sys.prefix).resolve() / "sybil.py").exists()
    fifi = found["fifi"]
    assert fifi.scores == {1: 0.0, 2: 0.0, 3: 3.0, 4: 3.0, 5: 3.0}
    assert "merged_form.pt is a FIFO" in fifi.comments[1]
    assert "linear_attention.pt is a symbolic link" in fifi.comments[2]
    assert re.fullmatch(r"graded; records not read: answers/merged_form.pt is a FIFO.*; answers/linear_attention.pt "
                        r"is a symbolic link.*", fifi.status)
    sly = found["sly"]
    assert sly.status.startswith("the executed notebook was not read") and "symbolic link" in sly.status
    assert sly.scores == found["hana"].scores          # the points come from the records, checked here
    feedback = (tmp_path / "out" / "feedback" / "sly" / f"{CHAPTER}.html").read_text()
    assert "### BEGIN SOLUTION" not in feedback and "BEGIN SOLUTION" not in html.unescape(feedback)
    printed = "".join(output.get("text", "") for output in find_cell(
        nbformat.read(tmp_path / "out" / "nbgrader" / "students" / "rhea" / CHAPTER / "autograded" / "rhea" / CHAPTER
                      / f"{CHAPTER}.ipynb", as_version=4), "task5_answer").outputs)
    report = dict(line.split(": ", 1) for line in printed.splitlines() if ": " in line)
    assert int(report["CapEff"], 16) == 0 and report["umount source"] != "0" and report["umount package"] != "0"
    assert report["remount environment"] != "0" and report["write environment"] == "OSError"


# Chapter 2 answers that are not answers: an overflowing preconditioner (its loss is NaN), the package's
# own functions of the task's very name, the closed forms handed in as a Monte-Carlo estimate.
OVERFLOW = ("def optimal_preconditioner(S, n, second_moment=0.0):\n"
            "    u = torch.ones(S.shape[0], 1, dtype=S.dtype)\n"
            "    return 1e300 * u @ u.T\n")
FROM_THEORY = {3: "from icl_course import theory\n"
                  "def one_step_loss(d, n, second_moment, c):\n"
                  "    return theory.one_step_loss(d, n, coefficient=c, second_moment=second_moment)\n",
               5: "from icl_course import theory\n"
                  "def optimal_preconditioner(S, n, second_moment=0.0):\n"
                  "    return theory.optimal_preconditioner(S, n, second_moment=second_moment)\n"}
CLOSED_FORM = ("import math\n"
               "def fourth_moment(d):\n    return d * (d + 2)\n"
               "def fourth_moment_monte_carlo(d, num_samples=200_000, seed=0):\n"
               "    exact = d * (d + 2)\n"
               "    return float(exact), math.sqrt((exact * (d + 4) * (d + 6) - exact**2) / num_samples)\n")


@pytest.mark.slow
@pytest.mark.skipif(not SANDBOX, reason=f"no sandbox on this machine: {SANDBOX_PROBLEM}")
def test_non_answers_to_chapter_2_earn_nothing_beside_an_honest_classmate(tmp_path):
    found = grade_answers(tmp_path, CHAPTER_2, {"alice": {}, "nadia": {5: OVERFLOW}, "theo": FROM_THEORY,
                                                "monty": {1: CLOSED_FORM}})
    assert found["alice"].scores == {1: 2.0, 2: 2.0, 3: 3.0, 4: 3.0, 5: 3.0}
    assert found["nadia"].scores == {1: 2.0, 2: 2.0, 3: 3.0, 4: 3.0, 5: 0.0}
    assert "your B has loss nan" in found["nadia"].comments[5]
    assert found["theo"].scores == {1: 2.0, 2: 2.0, 3: 0.0, 4: 3.0, 5: 0.0}
    for number, name in ((3, "one_step_loss"), (5, "optimal_preconditioner")):
        assert f"{name} is not available while your work is graded" in found["theo"].comments[number]
    assert found["monty"].scores == {1: 0.0, 2: 2.0, 3: 3.0, 4: 3.0, 5: 3.0}
    assert "closed forms" in found["monty"].comments[1]


def test_the_grading_process_caps_its_own_memory_while_it_grades():
    """Inside _memory_cap the process cannot grow by more than the cap (a 1 GiB allocation fails under a
    256 MiB cap), and the limit it had before comes back afterwards."""
    import resource

    from icl_course.grading.grade import _memory_cap
    before = resource.getrlimit(resource.RLIMIT_AS)
    with _memory_cap(256 * 2**20):
        with pytest.raises(MemoryError):
            bytearray(2**30)
    assert resource.getrlimit(resource.RLIMIT_AS) == before
    assert len(bytearray(2**28)) == 2**28
