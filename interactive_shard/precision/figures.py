"""Pure plotly figures of a ``PrecisionModel``: the same figures serve the view, the report
and the tests.

``figure_grid``: the unit tree (rows, root first) × the phases (columns), a dtype chip
per cell, coloured by dtype (one legend for every figure: ``DTYPE_COLORS``); an input
the unit cast reads ``fp32→bf16``, an output ``output_dtype`` changed ``fp16→fp32``.
Given a plan, the planned grid stands on the left and the observed one on the right,
every cell where they differ outlined in red on both; a unit that failed gets a red ✖
in the ``failure`` column. ``figures_bytes.py`` has the bytes, collectives and findings;
``report_figures`` is the report's section.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import plotly.graph_objects as go

from interactive_shard.precision.analysis import describe_policy
from interactive_shard.precision.compare import Plan, differing_phases, dtypes_of, short
from interactive_shard.precision.events import PHASES, Unit
from interactive_shard.precision.model import PrecisionModel
from interactive_shard.ui.plain_figure import figure
from interactive_shard.ui.text import literal

__all__ = [
    "DIFF",
    "DTYPE_COLORS",
    "dtype_class",
    "figure",
    "figure_grid",
    "grid_parts",
    "planned_dtypes",
    "report_figures",
    "unit_label",
]

DIFF = "#FF0000"  # pure red, as the other features' differences (not a dtype colour)
SELECTED = "#000000"
# One colour per kind of dtype, in every figure (Okabe-Ito, as ui.colors).
DTYPE_COLORS = {
    "fp32": "#0072B2",
    "bf16": "#E69F00",
    "fp16": "#009E73",
    "fp64": "#56B4E9",
    "other": "#CC79A7",
    "several": "#999999",
}
_CLASSES = tuple(DTYPE_COLORS)
_ALWAYS = ("fp32", "bf16", "fp16")  # in the legend even when absent: the same legend everywhere
FAILURE = "failure"
ROW_PX, TOP_PX, MIN_HEIGHT = 34, 120, 340


def dtype_class(dtype: str | None) -> str | None:
    """The colour key of a cell: ``fp32`` / ``bf16`` / ``fp16`` / ``fp64``, ``other``, or
    ``several`` (a phase that saw more than one dtype); None for an empty cell."""
    found = dtypes_of(dtype)
    if not found:
        return None
    if len(found) > 1:
        return "several"
    name = short(found[0])
    return name if name in DTYPE_COLORS else "other"


def unit_label(unit: Unit, depth: int) -> str:
    """A row label: indented by depth, the fqn (``root``) and the module's class."""
    indent = "\u00a0\u00a0\u00a0" * depth + ("└ " if depth else "")
    return f"{indent}{unit.fqn or 'root'} · {unit.module_type}"


def planned_dtypes(plan: Plan | None) -> dict[str, Mapping[str, str]]:
    """fqn -> phase -> planned dtype, from a ``PrecisionPlan`` (empty without one)."""
    return {} if plan is None else {u.fqn: u.dtypes for u in plan.units}


def _colorscale() -> list[list[Any]]:
    n = len(_CLASSES)
    scale: list[list[Any]] = []
    for i, key in enumerate(_CLASSES):
        scale += [[i / n, DTYPE_COLORS[key]], [(i + 1) / n, DTYPE_COLORS[key]]]
    return scale


_COLORSCALE = _colorscale()


def _cell_text(phase: str, dtype: str, before: Sequence[str], cast: Sequence[bool]) -> str:
    """What a chip reads: its dtype, with what it was before a cast the unit did."""
    changed = [b for b, c in zip(before, cast, strict=False) if c] if phase == "input" else []
    if phase == "output" and before and dtypes_of(dtype) != list(dict.fromkeys(before)):
        changed = list(before)
    if changed:
        return literal(f"{short(', '.join(dict.fromkeys(changed)))}→{short(dtype)}")
    return literal(short(dtype))


