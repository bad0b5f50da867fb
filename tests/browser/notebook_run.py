"""One notebook run in one front end (JupyterLab or Notebook 7), and what is wrong with it.

Each front end has its own copy of the notebooks, so its kernels are its own.
`start` (open, Run All) and `finish` (wait, check) are apart so that runs can
overlap; the test runs them one after the other (see test_notebooks.py).
"""

from __future__ import annotations

import contextlib
import re
import shutil
import urllib.error
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path

import nbformat
from conftest import SCREENSHOTS
from lab_page import (
    WIDGET_ERRORS,
    RenderedOutputs,
    open_notebook,
    rendered_outputs,
    run_menu_command,
    save_screenshot,
    save_widget_screenshots,
    start_run_all,
    wait_run_finished,
    wait_widgets_settled,
)
from lab_server import LabServer
from playwright.sync_api import BrowserContext, ConsoleMessage, Page, Response
from playwright.sync_api import TimeoutError as PlaywrightTimeout

WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
OPEN_TIMEOUT_S = 90
RUN_TIMEOUT_S = 240
WIDGET_TIMEOUT_S = 60
SAVE_TIMEOUT_S = 30
SAVE_ATTEMPTS = 3
ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*m")
# A font file of the page's CSS that the server's static handler refuses
# (403 "not in root static directory", for Notebook 7's copy of a JupyterLab
# font also with curl): text falls back to another font; no widget needs it.
FONT_REFUSED = (
    r"^Failed to load resource: the server responded with a status of 403 \(Forbidden\)"
    r" \(\S+/static/(lab|notebook)/[0-9a-f]+\.woff2\)$"
)
# Notebook 7.6.5 throws these from its own bundle (the stacks are all in
# notebook_core), before and apart from any widget: its shortcuts plugin reads
# a settings schema it never loaded (on every notebook page, one holding a
# single IntSlider too), and its file browser restorer calls a command that
# the notebook page does not register (in every run of our notebooks).
NOTEBOOK7_BENIGN_ERRORS = (
    FONT_REFUSED,
    r"^uncaught: Cannot read properties of undefined \(reading 'schema'\)$",
    r"^uncaught: Command 'filebrowser:open-path' not registered\.$",
)


@dataclass(frozen=True)
class FrontEnd:
    name: str
    folder: str  # its copy of the notebooks under the server's root: kernels apart
    page_path: str  # the URL path that opens a notebook, before the notebook's path
    query: str  # after the token
    screenshots: Path
    # Regexes of console errors the front end logs in a healthy run.
    benign_errors: tuple[str, ...] = ()

    def url(self, server: LabServer, path: str) -> str:
        quoted = urllib.parse.quote(path)
        return f"{server.url}/{self.page_path}/{quoted}?token={server.token}{self.query}"


# `reset` starts JupyterLab from an empty workspace: tabs an earlier test left
# open would reopen and start kernels of their own. Notebook 7 opens one
# document per page and keeps no workspace.
JUPYTERLAB = FrontEnd("JupyterLab", "lab", "lab/tree", "&reset", SCREENSHOTS, (FONT_REFUSED,))
NOTEBOOK7 = FrontEnd(
    "Notebook 7", "notebook7", "notebooks", "", SCREENSHOTS / "notebook7", NOTEBOOK7_BENIGN_ERRORS
)
FRONT_ENDS = (JUPYTERLAB, NOTEBOOK7)


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


