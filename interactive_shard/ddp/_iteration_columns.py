"""One DDP instance's iterations as numpy columns, and the bulk decode that fills them.

Why: a 10,000-iteration run on 2 ranks sends 20,000 ``lifecycle_iteration`` events and
more. Decoding each into frozen Structs (tracked by the garbage collector, whose passes
over a big store then dominate) and merging it in Python cost ~20 us an event. Here a
batch is converted in one ``msgspec.convert`` call into gc-free twins of the event's
Structs (lists as tuples, a collective as its bytes and caller: what the summaries
need) and merged into columns with numpy: one row per iteration, in index order, its
parts (events with the same index) added up. The collectives' other fields (op,
dtype, times) are read from the raw events only when an ``Iteration`` is materialized
(``Instance.iterations``, ``LifecycleModel.collectives``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import chain
from operator import attrgetter
from typing import Annotated, Any, get_args, get_origin

import msgspec
import numpy as np

from interactive_shard.ddp.events import (
    Caller,
    Collective,
    LifecycleCheck,
    LifecycleIteration,
)
from interactive_shard.telemetry.iteration_index import RankIterations
from interactive_shard.telemetry.schema import Event

# Collective.caller -> the purpose the view and `collectives()` report.
PURPOSES = {
    "reducer": "gradients",
    "sync_buffers": "buffers",
    "ddp_init": "construction",
    "delayed_all_reduce": "delayed",
}
PURPOSE_ORDER = ("gradients", "buffers", "construction", "delayed", "other")
BUFFERS, DELAYED = PURPOSE_ORDER.index("buffers"), PURPOSE_ORDER.index("delayed")
_COLUMN = {c: PURPOSE_ORDER.index(PURPOSES.get(c, "other")) for c in get_args(Caller)}
MAX_INT = 2**53  # any count, index or byte size: summed exactly in int64 (more is hostile)
Names = tuple[str, ...]


def _gc_free(
    cls: type[msgspec.Struct], name: str, keep: Sequence[str], nested: dict[Any, Any]
) -> Any:
    """``cls``'s fields named in ``keep``, with their constraints (read from ``cls``, so
    the twin cannot drift from the event's definition), as a ``gc=False`` Struct; lists
    become tuples (the collector untracks a tuple of atoms), ``nested`` swaps item types."""
    fields: list[Any] = []
    for f in msgspec.structs.fields(cls):
        if f.name not in keep:
            continue
        kind: Any = f.type
        meta: list[Any] = []
        if get_origin(kind) is Annotated:
            kind, *meta = get_args(kind)
        if get_origin(kind) is list:
            (item,) = get_args(kind)
            kind = tuple[nested.get(item, item), ...]  # type: ignore[misc]
        if kind is int:
            meta.append(msgspec.Meta(le=MAX_INT))
        kind = Annotated[(kind, *meta)] if meta else kind
        if f.default_factory is list:
            fields.append((f.name, kind, ()))
        elif f.default is msgspec.NODEFAULT:
            fields.append((f.name, kind))
        else:
            fields.append((f.name, kind, f.default))
    return msgspec.defstruct(name, fields, kw_only=True, frozen=True, gc=False)


_ALL = [f.name for f in msgspec.structs.fields(LifecycleIteration)]
_Sent = _gc_free(Collective, "_Sent", ("nbytes", "caller"), {})
_Part = _gc_free(LifecycleIteration, "_Part", _ALL, {Collective: _Sent})
CheckRecord = _gc_free(
    LifecycleCheck, "CheckRecord", [f.name for f in msgspec.structs.fields(LifecycleCheck)], {}
)
_Arrived = msgspec.defstruct("_Arrived", [("rank", int), ("payload", _Part)], gc=False)
_Arrived.__doc__ = "An event's rank and payload, read from the Event (from_attributes)."

# A part's (and a row's) numeric columns: numpy dtype, and the _Part field they read.
COLUMNS: dict[str, Any] = {
    "index": np.int64,
    "forwards": np.int64,
    "dropped": np.int64,
    "steps": np.int64,
    "backward": bool,
    "finished": float,  # 1.0, 0.0; nan: None
    "walk": float,  # seconds; nan: None
    "watch": np.int64,  # which of the instance's watches was current (Instance.watches)
}
_FIELD = {"index": "iteration", "steps": "steps_in_backward", "walk": "walk_s"}
_FINISHED = {True: 1.0, False: 0.0, None: np.nan}


@dataclass
class Parts:
    """``lifecycle_iteration`` events (parts) as columns, one entry per part (or, once
    merged, per iteration): ``cols`` holds ``COLUMNS`` and ``sent`` (bytes by purpose,
    one column per ``PURPOSE_ORDER``), ``rank`` and ``ddp`` the sender, and (decoded
    parts) ``at``, each part's position in the events given to ``decode``."""

    events: list[Event]  # raw: their collectives' details are decoded on demand
    cols: dict[str, np.ndarray]
    ready: list[Names]
    unready: list[Names]

    def __len__(self) -> int:
        return len(self.cols["index"])

    def take(self, sel: np.ndarray) -> Parts:
        """The parts at positions ``sel`` (an int array), in that order."""
        at = sel.tolist()
        return Parts(
            list(map(self.events.__getitem__, at)) if self.events else [],
            {k: v[sel] for k, v in self.cols.items()},
            list(map(self.ready.__getitem__, at)),
            list(map(self.unready.__getitem__, at)),
        )


