import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))  # for tests/reference.py

ROOT = Path(__file__).resolve().parents[1]


def answer_key_functions(paths) -> dict:
    """The functions of the answer keys at ``paths``, defined by running their import and answer cells."""
    import nbformat

    namespace = {}
    for path in paths:
        for cell in nbformat.read(path, as_version=4).cells:
            if cell.metadata["nbgrader"].get("solution") or cell.source.startswith("import torch"):
                exec(cell.source, namespace)
    return namespace


def verify_on_grading_inputs(name: str, function, seed: int) -> None:
    """Run ``function`` on the check's examples and on fresh cases drawn from ``seed``; raise if one is wrong."""
    from icl_course.grading import protocol, registry

    check = registry.CHECKS[name]
    for case in check.grading_cases(seed):
        check.verify(case, protocol.portable(function(**case.arguments)))


@pytest.fixture
def float64_tasks():
    """A small float64 sampler on the CPU: the setting of every identity test."""
    from icl_course import RegressionTasks

    def make(d=4, n=9, noise=0.5, **kwargs):
        return RegressionTasks(d, n, noise, dtype=torch.float64, device="cpu", **kwargs)
    return make


SLOW_FIXTURES = {"graded_class"}   # grades a whole class with nbgrader: minutes


def pytest_collection_modifyitems(config, items):
    for item in items:
        if SLOW_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)
