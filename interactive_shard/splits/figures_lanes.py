"""Pure plotly figures of one compile's partitions as lanes (``figure_lanes``), and of a
rank that compiled nothing (``figure_nothing``); shared by ``figures.py``.

Lanes: partitions left to right in execution order, their calls top to bottom in order
(a staircase: partition ``i + 1`` starts below where partition ``i`` ends), autocast and
grad-mode regions as coloured bands, each partition's entry (▶) and exit (◀) of a
region marked on the call that does it. Regions are read off every partition's own
global-state calls (``segments``); the copies ``split_module`` puts at the start and end
of the partitions a region spans chain them into one band (``bands``).
"""

from __future__ import annotations

import math
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import plotly.graph_objects as go

from interactive_shard.splits._drawing import lane_rect, outline, rect
from interactive_shard.splits.events import Call, Partition, SplitCompile
from interactive_shard.splits.model import SplitsModel
from interactive_shard.ui.colors import key_color
from interactive_shard.ui.format import nbytes
from interactive_shard.ui.plain_figure import figure
from interactive_shard.ui.text import literal

DIFF = "#FF0000"  # pure red: not in PALETTE (as the bucket map's differences)
CALL_COLOR = "#444444"
ROW_PX, MIN_HEIGHT, MAX_HEIGHT = 18, 320, 1400
TOP_PX, BOTTOM_PX = 135, 60  # three title lines and the lane headers; the legend
MAX_NAMED_LANES = 10  # more lanes: numbered headers (the hover names each partition)
MARKER_DX = -0.34  # calls sit at the left of their lane, labels to their right
LABEL_PX = 13  # a label needs this many pixels of row; fewer: label every n-th call
MAX_HOVER_FQNS = 8


def short_target(call: Call) -> str:
    """``torch._C._nn.linear`` -> ``linear``; a method's name as ``.float()``."""
    if call.op == "call_method":
        return f".{call.target}()"
    return call.target.rpartition(".")[2] or call.target


def region_label(call: Call) -> str | None:
    """The region a global-state call opens, in words (None for other calls)."""
    s = call.state
    if s is None or s.call == "exit_autocast":
        return None
    if s.call == "enter_autocast":
        dtype = (s.dtype or "default dtype").removeprefix("torch.")
        off = " (disabled)" if s.enabled is False else ""
        return f"autocast {s.device_type} {dtype}{off}"
    return "grad on" if s.enabled else "grad off"


# -- the lanes, as data -----------------------------------------------------------------------
@dataclass(frozen=True)
class Segment:
    """A region inside one partition's lane: rows ``start..end`` (figure rows)."""

    lane: int
    label: str
    start: int
    end: int
    entered: bool  # an enter / set-grad call of the partition opens it
    exited: bool  # an exit / the next set-grad call of the partition closes it


@dataclass(frozen=True)
class Band:
    """A region across consecutive lanes ``first..last`` (split_module's copies chain them)."""

    label: str
    first: int
    last: int
    start: int
    end: int


def offsets(partitions: Sequence[Partition]) -> list[int]:
    """The figure row of each partition's first call (the staircase)."""
    out, row = [], 0
    for p in partitions:
        out.append(row)
        row += max(len(p.calls), 1)
    return out


def segments(partitions: Sequence[Partition]) -> list[Segment]:
    """Every partition's regions as it runs them, from its own global-state calls."""
    out = []
    for lane, (p, first) in enumerate(zip(partitions, offsets(partitions), strict=True)):
        last = first + max(len(p.calls), 1) - 1
        autocast: dict[str, tuple[str, int, bool]] = {}  # enter node -> (label, row, entered)
        grad: tuple[str, int, bool] | None = None
        for j, c in enumerate(p.calls):
            row, s = first + j, c.state
            if s is None:
                continue
            if s.call == "enter_autocast":
                autocast[c.name] = (region_label(c) or "autocast", row, True)
            elif s.call == "exit_autocast":
                label, start, entered = autocast.pop(s.enter or "", ("autocast", first, False))
                out.append(Segment(lane, label, start, row, entered, True))
            else:
                if grad is not None:
                    out.append(Segment(lane, grad[0], grad[1], row, grad[2], True))
                grad = (region_label(c) or "grad", row, True)
        for label, start, entered in [*autocast.values(), *([grad] if grad else [])]:
            out.append(Segment(lane, label, start, last, entered, False))
    return sorted(out, key=lambda s: (s.lane, s.start))


def _only_state(calls: Sequence[Call]) -> bool:
    return all(c.state is not None for c in calls)


