"""A feature model's cursor over a RunStore: the new events of its kinds, decoded.

Every model reads the store the same way: from where it stopped, only its kinds, each
payload through ``msgspec.convert`` into its Struct (which checks types and bounds), a
payload that does not fit skipped, counted and logged, never fatal. ``Cursor`` is that
loop, once.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import msgspec

from interactive_shard.telemetry.store import RunStore

log = logging.getLogger(__name__)


class Cursor:
    """``take()`` returns ``(rank, kind, record)`` for every event of ``decoders``' kinds
    stored since the last call. ``with_rank``: the event's rank goes into the payload as
    field ``rank`` (Structs that carry it). ``skipped`` counts what did not decode, and
    what the model rejected itself (``skip``)."""

    def __init__(
        self, store: RunStore, decoders: Mapping[str, type[Any]], *, with_rank: bool = False
    ) -> None:
        self.store = store
        self.decoders = dict(decoders)
        self.with_rank = with_rank
        self.position = 0
        self.skipped = 0

    def take(self) -> list[tuple[int, str, Any]]:
        events = self.store.events(self.position)
        self.position += len(events)
        out: list[tuple[int, str, Any]] = []
        for e in events:
            decode = self.decoders.get(e.kind)
            if decode is None:
                continue
            payload = {**e.payload, "rank": e.rank} if self.with_rank else e.payload
            try:
                out.append((e.rank, e.kind, msgspec.convert(payload, decode)))
            except (msgspec.ValidationError, TypeError) as err:
                self.skip(e.rank, e.kind, err)
        return out

    def skip(self, rank: int, kind: str, why: object) -> None:
        """Count and log one malformed event (or record) of ``rank``."""
        self.skipped += 1
        log.warning("rank %d: skipped a malformed %s event: %s", rank, kind, why)
