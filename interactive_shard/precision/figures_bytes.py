"""Pure plotly figures of a ``PrecisionModel``'s bytes and conclusions (with ``figures.py``).

``figure_bytes``: bytes each unit holds per dtype, stacked (sharded parameters plain,
unsharded compute parameters hatched, gradients dotted; colour = dtype, as the grid),
and the total over every unit. ``figure_collectives``: each unit's all-gathers (forward,
backward) and reductions, bytes this rank sent, coloured by dtype. ``figure_findings``:
observed failures and findings with their fixes, and a plan's predicted failures, as a
table.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import plotly.graph_objects as go

from interactive_shard.precision.analysis import CATEGORIES, category_label
from interactive_shard.precision.compare import Plan, short
from interactive_shard.precision.figures import (
    DIFF,
    DTYPE_COLORS,
    Parts,
    dtype_class,
    figure,
    subplot_titles,
    unit_label,
)
from interactive_shard.precision.model import PrecisionModel
from interactive_shard.ui.format import nbytes
from interactive_shard.ui.text import literal

__all__ = [
    "bytes_parts",
    "collectives_parts",
    "figure_bytes",
    "figure_collectives",
    "figure_findings",
    "fix_text",
]

PATTERNS = {"sharded_param": "", "param": "/", "sharded_grad": "."}
LEVEL_COLORS = {"error": DIFF, "warning": "#E69F00", "note": "#0072B2", "planned": "#CC79A7"}
_UNSET = re.compile(r"\b\w+=None(, )?|, \w+=None(?=\))")
OPS = {"all_gather": "AG", "reduce_scatter": "RS", "all_reduce": "AR"}


def _color(dtype: str) -> str:
    return DTYPE_COLORS[dtype_class(dtype) or "other"]


def _labels(model: PrecisionModel, rank: int) -> dict[str, str]:
    """fqn -> its unit's label, as plotly shows it (the grid's rows)."""
    return {u.fqn: literal(unit_label(u, model.depth(u.fqn, rank=rank))) for u in model.units(rank)}


def bytes_parts(model: PrecisionModel, *, rank: int = 0, iteration: int | None = None) -> Parts:
    """``figure_bytes``' traces and layout."""
    held = model.bytes_held(rank=rank, iteration=iteration)
    it = iteration if iteration is not None else model.latest(rank) or 1
    if not held:
        return [], {"title": {"text": "No parameters reported yet"}, "height": 200}
    wrapper = model.wrapper(rank)
    labels = _labels(model, rank)
    total = model.total_bytes(rank=rank, iteration=iteration)
    keys = list(dict.fromkeys((h.category, h.dtype) for h in held))
    keys.sort(key=lambda k: CATEGORIES.index(k[0]))
    data: list[dict[str, Any]] = []
    for category, dtype in keys:
        mine = [h for h in held if (h.category, h.dtype) == (category, dtype)]
        name = f"{category_label(category, wrapper)} · {literal(short(dtype))}"
        marker = {"color": _color(dtype), "pattern": {"shape": PATTERNS[category]}}
        data.append(
            {
                "type": "bar",
                "name": name,
                "legendgroup": name,
                "x": [labels.get(h.unit, literal(h.unit)) for h in mine],
                "y": [h.nbytes for h in mine],
                "marker": marker,
                "hovertext": [
                    f"{literal(h.unit or 'root')}: {name}<br>{nbytes(h.nbytes)}" for h in mine
                ],
                "hoverinfo": "text",
                "xaxis": "x",
                "yaxis": "y",
            }
        )
        n = total[(category, dtype)]
        data.append(
            {
                "type": "bar",
                "name": name,
                "legendgroup": name,
                "showlegend": False,
                "x": ["total"],
                "y": [n],
                "marker": marker,
                "hovertext": [f"all units: {name}<br>{nbytes(n)}"],
                "hoverinfo": "text",
                "xaxis": "x2",
                "yaxis": "y2",
            }
        )
    grand = sum(total.values())
    shard = "replicated (DDP)" if wrapper == "ddp" else f"sharded over {model.world_size} ranks"
    layout = {
        # make_subplots(1, 2, column_widths=[0.8, 0.2], horizontal_spacing=0.08)'s axes
        "xaxis": {"anchor": "y", "domain": [0.0, 0.736]},
        "yaxis": {"anchor": "x", "domain": [0.0, 1.0], "title": {"text": "bytes"}},
        "xaxis2": {"anchor": "y2", "domain": [0.816, 1.0]},
        "yaxis2": {"anchor": "x2", "domain": [0.0, 1.0]},
        "annotations": subplot_titles((("per unit", 0.368), ("all units", 0.908))),
        "barmode": "stack",
        "title": {
            "text": f"Bytes held per dtype · rank {rank}, iteration {it} · {nbytes(grand)} in "
            f"all · parameters {shard}"
        },
        "height": 420,
        "legend": {"orientation": "h", "y": -0.25},
        "margin": {"t": 80, "b": 40},
    }
    return data, layout


