"""The bucket events of one kind, kept undecoded, indexed by iteration when needed.

Note [Lazy bucket events]
~~~~~~~~~~~~~~~~~~~~~~~~~

Background: a run of 10,000 iterations sends 50,000 or more ``bucket`` events, and a
view shows one iteration. Decoding them all as they arrive cost most of a refresh;
even reading one field of each of 100k new events costs tens of milliseconds (they are
cold in memory: each read is a cache miss).

Algorithm: ``RawEvents`` keeps the events' log positions (a numpy column, as
``RunStore.positions`` gives them: an update touches no event) and fetches an event
(``RunStore.at``) only when it is read. ``index()`` fetches the events not indexed
yet, oldest first, and reads each payload's ``iteration`` and the event's rank in one
C-level pass into numpy columns (``iterations``, ``rank_column``).
Indexed rows are filed by (rank, iteration) in the shared index (Note [One iteration
index]). ``BucketMap`` indexes when asked for something all events decide (the list of
iterations, the ranks, a superseded rank), and its health check indexes the
``ddp_iteration`` events as it reads them (a time budget per refresh). What a live
view asks for, the newest iteration and its buckets and record, is found by walking
back from the newest event (``newest`` / ``walk_for``), ``WALK`` events at most: the
probe sends a rank's events in iteration order, so a rank's events older than one of
an earlier iteration cannot belong to a later one. Past ``WALK`` the rest is indexed.

Caveats: the walk relies on a rank's iterations never decreasing from event to event
(the probe sends an iteration's events at the end of its backward, and counts
forwards; watching again supersedes the rank's earlier events, which ``BucketMap``
indexes first). Indexing checks it (``ordered``): once a rank's iterations went down,
every lookup indexes first. Until then a stream that breaks it (a hostile one, or a
synthetic one whose reductions outlast the next iteration's start) may have a bucket
not found by a walk; the indexed accessors (``BucketMap.iterations``) see all. An event
whose iteration cannot be read is skipped and counted when it is indexed.
"""

from __future__ import annotations

import itertools
import logging
import operator
from collections.abc import Callable, Collection
from typing import Any

import numpy as np

from interactive_shard.telemetry.iteration_index import IterationIndex, RankIterations, by_rank
from interactive_shard.telemetry.schema import MAX_WORLD_SIZE, Event
from interactive_shard.telemetry.store import RunStore

log = logging.getLogger("interactive_shard.buckets.model")

PAYLOAD = operator.attrgetter("payload")
RANK = operator.attrgetter("rank")
WALK = 4096  # events a walk from the newest reads before indexing instead
CHUNK = 64  # events a walk fetches first (then 4 times more each time)
_ITERATION = operator.itemgetter("iteration")
Reject = Callable[[Event, str], None]


