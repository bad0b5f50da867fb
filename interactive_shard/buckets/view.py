"""BucketMapView: the bucket map widget (iteration, rank, what-if cap, health, figures).

Thin: all state worth testing lives in ``BucketMap`` and in the pure figures of
``figures.py`` / ``figures_timeline.py``; this file wires widgets to them. Every redraw
builds the figures from the model as it is now and swaps them into the FigureWidgets
inside ``batch_update()``; ``ui.live`` calls ``refresh()`` at most 10 times a second
while ranks run.
"""

from __future__ import annotations

import html
import math
from typing import Any

import ipywidgets as widgets
import plotly.graph_objects as go

from interactive_shard.buckets.analysis import Finding
from interactive_shard.buckets.figures import figure_bucket_map
from interactive_shard.buckets.figures_timeline import (
    figure_bucket_timeline,
    figure_health,
    report_figures,
)
from interactive_shard.buckets.model import BucketMap
from interactive_shard.ui import live
from interactive_shard.ui.controls import CAP_STEP, clamp_log2, log2_grid, swap_figure

__all__ = [
    "BucketMapView",
    "figure_bucket_map",
    "figure_bucket_timeline",
    "figure_health",
    "report_figures",
]

LATEST = 0  # iteration selector value that follows the newest iteration
CAP_LOG2 = (-14.0, 9.0)  # what-if slider: 64 B .. 512 MiB, in MiB on a log2 scale
MAX_FINDINGS = 20  # listed in the widget; all are in BucketMap.health


