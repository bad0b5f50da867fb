"""RunStore: the single kernel-side state of a run.

Written by the collector thread (events from ranks) and the cluster's supervisor
(log lines, rank states); read by models on the notebook's main thread. Events
are append-only, so a model keeps a cursor and consumes only what is new.
"""

from __future__ import annotations

import itertools
import operator
import threading
from bisect import bisect_right
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import msgspec
import numpy as np

from interactive_shard.telemetry.schema import SCALAR, SCHEMA_VERSION, Event, ScalarRun

# A Python step per run costs about this many C-level checks of one event's kind.
_RUN_COST = 8
_KIND = operator.attrgetter("kind")
_RANK = operator.attrgetter("rank")
_STEP = operator.attrgetter("step")
_T = operator.attrgetter("t")
_FIRST = operator.itemgetter(0)
_PAYLOAD = operator.attrgetter("payload")
_VALUE = operator.itemgetter("value")
_NUMBERS = {int, float}


class _Column:
    """A numpy column that grows by doubling: appended to under the store's lock, read
    as views. A view stays valid after the column grows (its array is not changed, the
    column moves to a larger copy) and what it covers never changes (append-only)."""

    __slots__ = ("_data", "_n")

    def __init__(self, dtype: type[np.generic]) -> None:
        self._data: np.ndarray = np.empty(1024, dtype=dtype)
        self._n = 0

    def extend(self, values: list[int] | int, count: int) -> None:
        """Append ``values`` (``count`` of them), or ``count`` times the one int."""
        n = self._n
        if n + count > len(self._data):  # np.resize would also fill the new part: not needed
            grown = np.empty(max(2 * len(self._data), n + count), self._data.dtype)
            grown[:n] = self._data[:n]
            self._data = grown
        try:
            self._data[n : n + count] = values
        except (OverflowError, TypeError, ValueError):
            # Only events made in Python get here (the wire format checks ranks and
            # steps): what does not fit is filed as -1, a rank no run has and a step
            # no iteration has (models skip and count those events when they read them).
            info = np.iinfo(self._data.dtype)
            assert isinstance(values, list)
            fit = [v if type(v) is int and info.min <= v <= info.max else -1 for v in values]
            self._data[n : n + count] = fit
        self._n = n + count

    def view(self, start: int, end: int) -> np.ndarray:
        return self._data[start:end]

    def __len__(self) -> int:
        return self._n


class ScalarColumns(NamedTuple):
    """Scalar events as aligned numpy columns (``RunStore.scalars``)."""

    at: np.ndarray  # their log positions
    ranks: np.ndarray
    steps: np.ndarray
    names: np.ndarray  # index into the store's scalar names; -1: the payload is no Scalar
    values: np.ndarray  # float64 (NaN where names is -1)


@dataclass
class RunInfo:
    """What the recording header says about a run."""

    world_size: int
    backend: str
    device_types: list[str]
    schema_version: int = SCHEMA_VERSION
    package_version: str = ""
    torch_version: str = ""
    name: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


