"""The lifecycle strip of ``figures.py``: one DDP instance's iterations as a heatmap
(x = iteration, one row per thing a lifecycle mistake changes), pure, from the
instance's columns (``Instance.table``), so a 50,000-iteration strip costs what its
100 columns do: past ``MAX_COLUMNS`` iterations a column stands for consecutive
iterations and shows the worst state among them (the title says so), and ``window``
zooms in to one column per iteration. Also the helpers every lifecycle figure uses.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import plotly.graph_objects as go

from interactive_shard.ddp._iteration_columns import BUFFERS, DELAYED, IterationTable
from interactive_shard.ddp.model import Instance, LifecycleModel
from interactive_shard.ui.format import nbytes
from interactive_shard.ui.text import literal

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
MAX_COLUMNS = 100  # iterations drawn one per column; more share columns (aggregated)
TEXT_COLUMNS = 40  # cells carry their text up to this many columns (past it, the hover)
EMPTY = "No DDP instance watched yet: watch a DDP model with ish.watch(ddp)"
_STATES = list(STATE_COLORS)


@dataclass
class Strip:
    """A strip's title and heatmap cells (``z``: indices into ``STATE_COLORS``, rows of
    ``ROWS``); ``text``: the cells' texts, None past ``TEXT_COLUMNS`` columns."""

    title: str
    x: list[str]
    z: list[list[int]]
    hover: list[list[str]]
    text: list[list[str]] | None

    def traced(self) -> dict[str, Any]:
        """The heatmap properties that change from one strip to the next."""
        gap = 2 if len(self.x) <= TEXT_COLUMNS else 0
        template = "%{text}" if self.text else None
        return {
            "x": self.x,
            "z": self.z,
            "hovertext": self.hover,
            "xgap": gap,
            "text": self.text,
            "texttemplate": template,
        }


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


def empty_figure(text: str) -> go.Figure:
    return go.Figure(layout={"title": {"text": text}, "height": 200})


def _states(t: IterationTable, rows: slice) -> np.ndarray:
    """(len(ROWS), iterations) indices into ``STATE_COLORS`` (a higher one is worse)."""
    forwards, sent = t.col("forwards")[rows], t.col("sent")[rows]
    finished = t.col("finished")[rows]
    none, ok, info, warn, bad = range(len(_STATES))
    return np.stack(
        [
            np.where(forwards == 1, ok, np.where(forwards == 0, none, warn)),
            np.where(t.col("backward")[rows], ok, warn),
            np.where(np.isnan(finished), none, np.where(finished == 1, ok, bad)),
            np.where(sent[:, BUFFERS] > 0, info, none),
            np.where(sent[:, DELAYED] > 0, info, none),
            np.where(t.col("steps")[rows] > 0, info, none),
            np.where(t.col("dropped")[rows] > 0, bad, none),
        ]
    )


def _cells(inst: Instance, row: int) -> list[tuple[str, str]]:
    """(text, hover) per row of ``ROWS`` for the iteration in table row ``row``."""
    t = inst.table
    names = t.names.tuples
    forwards, walk = int(t.col("forwards")[row]), float(t.col("walk")[row])
    buffer, delayed = (int(b) for b in t.col("sent")[row, [BUFFERS, DELAYED]])
    backward, finished = bool(t.col("backward")[row]), float(t.col("finished")[row])
    steps, dropped = int(t.col("steps")[row]), int(t.col("dropped")[row])
    ready = literal(", ".join(names[int(t.col("ready")[row])]) or "none seen")
    walked = "" if np.isnan(walk) else f"; find_unused walk {walk * 1e3:.3g} ms"
    if np.isnan(finished):
        done = ("—", "no reduction expected (no_sync, or no Reducer)")
    elif finished:
        done = ("✓", "the Reducer finished its reduction")
    else:
        waited = literal(", ".join(names[int(t.col("unready")[row])]) or "some parameters")
        done = ("✗", f"unfinished: no gradient for {waited}")
    which = inst.watches[int(t.col("watch")[row])].delayed if delayed else []
    return [
        (str(forwards), f"{forwards} training forward(s){walked}"),
        (
            "✓" if backward else "✗",
            f"backward {'ended' if backward else 'not seen'}; ready order: {ready}",
        ),
        done,
        (
            nbytes(buffer) if buffer else "0",
            f"{nbytes(buffer)} of buffers broadcast from rank 0 before forwards",
        ),
        (
            nbytes(delayed) if delayed else "0",
            f"{nbytes(delayed)} all-reduced outside the Reducer: "
            + literal(", ".join(which) or "none"),
        ),
        (str(steps), f"{steps} optimizer step(s) inside the backward"),
        (str(dropped), f"{dropped} forward(s) whose output died without a backward"),
    ]


