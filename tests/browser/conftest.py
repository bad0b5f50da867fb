"""Chromium for the browser tests: Debian's build, driven by Playwright (never its download)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import BrowserContext, Route, ViewportSize, sync_playwright

SCREENSHOTS = Path(__file__).resolve().parent / "screenshots"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_INSTALL = "apt-get install -y --no-install-recommends chromium chromium-driver"
# Flags measured to work for Debian's Chromium headless, as root, offline.
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
VIEWPORT: ViewportSize = {"width": 1400, "height": 900}


@pytest.fixture(scope="module")
def chromium() -> str:
    path = CHROMIUM if os.path.exists(CHROMIUM) else shutil.which("chromium")
    if path:
        return path
    message = f"Chromium not found at {CHROMIUM} or on PATH; install it: `{CHROMIUM_INSTALL}`"
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"{message} (CI=true, so browser tests may not be skipped)", pytrace=False)
    pytest.skip(message)


@pytest.fixture(scope="module")
def browser(chromium: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrowserContext]:
    with sync_playwright() as playwright:
        context = playwright.chromium.launch_persistent_context(
            str(tmp_path_factory.mktemp("chromium-profile")),
            executable_path=chromium,
            args=CHROMIUM_ARGS,
            headless=True,
            viewport=VIEWPORT,
        )
        try:
            yield context
        finally:
            context.close()


class Offline:
    """A page that may load file:// URLs only; any other request is aborted and kept
    (``fetched``): what a reader without network sees."""

    def __init__(self, browser: BrowserContext) -> None:
        self.fetched: list[str] = []
        self.loaded: list[str] = []
        self.page = browser.new_page()
        self.page.route("**/*", self._route)

    def _route(self, route: Route) -> None:
        url = route.request.url
        if url.startswith("file:"):
            self.loaded.append(url)
            route.continue_()
        else:
            self.fetched.append(url)
            route.abort()
