"""RunStore: the single kernel-side state of a run.

Written by the collector thread (events from ranks) and the cluster's supervisor
(log lines, rank states); read by models on the notebook's main thread. Events
are append-only, so a model keeps a cursor and consumes only what is new.
"""

from __future__ import annotations

import itertools
import operator
import threading
from array import array
from bisect import bisect_left
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from interactive_shard.telemetry.schema import SCHEMA_VERSION, Event

_KIND = operator.attrgetter("kind")


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
        # kind -> (positions in _events, those events): appended in order, so sorted
        self._by_kind: dict[str, tuple[array[int], list[Event]]] = {}
        self._lock = threading.Lock()

    @property
    def version(self) -> int:
        """Grows with every append; views compare it to know whether to redraw."""
        return len(self._events)

    def append(self, event: Event) -> None:
        self.extend((event,))

    def extend(self, events: Iterable[Event]) -> None:
        events = list(events)
        with self._lock:
            at = len(self._events)
            self._events.extend(events)
            # Runs of one kind (a batch is mostly one kind): one slice per run, C loops.
            for kind, run in itertools.groupby(events, _KIND):
                part = list(run)
                index = self._by_kind.get(kind)
                if index is None:
                    index = self._by_kind[kind] = (array("q"), [])
                index[0].extend(range(at, at + len(part)))
                index[1].extend(part)
                at += len(part)

    def events(self, start: int = 0) -> list[Event]:
        """A snapshot of the events from index ``start`` (a model's cursor) on."""
        with self._lock:
            return self._events[start:]

    def since(self, start: int, kinds: Collection[str]) -> tuple[list[Event], int]:
        """The events of ``kinds`` from log position ``start`` on, in log order, and the
        position to start from next time (a cursor's), read under one lock."""
        parts: list[tuple[array[int], list[Event]]] = []
        with self._lock:
            end = len(self._events)
            for kind in kinds:
                index = self._by_kind.get(kind)
                if index is not None:
                    first = bisect_left(index[0], start)
                    if first < len(index[0]):
                        parts.append((index[0][first:], index[1][first:]))
        if len(parts) <= 1:
            return (parts[0][1] if parts else []), end
        # Several kinds: their positions sorted in C (a sort of 100k (position, event)
        # tuples took 0.1 s on the notebook's thread).
        order = np.argsort(np.concatenate([np.frombuffer(p, np.int64) for p, _ in parts]))
        events = list(itertools.chain.from_iterable(e for _, e in parts))
        return [events[i] for i in order.tolist()], end

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
