"""The package's layers point down: science -> pipelines -> interface, and its imports have no cycle.

The import graph is read from the source with ``ast`` (imports at module level and inside functions
alike), so a deferred import cannot hide an arrow.
"""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "icl_course"

#: modules that compute the papers' objects
SCIENCE = ("data", "models", "memformer", "baselines", "optimizers", "theory", "spectra", "evaluate", "linalg",
           "checkpoints", "runtime")
#: modules that train, select and score (``table1.cli`` is the command, an interface); ``mixed_noise`` scores
#: the shipped Table 1 models for chapter 4, so it sits above ``table1``
PIPELINES = ("train", "trainer_core", "sweep", "table1", "shipped", "mixed_noise")
#: what the notebooks see: figures and sliders
INTERFACE = ("plots", "widgets")

#: Arrows known to break the rules, each until a named change lands; the list is emptied as they do.
KNOWN: dict = {}   # known arrows that break the layering, each with the work that removes it: none


def module_name(path: Path) -> str:
    parts = ["icl_course", *path.relative_to(PACKAGE).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict:
    """``{module name: path}`` of every module of the package (the data folder ``pretrained/`` holds none)."""
    return {module_name(path): path for path in PACKAGE.rglob("*.py")}


def imported(name: str, path: Path, known: set) -> set:
    """The package's modules that ``name`` imports anywhere in its source."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    targets = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            targets.add(base)
            # ``from . import theory`` imports a module
            targets.update(f"{base}.{alias.name}" for alias in node.names if f"{base}.{alias.name}" in known)
    arrows = set()
    for target in targets:
        if target not in known:
            continue
        arrows.add(target)
        # importing a.b.c runs the package a.b first, unless the importer is inside it
        parent = target.rpartition(".")[0]
        while parent and parent != "icl_course" and not name.startswith(parent + ".") and name != parent:
            arrows.add(parent)
            parent = parent.rpartition(".")[0]
    arrows.discard(name)
    return arrows


def import_graph() -> dict:
    known = modules()
    return {name: imported(name, path, set(known)) for name, path in known.items()}


def layer(name: str):
    short = name.removeprefix("icl_course.")
    if short == "table1.cli":
        return "interface"
    top = short.split(".")[0]
    for label, group in (("science", SCIENCE), ("pipeline", PIPELINES), ("interface", INTERFACE)):
        if top in group:
            return label
    return None


def cycles(graph: dict) -> list:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(node):
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in graph[node]:
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.add(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def without_known(graph: dict) -> dict:
    return {name: {target for target in targets if (name, target) not in KNOWN} for name, targets in graph.items()}


def test_the_graph_sees_imports_inside_functions_and_every_layer_is_populated():
    graph = import_graph()
    assert "icl_course.table1" in graph["icl_course.mixed_noise"]  # imported inside mixed_noise's functions only
    assert "icl_course.sweep" in graph["icl_course.table1.training"]
    assert "icl_course.table1" in graph["icl_course.plots"]       # plots imports table1.paper: the package runs
    for group in (SCIENCE, PIPELINES, INTERFACE):
        assert all(f"icl_course.{name}" in graph for name in group), group


def test_science_and_pipelines_never_import_the_interface():
    graph = without_known(import_graph())
    wrong = sorted((name, target) for name, targets in graph.items() if layer(name) in ("science", "pipeline")
                   for target in targets if layer(target) == "interface")
    assert not wrong, f"science or pipeline modules import plots/widgets: {wrong}"


def test_science_never_imports_a_pipeline():
    graph = without_known(import_graph())
    wrong = sorted((name, target) for name, targets in graph.items() if layer(name) == "science"
                   for target in targets if layer(target) == "pipeline")
    assert not wrong, f"science modules import pipeline modules: {wrong}"


def test_the_import_graph_has_no_cycle():
    assert cycles(without_known(import_graph())) == []


def test_every_known_exception_is_still_an_arrow_of_the_graph():
    """An exception whose arrow is gone must leave the list, so the list only ever shrinks."""
    graph = import_graph()
    assert [arrow for arrow in KNOWN if arrow[1] not in graph[arrow[0]]] == []


def test_the_cycle_finder_finds_a_cycle_and_only_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_function_of_the_pipelines_is_over_80_lines():
    long = []
    for name, path in modules().items():
        if layer(name) != "pipeline":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno >= 80:
                long.append(f"{name}.{node.name} ({node.end_lineno - node.lineno + 1} lines)")
    assert not long, f"split these into named functions: {long}"
