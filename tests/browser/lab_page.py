"""What a user does with a notebook in JupyterLab or Notebook 7, as Playwright steps.

Selectors and command ids are JupyterLab 4's; Notebook 7 is built from the
same components (its notebook page has the same panel, toolbar, menus and
commands), so one set serves both. They are kept here so an upgrade that
renames one breaks one file.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from playwright.sync_api import Page
from playwright.sync_api import TimeoutError as PlaywrightTimeout

PANEL = ".jp-NotebookPanel"
KERNEL_IDLE = ".jp-Notebook-ExecutionIndicator[data-status='idle']"
PLOTLY_PLOT = ".js-plotly-plot .plot-container"
# ipywidgets' renderer leaves its output area without the data-mime-type that
# JupyterLab sets on every other rendered output.
WIDGET_OUTPUT = ".jp-OutputArea-output:not([data-mime-type])"
WIDGET_ERRORS = ("Error displaying widget", "Loading widget")

# True once Run All took: a cell is queued, running or done.
RUN_STARTED_JS = """
() => {
  const prompts = [...document.querySelectorAll(
    '.jp-NotebookPanel .jp-CodeCell .jp-InputPrompt')].map((el) => el.innerText);
  return prompts.length === 0 || prompts.some((p) => /[*\\d]/.test(p));
}
"""
RUN_START_TIMEOUT_S = 30

# Done when the kernel is idle and no cell is queued or running ("[*]"), and
# at least one cell ran. A failing cell stops Run All, leaving later cells
# with "[ ]", so "every cell has a number" would never come true then.
RUN_FINISHED_JS = """
() => {
  const panel = document.querySelector('.jp-NotebookPanel');
  const idle = panel && panel.querySelector(
    ".jp-Notebook-ExecutionIndicator[data-status='idle']");
  if (!idle) return false;
  const prompts = [...panel.querySelectorAll('.jp-CodeCell .jp-InputPrompt')]
    .map((el) => el.innerText);
  return prompts.length === 0
    || (!prompts.some((p) => p.includes('*')) && prompts.some((p) => /\\d/.test(p)));
}
"""

# Widgets render after their cell finished (plotly.js alone is megabytes).
WIDGETS_SETTLED_JS = """
([minPlots]) => {
  const panel = document.querySelector('.jp-NotebookPanel');
  const outputs = [...panel.querySelectorAll('.jp-OutputArea')].map((el) => el.innerText);
  if (outputs.some((text) => text.includes('Loading widget'))) return false;
  return panel.querySelectorAll('.js-plotly-plot .plot-container').length >= minPlots;
}
"""

# The notebook scrolls inside a panel, so a full-page screenshot shows only
# the viewport: scroll the panel to the top (Run All leaves it at the end) and
# return the extra height the viewport needs to show all cells.
HIDDEN_HEIGHT_JS = """
() => {
  const outer = document.querySelector('.jp-NotebookPanel .jp-WindowedPanel-outer');
  if (!outer) return 0;
  outer.scrollTop = 0;
  return Math.max(0, outer.scrollHeight - outer.clientHeight);
}
"""
MAX_SCREENSHOT_HEIGHT = 16_000


@dataclass(frozen=True)
class RenderedOutputs:
    widget_outputs: int
    widget_outputs_drawn: int
    plots: int
    output_text: str


def open_notebook(
    page: Page, url: str, kernel_connected: Callable[[], bool], timeout_s: float
) -> None:
    """Open a notebook and wait until its kernel is connected and idle.

    The toolbar shows "idle" while the notebook still has no kernel, and a Run
    All sent then is dropped (JupyterLab asks to select a kernel instead), so
    the server must first report a front end connected to the kernel: from
    then on the indicator passes "connecting" and "busy" before it is idle.
    """
    page.goto(url)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if kernel_connected() and page.locator(f"{PANEL} {KERNEL_IDLE}").count():
            return
        page.wait_for_timeout(250)
    raise AssertionError(f"kernel not connected and idle after {timeout_s} s")


def run_menu_command(page: Page, menu: str, command: str) -> None:
    page.locator(".lm-MenuBar-itemLabel", has_text=menu).first.click()
    page.locator(f"li.lm-Menu-item[data-command='{command}']").click()


def start_run_all(page: Page) -> None:
    """Run > Run All Cells; return once a cell is queued or running, not when all ran."""
    run_menu_command(page, "Run", "runmenu:run-all")
    try:
        page.wait_for_function(RUN_STARTED_JS, timeout=RUN_START_TIMEOUT_S * 1000, polling=100)
    except PlaywrightTimeout as exc:
        raise AssertionError(f"Run All started no cell within {RUN_START_TIMEOUT_S} s") from exc


def wait_run_finished(page: Page, timeout_s: float) -> None:
    try:
        page.wait_for_function(RUN_FINISHED_JS, timeout=timeout_s * 1000, polling=500)
    except PlaywrightTimeout as exc:
        raise AssertionError(f"cells still running after {timeout_s} s") from exc


def wait_widgets_settled(page: Page, min_plots: int, timeout_s: float) -> bool:
    """Wait until no widget is loading and the plots are drawn; False on timeout."""
    try:
        page.wait_for_function(
            WIDGETS_SETTLED_JS, arg=[min_plots], timeout=timeout_s * 1000, polling=500
        )
    except PlaywrightTimeout:
        return False
    return True


def rendered_outputs(page: Page) -> RenderedOutputs:
    panel = page.locator(PANEL)
    drawn = panel.locator(WIDGET_OUTPUT).evaluate_all(
        "els => els.filter((el) => el.firstElementChild"
        " && el.firstElementChild.getBoundingClientRect().height > 0).length"
    )
    return RenderedOutputs(
        widget_outputs=panel.locator(WIDGET_OUTPUT).count(),
        widget_outputs_drawn=int(drawn),
        plots=panel.locator(PLOTLY_PLOT).count(),
        output_text="\n".join(panel.locator(".jp-OutputArea").all_inner_texts()),
    )


def save_screenshot(page: Page, path: str) -> None:
    viewport = page.viewport_size or {"width": 1400, "height": 900}
    extra = int(page.evaluate(HIDDEN_HEIGHT_JS))
    height = min(viewport["height"] + extra, MAX_SCREENSHOT_HEIGHT)
    page.set_viewport_size({"width": viewport["width"], "height": height})
    page.wait_for_timeout(500)  # let JupyterLab lay the taller panel out
    page.screenshot(path=path, full_page=True)
    page.set_viewport_size(viewport)


def save_widget_screenshots(page: Page, prefix: str, limit: int = 8) -> None:
    """One picture per widget output (`<prefix>-widget<i>.png`): close-ups for docs and review."""
    for i, output in enumerate(page.locator(PANEL).locator(WIDGET_OUTPUT).all()[:limit]):
        output.scroll_into_view_if_needed()
        output.screenshot(path=f"{prefix}-widget{i}.png")
