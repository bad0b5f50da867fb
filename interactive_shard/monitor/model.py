"""RunMonitor model: per-rank state, step, progress, last log lines, and scalars.

Derived from a RunStore incrementally (a cursor over its append-only events), so it
serves a live run and a loaded recording alike. Payloads are decoded with their
Structs (``cluster/events.py``). No widgets here.
"""

from __future__ import annotations

import itertools
import logging
import operator
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from interactive_shard.cluster.events import Log, Progress, Scalar, State
from interactive_shard.cluster.state import RankState
from interactive_shard.telemetry.consume import Budget, Cursor
from interactive_shard.telemetry.schema import Event
from interactive_shard.telemetry.store import RunStore

log = logging.getLogger(__name__)

LOG_LINES = 8
CHUNK = 8192  # scalars read between two looks at the clock under a budget (~5 ms)


@dataclass
class RankStatus:
    state: RankState = RankState.STARTING
    step: int = 0
    total: int | None = None
    detail: str = ""
    logs: deque[str] = field(default_factory=lambda: deque(maxlen=LOG_LINES))


class Series:
    """One scalar of one rank: its steps and values, in arrival order.

    Held in numpy arrays that double when full (appending a refresh's points costs
    those points); ``steps`` / ``values`` are lists for reading, ``step_array`` /
    ``value_array`` views of the arrays for figures.
    """

    def __init__(self) -> None:
        self._steps = np.empty(16, dtype=np.int64)
        self._values = np.empty(16, dtype=np.float64)
        self._n = 0

    def __len__(self) -> int:
        return self._n

    @property
    def step_array(self) -> np.ndarray:
        return self._steps[: self._n]

    @property
    def value_array(self) -> np.ndarray:
        return self._values[: self._n]

    @property
    def steps(self) -> list[int]:
        return self.step_array.tolist()  # type: ignore[no-any-return]

    @property
    def values(self) -> list[float]:
        return self.value_array.tolist()  # type: ignore[no-any-return]

    def extend(self, steps: np.ndarray, values: np.ndarray) -> None:
        n, more = self._n, len(steps)
        if n + more > len(self._steps):
            size = max(2 * len(self._steps), n + more)
            self._steps = np.resize(self._steps, size)
            self._values = np.resize(self._values, size)
        self._steps[n : n + more] = steps
        self._values[n : n + more] = values
        self._n = n + more

    def __repr__(self) -> str:
        return f"Series({self._n} points)"


