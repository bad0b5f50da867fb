"""RunMonitor model: per-rank state, step, progress, last log lines, and scalars.

Derived from a RunStore incrementally (a cursor over its append-only events), so it
serves a live run and a loaded recording alike. Payloads are decoded with their
Structs (``telemetry/run_events.py``). No widgets here.
"""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from interactive_shard.telemetry._columns import Column
from interactive_shard.telemetry.consume import Cursor
from interactive_shard.telemetry.rank_state import RankState
from interactive_shard.telemetry.run_events import Log, Progress, RankInfo, Scalar, State
from interactive_shard.telemetry.schema import Event
from interactive_shard.telemetry.store import RunStore, ScalarColumns

log = logging.getLogger(__name__)

LOG_LINES = 8


@dataclass
class RankStatus:
    state: RankState = RankState.STARTING
    step: int = 0
    total: int | None = None
    detail: str = ""
    host: str = ""  # where it runs (its RankInfo; empty until it says)
    node: int = 0
    logs: deque[str] = field(default_factory=lambda: deque(maxlen=LOG_LINES))


class Series:
    """One scalar of one rank: its steps and values, in arrival order.

    Held in numpy arrays that double when full (appending a refresh's points costs
    those points); ``steps`` / ``values`` are lists for reading, ``step_array`` /
    ``value_array`` views of the arrays for figures.
    """

    def __init__(self) -> None:
        # Small at first: a run may have a series per name and rank, thousands of them.
        self._steps = Column(np.int64, capacity=16)
        self._values = Column(np.float64, capacity=16)

    def __len__(self) -> int:
        return len(self._steps)

    @property
    def step_array(self) -> np.ndarray:
        return self._steps.view(0)

    @property
    def value_array(self) -> np.ndarray:
        return self._values.view(0)

    @property
    def steps(self) -> list[int]:
        return self.step_array.tolist()  # type: ignore[no-any-return]

    @property
    def values(self) -> list[float]:
        return self.value_array.tolist()  # type: ignore[no-any-return]

    def extend(self, steps: np.ndarray, values: np.ndarray) -> None:
        self._steps.extend(steps, len(steps))
        self._values.extend(values, len(values))

    def __repr__(self) -> str:
        return f"Series({len(self)} points)"


class MonitorModel:
    """Rank states, steps, logs and scalar series of one run's store.

    ``update`` costs what arrived since the last one: the monitor's own kinds come from
    the store's index per kind, each kind's payloads decoded in one call (``Cursor``);
    the scalars come from the store's scalar columns (``RunStore.scalars``: 100k new
    ones take a few milliseconds of numpy, no event read) and the steps of the other
    kinds (the features') from its rank and step columns.
    """

    def __init__(self, store: RunStore) -> None:
        self.store = store
        self.ranks = [RankStatus() for _ in range(store.info.world_size)]
        # scalar name -> rank -> series
        self.scalars: dict[str, dict[int, Series]] = {}
        self._scalars = Cursor(store, {Scalar.KIND: Scalar})  # decodes what does not fit
        self._cursor = Cursor(store, {k.KIND: k for k in (Progress, Log, State, RankInfo)})
        self._row = 0  # the store's scalar row up to which scalars were read
        self._others = 0  # log position up to which the other kinds' steps were read
        self._outside = 0  # events of a rank outside the run
        self.points = 0  # scalar values read so far: a figure redraws when it grows

    @property
    def skipped(self) -> int:
        """Events the model could not read (see ``update``)."""
        return self._scalars.skipped + self._cursor.skipped + self._outside

    def update(self) -> bool:
        """Consume new events; True when anything changed.

        An event the model cannot read (a rank outside the run, a payload that does not
        fit its Struct: an unknown state, a scalar that is not a number...) is skipped
        and counted in ``skipped`` (logged once); the events after it are read as usual.
        """
        skipped, points = self.skipped, self.points
        events, records = self._cursor.take_records()
        ours = (Scalar.KIND, *self._cursor.decoders)
        others = [k for k in self.store.kinds() if k not in ours]
        at, self._others = self.store.positions(self._others, others)
        ranks, n = self.ranks, len(self.ranks)
        for e, record in zip(events, records, strict=True):
            if not 0 <= e.rank < n:
                self._outside_rank(e)
            else:
                status = ranks[e.rank]
                if e.kind == Progress.KIND:
                    status.total = record.total
                elif e.kind == Log.KIND:
                    status.logs.append(record.text)
                    continue  # noted in the kernel at step 0: says nothing of the step
                elif e.kind == RankInfo.KIND:
                    status.host, status.node = record.host, record.node
                    continue
                else:
                    status.state, status.detail = record.state, record.detail
                status.step = max(status.step, e.step)
        columns, names, self._row = self.store.scalars(self._row)
        if len(columns.at):
            self._add_scalars(columns, names)
        ranks_at, steps_at = self.store.columns(at)
        self._note_steps(*self._inside(at, ranks_at, steps_at)[1:])  # a feature's kinds too
        return bool(events or len(at) or self.points != points or self.skipped != skipped)

    def _inside(
        self, at: np.ndarray, ranks: np.ndarray, *rest: np.ndarray
    ) -> tuple[np.ndarray, ...]:
        """Of the events at log positions ``at`` (their ``ranks`` and other columns),
        those of the run's ranks (the others are skipped and counted)."""
        inside = (ranks >= 0) & (ranks < len(self.ranks))
        if inside.all():
            return (at, ranks, *rest)
        for e in self.store.at(at[~inside]):
            self._outside_rank(e)
        return tuple(column[inside] for column in (at, ranks, *rest))

    def _note_steps(self, ranks: np.ndarray, steps: np.ndarray) -> None:
        """Raise each rank's step to the highest of its ``steps``."""
        if not len(ranks):
            return
        top = np.full(len(self.ranks), np.iinfo(np.int64).min)
        np.maximum.at(top, ranks, steps)
        for rank in np.flatnonzero(top > np.iinfo(np.int64).min).tolist():
            self.ranks[rank].step = max(self.ranks[rank].step, int(top[rank]))

    def _add_scalars(self, columns: ScalarColumns, names: list[str]) -> None:
        """Append new scalars to their series in bulk: numpy groups them by (name,
        rank), however many arrived (a refresh may bring 100k)."""
        n = len(self.ranks)
        at, ranks, steps, codes, values = self._inside(*columns)
        misfit = codes < 0
        if misfit.any():  # a payload that is no Scalar: decoded, to be skipped and logged
            for e in self.store.at(at[misfit]):
                self._scalars.decode(e)
            ranks, steps, codes, values = (c[~misfit] for c in (ranks, steps, codes, values))
        if not len(ranks):
            return
        keys = codes.astype(np.int64) * n + ranks
        order = np.argsort(keys, kind="stable")  # stable: each series keeps arrival order
        starts = np.flatnonzero(np.diff(keys[order])) + 1
        for chunk in np.split(order, starts):
            name, rank = divmod(int(keys[chunk[0]]), n)
            per_rank = self.scalars.setdefault(names[name], {})
            series = per_rank.get(rank)
            if series is None:
                series = per_rank[rank] = Series()
            series.extend(steps[chunk], values[chunk])
        self._note_steps(ranks, steps)
        self.points += len(ranks)

    def _outside_rank(self, e: Event) -> None:
        self._outside += 1
        if self._outside == 1:
            log.warning(
                "run monitor: skipped a %r event of rank %r, outside this run's ranks "
                "0..%d; later ones are counted in MonitorModel.skipped",
                e.kind,
                e.rank,
                len(self.ranks) - 1,
            )
