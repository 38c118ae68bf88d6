"""Build the course website into ``build/site`` (``make site``).

The chapters, the notation card and the references are copied into a scratch source folder beside
this configuration, the exercises page is written from the notebooks in ``exercises/`` (answer keys
are never published), and Sphinx renders it all.  Nothing is executed and nothing is downloaded.

``python site/build.py --serve`` (``make serve-site``) builds and then serves the site on
http://127.0.0.1:8000 until Ctrl-C.  The pages also read from files, but under ``file://`` a browser
refuses the fetches with which the search page finds each hit's snippet; over a local server search
shows them.
"""

import argparse
import functools
import http.server
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / "build" / "site-source"
OUTPUT = ROOT / "build" / "site"
COLAB = "https://colab.research.google.com/github/icl-course/icl-course/blob/main"


def title(notebook: Path) -> str:
    cells = json.loads(notebook.read_text())["cells"]
    first = "".join(cells[0]["source"]).splitlines()[0] if cells else notebook.stem
    return first.lstrip("# ").strip()


def rewrite_links(text: str) -> str:
    """Links that work in the repository, made to work on the site: exercises open in Colab, the
    notation card and the references are pages of the site."""
    # the badge is an image on Colab's server; the site's own launch button and a plain link do without it
    text = re.sub(r"\[!\[Open In Colab\]\([^)]*\)\]\(([^)]*)\)", r"[Open in Colab](\1)", text)
    text = re.sub(r"\]\(\.\./exercises/([^)]+\.ipynb)\)", lambda match: f"]({COLAB}/exercises/{match.group(1)})", text)
    return text.replace("](../NOTATION.md)", "](../notation.md)").replace("](../REFERENCES.md)", "](../references.md)")


def copy_chapter(notebook: Path, target: Path) -> None:
    content = json.loads(notebook.read_text())
    for cell in content["cells"]:
        if cell["cell_type"] == "markdown":
            cell["source"] = rewrite_links("".join(cell["source"]))
    target.write_text(json.dumps(content))


def exercises_page() -> str:
    rows = [f"| {title(path)} | [{path.name}]({COLAB}/exercises/{path.name}) |"
            for path in sorted((ROOT / "exercises").glob("*.ipynb"))]
    return "\n".join([
        "# Exercises", "",
        "Each chapter from chapter 1 on has an exercise notebook with graded tasks; every task has a",
        "self-check cell that says what is wrong. Open one in Colab, or find it in the repository's",
        "`exercises/` folder.", "",
        "| exercise | notebook |", "| --- | --- |", *rows, "",
        "The answer keys are for instructors and are not part of this site.", ""])


def serve(port: int) -> None:
    """Serve build/site on localhost only (nobody else on the network sees it) until Ctrl-C."""
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(OUTPUT))
    with http.server.ThreadingHTTPServer(("127.0.0.1", port), handler) as server:
        print(f"serving the site at http://127.0.0.1:{server.server_address[1]}/ (Ctrl-C stops it)", flush=True)
        try:
            server.serve_forever()
        except KeyboardInterrupt:
            pass


def main(arguments: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--serve", action="store_true", help="after building, serve the site on localhost")
    parser.add_argument("--port", type=int, default=8000, help="the port to serve on (default 8000; 0: any free one)")
    options = parser.parse_args(arguments)
    shutil.rmtree(SOURCE, ignore_errors=True)
    (SOURCE / "chapters").mkdir(parents=True)
    for name in ("conf.py", "index.md", "favicon.svg"):
        shutil.copy(Path(__file__).parent / name, SOURCE / name)
    for notebook in sorted((ROOT / "chapters").glob("*.ipynb")):
        copy_chapter(notebook, SOURCE / "chapters" / notebook.name)
    shutil.copy(ROOT / "NOTATION.md", SOURCE / "notation.md")
    shutil.copy(ROOT / "REFERENCES.md", SOURCE / "references.md")
    (SOURCE / "exercises.md").write_text(exercises_page())
    command = [sys.executable, "-m", "sphinx", "-b", "html", "-q", "-W", "--keep-going", str(SOURCE), str(OUTPUT)]
    result = subprocess.run(command)
    if result.returncode != 0:
        return result.returncode
    if options.serve:
        serve(options.port)
    else:
        print(f"the site is in {OUTPUT}; open {OUTPUT / 'index.html'} in a browser, or run "
              "`make serve-site` for a local server (search shows its snippets only there)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
