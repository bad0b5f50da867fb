"""Pure figures of the run monitor (plotly only, no widgets): the live view and the report."""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go

from interactive_shard.monitor.model import MonitorModel
from interactive_shard.ui.colors import rank_color

DASHES = ("solid", "dash", "dot", "dashdot")


# The live widget shows at most this many points per line: redrawing 200,000-point
# traces took over a second per refresh and held the kernel. The report keeps all.
LIVE_POINTS = 2000


def _thin(values: list[float] | list[int], max_points: int | None) -> np.ndarray:
    array = np.asarray(values)  # numpy: plotly validates lists element by element
    if max_points is None or len(array) <= max_points:
        return array
    stride = -(-len(array) // max_points)
    return np.concatenate([array[::stride], array[-1:]])


def figure_scalars(model: MonitorModel, max_points: int | None = None) -> go.Figure:
    """One line per (scalar, rank), x = step; ``max_points`` thins long lines."""
    fig = go.Figure()
    for i, (name, per_rank) in enumerate(sorted(model.scalars.items())):
        for rank, series in sorted(per_rank.items()):
            fig.add_trace(
                go.Scatter(
                    x=_thin(series.steps, max_points),
                    y=_thin(series.values, max_points),
                    mode="lines+markers",
                    name=f"{name} · rank {rank}",
                    line={"color": rank_color(rank), "dash": DASHES[i % len(DASHES)]},
                    marker={"size": 4},
                )
            )
    fig.update_layout(
        title="Scalars emitted by the ranks",
        xaxis_title="step",
        height=300,
        margin={"l": 50, "r": 20, "t": 40, "b": 40},
        legend={"orientation": "h", "y": -0.25},
    )
    return fig


def report_figures(model: MonitorModel) -> list[go.Figure]:
    """The report's monitor section: every scalar, all points (empty when none)."""
    model.update()
    return [figure_scalars(model)] if model.scalars else []
