"""Pure figures of bucket timing and health, and the set of figures for the HTML report."""

from __future__ import annotations

import math
import textwrap
from typing import Any

import numpy as np
import plotly.graph_objects as go

from interactive_shard.buckets.analysis import Timeline, grouped, span
from interactive_shard.buckets.figures import (
    LEGEND_ROW_PX,
    Spec,
    figure_bucket_map,
    legend_rows,
    title_at_top,
)
from interactive_shard.buckets.model import BucketMap
from interactive_shard.ui.text import literal

WINDOW = "rgba(86, 180, 233, 0.18)"  # backward compute, light sky blue
HIDDEN = "#009E73"  # reduction overlapped with backward (green)
EXPOSED = "#D55E00"  # reduction after backward: the step waits for it (vermillion)
WAITING = "#BBBBBB"  # bucket ready, reduction not launched yet (earlier buckets first)
MS = 1e3
NO_FINDINGS = "No findings: every gradient became ready and the ranks agreed."
MAX_ROWS = 50  # health table rows; past this, findings repeated over iterations are grouped


def figure_bucket_timeline(bucket_map: BucketMap, iteration: int, rank: int = 0) -> go.Figure:
    """Per bucket: ready -> reduction launched -> done, over the shaded backward window."""
    traces, layout = bucket_timeline_spec(bucket_map, iteration, rank)
    return go.Figure(data=traces, layout=layout)


def bucket_timeline_spec(bucket_map: BucketMap, iteration: int, rank: int = 0) -> Spec:
    """``figure_bucket_timeline`` as plain trace dicts and a layout dict (not validated)."""
    tl = bucket_map.timeline(iteration, rank)
    rows = np.array([b.index for b in tl.buckets], dtype=np.int64)
    window = tl.backward_end * MS
    wait_x, wait_b, hid_x, hid_b, exp_x, exp_b, data = [], [], [], [], [], [], []
    for b in tl.buckets:
        ready, start = b.ready * MS, b.start * MS
        end = start if b.end is None else b.end * MS  # unknown: no bar, said in the title
        wait_b.append(ready)
        wait_x.append(max(start - ready, 0.0))
        cut = min(max(window, start), end)  # overlapped part: [start, cut]; exposed: [cut, end]
        hid_b.append(start)
        hid_x.append(cut - start)
        exp_b.append(cut)
        exp_x.append(end - cut)
        done = math.nan if b.end is None else end
        data.append([b.nbytes, len(b.fqns), ready, start, done, b.overlap * MS])
    custom = np.array(data, dtype=float).reshape(-1, 6)
    hover = (
        "<b>bucket %{y}</b> · %{customdata[0]:,} bytes, %{customdata[1]} params<br>ready "
        "%{customdata[2]:.2f} ms · launched %{customdata[3]:.2f} ms · done %{customdata[4]:.2f}"
        " ms<br>overlapped with backward: %{customdata[5]:.2f} ms<extra>%{fullData.name}</extra>"
    )
    traces: list[dict[str, Any]] = []
    for name, x, base, colour in (
        ("ready, waiting for earlier buckets", wait_x, wait_b, WAITING),
        ("reduction during backward (hidden)", hid_x, hid_b, HIDDEN),
        ("reduction after backward (exposed)", exp_x, exp_b, EXPOSED),
    ):
        traces.append(
            {
                "type": "bar",
                "orientation": "h",
                "name": name,
                "y": rows,
                "x": np.array(x, dtype=float),
                "base": np.array(base, dtype=float),
                "customdata": custom,
                "marker": {"color": colour},
                "hovertemplate": hover,
            }
        )
    # Both markers every time, empty when there is nothing to mark (and then out of the
    # legend): the same traces from one iteration to the next, so that a live view
    # updates them in place.
    traces.append(
        {
            "type": "scatter",
            "x": np.array([t * MS for _, t in tl.gradients], dtype=float),
            "y": np.full(len(tl.gradients), -1),
            "text": np.array([literal(f) for f, _ in tl.gradients], dtype=object),
            "mode": "markers",
            "marker": {"symbol": "line-ns-open", "size": 12, "color": "#0072B2"},
            "name": "a parameter's gradient became ready",
            "showlegend": bool(tl.gradients),
            "hovertemplate": "%{text}: %{x:.2f} ms<extra></extra>",
        }
    )
    unknown = [b for b in tl.buckets if b.end is None]
    traces.append(
        {
            "type": "scatter",
            "x": np.array([b.start * MS for b in unknown], dtype=float),
            "y": np.array([b.index for b in unknown], dtype=np.int64),
            "mode": "markers",
            "marker": {"symbol": "x-thin-open", "size": 12, "color": EXPOSED},
            "name": "reduction launched, end not recorded",
            "showlegend": bool(unknown),
            "hovertemplate": "bucket %{y}: launched %{x:.2f} ms, end not recorded<extra></extra>",
        }
    )
    headline = _headline(tl)
    if tl.approximate:
        headline += " · backward window estimated (no ddp_iteration event)"
    shown = [t["name"] for t in traces if t.get("showlegend", True)]
    bottom = 70 + LEGEND_ROW_PX * legend_rows(shown)
    layout = dict(
        title=title_at_top(
            f"<b>Bucket reductions · iteration {iteration} · rank {rank}</b><br>{headline}"
        ),
        barmode="overlay",
        height=min(1400, 80 + bottom + max(28 * (len(rows) + 1), 90)),
        margin={"l": 80, "r": 20, "t": 80, "b": bottom},
        xaxis={"title": {"text": "ms since the first gradient was ready"}, "zeroline": True},
        yaxis={
            "tickmode": "array",
            "tickvals": [-1, *range(len(rows))],
            "ticktext": ["gradients", *(f"bucket {i}" for i in range(len(rows)))],
            "range": [len(rows) - 0.5, -1.5],  # gradients, then bucket 0, on top
            "zeroline": False,
        },
        legend={"orientation": "h", "yref": "container", "y": 0, "yanchor": "bottom"},
        shapes=[
            {
                "type": "rect",
                "xref": "x",
                "yref": "paper",
                "x0": 0,
                "x1": window,
                "y0": 0,
                "y1": 1,
                "fillcolor": WINDOW,
                "line": {"width": 0},
                "layer": "below",
                "name": "backward",
            }
        ],
        annotations=[
            {
                "text": "backward",
                "x": window / 2,
                "xref": "x",
                "y": 1,
                "yref": "paper",
                "yanchor": "bottom",
                "showarrow": False,
                "font": {"size": 11, "color": "#0072B2"},
            }
        ],
    )
    return traces, layout


