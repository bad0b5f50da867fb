"""Pure plotly figures of a ``BucketMap``: the same figures serve widgets, report and tests.

``figure_bucket_map``: observed (left) and planned (right) buckets, one horizontal bar
per bucket made of one segment per parameter (``segments.py``), coloured by owning
module, caps as vertical lines, differences from the plan outlined in red and marked
with an x. Timing and health figures are in ``figures_timeline.py``.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Mapping, Sequence
from typing import Any

import plotly.graph_objects as go

from interactive_shard.buckets.analysis import Comparison, compare
from interactive_shard.buckets.model import BucketMap
from interactive_shard.buckets.segments import DIFF, Row, bar_panel, module_groups

ROW_PX, MAX_HEIGHT = 26, 1400
# A JupyterLab output area is about 650-900 px wide: size the legend for the narrow end.
LEGEND_ROW_PX, LEGEND_WIDTH_PX = 22, 600
_UNITS = ((2**20, "MiB"), (2**10, "KiB"), (1, "B"))


def _unit(largest: float) -> tuple[float, str]:
    return next((scale, name) for scale, name in _UNITS if largest >= scale)


def _fmt_bytes(n: float) -> str:
    scale, name = _unit(max(n, 1))
    return f"{n / scale:.3g} {name}"


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
    what_if = dict(what_if or {})
    observed = bucket_map.observed(iteration, rank)
    planned, comparison, error = None, None, ""
    try:
        planned = bucket_map.planned(iteration, **what_if)
        comparison = compare(iteration, rank, planned, observed)
    except (LookupError, ValueError, TypeError) as e:
        error = str(e)
    modules = module_groups(bucket_map)
    moved = set(comparison.moved) if comparison else set()
    obs_rows = [Row(b.index, b.fqns, b.shapes, b.dtypes, b.nbytes) for b in observed]
    plan_rows = [Row(b.index, b.fqns, b.shapes, b.dtypes, b.nbytes) for b in planned or []]
    obs_caps = _recorded_caps(bucket_map, iteration)
    plan_caps = _caps(planned or [])
    largest = max([r.nbytes for r in (*obs_rows, *plan_rows)] or [1])
    scale, unit = _unit(largest)

    traces = [
        *bar_panel(obs_rows, "", modules, moved, scale, True),
        *bar_panel(plan_rows, "2", modules, moved, scale, not obs_rows),
        *(_diff_markers(comparison, scale) if comparison is not None else []),
    ]
    shapes, notes = [], []
    for axis, caps in (("", obs_caps), ("2", plan_caps)):
        for cap in caps:
            if cap <= 1.5 * largest:
                shapes.append(_vline(cap / scale, axis))
                notes.append(_note(f"cap {_fmt_bytes(cap)}", cap / scale, f"x{axis}", 1.0))
            else:  # drawing it would squash every bar to a sliver
                text = f"cap {_fmt_bytes(cap)} →"
                notes.append(_note(text, 1.0, f"x{axis} domain", 1.0, xanchor="right"))
    stage = _stage(bucket_map, iteration, what_if)
    verdict = _verdict(comparison, error, observed)
    info = bucket_map.info
    reported = sum(len(r.fqns) for r in obs_rows)
    if info and reported < len(info.fqns) and bucket_map.record(iteration, rank) is None:
        verdict = f"in progress: {reported} of {len(info.fqns)} parameters reported so far"
    title = f"<b>DDP buckets · iteration {iteration} · rank {rank}</b><br>{verdict}"
    legend = [t["name"] for t in traces if t.get("showlegend")]
    layout = _layout(title, unit, (len(obs_rows), len(plan_rows)), legend)
    layout["shapes"] = shapes
    layout["annotations"] = [
        _note(f"<b>observed</b>: {_count(obs_rows)}", 0.0, "paper", 1.0, 12, 22, "left"),
        _note(f"<b>planned</b>: {_count(plan_rows)} ({stage})", 0.54, "paper", 1, 12, 22, "left"),
        *notes,
    ]
    # One constructor call: plotly validates dicts once, while add_traces/update_layout
    # on a built figure validate and copy again.
    return go.Figure(data=traces, layout=layout)


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
        return f"<span style='color:{DIFF}'>cannot plan: {error}</span>"
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
        for axis, rows in sides
        if rows
    ]
    if traces:
        traces[0]["showlegend"] = True
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


def _layout(title: str, unit: str, counts: tuple[int, int], legend: list[str]) -> dict[str, Any]:
    rows = max(*counts, 1)

    def yaxis(n: int, anchor: str) -> dict[str, Any]:
        return {
            "tickmode": "array",
            "tickvals": list(range(n)),
            "ticktext": [f"bucket {i}" for i in range(n)],
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
        yaxis=yaxis(counts[0], "x"),
        yaxis2=yaxis(counts[1], "x2"),
        legend={
            "orientation": "h",
            "yref": "container",
            "y": 0,
            "yanchor": "bottom",
            "font": {"size": 11},
        },
        hoverlabel={"align": "left"},
    )