class MonitorModel:
    """Rank states, steps, logs and scalar series of one run's store.

    ``update`` costs what arrived since the last one: the monitor's own kinds come from
    the store's index per kind, each kind's payloads decoded in one call (``Cursor``);
    the scalars' ranks and steps, and the steps of the other kinds (the features'),
    come from the store's numpy columns, so of those only the scalars' payloads are read.

    A view's refresh has a budget (``budget``, as the DDP lifecycle's): 100k new scalars
    take ~60 ms to read (each payload is a cache miss away from the next), more than a
    refresh may take. Scalars are then read in chunks of ``CHUNK`` until the budget is
    spent, ``pending`` counts the rest and the view's poller reads them between ticks.
    Outside a budget (``run.monitor``, the report, tests) an update reads everything.
    """

    def __init__(self, store: RunStore) -> None:
        self.store = store
        self.ranks = [RankStatus() for _ in range(store.info.world_size)]
        # scalar name -> rank -> series
        self.scalars: dict[str, dict[int, Series]] = {}
        self._scalars = Cursor(store, {Scalar.KIND: Scalar})  # decodes what does not fit
        self._cursor = Cursor(store, {k.KIND: k for k in (Progress, Log, State)})
        self._taken = 0  # log position up to which scalars were taken (into the backlog)
        self._backlog: deque[np.ndarray] = deque()  # their positions, not read yet
        self.pending = 0  # scalars in the backlog
        self.budget = Budget()
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
        taken, self._taken = self.store.positions(self._taken, (Scalar.KIND,))
        if len(taken):
            self._backlog.append(taken)
            self.pending += len(taken)
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
                else:
                    status.state, status.detail = record.state, record.detail
                status.step = max(status.step, e.step)
        if len(taken):  # new scalars: a chunk read now, even when the budget is spent
            self._add_scalars(self._next_chunk())
        while self._backlog and not self.budget.spent:
            self._add_scalars(self._next_chunk())
        self._note_steps(*self._inside(at)[1:])  # any kind (a feature's too) tells how far
        return bool(events or len(at) or self.points != points or self.skipped != skipped)

    def _next_chunk(self) -> np.ndarray:
        """The backlog's next positions: all of it outside a budget, else ``CHUNK``."""
        if not self.budget.limited:
            chunk: np.ndarray = np.concatenate(self._backlog)
            self._backlog.clear()
        else:
            first = self._backlog[0]
            chunk, rest = first[:CHUNK], first[CHUNK:]
            if len(rest):
                self._backlog[0] = rest
            else:
                self._backlog.popleft()
        self.pending -= len(chunk)
        return chunk

    def _inside(self, at: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Of the events at log positions ``at``, those of the run's ranks: positions,
        ranks and steps (the others are skipped and counted)."""
        ranks, steps = self.store.columns(at)
        inside = (ranks >= 0) & (ranks < len(self.ranks))
        if inside.all():
            return at, ranks, steps
        for e in self.store.at(at[~inside].tolist()):
            self._outside_rank(e)
        return at[inside], ranks[inside], steps[inside]

    def _note_steps(self, ranks: np.ndarray, steps: np.ndarray) -> None:
        """Raise each rank's step to the highest of its ``steps``."""
        if not len(ranks):
            return
        top = np.full(len(self.ranks), np.iinfo(np.int64).min)
        np.maximum.at(top, ranks, steps)
        for rank in np.flatnonzero(top > np.iinfo(np.int64).min).tolist():
            self.ranks[rank].step = max(self.ranks[rank].step, int(top[rank]))

    def _add_scalars(self, at: np.ndarray) -> None:
        """Append the scalars at log positions ``at`` to their series in bulk: numpy
        groups them by (name, rank), however many arrived (a refresh may bring 100k)."""
        n = len(self.ranks)
        at, ranks, steps = self._inside(at)
        events = self.store.at(at.tolist())
        columns = _columns(events)
        if columns is None:  # some payload does not fit: decode one by one, skip those
            records = [self._scalars.decode(e) for e in events]
            fits = np.array([r is not None for r in records], bool)
            events, ranks, steps = list(itertools.compress(events, fits)), ranks[fits], steps[fits]
            kept = [r for r in records if r is not None]
            columns = [r.name for r in kept], np.array([r.value for r in kept], np.float64)
        names_of, values = columns
        count = len(events)
        if not count:
            return
        names = sorted(set(names_of))
        ranks = ranks.astype(np.int64)
        if len(names) == 1:
            keys = ranks
        else:
            code = {name: i for i, name in enumerate(names)}
            keys = np.fromiter(map(code.__getitem__, names_of), np.int64, count) * n + ranks
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
        self.points += count

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


_NUMBERS = {int, float}
_PAYLOAD = operator.attrgetter("payload")
_VALUE = operator.itemgetter("value")


def _columns(events: list[Event]) -> tuple[list[str], np.ndarray] | None:
    """The names and values of scalar events when every payload fits ``Scalar`` (the
    common case), read in C loops; None when one does not (the caller decodes them one
    by one). The same rules as ``msgspec.convert(payload, Scalar)``: ``value`` an int or
    a float (not a bool) within float range, ``name`` a str (default ``"value"``)."""
    payloads = list(map(_PAYLOAD, events))
    try:
        values = list(map(_VALUE, payloads))
        if not set(map(type, values)) <= _NUMBERS:
            return None
        names = list(map(dict.get, payloads, itertools.repeat("name"), itertools.repeat("value")))
        if set(map(type, names)) - {str}:
            return None
        return names, np.array(values, dtype=np.float64)
    except (KeyError, OverflowError):
        return None
