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

import html
from typing import Any

import ipywidgets as widgets
import plotly.graph_objects as go

from interactive_shard.precision.analysis import describe_policy
from interactive_shard.precision.compare import Plan, differing_phases, short
from interactive_shard.precision.events import PHASES, Unit
from interactive_shard.precision.figures import (
    DIFF,
    DTYPE_COLORS,
    dtype_class,
    figure_grid,
    planned_dtypes,
    report_figures,
    unit_label,
)
from interactive_shard.precision.figures_bytes import (
    LEVEL_COLORS,
    figure_bytes,
    figure_collectives,
    fix_text,
    fmt_bytes,
)
from interactive_shard.precision.model import PrecisionModel
from interactive_shard.ui import live
from interactive_shard.ui.controls import Panels, swap_figure

__all__ = ["PrecisionView", "report_figures"]

LATEST = 0  # iteration selector value that follows the newest iteration
MAX_FINDINGS = 30  # listed in the widget; all are in PrecisionModel.findings
MAX_FAILED = 20  # failed iterations named next to the iteration selector


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
        if self.chosen_rank is not None:
            return self.chosen_rank
        ranks = self.model.ranks
        return 0 if 0 in ranks or not ranks else ranks[0]

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
        fqn = self.unit
        u = None if fqn is None else self.model.unit(fqn, rank=self.rank)
        if u is None:
            return ""
        r, it = self.rank, self.iteration
        observed = self.model.observed(u.fqn, rank=r, iteration=it)
        planned = planned_dtypes(self.plan).get(u.fqn)
        differ = set(differing_phases(planned, observed)) if planned is not None else set()
        head = (
            f"<b>{html.escape(u.fqn or 'root')}</b> ({html.escape(u.module_type)}) · parent "
            f"{html.escape(_name(u.parent))} · {len(u.params)} parameter(s), {u.numel:,} elements "
            f"stored in {html.escape(short(', '.join(dict.fromkeys(u.param_dtypes))) or '—')}"
            f"<br><b>policy</b>: <code>{html.escape(describe_policy(u.policy))}</code>"
        )
        rows = "".join(
            f"<tr><td>{p}</td>"
            + (f"<td>{_chip(planned.get(p))}</td>" if planned is not None else "")
            + f"<td>{_chip(observed.get(p), p in differ)}</td></tr>"
            for p in PHASES
        )
        plan_head = "<th>planned</th>" if planned is not None else ""
        table = (
            f"<table><tr><th>phase</th>{plan_head}<th>observed (rank {r}, iteration {it})</th>"
            f"</tr>{rows}</table>"
        )
        inputs = self.model.inputs(u.fqn, rank=r, iteration=it)
        ins = "".join(
            f"<li>input {i}: {_chip(b)} → {_chip(a)} · "
            + ("<b>cast</b>" if c else "passed through (the same tensor)")
            + "</li>"
            for i, (b, a, c) in enumerate(inputs)
        )
        found = self.model.collectives(u.fqn, rank=r, iteration=it)
        colls = "".join(
            f"<tr><td>{c.op}</td><td>{'backward' if c.backward else 'forward'}</td>"
            f"<td>{_chip(c.dtype)}</td><td>{fmt_bytes(c.nbytes)}</td></tr>"
            for c in found
        )
        parts = [head, table]
        parts.append(f"<b>inputs</b><ul>{ins}</ul>" if ins else "<b>inputs</b>: none seen")
        parts.append(
            "<b>collectives</b> (bytes this rank sent)<table><tr><th>op</th><th>when</th>"
            f"<th>dtype</th><th>bytes</th></tr>{colls}</table>"
            if colls
            else "<b>collectives</b>: none seen"
        )
        failed = [f for f in self.model.failures if f.rank == r and f.unit == u.fqn]
        for f in failed:
            parts.append(
                f"<span style='color:{DIFF}'><b>failed</b> in iteration {f.iteration}, in "
                f"<code>{html.escape(f.consumer)}</code>: {html.escape(f.message)}</span>"
            )
        return "<br>".join(parts)

    def findings_text(self) -> str:
        """Observed failures and findings with their fixes, and the plan's predicted ones.

        On a long run, those of the iterations read so far: every rank's first and latest,
        the one shown and those that failed (``run.precision.findings`` reads them all)."""
        items = []
        m = self.model
        also = [(f.rank, f.iteration) for f in m.failures]
        for r in m.ranks:
            also += [(r, 1), (r, m.latest(r) or 1), (r, self.iteration)]
        findings = m.findings_read(also)
        for f in findings[:MAX_FINDINGS]:
            color = LEVEL_COLORS.get(f.level, "#999999")
            where = f"rank(s) {', '.join(map(str, f.ranks))}"
            items.append(
                f"<li><b style='color:{color}'>{f.level} · {f.kind}</b> at "
                f"<b>{html.escape(_name(f.unit))}</b> ({where}): {html.escape(f.message)}"
                f"<br><i>fix</i>: {html.escape(f.fix)}</li>"
            )
        if len(findings) > MAX_FINDINGS:
            items.append(
                f"<li>… {len(findings) - MAX_FINDINGS} more: see "
                "<code>run.precision.findings</code></li>"
            )
        plan = self.plan
        for p in plan.failures if plan is not None else ():
            items.append(
                f"<li><b style='color:{LEVEL_COLORS['planned']}'>predicted failure</b> at "
                f"<b>{html.escape(_name(p.unit))}</b>, in <code>{html.escape(p.consumer)}</code>:"
                f" {html.escape(p.message).replace(chr(10), '<br>')}<br><i>fix</i>: "
                f"{html.escape(getattr(p, 'fix_note', '') or '')} <code>"
                f"{html.escape(fix_text(getattr(p, 'fix', None)))}</code></li>"
            )
        total = sum(m.latest(r) or 0 for r in m.ranks)
        read = m.findings_count
        partial = (
            f" <i>(from {read:,} of {total:,} rank-iterations read: the first, latest, shown "
            "and failed ones; <code>run.precision.findings</code> reads them all)</i>"
            if read < total
            else ""
        )
        if not items:
            return f"<b>Findings:</b> none.{partial}"
        return f"<b>Findings: {len(items)}</b>{partial}<ul>{''.join(items)}</ul>"

    def _status(self) -> str:
        ranks = self.model.ranks
        if not ranks:
            return (
                "<i>Waiting for <code>ish.watch(model)</code> on the ranks (an FSDP2 or FSDP1 "
                "root, or DDP with mixed_precision=)…</i>"
            )
        units = self.model.units(self.rank)
        parts = [
            f"<b>{self.model.wrapper(self.rank)}</b> · {len(units)} unit(s) · world size "
            f"{self.model.world_size} · {self.model.latest() or 0} iteration(s)"
        ]
        failed = self.model.failures
        if failed:
            parts.append(f"<span style='color:{DIFF}'>{len(failed)} failure(s)</span>")
        if self.plan is not None:
            n = len(self.differences())
            parts.append(
                f"<span style='color:{DIFF}'>{n} difference(s) from the plan</span>"
                if n
                else "observed = planned"
            )
        if self.model.skipped:
            parts.append(f"{self.model.skipped} malformed event(s) skipped")
        return " · ".join(parts)

    # -- widgets ---------------------------------------------------------------------------
    def _build(self) -> None:
        self.model.update()
        self.rank_selector = widgets.Dropdown(
            description="rank", options=self._rank_options(), value=self.rank
        )
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
                _heading("Unit"),
                self.unit_html,
                _heading("Planned vs observed"),
                self.differences_html,
                _heading("Findings and failures"),
                self.findings_html,
                _heading("Bytes held per dtype"),
                self.bytes_figure,
                self.collectives_figure,
            ]
        )
        self.refresh()

    def _rank_options(self) -> list[tuple[str, int]]:
        return [(str(r), r) for r in sorted({*self.model.ranks, self.rank})]

    def _iteration_max(self) -> int:
        return max(self.model.latest() or 1, self.chosen_iteration)

    def iteration_text(self) -> str:
        """Next to the iteration selector: what 0 means, the range, the failed ones."""
        latest = self.model.latest(self.rank) or 0
        failed = sorted({f.iteration for f in self.model.failures if f.rank == self.rank})
        shown = ", ".join(map(str, failed[:MAX_FAILED])) + ("…" if len(failed) > MAX_FAILED else "")
        parts = [f"0 = latest ({latest})" if latest else "0 = latest (none yet)"]
        if failed:
            parts.append(f"<span style='color:{DIFF}'>failed: {shown}</span>")
        return " · ".join(parts)

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
        by_label = {_label(self.model, u, self.rank): u.fqn for u in self.model.units(self.rank)}
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
        self.differences_html.value = _differences_html(self.differences(), plan)
        self.findings_html.value = self.findings_text()
        self._draw(self.bytes_figure, shown, figure_bytes(self.model, rank=rank, iteration=it))
        fig = figure_collectives(self.model, rank=rank, iteration=it)
        self._draw(self.collectives_figure, shown, fig)
        fig = figure_grid(self.model, rank=rank, iteration=it, plan=plan, selected=self.unit)
        if self._draw(self.grid_figure, (*shown, id(plan), self.unit), fig):
            for trace in self.grid_figure.data:  # new traces: the click goes to each again
                if trace.type == "heatmap":
                    trace.on_click(self._on_grid_click)
        self.unit_html.value = self.unit_text()

    def _draw(self, target: go.FigureWidget, key: tuple[Any, ...], fig: go.Figure) -> bool:
        """Swap ``fig`` into ``target`` unless it shows what ``key`` says ``target`` shows
        already; then only its title changes. True when swapped."""
        if self._changed(f"figure {id(target)}", key):
            swap_figure(target, fig)
            return True
        title = fig.layout.title.text
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


