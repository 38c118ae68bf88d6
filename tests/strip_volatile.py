"""Remove per-run metadata (execution timestamps) from notebooks, in place: ``make notebooks`` runs it.

Usage: python tests/strip_volatile.py NOTEBOOK...
"""

import sys

import nbformat


def strip(path: str) -> bool:
    notebook = nbformat.read(path, as_version=4)
    changed = False
    for cell in notebook.cells:
        if "execution" in cell.metadata:
            del cell.metadata["execution"]
            changed = True
    if changed:
        nbformat.write(notebook, path)
    return changed


if __name__ == "__main__":
    for argument in sys.argv[1:]:
        if strip(argument):
            print(f"stripped {argument}")
