"""Pure plotly figures of a ``SplitsModel``: the same figures serve the view, report and tests.

``figure_lanes`` (``figures_lanes.py``): one compile's partitions as lanes with their
calls, regions as bands, entries ▶ and exits ◀. ``figure_compare``: captured partitions
(left) next to planned ones (right), differences outlined in red; caps given re-plan
the right side (the what-if). ``figure_cap_sweep``: how many partitions each cap cuts
the graph into. ``figure_nothing`` says why nothing was compiled;
``figure_versus_runtime`` puts the compile-time partitions next to DDP's runtime
buckets; ``report_figures`` is the report's section.
"""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from typing import Any

import plotly.graph_objects as go

from interactive_shard.splits.compare import compare_graph, compare_partition
from interactive_shard.splits.events import Partition, SplitCompile
from interactive_shard.splits.figures_lanes import (
    DIFF,
    MAX_HEIGHT,
    figure_lanes,
    figure_nothing,
    hover_partition,
    pick,
    short_target,
    title_at_top,
)
from interactive_shard.splits.model import SplitsModel
from interactive_shard.splits.plan import MIB, GraphPlan, SplitPlan, SplitPlanError, plan_graph
from interactive_shard.ui.colors import PALETTE
from interactive_shard.ui.format import byte_unit, nbytes
from interactive_shard.ui.plain_figure import figure
from interactive_shard.ui.text import literal

__all__ = [
    "figure_cap_sweep",
    "figure_compare",
    "figure_lanes",
    "figure_nothing",
    "figure_versus_runtime",
    "report_figures",
]

SWEEP_CAPS_MB = tuple(2.0**k for k in range(0, 8))  # 1 .. 128 MiB


# -- figure: planned vs captured --------------------------------------------------------------
def plan_for(
    model: SplitsModel,
    rank: int = 0,
    index: int = -1,
    *,
    plan: SplitPlan | GraphPlan | None = None,
    bucket_cap_mb: float | None = None,
    first_bucket_cap_mb: float | None = None,
) -> GraphPlan:
    """The plan compile ``index`` is compared with: ``plan`` (a ``SplitPlan``'s graph at
    the compile's position), else the planner on its graph at its caps or those given.
    Raises ``SplitPlanError`` (caps) or ``LookupError`` (nothing to compare)."""
    if plan is None:
        return model.plan(
            rank, index, bucket_cap_mb=bucket_cap_mb, first_bucket_cap_mb=first_bucket_cap_mb
        )
    if isinstance(plan, GraphPlan):
        return plan
    if plan.nothing:
        raise LookupError(f"the plan says nothing is compiled: {plan.nothing}")
    position = index % max(model.count(rank), 1)
    if position >= len(plan.graphs):
        raise LookupError(f"the plan has {len(plan.graphs)} graph(s): none for compile {position}")
    return plan.graphs[position]


def differing(planned: Sequence[Partition], captured: Sequence[Partition]) -> set[int]:
    """Positions whose planned and captured partitions differ (or exist on one side only)."""
    out = {
        i
        for i, (p, c) in enumerate(zip(planned, captured, strict=False))
        if compare_partition("", p, c)
    }
    return out | set(range(min(len(planned), len(captured)), max(len(planned), len(captured))))


def figure_compare(
    model: SplitsModel,
    rank: int = 0,
    index: int = -1,
    *,
    plan: SplitPlan | GraphPlan | None = None,
    bucket_cap_mb: float | None = None,
    first_bucket_cap_mb: float | None = None,
) -> go.Figure:
    """Captured partitions (left) next to planned ones (right): a bar per partition of its
    bytes, differences outlined red; the caps given re-plan the right side (what-if)."""
    comp = pick(model, rank, index)
    if comp is None:
        return figure_nothing(model, rank)
    try:
        planned = plan_for(
            model,
            rank,
            index,
            plan=plan,
            bucket_cap_mb=bucket_cap_mb,
            first_bucket_cap_mb=first_bucket_cap_mb,
        )
    except (SplitPlanError, LookupError) as err:
        return _comparison(comp, None, rank=rank, error=str(err))
    what_if = None if bucket_cap_mb is None and first_bucket_cap_mb is None else planned
    return _comparison(comp, planned, rank=rank, what_if=what_if is not None)


