"""The main job's report renders offline in Chromium: every figure drawn, nothing fetched."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import SCREENSHOTS, Offline
from playwright.sync_api import BrowserContext

from interactive_shard.demo import run_demo

pytestmark = pytest.mark.browser


def test_demo_report_renders_offline(browser: BrowserContext, tmp_path: Path) -> None:
    index = run_demo(tmp_path / "demo", steps=5)
    offline = Offline(browser)  # the report must not need the network
    page = offline.page
    try:
        page.goto(index.as_uri())
        plots = page.locator(".js-plotly-plot .plot-container")
        plots.first.wait_for(timeout=30_000)
        # Scalars, bucket map of iteration 1 and of the latest, timeline, health table.
        assert plots.count() >= 5
        body = page.inner_text("body")
        sections = (
            "DDP gradient buckets",
            "graph splits",
            "Mixed precision",
            "timeline",
            "DDP lifecycle",
        )
        for section in sections:
            assert section in body, section
        SCREENSHOTS.mkdir(exist_ok=True)
        page.screenshot(path=str(SCREENSHOTS / "demo-report.png"), full_page=True)
    finally:
        page.close()
    assert offline.fetched == []
