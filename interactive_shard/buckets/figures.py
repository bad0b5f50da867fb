"""Pure plotly figures of a ``BucketMap``: the same figures serve widgets, report and tests.

``figure_bucket_map``: observed (left) and planned (right) buckets, one horizontal bar
per bucket made of one segment per parameter (``segments.py``), coloured by owning
module, caps as vertical lines, differences from the plan outlined in red and marked
with an x. Parameters of ``delay_all_reduce_named_params`` are in no bucket: they get a
hatched row of their own below the buckets. Timing and health figures are in
``figures_timeline.py``.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import plotly.graph_objects as go

from interactive_shard.buckets._params import key_fqn
from interactive_shard.buckets.analysis import Comparison, compare
from interactive_shard.buckets.model import BucketMap
from interactive_shard.buckets.plan import BucketPlan
from interactive_shard.buckets.segments import (
    DIFF,
    Modules,
    Row,
    bar_panel,
    module_groups,
    param_bytes,
)
from interactive_shard.ui.format import byte_unit, nbytes
from interactive_shard.ui.text import literal

Spec = tuple[list[dict[str, Any]], dict[str, Any]]  # a figure's traces and layout, as dicts
ROW_PX, MAX_HEIGHT = 26, 1400
# A JupyterLab output area is about 650-900 px wide: size the legend for the narrow end.
LEGEND_ROW_PX, LEGEND_WIDTH_PX = 22, 600


def _caps(buckets: Sequence[Any]) -> list[int]:
    caps = {b.cap_bytes for b in buckets if 0 < b.cap_bytes < sys.maxsize}
    return sorted(caps)


def figure_bucket_map(
    bucket_map: BucketMap,
    iteration: int = 1,
    rank: int = 0,
    *,
    what_if: Mapping[str, Any] | None = None,
) -> go.Figure:
    """Observed buckets (left) next to the planned ones (right) for one iteration and rank.

    ``what_if`` re-plans the right panel with other DDP settings (e.g.
    ``{"bucket_cap_mb": 0.5}``); differences are then those the new setting would make.
    """
    traces, layout = bucket_map_spec(bucket_map, iteration, rank, what_if=what_if)
    # One constructor call: plotly validates dicts once, while add_traces/update_layout
    # on a built figure validate and copy again.
    return go.Figure(data=traces, layout=layout)


def bucket_map_spec(
    bucket_map: BucketMap,
    iteration: int = 1,
    rank: int = 0,
    *,
    what_if: Mapping[str, Any] | None = None,
) -> Spec:
    """``figure_bucket_map`` as plain trace dicts and a layout dict (not validated):
    a live view redraws only what changed from them (``_redraw.py``)."""
    what_if = dict(what_if or {})
    observed = bucket_map.observed(iteration, rank)
    planned, comparison, error, plan = None, None, "", None
    try:
        plan = bucket_map.plan(**what_if)
        planned = plan.iteration(iteration)
        comparison = compare(iteration, rank, planned, observed)
    except (LookupError, ValueError, TypeError) as e:
        error = str(e)
    modules = module_groups(bucket_map)
    moved = set(comparison.moved) if comparison else set()
    obs_rows = [Row(b.index, b.fqns, b.shapes, b.dtypes, b.nbytes) for b in observed]
    plan_rows = [Row(b.index, b.fqns, b.shapes, b.dtypes, b.nbytes) for b in planned or []]
    # One level below every bucket of both panels, so the buckets stay level.
    below = max(len(obs_rows), len(plan_rows))
    delayed = (_recorded_delayed(bucket_map, below), _planned_delayed(plan, below))
    obs_caps = _recorded_caps(bucket_map, iteration)
    plan_caps = _caps(planned or [])
    largest = max([r.nbytes for r in (*obs_rows, *plan_rows, *delayed) if r] or [1])
    scale, unit = byte_unit(largest)

    traces = [
        *bar_panel(obs_rows, "", modules, moved, scale, True),
        *bar_panel(plan_rows, "2", modules, moved, scale, not obs_rows),
        *(_diff_markers(comparison, scale) if comparison is not None else []),
    ]
    shown = {t["name"] for t in traces if t.get("showlegend")}
    for axis, row, rows in (("", delayed[0], obs_rows), ("2", delayed[1], plan_rows)):
        if row is not None:
            traces += _delayed_bars(row, axis, modules, scale, shown, rows)
    shapes, notes = [], []
    for axis, caps in (("", obs_caps), ("2", plan_caps)):
        for cap in caps:
            if cap <= 1.5 * largest:
                shapes.append(_vline(cap / scale, axis))
                notes.append(_note(f"cap {nbytes(cap)}", cap / scale, f"x{axis}", 1.0))
            else:  # drawing it would squash every bar to a sliver
                text = f"cap {nbytes(cap)} →"
                notes.append(_note(text, 1.0, f"x{axis} domain", 1.0, xanchor="right"))
    stage = _stage(bucket_map, iteration, what_if)
    verdict = _verdict(comparison, error, observed)
    info = bucket_map.info
    reported = sum(len(r.fqns) for r in obs_rows)
    if info and reported < len(info.fqns) and bucket_map.record(iteration, rank) is None:
        verdict = f"in progress: {reported} of {len(info.fqns)} parameters reported so far"
    title = f"<b>DDP buckets · iteration {iteration} · rank {rank}</b><br>{verdict}"
    for axis, row in (("", delayed[0]), ("2", delayed[1])):
        if row is not None:
            notes.append(_delayed_note(row, axis, scale))
    legend = [t["name"] for t in traces if t.get("showlegend")]
    ticks = (_ticks(len(obs_rows), delayed[0]), _ticks(len(plan_rows), delayed[1]))
    layout = _layout(title, unit, ticks, legend)
    layout["shapes"] = shapes
    obs_title, plan_title = (
        _count(rows) + (" + delayed" if row is not None else "")
        for rows, row in ((obs_rows, delayed[0]), (plan_rows, delayed[1]))
    )
    layout["annotations"] = [
        _note(f"<b>observed</b>: {obs_title}", 0.0, "paper", 1.0, 12, 22, "left"),
        _note(f"<b>planned</b>: {plan_title} ({stage})", 0.54, "paper", 1, 12, 22, "left"),
        *notes,
    ]
    return traces, layout


Ticks = tuple[list[int], list[str]]  # a panel's y tick values and labels


@dataclass(frozen=True)
class DelayedRow(Row):
    """The parameters DDP all-reduces outside its buckets, drawn as one more row."""

    hook: str | None = None  # param_to_hook_all_reduce's fqn


def _recorded_delayed(bm: BucketMap, index: int) -> DelayedRow | None:
    """What the probe read from DDP (``ddp_watch.delayed``)."""
    info = bm.info
    d = info.delayed if info is not None else None
    if d is None:
        return None
    fqns = [key_fqn(f) for f in d.fqns]  # DDP's key ".pos" is the parameter "pos"
    size = sum(param_bytes(shape, dtype) for shape, dtype in zip(d.shapes, d.dtypes, strict=True))
    return DelayedRow(index, fqns, d.shapes, d.dtypes, size, d.hook)


def _planned_delayed(plan: BucketPlan | None, index: int) -> DelayedRow | None:
    d = plan.delayed if plan is not None else None
    if d is None:
        return None
    return DelayedRow(index, d.fqns, d.shapes, d.dtypes, d.nbytes, d.hook)


def _delayed_bars(
    row: DelayedRow,
    axis: str,
    modules: Modules,
    scale: float,
    shown: set[str],
    buckets: Sequence[Row],
) -> list[dict[str, Any]]:
    """The delayed row: module colours as in the buckets, hatched, its own hover."""
    # The hook's name goes in the hover text, not the template: a name is data, never
    # a template's %{...} (nor markup: ui.text.literal).
    hook = f"the gradient hook on {literal(row.hook)}" if row.hook else "a gradient hook"
    bucketed = {literal(f) for b in buckets for f in b.fqns}  # as the traces' text holds them
    traces = bar_panel([row], axis, modules, set(), scale, False, every_group=False)
    for t in traces:
        t["marker"]["pattern"] = {"shape": "/", "fgcolor": "#FFFFFF", "solidity": 0.3}
        t["showlegend"] = t["name"] not in shown  # a module seen only here
        shown.add(t["name"])
        also = [
            " · also in a bucket (DDP did not match its name)" * (f in bucketed) for f in t["text"]
        ]
        delayed = f"delayed: in no bucket; all-reduced in one flat buffer ({row.nbytes:,} bytes)"
        t["hovertext"] = np.array(
            [f"{h}{a}<br>{delayed} from {hook}" for h, a in zip(t["hovertext"], also, strict=True)],
            dtype=object,
        )
        t["hovertemplate"] = "<b>%{text}</b><br>%{hovertext}<extra></extra>"
    return traces


def _delayed_note(row: DelayedRow, axis: str, scale: float) -> dict[str, Any]:
    at = f" · all-reduced at {literal(row.hook)}'s hook" if row.hook else ""
    note = _note(f"{nbytes(row.nbytes)}{at}", row.nbytes / scale, f"x{axis}", 0, 10)
    # Beside the bar's end, at its level (data coordinates, not the paper's bottom).
    note.update(xanchor="left", xshift=4, y=row.index, yref=f"y{axis}", yanchor="middle")
    return note


def _ticks(buckets: int, delayed: DelayedRow | None) -> Ticks:
    values, labels = list(range(buckets)), [f"bucket {i}" for i in range(buckets)]
    if delayed is not None:
        values.append(delayed.index)
        labels.append("delayed")
    return values, labels


def _recorded_caps(bm: BucketMap, iteration: int) -> list[int]:
    try:
        return _caps(bm.planned(iteration))
    except (LookupError, ValueError, TypeError):
        return []


def _stage(bm: BucketMap, iteration: int, what_if: Mapping[str, Any]) -> str:
    try:
        plan = bm.plan(**what_if)
    except (LookupError, ValueError, TypeError):
        return "unavailable"
    stage = "rebuilt" if plan.iteration(iteration) is plan.rebuilt and plan.rebuilds else "initial"
    if what_if:
        # Short: the subplot title has half the figure's width.
        names = {"bucket_cap_mb": "cap", "bucket_cap_mb_list": "caps"}
        return f"{stage}, if " + ", ".join(
            f"{names.get(k, k)}={_short(v)}" for k, v in what_if.items()
        )
    return stage


def _verdict(c: Comparison | None, error: str, observed: Sequence[Any]) -> str:
    if c is None:
        return f"<span style='color:{DIFF}'>cannot plan: {literal(error)}</span>"
    if not observed:
        return "no bucket reported for this iteration yet"
    if c.matches:
        return "observed = planned"
    return f"<span style='color:{DIFF}'>differs: {c.summary}</span>"


def _diff_markers(c: Comparison, scale: float) -> list[dict[str, Any]]:
    """An x at the end of each bucket whose parameters differ from the other side."""
    planned = {b.index: b.fqns for b in c.planned}
    observed = {b.index: b.fqns for b in c.observed}
    sides = (
        ("", [b for b in c.observed if planned.get(b.index) != b.fqns]),
        ("2", [b for b in c.planned if c.observed and observed.get(b.index) != b.fqns]),
    )
    traces = [
        dict(
            type="scatter",
            x=[b.nbytes / scale for b in rows],
            y=[b.index for b in rows],
            xaxis=f"x{axis}",
            yaxis=f"y{axis}",
            mode="markers",
            marker={"symbol": "x", "color": DIFF, "size": 11},
            name="differs from plan (red outline: moved parameter)",
            legendgroup="diff",
            showlegend=False,
            hoverinfo="skip",
        )
        for axis, rows in sides  # both, empty or not: the same traces every iteration
    ]
    drawn = [t for t in traces if t["y"]]
    if drawn:
        drawn[0]["showlegend"] = True
    return traces


def _vline(x: float, axis: str) -> dict[str, Any]:
    return {
        "type": "line",
        "xref": f"x{axis}",
        "yref": f"y{axis} domain",
        "x0": x,
        "x1": x,
        "y0": 0,
        "y1": 1,
        "line": {"color": "#555555", "width": 1.5, "dash": "dash"},
        "name": "cap",
    }


def title_at_top(text: str) -> dict[str, Any]:
    """A (two-line) title pinned to the figure's top left, whatever its height."""
    return {
        "text": text,
        "font": {"size": 14},
        "x": 0,
        "xref": "paper",
        "xanchor": "left",
        "y": 1,
        "yref": "container",
        "yanchor": "top",
        "pad": {"t": 12},
    }


