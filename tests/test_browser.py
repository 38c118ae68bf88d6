"""The chapters in a real browser: JupyterLab, every cell run, every slider moved.

Playwright drives a Chromium that is already on the machine (nothing is downloaded): the one named
by ``ICL_COURSE_CHROMIUM``, else ``chromium``, ``chromium-browser``, ``google-chrome`` or
``google-chrome-stable`` on the PATH.  JupyterLab runs with the learners' configuration
(``make lab``), on a free port with a token.  For each chapter the test runs all cells, then for each
interactive widget moves every slider with the keyboard and types a value into one box, and checks
that the figure was redrawn, that no cell failed and that the browser logged no error.  Screenshots
of failures and the redraw times go to ``build/browser/``.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.request

import pytest
from conftest import ROOT

try:
    from playwright.sync_api import TimeoutError as PlaywrightTimeout
except ImportError:  # the tests skip; see _missing()
    PlaywrightTimeout = TimeoutError

pytestmark = pytest.mark.slow

CHAPTERS = sorted((ROOT / "chapters").glob("*.ipynb"))
ARTIFACTS = ROOT / "build" / "browser"
BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
# the machine may have no network: JupyterLab's news and extension listings fail to load, harmlessly
HARMLESS_CONSOLE = ("net::ERR_NAME_NOT_RESOLVED", "net::ERR_INTERNET_DISCONNECTED", "net::ERR_CONNECTION_REFUSED")


def find_chromium() -> str | None:
    named = os.environ.get("ICL_COURSE_CHROMIUM")
    if named:
        return named if os.access(named, os.X_OK) else None
    return next((path for path in map(shutil.which, BROWSERS) if path), None)


def _missing() -> str | None:
    try:
        import playwright  # noqa: F401
    except ImportError:
        return "Playwright for Python is not installed (pip install playwright; no browser download is needed)"
    if find_chromium() is None:
        return ("no Chromium found: install it (Debian: apt-get install chromium) or set ICL_COURSE_CHROMIUM "
                f"to its path; looked for {', '.join(BROWSERS)} on the PATH")
    return None


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """A JupyterLab server with the learners' configuration, serving a copy of the chapters (JupyterLab
    saves the notebooks it runs, and a test must leave the repository as it found it); yields its base
    URL and token."""
    missing = _missing()
    if missing:
        pytest.skip(missing)
    before = {path.name: path.read_bytes() for path in CHAPTERS}
    served = tmp_path_factory.mktemp("course")
    shutil.copytree(ROOT / "chapters", served / "chapters")
    shutil.copy(ROOT / "NOTATION.md", served / "NOTATION.md")
    configuration = served / "jupyter-learner"
    shutil.copytree(ROOT / "config" / "jupyter-learner", configuration,
                    ignore=shutil.ignore_patterns("lab", "migrated"))
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    token = secrets.token_hex(16)
    environment = dict(os.environ, JUPYTER_CONFIG_DIR=str(configuration))
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    log = open(ARTIFACTS / "jupyterlab.log", "w")
    server = subprocess.Popen(
        [sys.executable, "-m", "jupyter", "lab", "--no-browser", "--ip=127.0.0.1", f"--port={port}",
         f"--ServerApp.token={token}", f"--ServerApp.root_dir={served}", "--allow-root"],
        env=environment, stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(240):
            try:
                urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=1)
                break
            except OSError:
                if server.poll() is not None:
                    pytest.fail(f"JupyterLab exited: see {ARTIFACTS / 'jupyterlab.log'}")
                time.sleep(0.5)
        yield base, token
    finally:
        server.terminate()
        server.wait(timeout=30)
        log.close()
    assert {path.name: path.read_bytes() for path in CHAPTERS} == before, "the repository's chapters changed"


@pytest.fixture(scope="module")
def browser(lab):
    from playwright.sync_api import sync_playwright
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(
            executable_path=find_chromium(),
            args=["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                  "--no-first-run", "--disable-sync", "--disable-quic"])
        yield chromium
        chromium.close()


ALL_RUN = """() => {
    const panel = Array.from(document.querySelectorAll('.jp-NotebookPanel')).find(p => p.offsetParent !== null);
    const prompts = panel ? Array.from(panel.querySelectorAll('.jp-InputArea-prompt')) : [];
    return prompts.length > 0 && !prompts.some(p => p.textContent.includes('*'))
        && prompts.some(p => /\\[\\d+\\]/.test(p.textContent));
}"""
# aria-valuetext, not aria-valuenow: noUiSlider rounds aria-valuenow to one decimal, so a step of 0.05
# from 1.10 to 1.15 leaves it at "1.1" and a press that moved the slider would look lost
MOVED = "([handle, before]) => handle.getAttribute('aria-valuetext') !== before"
REDRAWN = """([box, before]) => {
    const image = box.querySelector('.jp-OutputArea img');
    return image !== null && image.getAttribute('src') !== before;
}"""


def _accept_kernel_dialog(page) -> None:
    """A fresh JupyterLab may ask which kernel to start; the notebook's own (Python 3) is preselected."""
    dialog = page.locator(".jp-Dialog:has-text('Select Kernel')")
    try:
        dialog.wait_for(state="visible", timeout=5_000)
    except Exception:   # no dialog: the kernel started by itself
        return
    dialog.locator("button.jp-mod-accept").click()


