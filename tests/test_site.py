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
# Failed loads are checked by URL (the console's "Failed to load resource" lines carry none).
HARMLESS_CONSOLE = ("Failed to load resource",)

# Each inline formula on a chapter page against the line it stands in: the baseline of the line is the
# top of an empty inline-block placed just before the formula (an empty inline-block's bottom margin
# edge sits on the baseline), the formula's baseline is its SVG's bottom raised by its depth (MathJax
# writes the depth as the SVG's vertical-align), and its ink is the bounding box of the drawn glyphs.
# Formulas that start a new line are left out: the marker then ends the line before.
INLINE_MATH = """() => [...document.querySelectorAll("article p span.math, article li span.math")].flatMap(span => {
    const svg = span.querySelector("mjx-container svg");
    if (!svg) return [{tex: span.textContent, typeset: false}];
    const marker = document.createElement("span");
    marker.style.cssText = "display: inline-block; width: 0; height: 0; vertical-align: baseline";
    span.before(marker);
    const line = marker.getBoundingClientRect();
    marker.remove();
    const box = svg.getBoundingClientRect();
    if (Math.abs(box.left - line.left) > 2) return [];
    const ink = svg.querySelector("g").getBoundingClientRect();
    const em = parseFloat(getComputedStyle(span.parentElement).fontSize);
    const depth = -parseFloat(getComputedStyle(svg).verticalAlign);
    return [{tex: span.textContent, typeset: true, baseline: (box.bottom - depth - line.top) / em,
             inkBottom: (ink.bottom - line.top) / em, inkTop: (line.top - ink.top) / em}];
})"""


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
    page.on("requestfailed", lambda request: failed.append(request.url))
    page.on("response", lambda response: failed.append(f"{response.url} ({response.status})")
            if response.status >= 400 else None)
    response = page.goto(f"{site}/{name}")
    assert response.status == 200
    page.wait_for_load_state("networkidle")
    if name.startswith("chapters/"):
        page.wait_for_function("() => window.MathJax && MathJax.startup && MathJax.startup.promise", timeout=60_000)
        page.evaluate("() => MathJax.startup.promise")
        assert page.locator("mjx-container").count() >= 10, "the chapter's math was not typeset"
        # typeset math shows symbols; TeX left as source shows its backslashes (\\frac, \\langle, ...)
        raw = page.locator(".math").evaluate_all(
            "spans => spans.map(s => s.innerText).filter(text => text.includes('\\\\'))")
        assert not raw, f"math left as TeX source: {raw[:3]}"
        images = page.locator("img")
        assert images.count() >= 1, "every chapter has figures"
        widths = images.evaluate_all("images => images.map(image => image.naturalWidth)")
        assert all(width > 0 for width in widths), "an image did not load"
        inline = page.evaluate(INLINE_MATH)
        assert len(inline) >= 3 and all(formula["typeset"] for formula in inline), \
            f"inline math not typeset: {[formula['tex'] for formula in inline if not formula['typeset']][:3]}"
        # on the line's baseline (to a pixel in 16), its glyphs reaching down to it (or below: subscripts, an
        # inline matrix) and up into the line: the MathJax 2 build this replaced drew them about half a
        # line higher than the words around them
        off = [formula for formula in inline if abs(formula["baseline"]) > 1 / 16
               or formula["inkBottom"] < -0.1 or formula["inkTop"] < 0.3]
        assert not off, f"inline math off the text's baseline (in em): {off[:3]}"
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


def test_search_over_the_local_server_shows_snippets(site, browser):
    """`make serve-site` serves the site so that search can fetch the pages its snippets come from."""
    page = browser.new_page()
    page.goto(f"{site}/search.html?q=preconditioner")
    # the snippets arrive one page at a time, and a page matched through the word's stem shows its opening
    # lines instead: wait for one that quotes the word itself
    page.wait_for_function("() => [...document.querySelectorAll('ul.search li p.context')]"
                           ".some(p => p.textContent.toLowerCase().includes('preconditioner'))", timeout=90_000)
    snippets = page.locator("ul.search li p.context").all_inner_texts()
    assert any("preconditioner" in snippet.lower() for snippet in snippets), snippets[:3]
    page.close()


def test_serve_site_serves_the_built_pages_on_localhost(site):
    """The server of `make serve-site` (site/build.py --serve, here on any free port and without the
    build, which the fixture did) answers on 127.0.0.1 with the built pages."""
    server = subprocess.Popen([sys.executable, "-c", "import build; build.serve(0)"], cwd=ROOT / "site",
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        announced = server.stdout.readline()
        address = re.search(r"http://127\.0\.0\.1:\d+/", announced)
        assert address, f"the server did not say where it is: {announced!r}"
        page = urllib.request.urlopen(address.group(0) + "chapters/01_linear_attention_is_gradient_descent.html",
                                      timeout=10).read().decode()
        assert "Linear attention is gradient descent" in page
    finally:
        server.terminate()
        server.wait(timeout=10)
