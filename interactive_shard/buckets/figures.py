"""Pure plotly figures of a ``BucketMap``: the same figures serve widgets, report and tests.

``figure_bucket_map``: observed (left) and planned (right) buckets, one horizontal bar
per bucket made of one segment per parameter, coloured by owning module, caps as
vertical lines, differences from the plan outlined in red and marked with an x.
``figure_bucket_timeline``: per bucket ready -> launch -> done over the backward window.
``figure_health``: the findings as a table.
"""

from __future__ import annotations

import functools
import math
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import plotly.graph_objects as go
import torch

from interactive_shard.buckets.analysis import Comparison, compare
from interactive_shard.buckets.model import BucketMap
from interactive_shard.ui.colors import PALETTE, key_color

DIFF = "#FF0000"  # pure red: not in PALETTE, so a highlight never looks like a module
SEPARATOR = "#FFFFFF"
MAX_LEGEND_MODULES = 24  # beyond this, one trace per colour keeps figures fast
ROW_PX, MAX_HEIGHT = 26, 1400
_UNITS = ((2**20, "MiB"), (2**10, "KiB"), (1, "B"))


@dataclass(frozen=True)
class _Row:
    index: int
    fqns: Sequence[str]
    shapes: Sequence[tuple[int, ...]]
    dtypes: Sequence[str]
    nbytes: int


@functools.lru_cache(maxsize=64)
def _itemsize(dtype: str) -> int:
    resolved = getattr(torch, dtype.removeprefix("torch."), None)
    return resolved.itemsize if isinstance(resolved, torch.dtype) else 4


def _param_bytes(shape: Sequence[int], dtype: str) -> int:
    return math.prod(shape) * _itemsize(dtype)


def _unit(largest: float) -> tuple[float, str]:
    return next((scale, name) for scale, name in _UNITS if largest >= scale)


def _fmt_bytes(n: float) -> str:
    scale, name = _unit(max(n, 1))
    return f"{n / scale:.3g} {name}"


def _modules(bm: BucketMap) -> tuple[dict[str, str], list[str]]:
    """fqn -> legend group name, and the group names in registration order."""
    info = bm.info
    if info is None:
        return {}, []
    names = [f"{m or '(root)'} · {t}" for m, t in zip(info.modules, info.module_types, strict=True)]
    of = dict(zip(info.fqns, names, strict=True))
    return of, list(dict.fromkeys(names))


def _bar_panel(
    rows: Sequence[_Row],
    axis: str,
    group_of: Mapping[str, str],
    groups: list[str],
    highlight: set[str],
    scale: float,
    show_legend: bool,
) -> list[dict[str, Any]]:
    """One bar trace per legend group (module, or colour when there are many modules).

    Columns go to plotly as numpy arrays and outlines are one extra trace rather than
    per-segment colour lists: plotly validates Python lists element by element, which
    made a 1,000-parameter figure ten times slower.
    """
    by_colour = len(groups) > MAX_LEGEND_MODULES
    position = {g: i for i, g in enumerate(groups)}
    cols: dict[str, _Columns] = {}
    moved = _Columns()
    for row in rows:
        base = 0
        for fqn, shape, dtype in zip(row.fqns, row.shapes, row.dtypes, strict=True):
            size = _param_bytes(shape, dtype)
            group = group_of.get(fqn, "(unknown module)")
            key = PALETTE[position.get(group, 0) % len(PALETTE)] if by_colour else group
            hover = f"shape {list(shape)} · {dtype}<br>{size:,} bytes · {group}"
            column = cols.setdefault(key, _Columns())
            for c in (column, moved) if fqn in highlight else (column,):
                c.add(row, fqn, hover, size / scale, base / scale, size)
            base += size
    traces = []
    for key, column in cols.items():
        name = f"modules in colour {PALETTE.index(key) + 1}" if by_colour else key
        colour = key if by_colour else key_color(key, groups)
        traces.append(column.bars(name, axis, colour, show_legend))
    if moved.y:
        trace = moved.bars("moved parameter", axis, "rgba(0,0,0,0)", show_legend)
        trace["marker"]["line"] = {"color": DIFF, "width": 2.5}
        trace.update(hoverinfo="skip", hovertemplate=None)
        traces.append(trace)
    return traces


