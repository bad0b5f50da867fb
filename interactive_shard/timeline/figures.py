"""Pure plotly figures of a ``TimelineModel``: the same figures serve the view, the report
and the tests.

``figure_timeline``: one lane group per rank (compute, with nested modules as sub-lanes
below their parent; hooks; collectives; optimizer), every span a horizontal bar from its
start to its end in ms since ``model.origin``, an instant a marker, the backward phase
shaded behind (lanes and traces: ``figures_lanes.py``).
``figure_side_by_side``: two runs (eager vs compiled) on aligned axes, each relative to
its own iteration's start. ``figure_overlap`` and ``figure_collectives``
(``figures_collectives.py``) show the overlap per iteration and each collective's
arrivals; ``report_figures`` is the report's section.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from interactive_shard.timeline.figures_lanes import (
    BOTTOM_PX,
    TOP_PX,
    every_nth,
    height_for,
    lane_axis,
    lay_out,
    legend_below,
    span_traces,
    window_trace,
)
from interactive_shard.timeline.model import TimelineModel, TimelineSpan
from interactive_shard.ui.format import duration_ms
from interactive_shard.ui.plain_figure import figure
from interactive_shard.ui.text import literal

Spec = tuple[list[dict[str, Any]], dict[str, Any]]  # a figure's traces and layout

__all__ = [
    "WAITING",
    "backward_order",
    "empty_figure",
    "figure_side_by_side",
    "figure_timeline",
    "overlap_text",
    "report_figures",
    "shown_iterations",
    "timeline_spec",
]

WAITING = "watch a model with ish.watch(model, timeline=True)"
MAX_TITLE_RANKS = 8  # ranks listed in a title's overlap line
MAX_TIMELINE_ITERATIONS = 20  # iterations "every iteration" draws (then every n-th)


# Okabe-Ito (as ui.colors); compiled kinds a lighter / darker cousin of their eager kind.
def backward_order(model: TimelineModel, rank: int, iteration: int) -> list[TimelineSpan]:
    """The spans that started in the iteration's backward, in start order: what
    ``model.order(rank, iteration, "backward")`` names, with their kinds."""
    phases = model.phases(rank, iteration)
    back, step = phases.get("backward"), phases.get("optimizer")
    if back is None:
        return []
    end = step[0] if step is not None else float("inf")  # the optimizer's start is its own
    return [s for s in model.spans(rank, iteration) if back[0] <= s.start < end]


# -- the titles' overlap ----------------------------------------------------------------------
def overlap_text(
    model: TimelineModel,
    rank: int,
    iteration: int | None,
    iterations: Sequence[int] | None = None,
) -> str:
    """``backward overlap 63% · exposed 1.2 ms`` for one iteration (None: the mean over
    ``iterations``, by default the rank's); the share of the collectives' time hidden
    under compute."""
    its = [iteration] if iteration is not None else list(iterations or model.iterations(rank))
    # overlap() reads 0.0 without collectives: only iterations that have some count.
    found = [f for f in (model.summary(rank, it) for it in its) if f.collectives]
    if not found:
        return "no collectives in backward"
    share = sum(f.overlap for f in found) / len(found)
    exposed = sum(f.exposed for f in found) / len(found)
    mean = "" if iteration is not None or len(found) == 1 else f" (mean of {len(found)} iterations)"
    return f"backward overlap {share:.0%} · exposed {duration_ms(exposed)}{mean}"


def _which(model: TimelineModel, iteration: int | None) -> str:
    if iteration is not None:
        return f"iteration {iteration}"
    first, last = model.earliest(), model.latest()
    return f"iterations {first}–{last}" if first != last else f"iteration {first}"


def shown_iterations(
    model: TimelineModel, ranks: Sequence[int], iteration: int | None
) -> tuple[dict[int, list[int]], str]:
    """The iterations a timeline draws on each rank: ``iteration``, or (None) every one,
    every n-th of a long run (at most ``MAX_TIMELINE_ITERATIONS``; the latest always);
    and how the title says it was decimated ("" when not)."""
    if iteration is not None:
        return {r: [iteration] for r in ranks}, ""
    shown, stride = model.sample(MAX_TIMELINE_ITERATIONS)
    out = {r: [it for it in shown if model.has(r, it)] for r in ranks}
    return out, every_nth(stride, len(shown), model.count())


def empty_figure(title: str = "No timeline spans yet") -> go.Figure:
    return figure(*empty_spec(title))


def empty_spec(title: str = "No timeline spans yet") -> Spec:
    layout = {
        "title": {"text": title},
        "height": 200,
        "annotations": [{"text": WAITING, "showarrow": False, "xref": "paper", "yref": "paper"}],
        "xaxis": {"visible": False},
        "yaxis": {"visible": False},
    }
    return [], layout


# -- figure: the timeline ---------------------------------------------------------------------
def figure_timeline(
    model: TimelineModel,
    *,
    iteration: int | None = None,
    ranks: Sequence[int] | None = None,
    depth: int | None = None,
    label: str | None = None,
) -> go.Figure:
    """Every span of ``iteration`` (None: of every iteration) on ``ranks`` (None: all)
    as bars on lanes, in ms since ``model.origin``; nested compute spans go below their
    parent down to ``depth`` (None: all); ``label`` names the run in the title. Drag to
    zoom time, double-click to reset."""
    return figure(*timeline_spec(model, iteration=iteration, ranks=ranks, depth=depth, label=label))


def timeline_spec(
    model: TimelineModel,
    *,
    iteration: int | None = None,
    ranks: Sequence[int] | None = None,
    depth: int | None = None,
    label: str | None = None,
) -> Spec:
    """``figure_timeline``'s traces and layout, as plain dicts (what a view redraws)."""
    chosen = sorted(model.ranks if ranks is None else set(ranks) & set(model.ranks))
    iterations, sampled = shown_iterations(model, chosen, iteration)
    spans = [s for r in chosen for it in iterations[r] for s in model.spans(r, it)]
    if not spans:
        return empty_spec()
    lanes = lay_out(spans, chosen, depth=depth)
    origin = min(s.start for s in spans)  # model.origin, unless some ranks are left out
    if len(chosen) == len(model.ranks) and model.origin is not None:
        origin = model.origin
    window = window_trace(model, lanes, iterations, origin)
    traces = [*([window] if window is not None else []), *span_traces(lanes, origin)]
    named = f" · {literal(label)}" if label else ""
    head = f"Timeline{named} · {_which(model, iteration)}"
    if len(chosen) == 1:
        words = overlap_text(model, chosen[0], iteration, iterations[chosen[0]])
        title = f"{head} · rank {chosen[0]} · {words}"
    else:
        each = " · ".join(
            f"rank {r}: {overlap_text(model, r, iteration, iterations[r])}"
            for r in chosen[:MAX_TITLE_RANKS]
        )
        more = " · …" if len(chosen) > MAX_TITLE_RANKS else ""
        title = f"{head} · {len(chosen)} ranks<br><sup>{each}{more}</sup>"
    if sampled:
        title += f"<br><sup>{sampled}: pick one in the iteration selector</sup>"
    height = height_for(len(lanes.labels))
    layout = {
        "title": {"text": title},
        "barmode": "overlay",
        "dragmode": "zoom",
        "xaxis": {"title": {"text": "ms since the first span"}, "zeroline": False},
        "yaxis": lane_axis(lanes),
        "height": height,
        "legend": legend_below(height),
        "margin": {"t": TOP_PX, "b": BOTTOM_PX, "l": 150},
        "hovermode": "closest",
    }
    return traces, layout


# -- figure: two runs side by side ------------------------------------------------------------
def iteration_start(model: TimelineModel, rank: int, iteration: int) -> float:
    """Where an iteration starts on ``rank``: its forward, else its first span."""
    forward = model.phases(rank, iteration).get("forward")
    if forward is not None:
        return forward[0]
    spans = model.spans(rank, iteration)
    return min((s.start for s in spans), default=0.0)


def figure_side_by_side(
    a: TimelineModel,
    b: TimelineModel,
    labels: tuple[str, str] = ("eager", "compiled"),
    iteration: int | None = None,
    rank: int = 0,
    *,
    depth: int | None = None,
) -> go.Figure:
    """Two runs' ``iteration`` (None: each run's latest) on ``rank``, stacked on one time
    axis, each in ms since its own iteration's start, each subplot titled with its
    overlap."""
    parts = []
    for label, m in zip(labels, (a, b), strict=True):
        it = iteration if iteration is not None else m.latest(rank)
        spans = m.spans(rank, it) if it is not None else []
        parts.append((label, m, it, lay_out(spans, [rank], depth=depth)))
    if not any(lanes.spans for *_, lanes in parts):
        return empty_figure(f"No timeline spans yet · {labels[0]} vs {labels[1]}")
    titles = []
    for label, m, it, lanes in parts:
        what = overlap_text(m, rank, it) if it is not None and lanes.spans else "no spans yet"
        titles.append(f"{literal(label)} · iteration {it or '—'} · {what}")
    rows = [max(len(lanes.labels), 1) for *_, lanes in parts]
    fig = make_subplots(
        rows=2,
        cols=1,
        shared_xaxes=True,
        vertical_spacing=0.12,
        row_heights=[n / sum(rows) for n in rows],
        subplot_titles=titles,
    )
    legend: set[str] = set()
    for row, (_, m, it, lanes) in enumerate(parts, start=1):
        if it is None or not lanes.spans:
            continue
        t0 = iteration_start(m, rank, it)
        window = window_trace(m, lanes, {rank: [it]}, t0, legend=legend)
        traces = span_traces(lanes, t0, legend=legend)
        for trace in [*([window] if window is not None else []), *traces]:
            fig.add_trace(trace, row=row, col=1)
        fig.update_yaxes(lane_axis(lanes), row=row, col=1)
    fig.update_xaxes(title={"text": "ms since the iteration's start"}, row=2, col=1)
    fig.update_layout(
        title={"text": f"{labels[0]} vs {labels[1]} · rank {rank}"},
        barmode="overlay",
        dragmode="zoom",
        height=height_for(sum(rows) + 4),
        legend=legend_below(height_for(sum(rows) + 4)),
        margin={"t": TOP_PX, "b": BOTTOM_PX, "l": 150},
        hovermode="closest",
    )
    return fig


# -- the report -------------------------------------------------------------------------------
def report_figures(model: TimelineModel) -> list[go.Figure]:
    """The report's section: the latest iteration on every rank, the overlap per
    iteration, and (with more than one rank) the latest iteration's collectives."""
    from interactive_shard.timeline.figures_collectives import (
        figure_collectives,
        figure_overlap,
    )

    model.update()
    latest = model.latest()
    if not model.ranks or latest is None:
        return []
    figures = [figure_timeline(model, iteration=latest), figure_overlap(model)]
    if len(model.ranks) > 1:
        figures.append(figure_collectives(model, latest))
    return figures