def _heatmap(
    rows: list[tuple[Unit, str]],
    cells: Mapping[str, Mapping[str, str]],
    texts: Mapping[str, Mapping[str, str]],
    hovers: Mapping[str, Mapping[str, str]],
    name: str,
    font_size: int = 11,
) -> dict[str, Any]:
    index = {k: i for i, k in enumerate(_CLASSES)}
    z, text, hover = [], [], []
    for unit, _ in rows:
        mine = cells.get(unit.fqn, {})
        z.append([index.get(dtype_class(mine.get(p)) or "", None) for p in PHASES])
        text.append([texts.get(unit.fqn, {}).get(p, "") for p in PHASES])
        hover.append([hovers.get(unit.fqn, {}).get(p, "") for p in PHASES])
    return {
        "type": "heatmap",
        "name": name,
        "x": list(PHASES),
        "y": [label for _, label in rows],
        "z": z,
        "text": text,
        "texttemplate": "%{text}",
        "textfont": {"size": font_size, "color": "white"},
        "hovertext": hover,
        "hoverinfo": "text",
        "colorscale": _COLORSCALE,
        "zmin": -0.5,
        "zmax": len(_CLASSES) - 0.5,
        "showscale": False,
        "xgap": 4,
        "ygap": 4,
    }


Parts = tuple[list[dict[str, Any]], dict[str, Any]]  # a figure's traces and layout, as dicts


def _axes(sides: int) -> dict[str, Any]:
    """The axes of one grid, or of two side by side sharing their rows (as make_subplots
    lays them out, with horizontal_spacing 0.03)."""
    if sides == 1:
        return {
            "xaxis": {"anchor": "y", "domain": [0.0, 1.0]},
            "yaxis": {"anchor": "x", "domain": [0.0, 1.0]},
        }
    return {
        "xaxis": {"anchor": "y", "domain": [0.0, 0.485]},
        "yaxis": {"anchor": "x", "domain": [0.0, 1.0]},
        "xaxis2": {"anchor": "y2", "domain": [0.515, 1.0]},
        "yaxis2": {"anchor": "x2", "domain": [0.0, 1.0], "matches": "y", "showticklabels": False},
    }


def _side(trace: dict[str, Any], col: int) -> dict[str, Any]:
    """``trace`` on the grid of column ``col`` (1: the left one)."""
    suffix = str(col) if col > 1 else ""
    trace.update(xaxis=f"x{suffix}", yaxis=f"y{suffix}")
    return trace


