"""The repository's promises: one dependency list, documented public functions, notebooks
stored executed and clean, CI running the README's command."""

import importlib
import inspect
import re

try:
    import tomllib
except ModuleNotFoundError:   # Python 3.10
    import tomli as tomllib

import nbformat
import pytest
import yaml
from conftest import ROOT

import icl_course
from icl_course.grading.registry import CHAPTERS

CONDA_NAMES = {"pytorch": "torch"}  # conda-forge name -> PyPI name


def requirement(text):
    name, bound = re.match(r"^\s*([A-Za-z0-9_.\-]+)\s*(.*)$", text).groups()
    return CONDA_NAMES.get(name.lower(), name.lower()), bound.replace(" ", "")


def test_environment_yml_names_the_same_dependencies_as_pyproject():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    expected = dict(requirement(item) for item in project["dependencies"] + project["optional-dependencies"]["lab"])
    environment = yaml.safe_load((ROOT / "environment.yml").read_text())
    conda = [item for item in environment["dependencies"] if isinstance(item, str)]
    pip_entry = next(index for index, item in enumerate(environment["dependencies"]) if isinstance(item, dict))
    assert "pip" in environment["dependencies"][:pip_entry], "pip must be listed before the pip: section"
    pip_section = next(item["pip"] for item in environment["dependencies"] if isinstance(item, dict))
    assert any(line.startswith("-e") and "dev" in line and "grading" in line for line in pip_section)
    listed = dict(requirement(item) for item in conda if not item.startswith(("python", "pip")))
    assert listed == expected
    assert "conda-forge" in environment["channels"]


def test_torch_is_never_pinned_to_a_release_that_would_replace_colabs():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    for item in project["dependencies"]:
        name, bound = requirement(item)
        assert bound.startswith(">="), f"{item}: runtime requirements take lower bounds only"


def public_callables():
    for module_name in ("runtime", "data", "linalg", "models", "memformer", "baselines", "optimizers", "theory",
                        "spectra", "evaluate", "mixed_noise", "train", "trainer_core", "sweep", "table1", "checkpoints",
                        "plots", "widgets", "checks",
                        "grading.checking", "grading.protocol", "grading.stripped", "grading.untrusted",
                        "grading.safe_html",
                        "grading.registry", *(f"grading.chapter{chapter}" for chapter in CHAPTERS)):
        module = importlib.import_module(f"icl_course.{module_name}")
        for name in getattr(module, "__all__", []):
            obj = getattr(module, name)
            if inspect.isfunction(obj) or inspect.isclass(obj):
                yield f"{module_name}.{name}", obj
                if inspect.isclass(obj):
                    for attribute, member in vars(obj).items():
                        public = not attribute.startswith("_")
                        if public and (inspect.isfunction(member) or isinstance(member, property)):
                            # an override may inherit the documentation of the method it overrides
                            documented = [vars(base)[attribute] for base in obj.__mro__ if attribute in vars(base)]
                            yield f"{module_name}.{name}.{attribute}", documented


def docstring(obj):
    return inspect.getdoc(obj.fget if isinstance(obj, property) else obj)


@pytest.mark.parametrize("name, obj", list(public_callables()),
                         ids=lambda value: value if isinstance(value, str) else "")
def test_every_public_function_has_a_docstring(name, obj):
    candidates = obj if isinstance(obj, list) else [obj]
    assert any((docstring(item) or "").strip() for item in candidates), f"{name} needs a docstring"


TENSOR_ARGUMENTS = {"X", "y", "x_t", "weights", "predictions", "tokens", "gram", "preconditioner"}


@pytest.mark.parametrize("name, obj", [(n, o) for n, o in public_callables() if inspect.isfunction(o)],
                         ids=lambda value: value if isinstance(value, str) else "")
def test_functions_of_tensors_state_their_shapes(name, obj):
    if TENSOR_ARGUMENTS & set(inspect.signature(obj).parameters):
        assert re.search(r"\(B|[Ss]hapes?", inspect.getdoc(obj)), f"{name}: say the shapes in the docstring"