def _comparison(
    comp: SplitCompile,
    planned: GraphPlan | None,
    *,
    rank: int = 0,
    error: str | None = None,
    what_if: bool = False,
) -> go.Figure:
    got = comp.partitions
    want = planned.partitions if planned is not None else []
    marked = differing(want, got) if planned is not None else set()
    largest = max([p.nbytes for p in (*got, *want)] or [1])
    scale, unit = byte_unit(largest)
    traces = [
        _bars(got, "", PALETTE[0], marked, scale, "captured"),
        _bars(want, "2", PALETTE[2], marked, scale, "planned"),
    ]
    for axis, side in (("", got), ("2", want)):
        rows = [p for i, p in enumerate(side) if i in marked]
        if rows:
            traces.append(
                dict(
                    type="scatter",
                    x=[p.nbytes / scale for p in rows],
                    y=[p.index for p in rows],
                    xaxis=f"x{axis}",
                    yaxis=f"y{axis}",
                    mode="markers",
                    marker={"symbol": "x", "color": DIFF, "size": 11},
                    name="differs",
                    showlegend=axis == "",
                    hoverinfo="skip",
                )
            )
    if error is not None:
        verdict = f"<span style='color:{DIFF}'>cannot plan: {literal(error)}</span>"
        lines: list[str] = []
    else:
        assert planned is not None
        lines = compare_graph(f"compile {comp.index}", planned, comp)
        if what_if:
            verdict = (
                f"<b>what if</b> cap {nbytes(planned.bucket_bytes_cap)} (first "
                f"{nbytes(planned.first_bucket_bytes)}): {len(want)} partition(s), "
                f"captured {len(got)} at cap {nbytes(comp.bucket_bytes_cap)}"
            )
        elif not lines:
            verdict = "captured = planned"
        else:
            verdict = f"<span style='color:{DIFF}'>{len(lines)} difference(s) from the plan</span>"
    n = max(len(got), len(want), 1)
    notes = [
        _panel_note(f"<b>captured</b>: {len(got)} partition(s)", 0.0),
        _panel_note(
            f"<b>{'what-if plan' if what_if else 'planned'}</b>: {len(want)} partition(s)", 0.54
        ),
    ]
    shown = [] if what_if else lines[:4]
    if shown:
        more = f"<br>… {len(lines) - len(shown)} more" if len(lines) > len(shown) else ""
        text = "<br>".join(literal(textwrap.shorten(line, 140)) for line in shown) + more
        notes.append(
            {
                "text": text,
                "x": 0,
                "xref": "paper",
                "xanchor": "left",
                "y": 0,
                "yref": "paper",
                "yanchor": "top",
                "yshift": -45,
                "align": "left",
                "showarrow": False,
                "font": {"size": 11, "color": DIFF},
            }
        )
    bottom = 60 + 16 * (len(shown) + (1 if len(lines) > len(shown) else 0))
    layout = dict(
        title=title_at_top(
            f"<b>Planned vs captured · rank {rank} · compile {comp.index}</b><br>{verdict}"
        ),
        height=min(MAX_HEIGHT, 110 + bottom + 34 * n),
        margin={"l": 70, "r": 20, "t": 90, "b": bottom},
        barmode="overlay",
        xaxis={"domain": [0.0, 0.46], "title": {"text": f"bytes ({unit})"}, "anchor": "y"},
        xaxis2={"domain": [0.54, 1.0], "title": {"text": f"bytes ({unit})"}, "anchor": "y2"},
        yaxis=_partition_axis(n, "x"),
        yaxis2=_partition_axis(n, "x2"),
        annotations=notes,
        showlegend=bool(marked),
        legend={"orientation": "h", "x": 1, "xanchor": "right", "y": 1.02, "yanchor": "bottom"},
        hoverlabel={"align": "left"},
    )
    return figure(traces, layout)


def _bars(
    parts: Sequence[Partition], axis: str, color: str, marked: set[int], scale: float, side: str
) -> dict[str, Any]:
    hover = []
    for p in parts:
        calls = ", ".join(short_target(c) for c in p.calls[:12]) + (
            " …" if len(p.calls) > 12 else ""
        )
        regions = "; ".join(r.describe() for r in p.regions) or "none"
        hover.append(
            f"{hover_partition(p)}<br>{len(p.calls)} calls: {literal(calls)}<br>regions: "
            f"{literal(regions)}"
        )
    return dict(
        type="bar",
        orientation="h",
        name=side,
        x=[p.nbytes / scale for p in parts],
        y=[p.index for p in parts],
        xaxis=f"x{axis}",
        yaxis=f"y{axis}",
        text=[f"{literal(p.name)} · {len(p.calls)} calls · {len(p.fqns)} params" for p in parts],
        textposition="inside",
        insidetextanchor="start",
        hovertext=hover,
        hoverinfo="text",
        marker={
            "color": color,
            "line": {
                "color": [DIFF if p.index in marked else color for p in parts],
                "width": [3 if p.index in marked else 0 for p in parts],
            },
        },
        showlegend=False,
    )


def _partition_axis(n: int, anchor: str) -> dict[str, Any]:
    return {
        "tickmode": "array",
        "tickvals": list(range(n)),
        "ticktext": [f"partition {i}" for i in range(n)],
        "range": [n - 0.5, -0.5],  # partition 0 on top
        "anchor": anchor,
        "zeroline": False,
    }


