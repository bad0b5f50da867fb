"""SplitsView: the graph-split widget (rank, compile, lanes, partition, plan, what-if caps),
on ``ui.view_base``; its HTML panels are in ``_view_text.py``."""

from __future__ import annotations

import html
from typing import Any

import ipywidgets as widgets

from interactive_shard.splits import _view_text
from interactive_shard.splits.compare import compare_graph
from interactive_shard.splits.events import Partition
from interactive_shard.splits.figures import (
    figure_cap_sweep,
    figure_compare,
    figure_lanes,
    plan_for,
    report_figures,
)
from interactive_shard.splits.model import Compilation, SplitsModel
from interactive_shard.splits.plan import MIB, GraphPlan, SplitPlan, SplitPlanError
from interactive_shard.ui import controls
from interactive_shard.ui.format import nbytes
from interactive_shard.ui.view_base import LATEST, PanelView, Selection, heading, selector

__all__ = ["SplitsView", "report_figures"]

CAP_LOG2 = (-6.0, 7.0)  # what-if cap slider: 1/64 .. 128 MiB, log2 scale
FIRST_LOG2 = (-10.0, 7.0)  # what-if first-bucket slider: 1 KiB .. 128 MiB
DEFAULT_CAP_MB = 25.0  # DDP's default, before any compile arrived
PRE = "<pre style='max-height:420px;overflow:auto;font-size:11px;margin:0'>{}</pre>"


