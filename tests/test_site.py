"""The course website (``make site``) in a real browser: every page loads, math renders, figures are
there, internal links resolve, the answer keys are not published, and nothing is fetched from the
network.  Uses the same Chromium and Playwright as tests/test_browser.py."""

from __future__ import annotations

import functools
import http.server
import re
import subprocess
import sys
import threading
import urllib.error
import urllib.parse
import urllib.request

import pytest
from conftest import ROOT
from test_browser import _missing, find_chromium

pytestmark = pytest.mark.slow

SITE = ROOT / "build" / "site"
# The book theme logs its colour mode as an error, and MathJax 2 probes for a web font through
# about:blank.  Failed loads are checked by URL instead (the "Failed to load resource" lines carry none).
HARMLESS_CONSOLE = ("invalid theme mode", "about:blank", "Failed to load resource")
# The browser asks every server for a favicon; MathJax 2's combined configuration probes for its TeX
# fonts, which jupyter-server-mathjax leaves out (it typesets with the STIX-Web fonts it ships).
HARMLESS_FAILURES = ("about:blank", "/favicon.ico", "MathJax_Script-Regular.otf", "MathJax_AMS-Regular.otf")


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *arguments):
        pass


class _QuietServer(http.server.ThreadingHTTPServer):
    def handle_error(self, request, client_address):
        pass   # a browser that closes a connection early is no failure of the site


@pytest.fixture(scope="module")
def site():
    missing = _missing()
    if missing:
        pytest.skip(missing)
    build = subprocess.run([sys.executable, str(ROOT / "site" / "build.py")], capture_output=True, text=True,
                           timeout=600)
    assert build.returncode == 0, f"make site failed:\n{build.stdout[-3000:]}{build.stderr[-3000:]}"
    handler = functools.partial(_QuietHandler, directory=str(SITE))
    server = _QuietServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


@pytest.fixture(scope="module")
def browser(site):
    from playwright.sync_api import sync_playwright
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=find_chromium(),
                                              args=["--no-sandbox", "--disable-gpu", "--disable-background-networking"])
        yield chromium
        chromium.close()


def pages():
    chapters = [f"chapters/{path.stem}.html" for path in sorted((ROOT / "chapters").glob("*.ipynb"))]
    return ["index.html", "exercises.html", "notation.html", "references.html", "search.html", *chapters]


@pytest.mark.parametrize("name", pages())
def test_every_page_loads_with_its_math_figures_and_links(site, browser, name):
    page = browser.new_page()
    console, outside, failed = [], [], []
    page.on("console", lambda message: console.append(message.text) if message.type == "error" else None)
    page.on("request", lambda request: outside.append(request.url)
            if not request.url.startswith((site, "data:", "about:")) else None)
    page.on("requestfailed", lambda request: failed.append(request.url)
            if not request.url.endswith(HARMLESS_FAILURES) else None)
    page.on("response", lambda response: failed.append(f"{response.url} ({response.status})")
            if response.status >= 400 and not response.url.endswith(HARMLESS_FAILURES) else None)
    response = page.goto(f"{site}/{name}")
    assert response.status == 200
    page.wait_for_load_state("networkidle")
    if name.startswith("chapters/"):
        page.wait_for_function("() => window.MathJax && MathJax.Hub && MathJax.Hub.queue.pending === 0",
                               timeout=60_000)
        assert page.locator(".MathJax").count() >= 10, "the chapter's math was not typeset"
        # typeset math shows symbols; TeX left as source shows its backslashes (\\frac, \\langle, ...)
        raw = page.locator(".math").evaluate_all(
            "spans => spans.map(s => s.innerText).filter(text => text.includes('\\\\'))")
        assert not raw, f"math left as TeX source: {raw[:3]}"
        images = page.locator("img")
        assert images.count() >= 1, "every chapter has figures"
        widths = images.evaluate_all("images => images.map(image => image.naturalWidth)")
        assert all(width > 0 for width in widths), "an image did not load"
    links = page.locator("a[href]").evaluate_all("links => links.map(link => link.href)")
    for link in {link.split("#")[0] for link in links if link.startswith(site)}:
        try:
            assert urllib.request.urlopen(link, timeout=10).status == 200
        except urllib.error.HTTPError as error:
            pytest.fail(f"{name} links to {urllib.parse.unquote(link)}, which answers {error.code}")
    assert not outside, f"the page fetched from the network: {outside[:3]}"
    assert not failed, f"resources that did not load: {failed[:3]}"
    errors = [text for text in console if not any(harmless in text for harmless in HARMLESS_CONSOLE)]
    assert not errors, f"console errors: {errors[:3]}"
    page.close()


def test_the_site_has_search_the_launch_buttons_and_no_answer_keys(site):
    index = (SITE / "searchindex.js").read_text()
    assert "gradient" in index and "preconditioning" in index.lower()
    chapter = (SITE / "chapters" / "01_linear_attention_is_gradient_descent.html").read_text()
    assert "colab.research.google.com/github/icl-course/icl-course/blob/main/chapters/" in chapter
    published = [path.relative_to(SITE).as_posix() for path in SITE.rglob("*") if path.is_file()]
    assert not [path for path in published if "solutions" in path or "BEGIN SOLUTION" in path]
    assert not any("### BEGIN SOLUTION" in (SITE / path).read_text(errors="ignore")
                   for path in published if path.endswith((".html", ".ipynb", ".txt")))
    exercises = (SITE / "exercises.html").read_text()
    for notebook in sorted((ROOT / "exercises").glob("*.ipynb")):
        assert notebook.name in exercises
    assert re.search(r"notation", (SITE / "index.html").read_text(), re.IGNORECASE)
