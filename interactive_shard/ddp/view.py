"""LifecycleView: the DDP lifecycle widget (instance, rank, settings, lifecycle strip,
hooks per parameter, bytes by purpose, findings with their fixes).

Thin: the state worth testing lives in ``LifecycleModel`` and in the pure figures of
``figures.py``; this file wires widgets to them. A long run's strip shares columns
between iterations (``figures.MAX_COLUMNS``); the ``window_selector`` slider, shown
then, zooms in on a range of iterations. Every redraw builds a figure from the
model as it is now and swaps it into its FigureWidget inside ``batch_update()``;
``ui.live`` calls ``refresh()`` at most 10 times a second while ranks run, and a panel
is redrawn only when what it shows changed (the model's ``revision``, or a control).
A refresh with new events summarises them for ``REFRESH_BUDGET_S`` (``model.budget``);
what is left a poller summarises between ticks, ``POLL_BUDGET_S`` at a time, and the
status line and strip title say how many events are still to be read.
"""

from __future__ import annotations

import html
from collections.abc import Callable
from typing import Any

import ipywidgets as widgets
import plotly.graph_objects as go

from interactive_shard.ddp.figures import (
    MAX_COLUMNS,
    STATE_COLORS,
    Bars,
    Strip,
    bytes_bars,
    figure_bytes,
    figure_hooks,
    figure_lifecycle,
    instance_label,
    lifecycle_strip,
    pick,
    report_figures,
)
from interactive_shard.ddp.model import Finding, Instance, LifecycleModel
from interactive_shard.ui import live
from interactive_shard.ui.controls import (
    Panels,
    heading,
    rank_options,
    rank_selector,
    shown_rank,
    swap_figure,
)
from interactive_shard.ui.format import nbytes

__all__ = ["LifecycleView", "report_figures"]

NEWEST = 0  # instance selector value that follows the newest instance (serials are >= 1)
# Seconds of summarising per refresh with new events, and per poll between ticks (a
# refresh also draws; 100k new events take a few polls, a tick redraws after each).
REFRESH_BUDGET_S, POLL_BUDGET_S = 0.02, 0.05
MAX_FINDINGS = 30  # listed in the widget; all are in LifecycleModel.findings
LEVEL_COLORS = {"error": STATE_COLORS["bad"], "info": "#0072B2"}
WAITING = (
    "<i>No DDP instance yet: watch a DDP model with <code>ish.watch(ddp)</code> on the "
    "ranks; its settings, iterations, hooks and collectives appear here.</i>"
)