def decode(events: list[Event], skip: Callable[[Event, Exception], None]) -> Parts:
    """The parts of ``events`` (all ``lifecycle_iteration``) in one msgspec call; when
    that call fails, one by one, skipping (``skip``) what does not fit."""
    try:
        arrived = msgspec.convert(events, list[_Arrived], from_attributes=True)  # type: ignore[valid-type]
        at = np.arange(len(events))
    except (msgspec.ValidationError, TypeError):
        arrived, kept = [], []
        for i, e in enumerate(events):
            try:
                arrived.append(msgspec.convert(e, _Arrived, from_attributes=True))
                kept.append(i)
            except (msgspec.ValidationError, TypeError) as err:
                skip(e, err)
        events, at = [events[i] for i in kept], np.array(kept, np.int64)
    n = len(arrived)
    parts = list(map(attrgetter("payload"), arrived))
    cols = {"at": at, "rank": np.fromiter(map(attrgetter("rank"), arrived), np.int64, n)}
    for name, dtype in COLUMNS.items():
        got = map(attrgetter(_FIELD.get(name, name)), parts)
        if name == "watch":
            cols[name] = np.zeros(n, np.int64)
        elif name == "finished":
            cols[name] = np.fromiter(map(_FINISHED.__getitem__, got), float, n)
        elif name == "walk":  # usually all None (find_unused_parameters off)
            walks = list(got)
            none = walks.count(None) == n
            cols[name] = np.full(n, np.nan) if none else np.array(walks, float).reshape(n)
        else:
            cols[name] = np.fromiter(got, dtype, n)
    cols["ddp"] = np.fromiter(map(attrgetter("ddp"), parts), np.int64, n)
    collectives = list(map(attrgetter("collectives"), parts))
    flat = list(chain.from_iterable(collectives))
    owner = np.repeat(np.arange(n), np.fromiter(map(len, collectives), np.int64, n))
    column = np.fromiter(map(_COLUMN.__getitem__, map(attrgetter("caller"), flat)), np.int64)
    cols["sent"] = np.zeros((n, len(PURPOSE_ORDER)), np.int64)
    np.add.at(cols["sent"], (owner, column), np.fromiter(map(attrgetter("nbytes"), flat), np.int64))
    ready = list(map(attrgetter("ready"), parts))
    return Parts(events, cols, ready, list(map(attrgetter("unready"), parts)))


class NamePool:
    """Tuples of parameter names (ready orders, unready sets) as small ints: a 10,000-
    iteration run repeats a handful, and ints compare in numpy."""

    def __init__(self) -> None:
        self.ids: dict[Names, int] = {(): 0}
        self.tuples: list[Names] = [()]

    def intern(self, tuples: list[Names]) -> np.ndarray:
        for t in dict.fromkeys(tuples):  # the distinct ones (C loops)
            if t not in self.ids:
                self.ids[t] = len(self.tuples)
                self.tuples.append(t)
        return np.fromiter(map(self.ids.__getitem__, tuples), np.int64, len(tuples))


class _Column:
    """A numpy column that grows by doubling and can be rewritten from a row on."""

    def __init__(self, dtype: Any, width: int = 0) -> None:
        self._data = np.zeros((16, width) if width else (16,), dtype)
        self.size = 0

    @property
    def values(self) -> np.ndarray:
        return self._data[: self.size]

    def put(self, start: int, new: np.ndarray) -> None:
        """Rows ``start:`` become ``new``."""
        end = start + len(new)
        if end > len(self._data):
            shape = (max(end, 2 * len(self._data)), *self._data.shape[1:])
            grown = np.zeros(shape, self._data.dtype)
            grown[:start] = self._data[:start]
            self._data = grown
        self._data[start:end] = new
        self.size = end


