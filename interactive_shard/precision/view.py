"""PrecisionView: the mixed-precision widget (rank, iteration, unit tree × phases, a unit's
details, planned vs observed, findings with fixes, bytes held).

Thin: the state worth testing lives in ``PrecisionModel`` and in the pure figures of
``figures.py`` / ``figures_bytes.py``; this file wires widgets to them. Every redraw
builds a figure from the model as it is now and swaps it into its FigureWidget inside
``batch_update()``; ``ui.live`` calls ``refresh()`` at most 10 times a second while
ranks run, and a panel is redrawn only when what it shows changed (the model's
``revision``, or a control).
"""

from __future__ import annotations

from typing import Any

import ipywidgets as widgets
import plotly.graph_objects as go

from interactive_shard.precision import _view_text
from interactive_shard.precision.compare import Plan
from interactive_shard.precision.events import Unit
from interactive_shard.precision.figures import (
    Parts,
    figure,
    grid_parts,
    report_figures,
    unit_label,
)
from interactive_shard.precision.figures_bytes import bytes_parts, collectives_parts
from interactive_shard.precision.model import PrecisionModel
from interactive_shard.ui import live
from interactive_shard.ui.controls import (
    LATEST,
    Panels,
    heading,
    rank_options,
    rank_selector,
    shown_rank,
    swap_figure,
)
from interactive_shard.ui.text import literal

__all__ = ["PrecisionView", "report_figures"]


