"""Pure plotly figures of a ``LifecycleModel`` (``run.ddp``): no widgets, no torch.

``figure_lifecycle`` (``figures_strip.py``): one DDP instance's iterations as a strip
(x = iteration, one row per thing a lifecycle mistake changes: forwards, backward,
reduction finished, buffer sync, delayed all-reduce, optimizer steps in backward,
dropped forwards), coloured by state with the details in the hover; past
``MAX_COLUMNS`` iterations a column stands for consecutive iterations (the worst state
among them; the title says so) and ``window`` zooms in. ``figure_hooks``: the live DDP
hooks on each parameter (two or more: the model was wrapped twice). ``figure_bytes``:
the bytes each instance sent, stacked by purpose. ``report_figures``: all of them, for
the report (a strip has at most ``MAX_COLUMNS`` columns, whatever the run's length).
"""

from __future__ import annotations

from dataclasses import dataclass

import plotly.graph_objects as go

from interactive_shard.ddp.figures_strip import (
    EMPTY,
    MAX_COLUMNS,
    ROWS,
    STATE_COLORS,
    Strip,
    empty_figure,
    figure_lifecycle,
    instance_label,
    lifecycle_strip,
    pick,
    window_rows,
)
from interactive_shard.ddp.model import PURPOSE_ORDER, LifecycleModel
from interactive_shard.ui.format import nbytes
from interactive_shard.ui.text import literal

__all__ = [
    "MAX_COLUMNS",
    "ROWS",
    "STATE_COLORS",
    "Bars",
    "Strip",
    "bytes_bars",
    "figure_bytes",
    "figure_hooks",
    "figure_lifecycle",
    "instance_label",
    "lifecycle_strip",
    "pick",
    "report_figures",
    "window_rows",
]

PURPOSE_COLORS = {
    "gradients": "#0072B2",
    "buffers": "#E69F00",
    "construction": "#009E73",
    "delayed": "#CC79A7",
    "other": "#999999",
}
HOOK_COLORS = {0: "#BBBBBB", 1: "#0072B2"}  # 2 or more: STATE_COLORS["bad"]


def figure_hooks(model: LifecycleModel, ddp: int | None = None, rank: int = 0) -> go.Figure:
    """Live DDP hooks per parameter of one instance; two or more (red): double hooks."""
    inst = pick(model, ddp, rank)
    if inst is None:
        return empty_figure(EMPTY)
    hooks = inst.hooks
    fqns = list(hooks)
    counts = [hooks[f] for f in fqns]
    colors = [HOOK_COLORS.get(c, STATE_COLORS["bad"]) for c in counts]
    double = sum(1 for c in counts if c >= 2)
    title = f"Live DDP hooks per parameter · {literal(instance_label(inst))}"
    title += f" · {double} hooked twice or more" if double else " · one each"
    fig = go.Figure(
        go.Bar(
            name="hooks",
            x=[literal(f) for f in fqns],
            y=counts,
            marker={"color": colors},
            hovertemplate="%{x}: %{y} live DDP hook(s)<extra></extra>",
        )
    )
    fig.update_layout(
        title={"text": title},
        height=320,
        yaxis={"title": {"text": "live hooks"}, "dtick": 1, "rangemode": "tozero"},
        xaxis={"title": {"text": "parameter"}},
    )
    return fig


@dataclass
class Bars:
    """What ``figure_bytes`` draws: per purpose, the bytes of each instance (``x``)."""

    title: str
    x: list[str]
    sent: dict[str, list[int]]  # purpose -> bytes per instance, in PURPOSE_ORDER

    def hover(self, purpose: str) -> list[str]:
        return [f"{purpose}: {nbytes(v)}" for v in self.sent[purpose]]


def bytes_bars(model: LifecycleModel, rank: int = 0) -> Bars | None:
    """The bytes ``rank`` sent per instance and purpose (None: no instance yet)."""
    insts = model.instances_of(rank)
    if not insts:
        return None
    per = [model.bytes_by_purpose(rank, i.serial) for i in insts]
    total = sum(sum(b.values()) for b in per)
    return Bars(
        f"Bytes sent by purpose · rank {rank} · {nbytes(total)} in all",
        [f"DDP #{i.serial}" for i in insts],
        {purpose: [b[purpose] for b in per] for purpose in PURPOSE_ORDER},
    )


def figure_bytes(model: LifecycleModel, rank: int = 0) -> go.Figure:
    """Bytes ``rank`` sent per instance, stacked by purpose (``PURPOSE_ORDER``)."""
    bars = bytes_bars(model, rank)
    if bars is None:
        return empty_figure(EMPTY)
    fig = go.Figure()
    for purpose, y in bars.sent.items():
        fig.add_bar(
            name=purpose,
            x=bars.x,
            y=y,
            marker={"color": PURPOSE_COLORS[purpose]},
            hovertext=bars.hover(purpose),
            hoverinfo="x+text",
        )
    fig.update_layout(
        barmode="stack",
        title={"text": bars.title},
        height=320,
        yaxis={"title": {"text": "bytes"}},
    )
    return fig


def report_figures(model: LifecycleModel) -> list[go.Figure]:
    """Per instance its lifecycle strip and hooks, then the bytes of every instance."""
    insts = model.instances
    if not insts:
        return []
    rank = insts[0].rank
    out: list[go.Figure] = []
    for inst in insts:
        out.append(figure_lifecycle(model, inst.serial, rank))
        out.append(figure_hooks(model, inst.serial, rank))
    out.append(figure_bytes(model, rank))
    return out