class RawEvents:
    """Events of one kind in arrival order, held as their log positions in ``store``
    (a row per event). Of the first ``indexed`` rows, ``iterations`` and
    ``rank_column`` hold the payloads' iteration numbers and the ranks (numpy columns),
    and ``alive`` is False for those a later ``ddp_watch`` of their rank superseded; an
    event whose iteration cannot be read is dropped then."""

    def __init__(self, store: RunStore, reject: Reject) -> None:
        self._store = store
        self._n = 0
        # Events ever added: caches note it, not ``len``, which indexing lowers when it
        # drops unreadable rows (new events and as many drops would leave it unchanged).
        self.added = 0
        self._where = np.empty(256, dtype=np.int64)  # row -> log position
        self.indexed = 0
        self._reject = reject
        self._iterations = np.empty(256, dtype=np.int64)
        self._ranks = np.empty(256, dtype=np.int64)
        self._alive = np.ones(256, dtype=bool)
        self.ranks: set[int] = set()  # of the indexed events, alive or not
        # The live indexed rows by (rank, iteration): the shared index (Note [One
        # iteration index]); a row, once indexed, never moves.
        self.filed = IterationIndex(RankIterations)
        # Walks assume a rank's iterations never decrease; indexing checks it, and once
        # it found them decreasing, every lookup indexes first.
        self.ordered = True
        self._last: dict[int, int] = {}  # rank -> iteration of its last indexed event
        # newest()'s last answer and what it read: a live view asks 10 times a second,
        # and a walk past every rank of a wide run reads thousands of events.
        self._newest: tuple[tuple[Any, ...], int | None] | None = None

    def __len__(self) -> int:
        return self._n

    @property
    def iterations(self) -> np.ndarray:
        return self._iterations[: self.indexed]

    @property
    def rank_column(self) -> np.ndarray:
        return self._ranks[: self.indexed]

    @property
    def alive(self) -> np.ndarray:
        return self._alive[: self.indexed]

    def add(self, positions: np.ndarray) -> None:
        """Append the events at log ``positions`` (ascending), unread."""
        n, end = self._n, self._n + len(positions)
        if end > len(self._where):
            self._where = np.resize(self._where, max(2 * len(self._where), end))
        self._where[n:end] = positions
        self._n = end
        self.added += len(positions)

    def at(self, rows: np.ndarray | list[int]) -> list[Event]:
        """The events of ``rows`` (fetched from the store)."""
        return self._store.at(self._where[: self._n][rows])

    def between(self, start: int, stop: int) -> list[Event]:
        """The events of rows ``start`` to ``stop``."""
        return self._store.at(self._where[start:stop])

    def index(self, upto: int | None = None) -> np.ndarray:
        """Index the events not indexed yet (up to row ``upto``); returns their
        iteration numbers."""
        start, stop = self.indexed, self._n if upto is None else upto
        if start >= stop:
            return np.empty(0, dtype=np.int64)
        new = self.between(start, stop)
        keys = _keys(new)
        if keys is None:
            kept, keys = _checked(new, self._reject)
            if not kept.all():  # the unreadable ones leave the rows
                where = self._where
                rest = np.concatenate((where[start:stop][kept], where[stop : self._n]))
                self._n = start + len(rest)
                where[start : self._n] = rest
        iterations, ranks = keys >> _SHIFT, keys & _RANKS
        end = start + len(iterations)
        if end > len(self._iterations):
            size = max(2 * len(self._iterations), end)
            self._iterations = np.resize(self._iterations, size)
            self._ranks = np.resize(self._ranks, size)
            self._alive = np.resize(self._alive, size)
        self._iterations[start:end] = iterations
        self._ranks[start:end] = ranks
        self._alive[start:end] = True
        self.indexed = end
        rows = np.arange(start, end, dtype=np.int64)
        for rank, picked in by_rank(ranks):
            self.ranks.add(rank)
            self.filed.file(rank, iterations[picked], rows[picked])
        if self.ordered and len(ranks) and not self._in_order(iterations, ranks):
            self.ordered = False
            log.warning(
                "%s events: a rank's iterations went down (events out of order); "
                "every lookup reads them all from now on",
                new[0].kind,
            )
        return iterations

    def _in_order(self, iterations: np.ndarray, ranks: np.ndarray) -> bool:
        """Per rank, the new iterations never decrease, nor fall below the last ones."""
        by_rank = np.argsort(ranks, kind="stable")
        ranks, iterations = ranks[by_rank], iterations[by_rank]
        same = ranks[1:] == ranks[:-1]
        if np.any(iterations[1:][same] < iterations[:-1][same]):
            return False
        starts = np.flatnonzero(np.concatenate(([True], ~same)))
        ends = np.concatenate((starts[1:], [len(ranks)])) - 1
        ok = True
        for rank, first, last in zip(
            ranks[starts].tolist(),
            iterations[starts].tolist(),
            iterations[ends].tolist(),
            strict=True,
        ):
            ok &= first >= self._last.get(rank, 0)
            self._last[rank] = last
        return ok

    def rows(self, iteration: int, rank: int) -> list[int]:
        """The rows of the live indexed events of ``iteration`` on ``rank``, in order."""
        return self.filed.positions(rank, iteration)

    def forget(self, rank: int) -> None:
        """Mark ``rank``'s events superseded (its ``ddp_watch`` came again)."""
        self.index()
        self.alive[self.rank_column == rank] = False
        self.filed.restart(rank)
        self._last[rank] = 0  # its iterations count from 1 again

    def newest(self, ranks: Collection[int]) -> int | None:
        """The highest iteration of the events not indexed yet: walked back from the
        newest until each of ``ranks`` (and every rank met) was seen once, else indexed.
        None when every event is indexed. The same answer as last time while nothing
        changed (no event added or indexed, the same ``ranks``)."""
        state = (self.added, self._n, self.indexed, self.ordered, frozenset(ranks))
        if self._newest is not None and self._newest[0] == state:
            return self._newest[1]
        found = self._newest_walked(ranks)
        # Kept only when the walk changed nothing (indexing changes the answer's basis).
        if state == (self.added, self._n, self.indexed, self.ordered, state[-1]):
            self._newest = (state, found)
        return found

    def _newest_walked(self, ranks: Collection[int]) -> int | None:
        if self.indexed == self._n:
            return None
        if not self.ordered:
            tail = self.index()
            return int(tail.max()) if len(tail) else None
        wanted, seen, top = set(ranks), set[int](), 0
        for e in self._walk():
            if e is None:  # too far back, or an unreadable event: index them
                tail = self.index()
                return int(tail.max()) if len(tail) else None
            rank, it, _ = e
            if rank not in seen:  # a rank's newest event holds its highest iteration
                seen.add(rank)
                top = max(top, int(it))
                if seen >= wanted:
                    return top
        return top

    def walk_for(self, iteration: int, rank: int) -> list[Event] | None:
        """The events of ``iteration`` on ``rank`` among those not indexed yet, oldest
        first, found walking back from the newest: at the first event of ``rank`` of an
        earlier iteration the rest are older still. None when the walk went too far
        (the caller indexes them)."""
        if not self.ordered:
            return None
        found: list[Event] = []
        for step in self._walk():
            if step is None:
                return None
            here, it, e = step
            if here != rank:
                continue
            if it == iteration:
                found.append(e)
            elif it < iteration:
                break
        found.reverse()
        return found

    def _walk(self) -> Any:
        """(rank, iteration, event) of the events not indexed yet, newest first; None
        (then stop) past ``WALK`` events or at one whose iteration cannot be read. The
        events are fetched in growing chunks: a walk mostly stops within a few."""
        stop = max(self.indexed, self._n - WALK)
        end, chunk = self._n, CHUNK
        while end > stop:
            first = max(stop, end - chunk)
            for e in reversed(self.between(first, end)):
                payload = e.payload
                it = payload.get("iteration") if type(payload) is dict else None
                if type(it) is not int or not 1 <= it <= _MAX_ITERATION:
                    yield None
                    return
                yield e.rank, it, e
            end, chunk = first, 4 * chunk
        if stop > self.indexed:
            yield None