NOTEBOOKS = sorted((ROOT / "chapters").glob("*.ipynb")) + sorted((ROOT / "solutions").glob("*.ipynb"))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda path: path.name)
def test_notebooks_are_stored_executed_and_clean(path):
    notebook = nbformat.read(path, as_version=4)
    assert notebook.cells[0].cell_type == "markdown" and notebook.cells[0].source.startswith("# ")
    code = [cell for cell in notebook.cells if cell.cell_type == "code"]
    assert all(cell.execution_count for cell in code), "run `make notebooks` to store current outputs"
    text = path.read_text()
    assert '"output_type": "error"' not in text
    assert "image/svg+xml" not in text, "figures must be PNG"
    assert not re.search(r"/(work|tmp|root|home)/", text), "no absolute paths of one machine"
    assert "arXiv:" in notebook.cells[-1].source or "arXiv:" in text, "a references section with arXiv identifiers"
    assert "execution" not in "".join(str(cell.metadata.keys()) for cell in code), \
        "execution timestamps are volatile: run `make notebooks` (it does not record them)"


@pytest.mark.parametrize("path", NOTEBOOKS + sorted((ROOT / "exercises").glob("*.ipynb")), ids=lambda path: path.name)
def test_notebooks_store_no_warnings(path):
    """A reader sees stored stderr (font warnings, deprecations) on GitHub and Colab."""
    notebook = nbformat.read(path, as_version=4)
    for cell in notebook.cells:
        for output in cell.get("outputs", []):
            assert not (output.output_type == "stream" and output.name == "stderr"), \
                f"cell {cell.get('id')} stores stderr: {output.text[:200]!r}"


def test_ci_runs_the_readme_test_command():
    assert "make test" in (ROOT / ".ci" / "run").read_text()
    readme = (ROOT / "README.md").read_text()
    assert "make lab" in readme and "make test" in readme


def test_the_learners_lab_has_no_grading_panels():
    """`make lab` runs JupyterLab with config/jupyter-learner: nbgrader's extensions are off there."""
    pytest.importorskip("jupyterlab")
    pytest.importorskip("nbgrader")
    import os
    import subprocess
    import sys
    environment = dict(os.environ, JUPYTER_CONFIG_DIR=str(ROOT / "config" / "jupyter-learner"))
    jupyter = [sys.executable, "-m", "jupyter"]

    def listed(*command):
        result = subprocess.run(jupyter + list(command), env=environment, capture_output=True, text=True,
                                timeout=120)
        return result.stdout + result.stderr
    labextensions = [line for line in listed("labextension", "list").splitlines() if "@jupyter/nbgrader v" in line]
    assert labextensions and all("disabled" in line for line in labextensions)
    learner = listed("server", "extension", "list").split("Config dir:")
    learner = next(part for part in learner if part.strip() and "jupyter-learner" in part.strip().splitlines()[0])
    assert "nbgrader.server_extensions.formgrader \x1b[31mdisabled" in learner or \
        "nbgrader.server_extensions.formgrader disabled" in learner
    assert "make lab" in (ROOT / "Makefile").read_text() and "config/jupyter-learner" in (ROOT / "Makefile").read_text()


def test_every_chapter_links_the_notation_card():
    assert (ROOT / "NOTATION.md").exists()
    for path in sorted((ROOT / "chapters").glob("*.ipynb")):
        notebook = nbformat.read(path, as_version=4)
        introduction = "".join(cell.source for cell in notebook.cells[:3] if cell.cell_type == "markdown")
        assert "../NOTATION.md" in introduction, f"{path.name}: link the notation card near the top"


def test_the_version_is_written_in_one_place():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "version" not in project["project"] and "version" in project["project"]["dynamic"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "icl_course.__version__"}
    assert not re.search(r"^version:", (ROOT / "CITATION.cff").read_text(), re.MULTILINE)
    assert re.fullmatch(r"\d+\.\d+\.\d+", icl_course.__version__)


def test_the_lower_bounds_are_read_from_pyproject():
    from lower_bounds import lower_bounds
    pins = lower_bounds((ROOT / "pyproject.toml").read_text())
    assert "numpy==1.23.*" in pins and not any(pin.startswith("torch") for pin in pins)
    assert len(pins) == len(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]) - 1