class RunStore:
    """Thread-safe, append-only event log of one run, with a change counter."""

    def __init__(self, info: RunInfo) -> None:
        self.info = info
        self._events: list[Event] = []
        # Each event's kind (as a small int), rank and step, in log order, so that a
        # filter reads these and touches only the events it returns, and a model files
        # events by (rank, step) without touching them at all (each event sits far from
        # the next in memory: reading even one field of 100k of them misses the cache
        # on each, ~0.1 us apiece; the collector fills these while the events are hot).
        self._codes = _Column(np.uint32)
        self._ranks = _Column(np.int32)
        self._steps = _Column(np.int64)
        self._code_of: dict[str, int] = {}
        # Scalars (Note [Columnar scalars] in schema): a row per scalar event, in log
        # order, from the wire's columns or from the payload of a stored event. Those
        # from columns hold None in the log until read as events (``_built``).
        self._scalar_at = _Column(np.int64)
        self._scalar_name = _Column(np.int32)
        self._scalar_value = _Column(np.float64)
        self._scalar_t = _Column(np.float64)
        self._names: list[str] = []
        self._name_code: dict[str, int] = {}
        self._unbuilt = 0  # scalars stored as columns only
        # kind -> (log position of each run, the runs): a run is a list of consecutive
        # events of that kind, as they arrived (a batch is mostly one run). Positions
        # grow, so a bisect finds where a cursor stopped, and runs of several kinds
        # merge into log order by their positions alone.
        # A run of columnar scalars is held as its length (its events are not built).
        self._by_kind: dict[str, tuple[list[int], list[list[Event] | int]]] = {}
        self._lock = threading.Lock()

    @property
    def version(self) -> int:
        """Grows with every append; views compare it to know whether to redraw."""
        return len(self._events)

    def append(self, event: Event) -> None:
        self.extend((event,))

    def extend(
        self,
        events: Iterable[Event],
        *,
        rank: int | None = None,
        scalars: Sequence[ScalarRun] = (),
    ) -> None:
        """Append ``events``; ``rank``: every one of them is that rank's (a checked batch).

        ``scalars``: that rank's runs of columnar scalars (``Batch.scalars``), each
        placed among ``events`` by its ``before``."""
        events = list(events)
        if scalars and rank is None:
            raise ValueError("RunStore.extend(scalars=...) needs the rank they are from.")
        with self._lock:
            done = 0
            for run in scalars:
                self._extend(events[done : run.before], rank)
                self._extend_scalars(run, rank)  # type: ignore[arg-type]  # checked above
                done = run.before
            self._extend(events[done:] if done else events, rank)

    def _extend(self, events: list[Event], rank: int | None) -> None:
        if not events:
            return
        kinds = list(map(_KIND, events))
        at = len(self._events)
        self._events.extend(events)
        n = len(events)
        # A batch from the collector is one rank's, and mostly of one kind: those
        # columns then take one int (a pass less over the events each).
        self._ranks.extend(list(map(_RANK, events)) if rank is None else rank, n)
        self._steps.extend(list(map(_STEP, events)), n)
        if kinds.count(kinds[0]) == n:  # one kind: the batch is one run
            self._codes.extend(self._code(kinds[0]), n)
            self._add_run(kinds[0], at, events)
            return
        for kind in set(kinds).difference(self._code_of):
            self._code(kind)
        self._codes.extend(list(map(self._code_of.__getitem__, kinds)), n)
        i = 0
        for kind, group in itertools.groupby(kinds):
            n = len(list(group))
            self._add_run(kind, at + i, events[i : i + n])
            i += n

    def _code(self, kind: str) -> int:
        code = self._code_of.get(kind)
        if code is None:
            code = self._code_of[kind] = len(self._code_of)
        return code

    def _add_run(self, kind: str, at: int, run: list[Event] | int) -> None:
        index = self._by_kind.get(kind)
        if index is None:
            index = self._by_kind[kind] = ([], [])
        index[0].append(at)
        index[1].append(run)
        if kind == SCALAR and not isinstance(run, int):
            names, values = _scalar_fields(list(map(_PAYLOAD, run)))
            code = {name: -1 if name is None else self._name(name) for name in dict.fromkeys(names)}
            codes = list(map(code.__getitem__, names))
            self._add_scalar_rows(np.arange(at, at + len(run)), codes, values, list(map(_T, run)))

    def _extend_scalars(self, run: ScalarRun, rank: int) -> None:
        n = run.size
        if not n:
            return
        at = len(self._events)
        self._events.extend(itertools.repeat(None, n))  # type: ignore[arg-type]  # built when read
        self._codes.extend(self._code(SCALAR), n)
        self._ranks.extend(rank, n)
        self._steps.extend(run.steps, n)  # type: ignore[arg-type]  # an array fits too
        self._add_run(SCALAR, at, n)
        codes = np.array(list(map(self._name, run.names)), np.int32)[run.name_of]
        self._add_scalar_rows(np.arange(at, at + n), codes, run.values, run.times)
        self._unbuilt += n

    def _add_scalar_rows(self, at: np.ndarray, names: Any, values: Any, times: Any) -> None:
        n = len(at)
        for column, data in zip(
            (self._scalar_at, self._scalar_name, self._scalar_value, self._scalar_t),
            (at, names, values, times),
            strict=True,
        ):
            column.extend(data, n)

    def _name(self, name: str) -> int:
        code = self._name_code.get(name)
        if code is None:
            code = self._name_code[name] = len(self._names)
            self._names.append(name)
        return code

    def _built(self, positions: np.ndarray) -> list[Event]:
        """Under the lock: the columnar scalars at ``positions``, as events."""
        rows = np.searchsorted(self._scalar_at.view(0, len(self._scalar_at)), positions)
        names = self._names
        return list(
            map(
                Event,
                itertools.repeat(SCALAR),
                self._ranks.view(0, len(self._events))[positions].tolist(),
                self._steps.view(0, len(self._events))[positions].tolist(),
                self._scalar_t.view(0, len(self._scalar_t))[rows].tolist(),
                [
                    {"name": names[code], "value": value}
                    for code, value in zip(
                        self._scalar_name.view(0, len(self._scalar_name))[rows].tolist(),
                        self._scalar_value.view(0, len(self._scalar_value))[rows].tolist(),
                        strict=True,
                    )
                ],
            )
        )

    def _filled(self, events: list[Event], positions: np.ndarray) -> list[Event]:
        """Under the lock: ``events`` (read at ``positions``) with every columnar scalar
        among them built; the codes find the scalars (a scan of the events for None
        would cost ~35 ns an event)."""
        if not self._unbuilt:
            return events
        codes = self._codes.view(0, len(self._events))[positions]
        scalars = np.flatnonzero(codes == self._code_of[SCALAR]).tolist()
        missing = [i for i in scalars if events[i] is None]
        if missing:
            for i, event in zip(missing, self._built(positions[missing]), strict=True):
                events[i] = event
        return events

    def events(self, start: int = 0) -> list[Event]:
        """A snapshot of the events from index ``start`` (a model's cursor) on."""
        with self._lock:
            events, end = self._events[start:], len(self._events)
            return self._filled(events, np.arange(end - len(events), end))

    def since(self, start: int, kinds: Collection[str]) -> tuple[list[Event], int]:
        """The events of ``kinds`` from log position ``start`` on, in log order, and the
        position to start from next time (a cursor's), read under one lock."""
        parts: list[tuple[int, list[Event]]] = []
        with self._lock:
            end = len(self._events)
            found = []
            for kind in kinds:
                index = self._by_kind.get(kind)
                if index is not None:
                    first = max(bisect_right(index[0], start) - 1, 0)
                    found.append((index, first))
            if sum(len(index[0]) - first for index, first in found) * _RUN_COST > end - start:
                # Short runs (kinds interleaved in every batch): numpy finds the events
                # of the kinds by code faster than a Python step per run (100k events
                # in 50k runs: 164 -> ~10 ms).
                return self._filtered(start, end, kinds), end
            for (positions, runs), first in found:
                for at, run in zip(positions[first:], runs[first:], strict=True):
                    size = run if isinstance(run, int) else len(run)
                    if at + size > start:
                        skip = max(start - at, 0)
                        if isinstance(run, int):  # columnar scalars: built now
                            run = self._built(np.arange(at + skip, at + size))
                        elif skip:
                            run = run[skip:]
                        parts.append((at + skip, run))
        if len(kinds) > 1:
            parts.sort(key=_FIRST)  # runs never interleave: their starts give log order
        return list(itertools.chain.from_iterable(run for _, run in parts)), end

    def _filtered(self, start: int, end: int, kinds: Collection[str]) -> list[Event]:
        """Under the lock: the events of ``kinds`` in ``[start, end)``, by their codes."""
        positions = self._positions(start, end, kinds)
        return self._filled(list(map(self._events.__getitem__, positions.tolist())), positions)

    def _positions(self, start: int, end: int, kinds: Collection[str]) -> np.ndarray:
        wanted = [self._code_of[k] for k in kinds if k in self._code_of]
        return np.flatnonzero(np.isin(self._codes.view(start, end), wanted)) + start

    def positions(self, start: int, kinds: Collection[str]) -> tuple[np.ndarray, int]:
        """Where the events of ``kinds`` from ``start`` on lie in the log (ascending),
        and the position to start from next time: with ``columns`` and ``at``, a model
        files events by rank and step and reads only those it shows."""
        with self._lock:
            end = len(self._events)
            return self._positions(start, end, kinds), end

    def columns(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The ranks and steps of the events at ``positions`` (numpy, aligned)."""
        with self._lock:
            end = len(self._events)
            return self._ranks.view(0, end)[positions], self._steps.view(0, end)[positions]

    def at(self, positions: np.ndarray | Sequence[int]) -> list[Event]:
        """The events at ``positions`` (log positions, as ``positions`` returns)."""
        where = np.asarray(positions, np.int64)
        events = list(map(self._events.__getitem__, where.tolist()))  # append-only: no lock
        if not self._unbuilt:
            return events
        with self._lock:
            return self._filled(events, where)

    def scalars(self, start: int = 0) -> tuple[ScalarColumns, list[str], int]:
        """The scalar events from row ``start`` on (a row per scalar, in log order) as
        columns, every name they refer to, and the row to start from next time: a
        model reads 100k scalars in numpy without an event object."""
        with self._lock:
            end, size = len(self._scalar_at), len(self._events)
            at = self._scalar_at.view(start, end)
            names, values = self._scalar_name.view(start, end), self._scalar_value.view(start, end)
            ranks, steps = self._ranks.view(0, size)[at], self._steps.view(0, size)[at]
            return ScalarColumns(at, ranks, steps, names, values), list(self._names), end

    def kinds(self) -> list[str]:
        """Every kind stored so far, in the order each first arrived."""
        with self._lock:
            return list(self._by_kind)

    def of_kind(self, kind: str) -> list[Event]:
        return self.since(0, (kind,))[0]

    def __len__(self) -> int:
        return len(self._events)

    def __repr__(self) -> str:
        return (
            f"RunStore({len(self)} events, world_size={self.info.world_size}, "
            f"backend={self.info.backend!r})"
        )


class _Scalar(msgspec.Struct, kw_only=True, frozen=True):
    """The fields of ``cluster.events.Scalar`` (a test keeps the two alike)."""

    name: str = "value"
    value: float


def _scalar_fields(payloads: list[dict[str, Any]]) -> tuple[list[str | None], np.ndarray]:
    """Each scalar payload's name and value (None and NaN where ``msgspec.convert`` into
    ``Scalar`` refuses it): C loops for the common case, where every payload fits."""
    try:
        values = list(map(_VALUE, payloads))
        names = list(map(dict.get, payloads, itertools.repeat("name"), itertools.repeat("value")))
        if set(map(type, values)) <= _NUMBERS and set(map(type, names)) <= {str}:
            return names, np.array(values, np.float64)
    except (KeyError, OverflowError):
        pass
    out_names: list[str | None] = []
    out_values: list[float] = []
    for payload in payloads:
        try:
            scalar = msgspec.convert(payload, _Scalar)
        except msgspec.ValidationError:
            out_names.append(None)
            out_values.append(np.nan)
        else:
            out_names.append(scalar.name)
            out_values.append(scalar.value)
    return out_names, np.array(out_values, np.float64)
