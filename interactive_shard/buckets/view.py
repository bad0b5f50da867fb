"""BucketMapView: the bucket map widget (iteration, rank, what-if cap, health, figures).

Thin: all state worth testing lives in ``BucketMap`` and in the pure figures of
``figures.py`` / ``figures_timeline.py``; this file wires widgets to them. Every redraw
builds the figures' dicts from the model as it is now and sets, inside
``batch_update()``, only what differs from what the FigureWidgets show (``_redraw.py``);
``ui.live`` calls ``refresh()`` at most 10 times a second while ranks run.

A run may have 10,000 iterations: the iteration selector is a bounded number box (0
follows the latest), not a list of every iteration, and the health list groups a
finding repeated over iterations into one line with its span.
"""

from __future__ import annotations

import html
import math
from typing import Any

import ipywidgets as widgets
import plotly.graph_objects as go

from interactive_shard.buckets.analysis import grouped, span
from interactive_shard.buckets.figures import bucket_map_spec, figure_bucket_map
from interactive_shard.buckets.figures_timeline import (
    bucket_timeline_spec,
    figure_bucket_timeline,
    figure_health,
    report_figures,
)
from interactive_shard.buckets.model import BucketMap
from interactive_shard.ui import live
from interactive_shard.ui.controls import (
    CAP_STEP,
    LATEST,
    clamp_log2,
    log2_grid,
    rank_options,
    rank_selector,
    shown_rank,
)
from interactive_shard.ui.redraw import Redrawn

__all__ = [
    "BucketMapView",
    "figure_bucket_map",
    "figure_bucket_timeline",
    "figure_health",
    "report_figures",
]

CAP_LOG2 = (-14.0, 9.0)  # what-if slider: 64 B .. 512 MiB, in MiB on a log2 scale
MAX_FINDINGS = 20  # listed in the widget; all are in BucketMap.health
# Health work per refresh with new events: a burst of 100k events holds 50k records to
# compare across ranks (~100 ms); a poller looks at the rest between ticks, and the list
# says how far it got.
HEALTH_BUDGET_S = 0.005