def _figure(box) -> str | None:
    image = box.locator(".jp-OutputArea img")
    return image.first.get_attribute("src") if image.count() else None


def _redraw_seconds(page, box, act) -> float:
    """Run ``act`` and return the seconds until the widget's figure changes."""
    before = _figure(box)
    start = time.monotonic()
    act()
    page.wait_for_function(REDRAWN, arg=[box.element_handle(), before], timeout=120_000)
    return time.monotonic() - start


def _press(page, handle, key: str) -> None:
    """Press ``key`` on a slider handle until the slider's value moves.

    A key press can be lost while JupyterLab is still laying out the cell's output (focus lands
    before the handle is ready); pressing again is what a learner would do.  A slider that never
    moves fails here, with its value, rather than as a figure that never redraws.
    """
    before = handle.get_attribute("aria-valuetext")
    for _ in range(5):
        handle.focus()
        page.keyboard.press(key)
        try:
            page.wait_for_function(MOVED, arg=[handle.element_handle(), before], timeout=5_000)
            return
        except PlaywrightTimeout:
            continue
    raise AssertionError(f"{key} did not move the slider from {before} "
                         f"(range {handle.get_attribute('aria-valuemin')}-{handle.get_attribute('aria-valuemax')})")


def _settle(page, box) -> None:
    """Wait until the kernel is idle and the widget's figure has stayed the same for two seconds, so
    that a redraw measured next is caused by the test's own move."""
    page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle']", timeout=600_000)
    shown, since = _figure(box), time.monotonic()
    while time.monotonic() - since < 2:
        page.wait_for_timeout(250)
        if _figure(box) != shown:
            shown, since = _figure(box), time.monotonic()


@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda path: path.stem)
def test_every_slider_of_every_chapter_redraws_its_figure(lab, browser, chapter):
    base, token = lab
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    console = []
    page.on("console", lambda message: console.append(message.text) if message.type == "error" else None)
    timings = {}
    try:
        # ?reset: a fresh workspace, without the tabs a previous test left open
        page.goto(f"{base}/lab/tree/chapters/{chapter.name}?reset&token={token}")
        page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=120_000)
        _accept_kernel_dialog(page)
        page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle']", timeout=120_000)
        page.click("div.lm-MenuBar-itemLabel:text-is('Run')")
        page.click("li.lm-Menu-item:has-text('Run All Cells')")
        page.wait_for_timeout(1000)
        page.wait_for_function(ALL_RUN, timeout=600_000)
        notebook = page.locator(".jp-NotebookPanel:visible")
        assert notebook.count() == 1
        errors = notebook.locator(".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']")
        assert errors.count() == 0, f"a cell wrote to stderr or failed: {errors.first.inner_text()[:500]}"
        interacts = notebook.locator(".widget-interact")
        assert interacts.count() >= 1, "every chapter has at least one widget"
        for index in range(interacts.count()):
            box = interacts.nth(index)
            box.scroll_into_view_if_needed()
            assert _figure(box) is not None, f"widget {index} shows no figure after running all cells"
            _settle(page, box)
            handles = box.locator(".noUi-handle")
            assert handles.count() >= 1
            for slider in range(handles.count()):
                def move(handle=handles.nth(slider)):
                    value, top = (float(handle.get_attribute(name)) for name in ("aria-valuetext", "aria-valuemax"))
                    at_end = value >= top
                    _press(page, handle, "ArrowLeft" if at_end else "ArrowRight")
                timings[f"widget {index}, slider {slider} (keyboard)"] = _redraw_seconds(page, box, move)
            # typing: step the first slider back (its figure redraws), note the value, step forward
            # again, then type the noted value into the box
            readout = box.locator(".widget-readout").first

            def step(key):
                _press(page, handles.first, key)
            _redraw_seconds(page, box, lambda: step("ArrowLeft"))
            shown = readout.inner_text().strip()
            _redraw_seconds(page, box, lambda: step("ArrowRight"))

            def type_shown(value=shown):
                readout.click()
                page.keyboard.press("Control+A")
                page.keyboard.type(value)
                page.keyboard.press("Enter")
            timings[f"widget {index}, typed value"] = _redraw_seconds(page, box, type_shown)
        assert errors.count() == 0, f"moving a widget made a cell fail: {errors.first.inner_text()[:500]}"
        course_errors = [text for text in console if not any(harmless in text for harmless in HARMLESS_CONSOLE)]
        assert not course_errors, f"the browser logged errors: {course_errors[:5]}"
    except Exception:
        page.screenshot(path=str(ARTIFACTS / f"{chapter.stem}-failure.png"), full_page=True)
        raise
    finally:
        report = ARTIFACTS / "redraw-seconds.json"
        known = json.loads(report.read_text()) if report.exists() else {}
        known[chapter.stem] = {name: round(value, 2) for name, value in timings.items()}
        report.write_text(json.dumps(known, indent=1))
        page.close()
    slowest = max(timings.values())
    print(f"{chapter.stem}: slowest redraw {slowest:.2f} s after the release")
    assert slowest < 30, f"a widget took {slowest:.1f} s to redraw: {timings}"
