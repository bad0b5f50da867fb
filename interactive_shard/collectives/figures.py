"""The ledger as a figure: ranks × sequence number, one cell per collective, coloured by
op; the first divergence outlined, the collectives still pending shaded. Pure plotly (no
widgets): the live view and the report draw the same figure."""

from __future__ import annotations

from typing import Any

import plotly.graph_objects as go

from interactive_shard.collectives.events import LedgerEntry
from interactive_shard.collectives.model import CollectivesModel
from interactive_shard.ui.colors import PALETTE
from interactive_shard.ui.format import duration_ms
from interactive_shard.ui.format import nbytes as fmt_bytes
from interactive_shard.ui.plain_figure import figure
from interactive_shard.ui.text import literal

WINDOW = 400  # sequence numbers shown at once (around the divergence, else the newest)
_MISSING = "#FFFFFF"


def report_figures(model: CollectivesModel) -> list[go.Figure]:
    return [ledger_figure(model, group) for group in model.busiest()[:4]]


def ledger_figure(model: CollectivesModel, group: str | None = None) -> go.Figure:
    """``group``'s ledger (default: the busiest), ``WINDOW`` sequence numbers at most."""
    groups = model.busiest()
    if group is None:
        group = groups[0] if groups else ""
    ranks = model.ranks
    span = model.seq_range(group)
    if span is None:
        return figure([], {"title": {"text": "No collectives recorded yet"}, "height": 200})
    d = model.divergence()
    here = d if d is not None and d.group == group else None
    first, last = _window(span, here.seq if here is not None else None)
    table = model.table(group)
    per_rank = {r: table.get(r, {}) for r in ranks}
    shown = [s for s in range(first, last + 1) if any(s in mine for mine in per_rank.values())]
    total = sum(map(len, per_rank.values()))
    ops = sorted({e.op for mine in per_rank.values() for s in shown if (e := mine.get(s))})
    z, text = [], []
    for r in ranks:
        row, tips = [], []
        for s in shown:
            e = per_rank[r].get(s)
            row.append(ops.index(e.op) if e is not None else None)
            tips.append(_tip(r, s, e))
        z.append(row)
        text.append(tips)
    colorscale = _scale(len(ops))
    traces: list[dict[str, Any]] = [
        {
            "type": "heatmap",
            "x": shown,
            "y": [f"rank {r}" for r in ranks],
            "z": z,
            "text": text,
            "hoverinfo": "text",
            "zmin": -0.5,
            "zmax": len(ops) - 0.5,
            "colorscale": colorscale,
            "xgap": 1,
            "ygap": 2,
            "colorbar": {
                "tickvals": list(range(len(ops))),
                "ticktext": [literal(op) for op in ops],
                "title": {"text": "op"},
            },
        }
    ]
    shapes: list[dict[str, Any]] = []
    notes = []
    if here is not None and first <= here.seq <= last:
        shapes.append(_outline(here.seq, len(ranks)))
        notes.append(f"first divergence: {here.kind} at #{here.seq} (outlined)")
    pending = sorted(e.seq for e in model.pending().values() if e is not None and e.group == group)
    if pending:
        shapes.append(
            {
                "type": "rect",
                "xref": "x",
                "yref": "paper",
                "x0": pending[0] - 0.5,
                "x1": pending[-1] + 0.5,
                "y0": 0,
                "y1": 1,
                "fillcolor": "#D55E00",
                "opacity": 0.18,
                "line": {"width": 0},
            }
        )
        late = model.waiting_for()
        notes.append(
            f"pending (shaded) at #{pending[-1]}"
            + (f": waiting for rank(s) {', '.join(map(str, late))}" if late else "")
        )
    if (first, last) != span:
        notes.append(f"showing #{first}–#{last} of #{span[0]}–#{span[1]} ({total:,} recorded)")
    title = f"Collectives of group {literal(group)}, by rank and sequence number"
    if notes:
        title += "<br><sub>" + literal(" · ".join(notes)) + "</sub>"
    layout = {
        "title": {"text": title},
        "xaxis": {"title": {"text": "sequence number in the group"}},
        "yaxis": {"autorange": "reversed"},
        "shapes": shapes,
        "height": 180 + 32 * len(ranks),
        "margin": {"l": 70, "r": 20, "t": 70, "b": 50},
    }
    return figure(traces, layout)


def _window(span: tuple[int, int], focus: int | None) -> tuple[int, int]:
    """The sequence numbers shown: ``WINDOW`` around ``focus``, else the newest."""
    low, high = span
    if high - low < WINDOW:
        return low, high
    if focus is None:
        return high - WINDOW + 1, high
    first = min(max(low, focus - WINDOW // 2), high - WINDOW + 1)
    return first, first + WINDOW - 1


def _tip(rank: int, seq: int, e: LedgerEntry | None) -> str:
    if e is None:
        return f"rank {rank} #{seq}: nothing recorded"
    shape = "×".join(map(str, e.shape)) or "scalar"
    took = f", {duration_ms(e.end - e.start)}" if e.start is not None and e.end is not None else ""
    return (
        f"rank {rank} #{seq}: <b>{literal(e.op)}</b> {literal(e.dtype)} [{shape}], "
        f"{fmt_bytes(e.nbytes)}<br>by {literal(e.caller or 'unknown')}<br>{e.state}{took}"
    )


def _scale(n: int) -> list[list[Any]]:
    """A discrete colour scale: op k gets PALETTE[k]."""
    if n <= 1:
        return [[0.0, PALETTE[0]], [1.0, PALETTE[0]]]
    out: list[list[Any]] = []
    for k in range(n):
        color = PALETTE[k % len(PALETTE)]
        out += [[k / n, color], [(k + 1) / n, color]]
    return out


def _outline(seq: int, n_ranks: int) -> dict[str, Any]:
    return {
        "type": "rect",
        "xref": "x",
        "yref": "y",
        "x0": seq - 0.5,
        "x1": seq + 0.5,
        "y0": -0.5,
        "y1": n_ranks - 0.5,
        "line": {"color": "#000000", "width": 3},
        "fillcolor": "rgba(0,0,0,0)",
    }