def _name(fqn: str | None) -> str:
    return "—" if fqn is None else "root" if fqn == "" else fqn


def _label(model: PrecisionModel, u: Unit, rank: int) -> str:
    return unit_label(u, model.depth(u.fqn, rank=rank))


def _chip(dtype: str | None, differs: bool = False) -> str:
    """A dtype as a coloured chip (HTML), outlined red when it differs from the plan."""
    if not dtype:
        return "<span style='color:#999'>—</span>"
    color = DTYPE_COLORS[dtype_class(dtype) or "other"]
    outline = f"outline:3px solid {DIFF};" if differs else ""
    return (
        f"<span style='background:{color};color:white;padding:1px 6px;border-radius:3px;"
        f"{outline}' title='{html.escape(dtype)}'>{html.escape(short(dtype))}</span>"
    )


def _differences_html(lines: list[str], plan: Plan | None) -> str:
    if plan is None:
        return (
            "<i>No plan: <code>view.set_plan(ish.plan_precision(model, policies))</code> "
            "compares every unit and phase.</i>"
        )
    if not lines:
        return "<b>observed = planned</b>: every unit and phase both have, and the failures."
    items = "".join(f"<li>{html.escape(line)}</li>" for line in lines)
    return f"<b style='color:{DIFF}'>{len(lines)} difference(s)</b><ul>{items}</ul>"


def _heading(text: str) -> widgets.HTML:
    return widgets.HTML(f"<h4 style='margin:12px 0 4px 0'>{html.escape(text)}</h4>")
