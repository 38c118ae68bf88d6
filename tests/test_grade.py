"""End to end: grade a small class that the test makes itself, with nbgrader underneath."""

import csv
import hashlib
import html
import json
import re
import shutil

import nbformat
import pytest

from conftest import ROOT
from icl_course.__main__ import main as command
from icl_course.grade import find_submissions, grade

CHAPTER = "01_linear_attention_is_gradient_descent"
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


@pytest.fixture(scope="module")
def graded_class(tmp_path_factory):
    root = tmp_path_factory.mktemp("class")
    solutions = root / "solutions"
    solutions.mkdir()
    shutil.copy(ROOT / "solutions" / f"{CHAPTER}.ipynb", solutions)
    solution = nbformat.read(solutions / f"{CHAPTER}.ipynb", as_version=4)
    exercise = nbformat.read(ROOT / "exercises" / f"{CHAPTER}.ipynb", as_version=4)
    submitted = root / "submissions"

    def hand_in(relative, notebook=None, text=None):
        path = submitted / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        # json, not nbformat.write, which would repair the defects this class is made of
        path.write_text(text if text is not None else json.dumps(notebook, indent=1))

    hand_in(f"submitted/alice/{CHAPTER}/{CHAPTER}.ipynb", answered(exercise, solution, range(1, 6)))
    hand_in(f"submitted/bob/{CHAPTER}/{CHAPTER}.ipynb", exercise)
    hand_in(f"submitted/carol/{CHAPTER}/{CHAPTER}.ipynb", answered(exercise, solution, [1]))
    hand_in(f"submitted/dave/{CHAPTER}/{CHAPTER}.ipynb", text="{ this is not json")
    # a Canvas download, with a split cell's duplicate id and another kernel name
    erin = answered(exercise, solution, range(1, 6))
    erin.cells[3].id = erin.cells[2].id
    erin.metadata["kernelspec"] = {"name": "python3-custom", "display_name": "Custom", "language": "python"}
    hand_in("erin_LATE_12345_67890_exercise_01.ipynb", erin)
    # tampering with a locked check: it is restored from the source
    frank = nbformat.from_dict(exercise)
    find_cell(frank, "task1_check").source = "print('task 1: passed')"
    hand_in(f"submitted/frank/{CHAPTER}/{CHAPTER}.ipynb", frank)
    # a deleted check cell is added back
    grace = answered(exercise, solution, range(1, 6))
    grace.cells.remove(find_cell(grace, "task2_check"))
    hand_in(f"submitted/grace/{CHAPTER}/{CHAPTER}.ipynb", grace)
    # an answer that never returns loses only its own task
    henry = answered(exercise, solution, range(1, 6))
    find_cell(henry, "task5_answer").source = "def best_step_size(d, n, num_tasks=20_000, seed=0):\n    while True:\n        pass"
    hand_in(f"submitted/henry/{CHAPTER}/{CHAPTER}.ipynb", henry)
    # a notebook from somewhere else
    hand_in("ivan_homework.ipynb", nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("print(1)")]))

    before = {path: hashlib.sha256(path.read_bytes()).hexdigest() for path in submitted.rglob("*") if path.is_file()}
    out = root / "out"
    grade(submitted, out, solutions=solutions, cell_timeout=10, notebook_timeout=300, progress=False)
    after = {path: hashlib.sha256(path.read_bytes()).hexdigest() for path in submitted.rglob("*") if path.is_file()}
    with open(out / "grades.csv") as handle:
        rows = {row["student"]: row for row in csv.DictReader(handle)}
    return root, out, rows, before, after


def test_full_zero_and_partial_marks(graded_class):
    _, _, rows, _, _ = graded_class
    assert float(rows["alice"]["total"]) == FULL and float(rows["alice"]["max_total"]) == FULL
    assert float(rows["bob"]["total"]) == 0 and rows["bob"]["status"].startswith("graded")
    assert float(rows["carol"]["total"]) == 2 and float(rows["carol"]["task1"]) == 2


def test_layouts_and_repairs(graded_class):
    _, _, rows, _, _ = graded_class
    assert float(rows["erin"]["total"]) == FULL  # student taken from the Canvas file name
    assert "duplicate cell ids" in rows["erin"]["status"] and "kernel" in rows["erin"]["status"]
    assert rows["erin"]["assignment"] == CHAPTER  # recognised from the notebook, not its name


def test_tampering_and_deleted_checks(graded_class):
    _, _, rows, _, _ = graded_class
    assert float(rows["frank"]["task1"]) == 0 and float(rows["frank"]["total"]) == 0
    assert float(rows["grace"]["total"]) == FULL


def test_a_hanging_answer_loses_only_its_task(graded_class):
    _, _, rows, _, _ = graded_class
    assert float(rows["henry"]["task5"]) == 0 and float(rows["henry"]["total"]) == FULL - 3


def test_malformed_files_get_zero_and_a_reason(graded_class):
    _, _, rows, _, _ = graded_class
    assert rows["dave"]["status"].startswith("not a notebook") and float(rows["dave"]["total"]) == 0
    assert rows["ivan"]["status"] == "not recognised as any exercise of this course"


def test_submissions_untouched_and_feedback_written(graded_class):
    _, out, rows, before, after = graded_class
    assert before == after
    page = (out / "feedback" / "alice" / f"{CHAPTER}.html").read_text()
    feedback = html.unescape(re.sub(r"<[^>]+>", "", page))  # the text, without syntax-highlighting tags
    assert "check_merged_form(D=4, k=3, v=2, seed=0)" in feedback  # the visible self-check is shown
    assert "HIDDEN TESTS" not in feedback and "D=2 + seed" not in feedback  # the hidden ones are not
    assert not (out / "feedback" / "dave").exists()


def test_grading_refuses_to_write_into_the_submissions_or_a_foreign_folder(tmp_path):
    (tmp_path / "class").mkdir()
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me")
    with pytest.raises(ValueError, match="outside the submissions folder"):
        grade(tmp_path / "class", tmp_path / "class" / "out")
    with pytest.raises(ValueError, match="was not made by icl-course grade"):
        grade(tmp_path / "class", tmp_path / "mine")
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep me"


def test_layout_rules(tmp_path):
    for relative in ("submitted/Ann/01/x.ipynb", "bo/01/x.ipynb", "cy_LATE_1_2_x.ipynb", ".ipynb_checkpoints/z.ipynb"):
        (tmp_path / relative).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / relative).write_text("{}")
    assert sorted(s.student for s in find_submissions(tmp_path)) == ["ann", "bo", "cy"]


def test_command_line_help(capsys):
    assert command(["--help"]) == 0
    assert "icl-course grade" in capsys.readouterr().out
    assert command(["regrade"]) == 2


def test_a_broken_answer_key_is_named_not_a_traceback(tmp_path, capsys):
    (tmp_path / "class").mkdir()
    (tmp_path / "keys").mkdir()
    (tmp_path / "keys" / "broken.ipynb").write_text("not a notebook")
    with pytest.raises(ValueError, match="answer key .*broken.ipynb cannot be used"):
        grade(tmp_path / "class", tmp_path / "out", solutions=tmp_path / "keys", progress=False)
    with pytest.raises(SystemExit):
        command(["grade", str(tmp_path / "class"), "--out", str(tmp_path / "out2"), "--solutions", str(tmp_path / "keys")])
    assert "broken.ipynb cannot be used" in capsys.readouterr().err