class LifecycleView(Panels, live.LazyWidget):
    """Live view of a ``LifecycleModel`` (``run.ddp``); ``widget`` is built on first use.

    State first, settable before any widget exists: ``rank`` (None: the lowest),
    ``ddp``, the instance's serial (None follows the newest: a re-run cell's new
    wrapper) and ``window``, the first and last iteration the strip shows (None: all,
    following new ones). Once ``widget`` is built the controls hold that state: set
    ``ddp_selector.value``, ``rank_selector.value`` or ``window_selector.value`` (the
    whole range: all), then read the figures and HTML.
    """

    def __init__(
        self,
        model: LifecycleModel,
        *,
        ddp: int | None = None,
        rank: int | None = None,
        window: tuple[int, int] | None = None,
    ) -> None:
        self.model = model
        self.chosen_ddp = ddp or NEWEST
        self.chosen_rank = rank
        self.chosen_window = window
        self._widget: widgets.VBox | None = None
        self._drawn: dict[str, Any] = {}
        self._quiet = False  # set while the view itself moves a control
        self._catch_up = live.CatchUp(self, REFRESH_BUDGET_S, POLL_BUDGET_S)

    # -- state (no widgets) ----------------------------------------------------------------
    @property
    def rank(self) -> int:
        return shown_rank(self.chosen_rank, self.model.ranks)

    @property
    def instance(self) -> Instance | None:
        """The instance shown (None: none watched on this rank yet)."""
        return pick(self.model, self.chosen_ddp or None, self.rank)

    @property
    def ddp(self) -> int | None:
        inst = self.instance
        return None if inst is None else inst.serial

    def findings(self) -> list[Finding]:
        """The instance's findings: the checks that fired, then the advice."""
        return [f for f in self.model.findings if f.ddp is None or f.ddp == self.ddp]

    def settings_text(self) -> str:
        """The instance's settings and what it syncs, as an HTML table."""
        inst = self.instance
        if inst is None:
            return ""
        w = inst.watch
        rows = [(name, _value(v)) for name, v in inst.settings.items()]
        rows += [
            ("world size", str(w.world_size)),
            ("parameters", f"{len(w.params)} · {nbytes(w.param_bytes)}"),
            ("buffers", f"{len(w.buffers)} · {nbytes(w.buffer_bytes)}"),
            ("collectives recorded from", w.recorded_from),
        ]
        body = "".join(
            f"<tr><td><code>{html.escape(k)}</code></td><td>{html.escape(v)}</td></tr>"
            for k, v in rows
        )
        return f"<b>{html.escape(instance_label(inst))}</b><table>{body}</table>"

    def findings_text(self) -> str:
        """Checks (red, with their fix) and advice (blue) for the instance shown."""
        found = self.findings()
        items = []
        for f in found[:MAX_FINDINGS]:
            color = LEVEL_COLORS.get(f.level, "#999999")
            when = "" if f.iteration is None else f" in iteration {f.iteration}"
            ranks = ", ".join(map(str, f.ranks))
            items.append(
                f"<li><b style='color:{color}'>{f.level} · {f.kind}</b>{when} "
                f"(rank(s) {ranks}): <span style='color:{color}'>{html.escape(f.message)}"
                "</span></li>"
            )
        if len(found) > MAX_FINDINGS:
            items.append(
                f"<li>… {len(found) - MAX_FINDINGS} more: see <code>run.ddp.findings</code></li>"
            )
        if not items:
            return "<b>Findings:</b> none."
        return f"<b>Findings: {len(found)}</b><ul>{''.join(items)}</ul>"

    def _span(self) -> tuple[int, int]:
        """The shown instance's first and last iteration index ((1, 1) before any)."""
        inst = self.instance
        if inst is None or not inst.iteration_count:
            return (1, 1)
        index = inst.table.col("index")
        return (int(index[0]), int(index[-1]))

    def _status(self) -> str:
        insts = self.model.instances_of(self.rank)
        if not insts:
            return WAITING
        its = sum(i.iteration_count for i in insts)
        parts = [f"<b>{len(insts)} DDP instance(s)</b> on rank {self.rank} · {its} iteration(s)"]
        errors = self.model.checks
        if errors:
            parts.append(
                f"<span style='color:{LEVEL_COLORS['error']}'>{len(errors)} check(s)</span>"
            )
        if self.model.skipped:
            parts.append(f"{self.model.skipped} malformed event(s) skipped")
        if self.model.pending:
            parts.append(f"reading: {self.model.pending:,} event(s) to go")
        return " · ".join(parts)

    # -- widgets ---------------------------------------------------------------------------
    def _build(self) -> None:
        self.model.update()
        self.ddp_selector = widgets.Dropdown(
            description="DDP",
            options=self._ddp_options(),
            value=self.chosen_ddp,
            layout={"width": "420px"},
        )
        self.rank_selector = rank_selector(self.model.ranks, self.rank)
        low, high = self._span()
        self.window_selector = widgets.IntRangeSlider(
            description="iterations",
            min=low,
            max=high,
            value=self.chosen_window or (low, high),
            continuous_update=False,
            layout={"width": "600px"},
        )
        self.status_html = widgets.HTML()
        self.settings_html = widgets.HTML()
        self.findings_html = widgets.HTML()
        self.lifecycle_figure = go.FigureWidget()
        self.hooks_figure = go.FigureWidget()
        self.bytes_figure = go.FigureWidget()
        for control in (self.ddp_selector, self.rank_selector, self.window_selector):
            control.observe(self._on_control, names="value")
        self.details = widgets.VBox(
            [
                self.settings_html,
                self.window_selector,
                self.lifecycle_figure,
                heading("Findings"),
                self.findings_html,
                heading("Hooks and bytes"),
                self.hooks_figure,
                self.bytes_figure,
            ]
        )
        self._widget = widgets.VBox(
            [self.status_html, widgets.HBox([self.ddp_selector, self.rank_selector]), self.details]
        )
        self.refresh()

    def _ddp_options(self) -> list[tuple[str, int]]:
        insts = self.model.instances_of(self.rank)
        newest = f"newest ({instance_label(insts[-1])})" if insts else "newest"
        chosen = {self.chosen_ddp} - {NEWEST} - {i.serial for i in insts}
        return (
            [(newest, NEWEST)]
            + [(instance_label(i), i.serial) for i in insts]
            + [(f"DDP #{s} · not on this rank", s) for s in sorted(chosen)]
        )

    def _rank_options(self) -> list[tuple[str, int]]:
        return rank_options(self.model.ranks, self.rank)

    def _on_control(self, _change: dict[str, Any]) -> None:
        if self._quiet:
            return
        self.chosen_ddp = self.ddp_selector.value
        self.chosen_rank = self.rank_selector.value
        window = tuple(self.window_selector.value)
        whole = window == (self.window_selector.min, self.window_selector.max)
        self.chosen_window = None if whole else (int(window[0]), int(window[1]))
        self.refresh()

    def refresh(self) -> None:
        """Bring controls and panels up to date (cheap when nothing changed)."""
        if self._widget is None:
            return
        with self._catch_up(self.model):  # new events: some summarising now (a budget)
            self._refresh()

    def _refresh(self) -> None:
        self.model.update()
        self._sync_controls()
        revision = self.model.revision
        if self._changed("status", (revision, self.rank)):
            self.status_html.value = self._status()
        inst = self.instance
        self.details.layout.display = "none" if inst is None else ""
        if inst is None:
            return
        # Settings and hooks change only with a watch; findings, strip and bytes with
        # every update (redrawn in place: the figures' traces keep their shape).
        watched = (self.rank, inst.serial, len(inst.watches))
        if self._changed("instance", (revision, self.rank, inst.serial)):
            self.findings_html.value = self.findings_text()
        if self._changed("settings", watched):
            self.settings_html.value = self.settings_text()
        if self._changed("strip", (revision, self.rank, inst.serial, self.chosen_window)):
            window, serial = self.chosen_window, inst.serial
            strip = lifecycle_strip(self.model, serial, self.rank, window=window)
            _redraw(
                self.lifecycle_figure,
                lambda: figure_lifecycle(self.model, serial, self.rank, window=window),
                lambda target: _strip_in_place(target, strip),
            )
        if self._changed("hooks", watched):
            fig = figure_hooks(self.model, inst.serial, self.rank)
            _redraw(self.hooks_figure, lambda: fig)
        if self._changed("bytes", (revision, self.rank)):
            bars = bytes_bars(self.model, self.rank)
            _redraw(
                self.bytes_figure,
                lambda: figure_bytes(self.model, self.rank),
                lambda target: _bars_in_place(target, bars),
            )

    def _sync_controls(self) -> None:
        """New ranks, instances and iterations appear while the run goes on."""
        self._set_selectors(
            (
                (self.rank_selector, self._rank_options(), self.rank),
                (self.ddp_selector, self._ddp_options(), self.chosen_ddp),
            )
        )
        low, high = self._span()
        slider = self.window_selector
        long = high - low + 1 > MAX_COLUMNS or self.chosen_window is not None
        slider.layout.display = "" if long else "none"
        if (slider.min, slider.max) != (low, high) or (
            self.chosen_window is None and tuple(slider.value) != (low, high)
        ):
            self._quiet = True
            try:  # widen first: the slider clamps its value to its bounds
                slider.max = max(high, slider.min)
                slider.min = low
                slider.max = high
                slider.value = self.chosen_window or (low, high)
            finally:
                self._quiet = False


