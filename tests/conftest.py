import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))  # for tests/reference.py

ROOT = Path(__file__).resolve().parents[1]


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