def grid_parts(
    model: PrecisionModel,
    *,
    rank: int = 0,
    iteration: int | None = None,
    plan: Plan | None = None,
    selected: str | None = None,
) -> Parts:
    """``figure_grid``'s traces and layout."""
    units = model.units(rank)
    it = iteration if iteration is not None else model.latest(rank) or 1
    if not units:
        return [], {"title": {"text": "No mixed-precision data yet"}, "height": 200}
    # Labels are the rows' categories, as plotly shows them (ui.text.literal).
    rows = [(u, literal(unit_label(u, model.depth(u.fqn, rank=rank)))) for u in units]
    label_of = {u.fqn: label for u, label in rows}
    observed = {u.fqn: model.observed(u.fqn, rank=rank, iteration=it) for u in units}
    planned = planned_dtypes(plan)
    texts: dict[str, dict[str, str]] = {}
    hovers: dict[str, dict[str, str]] = {}
    for u, label in rows:
        records: dict[str, Any] = {s.phase: s for s in model.seen(u.fqn, rank=rank, iteration=it)}
        inputs = model.inputs(u.fqn, rank=rank, iteration=it)
        for phase, dtype in observed[u.fqn].items():
            s = records.get(phase)
            before = [b for b, _, _ in inputs] if phase == "input" else (s.before if s else [])
            cast = [c for _, _, c in inputs]
            texts.setdefault(u.fqn, {})[phase] = _cell_text(phase, dtype, before, cast)
        for phase in PHASES:
            seen, want = observed[u.fqn].get(phase), planned.get(u.fqn, {}).get(phase)
            lines = [f"<b>{label.strip()}</b> · {phase}"]
            lines.append(f"observed: {literal(short(seen) or '—')}")
            if plan is not None:
                lines.append(f"planned: {literal(short(want) or '—')}")
            if phase == "input" and inputs:
                lines += [
                    literal(f"input {i}: {short(b)} → {short(a)} ")
                    + f"({'cast' if c else 'passed through'})"
                    for i, (b, a, c) in enumerate(inputs)
                ]
            lines.append(literal(describe_policy(u.policy)))
            hovers.setdefault(u.fqn, {})[phase] = "<br>".join(lines)
    failures = [f for f in model.failures if f.rank == rank and f.iteration == it]
    sides = 2 if plan is not None else 1
    layout = _axes(sides)
    data: list[dict[str, Any]] = []
    col = sides  # the observed grid: the right one
    if plan is not None:
        planned_texts = {
            f: {p: literal(short(d)) for p, d in ds.items()} for f, ds in planned.items()
        }
        planned_cells = {f: {p: str(d) for p, d in ds.items()} for f, ds in planned.items()}
        data.append(_side(_heatmap(rows, planned_cells, planned_texts, hovers, "planned", 10), 1))
    size = 10 if plan is not None else 11
    data.append(_side(_heatmap(rows, observed, texts, hovers, "observed", size), col))
    differ = [
        (u.fqn, p)
        for u in units
        if u.fqn in planned
        for p in differing_phases(planned[u.fqn], observed[u.fqn])
    ]
    for c in range(1, sides + 1):
        mark = {
            "type": "scatter",
            "name": "planned ≠ observed",
            "legendgroup": "diff",
            "showlegend": c == 1,
            "x": [p for _, p in differ],
            "y": [label_of[f] for f, _ in differ],
            "mode": "markers",
            "marker": {"symbol": "square-open", "size": 34, "color": DIFF, "line": {"width": 4}},
            "hovertext": [
                literal(
                    f"{f or 'root'} · {p}: planned {short(planned[f][p])}, "
                    f"observed {short(observed[f][p])}"
                )
                for f, p in differ
            ],
            "hoverinfo": "text",
            "visible": True if differ else "legendonly",
        }
        data.append(_side(mark, c))
    predicted = list(plan.failures) if plan is not None else []
    x_order = [*PHASES, FAILURE] if failures or predicted else list(PHASES)
    if predicted:  # the planner finds every failure; a real run stops at the first
        marks = _failure_marks("predicted failure", predicted, label_of, "predicted")
        data.append(_side(marks, 1))
    if failures:
        marks = _failure_marks("failure (✖ at its unit)", failures, label_of, "failed")
        data.append(_side(marks, col))
    present = {
        dtype_class(d) for ds in (*observed.values(), *planned.values()) for d in ds.values()
    }
    for key in _CLASSES:
        if key in _ALWAYS or key in present:
            legend = {
                "type": "scatter",
                "name": key,
                "legendgroup": "dtype",
                "legendgrouptitle": {"text": "dtype"},
                "x": [None],
                "y": [None],
                "mode": "markers",
                "marker": {"symbol": "square", "size": 14, "color": DTYPE_COLORS[key]},
                "hoverinfo": "skip",
            }
            data.append(_side(legend, col))
    for c in range(1, sides + 1):
        layout["xaxis" if c == 1 else f"xaxis{c}"].update(
            categoryorder="array",
            categoryarray=x_order,
            tickvals=x_order,
            ticktext=[x.replace("_", "<br>") for x in x_order],
            tickangle=0,
            side="top",
        )
    for c in range(1, sides + 1):
        layout["yaxis" if c == 1 else f"yaxis{c}"].update(
            categoryorder="array",
            categoryarray=[label for _, label in rows],
            autorange="reversed",
        )
    if selected is not None and selected in label_of:
        row = next(i for i, r in enumerate(rows) if r[0].fqn == selected)
        layout["shapes"] = [
            {
                "type": "rect",
                "xref": "x domain" if sides == 1 else "x2 domain",
                "yref": "y",
                "x0": 0,
                "x1": 1,
                "y0": row - 0.5,
                "y1": row + 0.5,
                "line": {"color": SELECTED, "width": 2},
            }
        ]
    title = (
        f"Dtypes per unit and phase · rank {rank}, iteration {it} · {model.wrapper(rank)}"
        + (f" · <span style='color:{DIFF}'>{len(differ)} difference(s)</span>" if differ else "")
        + (f" · <span style='color:{DIFF}'>failed</span>" if failures else "")
    )
    layout.update(
        title={"text": title, "y": 0.98, "yanchor": "top"},
        height=max(MIN_HEIGHT, TOP_PX + ROW_PX * len(rows)),
        margin={"t": TOP_PX - 20, "l": 10, "r": 10, "b": 20},
        plot_bgcolor="white",
        legend={"orientation": "v", "x": 1.02, "y": 1},
        clickmode="event",
    )
    if plan is not None:  # subplot titles above the phases on top
        layout["annotations"] = subplot_titles((("planned", 0.2425), ("observed", 0.7575)), 34)
    return data, layout


