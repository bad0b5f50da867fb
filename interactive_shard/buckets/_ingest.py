"""How ``BucketMap`` reads the store: bucket events kept unread, watches in order.

``BucketEvents`` is the model's lower half: it takes the new events of its three kinds
from the store's index per kind (one ``since`` call per kind: no merge of kinds) and
files ``bucket`` and ``ddp_iteration`` events unread (Note [Lazy bucket events] in
``_raw.py``). A ``ddp_watch`` is rare and ordered against the others: when one came,
the log is read in order from where the kinds stopped, so that a rank watched again
has its earlier events superseded and only those. Malformed events are counted once
(``skipped``), the first of each kind logged.
"""

from __future__ import annotations

import logging
from typing import Any

import msgspec

from interactive_shard.buckets import records
from interactive_shard.buckets._raw import RawEvents
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
        self._position = {WATCH: 0, BUCKET: 0, ITERATION: 0}  # store position per kind
        self._store_length = -1  # at the last update (unchanged: nothing to read)
        self._infos: dict[int, WatchInfo] = {}
        self._buckets = RawEvents(self._reject)  # indexed when asked
        self._records = RawEvents(self._reject)  # indexed as health reads them
        self._raw = (self._buckets, self._records)
        self._forgotten = 0  # ranks superseded so far (a state of the indexes)

    def _watched(self) -> None:
        """A rank's watch came (its info changed): derived state is stale."""

    def update(self) -> bool:
        """Consume new events; True when bucket data changed."""
        if len(self.store) == self._store_length:
            return False
        self._store_length = len(self.store)
        pos = self._position
        buckets, b_end = self.store.since(pos[BUCKET], (BUCKET,))
        iterations, i_end = self.store.since(pos[ITERATION], (ITERATION,))
        watches, w_end = self.store.since(pos[WATCH], (WATCH,))
        if watches:  # rare: a rank watched (again); its events before that are superseded
            changed = self._replay()
        else:
            pos[BUCKET], pos[ITERATION], pos[WATCH] = b_end, i_end, w_end
            changed = self._add(buckets, iterations)
        if changed:
            self.revision += 1
        return changed

    def _add(self, buckets: list[Event], iterations: list[Event]) -> bool:
        # Unread (Note [Lazy bucket events]): cache entries note the counts they saw.
        self._buckets.add(buckets)
        self._records.add(iterations)
        return bool(buckets or iterations)

    def _replay(self) -> bool:
        """Read the log in order from where the first kind stopped: a ``ddp_watch``
        splits its rank's events into superseded (before) and current (after)."""
        start = min(self._position.values())
        events = self.store.events(start)
        changed = False
        batch: dict[str, list[Event]] = {BUCKET: [], ITERATION: []}
        for offset, e in enumerate(events):
            if e.kind not in self._position or start + offset < self._position[e.kind]:
                continue
            if e.kind != WATCH:
                batch[e.kind].append(e)
                continue
            changed |= self._add(batch[BUCKET], batch[ITERATION])
            batch = {BUCKET: [], ITERATION: []}
            changed |= self._watch(e)
        changed |= self._add(batch[BUCKET], batch[ITERATION])
        end = start + len(events)
        self._position = dict.fromkeys(self._position, end)
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
            return msgspec.convert(e.payload, _TYPES[e.kind])
        except (msgspec.ValidationError, TypeError) as err:
            self._skip(e, err)
            return None

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
        return list(map(raw.events.__getitem__, raw.positions(iteration, rank)))
