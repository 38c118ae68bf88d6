"""Exercise notebooks: generated from the solutions by nbgrader, failing only where the learner has work to do."""

import re

import nbformat
import pytest
from conftest import ROOT
from nbclient import NotebookClient

from icl_course.grading.exercises import UNFINISHED, GenerationError, generate, mark_cells, task_points
from icl_course.grading.protocol import recorded_names
from icl_course.grading.registry import CHECKS

SOLUTIONS = sorted((ROOT / "solutions").glob("*.ipynb"))


@pytest.mark.slow
def test_committed_exercises_are_generated_from_the_solutions():
    out_of_date = generate(ROOT / "solutions", ROOT / "exercises", check=True)
    assert not out_of_date, f"run `make exercises`: {[path.name for path in out_of_date]} differ from their solutions"
    assert {path.name for path in (ROOT / "exercises").glob("*.ipynb")} == {path.name for path in SOLUTIONS}


def tiny_solution():
    return nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_markdown_cell("# Tiny\n\n## Task 1: doubling (2 points)"),
        nbformat.v4.new_code_cell("def f(x):\n    ### BEGIN SOLUTION\n    return 2 * x\n    ### END SOLUTION"),
        nbformat.v4.new_code_cell("# self-check, task 1\nassert f(1) == 2\n### BEGIN HIDDEN TESTS\nassert f(3) == 6\n"
                                  "### END HIDDEN TESTS\nprint('ok')"),
    ], metadata={"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}})


@pytest.mark.slow
def test_generation_stubs_answers_drops_hidden_tests_and_locks_checks(tmp_path):
    (tmp_path / "solutions").mkdir()
    nbformat.write(mark_cells(tiny_solution()), tmp_path / "solutions" / "tiny.ipynb")
    assert generate(tmp_path / "solutions", tmp_path / "exercises") == [tmp_path / "exercises" / "tiny.ipynb"]
    exercise = nbformat.read(tmp_path / "exercises" / "tiny.ipynb", as_version=4)
    answer, check = exercise.cells[1], exercise.cells[2]
    assert "2 * x" not in answer.source and UNFINISHED in answer.source
    assert "f(3)" not in check.source and "assert f(1) == 2" in check.source
    assert check.metadata["nbgrader"]["locked"] and check.metadata["nbgrader"]["points"] == 2
    assert "checksum" in check.metadata["nbgrader"]
    assert generate(tmp_path / "solutions", tmp_path / "exercises", check=True) == []


def test_marking_refuses_a_task_without_points():
    notebook = tiny_solution()
    notebook.cells[0].source = "# Tiny\n\n## Task 1: doubling"
    with pytest.raises(GenerationError, match="no heading"):
        mark_cells(notebook)


@pytest.mark.parametrize("solution", SOLUTIONS, ids=lambda path: path.name)
def test_solutions_are_nbgrader_source_notebooks(solution):
    notebook = nbformat.read(solution, as_version=4)
    cells = [cell.metadata.get("nbgrader") for cell in notebook.cells]
    assert all(cells), "every cell carries nbgrader metadata: run it through icl_course.grading.exercises.mark_cells"
    answers = [c for c in cells if c["solution"]]
    checks = [c for c in cells if c["grade"]]
    assert 3 <= len(answers) == len(checks) <= 6
    assert all(c["locked"] for c in checks) and not any(c["locked"] for c in answers)
    assert sum(c["points"] for c in checks) == sum(task_points(notebook).values())
    assert all("### BEGIN HIDDEN TESTS" in cell.source for cell in notebook.cells
               if cell.metadata["nbgrader"]["grade"]), "every check has hidden tests on fresh inputs"


@pytest.mark.parametrize("solution", SOLUTIONS, ids=lambda path: path.name)
def test_exercise_fails_only_where_the_learner_has_work_to_do(solution):
    exercise = nbformat.read(ROOT / "exercises" / solution.name, as_version=4)
    NotebookClient(exercise, timeout=120, allow_errors=True, kernel_name="python3",
                   resources={"metadata": {"path": str(ROOT / "exercises")}}).execute()
    errors = [(cell.source.splitlines()[0], output.ename) for cell in exercise.cells if cell.cell_type == "code"
              for output in cell.outputs if output.output_type == "error"]
    unexpected = [error for error in errors if error[1] not in ("NotImplementedError", "AssertionError")]
    assert not unexpected, f"cells failed for reasons other than an unfinished answer or a self-check: {unexpected}"
    stubs = sum(cell.source.count(UNFINISHED) for cell in exercise.cells if cell.cell_type == "code")
    assert stubs >= 3 and sum(name == "NotImplementedError" for _, name in errors) >= 1


@pytest.mark.parametrize("solution", SOLUTIONS, ids=lambda path: path.name)
def test_every_task_is_graded_by_its_trusted_checks(solution):
    """Each self-check records, in its hidden tests, exactly the checks that icl_course.checks files under its task."""
    chapter = int(solution.name.split("_")[0])
    exercise = nbformat.read(ROOT / "exercises" / solution.name, as_version=4)
    for cell in nbformat.read(solution, as_version=4).cells:
        if not cell.metadata["nbgrader"]["grade"]:
            continue
        task = int(cell.metadata["nbgrader"]["grade_id"][4:].split("_")[0])
        expected = sorted(name for name, check in CHECKS.items() if (check.chapter, check.task) == (chapter, task))
        hidden = cell.source.split("### BEGIN HIDDEN TESTS")[1].split("### END HIDDEN TESTS")[0]
        assert expected and sorted(recorded_names(hidden)) == expected, f"task {task} of {solution.name}"
        grade_id = cell.metadata["nbgrader"]["grade_id"]
        learner = next(c for c in exercise.cells if c.metadata.get("nbgrader", {}).get("grade_id") == grade_id)
        assert sorted(re.findall(r'checks\.self_check\("(\w+)"', learner.source)) == expected
        assert not recorded_names(learner.source)
