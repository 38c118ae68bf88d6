"""The copy of the package that the sandbox shows a graded kernel: the references of the graded tasks
raise a clear error however they are reached, everything else works as in the package."""

import subprocess
import sys
from pathlib import Path

import pytest

import icl_course
from icl_course.grading import registry, sandbox
from icl_course.grading.stripped import strip_package, strip_source, withheld_names

PACKAGE = Path(icl_course.__file__).resolve().parent
CHAPTER_1 = [check for check in registry.CHECKS.values() if check.chapter == 1]


def test_only_giveaways_that_the_package_defines_are_withheld():
    names = withheld_names(CHAPTER_1, PACKAGE)
    assert {"gd_construction", "LinearSelfAttention", "from_matrices", "gradient_descent"} <= names
    assert "theory" not in names and "RegressionTasks" not in names   # a module, and what locked cells use
    assert "conjugate_gradient" not in names                          # chapter 5's answer, not graded here


def test_a_withheld_class_keeps_its_name_and_bases_but_makes_no_instances():
    source = ('"""doc"""\nimport dataclasses\n@dataclasses.dataclass\nclass Law:\n    """the answer: 42"""\n'
              '    level: float = 1.0\n    def mean(self):\n        return 42\n'
              'class Other(Law):\n    pass\ndef kept():\n    return 1\n')
    namespace = {}
    exec(strip_source(source, {"Law"}), namespace)
    assert namespace["kept"]() == 1 and issubclass(namespace["Other"], namespace["Law"])
    with pytest.raises(RuntimeError, match="Law is not available while your work is graded"):
        namespace["Law"]()
    assert "42" not in strip_source(source, {"Law"})
    assert strip_source(source, {"absent"}) is None     # an untouched module is copied byte for byte


def run_in_copy(copy: Path, code: str) -> subprocess.CompletedProcess:
    """``code`` in a fresh interpreter that imports ``icl_course`` from ``copy`` (as the sandbox's kernel does)."""
    return subprocess.run([sys.executable, "-c", code], cwd=copy.parent, capture_output=True, text=True,
                          env={"PYTHONPATH": str(copy.parent), "PATH": "/usr/bin:/bin"}, timeout=120)


def test_the_stripped_copy_raises_for_withheld_functions_and_keeps_the_rest(tmp_path):
    copy = strip_package(PACKAGE, tmp_path / "icl_course", withheld_names(CHAPTER_1, PACKAGE))
    # compiled afresh from the copy's sources: the package's own __pycache__ holds the full functions
    rewritten = (copy / "models.py").stat().st_mtime
    assert any(copy.rglob("*.pyc")) and all(path.stat().st_mtime >= rewritten for path in copy.rglob("*.pyc"))
    result = run_in_copy(copy, (
        "import inspect, torch, icl_course\n"
        f"assert icl_course.__file__.startswith({str(copy)!r}), icl_course.__file__\n"
        "from icl_course import gd_construction, RegressionTasks, checks, optimizers, theory\n"
        "from icl_course.grading import chapter4\n"
        "for call in (lambda: gd_construction(3, 8, 0.5), lambda: chapter4.reference_diag_layer(None, 1, 1, 1, 1)):\n"
        "    try:\n"
        "        call()\n"
        "    except RuntimeError as error:\n"
        "        print('refused:', error)\n"
        "print('source:', '-eta / n' in inspect.getsource(gd_construction))\n"
        "print('file:', '-eta / n' in open(icl_course.models.__file__).read())\n"
        "batch = RegressionTasks(3, 8, dtype=torch.float64, device='cpu').sample(4, seed=0)\n"
        "print('kept:', tuple(theory.best_linear_cosine(batch.X, batch.y).shape), checks.progress(1).passed)\n"))
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("is not available while your work is graded") == 2
    assert "refused: gd_construction is not available" in result.stdout
    assert "refused: reference_diag_layer is not available" in result.stdout
    assert "source: False" in result.stdout and "file: False" in result.stdout
    assert "kept: (4,) 0" in result.stdout


def test_the_sandbox_mounts_the_copy_over_the_package_and_every_installed_copy(tmp_path, monkeypatch):
    installed = tmp_path / "site-packages"
    (installed / "icl_course").mkdir(parents=True)
    monkeypatch.setattr(sandbox, "_python_folders", lambda: [installed])
    copy = tmp_path / "stripped" / "icl_course"
    arguments = sandbox.sandboxed(["true"], writable=None, package=copy)
    binds = [tuple(arguments[index + 1:index + 3]) for index, word in enumerate(arguments) if word == "--ro-bind"]
    assert binds[-2:] == [(str(copy), str(PACKAGE)), (str(copy), str(installed / "icl_course"))]
    # mounted after the real folder: the copy is what the path shows
    assert binds.index((str(PACKAGE), str(PACKAGE))) < binds.index((str(copy), str(PACKAGE)))
    assert (str(copy), str(PACKAGE)) not in [tuple(arguments[i + 1:i + 3]) for i, word in enumerate(
        sandbox.sandboxed(["true"], writable=None)) if word == "--ro-bind"]
