"""The run's own cost as figures: each probe's share of the step, one bar per rank, and
the table behind it. Pure plotly (no widgets): the live view and the report draw them."""

from __future__ import annotations

from typing import Any

import plotly.graph_objects as go

from interactive_shard.overhead.model import OverheadModel, percent
from interactive_shard.ui.colors import rank_color
from interactive_shard.ui.format import duration_ms
from interactive_shard.ui.plain_figure import figure
from interactive_shard.ui.text import literal


def report_figures(model: OverheadModel) -> list[go.Figure]:
    return [share_figure(model), table_figure(model)]


def share_figure(model: OverheadModel) -> go.Figure:
    """Each probe's share of the step (percent), a bar per rank."""
    model.update()
    probes, ranks = model.probes, model.ranks
    if not ranks:
        return figure([], {"title": {"text": "No probe costs recorded yet"}, "height": 200})
    badge = model.badge()
    traces: list[dict[str, Any]] = []
    for rank in ranks:
        rows = [model.row(p, rank) for p in probes]
        traces.append(
            {
                "type": "bar",
                "name": f"rank {rank}",
                "x": [literal(p) for p in probes],
                "y": [0.0 if r is None else r.share * 100 for r in rows],
                "marker": {"color": rank_color(rank)},
                "customdata": [_tip(r) for r in rows],
                "hovertemplate": "%{x} · rank " + str(rank) + "<br>%{customdata}<extra></extra>",
            }
        )
    return figure(
        traces,
        {
            "title": {"text": literal(badge[:1].upper() + badge[1:])},
            "barmode": "group",
            "yaxis": {"title": {"text": "share of the step (%)"}, "rangemode": "tozero"},
            "xaxis": {"title": {"text": "probe"}},
            "height": 320,
            "margin": {"t": 50, "b": 50},
        },
    )


def table_figure(model: OverheadModel) -> go.Figure:
    """Every (probe, rank): its share, time, active span, calls and iterations."""
    model.update()
    rows = model.rows()
    columns = ["rank", "probe", "share", "own time", "over", "calls", "iterations"]
    cells = [
        [r.rank for r in rows],
        [literal(r.probe) for r in rows],
        [percent(r.share) for r in rows],
        [duration_ms(r.spent) for r in rows],
        [f"{r.active:,.1f} s" for r in rows],
        [f"{r.calls:,}" for r in rows],
        [f"{r.iterations:,}" if r.iterations else "" for r in rows],
    ]
    height = 80 + 22 * max(len(rows), 1)
    return figure(
        [{"type": "table", "header": {"values": columns}, "cells": {"values": cells}}],
        {"height": height, "margin": {"t": 10, "b": 10, "l": 10, "r": 10}},
    )


def _tip(row: Any) -> str:
    if row is None:
        return "not recorded"
    return (
        f"{percent(row.share)}: {duration_ms(row.spent)} of {row.active:,.1f} s"
        f" in {row.calls:,} calls"
    )