def save_and_read(page: Page, server: LabServer, path: str) -> nbformat.NotebookNode:
    """Save from the File menu; once the page's save request is answered, read the file."""
    api_path = "/api/contents/" + urllib.parse.quote(path)

    def is_save(response: Response) -> bool:
        request = response.request
        return request.method == "PUT" and urllib.parse.urlsplit(request.url).path == api_path

    # On a loaded machine a menu click can be lost while the page is busy drawing
    # widgets: ask again (a second save of the same state is harmless). Waiting
    # for the page's own request, not for the file to change, reads what it saved.
    for _attempt in range(SAVE_ATTEMPTS):
        try:
            with page.expect_response(is_save, timeout=SAVE_TIMEOUT_S * 1000) as saved:
                run_menu_command(page, "File", "docmanager:save")
        except PlaywrightTimeout:
            continue
        if saved.value.ok:
            return nbformat.from_dict(server.api("GET", api_path + "?content=1")["content"])
    raise AssertionError(
        f"{path}: not saved after {SAVE_ATTEMPTS} saves of {SAVE_TIMEOUT_S} s each"
    )


def expects_error(cell: nbformat.NotebookNode) -> bool:
    # The `raises-exception` tag also keeps Run All going.
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


@dataclass
class NotebookRun:
    """`start()`, then `finish()` for the problems; `close()` always."""

    front_end: FrontEnd
    server: LabServer
    browser: BrowserContext
    name: str  # the notebook's file name
    js_errors: list[str] = field(default_factory=list)
    failed: str | None = None  # why the run did not get to the end of Run All
    page: Page | None = None

    @property
    def path(self) -> str:
        return f"{self.front_end.folder}/{self.name}"

    @property
    def screenshot(self) -> Path:
        return self.front_end.screenshots / self.name.replace(".ipynb", ".png")

    def start(self) -> None:
        self.front_end.screenshots.mkdir(parents=True, exist_ok=True)
        page = self.page = self.browser.new_page()
        # A widget whose front-end module fails to load or render leaves no text
        # on the page (at most its text/plain fallback), only a console error.
        page.on("pageerror", lambda exc: self.js_errors.append(f"uncaught: {exc.message}"))
        page.on("console", self._on_console)
        url = self.front_end.url(self.server, self.path)
        try:
            connected = lambda: self.server.kernel_connected(self.path)  # noqa: E731
            open_notebook(page, url, connected, OPEN_TIMEOUT_S)
            start_run_all(page)
        except AssertionError as exc:
            self._fail(str(exc))

    def _on_console(self, message: ConsoleMessage) -> None:
        if message.type == "error":
            # A resource that failed to load is named in the location, not the text.
            where = message.location.get("url", "") if "Failed to load" in message.text else ""
            self.js_errors.append(first_line(message.text) + (f" ({where})" if where else ""))

    def _fail(self, why: str) -> None:
        assert self.page is not None
        self.failed = why
        save_screenshot(self.page, str(self.screenshot))

    def finish(self, builds_figure: bool) -> list[str]:
        """Wait for Run All, check the page and the saved notebook; every problem found."""
        page = self.page
        assert page is not None
        if self.failed is None:
            try:
                wait_run_finished(page, RUN_TIMEOUT_S)
            except AssertionError as exc:
                self._fail(str(exc))
        if self.failed is not None:
            return [f"{self.failed} (js errors: {self.js_errors})"]
        settled = wait_widgets_settled(page, 1 if builds_figure else 0, WIDGET_TIMEOUT_S)
        rendered = rendered_outputs(page)
        save_screenshot(page, str(self.screenshot))
        try:
            saved = save_and_read(page, self.server, self.path)
        except AssertionError as exc:
            return [str(exc)]
        # After saving: scrolling widgets into view can steal the File menu's focus.
        save_widget_screenshots(page, str(self.screenshot.with_suffix("")))
        found = problems(saved, rendered, builds_figure)
        found += [
            f"browser console error: {text}"
            for text in self.js_errors
            if not any(re.search(pattern, text) for pattern in self.front_end.benign_errors)
        ]
        if not settled:
            found.append(f"widgets still loading or plots missing after {WIDGET_TIMEOUT_S} s")
        return found

    def close(self) -> None:
        if self.page is not None:
            self.page.close()
        with contextlib.suppress(OSError):  # a dead server must not hide the failure
            self.server.delete_sessions(self.path)
