"""Print the lowest versions that pyproject.toml promises, as pip requirements (torch left out).

``make test-lower-bounds`` installs them into a separate environment and runs the tests there, so
that the promise ``numpy>=1.23`` is a tested one.  torch stays at the Makefile's ``TORCH``: its
lower bound, 2.0, is published for Linux only as a CUDA build of several GB.
"""

import re
from pathlib import Path

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"


def lower_bounds(text: str) -> list[str]:
    block = re.search(r"^dependencies = \[(.*?)\]", text, re.S | re.M).group(1)
    pins = []
    for name, version in re.findall(r'"([A-Za-z0-9_.\-]+)>=([0-9.]+)"', block):
        if name != "torch":
            pins.append(f"{name}=={version}.*")
    return pins


if __name__ == "__main__":
    print(" ".join(lower_bounds(PYPROJECT.read_text())))
