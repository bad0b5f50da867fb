"""The collective ledger view: the ranks × sequence grid of one process group, the
verdict (first divergence, who a hang waits for) above it, live."""

from __future__ import annotations

import html
from typing import Any

import ipywidgets as widgets

from interactive_shard.collectives.figures import ledger_figure
from interactive_shard.collectives.model import CollectivesModel
from interactive_shard.ui import live
from interactive_shard.ui.view_base import PanelView, heading, selector

REFRESH_BUDGET_S, POLL_BUDGET_S = 0.02, 0.05  # reading 100k new collectives: see Budget


class _Backlog:
    """The model as ``ui.live.CatchUp`` reads it (``pending``: events not read yet;
    the model's own ``pending()`` is the collectives the ranks wait in)."""

    def __init__(self, model: CollectivesModel) -> None:
        self.model, self.store, self.budget = model, model.store, model.budget

    @property
    def pending(self) -> int:
        return self.model.backlog

    @pending.setter
    def pending(self, _value: int) -> None:  # the model counts it
        pass

    def update(self) -> bool:
        return self.model.update()


class CollectivesView(PanelView[CollectivesModel]):
    """``run.collectives`` displayed: a group selector, the findings, the grid."""

    def __init__(self, model: CollectivesModel, group: str | None = None) -> None:
        super().__init__(model)
        self.chosen_group = group
        self._catch_up = live.CatchUp(self, REFRESH_BUDGET_S, POLL_BUDGET_S)
        self._backlog = _Backlog(model)

    def refresh(self) -> None:
        """Every read of the model in a refresh is under its budget (see ``CatchUp``)."""
        with self._catch_up(self._backlog):
            super().refresh()

    @property
    def group(self) -> str:
        groups = self.model.busiest()
        if self.chosen_group is not None:
            return self.chosen_group
        return groups[0] if groups else ""

    def _panels(self) -> list[Any]:
        group = self.group
        self.group_selector = selector("group", [group] if group else [], group or None)
        self._observe(self.group_selector)
        self.findings_html = widgets.HTML()
        return [
            self.group_selector,
            heading("What the ranks issued"),
            self.findings_html,
            self._figure("ledger"),
        ]

    def _read_controls(self) -> None:
        self.chosen_group = self.group_selector.value

    def _selections(self) -> list[Any]:
        groups = self.model.busiest()
        group = self.group
        return [(self.group_selector, sorted({*groups, group} - {""}), group or None)]

    def _redraw(self) -> None:
        model = self.model
        n = sum(model.counts().values())
        self._set_status(
            f"<b>{n:,} collectives</b> from {len(model.ranks)} rank(s)"
            + (f" · reading {model.backlog:,} more reports" if model.backlog else "")
            + (f" · {model.skipped} unreadable events skipped" if model.skipped else "")
        )
        if not self._changed("ledger", (model.revision, self.group)):
            return
        lines = [f.message for f in model.findings]
        if model.hang_flagged():
            lines.insert(0, "HANG: a collective has been pending for a while (see below)")
        if not lines and n:
            lines = ["no divergence: the ranks agree" + ("" if model.over else " so far")]
        self.findings_html.value = "<br>".join(
            f"<span style='color:{'#D55E00' if 'agree' not in line else '#009E73'}'>"
            f"{html.escape(line)}</span>"
            for line in lines
        )
        self._draw("ledger", ledger_figure(model, self.group or None))