class PrecisionView(Panels, live.LazyWidget):
    """Live view of a ``PrecisionModel`` (``run.precision``); ``widget`` is built on first use.

    State first, settable before any widget exists: ``rank``, ``iteration`` (None follows
    the latest), the selected ``unit`` (None: the first that failed, else the root) and a
    plan to compare with (``set_plan``; default: the model's ``plan``). Once ``widget`` is
    built the controls hold that state: set ``rank_selector.value``,
    ``iteration_selector.value`` or ``unit_selector.value``, or click a row of the grid,
    then read the figures and HTML panels.
    """

    def __init__(
        self,
        model: PrecisionModel,
        *,
        rank: int | None = None,
        iteration: int | None = None,
        unit: str | None = None,
        plan: Plan | None = None,
    ) -> None:
        self.model = model
        self.chosen_rank = rank
        self.chosen_iteration = iteration or LATEST
        self.chosen_unit = unit
        self.user_plan = plan
        self._widget: widgets.VBox | None = None
        self._drawn: dict[str, Any] = {}
        self._quiet = False  # set while the view itself moves a control

    # -- state (no widgets) ----------------------------------------------------------------
    @property
    def rank(self) -> int:
        return shown_rank(self.chosen_rank, self.model.ranks)

    @property
    def iteration(self) -> int:
        """The iteration shown: the selected one, or the rank's latest (1 before any)."""
        if self.chosen_iteration != LATEST:
            return self.chosen_iteration
        return self.model.latest(self.rank) or 1

    @property
    def plan(self) -> Plan | None:
        return self.user_plan if self.user_plan is not None else self.model.plan

    @property
    def unit(self) -> str | None:
        """The fqn of the unit whose details are shown (None: no unit yet)."""
        fqns = [u.fqn for u in self.model.units(self.rank)]
        if self.chosen_unit in fqns:
            return self.chosen_unit
        failed = [f.unit for f in self.model.failures if f.rank == self.rank]
        return next((f for f in failed if f in fqns), fqns[0] if fqns else None)

    def set_plan(self, plan: Plan | None) -> None:
        """Compare the observed dtypes with ``plan`` (``ish.plan_precision(...)``)."""
        self.user_plan = plan
        self.refresh()

    def select_unit(self, fqn: str) -> None:
        self.chosen_unit = fqn
        if self._widget is not None:
            self._quiet = True
            try:
                self.unit_selector.value = self.unit
            finally:
                self._quiet = False
        self.refresh()

    def differences(self) -> list[str]:
        """Planned vs observed on the rank and iteration shown (empty without a plan)."""
        plan = self.plan
        if plan is None:
            return []
        return self.model.compare(plan, rank=self.rank, iteration=self.iteration).differences

    def unit_text(self) -> str:
        """The selected unit in HTML: policy, dtypes per phase (planned next to observed),
        inputs cast or passed through, collectives with dtype and bytes."""
        return _view_text.unit_text(self)

    def findings_text(self) -> str:
        """Observed failures and findings with their fixes, and the plan's predicted ones
        (on a long run, those of the iterations read so far)."""
        return _view_text.findings_text(self)

    def iteration_text(self) -> str:
        """Next to the iteration selector: what 0 means, the latest, the failed ones."""
        return _view_text.iteration_text(self)

    def _status(self) -> str:
        return _view_text.status(self)

    # -- widgets ---------------------------------------------------------------------------
    def _build(self) -> None:
        self.model.update()
        self.rank_selector = rank_selector(self.model.ranks, self.rank)
        # A number, not a list of every iteration: a long run has 10,000 (0: the latest).
        self.iteration_selector = widgets.BoundedIntText(
            description="iteration",
            value=self.chosen_iteration,
            min=LATEST,
            max=self._iteration_max(),
            layout={"width": "200px"},
        )
        self.iteration_html = widgets.HTML()
        self.unit_selector = widgets.Dropdown(
            description="unit",
            options=self._unit_options(),
            value=self.unit,
            layout={"width": "360px"},
        )
        self.status_html = widgets.HTML()
        self.unit_html = widgets.HTML()
        self.differences_html = widgets.HTML()
        self.findings_html = widgets.HTML()
        self.grid_figure = go.FigureWidget()
        self.bytes_figure = go.FigureWidget()
        self.collectives_figure = go.FigureWidget()
        for control in (self.rank_selector, self.iteration_selector, self.unit_selector):
            control.observe(self._on_control, names="value")
        self._widget = widgets.VBox(
            [
                self.status_html,
                widgets.HBox(
                    [
                        self.rank_selector,
                        self.iteration_selector,
                        self.iteration_html,
                        self.unit_selector,
                    ]
                ),
                self.grid_figure,
                heading("Unit"),
                self.unit_html,
                heading("Planned vs observed"),
                self.differences_html,
                heading("Findings and failures"),
                self.findings_html,
                heading("Bytes held per dtype"),
                self.bytes_figure,
                self.collectives_figure,
            ]
        )
        self.refresh()

    def _rank_options(self) -> list[tuple[str, int]]:
        return rank_options(self.model.ranks, self.rank)

    def _iteration_max(self) -> int:
        return max(self.model.latest() or 1, self.chosen_iteration)

    def _unit_options(self) -> list[tuple[str, str | None]]:
        units = self.model.units(self.rank)
        if not units:
            return [("none", None)]
        return [(_label(self.model, u, self.rank), u.fqn) for u in units]

    def _on_control(self, _change: dict[str, Any]) -> None:
        if self._quiet:
            return
        self.chosen_rank = self.rank_selector.value
        self.chosen_iteration = self.iteration_selector.value
        if self.unit_selector.value is not None:
            self.chosen_unit = self.unit_selector.value
        self.refresh()

    def _on_grid_click(self, _trace: Any, points: Any, _state: Any) -> None:
        """A click on a row of the grid selects its unit."""
        if not points.point_inds or not points.ys:
            return
        units = self.model.units(self.rank)
        by_label = {literal(_label(self.model, u, self.rank)): u.fqn for u in units}  # as drawn
        fqn = by_label.get(points.ys[0])
        if fqn is not None:
            self.select_unit(fqn)

    def refresh(self) -> None:
        """Bring controls and panels up to date (cheap when nothing changed)."""
        if self._widget is None:
            return
        self.model.update()
        self._sync_controls()
        rank, it, plan = self.rank, self.iteration, self.plan
        data = (self.model.revision, rank, it, id(plan))
        if not self._changed("data", data) and not self._changed("unit", (*data, self.unit)):
            return
        self._drawn["unit"] = (*data, self.unit)
        # What the figures show but for the iteration's number: iterations of a long run
        # mostly repeat one another, and then a figure only gets its new title.
        shown = (rank, self.model.content(rank, it))
        self.status_html.value = self._status()
        self.differences_html.value = _view_text.differences_html(self.differences(), plan)
        self.findings_html.value = self.findings_text()
        self._draw(self.bytes_figure, shown, bytes_parts(self.model, rank=rank, iteration=it))
        parts = collectives_parts(self.model, rank=rank, iteration=it)
        self._draw(self.collectives_figure, shown, parts)
        parts = grid_parts(self.model, rank=rank, iteration=it, plan=plan, selected=self.unit)
        if self._draw(self.grid_figure, (*shown, id(plan), self.unit), parts):
            for trace in self.grid_figure.data:  # new traces: the click goes to each again
                if trace.type == "heatmap":
                    trace.on_click(self._on_grid_click)
        self.unit_html.value = self.unit_text()

    def _draw(self, target: go.FigureWidget, key: tuple[Any, ...], parts: Parts) -> bool:
        """Swap the figure of ``parts`` into ``target`` unless it shows what ``key`` says
        ``target`` shows already; then only its title changes (no figure is built). True
        when swapped."""
        if self._changed(f"figure {id(target)}", key):
            swap_figure(target, figure(*parts))
            return True
        title = parts[1].get("title", {}).get("text")
        if target.layout.title.text != title:
            target.layout.title.text = title
        return False

    def _sync_controls(self) -> None:
        """New ranks, iterations and units appear while the run goes on."""
        self._set_selectors(
            (
                (self.rank_selector, self._rank_options(), self.rank),
                (self.unit_selector, self._unit_options(), self.unit),
            )
        )
        self._quiet = True
        try:
            top = self._iteration_max()
            if self.iteration_selector.max != top:
                self.iteration_selector.max = top
            if self.iteration_selector.value != self.chosen_iteration:
                self.iteration_selector.value = self.chosen_iteration
        finally:
            self._quiet = False
        text = self.iteration_text()
        if self.iteration_html.value != text:
            self.iteration_html.value = text


def _label(model: PrecisionModel, u: Unit, rank: int) -> str:
    return unit_label(u, model.depth(u.fqn, rank=rank))