def _panel_note(text: str, x: float) -> dict[str, Any]:
    return {
        "text": text,
        "x": x,
        "xref": "paper",
        "xanchor": "left",
        "y": 1,
        "yref": "paper",
        "yanchor": "bottom",
        "showarrow": False,
        "font": {"size": 12},
    }


# -- figure: the cap's trade-off --------------------------------------------------------------
def sweep(
    comp: SplitCompile, caps_mb: Sequence[float] = SWEEP_CAPS_MB
) -> list[tuple[float, GraphPlan]]:
    """(cap in MiB, plan) for each cap DDPOptimizer accepts at the compile's first-bucket cap."""
    out = []
    for cap_mb in sorted({*caps_mb, comp.bucket_bytes_cap / MIB}):
        cap = int(cap_mb * MIB)
        if cap >= comp.first_bucket_bytes:
            out.append((cap_mb, plan_graph(comp.graph, cap, comp.first_bucket_bytes)))
    return out


def figure_cap_sweep(
    model: SplitsModel, rank: int = 0, index: int = -1, *, current_mb: float | None = None
) -> go.Figure:
    """Partitions (and the largest one's bytes) the planner cuts compile ``index``'s graph
    into at each cap: a smaller cap overlaps more all-reduce with backward, in more pieces."""
    comp = pick(model, rank, index)
    if comp is None:
        return figure_nothing(model, rank)
    found = sweep(comp, (*SWEEP_CAPS_MB, *([current_mb] if current_mb else [])))
    x = [c for c, _ in found]
    counts = [len(p.partitions) for _, p in found]
    hover = [
        f"cap {c:.3g} MiB: {len(p.partitions)} partition(s)<br>"
        + ", ".join(nbytes(q.nbytes) for q in p.partitions)
        for c, p in found
    ]
    traces = [
        dict(
            type="scatter",
            x=x,
            y=counts,
            mode="lines+markers",
            name="partitions",
            line={"shape": "hv", "color": PALETTE[0]},
            hovertext=hover,
            hoverinfo="text",
        )
    ]
    shapes = [_vline(comp.bucket_bytes_cap / MIB, "#555555", "dash")]
    if current_mb is not None:
        shapes.append(_vline(current_mb, PALETTE[5], "solid"))
    title = (
        f"<b>What a cap does · rank {rank} · compile {comp.index}</b><br>smaller cap: more "
        "partitions, so more all-reduce overlaps backward, but more graph breaks (dashed: "
        f"the run's cap {comp.bucket_bytes_cap / MIB:.3g} MiB)"
    )
    layout = dict(
        title=title_at_top(title),
        height=320,
        margin={"l": 60, "r": 20, "t": 80, "b": 50},
        xaxis={"type": "log", "title": {"text": "bucket_cap_mb (MiB)"}},
        yaxis={
            "title": {"text": "partitions"},
            "rangemode": "tozero",
            "dtick": 1 if max(counts or [1]) < 12 else None,
        },
        shapes=shapes,
    )
    return figure(traces, layout)


def _vline(x: float, color: str, dash: str) -> dict[str, Any]:
    return {
        "type": "line",
        "xref": "x",
        "yref": "y domain",
        "x0": x,
        "x1": x,
        "y0": 0,
        "y1": 1,
        "line": {"color": color, "width": 1.5, "dash": dash},
    }


def figure_versus_runtime(model: SplitsModel, rank: int = 0) -> go.Figure:
    """DDPOptimizer's compile-time partitions next to DDP's runtime buckets, in words."""
    lines = model.versus_runtime(rank)
    table = dict(
        type="table",
        header={
            "values": ["<b>compile time (DDPOptimizer) vs run time (DDP buckets)</b>"],
            "align": "left",
        },
        cells={"values": [[literal(line) for line in lines]], "align": "left", "height": 24},
    )
    layout = dict(
        title=title_at_top(
            f"<b>Compile-time partitions vs DDP's runtime buckets · rank {rank}</b>"
        ),
        height=120 + 40 * len(lines),
        margin={"l": 20, "r": 20, "t": 50, "b": 10},
    )
    return figure([table], layout)


MAX_REPORT_COMPILES = 2  # the first and the latest


def report_figures(model: SplitsModel) -> list[go.Figure]:
    """The report's splits section: rank 0's first and latest compile (lanes, planned vs
    captured), the cap's trade-off, compile time vs run time; why a rank compiled nothing."""
    model.update()
    ranks = model.ranks
    if not ranks:
        return []
    rank = 0 if 0 in ranks else ranks[0]
    found = model.count(rank)
    figures = [figure_nothing(model, r) for r in ranks if model.nothing(r) and not model.count(r)]
    if not found:
        return figures
    for i in dict.fromkeys([0, found - 1][:MAX_REPORT_COMPILES]):
        figures.append(figure_lanes(model, rank, i))
        figures.append(figure_compare(model, rank, i))
    figures.append(figure_cap_sweep(model, rank))
    figures.append(figure_versus_runtime(model, rank))
    return figures