def _redraw(
    target: go.FigureWidget,
    build: Callable[[], go.Figure],
    in_place: Callable[[go.FigureWidget], bool] | None = None,
) -> None:
    """Redraw one panel: new data into the traces it has (``in_place`` says whether they
    fit), else ``build()``'s figure swapped in."""
    if in_place is None or not in_place(target):
        swap_figure(target, build())


def _strip_in_place(target: go.FigureWidget, strip: Strip | str) -> bool:
    if not isinstance(strip, Strip) or [t.type for t in target.data] != ["heatmap"]:
        return False
    # One update message, unvalidated (a 100-column strip's cells took ~20 ms of
    # plotly's validation): the same properties, of the same kinds, as the heatmap that
    # figure_lifecycle built and plotly validated.
    restyle = {k: [v] for k, v in strip.traced().items()}
    target.plotly_update(restyle, {"title.text": strip.title}, [0])
    return True


def _bars_in_place(target: go.FigureWidget, bars: Bars | None) -> bool:
    if bars is None or [t.name for t in target.data] != list(bars.sent):
        return False
    restyle = {
        "x": [bars.x] * len(bars.sent),
        "y": list(bars.sent.values()),
        "hovertext": [bars.hover(purpose) for purpose in bars.sent],
    }
    target.plotly_update(restyle, {"title.text": bars.title}, list(range(len(bars.sent))))
    return True


def _value(v: Any) -> str:
    if isinstance(v, list):
        return ", ".join(map(str, v)) or "—"
    return "—" if v is None else str(v)
