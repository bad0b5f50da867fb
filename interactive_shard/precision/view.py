"""PrecisionView: the mixed-precision widget (rank, iteration, unit tree × phases, a unit's
details, planned vs observed, findings with fixes, bytes held), on ``ui.view_base``; its
HTML panels are in ``_view_text.py``."""

from __future__ import annotations

from typing import Any

import ipywidgets as widgets

from interactive_shard.precision import _view_text
from interactive_shard.precision.compare import Plan
from interactive_shard.precision.events import Unit
from interactive_shard.precision.figures import grid_parts, report_figures, unit_label
from interactive_shard.precision.figures_bytes import bytes_parts, collectives_parts
from interactive_shard.precision.model import PrecisionModel
from interactive_shard.ui.text import literal
from interactive_shard.ui.view_base import LATEST, PanelView, Selection, heading, selector

__all__ = ["PrecisionView", "report_figures"]


class PrecisionView(PanelView[PrecisionModel]):
    """Live view of a ``PrecisionModel`` (``run.precision``); ``widget`` is built on first use.

    State first, settable before any widget exists: ``rank``, ``iteration`` (``LATEST``
    follows the latest), the selected ``unit`` (None: the first that failed, else the
    root) and a plan to compare with (``set_plan``; default: the model's ``plan``). Once
    ``widget`` is built the controls hold that state: set ``rank_selector.value``,
    ``iteration_selector.value`` or ``unit_selector.value``, or click a row of the grid,
    then read the figures and HTML panels.
    """

    def __init__(
        self,
        model: PrecisionModel,
        *,
        rank: int | None = None,
        iteration: int = LATEST,
        unit: str | None = None,
        plan: Plan | None = None,
    ) -> None:
        super().__init__(model, rank, iteration)
        self.chosen_unit, self.user_plan = unit, plan

    # -- state (no widgets) ----------------------------------------------------------------
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

    @property
    def iteration_html(self) -> widgets.HTML:
        """The note beside the iteration selector (``iteration_note``)."""
        return self.iteration_note

    def differences(self) -> list[str]:
        """Planned vs observed on the rank and iteration shown (empty without a plan)."""
        plan = self.plan
        if plan is None:
            return []
        return self.model.compare(plan, rank=self.rank, iteration=self.iteration).differences

    def set_plan(self, plan: Plan | None) -> None:
        """Compare the observed dtypes with ``plan`` (``ish.plan_precision(...)``)."""
        self.user_plan = plan
        self.refresh()

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

    def _newest(self) -> int | None:
        return self.model.latest()

    def _iteration_note(self) -> str:
        return self.iteration_text()

    # -- widgets ---------------------------------------------------------------------------
    def _panels(self) -> list[Any]:
        self.unit_selector = selector("unit", self._unit_options(), self.unit, "360px")
        controls = [self._rank_selector(), *self._iteration_box("200px"), self.unit_selector]
        self._observe(self.rank_selector, self.iteration_selector, self.unit_selector)
        self.unit_html = widgets.HTML()
        self.differences_html = widgets.HTML()
        self.findings_html = widgets.HTML()
        self.grid_figure = self._figure("grid")
        self.bytes_figure = self._figure("bytes")
        self.collectives_figure = self._figure("collectives")
        return [
            widgets.HBox(controls),
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

    def _unit_options(self) -> list[tuple[str, str | None]]:
        units = self.model.units(self.rank)
        if not units:
            return [("none", None)]
        return [(_label(self.model, u, self.rank), u.fqn) for u in units]

    def _selections(self) -> list[Selection]:
        return [(self.unit_selector, self._unit_options(), self.unit)]

    def _read_controls(self) -> None:
        super()._read_controls()
        if self.unit_selector.value is not None:
            self.chosen_unit = self.unit_selector.value

    def select_unit(self, fqn: str) -> None:
        self.chosen_unit = fqn
        self.refresh()  # which moves the unit selector

    def _on_grid_click(self, _trace: Any, points: Any, _state: Any) -> None:
        """A click on a row of the grid selects its unit."""
        if not points.point_inds or not points.ys:
            return
        units = self.model.units(self.rank)
        by_label = {literal(_label(self.model, u, self.rank)): u.fqn for u in units}  # as drawn
        fqn = by_label.get(points.ys[0])
        if fqn is not None:
            self.select_unit(fqn)

    def _redraw(self) -> None:
        rank, it, plan = self.rank, self.iteration, self.plan
        data = (self.model.revision, rank, it, id(plan))
        if self._changed("data", data):
            self._set_status(self._status())
            self.differences_html.value = _view_text.differences_html(self.differences(), plan)
            self.findings_html.value = self.findings_text()
            self._draw("bytes", bytes_parts(self.model, rank=rank, iteration=it))
            self._draw("collectives", collectives_parts(self.model, rank=rank, iteration=it))
        if self._changed("unit", (*data, self.unit)):
            parts = grid_parts(self.model, rank=rank, iteration=it, plan=plan, selected=self.unit)
            if self._draw("grid", parts):
                for trace in self.grid_figure.data:  # new traces: the click goes to each again
                    if trace.type == "heatmap":
                        trace.on_click(self._on_grid_click)
            self.unit_html.value = self.unit_text()

    def _status(self) -> str:
        return _view_text.status(self)


def _label(model: PrecisionModel, u: Unit, rank: int) -> str:
    return unit_label(u, model.depth(u.fqn, rank=rank))