class SplitsView(PanelView[SplitsModel]):
    """Live view of a ``SplitsModel`` (``run.splits``); ``widget`` is built on first use.

    State first, settable before any widget exists: ``rank``, the compile ``index`` (its
    position among the rank's compiles; None follows the latest), the selected
    ``partition``, the what-if ``cap_mb`` / ``first_cap_mb`` (None: the compile's own
    caps) and a plan to compare with (``set_plan``). Once ``widget`` is built the controls
    hold that state: set ``rank_selector.value``, ``compile_selector.value`` (``LATEST``,
    or the compile at ``index`` as ``index + 1``), ``partition_selector.value``,
    ``cap_slider.value`` or ``first_cap_slider.value``, click ``reset_button`` or a call
    of the lanes figure, then read the figures and HTML panels.
    """

    def __init__(
        self,
        model: SplitsModel,
        *,
        rank: int | None = None,
        index: int | None = None,
        partition: int = 0,
        cap_mb: float | None = None,
        first_cap_mb: float | None = None,
        plan: SplitPlan | GraphPlan | None = None,
    ) -> None:
        super().__init__(model, rank)
        # The compile selector counts compiles from 1, as LATEST (0) follows the newest.
        self.chosen_compile = LATEST if index is None else index + 1
        self.partition = partition
        self.cap_mb = cap_mb
        self.first_cap_mb = first_cap_mb
        self.user_plan = plan
        self._options: tuple[tuple[Any, ...], list[tuple[str, int]]] | None = None

    # -- state (no widgets) ----------------------------------------------------------------
    @property
    def index(self) -> int | None:
        """The position of the compile shown among the rank's compiles (None: none yet)."""
        n = self.model.count(self.rank)
        if n == 0:
            return None
        return n - 1 if self.chosen_compile == LATEST else min(self.chosen_compile, n) - 1

    @property
    def compilation(self) -> Compilation | None:
        index = self.index
        return None if index is None else self.model.compilation(self.rank, index)

    @property
    def selected(self) -> Partition | None:
        """The partition whose code and parameters are shown."""
        comp = self.compilation
        if comp is None or not comp.partitions:
            return None
        return comp.partitions[min(max(self.partition, 0), len(comp.partitions) - 1)]

    @property
    def what_if(self) -> dict[str, float]:
        caps = {"bucket_cap_mb": self.cap_mb, "first_bucket_cap_mb": self.first_cap_mb}
        return {k: v for k, v in caps.items() if v is not None}

    def set_plan(self, plan: SplitPlan | GraphPlan | None) -> None:
        """Compare the captured partitions with ``plan`` (``ish.plan_splits(...)``; None:
        the planner run on each captured graph at its own caps)."""
        self.user_plan = plan
        self.refresh()

    def differences(self) -> list[str]:
        """Planned (``set_plan``'s plan, or the planner's) vs the captured compile shown."""
        comp = self.compilation
        if comp is None:
            return []
        try:
            planned = plan_for(self.model, self.rank, self._position(), plan=self.user_plan)
        except (SplitPlanError, LookupError) as err:
            return [f"cannot compare: {err}"]
        return compare_graph(f"rank {self.rank}, compile {comp.index}", planned, comp)

    def what_if_text(self) -> str:
        """The what-if plan in words (HTML): how many partitions, their bytes; or why not."""
        return _view_text.what_if_text(self)

    def partition_text(self) -> str:
        """The selected partition in HTML: parameters, inputs, outputs, regions, calls."""
        return _view_text.partition_text(self)

    def _status(self) -> str:
        return _view_text.status(self)

    def _caps(self) -> dict[str, Any]:
        return {"bucket_cap_mb": self.cap_mb, "first_bucket_cap_mb": self.first_cap_mb}

    def _position(self) -> int:
        return self.index if self.index is not None else -1

    def _selected_index(self) -> int:
        p = self.selected
        return p.index if p is not None else 0

    # -- widgets ---------------------------------------------------------------------------
    def _panels(self) -> list[Any]:
        self.compile_selector = selector("compile", self._compile_options(), self.chosen_compile)
        partitions = self._partition_options()
        self.partition_selector = selector("partition", partitions, self._selected_index(), "420px")
        cap, first = self._recorded()
        self.cap_slider = controls.cap_slider(
            "what-if cap (MiB)", self.cap_mb or cap, cap, CAP_LOG2, "360px"
        )
        self.first_cap_slider = controls.cap_slider(
            "first bucket (MiB)", self.first_cap_mb or first, first, FIRST_LOG2, "360px"
        )
        self.reset_button = widgets.Button(description="recorded caps", icon="undo")
        self.partition_html = widgets.HTML()
        self.code_html = widgets.HTML()
        self.differences_html = widgets.HTML()
        self.what_if_html = widgets.HTML()
        self.runtime_html = widgets.HTML()
        selectors = widgets.HBox([self._rank_selector(), self.compile_selector])
        self.lanes_figure = self._figure("lanes")
        self.compare_figure = self._figure("compare")
        self.what_if_figure = self._figure("what_if")
        self.sweep_figure = self._figure("sweep")
        self._observe(self.rank_selector, self.compile_selector, self.partition_selector)
        self.cap_slider.observe(self._on_cap, names="value")
        self.first_cap_slider.observe(self._on_cap, names="value")
        self.reset_button.on_click(self._on_reset)
        self.details = widgets.VBox(
            [
                self.partition_selector,
                self.partition_html,
                self.code_html,
                heading("Planned vs captured"),
                self.compare_figure,
                self.differences_html,
                heading("What if: another cap"),
                widgets.HBox([self.cap_slider, self.first_cap_slider, self.reset_button]),
                self.what_if_html,
                self.what_if_figure,
                self.sweep_figure,
                heading("Compile time (DDPOptimizer) vs run time (DDP's buckets)"),
                self.runtime_html,
            ]
        )
        return [selectors, self.lanes_figure, self.details]

    def _compile_options(self) -> list[tuple[str, int]]:
        key = (self.rank, self.model.count(self.rank), self.chosen_compile)
        if self._options is not None and self._options[0] == key:
            return self._options[1]
        options = [("latest", LATEST)]
        for i, h in enumerate(self.model.headers(self.rank)):  # labels without decoding
            label = f"{h[0]} · {h[1]} partition(s) · {h[2]}" if h else f"{i} · (unreadable)"
            options.append((label, i + 1))
        if self.chosen_compile >= len(options):
            options.append((f"{self.chosen_compile - 1} (not yet)", self.chosen_compile))
        self._options = (key, options)
        return options

    def _partition_options(self) -> list[tuple[str, int]]:
        comp = self.compilation
        if comp is None or not comp.partitions:
            return [("none", 0)]
        return [
            (f"{p.index}: {p.name} · {nbytes(p.nbytes)} · {len(p.fqns)} params", p.index)
            for p in comp.partitions
        ]

    def _recorded(self) -> tuple[float, float]:
        comp = self.compilation
        if comp is None:
            return DEFAULT_CAP_MB, 1.0
        return comp.bucket_bytes_cap / MIB, comp.first_bucket_bytes / MIB

    def _read_controls(self) -> None:
        super()._read_controls()
        self.chosen_compile = self.compile_selector.value
        self.partition = self.partition_selector.value

    def _on_cap(self, change: dict[str, Any]) -> None:
        if self._quiet:
            return
        cap, first = self._recorded()
        is_cap = change["owner"] is self.cap_slider
        given = self.cap_mb if is_cap else self.first_cap_mb
        shown = given if given is not None else (cap if is_cap else first)
        new = float(change["new"])
        if controls.snapped(new, shown):
            return
        if is_cap:
            self.cap_mb = new
        else:
            self.first_cap_mb = new
        self.refresh()

    def _on_reset(self, _button: widgets.Button | None = None) -> None:
        self.cap_mb = self.first_cap_mb = None
        self._place_sliders()
        self.refresh()

    def select_partition(self, partition: int) -> None:
        self.partition = partition
        self.refresh()  # which moves the partition selector

    def _on_lane_click(self, trace: Any, points: Any, _state: Any) -> None:
        """A click on a call of the lanes figure selects its partition."""
        if points.point_inds and trace.customdata is not None:
            self.select_partition(int(trace.customdata[points.point_inds[0]]))

    def _place_sliders(self) -> None:
        """Sliders on the compile's caps (their grid through them), unless a what-if is set."""
        cap, first = self._recorded()
        with self._quietly():
            for slider, given, recorded, bounds in (
                (self.cap_slider, self.cap_mb, cap, CAP_LOG2),
                (self.first_cap_slider, self.first_cap_mb, first, FIRST_LOG2),
            ):
                controls.place(slider, recorded if given is None else given, recorded, bounds)

    def _selections(self) -> list[Selection]:
        return [
            (self.compile_selector, self._compile_options(), self.chosen_compile),
            (self.partition_selector, self._partition_options(), self._selected_index()),
        ]

    def _redraw(self) -> None:
        comp = self.compilation
        data = (self.model.revision, self.rank, self.index)
        position = self._position()
        if self._changed("data", data):
            self._set_status(self._status())
            self._place_sliders()
        self.details.layout.display = "" if comp is not None else "none"
        selected = self._selected_index()
        if self._changed("lanes", (*data, selected)):
            fig = figure_lanes(self.model, self.rank, position, selected=selected)
            if self._draw("lanes", fig):
                for trace in self.lanes_figure.data:  # new traces: the click goes to each again
                    if trace.customdata is not None:
                        trace.on_click(self._on_lane_click)
            self.partition_html.value = self.partition_text()
            p = self.selected
            code = p.code if p is not None and p.code else "(no generated code captured)"
            self.code_html.value = PRE.format(html.escape(code))
        if comp is None:
            return
        compare = None
        if self._changed("compare", (*data, id(self.user_plan))):
            compare = figure_compare(self.model, self.rank, position, plan=self.user_plan)
            self._draw("compare", compare)
            self.differences_html.value = _view_text.differences_html(self.differences())
        if self._changed("what_if", (*data, self.cap_mb, self.first_cap_mb)):
            if compare is None or self.user_plan is not None or self.what_if:
                compare = figure_compare(self.model, self.rank, position, **self._caps())
            # (without a what-if or a plan of the user's, the what-if is the comparison)
            self._draw("what_if", compare)
            self.what_if_html.value = self.what_if_text()
            fig = figure_cap_sweep(self.model, self.rank, position, current_mb=self.cap_mb)
            self._draw("sweep", fig)
        runtime = "<br>".join(html.escape(line) for line in self.model.versus_runtime(self.rank))
        if self.runtime_html.value != runtime:  # the bucket map fills in after the compile
            self.runtime_html.value = runtime