# A key is iteration << 16 | rank: one pass reads both. Ranks are below MAX_WORLD_SIZE
# (2**16: the schema checks every event that arrives), iterations below 2**47.
_SHIFT = (MAX_WORLD_SIZE - 1).bit_length()
_RANKS = (1 << _SHIFT) - 1
_MAX_ITERATION = (1 << (63 - _SHIFT)) - 1
_SHIFTS = itertools.repeat(_SHIFT)


def _keys(events: list[Event]) -> np.ndarray | None:
    """``payload["iteration"] << 16 | rank`` of every event, in one C-level pass over
    them. None when an iteration is missing, not a number, or not in 1..2**47-1.

    numpy reads 1.5, True or "3" as an int here: such an event is filed under that
    iteration, and skipped (and counted) when that iteration is decoded, so the only
    trace of it is an iteration listed without data.
    """
    iterations = map(operator.lshift, map(_ITERATION, map(PAYLOAD, events)), _SHIFTS)
    try:
        keys = np.fromiter(map(operator.or_, iterations, map(RANK, events)), np.int64, len(events))
    except (KeyError, TypeError, ValueError, OverflowError):
        return None
    return keys if keys.min() >> _SHIFT >= 1 else None


def _checked(events: list[Event], reject: Reject) -> tuple[np.ndarray, np.ndarray]:
    """(which events have a readable iteration, their keys); the others rejected."""
    kept, keys = [], []
    for e in events:
        payload: Any = e.payload
        it = payload.get("iteration") if isinstance(payload, dict) else None
        if type(it) is int and 1 <= it <= _MAX_ITERATION:
            kept.append(True)
            keys.append(it << _SHIFT | e.rank)
        else:
            kept.append(False)
            reject(e, f"iteration {it!r}: iterations are ints from 1 (the first backward)")
    return np.array(kept, dtype=bool), np.array(keys, dtype=np.int64)
