"""Spans on lanes for ``figures.py``'s timelines: every rank a group of rows (compute,
nested spans a row deeper than their parent; hooks; collectives; optimizer), and the
traces that draw them, one per kind (not per span), so a few thousand spans stay cheap.

``nesting`` finds each compute span's depth with one sweep; ``lay_out`` gives every span
its row; ``span_traces`` draws bars (``base`` = start, ``x`` = duration, ms since an
origin) and instants (markers); ``window_trace`` shades the backward phase behind.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from interactive_shard.timeline.events import KINDS
from interactive_shard.timeline.model import TimelineModel, TimelineSpan
from interactive_shard.ui.format import nbytes
from interactive_shard.ui.text import literal

__all__ = [
    "KIND_COLORS",
    "Lanes",
    "every_nth",
    "height_for",
    "hover",
    "lane_axis",
    "lay_out",
    "legend_below",
    "nesting",
    "span_traces",
    "window_trace",
]

# Okabe-Ito (as ui.colors); a compiled kind is a lighter / darker cousin of its eager kind.
KIND_COLORS = {
    "forward": "#0072B2",
    "backward": "#E69F00",
    "compiled_forward": "#56B4E9",
    "compiled_backward": "#D55E00",
    "hook": "#CC79A7",
    "collective": "#009E73",
    "optimizer": "#555555",
}
COMPUTE = ("forward", "backward", "compiled_forward", "compiled_backward")
LANE_OF = {"hook": "hooks", "collective": "collectives", "optimizer": "optimizer"}
OTHER_LANES = ("hooks", "collectives", "optimizer")
ROW_PX, TOP_PX, BOTTOM_PX, MIN_HEIGHT, MAX_HEIGHT = 22, 110, 110, 300, 1400
LEGEND_GAP_PX = 48  # below the plot: under the time axis's title
BAR_WIDTH = 0.8  # of a lane's height
WINDOW_OPACITY = 0.12  # the backward phase behind a rank's lanes


# -- long runs: what a screen can show -------------------------------------------------------
def every_nth(stride: int, shown: int, total: int) -> str:
    """How a decimated figure says so: ``every 500th iteration shown (100 of 50,000)``."""
    if stride <= 1:
        return ""
    return f"every {_ordinal(stride)} iteration shown ({shown:,} of {total:,})"


def _ordinal(n: int) -> str:
    tail = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n:,}{tail}"


# -- lanes, as data ---------------------------------------------------------------------------
def nesting(spans: Sequence[TimelineSpan]) -> list[int]:
    """The nesting depth of each span (aligned with ``spans``): how many spans that
    started no later and end later enclose it. A sweep over a stack of open spans keeps
    any two spans given the same depth from overlapping (a span that only partly overlaps
    the one open goes one deeper)."""
    order = sorted(range(len(spans)), key=lambda i: (spans[i].start, -spans[i].end))
    depths = [0] * len(spans)
    open_ends: list[float] = []
    for i in order:
        s = spans[i]
        while open_ends and open_ends[-1] <= s.start:
            open_ends.pop()
        depths[i] = len(open_ends)
        open_ends.append(s.end)
    return depths


@dataclass(frozen=True)
class Lanes:
    """Spans placed on lanes: ``spans[i]`` is drawn on row ``rows[i]`` (0 at the top)."""

    spans: list[TimelineSpan]
    rows: list[int]
    labels: list[str]  # one per row, top to bottom
    groups: dict[int, tuple[int, int]]  # rank -> its first and last row


def lay_out(
    spans: Sequence[TimelineSpan], ranks: Sequence[int], *, depth: int | None = None
) -> Lanes:
    """Rows per rank: compute at nesting depth 0 .. the deepest (or ``depth``; deeper
    compute spans are left out), then hooks, collectives, optimizer."""
    by_rank: dict[int, list[TimelineSpan]] = {r: [] for r in ranks}
    for s in spans:
        if s.rank in by_rank:
            by_rank[s.rank].append(s)
    kept: list[TimelineSpan] = []
    rows: list[int] = []
    labels: list[str] = []
    groups: dict[int, tuple[int, int]] = {}
    for r in ranks:
        compute = [s for s in by_rank[r] if s.kind in COMPUTE]
        depths = nesting(compute)
        deepest = max(depths, default=0)
        shown = deepest if depth is None else min(max(depth, 0), deepest)
        first = len(labels)
        labels += [f"rank {r} · compute" + (f" ›{d}" if d else "") for d in range(shown + 1)]
        lane_row = {lane: len(labels) + i for i, lane in enumerate(OTHER_LANES)}
        labels += [f"rank {r} · {lane}" for lane in OTHER_LANES]
        for s, d in zip(compute, depths, strict=True):
            if d <= shown:
                kept.append(s)
                rows.append(first + d)
        for s in by_rank[r]:
            if s.kind not in COMPUTE:
                kept.append(s)
                rows.append(lane_row[LANE_OF.get(s.kind, "hooks")])
        groups[r] = (first, len(labels) - 1)
    return Lanes(kept, rows, labels, groups)


# -- traces -----------------------------------------------------------------------------------
def hover(s: TimelineSpan, origin: float) -> str:
    """A span in words: name, kind, rank and iteration, start and duration; a
    collective's op, bytes, dtype and group; any other detail as ``key=value``."""
    start = (s.start - origin) * 1e3
    lines = [
        f"<b>{literal(s.name) or 'root'}</b> · {s.kind}",
        f"rank {s.rank} · iteration {s.iteration}",
        f"start {start:.3f} ms · {s.duration * 1e3:.3f} ms"
        if s.end > s.start
        else f"at {start:.3f} ms (instant)",
    ]
    d = dict(s.detail)
    if s.kind == "collective":
        op, size_b = d.pop("op", s.name), d.pop("nbytes", 0)
        dtype, group, size = d.pop("dtype", ""), d.pop("group", "?"), d.pop("group_size", "?")
        nb = nbytes(float(size_b)) if isinstance(size_b, int | float) else literal(size_b)
        lines.append(f"{literal(op)} · {nb} · {literal(dtype)}")
        lines.append(f"group {literal(group)} ({literal(size)} ranks)")
        if d.pop("backward", False):
            lines.append("issued during backward")
    if d:
        lines.append(literal(", ".join(f"{k}={v}" for k, v in d.items())))
    return "<br>".join(lines)