def _binned(t: IterationTable, rows: slice, starts: np.ndarray) -> list[list[str]]:
    """Hover per row of ``ROWS`` and bin (the iterations from each of ``starts`` on)."""
    index = t.col("index")[rows]
    f, sent = t.col("forwards")[rows], t.col("sent")[rows]
    fin, dropped = t.col("finished")[rows], t.col("dropped")[rows]
    missing = ~t.col("backward")[rows]
    counts = np.diff(np.r_[starts, len(index)])

    def total(x: np.ndarray) -> list[int]:
        return [int(v) for v in np.add.reduceat(x.astype(np.int64), starts)]

    def first(mask: np.ndarray) -> list[str]:
        at = np.minimum.reduceat(np.where(mask, index, np.iinfo(np.int64).max), starts)
        return [
            f" (first: {a})" if n else "" for a, n in zip(at.tolist(), total(mask), strict=True)
        ]

    def where(mask: np.ndarray, what: str) -> list[str]:
        return [
            f"; {what} in {n}{w}" if n else ""
            for n, w in zip(total(mask), first(mask), strict=True)
        ]

    low, high = np.minimum.reduceat(f, starts).tolist(), np.maximum.reduceat(f, starts).tolist()
    unfinished = fin == 0
    lines = [
        [
            f"{lo if lo == hi else f'{lo}..{hi}'} training forward(s) per iteration{w}"
            for lo, hi, w in zip(low, high, where(f != 1, "not one"), strict=True)
        ],
        [
            f"backward ended in {n - m}{w}"
            for n, m, w in zip(counts, total(missing), where(missing, "not seen"), strict=True)
        ],
        [
            f"finished in {ok}{w}; no reduction expected in {e}"
            for ok, w, e in zip(
                total(fin == 1), where(unfinished, "unfinished"), total(np.isnan(fin)), strict=True
            )
        ],
        [
            f"{nbytes(b)} of buffers broadcast from rank 0 in {n} iteration(s)"
            for b, n in zip(total(sent[:, BUFFERS]), total(sent[:, BUFFERS] > 0), strict=True)
        ],
        [
            f"{nbytes(b)} all-reduced outside the Reducer in {n} iteration(s)"
            for b, n in zip(total(sent[:, DELAYED]), total(sent[:, DELAYED] > 0), strict=True)
        ],
        [f"{n} optimizer step(s) inside the backward" for n in total(t.col("steps")[rows])],
        [
            f"{n} forward(s) died without a backward{w}"
            for n, w in zip(total(dropped), where(dropped > 0, "dropped"), strict=True)
        ],
    ]
    head = [
        f"iterations {a}..{b} ({n})"
        for a, b, n in zip(
            index[starts].tolist(), index[starts + counts - 1].tolist(), counts, strict=True
        )
    ]
    return [
        [f"{h} · {ROWS[r]}<br>{x}" for h, x in zip(head, lines[r], strict=True)]
        for r in range(len(ROWS))
    ]


def window_rows(inst: Instance, window: tuple[int, int] | None = None) -> slice:
    """Table rows of the iterations in ``window`` (first, last index; None: all)."""
    if window is None:
        return slice(0, len(inst.table))
    index = inst.table.col("index")
    lo, hi = np.searchsorted(index, window[0]), np.searchsorted(index, window[1], "right")
    return slice(int(lo), int(hi))


