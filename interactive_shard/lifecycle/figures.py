"""Pure plotly figures of a ``LifecycleModel`` (``run.ddp``): no widgets, no torch.

``figure_lifecycle``: one DDP instance's iterations as a strip (x = iteration, one row
per thing a lifecycle mistake changes: forwards, backward, reduction finished, buffer
sync, delayed all-reduce, optimizer steps in backward, dropped forwards), coloured by
state with the details in the hover. ``figure_hooks``: the live DDP hooks on each
parameter (two or more: the model was wrapped twice). ``figure_bytes``: the bytes each
instance sent, stacked by purpose. ``report_figures``: all of them, for the report.
"""

from __future__ import annotations

from typing import Any

import plotly.graph_objects as go

from interactive_shard.lifecycle.model import (
    PURPOSE_ORDER,
    Instance,
    Iteration,
    LifecycleModel,
)

__all__ = [
    "ROWS",
    "STATE_COLORS",
    "figure_bytes",
    "figure_hooks",
    "figure_lifecycle",
    "fmt_bytes",
    "instance_label",
    "pick",
    "report_figures",
]

ROWS = (
    "forwards",
    "backward",
    "reduction finished",
    "buffer sync",
    "delayed all-reduce",
    "optimizer steps in backward",
    "dropped forwards",
)
# A cell's state -> its colour; the heatmap's z is the index into this (a discrete scale).
STATE_COLORS = {
    "none": "#F2F2F2",  # nothing happened (0 bytes, no step)
    "ok": "#A6DBA0",  # what a healthy iteration does
    "info": "#9ECAE1",  # happened, neither right nor wrong (bytes sent, a step)
    "warn": "#FDD49E",  # unusual but legal (two forwards, no backward)
    "bad": "#D55E00",  # a lifecycle mistake (unfinished reduction, dropped forward)
}
PURPOSE_COLORS = {
    "gradients": "#0072B2",
    "buffers": "#E69F00",
    "construction": "#009E73",
    "delayed": "#CC79A7",
    "other": "#999999",
}
HOOK_COLORS = {0: "#BBBBBB", 1: "#0072B2"}  # 2 or more: STATE_COLORS["bad"]
EMPTY = "No DDP instance watched yet: watch a DDP model with ish.watch(ddp)"
_STATES = list(STATE_COLORS)
_UNITS = ((2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB"))


def fmt_bytes(n: float) -> str:
    for scale, name in _UNITS:
        if n >= scale:
            return f"{n / scale:.3g} {name}"
    return f"{int(n)} B"


def pick(model: LifecycleModel, ddp: int | None = None, rank: int = 0) -> Instance | None:
    """Instance ``ddp`` of ``rank`` (None: the newest, the one a re-run cell trains)."""
    found = model.instances_of(rank)
    if ddp is None:
        return found[-1] if found else None
    return next((i for i in found if i.serial == ddp), None)


def instance_label(inst: Instance) -> str:
    """``DDP #2 · static_graph, find_unused``: the serial and what differs from defaults."""
    s = inst.settings
    parts = [name for name in ("static_graph", "find_unused_parameters") if s[name]]
    if not s["forward_sync_buffers"]:
        parts.append("no buffer sync")
    if s["delayed"]:
        parts.append(f"{len(s['delayed'])} delayed")
    if s["comm_hook"]:
        parts.append(f"comm hook {s['comm_hook']}")
    if s["mixed_precision"]:
        parts.append("mixed precision")
    if s["optimizer_in_backward"]:
        parts.append("optimizer in backward")
    summary = ", ".join(p.replace("_parameters", "") for p in parts) or "defaults"
    return f"DDP #{inst.serial} · {summary}"


def _empty(text: str) -> go.Figure:
    return go.Figure(layout={"title": {"text": text}, "height": 200})


def _cells(it: Iteration) -> list[tuple[str, str, str]]:
    """(state, text, hover) per row of ``ROWS`` for one iteration."""
    ready = ", ".join(it.ready) or "none seen"
    walk = f"; find_unused walk {it.walk_s * 1e3:.3g} ms" if it.walk_s is not None else ""
    fwd_state = "ok" if it.forwards == 1 else "none" if it.forwards == 0 else "warn"
    if it.finished is None:
        finished = ("none", "—", "no reduction expected (no_sync, or no Reducer)")
    elif it.finished:
        finished = ("ok", "✓", "the Reducer finished its reduction")
    else:
        waited = ", ".join(it.waited_for) or "some parameters"
        finished = ("bad", "✗", f"unfinished: no gradient for {waited}")
    delayed = ", ".join(it.delayed) or "none"
    return [
        (fwd_state, str(it.forwards), f"{it.forwards} training forward(s){walk}"),
        (
            "ok" if it.backward else "warn",
            "✓" if it.backward else "✗",
            f"backward {'ended' if it.backward else 'not seen'}; ready order: {ready}",
        ),
        finished,
        (
            "info" if it.buffer_bytes else "none",
            fmt_bytes(it.buffer_bytes) if it.buffer_bytes else "0",
            f"{fmt_bytes(it.buffer_bytes)} of buffers broadcast from rank 0 before forwards",
        ),
        (
            "info" if it.delayed_bytes else "none",
            fmt_bytes(it.delayed_bytes) if it.delayed_bytes else "0",
            f"{fmt_bytes(it.delayed_bytes)} all-reduced outside the Reducer: {delayed}",
        ),
        (
            "info" if it.steps_in_backward else "none",
            str(it.steps_in_backward),
            f"{it.steps_in_backward} optimizer step(s) inside the backward",
        ),
        (
            "bad" if it.dropped else "none",
            str(it.dropped),
            f"{it.dropped} forward(s) whose output died without a backward",
        ),
    ]


def figure_lifecycle(model: LifecycleModel, ddp: int | None = None, rank: int = 0) -> go.Figure:
    """One instance's iterations on ``rank``: a cell per row of ``ROWS`` and iteration."""
    inst = pick(model, ddp, rank)
    if inst is None:
        return _empty(EMPTY)
    its = inst.iterations
    if not its:
        return _empty(f"{instance_label(inst)} · rank {rank}: no iteration yet")
    x = [str(it.index) for it in its]
    columns = [_cells(it) for it in its]
    z = [[_STATES.index(col[r][0]) for col in columns] for r in range(len(ROWS))]
    text = [[col[r][1] for col in columns] for r in range(len(ROWS))]
    hover = [
        [f"iteration {x[c]} · {ROWS[r]}<br>{col[r][2]}" for c, col in enumerate(columns)]
        for r in range(len(ROWS))
    ]
    n = len(_STATES)
    scale: list[list[Any]] = []
    for k, color in enumerate(STATE_COLORS.values()):  # flat bands: z picks its colour
        scale += [[k / n, color], [(k + 1) / n, color]]
    bad = sum(1 for it in its if it.finished is False or it.dropped)
    title = f"Lifecycle · {instance_label(inst)} · rank {rank} · {len(its)} iteration(s)"
    if bad:
        title += f" · {bad} with a mistake"
    fig = go.Figure(
        go.Heatmap(
            name="lifecycle",
            x=x,
            y=list(ROWS),
            z=z,
            zmin=-0.5,
            zmax=n - 0.5,
            colorscale=scale,
            showscale=False,
            text=text,
            texttemplate="%{text}",
            hovertext=hover,
            hoverinfo="text",
            xgap=2,
            ygap=2,
        )
    )
    fig.update_layout(
        title={"text": title},
        height=120 + 32 * len(ROWS),
        xaxis={"title": {"text": "iteration"}, "type": "category"},
        yaxis={"autorange": "reversed"},
        margin={"l": 200},
    )
    return fig


def figure_hooks(model: LifecycleModel, ddp: int | None = None, rank: int = 0) -> go.Figure:
    """Live DDP hooks per parameter of one instance; two or more (red): double hooks."""
    inst = pick(model, ddp, rank)
    if inst is None:
        return _empty(EMPTY)
    hooks = inst.hooks
    fqns = list(hooks)
    counts = [hooks[f] for f in fqns]
    colors = [HOOK_COLORS.get(c, STATE_COLORS["bad"]) for c in counts]
    double = sum(1 for c in counts if c >= 2)
    title = f"Live DDP hooks per parameter · {instance_label(inst)}"
    title += f" · {double} hooked twice or more" if double else " · one each"
    fig = go.Figure(
        go.Bar(
            name="hooks",
            x=fqns,
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


def figure_bytes(model: LifecycleModel, rank: int = 0) -> go.Figure:
    """Bytes ``rank`` sent per instance, stacked by purpose (``PURPOSE_ORDER``)."""
    insts = model.instances_of(rank)
    if not insts:
        return _empty(EMPTY)
    x = [f"DDP #{i.serial}" for i in insts]
    sent = [model.bytes_by_purpose(rank, i.serial) for i in insts]
    fig = go.Figure()
    for purpose in PURPOSE_ORDER:
        y = [b[purpose] for b in sent]
        fig.add_bar(
            name=purpose,
            x=x,
            y=y,
            marker={"color": PURPOSE_COLORS[purpose]},
            hovertext=[f"{purpose}: {fmt_bytes(v)}" for v in y],
            hoverinfo="x+text",
        )
    total = sum(sum(b.values()) for b in sent)
    fig.update_layout(
        barmode="stack",
        title={"text": f"Bytes sent by purpose · rank {rank} · {fmt_bytes(total)} in all"},
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
