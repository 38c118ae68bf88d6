"""A copy of the ``icl_course`` package without the answers to the tasks being graded.

The sandbox (:mod:`icl_course.grading.sandbox`) mounts this copy, read-only, at the very path of the
real package folder, so that every way a submission could reach a reference function, ``import``,
``inspect.getsource``, ``open`` on the ``.py`` file or the compiled ``__pycache__``, finds the copy.
In the copy, the body of every *withheld* function is replaced by a ``raise RuntimeError`` that says
why; classes keep their name and bases (``isinstance`` and subclasses still work) but every method,
``__init__`` included, raises the same way.  What is withheld (:func:`withheld_names`):

* the ``giveaways`` of the graded checks that are functions, classes or methods defined in the
  package (``gd_construction``, ``LinearSelfAttention``, ``from_matrices``); module names such as
  ``theory`` are left alone, their other functions are the course's tools, not answers;
* the catalogues' reference code (``reference_diag_layer``, ``_best_step_size_reference``): under
  grading the kernel never verifies anything (:func:`icl_course.grading.protocol.record` only runs the
  learner's function on inputs that the grader wrote), so nothing inside it needs them.

Everything else is copied as it is: the exercise notebooks' locked cells (``RegressionTasks``,
``checks.record``, ``checks.progress``) work as before.  A rewritten file loses its comments
(:func:`ast.unparse`), which may explain a withheld function as well as its body does.
"""

from __future__ import annotations

import ast
import compileall
import re
import shutil
from pathlib import Path

__all__ = ["withheld_names", "defined_names", "strip_package", "UNAVAILABLE"]

# what a withheld function raises: "<name> is not available while your work is graded: ..."
UNAVAILABLE = ("{name} is not available while your work is graded: the grader withholds the package's own "
               "answer to the tasks being graded, so write this part yourself")
_CATALOGUE = re.compile(r"chapter\d+\.py")
_REFERENCE = re.compile(r"^reference_|_reference$")


def _definitions(tree: ast.Module):
    """The module's top-level functions and classes, and the methods in its classes' bodies."""
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            yield node
        if isinstance(node, ast.ClassDef):
            yield from (item for item in node.body if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)))


def defined_names(package: Path) -> set[str]:
    """Every function, class and method name that the package's modules define."""
    names = set()
    for path in Path(package).rglob("*.py"):
        names.update(node.name for node in _definitions(ast.parse(path.read_text(encoding="utf-8"))))
    return names


def withheld_names(checks, package: Path) -> set[str]:
    """The giveaways of ``checks`` that the package defines as functions, classes or methods."""
    giveaways = {name for check in checks for name in check.giveaways}
    return giveaways & defined_names(package)


def _stub_body(name: str) -> list[ast.stmt]:
    message = ast.Constant(UNAVAILABLE.format(name=name))
    return [ast.Raise(exc=ast.Call(func=ast.Name("RuntimeError", ast.Load()), args=[message], keywords=[]),
                      cause=None)]


def _stub_function(node: ast.FunctionDef | ast.AsyncFunctionDef, name: str) -> None:
    node.body = _stub_body(name)   # the docstring goes too: it may state the answer


def _stub_class(node: ast.ClassDef) -> None:
    """Every method of the class raises; an ``__init__`` that raises is added where there is none, so
    that neither the class nor a dataclass's generated ``__init__`` makes instances."""
    methods = [item for item in node.body if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef))]
    for method in methods:
        _stub_function(method, f"{node.name}.{method.name}")
    if not any(method.name == "__init__" for method in methods):
        constructor = ast.parse("def __init__(self, *args, **kwargs):\n    pass\n").body[0]
        constructor.body = _stub_body(node.name)
        node.body.append(constructor)
    docstring = ast.get_docstring(node, clean=False)
    if docstring is not None:
        node.body = node.body[1:]
    node.body = node.body or [ast.Pass()]


def strip_source(source: str, names: set[str], catalogue: bool = False) -> str | None:
    """``source`` with the definitions called ``names`` (and, in a catalogue, its reference functions)
    made to raise; None when the module defines none of them."""
    tree = ast.parse(source)
    changed = False
    for node in list(_definitions(tree)):
        withheld = node.name in names or (catalogue and _REFERENCE.search(node.name) is not None)
        if not withheld:
            continue
        if isinstance(node, ast.ClassDef):
            _stub_class(node)
        else:
            _stub_function(node, node.name)
        changed = True
    return ast.unparse(ast.fix_missing_locations(tree)) + "\n" if changed else None


def strip_package(package: Path, target: Path, names: set[str]) -> Path:
    """Copy ``package`` to ``target`` (which must not exist) with ``names`` withheld; returns ``target``.

    ``__pycache__`` is never copied (compiled code holds the full functions); the copy is compiled
    afresh, from its own sources, so that the kernel's imports stay fast on a read-only mount.
    """
    package, target = Path(package), Path(target)
    shutil.copytree(package, target, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    for path in sorted(target.rglob("*.py")):
        catalogue = path.parent.name == "grading" and _CATALOGUE.fullmatch(path.name) is not None
        stripped = strip_source(path.read_text(encoding="utf-8"), names, catalogue)
        if stripped is not None:
            path.write_text(stripped, encoding="utf-8")
    compileall.compile_dir(str(target), quiet=1)
    return target
