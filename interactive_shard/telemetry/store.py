"""RunStore: the single kernel-side state of a run.

Written by the collector thread (events from ranks) and the cluster's supervisor
(log lines, rank states); read by models on the notebook's main thread. Events
are append-only, so a model keeps a cursor and consumes only what is new.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from interactive_shard.telemetry.schema import SCHEMA_VERSION, Event


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
        self._lock = threading.Lock()

    @property
    def version(self) -> int:
        """Grows with every append; views compare it to know whether to redraw."""
        return len(self._events)

    def append(self, event: Event) -> None:
        with self._lock:
            self._events.append(event)

    def extend(self, events: Iterable[Event]) -> None:
        with self._lock:
            self._events.extend(events)

    def events(self, start: int = 0) -> list[Event]:
        """A snapshot of the events from index ``start`` (a model's cursor) on."""
        with self._lock:
            return self._events[start:]

    def of_kind(self, kind: str) -> list[Event]:
        return [e for e in self.events() if e.kind == kind]

    def __len__(self) -> int:
        return len(self._events)

    def __repr__(self) -> str:
        return (
            f"RunStore({len(self)} events, world_size={self.info.world_size}, "
            f"backend={self.info.backend!r})"
        )
