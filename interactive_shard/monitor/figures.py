"""Pure figures of the run monitor (plotly only, no widgets): the live view and the report."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import plotly.graph_objects as go

from interactive_shard.monitor.model import MonitorModel
from interactive_shard.ui.colors import rank_color
from interactive_shard.ui.text import literal

DASHES = ("solid", "dash", "dot", "dashdot")
WEBGL_POINTS = 20_000  # more points than this in a figure: WebGL traces


# The live widget shows at most this many points per line: redrawing 200,000-point
# traces took over a second per refresh and held the kernel. The report keeps up to
# REPORT_POINTS per line, so that a 10,000-step run of many ranks stays a small page.
LIVE_POINTS = 2000
REPORT_POINTS = 5000
TITLE = "Scalars emitted by the ranks"


class Line(NamedTuple):
    name: str
    rank: int
    steps: np.ndarray
    values: np.ndarray
    total: int  # points in the series (more than shown when thinned)


def _thin(values: np.ndarray, max_points: int | None) -> np.ndarray:
    """Every k-th point and the last: a strided view of the series' array costs the
    points kept, not the series' length (a refresh must not grow with the run)."""
    n = len(values)
    if max_points is None or n <= max_points:
        return values
    stride = -(-n // max_points)
    kept = values[::stride]
    return kept if (n - 1) % stride == 0 else np.append(kept, values[-1])


def scalar_lines(model: MonitorModel, max_points: int | None = None) -> list[Line]:
    """One line per (scalar, rank), in name then rank order, thinned to ``max_points``."""
    return [
        Line(name, rank, _thin(s.step_array, max_points), _thin(s.value_array, max_points), len(s))
        for name, per_rank in sorted(model.scalars.items())
        for rank, s in sorted(per_rank.items())
    ]


def line_name(line: Line) -> str:
    """A line's trace name (its legend entry): the scalar's name shown as itself."""
    return f"{literal(line.name)} · rank {line.rank}"


def title(lines: list[Line]) -> str:
    """The figure's title; says when lines are thinned (a screen shows ~2,000 points)."""
    thinned = [ln for ln in lines if len(ln.steps) < ln.total]
    if not thinned:
        return TITLE
    longest = max(thinned, key=lambda ln: ln.total)
    stride = -(-longest.total // max(len(longest.steps) - 1, 1))
    return f"{TITLE} (every {stride}th point of {longest.total:,} shown)"


def figure_scalars(model: MonitorModel, max_points: int | None = None) -> go.Figure:
    """One line per (scalar, rank), x = step; ``max_points`` thins long lines."""
    lines = scalar_lines(model, max_points)
    names = sorted(model.scalars)
    many = sum(len(ln.steps) for ln in lines) > WEBGL_POINTS
    trace = go.Scattergl if many else go.Scatter  # WebGL: 100k+ points stay fluid
    fig = go.Figure()
    for ln in lines:
        fig.add_trace(
            trace(
                x=ln.steps,
                y=ln.values,
                mode="lines+markers",
                name=line_name(ln),
                line={"color": rank_color(ln.rank), "dash": DASHES[names.index(ln.name) % 4]},
                marker={"size": 4},
            )
        )
    fig.update_layout(
        title=title(lines),
        xaxis_title="step",
        height=300,
        margin={"l": 50, "r": 20, "t": 40, "b": 40},
        legend={"orientation": "h", "y": -0.25},
    )
    return fig


def report_figures(model: MonitorModel) -> list[go.Figure]:
    """The report's monitor section: every scalar, thinned to ``REPORT_POINTS`` a line."""
    model.update()
    return [figure_scalars(model, REPORT_POINTS)] if model.scalars else []
