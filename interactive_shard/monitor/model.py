"""RunMonitor model: per-rank state, step, progress, last log lines, and scalars.

Derived from a RunStore incrementally (a cursor over its append-only events), so it
serves a live run and a loaded recording alike. Payloads are decoded with their
Structs (``cluster/events.py``). No widgets here.
"""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass, field

import msgspec

from interactive_shard.cluster.events import Log, Progress, Scalar, State
from interactive_shard.cluster.state import RankState
from interactive_shard.telemetry.schema import Event
from interactive_shard.telemetry.store import RunStore

log = logging.getLogger(__name__)

LOG_LINES = 8


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
        self.skipped = 0  # events the model could not read (see update)
        self._cursor = 0

    def update(self) -> bool:
        """Consume new events; True when anything changed.

        An event the model cannot read (a rank outside the run, a payload that does not
        fit its Struct: an unknown state, a scalar that is not a number...) is skipped
        and counted in ``skipped`` (logged once); the events after it are read as usual.
        """
        events = self.store.events(self._cursor)
        self._cursor += len(events)
        for e in events:
            try:
                self._apply(e)
            except Exception as exc:  # one event must not break the model
                self._skip(e, exc)
        return bool(events)

    def _apply(self, e: Event) -> None:
        if not 0 <= e.rank < len(self.ranks):
            raise ValueError(f"rank {e.rank} outside 0..{len(self.ranks) - 1}")
        status = self.ranks[e.rank]
        kind = e.kind
        # Decoded before anything changes: a payload that does not fit changes nothing.
        if kind == Scalar.KIND:
            scalar = msgspec.convert(e.payload, Scalar)
            series = self.scalars.setdefault(scalar.name, {}).setdefault(e.rank, Series())
            series.steps.append(e.step)
            series.values.append(scalar.value)
        elif kind == Progress.KIND:
            status.step, status.total = e.step, msgspec.convert(e.payload, Progress).total
        elif kind == Log.KIND:
            status.logs.append(msgspec.convert(e.payload, Log).text)
            return  # noted in the kernel at step 0: says nothing of the rank's step
        elif kind == State.KIND:
            state = msgspec.convert(e.payload, State)
            status.state, status.detail = state.state, state.detail
        # Any kind (a feature's too) tells how far the rank got.
        if e.step > status.step:
            status.step = e.step

    def _skip(self, e: Event, exc: Exception) -> None:
        self.skipped += 1
        if self.skipped == 1:
            log.warning(
                "run monitor: skipped a %r event of rank %r it cannot read (%s: %s); later "
                "ones are counted in MonitorModel.skipped",
                e.kind,
                e.rank,
                type(exc).__name__,
                exc,
            )