def legend_rows(names: list[str]) -> int:
    """Rows a horizontal legend needs, from its text width (about 6.5 px a character)."""
    return math.ceil(sum(40 + 6.5 * len(name) for name in names) / LEGEND_WIDTH_PX)


def _count(rows: Sequence[Any]) -> str:
    return f"{len(rows)} bucket" + ("" if len(rows) == 1 else "s")


def _short(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.3g}"
    if isinstance(value, list):
        return "[" + ", ".join(map(_short, value)) + "]"
    return str(value)


def _note(
    text: str,
    x: float,
    xref: str,
    y: float,
    size: int = 11,
    shift: int = 0,
    xanchor: str = "center",
) -> dict[str, Any]:
    return {
        "text": text,
        "x": x,
        "xref": xref,
        "xanchor": xanchor,
        "y": y,
        "yref": "paper",
        "yshift": shift,  # pixels: subplot titles sit above the cap labels at any height
        "showarrow": False,
        "yanchor": "bottom",
        "font": {"size": size},
    }


def _layout(title: str, unit: str, ticks: tuple[Ticks, Ticks], legend: list[str]) -> dict[str, Any]:
    rows = max(*(max(values, default=-1) + 1 for values, _ in ticks), 1)

    def yaxis(axis_ticks: Ticks, anchor: str) -> dict[str, Any]:
        values, labels = axis_ticks
        return {
            "tickmode": "array",
            "tickvals": values,
            "ticktext": labels,
            "range": [rows - 0.5, -0.5],  # bucket 0 on top; bucket i level in both panels
            "anchor": anchor,
            "zeroline": False,
        }

    # Pixel budget: the legend sits at the bottom of the figure (container coordinates),
    # below a margin sized for its rows, so it never covers the axis titles.
    bottom = 70 + LEGEND_ROW_PX * legend_rows(legend)
    top = 100  # two title lines, the panel titles, then the cap labels
    return dict(
        title=title_at_top(title),
        barmode="overlay",
        bargap=0.25,
        height=min(MAX_HEIGHT, top + bottom + max(ROW_PX * rows, 90)),
        margin={"l": 80, "r": 20, "t": top, "b": bottom},
        xaxis={"domain": [0.0, 0.46], "title": {"text": f"bytes ({unit})"}, "anchor": "y"},
        xaxis2={"domain": [0.54, 1.0], "title": {"text": f"bytes ({unit})"}, "anchor": "y2"},
        yaxis=yaxis(ticks[0], "x"),
        yaxis2=yaxis(ticks[1], "x2"),
        legend={
            "orientation": "h",
            "yref": "container",
            "y": 0,
            "yanchor": "bottom",
            "font": {"size": 11},
        },
        hoverlabel={"align": "left"},
    )
