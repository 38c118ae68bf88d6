"""Exercise notebooks: generated from the solutions, and failing only where the learner has work to do."""

import nbformat
import pytest
from nbclient import NotebookClient

from conftest import ROOT
from icl_course.exercises import UNFINISHED, generate, make_exercise

SOLUTIONS = sorted((ROOT / "solutions").glob("*.ipynb"))


def test_committed_exercises_are_generated_from_the_solutions():
    out_of_date = generate(ROOT / "solutions", ROOT / "exercises", check=True)
    assert not out_of_date, f"run `make exercises`: {[path.name for path in out_of_date]} differ from their solutions"
    assert {path.name for path in (ROOT / "exercises").glob("*.ipynb")} == {path.name for path in SOLUTIONS}


def test_generation_stubs_answers_and_drops_hidden_tests():
    solution = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_code_cell("def f(x):\n    ### BEGIN SOLUTION\n    return 2 * x\n    ### END SOLUTION"),
        nbformat.v4.new_code_cell("assert f(1) == 2\n### BEGIN HIDDEN TESTS\nassert f(3) == 6\n### END HIDDEN TESTS\nprint('ok')"),
        nbformat.v4.new_markdown_cell("Why?\n### BEGIN SOLUTION\nBecause.\n### END SOLUTION"),
    ])
    exercise = make_exercise(solution)
    assert exercise.cells[0].source == f"def f(x):\n    # YOUR CODE HERE\n    {UNFINISHED}"
    assert exercise.cells[1].source == "assert f(1) == 2\nprint('ok')"
    assert exercise.cells[2].source == "Why?\nYOUR ANSWER HERE"
    assert "2 * x" in solution.cells[0].source  # the source is left alone


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
