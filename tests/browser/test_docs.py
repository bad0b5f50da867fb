"""The docs site (make docs) renders offline in Chromium: index, API, a notebook's figures.

Pages are opened from file:// with every other request aborted and recorded: the site
must need no network (no web fonts, no CDN; plotly.js is served by the site itself).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import nbformat
import pytest
from conftest import SCREENSHOTS, Offline
from playwright.sync_api import BrowserContext, Page

import interactive_shard

pytestmark = pytest.mark.browser

ROOT = Path(__file__).resolve().parents[2]
SITE = ROOT / "site"
NOTEBOOK = "02-ddp-bucket-maps"  # the notebook page opened from the real site
PLOTLY = "application/vnd.plotly.v1+json"
WIDGET = "application/vnd.jupyter.widget-view+json"
SOURCES = (
    "mkdocs.yml",
    "README.md",
    "CHANGELOG.md",
    "docs",
    "notebooks",
    "tools",
    "interactive_shard",
)
DRAW_TIMEOUT_MS = 30_000


def build(dest: Path) -> None:
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    command = [sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-d", str(dest)]
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
    assert done.returncode == 0, f"mkdocs build --strict failed:\n{done.stdout}{done.stderr}"


def newest_source() -> float:
    return max(
        path.stat().st_mtime
        for name in SOURCES
        for path in ([ROOT / name] if (ROOT / name).is_file() else (ROOT / name).rglob("*"))
        if path.is_file() and "__pycache__" not in path.parts
    )


@pytest.fixture(scope="module")
def site() -> Path:
    # `make test` builds site/ (make docs) just before; a run on its own rebuilds it
    # when it is missing or older than a source, so the test never reads a stale site.
    index = SITE / "index.html"
    if not index.exists() or index.stat().st_mtime < newest_source():
        build(SITE)
    return SITE


@pytest.fixture
def offline(browser: BrowserContext) -> Iterator[Offline]:
    page = Offline(browser)
    try:
        yield page
    finally:
        page.page.close()
    assert page.fetched == [], f"the site asked the network for {page.fetched}"


def drawn_figures(page: Page) -> int:
    """How many figures plotly drew, once every placeholder holds one (or the timeout)."""
    if page.locator("div.ish-figure").count():
        page.wait_for_function(
            "[...document.querySelectorAll('div.ish-figure')]"
            ".every(d => d.querySelector('svg.main-svg'))",
            timeout=DRAW_TIMEOUT_MS,
        )
    # plotly draws several main-svg layers per figure: count the figures holding one.
    return page.locator("div.ish-figure.js-plotly-plot", has=page.locator("svg.main-svg")).count()


def test_index_and_api_offline(site: Path, offline: Offline) -> None:
    page = offline.page
    page.goto((site / "index.html").as_uri())
    assert page.locator("h1").first.inner_text().rstrip("¶ \n") == "interactive_shard"
    assert page.locator("img[src='monitor.png']").evaluate("img => img.naturalWidth") > 0
    nav = page.locator("nav.md-nav--primary")
    for src in sorted((ROOT / "notebooks").glob("*.ipynb")):
        assert nav.locator(f"a[href='notebooks/{src.stem}.html']").count() == 1, src.stem
    for title in ("Architecture", "Event reference", "API reference", "Changelog"):
        assert nav.get_by_text(title, exact=True).count() >= 1, title
    SCREENSHOTS.mkdir(exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / "docs-index.png"))

    page.goto((site / "api.html").as_uri())
    for name in set(interactive_shard.__all__) - {"__version__", "listen"}:
        assert page.locator(f"[id='interactive_shard.{name}']").count() == 1, name
    assert page.locator("[id='interactive_shard.cluster.listen.listen']").count() == 1
    # The docstrings themselves are on the page, not only their names.
    assert "rank processes with an initialised process group" in page.inner_text("body")


def committed_figures(nb: nbformat.NotebookNode) -> int:
    return sum(PLOTLY in out.get("data", {}) for c in nb.cells for out in c.get("outputs", []))


def test_every_notebook_page_holds_its_figures(site: Path) -> None:
    for src in sorted((ROOT / "notebooks").glob("*.ipynb")):
        html = (site / "notebooks" / f"{src.stem}.html").read_text(encoding="utf-8")
        expected = committed_figures(nbformat.read(src, as_version=4))
        assert html.count('<div class="ish-figure"') == expected, src.stem
        assert ("assets/plotly.min.js" in html) == (expected > 0), src.stem


def test_no_page_loads_anything_from_the_network(site: Path) -> None:
    # The pages the browser tests do not open are checked by their tags.
    remote = re.compile(r"<(?:script|link|img|iframe)\b[^>]*\b(?:src|href)=[\"']?(?:https?:)?//")
    pages = sorted(site.rglob("*.html"))
    assert len(pages) >= 6
    for html in pages:
        assert not remote.search(html.read_text(encoding="utf-8")), html.relative_to(site)


def test_notebook_page_offline_shows_its_figures(site: Path, offline: Offline) -> None:
    nb = nbformat.read(ROOT / "notebooks" / f"{NOTEBOOK}.ipynb", as_version=4)
    committed = committed_figures(nb)
    assert committed >= 1  # each view of notebook 02 carries its figure
    page = offline.page
    page.goto((site / "notebooks" / f"{NOTEBOOK}.html").as_uri())
    cells = page.locator(".jp-CodeCell:not(.jp-CodeCell .jp-CodeCell)")  # mkdocs-jupyter nests two
    assert cells.count() == sum(c.cell_type == "code" for c in nb.cells)
    assert drawn_figures(page) == committed  # every committed figure, drawn
    # No widget is left to draw nothing: each view shows its figure or its summary.
    assert page.locator(f"script[type='{WIDGET}']").count() == 0
    assert page.locator(".ish-summary").count() >= committed
    assert any(url.endswith("/assets/plotly.min.js") for url in offline.loaded)
    SCREENSHOTS.mkdir(exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / f"docs-{NOTEBOOK}.png"), full_page=True)
