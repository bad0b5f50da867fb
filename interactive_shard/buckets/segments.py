"""Bar segments of the bucket map as plain trace dicts: one segment per parameter.

Kept apart from ``figures.py`` (layout, caps, verdict) because this is the hot loop of a
redraw: 1,000 parameters become a handful of traces with numpy columns.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from interactive_shard.buckets._params import as_dtype, key_fqn
from interactive_shard.buckets.model import BucketMap
from interactive_shard.ui.colors import PALETTE, key_color
from interactive_shard.ui.text import literal

DIFF = "#FF0000"  # pure red: not in PALETTE, so a highlight never looks like a module
SEPARATOR = "#FFFFFF"
MAX_LEGEND_MODULES = 24  # beyond this, one trace per colour keeps figures fast


@dataclass(frozen=True)
class Row:
    index: int
    fqns: Sequence[str]
    shapes: Sequence[tuple[int, ...]]
    dtypes: Sequence[str]
    nbytes: int


def param_bytes(shape: Sequence[int], dtype: str) -> int:
    try:
        itemsize = as_dtype(dtype).itemsize
    except ValueError:  # a dtype this torch does not know (recorded with a newer one)
        itemsize = 4
    return math.prod(shape) * itemsize


@dataclass(frozen=True)
class Modules:
    """Owning module of each parameter: the legend shows the module, hovers its type too."""

    group_of: dict[str, str] = field(default_factory=dict)  # fqn -> module fqn
    groups: list[str] = field(default_factory=list)  # module fqns, registration order
    described: dict[str, str] = field(default_factory=dict)  # fqn -> "module (Type)"


def module_groups(bm: BucketMap) -> Modules:
    info = bm.info
    if info is None:
        return Modules()
    fqns, owners, types = list(info.fqns), list(info.modules), list(info.module_types)
    if info.delayed is not None:  # in no bucket, but drawn in their modules' colours
        d, known = info.delayed, set(fqns)
        for name, owner, kind in zip(d.fqns, d.modules, d.module_types, strict=True):
            if key_fqn(name) not in known:
                fqns.append(key_fqn(name))
                owners.append(owner)
                types.append(kind)
    names = [m or "(root)" for m in owners]
    described = [f"{m} ({t})" for m, t in zip(names, types, strict=True)]
    return Modules(
        dict(zip(fqns, names, strict=True)),
        list(dict.fromkeys(names)),
        dict(zip(fqns, described, strict=True)),
    )


def bar_panel(
    rows: Sequence[Row],
    axis: str,
    modules: Modules,
    highlight: set[str],
    scale: float,
    show_legend: bool,
    *,
    every_group: bool = True,
) -> list[dict[str, Any]]:
    """One bar trace per legend group (module, or colour when there are many modules).

    ``every_group``: a trace for every module (or colour) of the model and a "moved
    parameter" outline, empty when nothing is there, so that the traces are the same
    from one iteration to the next and a live view updates them in place (a figure
    built anew costs ten times more); an empty trace stays out of the legend.

    Columns go to plotly as numpy arrays and outlines are one extra trace rather than
    per-segment colour lists: plotly validates Python lists element by element, which
    made a 1,000-parameter figure ten times slower.
    """
    groups, group_of = modules.groups, modules.group_of
    by_colour = len(groups) > MAX_LEGEND_MODULES
    position = {g: i for i, g in enumerate(groups)}

    def key_of(group: str) -> str:
        return PALETTE[position.get(group, 0) % len(PALETTE)] if by_colour else group

    cols: dict[str, _Columns] = {}
    if every_group:
        cols = {key_of(g): _Columns() for g in groups}
    moved = _Columns()
    for row in rows:
        base = 0
        for fqn, shape, dtype in zip(row.fqns, row.shapes, row.dtypes, strict=True):
            size = param_bytes(shape, dtype)
            group = group_of.get(fqn, "(unknown module)")
            owner = modules.described.get(fqn, group)
            hover = f"shape {list(shape)} · {literal(dtype)}<br>{size:,} bytes · {literal(owner)}"
            column = cols.setdefault(key_of(group), _Columns())
            for c in (column, moved) if fqn in highlight else (column,):
                c.add(row, literal(fqn), hover, size / scale, base / scale, size)
            base += size
    traces = []
    for key, column in cols.items():
        name = f"modules in colour {PALETTE.index(key) + 1}" if by_colour else literal(key)
        colour = key if by_colour else key_color(key, groups)
        traces.append(column.bars(name, axis, colour, show_legend and bool(column.y)))
    if moved.y or every_group:
        trace = moved.bars("moved parameter", axis, "rgba(0,0,0,0)", show_legend and bool(moved.y))
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
    fqn: list[str] = field(default_factory=list)  # as plotly shows them (ui.text.literal)
    hover: list[str] = field(default_factory=list)
    numbers: list[tuple[int, int, int]] = field(default_factory=list)  # bytes, bucket, its bytes

    def add(self, row: Row, fqn: str, hover: str, x: float, base: float, size: int) -> None:
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
