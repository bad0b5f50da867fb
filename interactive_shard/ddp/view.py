"""LifecycleView: the DDP lifecycle widget (instance, rank, settings, lifecycle strip,
hooks per parameter, bytes by purpose, findings with their fixes), on ``ui.view_base``.

A long run's strip shares columns between iterations (``figures.MAX_COLUMNS``); the
``window_selector`` slider, shown then, zooms in on a range of iterations. A refresh
with new events summarises them for ``REFRESH_BUDGET_S`` (``model.budget``); what is
left a poller summarises between ticks, ``POLL_BUDGET_S`` at a time, and the status
line and strip title say how many events are still to be read.
"""

from __future__ import annotations

import html
from typing import Any

import ipywidgets as widgets

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
from interactive_shard.ui.format import nbytes
from interactive_shard.ui.redraw import Spec, retitled
from interactive_shard.ui.view_base import LATEST, PanelView, Selection, heading, selector

__all__ = ["LifecycleView", "report_figures"]

# Seconds of summarising per refresh with new events, and per poll between ticks (a
# refresh also draws; 100k new events take a few polls, a tick redraws after each).
REFRESH_BUDGET_S, POLL_BUDGET_S = 0.02, 0.05
MAX_FINDINGS = 30  # listed in the widget; all are in LifecycleModel.findings
LEVEL_COLORS = {"error": STATE_COLORS["bad"], "info": "#0072B2"}
WAITING = (
    "<i>No DDP instance yet: watch a DDP model with <code>ish.watch(ddp)</code> on the "
    "ranks; its settings, iterations, hooks and collectives appear here.</i>"
)


class LifecycleView(PanelView[LifecycleModel]):
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
        super().__init__(model, rank)
        self.chosen_ddp = ddp or LATEST  # instances are numbered (serials) from 1
        self.chosen_window = window
        self._catch_up = live.CatchUp(self, REFRESH_BUDGET_S, POLL_BUDGET_S)

    # -- state (no widgets) ----------------------------------------------------------------
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
    def _panels(self) -> list[Any]:
        self.ddp_selector = selector("DDP", self._ddp_options(), self.chosen_ddp, "420px")
        low, high = self._span()
        self.window_selector = widgets.IntRangeSlider(
            description="iterations",
            min=low,
            max=high,
            value=self.chosen_window or (low, high),
            continuous_update=False,
            layout={"width": "600px"},
        )
        selectors = widgets.HBox([self.ddp_selector, self._rank_selector()])
        self._observe(self.ddp_selector, self.rank_selector, self.window_selector)
        self.settings_html = widgets.HTML()
        self.findings_html = widgets.HTML()
        self.lifecycle_figure = self._figure("lifecycle")
        self.hooks_figure = self._figure("hooks")
        self.bytes_figure = self._figure("bytes")
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
        return [selectors, self.details]

    def _ddp_options(self) -> list[tuple[str, int]]:
        insts = self.model.instances_of(self.rank)
        newest = f"newest ({instance_label(insts[-1])})" if insts else "newest"
        chosen = {self.chosen_ddp} - {LATEST} - {i.serial for i in insts}
        return (
            [(newest, LATEST)]
            + [(instance_label(i), i.serial) for i in insts]
            + [(f"DDP #{s} · not on this rank", s) for s in sorted(chosen)]
        )

    def _read_controls(self) -> None:
        super()._read_controls()
        self.chosen_ddp = self.ddp_selector.value
        window = tuple(self.window_selector.value)
        whole = window == (self.window_selector.min, self.window_selector.max)
        self.chosen_window = None if whole else (int(window[0]), int(window[1]))

    def refresh(self) -> None:
        if self._widget is not None:
            with self._catch_up(self.model):  # new events: some summarising now (a budget)
                super().refresh()

    def _redraw(self) -> None:
        revision = self.model.revision
        if self._changed("status", (revision, self.rank)):
            self._set_status(self._status())
        inst = self.instance
        self.details.layout.display = "none" if inst is None else ""
        if inst is None:
            return
        # Settings and hooks change only with a watch; findings, strip and bytes with
        # every update (the strip's and the bars' new values into the traces they have).
        watched = (self.rank, inst.serial, len(inst.watches))
        if self._changed("instance", (revision, self.rank, inst.serial)):
            self.findings_html.value = self.findings_text()
        if self._changed("settings", watched):
            self.settings_html.value = self.settings_text()
        if self._changed("strip", (revision, self.rank, inst.serial, self.chosen_window)):
            window, serial = self.chosen_window, inst.serial
            strip = lifecycle_strip(self.model, serial, self.rank, window=window)
            spec = _strip_spec(self._redrawn["lifecycle"].shown, strip)
            self._draw(
                "lifecycle",
                spec or figure_lifecycle(self.model, serial, self.rank, window=window),
            )
        if self._changed("hooks", watched):
            self._draw("hooks", figure_hooks(self.model, inst.serial, self.rank))
        if self._changed("bytes", (revision, self.rank)):
            spec = _bars_spec(self._redrawn["bytes"].shown, bytes_bars(self.model, self.rank))
            self._draw("bytes", spec or figure_bytes(self.model, self.rank))

    def _selections(self) -> list[Selection]:
        return [(self.ddp_selector, self._ddp_options(), self.chosen_ddp)]

    def _sync_controls(self) -> None:
        """New ranks, instances and iterations appear while the run goes on."""
        super()._sync_controls()
        low, high = self._span()
        slider = self.window_selector
        long = high - low + 1 > MAX_COLUMNS or self.chosen_window is not None
        slider.layout.display = "" if long else "none"
        if (slider.min, slider.max) != (low, high) or (
            self.chosen_window is None and tuple(slider.value) != (low, high)
        ):
            with self._quietly():  # widen first: the slider clamps its value to its bounds
                slider.max = max(high, slider.min)
                slider.min = low
                slider.max = high
                slider.value = self.chosen_window or (low, high)


def _strip_spec(shown: Spec | None, strip: Strip | str) -> Spec | None:
    """The strip drawn last with ``strip``'s cells and title (None: it has no heatmap to
    take them, or there is no strip): building and validating a whole 100-column strip
    cost ~20 ms of plotly's validation."""
    if (
        shown is None
        or not isinstance(strip, Strip)
        or [t.get("type") for t in shown[0]] != ["heatmap"]
    ):
        return None
    (heatmap,), layout = shown
    return [{**heatmap, **strip.traced()}], retitled(layout, strip.title)


def _bars_spec(shown: Spec | None, bars: Bars | None) -> Spec | None:
    """The bars drawn last with ``bars``' values and title (None: other purposes, or none)."""
    if shown is None or bars is None or [t.get("name") for t in shown[0]] != list(bars.sent):
        return None
    traces = [
        {**t, "x": bars.x, "y": bars.sent[t["name"]], "hovertext": bars.hover(t["name"])}
        for t in shown[0]
    ]
    return traces, retitled(shown[1], bars.title)


def _value(v: Any) -> str:
    if isinstance(v, list):
        return ", ".join(map(str, v)) or "—"
    return "—" if v is None else str(v)
