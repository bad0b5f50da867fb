"""Every notebook, opened in JupyterLab and in Notebook 7 in Chromium, runs and renders its widgets.

One Jupyter server serves both front ends (with the `notebook` package
installed JupyterLab's server also serves Notebook 7's pages), each with its
own copy of notebooks/, outputs cleared. For each notebook and front end a
fresh page opens it, runs Run menu > Run All Cells, saves it, and the test
checks the saved cells (no errors, all executed) and the page (every widget
drawn, a plot wherever a FigureWidget is built, no "Error displaying widget"
or stuck "Loading widget"). Full-page screenshots go to
tests/browser/screenshots/ (JupyterLab) and screenshots/notebook7/.

The two runs of a notebook are not overlapped: tried on the loaded 2-core
machine, the server dropped a page's kernel websocket (ping timeout) and its
cells stayed "[*]".

Set ISH_NOTEBOOKS_DIR to test the notebooks of another folder.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import nbformat
import pytest
from lab_server import LabServer
from notebook_run import (
    FRONT_ENDS,
    OPEN_TIMEOUT_S,
    RUN_TIMEOUT_S,
    WIDGET_TIMEOUT_S,
    FrontEnd,
    NotebookRun,
    copy_with_outputs_cleared,
)
from playwright.sync_api import BrowserContext
from support import notebook_params, notebooks_dir

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def server(chromium: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LabServer]:
    home = tmp_path_factory.mktemp("jupyter")
    root = home / "notebooks"
    for front_end in FRONT_ENDS:
        copy_with_outputs_cleared(notebooks_dir(), root / front_end.folder)
    lab = LabServer(root_dir=root, home=home / "server")
    try:
        lab.start()
        yield lab
    finally:
        lab.stop()


@pytest.mark.timeout(OPEN_TIMEOUT_S + RUN_TIMEOUT_S + WIDGET_TIMEOUT_S + 120)
@pytest.mark.parametrize("front_end", [pytest.param(f, id=f.folder) for f in FRONT_ENDS])
@pytest.mark.parametrize("notebook", notebook_params())
def test_notebook_runs_and_renders(
    notebook: Path, front_end: FrontEnd, server: LabServer, browser: BrowserContext
) -> None:
    source = nbformat.read(notebook, as_version=4)
    builds_figure = any(
        "FigureWidget" in cell.source for cell in source.cells if cell.cell_type == "code"
    )
    run = NotebookRun(front_end, server, browser, notebook.name)
    try:
        run.start()
        found = run.finish(builds_figure)
    finally:
        run.close()
    if found:
        pytest.fail(
            f"{notebook.name} in {front_end.name}:\n- "
            + "\n- ".join(found)
            + f"\nscreenshot: {run.screenshot}",
            pytrace=False,
        )