def _headline(tl: Timeline) -> str:
    unknown = tl.unknown_end
    if not tl.buckets:
        return "no bucket reported for this iteration yet"
    if len(unknown) == len(tl.buckets):
        text = (
            "reduction times unknown: the all-reduce had not finished when this iteration "
            "was recorded (DDP never finished the iteration)"
        )
    else:
        text = (
            f"{tl.overlap_fraction:.0%} of reduction time overlapped backward "
            f"(exposed {tl.exposed_time * MS:.2f} ms of {tl.comm_time * MS:.2f} ms)"
        )
        if unknown:
            text += f" · end not recorded for bucket {', '.join(map(str, unknown))}"
    if tl.repeated:
        text += (
            f"<br>ready twice (reentrant checkpoint): {literal(', '.join(tl.repeated[:4]))}"
            f"{' …' if len(tl.repeated) > 4 else ''}; their ticks show the later arrival"
        )
    return text


def figure_health(bucket_map: BucketMap) -> go.Figure:
    """The health findings as a table: one row per finding, or past ``MAX_ROWS`` one per
    finding repeated over iterations (with their span), the title saying so."""
    findings = bucket_map.health
    rows = [(str(f.iteration), f) for f in findings]
    title = "<b>Bucket health</b>"
    if len(findings) > MAX_ROWS:  # a long run: the same finding every iteration
        groups = grouped(findings)
        rows = [(span(its), f) for f, its in groups[:MAX_ROWS]]
        shown = f"the first {MAX_ROWS} of {len(groups)}" if len(groups) > MAX_ROWS else "all"
        title += (
            f" · {len(findings):,} findings, one row per finding repeated over iterations "
            f"({shown} shown; all in <code>run.buckets.health</code>)"
        )
    cols: list[list[str]] = [[], [], [], [], []]
    for where, f in rows:
        values = (where, f.kind, ", ".join(map(str, f.ranks)), ", ".join(f.fqns), f.message)
        for col, value in zip(cols, values, strict=True):
            col.append("<br>".join(literal(line) for line in textwrap.wrap(value, 110)))
    if not findings:
        cols = [["–"], ["–"], ["–"], ["–"], [NO_FINDINGS]]
    fig = go.Figure(
        go.Table(
            columnwidth=[50, 70, 50, 160, 520],
            header={"values": ["iteration", "finding", "ranks", "parameters", "what it means"]},
            cells={"values": cols, "align": "left"},
        )
    )
    fig.update_layout(
        title={"text": title, "font": {"size": 14}},
        height=min(900, 160 + 110 * max(len(rows), 1)),
        margin={"l": 20, "r": 20, "t": 50, "b": 20},
    )
    return fig


def report_figures(bucket_map: BucketMap) -> list[go.Figure]:
    """Figures for the HTML report: iteration 1 and the latest (rank 0), timing, health."""
    bucket_map.update()
    iterations = bucket_map.iterations
    if bucket_map.info is None and not iterations:
        return []
    ranks = bucket_map.ranks
    rank = 0 if 0 in ranks else ranks[0]
    figures = []
    for it in dict.fromkeys(iterations[:1] + iterations[-1:]):
        figures.append(figure_bucket_map(bucket_map, it, rank))
    if iterations:
        figures.append(figure_bucket_timeline(bucket_map, iterations[-1], rank))
    figures.append(figure_health(bucket_map))
    return figures
