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
from typing import Any

import numpy as np

from interactive_shard.telemetry._columns import Column
from interactive_shard.telemetry._scalar_rows import ScalarColumns, ScalarRows
from interactive_shard.telemetry.schema import SCALAR, SCHEMA_VERSION, Event, ScalarRun

__all__ = ["RunInfo", "RunStore", "ScalarColumns"]

# A Python step per run costs about this many C-level checks of one event's kind.
_RUN_COST = 8
_KIND = operator.attrgetter("kind")
_RANK = operator.attrgetter("rank")
_STEP = operator.attrgetter("step")
_FIRST = operator.itemgetter(0)


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
        self._codes = Column(np.uint32)
        self._ranks = Column(np.int32)
        self._steps = Column(np.int64)
        self._code_of: dict[str, int] = {}
        # A row per scalar (Note [Columnar scalars] in schema), from the wire's columns
        # or from a stored event's payload. Those from columns hold None in the log
        # until read as events (``_built``).
        self._scalars = ScalarRows()
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
            self._scalars.add_events(at, run)

    def _extend_scalars(self, run: ScalarRun, rank: int) -> None:
        n = run.size
        if not n:
            return
        at = len(self._events)
        # Counted first: ``at`` reads the log without the lock, and must know a None
        # in it is a scalar to build once the log holds one.
        self._unbuilt += n
        self._codes.extend(self._code(SCALAR), n)
        self._ranks.extend(rank, n)
        self._steps.extend(run.steps, n)
        self._add_run(SCALAR, at, n)
        self._scalars.add_run(at, run)
        self._events.extend(itertools.repeat(None, n))  # type: ignore[arg-type]  # built when read

    def _built(self, positions: np.ndarray) -> list[Event]:
        """Under the lock: the columnar scalars at ``positions``, as events."""
        return self._scalars.built(positions, self._ranks.view(0), self._steps.view(0))

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
            if start >= end:  # nothing new: what a cursor asks at every idle refresh
                return [], end
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
            return self._scalars.read(start, self._ranks.view(0), self._steps.view(0))

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
