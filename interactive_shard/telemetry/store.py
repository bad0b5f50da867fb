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
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from interactive_shard.telemetry.schema import SCHEMA_VERSION, Event

# A Python step per run costs about this many C-level checks of one event's kind.
_RUN_COST = 8
_KIND = operator.attrgetter("kind")
_RANK = operator.attrgetter("rank")
_STEP = operator.attrgetter("step")
_FIRST = operator.itemgetter(0)


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
        if n + count > len(self._data):
            self._data = np.resize(self._data, max(2 * len(self._data), n + count))
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
        # kind -> (log position of each run, the runs): a run is a list of consecutive
        # events of that kind, as they arrived (a batch is mostly one run). Positions
        # grow, so a bisect finds where a cursor stopped, and runs of several kinds
        # merge into log order by their positions alone.
        self._by_kind: dict[str, tuple[list[int], list[list[Event]]]] = {}
        self._lock = threading.Lock()

    @property
    def version(self) -> int:
        """Grows with every append; views compare it to know whether to redraw."""
        return len(self._events)

    def append(self, event: Event) -> None:
        self.extend((event,))

    def extend(self, events: Iterable[Event], *, rank: int | None = None) -> None:
        """Append ``events``; ``rank``: every one of them is that rank's (a checked batch)."""
        events = list(events)
        if not events:
            return
        kinds = list(map(_KIND, events))
        with self._lock:
            at = len(self._events)
            self._events.extend(events)
            code_of = self._code_of
            for kind in set(kinds).difference(code_of):
                code_of[kind] = len(code_of)
            n = len(events)
            # A batch from the collector is one rank's, and mostly of one kind: those
            # columns then take one int (a pass less over the events each).
            ranks = list(map(_RANK, events)) if rank is None else rank
            self._ranks.extend(ranks, n)
            self._steps.extend(list(map(_STEP, events)), n)
            if kinds.count(kinds[0]) == n:  # one kind: the batch is one run
                self._codes.extend(code_of[kinds[0]], n)
                self._add_run(kinds[0], at, events)
                return
            self._codes.extend(list(map(code_of.__getitem__, kinds)), n)
            i = 0
            for kind, group in itertools.groupby(kinds):
                n = len(list(group))
                self._add_run(kind, at + i, events[i : i + n])
                i += n

    def _add_run(self, kind: str, at: int, run: list[Event]) -> None:
        index = self._by_kind.get(kind)
        if index is None:
            index = self._by_kind[kind] = ([], [])
        index[0].append(at)
        index[1].append(run)

    def events(self, start: int = 0) -> list[Event]:
        """A snapshot of the events from index ``start`` (a model's cursor) on."""
        with self._lock:
            return self._events[start:]

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
                    if at + len(run) > start:
                        skip = max(start - at, 0)
                        parts.append((at + skip, run[skip:] if skip else run))
        if len(kinds) > 1:
            parts.sort(key=_FIRST)  # runs never interleave: their starts give log order
        return list(itertools.chain.from_iterable(run for _, run in parts)), end

    def _filtered(self, start: int, end: int, kinds: Collection[str]) -> list[Event]:
        """Under the lock: the events of ``kinds`` in ``[start, end)``, by their codes."""
        return list(map(self._events.__getitem__, self._positions(start, end, kinds).tolist()))

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

    def at(self, positions: Iterable[int]) -> list[Event]:
        """The events at ``positions`` (log positions, as ``positions`` returns)."""
        events = self._events  # append-only: earlier positions never change
        return list(map(events.__getitem__, positions))

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
