"""BucketMapView: the bucket map widget (iteration, rank, what-if cap, health, figures), on
``ui.view_base``. A run may have 10,000 iterations: the health list groups a finding
repeated over iterations into one line with its span."""

from __future__ import annotations

import html
from typing import Any

import ipywidgets as widgets

from interactive_shard.buckets.analysis import grouped, span
from interactive_shard.buckets.figures import bucket_map_spec, figure_bucket_map
from interactive_shard.buckets.figures_timeline import (
    bucket_timeline_spec,
    figure_bucket_timeline,
    figure_health,
    report_figures,
)
from interactive_shard.buckets.model import BucketMap
from interactive_shard.ui import controls, live
from interactive_shard.ui.view_base import LATEST, PanelView

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


class BucketMapView(PanelView[BucketMap]):
    """Live view of a ``BucketMap``; ``widget`` is built on first use.

    State first: ``iteration`` (``LATEST`` follows the latest), ``rank`` and the what-if
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
        iteration: int = LATEST,
        rank: int | None = None,
        cap_mb: float | None = None,
    ) -> None:
        super().__init__(bucket_map, rank, iteration)
        self.cap_mb = cap_mb
        self._catching_up = False  # a poller finishes the health check after a burst
        self._checked_at = -1  # the model revision the health check last went on at

    # -- state (no widgets) ----------------------------------------------------------------
    @property
    def iteration(self) -> int | None:
        """The iteration shown: the selected one, or the latest."""
        return self.chosen_iteration if self.chosen_iteration != LATEST else self.model.newest

    @property
    def what_if(self) -> dict[str, Any]:
        return {} if self.cap_mb is None else {"bucket_cap_mb": self.cap_mb}

    def _ranks(self) -> list[int]:
        return self.model.known_ranks  # without indexing every bucket event

    def _newest(self) -> int | None:
        return self.model.newest

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
    def _panels(self) -> list[Any]:
        recorded = self._recorded_cap()
        given = self.cap_mb if self.cap_mb is not None else recorded
        self.cap_slider = controls.cap_slider(
            "what-if cap (MiB)", given, recorded, CAP_LOG2, "420px"
        )
        self.reset_button = widgets.Button(description="recorded settings", icon="undo")
        self.health_html = widgets.HTML()
        selectors = widgets.HBox([self._rank_selector(), *self._iteration_box("190px")])
        self.map_figure = self._figure("map")
        self.timeline_figure = self._figure("timeline")
        self._observe(self.iteration_selector, self.rank_selector)
        self.cap_slider.observe(self._on_cap, names="value")
        self.reset_button.on_click(self._on_reset)
        what_if = widgets.HBox([self.cap_slider, self.reset_button])
        return [selectors, what_if, self.map_figure, self.timeline_figure, self.health_html]

    def _on_cap(self, change: dict[str, Any]) -> None:
        shown = self.cap_mb if self.cap_mb is not None else self._recorded_cap()
        new = float(change["new"])
        if not self._quiet and not controls.snapped(new, controls.clamp_log2(shown, CAP_LOG2)):
            self.cap_mb = new
            self.refresh()

    def _recorded_cap(self) -> float:
        info = self.model.info
        return controls.clamp_log2(info.cap_mb if info is not None else 25.0, CAP_LOG2)

    def _on_reset(self, _button: widgets.Button | None = None) -> None:
        self.cap_mb = None
        with self._quietly():
            self.cap_slider.value = self._recorded_cap()
        self.refresh()

    def _redraw(self) -> None:
        if self._checked_at != self.model.revision:  # new events: some health work now
            self._checked_at = self.model.revision
            self.model.check_health(HEALTH_BUDGET_S)
        done, total = self.model.health_checked
        complete = done == total  # else a poller goes on between ticks (_health_done)
        if self._changed("health", (self.model.health_revision, complete)):
            self.health_html.value = self._health(complete)
        if not complete and not self._catching_up:  # a burst: finish it between ticks
            self._catching_up = True
            live.keep_polling(self._health_done)
        iteration = self.iteration
        data = (self.model.revision, iteration, self.rank)
        if not self._changed("map", (*data, self.cap_mb)):
            return
        self._set_status(self._status())
        if iteration is None:
            self._draw("map", ([], {"title": {"text": "No bucket data yet"}}))
            return
        self._draw("map", bucket_map_spec(self.model, iteration, self.rank, what_if=self.what_if))
        if self._changed("timeline", data):  # the timeline does not depend on the what-if cap
            self._draw("timeline", bucket_timeline_spec(self.model, iteration, self.rank))

    def _health_done(self) -> bool:
        """The poller's question, asked between ticks until it says True: one more
        budgeted step of the health check (the tick after it redraws the list)."""
        done = self.closed or self.model.check_health(HEALTH_BUDGET_S)
        self._catching_up = not done
        return done