class BucketMapView(live.LazyWidget):
    """Live view of a ``BucketMap``; ``widget`` is built on first use.

    State first: ``iteration`` (None follows the latest), ``rank`` and the what-if
    ``cap_mb`` (None: the recorded DDP settings) can be given here, before any widget
    exists. Once ``widget`` is built, the controls hold that state: set
    ``iteration_selector.value`` (an iteration, or 0 for the latest),
    ``rank_selector.value`` or ``cap_slider.value``, click ``reset_button``, then read
    ``map_figure`` / ``timeline_figure`` / ``health_html``; ``iteration_note`` says what
    the iterations are (how many, which has the initial and the rebuilt buckets).
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
        self._health_drawn: tuple[int, bool] | None = None  # (health_revision, complete)
        self._catching_up = False  # a poller finishes the health check after a burst
        self._checked_at = -1  # the model revision the health check last went on at
        self._quiet = False  # set while the view itself moves a control

    # -- state (no widgets) ----------------------------------------------------------------
    @property
    def iteration(self) -> int | None:
        """The iteration shown: the selected one, or the latest."""
        return self.chosen_iteration if self.chosen_iteration != LATEST else self.model.newest

    @property
    def rank(self) -> int:
        return shown_rank(self.chosen_rank, self.model.known_ranks)

    @property
    def what_if(self) -> dict[str, Any]:
        return {} if self.cap_mb is None else {"bucket_cap_mb": self.cap_mb}

    def _iteration_note(self) -> str:
        """What the number box can show: 0 = the latest, and where the buckets change."""
        latest = self.model.newest
        if latest is None:
            return "0 = latest · no iteration yet"
        try:
            rebuilt_from = self.model.plan().rebuilt_from_iteration
        except (LookupError, ValueError, TypeError):
            rebuilt_from = None
        marks = ["1: initial buckets"]
        if rebuilt_from is not None:
            marks.append(f"{rebuilt_from}: rebuilt")
        return f"0 = latest ({latest:,}) · {' · '.join(marks)}"

    def _rank_options(self) -> list[tuple[str, int]]:
        return rank_options(self.model.known_ranks, self.rank)

    def _status(self) -> str:
        info = self.model.info
        if info is None:
            return "<i>Waiting for <code>ish.watch(ddp)</code> on the ranks…</i>"
        caps = info.caps_text
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

    def _health(self, complete: bool = True) -> str:
        findings = self.model.health_so_far
        progress = ""
        if not complete:
            done, total = self.model.health_checked
            progress = f" (looked at {done:,} of {total:,} iteration records so far…)"
        if not findings:
            return f"<b>Health:</b> no findings{progress}."
        # The same finding every iteration (an unused head) is listed once, with its span.
        groups = grouped(findings)
        items = []
        for first, its in groups[:MAX_FINDINGS]:
            where = f"iteration {its[0]}" if len(its) == 1 else f"iterations {span(its)}"
            items.append(f"<li><b>{first.kind}</b> ({where}): {html.escape(first.message)}</li>")
        more = len(groups) - MAX_FINDINGS
        tail = f"<li>… {more} more: see <code>run.buckets.health</code></li>" if more > 0 else ""
        return f"<b>Health: {len(findings)} finding(s)</b>{progress}<ul>{''.join(items)}{tail}</ul>"

    # -- widgets ---------------------------------------------------------------------------
    def _build(self) -> None:
        self.model.update()
        recorded = self._recorded_cap()
        low, high = log2_grid(recorded, CAP_LOG2)
        # A number box, not a Dropdown: 10,000 options are slow to send and to scroll.
        self.iteration_selector = widgets.BoundedIntText(
            description="iteration",
            min=LATEST,
            max=self._iteration_max(),
            value=self.chosen_iteration,
            layout={"width": "190px"},
        )
        self.iteration_note = widgets.HTML(self._iteration_note())
        self.rank_selector = rank_selector(self.model.known_ranks, self.rank)
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
        self._map = Redrawn(self.map_figure)
        self._timeline = Redrawn(self.timeline_figure)
        self.iteration_selector.observe(self._on_control, names="value")
        self.rank_selector.observe(self._on_control, names="value")
        self.cap_slider.observe(self._on_cap, names="value")
        self.reset_button.on_click(self._on_reset)
        controls = widgets.HBox([self.iteration_selector, self.iteration_note, self.rank_selector])
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

    def _iteration_max(self) -> int:
        return max(self.model.newest or 0, self.chosen_iteration)

    def refresh(self) -> None:
        """Bring controls and figures up to date with the model (cheap when nothing changed)."""
        if self._widget is None:
            return
        self.model.update()
        if self._checked_at != self.model.revision:  # new events: some health work now
            self._checked_at = self.model.revision
            self.model.check_health(HEALTH_BUDGET_S)
        done, total = self.model.health_checked
        complete = done == total  # else a poller goes on between ticks (_health_done)
        health = (self.model.health_revision, complete)
        if health != self._health_drawn:
            self._health_drawn = health
            self.health_html.value = self._health(complete)
        if not complete and not self._catching_up:  # a burst: finish it between ticks
            self._catching_up = True
            live.keep_polling(self._health_done)
        iteration = self.iteration
        key = (self.model.revision, iteration, self.rank)
        if (*key, self.cap_mb) == self._drawn:
            return
        data_changed = self._drawn is None or key != self._drawn[:3]
        self._drawn = (*key, self.cap_mb)
        if data_changed:  # new iterations and ranks appear while the run goes on
            self._update_controls()
        self.status_html.value = self._status()
        if iteration is None:
            self._map.draw(([], {"title": {"text": "No bucket data yet"}}))
            return
        self._map.draw(bucket_map_spec(self.model, iteration, self.rank, what_if=self.what_if))
        if data_changed:  # the timeline does not depend on the what-if cap
            self._timeline.draw(bucket_timeline_spec(self.model, iteration, self.rank))

    def _health_done(self) -> bool:
        """The poller's question, asked between ticks until it says True: one more
        budgeted step of the health check (the tick after it redraws the list)."""
        done = self.closed or self.model.check_health(HEALTH_BUDGET_S)
        self._catching_up = not done
        return done

    def _update_controls(self) -> None:
        self._quiet = True
        try:
            top = self._iteration_max()
            if self.iteration_selector.max != top:
                self.iteration_selector.max = top
            note = self._iteration_note()
            if self.iteration_note.value != note:
                self.iteration_note.value = note
            ranks = self._rank_options()
            if ranks != list(self.rank_selector.options):
                self.rank_selector.options = ranks
                self.rank_selector.value = self.rank
        finally:
            self._quiet = False
