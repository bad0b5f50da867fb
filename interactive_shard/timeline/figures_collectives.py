"""Pure plotly figures of a ``TimelineModel``'s overlap and collectives (with ``figures.py``).

``figure_overlap``: per iteration and rank, the share of backward's collective time
hidden under compute (the rest is exposed: the step waits for it). ``figure_collectives``:
each collective of one iteration matched across ranks, every rank's arrival (its issue)
after the first rank's; the last to arrive, the straggler, is ringed: everyone else
waited for it.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import plotly.graph_objects as go

from interactive_shard.timeline.figures import Spec
from interactive_shard.timeline.figures_lanes import every_nth
from interactive_shard.timeline.model import TimelineModel
from interactive_shard.ui.colors import rank_color
from interactive_shard.ui.format import duration_ms, nbytes
from interactive_shard.ui.plain_figure import figure
from interactive_shard.ui.text import literal

__all__ = ["collectives_spec", "figure_collectives", "figure_overlap", "overlap_spec"]

MAX_OVERLAP_ITERATIONS = 50  # iterations the overlap overview shows (then every n-th)
MAX_UNIT_TICKS = 30  # an x tick per iteration up to this many
STRAGGLER = "#FF0000"  # pure red, as the other features' differences (not a rank colour)


def figure_overlap(model: TimelineModel, selected: int | None = None) -> go.Figure:
    """The backward overlap of every iteration on every rank, in percent. A long run
    shows every n-th iteration (at most about ``MAX_OVERLAP_ITERATIONS``, the title says
    which), and always the latest and ``selected``, exactly."""
    return figure(*overlap_spec(model, selected))


def overlap_spec(model: TimelineModel, selected: int | None = None) -> Spec:
    """``figure_overlap``'s traces and layout, as plain dicts (what a view redraws)."""
    ranks = model.ranks
    if not ranks or not model.count():
        return [], {"title": {"text": "No iterations yet"}, "height": 200}
    shown, stride = model.sample(MAX_OVERLAP_ITERATIONS, keep=[selected])
    traces = []
    for r in ranks:
        its = [it for it in shown if model.has(r, it)]
        found = [model.summary(r, it) for it in its]
        traces.append(
            {
                "type": "bar",
                "name": f"rank {r}",
                "x": np.array(its),
                "y": np.array(
                    [100 * f.overlap if math.isfinite(f.overlap) else np.nan for f in found]
                ),
                "marker": {"color": rank_color(r)},
                "hovertext": np.array(
                    [
                        f"rank {r} · iteration {it}<br>backward overlap "
                        + (f"{f.overlap:.0%}" if math.isfinite(f.overlap) else "—")
                        + f"<br>exposed {duration_ms(f.exposed)}"
                        for it, f in zip(its, found, strict=True)
                    ],
                    dtype=object,
                ),
                "hoverinfo": "text",
            }
        )
    sampled = every_nth(stride, len(shown), model.count())
    note = f" · {sampled}" if sampled else ""
    xaxis: dict[str, Any] = {"title": {"text": "iteration"}}
    if stride == 1 and len(shown) <= MAX_UNIT_TICKS:
        xaxis["dtick"] = 1
    layout: dict[str, Any] = {
        "barmode": "group",
        "title": {
            "text": f"Backward overlap per iteration{note}<br><sup>share of the collectives' "
            "time during backward hidden under compute; the rest is exposed</sup>"
        },
        "xaxis": xaxis,
        "yaxis": {"title": {"text": "overlap"}, "range": [0, 100], "ticksuffix": "%"},
        "height": 320,
        "margin": {"t": 80, "b": 50},
    }
    return traces, layout


def figure_collectives(model: TimelineModel, iteration: int | None = None) -> go.Figure:
    """Every matched collective of ``iteration`` (None: the latest): each rank's arrival
    in ms after the first arrival, the straggler ringed, wait times in the hover."""
    return figure(*collectives_spec(model, iteration))


def collectives_spec(model: TimelineModel, iteration: int | None = None) -> Spec:
    """``figure_collectives``'s traces and layout, as plain dicts (what a view redraws)."""
    it = iteration if iteration is not None else model.latest()
    found = model.collectives(it) if it is not None else []
    if not found:
        return [], {"title": {"text": "No collectives matched across ranks yet"}, "height": 200}
    labels = [f"{c.index}: {literal(c.op)} {nbytes(float(c.nbytes))}" for c in found]
    per_rank: dict[int, dict[str, list[Any]]] = {}
    ring: dict[str, list[Any]] = {"x": [], "y": [], "text": []}
    for label, c in zip(labels, found, strict=True):
        starts, ends, waited = c.starts, c.ends, c.waited
        first = min(starts.values())
        # A tie (nobody waited) has no straggler worth ringing.
        late = c.straggler if max(waited.values(), default=0.0) > 0 else None
        for r, start in sorted(starts.items()):
            lag = (start - first) * 1e3
            text = (
                f"<b>{literal(c.op)}</b> #{c.index} · {nbytes(float(c.nbytes))} · group "
                f"{literal(c.group)}<br>rank {r} arrived {lag:.3f} ms after the first"
                f"<br>waited {duration_ms(waited.get(r, 0.0))} for the last"
                + (f" · took {duration_ms(ends[r] - start)}" if r in ends else "")
                + (" · <b>straggler</b>" if r == late else "")
            )
            mine = per_rank.setdefault(r, {"x": [], "y": [], "text": []})
            mine["x"].append(label)
            mine["y"].append(lag)
            mine["text"].append(text)
            if r == late:
                ring["x"].append(label)
                ring["y"].append(lag)
                ring["text"].append(text)
    traces: list[dict[str, Any]] = [
        {
            "type": "scatter",
            "name": f"rank {r}",
            "mode": "markers",
            "x": np.array(pts["x"], dtype=object),
            "y": np.array(pts["y"]),
            "marker": {"color": rank_color(r), "size": 9},
            "hovertext": np.array(pts["text"], dtype=object),
            "hoverinfo": "text",
        }
        for r, pts in sorted(per_rank.items())
    ]
    if ring["x"]:
        traces.append(
            {
                "type": "scatter",
                "name": "straggler (the others waited)",
                "mode": "markers",
                "x": np.array(ring["x"], dtype=object),
                "y": np.array(ring["y"]),
                "marker": {
                    "color": "rgba(0,0,0,0)",
                    "size": 17,
                    "line": {"color": STRAGGLER, "width": 2},
                },
                "hovertext": np.array(ring["text"], dtype=object),
                "hoverinfo": "text",
            }
        )
    most = max((w for c in found for w in c.waited.values()), default=0.0)
    layout = {
        "title": {
            "text": f"Collectives · iteration {it} · {len(found)} matched across ranks · "
            f"longest wait {duration_ms(most)}<br><sup>arrival: when a rank issued it, after the "
            "first rank did; the ringed rank arrived last</sup>"
        },
        "xaxis": {"title": {"text": "collective (in issue order)"}, "type": "category"},
        "yaxis": {"title": {"text": "ms after the first arrival"}, "rangemode": "tozero"},
        "height": 360,
        "margin": {"t": 80, "b": 60},
        "hovermode": "closest",
    }
    return traces, layout
