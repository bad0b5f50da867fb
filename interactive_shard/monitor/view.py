"""RunMonitor view: rank states, steps, progress, last log lines, live scalar plot."""

from __future__ import annotations

import html
from typing import TYPE_CHECKING, Protocol

import ipywidgets as widgets
import plotly.graph_objects as go

from interactive_shard.monitor.figures import (
    LIVE_POINTS,
    figure_scalars,
    line_name,
    scalar_lines,
    title,
)
from interactive_shard.monitor.model import MonitorModel
from interactive_shard.telemetry import rank_info
from interactive_shard.telemetry.rank_state import RankState
from interactive_shard.ui import live
from interactive_shard.ui.colors import STATE_COLORS
from interactive_shard.ui.redraw import Redrawn, retitled, spec_of
from interactive_shard.ui.view_base import with_badge

if TYPE_CHECKING:
    from interactive_shard.cluster.run import Run


class MonitorSource(Protocol):
    """What a monitor follows: a ``Run`` (itself) or a ``Cluster`` (its latest run)."""

    @property
    def latest_run(self) -> Run | None: ...

    def live_rank_states(self) -> list[RankState] | None:
        """The ranks' states now, or None when the run's own events tell them."""
        ...

    def describe(self) -> str:
        """One line of plain text: ranks, backend, devices."""
        ...


class MonitorView(live.LazyWidget):
    """Live monitor of a Run, or of a Cluster's latest run. The widget is built lazily."""

    def __init__(self, source: MonitorSource) -> None:
        self._source = source
        self._run: Run | None = None
        self._model: MonitorModel | None = None
        self._widget: widgets.VBox | None = None
        self._seen_points = -1  # the model's points at the last redraw

    # -- state (no widgets) ----------------------------------------------------------------
    def _current(self) -> MonitorModel | None:
        """The model of the source's latest run (a new one when the run changed)."""
        run = self._source.latest_run
        if run is not self._run:
            self._run, self._model, self._seen_points = run, None, -1
        if run is not None and self._model is None:
            self._model = MonitorModel(run.store)
        return self._model

    def _follow(self) -> MonitorModel | None:
        model = self._current()
        if model is not None:
            model.update()
        return model

    def _states(self, model: MonitorModel | None) -> list[str]:
        live_states = self._source.live_rank_states()
        if live_states is None:
            return [r.state.value for r in model.ranks] if model is not None else []
        states = [s.value for s in live_states]
        if model is not None:  # a finished/failed run says more than "idle"
            for i, r in enumerate(model.ranks):
                if states[i] == RankState.IDLE.value and r.state != RankState.RUNNING:
                    states[i] = r.state.value
        return states

    def _header(self) -> str:
        run = self._run
        what = f" · run {run.run_id}: {html.escape(run.store.info.name)}" if run else ""
        return f"<b>{html.escape(self._source.describe())}</b>{what}"

    def _static_model(self) -> MonitorModel | None:
        return self._follow()

    def _static_title(self) -> str:
        return "Run monitor"

    def _static_heading(self) -> str:
        """The ranks' states now (a live cluster knows them before its run's events do)."""
        states = self._states(self._follow())
        run, what = self._run, ""
        if run is not None:
            what = f" · run {run.run_id}" + (
                f": {run.store.info.name}" if run.store.info.name else ""
            )
        return f"{self._source.describe()}{what} · ranks: {', '.join(states) or 'none'}"

    # -- widgets ---------------------------------------------------------------------------
    def _build(self) -> None:
        model = self._follow()
        n = len(self._states(model))
        self._title = widgets.HTML()
        self._labels = [widgets.HTML(layout={"width": "260px"}) for _ in range(n)]
        self._bars = [
            widgets.IntProgress(min=0, max=1, value=0, layout={"width": "200px"}) for _ in range(n)
        ]
        self._logs = [widgets.HTML(layout={"width": "100%"}) for _ in range(n)]
        rows = [widgets.HBox([self._labels[r], self._bars[r], self._logs[r]]) for r in range(n)]
        self._plot = Redrawn(go.FigureWidget())  # as the other views redraw (ui/view_base)
        self._fig = self._plot.widget
        # Shown only once there is a scalar to plot (an empty plot just takes space).
        self._fig_box = widgets.Box([self._fig], layout={"display": "none"})
        self._widget = widgets.VBox([self._title, *rows, self._fig_box])
        self.refresh()

    def refresh(self) -> None:
        """Redraw from the model (called by ui.live at most 10 times a second)."""
        if self._widget is None:
            return
        model = self._follow()
        states = self._states(model)
        store = model.store if model is not None else None
        self._title.value = with_badge(self._header(), store)  # the run's own cost after it
        for r, state in enumerate(states):
            status = model.ranks[r] if model else None
            step = f" · step {status.step}" if status and status.step else ""
            color = STATE_COLORS.get(state, "#999")
            dot = f"<span style='color:{color}'>●</span>"
            name = rank_info.of(model.store).label(r) if model else str(r)
            label = f"{dot} rank {html.escape(name)} <b>{state}</b>{step}"
            self._labels[r].value = f"<span style='white-space:nowrap'>{label}</span>"
            bar = self._bars[r]
            if status and status.total:
                bar.max, bar.value = status.total, min(status.step, status.total)
                bar.layout.visibility = "visible"
            else:
                bar.layout.visibility = "hidden"
            lines = list(status.logs)[-3:] if status else []
            self._logs[r].value = (
                "<pre style='margin:0;font-size:11px;line-height:1.2'>"
                + html.escape("\n".join(lines))
                + "</pre>"
            )
        if model is not None and model.points != self._seen_points:
            self._seen_points = model.points
            self._redraw(model)

    def _redraw(self, model: MonitorModel) -> None:
        """New points into the traces shown (no figure built: that cost ~1 ms a trace);
        a new line (scalar or rank) draws the figure whole once."""
        lines = scalar_lines(model, LIVE_POINTS)
        shown = self._plot.shown
        if shown is not None and [t.get("name") for t in shown[0]] == list(map(line_name, lines)):
            traces = [
                {**t, "x": ln.steps, "y": ln.values} for t, ln in zip(shown[0], lines, strict=True)
            ]
            self._plot.draw((traces, retitled(shown[1], title(lines))))
        else:
            self._plot.draw(spec_of(figure_scalars(model, LIVE_POINTS)))
        self._fig_box.layout.display = "" if lines else "none"