def subplot_titles(titles: Sequence[tuple[str, float]], yshift: int = 0) -> list[dict[str, Any]]:
    """Titles above side-by-side subplots, as make_subplots writes them (text, centre x)."""
    return [
        {
            "font": {"size": 16},
            "showarrow": False,
            "text": text,
            "x": x,
            "xanchor": "center",
            "xref": "paper",
            "y": 1.0,
            "yanchor": "bottom",
            "yref": "paper",
            **({"yshift": yshift} if yshift else {}),
        }
        for text, x in titles
    ]


def figure_grid(
    model: PrecisionModel,
    *,
    rank: int = 0,
    iteration: int | None = None,
    plan: Plan | None = None,
    selected: str | None = None,
) -> go.Figure:
    """The unit tree × phases of ``rank`` at ``iteration`` (None: its latest); with a
    plan, planned (left) next to observed (right), differing cells outlined red."""
    return figure(*grid_parts(model, rank=rank, iteration=iteration, plan=plan, selected=selected))


def report_figures(model: PrecisionModel) -> list[go.Figure]:
    """The report's section: rank 0's latest iteration (and the first, when it differs)
    as the grid (planned vs observed when ``model.plan`` is set), the bytes held, the
    collectives, and the findings with their fixes."""
    from interactive_shard.precision.figures_bytes import (
        figure_bytes,
        figure_collectives,
        figure_findings,
    )

    model.update()
    ranks = model.ranks
    if not ranks:
        return []
    rank = 0 if 0 in ranks else ranks[0]
    latest = model.latest(rank) or 1
    figures = [
        figure_grid(model, rank=rank, iteration=it, plan=model.plan)
        for it in dict.fromkeys([1, latest])
    ]
    figures += [
        figure_bytes(model, rank=rank, iteration=latest),
        figure_collectives(model, rank=rank, iteration=latest),
    ]
    if model.findings or (model.plan is not None and model.plan.failures):
        figures.append(figure_findings(model, plan=model.plan))
    return figures


def _failure_marks(
    name: str, failures: list[Any], label_of: dict[str, str], verb: str
) -> dict[str, Any]:
    """A ✖ per failure in the failure column, at its unit's row ("predicted" open)."""
    return {
        "type": "scatter",
        "name": name,
        "x": [FAILURE] * len(failures),
        "y": [label_of.get(f.unit, literal(f.unit)) for f in failures],
        "mode": "markers+text",
        "text": [f"in {literal(f.consumer)}" for f in failures],
        "textposition": "middle right",
        "marker": {
            "symbol": "x-open" if verb == "predicted" else "x",
            "size": 16 if verb == "predicted" else 18,
            "color": DIFF,
        },
        "hovertext": [
            f"<b>{verb}</b> in <code>{literal(f.consumer)}</code>:<br>{literal(f.message)}"
            for f in failures
        ],
        "hoverinfo": "text",
    }