def figure_bytes(
    model: PrecisionModel, *, rank: int = 0, iteration: int | None = None
) -> go.Figure:
    """Bytes held per unit and in total on ``rank``, stacked by category and dtype."""
    return figure(*bytes_parts(model, rank=rank, iteration=iteration))


def collectives_parts(
    model: PrecisionModel, *, rank: int = 0, iteration: int | None = None
) -> Parts:
    """``figure_collectives``' traces and layout."""
    it = iteration if iteration is not None else model.latest(rank) or 1
    found = model.collectives(rank=rank, iteration=it)
    if not found:
        return [], {"title": {"text": "No collectives reported yet"}, "height": 200}
    labels = _labels(model, rank)
    order = {fqn: i for i, fqn in enumerate(labels)}
    found = sorted(found, key=lambda c: order.get(c.unit, len(order)))

    def op_of(c: Any) -> str:
        if c.op != "all_gather":
            return OPS[c.op]
        return f"AG {'bwd' if c.backward else 'fwd'}"

    data: list[dict[str, Any]] = []
    for dtype in dict.fromkeys(c.dtype for c in found):
        sums: dict[tuple[str, str], int] = {}
        for c in found:
            if c.dtype == dtype:
                key = (labels.get(c.unit, literal(c.unit)), op_of(c))
                sums[key] = sums.get(key, 0) + c.nbytes
        data.append(
            {
                "type": "bar",
                "name": literal(short(dtype)),
                "x": [[u for u, _ in sums], [o for _, o in sums]],
                "y": list(sums.values()),
                "marker": {"color": _color(dtype)},
                "text": [literal(short(dtype))] * len(sums),
                "textposition": "inside",
                "hovertext": [f"{u}<br>{o}: {nbytes(n)}" for (u, o), n in sums.items()],
                "hoverinfo": "text",
            }
        )
    layout = {
        "barmode": "stack",
        "title": {
            "text": f"Collectives per unit (bytes this rank sent) · rank {rank}, iteration {it}"
            "<br><sup>AG: all-gather (forward, backward) · RS: reduce-scatter · AR: all-reduce "
            "(a reduction's dtype is the unit's reduce phase)</sup>"
        },
        "yaxis": {"title": {"text": "bytes"}},
        "height": 420,
        "margin": {"t": 80, "b": 60},
        "xaxis": {"tickangle": 0},
    }
    return data, layout


def figure_collectives(
    model: PrecisionModel, *, rank: int = 0, iteration: int | None = None
) -> go.Figure:
    """Each unit's collectives of ``iteration`` on ``rank``: bytes sent, by op and dtype."""
    return figure(*collectives_parts(model, rank=rank, iteration=iteration))


def fix_text(fix: object) -> str:
    """A fix in words: text as it is; a plan's ``policies`` dict as ``fqn: policy`` lines,
    each policy without the fields it leaves None."""
    if isinstance(fix, Mapping):
        return "; ".join(f"{k or 'root'!s}: {_UNSET.sub('', repr(v))}" for k, v in fix.items())
    return "" if fix is None else str(fix)


def figure_findings(model: PrecisionModel, *, plan: Plan | None = None) -> go.Figure:
    """Failures and findings (where, what, the fix); a plan's predicted failures too."""
    rows: list[tuple[str, str, str, str, str, str]] = []
    for f in model.findings:
        ranks = ", ".join(map(str, f.ranks))
        its = ", ".join(map(str, f.iterations[:5])) + ("…" if len(f.iterations) > 5 else "")
        rows.append((f.level, f.kind, f.unit or "root", f"{ranks} / {its}", f.message, f.fix))
    for p in plan.failures if plan is not None else ():
        note = getattr(p, "fix_note", "") or ""
        fix = " ".join(x for x in (note, fix_text(getattr(p, "fix", None))) if x)
        rows.append(("planned", "predicted failure", p.unit or "root", "plan", p.message, fix))
    if not rows:
        return figure([], {"title": {"text": "No findings"}, "height": 160})
    columns = list(zip(*rows, strict=True))
    colors = [LEVEL_COLORS.get(level, "#999999") for level in columns[0]]
    table = {
        "type": "table",
        "columnwidth": [70, 110, 60, 80, 330, 380],
        "header": {
            "values": ["level", "kind", "unit", "ranks / iterations", "what", "fix"],
            "align": "left",
            "fill": {"color": "#eeeeee"},
        },
        "cells": {
            "values": [[literal(v) for v in c] for c in columns],
            "align": "left",
            "font": {"color": [colors, ["#222222"] * len(rows)]},
            "height": 28,
        },
    }
    # Rows grow with their text (about 40 characters a line in the widest columns).
    lines = sum(1 + max(len(r[4]), len(r[5])) // 40 for r in rows)
    layout = {
        "title": {"text": f"Findings and failures · {len(rows)}"},
        "height": min(2400, 120 + 17 * lines + 14 * len(rows)),
        "margin": {"t": 50, "b": 10},
    }
    return figure([table], layout)