def _array(values: list[Any]) -> np.ndarray[Any, Any]:
    """Plotly validates a numpy array at once, a list item by item (a whole redraw),
    and a patched one compares arrays at once too."""
    return np.asarray(values, dtype=object if values and isinstance(values[0], str) else None)


def span_traces(
    lanes: Lanes, origin: float, *, legend: set[str] | None = None
) -> list[dict[str, Any]]:
    """One bar trace per kind (spans with a length) and one marker trace per kind
    (instants), x in ms since ``origin``, as plain trace dicts (``ui.plain_figure``;
    the unit tests validate them). ``legend``: kinds already in the legend (for
    subplots sharing one); updated with those shown here."""
    shown = legend if legend is not None else set()
    out: list[dict[str, Any]] = []
    for kind in KINDS:
        mine = [i for i, s in enumerate(lanes.spans) if s.kind == kind]
        bars = [i for i in mine if lanes.spans[i].end > lanes.spans[i].start]
        instants = [i for i in mine if lanes.spans[i].end <= lanes.spans[i].start]
        common: dict[str, Any] = {"name": kind, "legendgroup": kind, "hoverinfo": "text"}
        if bars:
            out.append(
                {
                    "type": "bar",
                    "orientation": "h",
                    "y": _array([lanes.rows[i] for i in bars]),
                    "base": _array([(lanes.spans[i].start - origin) * 1e3 for i in bars]),
                    "x": _array([lanes.spans[i].duration * 1e3 for i in bars]),
                    "width": BAR_WIDTH,
                    "marker": {
                        "color": KIND_COLORS[kind],
                        "line": {"width": 0.5, "color": "white"},
                    },
                    "hovertext": _array([hover(lanes.spans[i], origin) for i in bars]),
                    "showlegend": kind not in shown,
                    **common,
                }
            )
            shown.add(kind)
        if instants:
            out.append(
                {
                    "type": "scatter",
                    "mode": "markers",
                    "y": _array([lanes.rows[i] for i in instants]),
                    "x": _array([(lanes.spans[i].start - origin) * 1e3 for i in instants]),
                    "marker": {"color": KIND_COLORS[kind], "symbol": "diamond", "size": 9},
                    "hovertext": _array([hover(lanes.spans[i], origin) for i in instants]),
                    "showlegend": kind not in shown,
                    **common,
                }
            )
            shown.add(kind)
    return out


def window_trace(
    model: TimelineModel,
    lanes: Lanes,
    iterations: dict[int, list[int]],
    origin: float,
    *,
    legend: set[str] | None = None,
) -> dict[str, Any] | None:
    """The backward phase (``model.phases``: the forward's end to the optimizer's start)
    of every (rank, iteration) shown, shaded behind the rank's lanes: where backward's
    collectives run, hidden under compute or exposed."""
    y, base, x, width = [], [], [], []
    for r, (first, last) in lanes.groups.items():
        for it in iterations.get(r, []):
            window = model.phases(r, it).get("backward")
            if window is None or window[1] <= window[0]:
                continue
            y.append((first + last) / 2)
            width.append(last - first + 1)
            base.append((window[0] - origin) * 1e3)
            x.append((window[1] - window[0]) * 1e3)
    if not y:
        return None
    first_time = legend is None or "window" not in legend
    if legend is not None:
        legend.add("window")
    return {
        "type": "bar",
        "name": "backward phase",
        "orientation": "h",
        "y": y,
        "base": base,
        "x": x,
        "width": width,
        "marker": {"color": KIND_COLORS["backward"], "line": {"width": 0}},
        "opacity": WINDOW_OPACITY,
        "hoverinfo": "skip",
        "legendgroup": "window",
        "showlegend": first_time,
    }


def height_for(rows: int) -> int:
    return max(MIN_HEIGHT, min(MAX_HEIGHT, TOP_PX + BOTTOM_PX + ROW_PX * rows))


def legend_below(height: int) -> dict[str, Any]:
    """A horizontal legend under the time axis's title (paper y is a share of the plot)."""
    plot = max(height - TOP_PX - BOTTOM_PX, 1)
    return {"orientation": "h", "yanchor": "top", "y": -LEGEND_GAP_PX / plot}


def lane_axis(lanes: Lanes) -> dict[str, Any]:
    return {
        "tickvals": list(range(len(lanes.labels))),
        "ticktext": lanes.labels,
        "range": [len(lanes.labels) - 0.5, -0.5],  # row 0 at the top
        "fixedrange": True,  # zoom and pan move time only
        "showgrid": False,
        "zeroline": False,
    }