class IterationTable:
    """One instance's iterations on one rank: a row per index (ascending), its parts
    merged as ``Iteration`` merges them (counts add up, ``backward`` ors, ``finished``
    is the last part's that says, walk times add, name lists concatenate in arrival
    order). ``col(name)`` reads a column of ``COLUMNS``, ``sent`` the bytes by purpose,
    ``ready`` / ``unready`` ids into the model's ``NamePool``."""

    def __init__(self, names: NamePool) -> None:
        self.names = names
        self._cols = {name: _Column(dtype) for name, dtype in COLUMNS.items()}
        self._cols["sent"] = _Column(np.int64, len(PURPOSE_ORDER))
        self._cols["ready"] = _Column(np.int64)
        self._cols["unready"] = _Column(np.int64)
        self.total = np.zeros(len(PURPOSE_ORDER), np.int64)  # bytes sent, by purpose
        self.raw: list[Event] = []  # every part, as it arrived
        self._raw_filed = RankIterations()  # their rows in ``raw`` by (shifted) index
        self.version = 0  # grows with every add

    def __len__(self) -> int:
        return self._cols["index"].size

    def col(self, name: str) -> np.ndarray:
        """A column (``COLUMNS``, ``sent``, ``ready``, ``unready``), one entry per row."""
        return self._cols[name].values

    def raw_between(self, first: int, last: int) -> tuple[list[int], list[Event]]:
        """The parts of iterations ``first`` to ``last`` as they arrived: (their
        iteration indices, the raw events), by index, then in arrival order."""
        its, rows = self._raw_filed.between(first, last)
        return its.tolist(), list(map(self.raw.__getitem__, rows.tolist()))

    def row(self, index: int) -> int | None:
        """The row of iteration ``index``, or None."""
        at = int(np.searchsorted(self.col("index"), index))
        return at if at < len(self) and int(self.col("index")[at]) == index else None

    def add(self, parts: Parts) -> int:
        """Merge ``parts`` (this instance's, indices shifted, in arrival order) into the
        rows; returns the first row that changed. Only rows from the smallest new index
        on are merged again: usually none (new iterations) or the last (a later part)."""
        if not len(parts):
            return len(self)
        rows = np.arange(len(self.raw), len(self.raw) + len(parts.events), dtype=np.int64)
        self.raw.extend(parts.events)
        self._raw_filed.file(parts.cols["index"], rows)
        self.total += parts.cols["sent"].sum(axis=0)
        keep = int(np.searchsorted(self.col("index"), parts.cols["index"].min()))
        merged = _reduce(_concat(self._as_parts(keep), parts))
        for name in (*COLUMNS, "sent"):
            self._cols[name].put(keep, merged.cols[name])
        self._cols["ready"].put(keep, self.names.intern(merged.ready))
        self._cols["unready"].put(keep, self.names.intern(merged.unready))
        self.version += 1
        return keep

    def _as_parts(self, start: int) -> Parts:
        """Rows ``start:`` as parts, to merge them again with later ones."""
        tuples = self.names.tuples
        cols = {name: self.col(name)[start:] for name in (*COLUMNS, "sent")}
        cols["rank"] = cols["ddp"] = np.zeros(len(self) - start, np.int64)
        return Parts(
            [],
            cols,
            [tuples[i] for i in self.col("ready")[start:].tolist()],
            [tuples[i] for i in self.col("unready")[start:].tolist()],
        )


def _concat(a: Parts, b: Parts) -> Parts:
    if not len(a):
        return b
    cols = {k: np.concatenate([a.cols[k], b.cols[k]]) for k in a.cols}
    return Parts([], cols, a.ready + b.ready, a.unready + b.unready)


def _reduce(p: Parts) -> Parts:
    """One entry per index (ascending), the parts of one index merged in arrival order."""
    order = np.argsort(p.cols["index"], kind="stable")
    if np.any(order != np.arange(len(order))):
        p = p.take(order)
    c = p.cols
    index = c["index"]
    starts = np.flatnonzero(np.r_[True, index[1:] != index[:-1]])
    if len(starts) == len(index):  # one part per iteration: the usual case
        return p
    said = np.maximum.reduceat(np.where(np.isnan(c["finished"]), -1, np.arange(len(index))), starts)
    walks = np.add.reduceat(~np.isnan(c["walk"]), starts)
    ends = np.r_[starts[1:], len(index)]
    ready = [p.ready[a] for a in starts.tolist()]
    unready = [p.unready[a] for a in starts.tolist()]
    for row in np.flatnonzero(ends - starts > 1).tolist():  # only merged rows, in Python
        a, b = int(starts[row]), int(ends[row])
        ready[row] = sum(p.ready[a:b], ())
        unready[row] = sum(p.unready[a:b], ())
    cols = {k: c[k][starts] for k in ("rank", "ddp", "index", "watch")}  # the first part's
    for name in ("forwards", "dropped", "steps"):
        cols[name] = np.add.reduceat(c[name], starts)
    cols["sent"] = np.add.reduceat(c["sent"], starts, axis=0)
    cols["backward"] = np.logical_or.reduceat(c["backward"], starts)
    cols["finished"] = np.where(said >= 0, c["finished"][np.maximum(said, 0)], np.nan)
    cols["walk"] = np.where(walks > 0, np.add.reduceat(np.nan_to_num(c["walk"]), starts), np.nan)
    return Parts([], cols, ready, unready)