def bands(partitions: Sequence[Partition]) -> list[Band]:
    """Segments chained across lanes: a region left by the trailing exit copies of one
    partition and entered by the leading enter copies of the next is one region."""
    rows = offsets(partitions)
    found: list[list[Segment]] = []
    for seg in segments(partitions):
        lane = seg.lane
        chain = next(
            (
                ch
                for ch in found
                if ch[-1].lane == lane - 1
                and ch[-1].label == seg.label
                and _only_state(partitions[lane - 1].calls[ch[-1].end - rows[lane - 1] + 1 :])
                and _only_state(partitions[lane].calls[: seg.start - rows[lane]])
            ),
            None,
        )
        if chain is None:
            found.append([seg])
        else:
            chain.append(seg)
    return [Band(ch[0].label, ch[0].lane, ch[-1].lane, ch[0].start, ch[-1].end) for ch in found]


# -- figure: lanes ----------------------------------------------------------------------------
def pick(model: SplitsModel, rank: int, index: int) -> SplitCompile | None:
    """Compile ``index`` (its position; negative: from the newest) of ``rank``, or None."""
    return model.compilation(rank, index)


def hover_partition(p: Partition) -> str:
    fqns = p.fqns[:MAX_HOVER_FQNS]
    more = len(p.fqns) - len(fqns)
    listed = "<br>  ".join(literal(f) for f in fqns) + (f"<br>  … {more} more" if more else "")
    return f"<b>{literal(p.name)}</b>: {len(p.fqns)} parameter(s), {nbytes(p.nbytes)}" + (
        f"<br>  {listed}" if fqns else ""
    )


def figure_lanes(
    model: SplitsModel, rank: int = 0, index: int = -1, *, selected: int | None = None
) -> go.Figure:
    """Compile ``index`` of ``rank`` (default: the latest) as lanes; ``selected`` outlines
    one partition's lane."""
    comp = pick(model, rank, index)
    if comp is None:
        return figure_nothing(model, rank)
    return lanes_figure(comp, rank=rank, selected=selected)


def lanes_figure(comp: SplitCompile, *, rank: int = 0, selected: int | None = None) -> go.Figure:
    parts = comp.partitions
    starts = offsets(parts)
    rows = sum(max(len(p.calls), 1) for p in parts) or 1
    height = min(MAX_HEIGHT, max(MIN_HEIGHT, TOP_PX + BOTTOM_PX + ROW_PX * rows))
    step = max(1, math.ceil(LABEL_PX / ((height - TOP_PX - BOTTOM_PX) / rows)))
    labels = sorted({s.label for s in segments(parts)})
    plain: dict[str, list[Any]] = {k: [] for k in ("x", "y", "text", "hover", "lane")}
    enters: dict[str, list[Any]] = {k: [] for k in ("x", "y", "text", "hover", "lane", "color")}
    exits: dict[str, list[Any]] = {k: [] for k in ("x", "y", "text", "hover", "lane", "color")}
    open_labels: dict[str, str] = {}
    for lane, (p, first) in enumerate(zip(parts, starts, strict=True)):
        about = hover_partition(p)
        for j, c in enumerate(p.calls):
            row, s = first + j, c.state
            hover = f"<b>{literal(c.target)}</b> ({c.op})<br>node {literal(c.name)}<br>{about}"
            if s is None:
                col = plain
                text = literal(short_target(c)) if (row % step == 0) else ""
            elif s.call == "exit_autocast":
                col = exits
                label = open_labels.get(f"{lane}:{s.enter}", "autocast")
                col["color"].append(key_color(label, labels))
                text = f"end {literal(label)}" if step < 3 or row % step == 0 else ""
            else:
                col = enters
                label = region_label(c) or "?"
                open_labels[f"{lane}:{c.name}"] = label
                col["color"].append(key_color(label, labels))
                text = literal(label) if step < 3 or row % step == 0 else ""
            col["x"].append(lane + MARKER_DX)
            col["y"].append(row)
            col["text"].append(text)
            col["hover"].append(hover)
            col["lane"].append(lane)
    traces: list[dict[str, Any]] = [
        _markers("calls", plain, "square", CALL_COLOR, 8),
        _markers("enters a region (▶)", enters, "triangle-right", enters["color"], 12),
        _markers("leaves a region (◀)", exits, "triangle-left", exits["color"], 12),
    ]
    shapes = [
        lane_rect(lane, first, len(p.calls))
        for lane, (p, first) in enumerate(zip(parts, starts, strict=True))
    ]
    for b in bands(parts):
        if b.last > b.first:  # the region across the lanes it spans
            color = key_color(b.label, labels)
            shapes.append(rect(b.first - 0.46, b.last + 0.46, b.start, b.end, color, 0.08, "dot"))
    for seg in segments(parts):  # inside each lane: exactly the calls that run in it
        shapes.append(
            rect(
                seg.lane - 0.4,
                seg.lane + 0.4,
                seg.start,
                seg.end,
                key_color(seg.label, labels),
                0.22,
            )
        )
    if selected is not None and 0 <= selected < len(parts):
        p = parts[selected]
        shapes.append(outline(selected, starts[selected], len(p.calls)))
    for label in labels:  # the legend of the band colours
        traces.append(_legend_swatch(label, key_color(label, labels)))
    title = _lanes_title(comp, rank)
    layout = dict(
        title=title_at_top(title),
        height=height,
        margin={"l": 40, "r": 20, "t": TOP_PX, "b": BOTTOM_PX},
        xaxis={
            **_lane_ticks(parts),
            "side": "top",
            "tickangle": 0,
            "range": [-0.6, len(parts) - 0.1],
            "zeroline": False,
            "showgrid": False,
        },
        yaxis={
            "range": [rows - 0.4, -0.6],  # the first call on top
            "showticklabels": False,
            "zeroline": False,
            "showgrid": False,
            "title": {"text": "calls, in execution order"},
        },
        shapes=shapes,
        legend={"orientation": "h", "y": -0.02, "yanchor": "top", "font": {"size": 11}},
        hoverlabel={"align": "left"},
        plot_bgcolor="white",
    )
    return figure(traces, layout)


