"""Every notebook, opened in JupyterLab in Chromium, runs and renders its widgets.

One JupyterLab server serves a copy of notebooks/ with outputs cleared; for
each notebook a fresh page opens it, runs Run menu > Run All Cells, saves it,
and the test checks the saved cells (no errors, all executed) and the page
(every widget drawn, a plot wherever a FigureWidget is built, no "Error
displaying widget" or stuck "Loading widget"). A full-page screenshot of each
notebook goes to tests/browser/screenshots/.

Set ISH_NOTEBOOKS_DIR to test the notebooks of another folder.
"""

from __future__ import annotations

import contextlib
import re
import shutil
import time
import urllib.error
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

import nbformat
import pytest
from conftest import SCREENSHOTS
from lab_page import (
    WIDGET_ERRORS,
    RenderedOutputs,
    open_notebook,
    rendered_outputs,
    run_all,
    run_menu_command,
    save_screenshot,
    save_widget_screenshots,
    wait_widgets_settled,
)
from lab_server import LabServer
from playwright.sync_api import BrowserContext, ConsoleMessage, Page
from support import notebook_params, notebooks_dir

pytestmark = pytest.mark.browser

HERE = Path(__file__).resolve().parent
REPO_ROOT = HERE.parents[1]
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
OPEN_TIMEOUT_S = 90
RUN_TIMEOUT_S = 240
WIDGET_TIMEOUT_S = 60
SAVE_TIMEOUT_S = 30
SAVE_ATTEMPTS = 3
ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*m")
# Regexes of console errors JupyterLab logs in a healthy run (none seen so far).
BENIGN_CONSOLE_ERRORS: tuple[str, ...] = ()


def copy_with_outputs_cleared(src: Path, dst: Path) -> None:
    """The page must show what this run rendered, not outputs saved with the notebook."""
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns(".ipynb_checkpoints", "__pycache__"))
    for path in dst.glob("*.ipynb"):
        nb = nbformat.read(path, as_version=4)
        for cell in nb.cells:
            if cell.cell_type == "code":
                cell.outputs = []
                cell.execution_count = None
        nb.metadata.pop("widgets", None)
        nbformat.write(nb, path)


@pytest.fixture(scope="module")
def lab(chromium: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LabServer]:
    home = tmp_path_factory.mktemp("jupyterlab")
    root = home / "notebooks"
    copy_with_outputs_cleared(notebooks_dir(), root)
    server = LabServer(root_dir=root, home=home / "lab")
    try:
        server.start()
        yield server
    finally:
        server.stop()


def save_and_read(page: Page, server: LabServer, name: str) -> nbformat.NotebookNode:
    """Save from the File menu; return the notebook as saved."""
    api_path = "/api/contents/" + urllib.parse.quote(name)
    before = server.api("GET", api_path + "?content=0")["last_modified"]
    # On a loaded machine a menu click can be lost while the page is busy drawing
    # widgets: ask again (a second save of the same state is harmless).
    for _attempt in range(SAVE_ATTEMPTS):
        run_menu_command(page, "File", "docmanager:save")
        deadline = time.monotonic() + SAVE_TIMEOUT_S
        while time.monotonic() < deadline:
            # The server writes the file in place, so a read during the save can
            # see half a notebook (400 Bad Request): read again.
            with contextlib.suppress(urllib.error.HTTPError):
                model = server.api("GET", api_path + "?content=1")
                if model["last_modified"] != before:
                    return nbformat.from_dict(model["content"])
            time.sleep(0.5)
    raise AssertionError(
        f"{name}: not saved after {SAVE_ATTEMPTS} saves of {SAVE_TIMEOUT_S} s each"
    )


def expects_error(cell: nbformat.NotebookNode) -> bool:
    # The `raises-exception` tag also keeps JupyterLab's Run All going.
    first_line = cell.source.lstrip().split("\n", 1)[0]
    return "raises-exception" in cell.metadata.get("tags", []) or (
        "NBVAL_RAISES_EXCEPTION" in first_line
    )


def first_line(text: str) -> str:
    return text.split("\n", 1)[0]  # the stack trace below it is minified JS


