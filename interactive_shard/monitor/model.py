"""RunMonitor model: per-rank state, step, progress, last log lines, and scalars.

Derived from a RunStore incrementally (a cursor over its append-only events), so it
serves a live run and a loaded recording alike. No widgets here.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from enum import Enum

from interactive_shard.telemetry import schema
from interactive_shard.telemetry.store import RunStore

LOG_LINES = 8


class RankState(str, Enum):
    """What a rank is doing. A Run's ranks go running -> finished | failed."""

    STARTING = "starting"
    IDLE = "idle"
    RUNNING = "running"
    FINISHED = "finished"
    FAILED = "failed"


@dataclass
class RankStatus:
    state: RankState = RankState.STARTING
    step: int = 0
    total: int | None = None
    detail: str = ""
    logs: deque[str] = field(default_factory=lambda: deque(maxlen=LOG_LINES))


@dataclass
class Series:
    steps: list[int] = field(default_factory=list)
    values: list[float] = field(default_factory=list)


class MonitorModel:
    def __init__(self, store: RunStore) -> None:
        self.store = store
        self.ranks = [RankStatus() for _ in range(store.info.world_size)]
        # scalar name -> rank -> series
        self.scalars: dict[str, dict[int, Series]] = {}
        self._cursor = 0

    def update(self) -> bool:
        """Consume new events; True when anything changed."""
        events = self.store.events(self._cursor)
        self._cursor += len(events)
        for e in events:
            if not 0 <= e.rank < len(self.ranks):
                continue
            status = self.ranks[e.rank]
            if e.kind == schema.SCALAR:
                name = str(e.payload.get("name", "value"))
                value = e.payload.get("value")
                if isinstance(value, (int, float)):
                    series = self.scalars.setdefault(name, {}).setdefault(e.rank, Series())
                    series.steps.append(e.step)
                    series.values.append(float(value))
            elif e.kind == schema.PROGRESS:
                status.step = e.step
                total = e.payload.get("total")
                status.total = total if isinstance(total, int) else None
            elif e.kind == schema.LOG:
                status.logs.append(str(e.payload.get("text", "")))
            elif e.kind == schema.STATE:
                status.state = RankState(e.payload.get("state", "running"))
                status.detail = str(e.payload.get("detail", ""))
            if e.step > status.step and e.kind != schema.LOG:
                status.step = e.step
        return bool(events)

    @property
    def finished(self) -> bool:
        return all(r.state in (RankState.FINISHED, RankState.FAILED) for r in self.ranks)
