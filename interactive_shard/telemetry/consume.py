"""A feature model's cursor over a RunStore: the new events of its kinds, decoded.

Every model reads the store the same way: from where it stopped, only its kinds (the
store's index per kind: the other kinds cost nothing), each payload through
``msgspec.convert`` into its Struct (which checks types and bounds), a payload that
does not fit skipped, counted and logged, never fatal. ``Cursor`` is that loop, once.

The payloads of one kind are converted in one call (a tenth of a microsecond each,
against a third one at a time); only when that call fails are they converted one by
one, to skip just the ones that do not fit.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from time import perf_counter
from typing import Any

import msgspec

from interactive_shard.telemetry.schema import Event
from interactive_shard.telemetry.store import RunStore

log = logging.getLogger(__name__)


class Cursor:
    """``take()`` returns ``(rank, kind, record)`` for every event of ``decoders``' kinds
    stored since the last call, in store order. ``with_rank``: the event's rank goes into
    the payload as field ``rank`` (Structs that carry it). ``skipped`` counts what did not
    decode, and what the model rejected itself (``skip``). ``take_events()`` returns the
    events undecoded, for a model that decodes only what it shows (``decode``)."""

    def __init__(
        self, store: RunStore, decoders: Mapping[str, type[Any]], *, with_rank: bool = False
    ) -> None:
        self.store = store
        self.decoders = dict(decoders)
        self.with_rank = with_rank
        self.position = 0
        self.skipped = 0
        self._logged: set[str] = set()

    def take_events(self) -> list[Event]:
        """The new events of the cursor's kinds, undecoded."""
        events, self.position = self.store.since(self.position, self.decoders)
        return events

    def take(self) -> list[tuple[int, str, Any]]:
        events, records = self.take_records()
        return [(e.rank, e.kind, r) for e, r in zip(events, records, strict=True)]

    def take_records(self) -> tuple[list[Event], list[Any]]:
        """The new events of the cursor's kinds that decode, and their records (aligned).

        Two lists, not a list of pairs: 100k new events would otherwise make 100k tuples
        the garbage collector tracks, and its collections then cost more than the rest.
        """
        events = self.take_events()
        kinds = set(self.decoders) if len(self.decoders) == 1 else {e.kind for e in events}
        if not events:
            return [], []
        if len(kinds) == 1:
            records = self._convert(kinds.pop(), events)
        else:
            per_kind = {
                k: iter(self._convert(k, [e for e in events if e.kind == k])) for k in kinds
            }
            records = [next(per_kind[e.kind]) for e in events]
        if None in records:  # identity and equality: a record is never equal to None
            kept = [i for i, r in enumerate(records) if r is not None]
            return [events[i] for i in kept], [records[i] for i in kept]
        return events, records

    def decode(self, event: Event) -> Any | None:
        """One event's record, or None (skipped and counted) when it does not fit."""
        try:
            return msgspec.convert(self._payload(event), self.decoders[event.kind])
        except (msgspec.ValidationError, TypeError) as err:
            self.skip(event.rank, event.kind, err)
            return None

    def _payload(self, event: Event) -> Any:
        return {**event.payload, "rank": event.rank} if self.with_rank else event.payload

    def _convert(self, kind: str, events: list[Event]) -> list[Any | None]:
        """The records of ``events`` (all of ``kind``), None where one does not fit."""
        try:
            payloads = (
                [self._payload(e) for e in events]
                if self.with_rank
                else [e.payload for e in events]
            )
            return msgspec.convert(payloads, list[self.decoders[kind]])  # type: ignore[name-defined]
        except (msgspec.ValidationError, TypeError):
            return [self.decode(e) for e in events]

    def skip(self, rank: int, kind: str, why: object) -> None:
        """Count one malformed event (or record) of ``rank``; the first of each kind is
        logged, the others only counted (a flood of bad events must not flood the log)."""
        self.skipped += 1
        if kind not in self._logged:
            self._logged.add(kind)
            log.warning(
                "rank %d: skipped a malformed %s event (the model cannot read it: %s); "
                "later ones are only counted (skipped)",
                rank,
                kind,
                why,
            )


class Budget:
    """How long a model's updates may work: a view's refresh, then its poller, give the
    updates inside ``with model.budget(seconds):`` that long in all, and a model takes
    what the budget leaves for later (its ``pending``) at the next update. Outside a
    budget (the public API, the report, tests) an update reads everything: exact.

    A model spends it in chunks, looking at the clock between two, and reads one chunk
    of new events before it looks: some progress at every update with new events."""

    def __init__(self) -> None:
        self._deadline: float | None = None  # perf_counter() time; None: no budget

    @contextmanager
    def __call__(self, seconds: float) -> Iterator[None]:
        self._deadline = perf_counter() + seconds
        try:
            yield
        finally:
            self._deadline = None

    @property
    def limited(self) -> bool:
        """Inside a budget: work in chunks."""
        return self._deadline is not None

    @property
    def spent(self) -> bool:
        return self._deadline is not None and perf_counter() >= self._deadline
