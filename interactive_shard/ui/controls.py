"""Plumbing the views share: headings, the rank selector, the "latest" sentinel, redrawing a
FigureWidget in one update, log-scale cap sliders."""

from __future__ import annotations

import html
import math
from collections.abc import Iterable
from typing import Any

import plotly.graph_objects as go

from interactive_shard.ui.redraw import whole

CAP_STEP = 0.25  # what-if cap sliders, in log2: four positions per doubling
LATEST = 0  # an iteration selector's value that follows the newest (iterations count from 1)


def heading(text: str) -> Any:
    """A panel's heading in a view."""
    import ipywidgets as widgets

    return widgets.HTML(f"<h4 style='margin:12px 0 4px 0'>{html.escape(text)}</h4>")


def shown_rank(chosen: int | None, ranks: list[int]) -> int:
    """The rank a view shows: the chosen one, else rank 0 (or the lowest seen, if 0 has
    not reported yet)."""
    if chosen is not None:
        return chosen
    return 0 if 0 in ranks or not ranks else ranks[0]


def rank_options(ranks: Iterable[int], shown: int) -> list[tuple[str, int]]:
    """A rank selector's options: the ranks seen so far and the one shown."""
    return [(str(r), r) for r in sorted({*ranks, shown})]


def rank_selector(ranks: Iterable[int], shown: int) -> Any:
    """The rank selector every per-rank view has."""
    import ipywidgets as widgets

    return widgets.Dropdown(description="rank", options=rank_options(ranks, shown), value=shown)


def swap_figure(target: go.FigureWidget, fig: go.Figure) -> None:
    """Replace a FigureWidget's traces and layout with ``fig``'s, as one front-end update.

    The layout is merged with ``overwrite=True`` minus its template: assigning a whole
    layout re-validates plotly's default template, which cost more than the traces.
    """
    layout = fig.layout.to_plotly_json()
    layout.pop("template", None)
    whole(target, list(fig.data), layout)


def clamp_log2(value: float, bounds: tuple[float, float]) -> float:
    """``value`` inside ``2**bounds`` (the upper end for anything not a positive number)."""
    low, high = 2.0 ** bounds[0], 2.0 ** bounds[1]
    return min(max(value, low), high) if math.isfinite(value) and value > 0 else high


def log2_grid(recorded: float, bounds: tuple[float, float]) -> tuple[float, float]:
    """Slider bounds (log2) whose grid passes through the recorded value, so that a
    browser snapping the slider to its grid leaves the recorded value where it is."""
    at = math.log2(clamp_log2(recorded, bounds))
    low = at - math.ceil((at - bounds[0]) / CAP_STEP) * CAP_STEP
    return low, low + math.ceil((bounds[1] - low) / CAP_STEP) * CAP_STEP


class Panels:
    """What the views with several panels and selectors share (a mixin of LazyWidget
    views): a panel is redrawn only when the key it was drawn for changed, and the
    selectors are updated without the view reacting to its own changes (``_quiet``,
    which the views' observers check)."""

    _quiet = False

    def _changed(self, panel: str, key: tuple[Any, ...]) -> bool:
        drawn: dict[str, Any] = self.__dict__.setdefault("_drawn", {})
        if drawn.get(panel) == key:
            return False
        drawn[panel] = key
        return True

    def _set_selectors(self, selectors: Iterable[tuple[Any, list[Any], Any]]) -> None:
        """Give each (selector, options, value) its options and value, quietly."""
        self._quiet = True
        try:
            for selector, options, value in selectors:
                if options != list(selector.options):
                    selector.options = options
                if selector.value != value:
                    selector.value = value
        finally:
            self._quiet = False
