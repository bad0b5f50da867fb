"""How ``BucketMap`` reads the store: bucket events kept unread, watches in order.

``BucketEvents`` is the model's lower half: it takes where the new events of its three
kinds lie in the store (``RunStore.positions``, one call per kind, touching no event)
and files ``bucket`` and ``ddp_iteration`` events by position, unread (Note [Lazy
bucket events] in ``_lazy_events.py``). A ``ddp_watch`` is rare and ordered against the others
by position, so that a rank watched again has its earlier events superseded and only
those. Malformed events are counted once
(``skipped``), the first of each kind logged.
"""

from __future__ import annotations

import logging
from typing import Any

import msgspec
import numpy as np

from interactive_shard.buckets import records
from interactive_shard.buckets._lazy_events import RawEvents
from interactive_shard.buckets.events import BucketReduced, DdpIteration, DdpWatch
from interactive_shard.buckets.records import IterationRecord, RecordError, WatchInfo
from interactive_shard.telemetry.schema import Event
from interactive_shard.telemetry.store import RunStore

log = logging.getLogger("interactive_shard.buckets.model")

WATCH, BUCKET, ITERATION = DdpWatch.KIND, BucketReduced.KIND, DdpIteration.KIND
_TYPES: dict[str, type[Any]] = {BUCKET: BucketReduced, ITERATION: DdpIteration}


class BucketEvents:
    """The bucket events of a store, read as they come (``update``)."""

    def __init__(self, store: RunStore) -> None:
        self.store = store
        self.revision = 0  # grows whenever new bucket data arrived; views compare it
        self.skipped = 0  # events that did not follow the schema (logged once per kind)
        self._bad: set[int] = set()  # ids of the stored events counted in skipped
        self._logged: set[str] = set()
        self._position = 0  # in the store: every event before it was filed
        self._store_length = -1  # at the last update (unchanged: nothing to read)
        self._infos: dict[int, WatchInfo] = {}
        self._buckets = RawEvents(store, self._reject)  # indexed when asked
        self._records = RawEvents(store, self._reject)  # indexed as health reads them
        self._raw = (self._buckets, self._records)
        self._forgotten = 0  # ranks superseded so far (a state of the indexes)

    def _watched(self) -> None:
        """A rank's watch came (its info changed): derived state is stale."""

    def update(self) -> bool:
        """Consume new events; True when bucket data changed."""
        if len(self.store) == self._store_length:
            return False
        start, store = self._position, self.store
        # Three reads (each under the store's lock): cut at the first one's end, so that
        # each kind is read up to the same place, and what came since waits for the next.
        watches, end = store.positions(start, (WATCH,))
        buckets, _ = store.positions(start, (BUCKET,))
        iterations, _ = store.positions(start, (ITERATION,))
        buckets = buckets[: np.searchsorted(buckets, end)]
        iterations = iterations[: np.searchsorted(iterations, end)]
        self._position = self._store_length = end
        if len(watches):  # rare: a rank watched (again); its events before that are superseded
            changed = self._in_order(watches, buckets, iterations)
        else:
            changed = self._add(buckets, iterations)
        if changed:
            self.revision += 1
        return changed

    def _add(self, buckets: np.ndarray, iterations: np.ndarray) -> bool:
        # Unread (Note [Lazy bucket events]): cache entries note the counts they saw.
        self._buckets.add(buckets)
        self._records.add(iterations)
        return bool(len(buckets) or len(iterations))

    def _in_order(self, watches: np.ndarray, buckets: np.ndarray, iterations: np.ndarray) -> bool:
        """File the events between watches in log order: a ``ddp_watch`` splits its
        rank's events into superseded (before) and current (after)."""
        changed, b, i = False, 0, 0
        for at, watch in zip(watches.tolist(), self.store.at(watches), strict=True):
            b_cut, i_cut = np.searchsorted(buckets, at), np.searchsorted(iterations, at)
            changed |= self._add(buckets[b:b_cut], iterations[i:i_cut])
            b, i = b_cut, i_cut
            changed |= self._watch(watch)
        changed |= self._add(buckets[b:], iterations[i:])
        return changed

    def _watch(self, e: Event) -> bool:
        try:
            info = records.decode(e.rank, e.kind, e.payload)
        except RecordError as err:
            self._skip(e, err)
            return False
        assert isinstance(info, WatchInfo)
        if e.rank in self._infos:  # watching again restarts the rank's iteration count
            self._forget(e.rank)
        self._infos[e.rank] = info
        self._watched()
        return True

    def _forget(self, rank: int) -> None:
        log.info("rank %d: ddp_watch again; dropping its earlier bucket events", rank)
        for raw in self._raw:
            raw.forget(rank)
        self._forgotten += 1

    def _skip(self, e: Event, why: object) -> None:
        """Count a malformed event once (it may be read again), log the first per kind."""
        if id(e) in self._bad:
            return
        self._bad.add(id(e))
        self.skipped += 1
        if e.kind not in self._logged:
            self._logged.add(e.kind)
            log.warning(
                "rank %d: skipped a malformed %s event: %s (later ones are only counted)",
                e.rank,
                e.kind,
                why,
            )

    def _reject(self, e: Event, why: str) -> None:
        self._skip(e, why)

    def _decode(self, e: Event) -> Any:
        """The record of a ``bucket`` or ``ddp_iteration`` event, None if it does not fit."""
        try:
            record = msgspec.convert(e.payload, _TYPES[e.kind])
        except (msgspec.ValidationError, TypeError) as err:
            self._skip(e, err)
            return None
        problem = records.size_problem(record)
        if problem is not None:  # sizes no int64 holds (a hostile event)
            self._skip(e, f"{e.kind} event: {problem}")
            return None
        return record

    def _decode_records(self, events: list[Event]) -> list[IterationRecord | None]:
        """Records of ``ddp_iteration`` events, None where one does not fit: one msgspec
        call for all (a third of the cost), one each only when that call fails."""
        try:
            decoded: list[IterationRecord | None] = msgspec.convert(
                [e.payload for e in events], list[DdpIteration]
            )
            return decoded
        except (msgspec.ValidationError, TypeError):
            return [self._decode(e) for e in events]

    def _events(self, raw: RawEvents, iteration: int, rank: int) -> list[Event]:
        """The live events of ``iteration`` on ``rank``, oldest first: the indexed ones,
        then those a walk from the newest finds (or, past the walk, all indexed)."""
        tail = raw.walk_for(iteration, rank)
        if tail is None:
            raw.index()
            tail = []
        return self._of(raw, iteration, rank) + tail

    @staticmethod
    def _of(raw: RawEvents, iteration: int, rank: int) -> list[Event]:
        return raw.at(raw.rows(iteration, rank))