def lifecycle_strip(
    model: LifecycleModel,
    ddp: int | None = None,
    rank: int = 0,
    *,
    window: tuple[int, int] | None = None,
) -> Strip | str:
    """What ``figure_lifecycle`` draws (a str: the title of an empty figure). The view
    puts it into its FigureWidget's heatmap in place (no figure built: plotly's
    validation of a whole new figure cost more than computing the cells)."""
    inst = pick(model, ddp, rank)
    if inst is None:
        return EMPTY
    t, rows = inst.table, window_rows(inst, window)
    if not len(t):
        return f"{literal(instance_label(inst))} · rank {rank}: no iteration yet"
    index = t.col("index")[rows]
    n = len(index)
    title = f"Lifecycle · {literal(instance_label(inst))} · rank {rank} · {n} iteration(s)"
    if not n:
        return f"{title} in {window[0]}..{window[1]} (of {len(t)})" if window else title
    if n < len(t):
        title += f" ({index[0]}..{index[-1]} of {len(t)})"
    states = _states(t, rows)
    bad = int(np.count_nonzero((t.col("finished")[rows] == 0) | (t.col("dropped")[rows] > 0)))
    if bad:
        title += f" · {bad} with a mistake"
    if model.pending:  # a view's refresh left some for later (LifecycleModel.budget)
        title += f" · reading: {model.pending:,} event(s) to go"
    text: list[list[str]] | None = None
    if n <= MAX_COLUMNS:
        x = [str(i) for i in index.tolist()]
        columns = [_cells(inst, r) for r in range(rows.start, rows.stop)]
        hover = [
            [f"iteration {x[c]} · {ROWS[r]}<br>{col[r][1]}" for c, col in enumerate(columns)]
            for r in range(len(ROWS))
        ]
        if n <= TEXT_COLUMNS:
            text = [[col[r][0] for col in columns] for r in range(len(ROWS))]
        z = states
    else:
        per = -(-n // MAX_COLUMNS)
        starts = np.arange(0, n, per)
        last = index[np.minimum(starts + per, n) - 1]
        x = [f"{a}–{b}" for a, b in zip(index[starts].tolist(), last.tolist(), strict=True)]
        hover = _binned(t, rows, starts)
        z = np.maximum.reduceat(states, starts, axis=1)
        title += f" · {per} iterations per column, the worst state shown"
    return Strip(title, x, z.tolist(), hover, text)


def figure_lifecycle(
    model: LifecycleModel,
    ddp: int | None = None,
    rank: int = 0,
    *,
    window: tuple[int, int] | None = None,
) -> go.Figure:
    """One instance's iterations on ``rank``: a cell per row of ``ROWS`` and iteration
    (``window``: first and last iteration shown). Past ``MAX_COLUMNS`` iterations a
    column stands for consecutive iterations and shows the worst state among them (the
    title says how many); zoom in with ``window`` to see each."""
    strip = lifecycle_strip(model, ddp, rank, window=window)
    if isinstance(strip, str):
        return empty_figure(strip)
    k = len(_STATES)
    scale: list[list[Any]] = []
    for i, color in enumerate(STATE_COLORS.values()):  # flat bands: z picks its colour
        scale += [[i / k, color], [(i + 1) / k, color]]
    heat = go.Heatmap(
        name="lifecycle",
        y=list(ROWS),
        zmin=-0.5,
        zmax=k - 0.5,
        colorscale=scale,
        showscale=False,
        hoverinfo="text",
        ygap=2,
        **strip.traced(),
    )
    fig = go.Figure(heat)
    fig.update_layout(
        title={"text": strip.title},
        height=120 + 32 * len(ROWS),
        xaxis={"title": {"text": "iteration"}, "type": "category"},
        yaxis={"autorange": "reversed"},
        margin={"l": 200},
    )
    return fig