def problems(saved: nbformat.NotebookNode, page: RenderedOutputs, builds_figure: bool) -> list[str]:
    """Everything wrong with one run: the saved cells first, then the page."""
    found = []
    code_cells = [(i, cell) for i, cell in enumerate(saved.cells) if cell.cell_type == "code"]
    for index, cell in code_cells:
        for output in cell.outputs:
            if output.output_type == "error" and not expects_error(cell):
                trace = ANSI_ESCAPE.sub("", "\n".join(output.traceback))
                found.append(f"cell {index} raised {output.ename}: {output.evalue}\n{trace}")
    not_run = [i for i, cell in code_cells if cell.source.strip() and cell.execution_count is None]
    if not_run:
        found.append(f"cells {not_run} did not run")
    outputs = [output for _, cell in code_cells for output in cell.outputs]
    views = sum(WIDGET_VIEW in output.get("data", {}) for output in outputs)
    # Nested widgets (an Output widget holding widgets) can add output areas.
    if not page.widget_outputs_drawn == page.widget_outputs >= views:
        found.append(
            f"{views} widget outputs saved, {page.widget_outputs} on the page, "
            f"{page.widget_outputs_drawn} of them drawn"
        )
    if builds_figure and page.plots == 0:
        found.append("a cell builds a FigureWidget, but no plot was drawn")
    found += [f"the page shows {text!r}" for text in WIDGET_ERRORS if text in page.output_text]
    return found


@pytest.mark.timeout(OPEN_TIMEOUT_S + RUN_TIMEOUT_S + WIDGET_TIMEOUT_S + 120)
@pytest.mark.parametrize("notebook", notebook_params())
def test_notebook_runs_and_renders(notebook: Path, lab: LabServer, browser: BrowserContext) -> None:
    name = notebook.name
    source = nbformat.read(lab.root_dir / name, as_version=4)
    builds_figure = any(
        "FigureWidget" in cell.source for cell in source.cells if cell.cell_type == "code"
    )
    SCREENSHOTS.mkdir(exist_ok=True)
    screenshot = str(SCREENSHOTS / f"{notebook.stem}.png")
    page = browser.new_page()
    # A widget whose front-end module fails to load or render leaves no text
    # on the page (at most its text/plain fallback), only a console error.
    js_errors: list[str] = []
    page.on("pageerror", lambda exc: js_errors.append(f"uncaught: {exc.message}"))

    def on_console(message: ConsoleMessage) -> None:
        if message.type == "error":
            js_errors.append(first_line(message.text))

    page.on("console", on_console)
    try:
        # `reset` starts from an empty workspace: tabs an earlier test left open
        # would reopen and start kernels of their own.
        url = f"{lab.url}/lab/tree/{urllib.parse.quote(name)}?reset&token={lab.token}"
        try:
            open_notebook(page, url, lambda: lab.kernel_connected(name), OPEN_TIMEOUT_S)
            run_all(page, RUN_TIMEOUT_S)
        except AssertionError as exc:
            save_screenshot(page, screenshot)
            pytest.fail(f"{name}: {exc}\nscreenshot: {screenshot}\njs errors: {js_errors}")
        settled = wait_widgets_settled(page, 1 if builds_figure else 0, WIDGET_TIMEOUT_S)
        rendered = rendered_outputs(page)
        save_screenshot(page, screenshot)
        saved = save_and_read(page, lab, name)
        # After saving: scrolling widgets into view can steal the File menu's focus.
        save_widget_screenshots(page, str(SCREENSHOTS / notebook.stem))
    finally:
        page.close()
        with contextlib.suppress(OSError):  # a dead server must not hide the failure
            lab.delete_sessions()

    found = problems(saved, rendered, builds_figure)
    found += [
        f"browser console error: {text}"
        for text in js_errors
        if not any(re.search(pattern, text) for pattern in BENIGN_CONSOLE_ERRORS)
    ]
    if not settled:
        found.append(f"widgets still loading or plots missing after {WIDGET_TIMEOUT_S} s")
    if found:
        pytest.fail(
            f"{name}:\n- " + "\n- ".join(found) + f"\nscreenshot: {screenshot}",
            pytrace=False,
        )