def _lane_ticks(parts: Sequence[Partition]) -> dict[str, Any]:
    """Lane headers: name and bytes, or (many lanes) every n-th lane's number."""
    if len(parts) <= MAX_NAMED_LANES:
        text = [f"{literal(p.name)}<br>{nbytes(p.nbytes)}" for p in parts]
        return {"tickmode": "array", "tickvals": list(range(len(parts))), "ticktext": text}
    every = math.ceil(len(parts) / MAX_NAMED_LANES)
    shown = list(range(0, len(parts), every))
    return {"tickmode": "array", "tickvals": shown, "ticktext": [str(i) for i in shown]}


def title_at_top(text: str) -> dict[str, Any]:
    """A title pinned to the figure's top left, whatever its height."""
    return {
        "text": text,
        "font": {"size": 14},
        "x": 0,
        "xref": "paper",
        "xanchor": "left",
        "y": 1,
        "yref": "container",
        "yanchor": "top",
        "pad": {"t": 10},
    }


def _lanes_title(comp: SplitCompile, rank: int) -> str:
    n = len(comp.partitions)
    shape = (
        f"{n} partitions (the graph was cut at bucket boundaries)"
        if n > 1
        else "compiled whole: one bucket, no split"
    )
    return (
        f"<b>Graph splits · rank {rank} · compile {comp.index}</b> · backend "
        f"{literal(comp.backend)}<br>{shape} · cap {nbytes(comp.bucket_bytes_cap)}, first "
        f"bucket {nbytes(comp.first_bucket_bytes)} · compiled in {comp.compile_s:.3g} s"
        "<br><span style='font-size:11px'>bands: autocast and grad-mode regions · ▶ the partition "
        "enters a region, ◀ leaves it (split_module copies both into every partition)</span>"
    )


def _markers(
    name: str, col: dict[str, list[Any]], symbol: str, color: Any, size: int
) -> dict[str, Any]:
    return dict(
        type="scatter",
        name=name,
        x=col["x"],
        y=col["y"],
        mode="markers+text",
        text=col["text"],
        textposition="middle right",
        textfont={"size": 10},
        hovertext=col["hover"],
        hoverinfo="text",
        customdata=col["lane"],
        marker={"symbol": symbol, "color": color, "size": size},
        cliponaxis=False,
    )


def _legend_swatch(label: str, color: str) -> dict[str, Any]:
    return dict(
        type="scatter",
        name=f"region: {literal(label)}",
        x=[None],
        y=[None],
        mode="markers",
        marker={"symbol": "square", "size": 12, "color": color, "opacity": 0.4},
        hoverinfo="skip",
    )


# -- figure: nothing compiled ---------------------------------------
def figure_nothing(model: SplitsModel, rank: int = 0) -> go.Figure:
    """Why ``rank`` shows no partitions: the probe's reason, or that nothing arrived yet."""
    reason = model.nothing(rank)
    if reason is None:
        head = "No compile captured yet"
        text = "Waiting for <code>ish.watch(torch.compile(ddp))</code> and a first forward."
    else:
        head = "Nothing compiled"
        text = "<br>".join(literal(line) for line in textwrap.wrap(reason, 100))
    layout = dict(
        title=title_at_top(f"<b>{head} · rank {rank}</b>"),
        height=220,
        margin={"l": 20, "r": 20, "t": 50, "b": 20},
        plot_bgcolor="white",
        xaxis={"visible": False},
        yaxis={"visible": False},
        annotations=[
            {
                "text": text,
                "x": 0,
                "y": 1,
                "xref": "paper",
                "yref": "paper",
                "xanchor": "left",
                "yanchor": "top",
                "align": "left",
                "showarrow": False,
                "font": {"size": 13},
            }
        ],
    )
    return figure([], layout)