@dataclass
class _Columns:
    """One trace's segments. Plotly gets numpy arrays: it validates and deep-copies
    Python lists element by element, which made a 1,000-parameter figure 10x slower."""

    y: list[int] = field(default_factory=list)  # bucket index (numeric: no string copies)
    x: list[float] = field(default_factory=list)
    base: list[float] = field(default_factory=list)
    fqn: list[str] = field(default_factory=list)
    hover: list[str] = field(default_factory=list)
    numbers: list[tuple[int, int, int]] = field(default_factory=list)  # bytes, bucket, its bytes

    def add(self, row: _Row, fqn: str, hover: str, x: float, base: float, size: int) -> None:
        self.y.append(row.index)
        self.x.append(x)
        self.base.append(base)
        self.fqn.append(fqn)
        self.hover.append(hover)
        self.numbers.append((size, row.index, row.nbytes))

    def bars(self, name: str, axis: str, colour: str, show_legend: bool) -> dict[str, Any]:
        return dict(
            type="bar",
            orientation="h",
            name=name,
            legendgroup=name,
            showlegend=show_legend,
            y=np.array(self.y, dtype=np.int64),
            x=np.array(self.x, dtype=float),
            base=np.array(self.base, dtype=float),
            text=np.array(self.fqn, dtype=object),
            textposition="none",
            hovertext=np.array(self.hover, dtype=object),
            customdata=np.array(self.numbers, dtype=np.int64).reshape(-1, 3),
            xaxis=f"x{axis}",
            yaxis=f"y{axis}",
            marker={"color": colour, "line": {"color": SEPARATOR, "width": 0.5}},
            hovertemplate="<b>%{text}</b><br>%{hovertext}<br>"
            "bucket %{customdata[1]} (%{customdata[2]:,} bytes)<extra></extra>",
        )


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
    group_of, groups = _modules(bucket_map)
    moved = set(comparison.moved) if comparison else set()
    obs_rows = [_Row(b.index, b.fqns, b.shapes, b.dtypes, b.nbytes) for b in observed]
    plan_rows = [_Row(b.index, b.fqns, b.shapes, b.dtypes, b.nbytes) for b in planned or []]
    obs_caps = _recorded_caps(bucket_map, iteration)
    plan_caps = _caps(planned or [])
    largest = max([r.nbytes for r in (*obs_rows, *plan_rows)] or [1])
    scale, unit = _unit(largest)

    traces = [
        *_bar_panel(obs_rows, "", group_of, groups, moved, scale, True),
        *_bar_panel(plan_rows, "2", group_of, groups, moved, scale, not obs_rows),
        *(_diff_markers(comparison, scale) if comparison is not None else []),
    ]
    shapes, notes = [], []
    for axis, caps in (("", obs_caps), ("2", plan_caps)):
        for cap in caps:
            if cap <= 1.5 * largest:
                shapes.append(_vline(cap / scale, axis))
                notes.append(_note(f"cap {_fmt_bytes(cap)}", cap / scale, f"x{axis}", 1.0))
            else:  # drawing it would squash every bar to a sliver
                notes.append(_note(f"cap {_fmt_bytes(cap)} →", 1.0, f"x{axis} domain", 1.0))
    stage = _stage(bucket_map, iteration, what_if)
    verdict = _verdict(comparison, error, observed)
    info = bucket_map.info
    reported = sum(len(r.fqns) for r in obs_rows)
    if info and reported < len(info.fqns) and bucket_map.record(iteration, rank) is None:
        verdict = f"in progress: {reported} of {len(info.fqns)} parameters reported so far"
    title = f"<b>DDP buckets · iteration {iteration} · rank {rank}</b> · {verdict}"
    layout = _layout(title, unit, len(obs_rows), len(plan_rows))
    layout["shapes"] = shapes
    layout["annotations"] = [
        _note(f"observed ({len(obs_rows)} buckets)", 0.23, "paper", 1.04, size=13),
        _note(f"planned: {stage} ({len(plan_rows)} buckets)", 0.77, "paper", 1.04, size=13),
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
        return f"{stage}, what if " + ", ".join(f"{k}={v}" for k, v in what_if.items())
    return stage


def _verdict(c: Comparison | None, error: str, observed: Sequence[Any]) -> str:
    if c is None:
        return f"<span style='color:{DIFF}'>cannot plan: {error}</span>"
    if not observed:
        return "no bucket reported for this iteration yet"
    if c.matches:
        return "observed = planned"
    return f"<span style='color:{DIFF}'>differs: {'; '.join(c.differences)}</span>"


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


def _note(text: str, x: float, xref: str, y: float, size: int = 11) -> dict[str, Any]:
    return {
        "text": text,
        "x": x,
        "xref": xref,
        "y": y,
        "yref": "paper",
        "showarrow": False,
        "yanchor": "bottom",
        "font": {"size": size},
    }


def _layout(title: str, unit: str, n_left: int, n_right: int) -> dict[str, Any]:
    def yaxis(n: int, anchor: str) -> dict[str, Any]:
        return {
            "tickmode": "array",
            "tickvals": list(range(n)),
            "ticktext": [f"bucket {i}" for i in range(n)],
            "range": [max(n, 1) - 0.5, -0.5],  # bucket 0 on top
            "anchor": anchor,
            "zeroline": False,
        }

    return dict(
        title={"text": title, "font": {"size": 14}},
        barmode="overlay",
        bargap=0.25,
        height=min(MAX_HEIGHT, 200 + ROW_PX * max(n_left, n_right, 1)),
        margin={"l": 80, "r": 20, "t": 90, "b": 50},
        xaxis={"domain": [0.0, 0.46], "title": {"text": f"bytes ({unit})"}, "anchor": "y"},
        xaxis2={"domain": [0.54, 1.0], "title": {"text": f"bytes ({unit})"}, "anchor": "y2"},
        yaxis=yaxis(n_left, "x"),
        yaxis2=yaxis(n_right, "x2"),
        legend={"orientation": "h", "y": -0.12, "yanchor": "top", "font": {"size": 11}},
        hoverlabel={"align": "left"},
    )
