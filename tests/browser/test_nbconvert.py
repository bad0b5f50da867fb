"""A notebook executed by nbconvert into HTML shows every view offline, as a summary.

nbconvert's HTML has no widget manager of its own: without saved widget state it drops
the widget mime and shows the next in its priority, the view's ``text/html`` summary
(``ui/fallback.py``). The test executes a notebook as a reader would
(``jupyter nbconvert --to html --execute``, real ranks) without saving widget state (as
the committed notebooks hold none; with the state, the page would fetch the widget
manager from the network to draw the widgets), opens the page in Chromium with the
network cut, and finds one summary per view the committed notebook displays, and no
empty widget box.

Every notebook runs when ISH_NBCONVERT_ALL=1; by default the bucket-map one (its
views are the most: seven, one shown as a bare ``view.widget``).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from conftest import SCREENSHOTS, Offline
from playwright.sync_api import BrowserContext
from support import notebook_params

from interactive_shard.ui.fallback import WIDGET_MIME

pytestmark = pytest.mark.browser

DEFAULT = "02-ddp-bucket-maps.ipynb"
EXECUTE_TIMEOUT_S = 900


def chosen() -> list[object]:
    params = notebook_params()
    if os.environ.get("ISH_NBCONVERT_ALL") == "1":
        return params
    return [p for p in params if getattr(p, "id", "") in (DEFAULT, "no-notebooks")] or params


def views_in(notebook: Path) -> int:
    """How many outputs of the committed notebook are widgets (views)."""
    nb = nbformat.read(notebook, as_version=4)
    return sum(
        WIDGET_MIME in out.get("data", {})
        for cell in nb.cells
        if cell.cell_type == "code"
        for out in cell.get("outputs", [])
    )


@pytest.mark.timeout(EXECUTE_TIMEOUT_S + 120)
@pytest.mark.parametrize("notebook", chosen())
def test_nbconvert_html_shows_every_view_offline(
    notebook: Path, browser: BrowserContext, tmp_path: Path
) -> None:
    expected = views_in(notebook)
    assert expected > 0, f"{notebook.name}'s committed outputs show no view"
    command = [
        *(sys.executable, "-m", "jupyter", "nbconvert", "--to", "html", "--execute"),
        "--ExecutePreprocessor.store_widget_state=False",
        f"--ExecutePreprocessor.timeout={EXECUTE_TIMEOUT_S}",
        *("--output-dir", str(tmp_path), str(notebook)),
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=EXECUTE_TIMEOUT_S)
    assert done.returncode == 0, done.stderr[-3000:]
    page_path = tmp_path / f"{notebook.stem}.html"
    assert "<script" not in _summaries(page_path.read_text())
    offline = Offline(browser)
    page = offline.page
    try:
        page.goto(page_path.as_uri())
        summaries = page.locator(".jp-OutputArea-output .ish-summary")
        summaries.first.wait_for(timeout=30_000)
        assert summaries.count() == expected, f"{summaries.count()} summaries, {expected} views"
        for i in range(expected):
            shown = summaries.nth(i)
            assert shown.is_visible() and len(shown.inner_text().splitlines()) >= 2
        # No widget box (an empty div waiting for a widget manager), no widget repr.
        assert page.locator(".jupyter-widgets").count() == 0
        assert "VBox(children" not in page.inner_text("body")
        SCREENSHOTS.mkdir(exist_ok=True)
        page.screenshot(path=str(SCREENSHOTS / f"nbconvert-{notebook.stem}.png"), full_page=True)
        summaries.first.screenshot(path=str(SCREENSHOTS / f"nbconvert-{notebook.stem}-view.png"))
    finally:
        page.close()
    # nbconvert's template asks for require.js and MathJax (blocked: the page reads
    # without them); nothing asked for a widget manager.
    fetched = offline.fetched
    assert not [url for url in fetched if "widget" in url or "unpkg" in url], fetched


def _summaries(text: str) -> str:
    """The summaries' HTML in the page (each from its div to its closing one)."""
    found, start = [], text.find('<div class="ish-summary"')
    while start >= 0:
        end = text.find("</div>", start)
        found.append(text[start:end])
        start = text.find('<div class="ish-summary"', end)
    assert found, "no view summary in the page"
    return "\n".join(found)
