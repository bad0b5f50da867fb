"""OverheadView: ``run.overhead`` displayed: each probe's share of the step per rank, and
the table behind it, live (``ui.view_base``). Every other view shows the total as a
badge on its status line (``PanelView``)."""

from __future__ import annotations

import html
from typing import Any

import ipywidgets as widgets

from interactive_shard.overhead.figures import share_figure, table_figure
from interactive_shard.overhead.model import OverheadModel
from interactive_shard.ui.view_base import PanelView, heading

__all__ = ["OverheadView"]


class OverheadView(PanelView[OverheadModel]):
    """Live view of an ``OverheadModel``: the share figure and the table; no selectors
    (every rank is in the figure)."""

    def _panels(self) -> list[Any]:
        self.note_html = widgets.HTML(
            "<span style='color:#666'>Time in each probe's own code (its hooks, callbacks "
            "and event sending) over the time it was active; the background ones (sending, "
            "collectives) over the run.</span>"
        )
        return [
            self.note_html,
            heading("Share of the step, per probe and rank"),
            self._figure("shares"),
            self._figure("table"),
        ]

    def _status(self) -> str:
        model = self.model
        probes, ranks = model.probes, model.ranks
        if not ranks:
            return "<b>no probe costs recorded yet</b>"
        return (
            f"<b>{len(probes)} probe(s)</b> on {len(ranks)} rank(s): "
            f"{html.escape(', '.join(probes))}"
            + (f" · {model.skipped} unreadable events skipped" if model.skipped else "")
        )

    def _redraw(self) -> None:
        if not self._changed("data", (self.model.revision,)):
            return
        self._set_status(self._status())
        self._draw("shares", share_figure(self.model))
        self._draw("table", table_figure(self.model))