class BucketMapView(live.LazyWidget):
    """Live view of a ``BucketMap``; ``widget`` is built on first use.

    State first: ``iteration`` (None follows the latest), ``rank`` and the what-if
    ``cap_mb`` (None: the recorded DDP settings) can be given here, before any widget
    exists. Once ``widget`` is built, the controls hold that state: set
    ``iteration_selector.value``, ``rank_selector.value`` or ``cap_slider.value``, click
    ``reset_button``, then read ``map_figure`` / ``timeline_figure`` / ``health_html``.
    """

    def __init__(
        self,
        bucket_map: BucketMap,
        *,
        iteration: int | None = None,
        rank: int | None = None,
        cap_mb: float | None = None,
    ) -> None:
        self.model = bucket_map
        self.chosen_iteration = iteration or LATEST
        self.chosen_rank = rank
        self.cap_mb = cap_mb
        self._widget: widgets.VBox | None = None
        self._drawn: tuple[Any, ...] | None = None
        self._quiet = False  # set while the view itself moves a control

    # -- state (no widgets) ----------------------------------------------------------------
    @property
    def iteration(self) -> int | None:
        """The iteration shown: the selected one, or the latest."""
        return self.chosen_iteration if self.chosen_iteration != LATEST else self.model.latest

    @property
    def rank(self) -> int:
        if self.chosen_rank is not None:
            return self.chosen_rank
        ranks = self.model.ranks
        return 0 if 0 in ranks or not ranks else ranks[0]

    @property
    def what_if(self) -> dict[str, Any]:
        return {} if self.cap_mb is None else {"bucket_cap_mb": self.cap_mb}

    def _iteration_options(self) -> list[tuple[str, int]]:
        try:
            plan = self.model.plan()
            rebuilt_from = plan.rebuilt_from_iteration
        except (LookupError, ValueError, TypeError):
            rebuilt_from = None
        options = [("latest", LATEST)]
        iterations = set(self.model.iterations) | {self.chosen_iteration} - {LATEST}
        for it in sorted(iterations):
            note = " · initial buckets" if it == 1 else ""
            note += " · rebuilt" if it == rebuilt_from else ""
            options.append((f"{it}{note}", it))
        return options

    def _rank_options(self) -> list[tuple[str, int]]:
        return [(str(r), r) for r in sorted({*self.model.ranks, self.rank})]

    def _status(self) -> str:
        info = self.model.info
        if info is None:
            return "<i>Waiting for <code>ish.watch(ddp)</code> on the ranks…</i>"
        # The probe reports caps as bytes / 2**20: print 0.02, not 0.01999950408935547.
        if info.bucket_cap_mb_list:
            caps = f"bucket_cap_mb_list=[{', '.join(f'{c:.3g}' for c in info.bucket_cap_mb_list)}]"
        elif info.bucket_cap_mb is None:
            caps = "bucket_cap_mb=default (25)"
        else:
            caps = f"bucket_cap_mb={info.bucket_cap_mb:.3g}"
        flags = (
            f"find_unused_parameters={info.find_unused_parameters}, "
            f"static_graph={info.static_graph}"
        )
        what_if = f" · <b>what if bucket_cap_mb={self.cap_mb:.4g}</b>" if self.cap_mb else ""
        delayed = ""
        if info.delayed is not None:
            hook = f" at {html.escape(info.delayed.hook)}'s hook" if info.delayed.hook else ""
            delayed = f" + {len(info.delayed.fqns)} delayed (in no bucket, all-reduced{hook})"
        return (
            f"<b>{len(info.fqns)} parameters</b>{delayed} · DDP {caps}, {flags} · world size "
            f"{info.world_size} · ready order {html.escape(self.model.ready_order_source())}"
            f"{what_if}"
        )

    def _health(self) -> str:
        findings = self.model.health
        if not findings:
            return "<b>Health:</b> no findings."
        # The same finding every iteration (an unused head) is listed once, with its span.
        groups: dict[tuple[Any, ...], list[Finding]] = {}
        for f in findings:
            groups.setdefault((f.kind, tuple(f.ranks), tuple(f.fqns)), []).append(f)
        items = []
        for same in list(groups.values())[:MAX_FINDINGS]:
            its = [f.iteration for f in same]
            span = f"iteration {its[0]}" if len(its) == 1 else f"iterations {_span(its)}"
            items.append(f"<li><b>{same[0].kind}</b> ({span}): {html.escape(same[0].message)}</li>")
        more = len(groups) - MAX_FINDINGS
        tail = f"<li>… {more} more: see <code>run.buckets.health</code></li>" if more > 0 else ""
        return f"<b>Health: {len(findings)} finding(s)</b><ul>{''.join(items)}{tail}</ul>"

    # -- widgets ---------------------------------------------------------------------------
    def _build(self) -> None:
        self.model.update()
        recorded = self._recorded_cap()
        low, high = log2_grid(recorded, CAP_LOG2)
        self.iteration_selector = widgets.Dropdown(
            description="iteration", options=self._iteration_options(), value=self.chosen_iteration
        )
        self.rank_selector = widgets.Dropdown(
            description="rank", options=self._rank_options(), value=self.rank
        )
        self.cap_slider = widgets.FloatLogSlider(
            value=clamp_log2(self.cap_mb, CAP_LOG2) if self.cap_mb is not None else recorded,
            base=2,
            min=low,
            max=high,
            step=CAP_STEP,
            readout_format=".3g",
            description="what-if cap (MiB)",
            style={"description_width": "initial"},
            layout={"width": "420px"},
        )
        self.reset_button = widgets.Button(description="recorded settings", icon="undo")
        self.status_html = widgets.HTML()
        self.health_html = widgets.HTML()
        self.map_figure = go.FigureWidget()
        self.timeline_figure = go.FigureWidget()
        self.iteration_selector.observe(self._on_control, names="value")
        self.rank_selector.observe(self._on_control, names="value")
        self.cap_slider.observe(self._on_cap, names="value")
        self.reset_button.on_click(self._on_reset)
        controls = widgets.HBox([self.iteration_selector, self.rank_selector])
        what_if = widgets.HBox([self.cap_slider, self.reset_button])
        self._widget = widgets.VBox(
            [
                self.status_html,
                controls,
                what_if,
                self.map_figure,
                self.timeline_figure,
                self.health_html,
            ]
        )
        self.refresh()

    def _on_control(self, _change: dict[str, Any]) -> None:
        if not self._quiet:
            self.chosen_iteration = self.iteration_selector.value
            self.chosen_rank = self.rank_selector.value
            self.refresh()

    def _on_cap(self, change: dict[str, Any]) -> None:
        if self._quiet:
            return
        new = float(change["new"])
        shown = (
            clamp_log2(self.cap_mb, CAP_LOG2) if self.cap_mb is not None else self._recorded_cap()
        )
        # A browser snaps the value to the slider's grid and sends it back: a move within
        # half a step is that snap, not the user's choice (it would turn the what-if on).
        if abs(math.log2(new) - math.log2(shown)) < CAP_STEP / 2:
            return
        self.cap_mb = new
        self.refresh()

    def _recorded_cap(self) -> float:
        info = self.model.info
        return clamp_log2(info.cap_mb if info is not None else 25.0, CAP_LOG2)

    def _on_reset(self, _button: widgets.Button | None = None) -> None:
        self.cap_mb = None
        self._quiet = True
        try:
            self.cap_slider.value = self._recorded_cap()
        finally:
            self._quiet = False
        self.refresh()

    def refresh(self) -> None:
        """Bring controls and figures up to date with the model (cheap when nothing changed)."""
        if self._widget is None:
            return
        self.model.update()
        self._quiet = True
        try:  # new iterations and ranks appear while the run goes on
            options = self._iteration_options()
            if options != list(self.iteration_selector.options):
                self.iteration_selector.options = options
                self.iteration_selector.value = self.chosen_iteration
            ranks = self._rank_options()
            if ranks != list(self.rank_selector.options):
                self.rank_selector.options = ranks
                self.rank_selector.value = self.rank
        finally:
            self._quiet = False
        iteration = self.iteration
        key = (self.model.revision, iteration, self.rank)
        if (*key, self.cap_mb) == self._drawn:
            return
        data_changed = self._drawn is None or key != self._drawn[:3]
        self._drawn = (*key, self.cap_mb)
        self.status_html.value = self._status()
        self.health_html.value = self._health()
        if iteration is None:
            swap_figure(
                self.map_figure, go.Figure(layout={"title": {"text": "No bucket data yet"}})
            )
            return
        swap_figure(
            self.map_figure,
            figure_bucket_map(self.model, iteration, self.rank, what_if=self.what_if),
        )
        if data_changed:  # the timeline does not depend on the what-if cap
            swap_figure(
                self.timeline_figure, figure_bucket_timeline(self.model, iteration, self.rank)
            )


def _span(iterations: list[int]) -> str:
    """[1, 2, 3, 7] -> "1-3, 7"."""
    runs: list[list[int]] = []
    for it in iterations:
        if runs and it == runs[-1][-1] + 1:
            runs[-1].append(it)
        else:
            runs.append([it])
    return ", ".join(f"{r[0]}-{r[-1]}" if len(r) > 1 else str(r[0]) for r in runs)
