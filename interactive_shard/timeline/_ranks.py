"""One rank's batches of ``timeline_spans``, filed by iteration as log positions in the
shared index (``telemetry/iteration_index.py``), with the rank's watch: ``_index.py``
keeps one per rank.

Positions, not events: an Event lies far from the next in memory, so touching 100k of
them (even one field) misses the cache on each; the store's columns give each event's
rank and step without touching it, and a batch is fetched (``store.at``) only when its
iteration is read."""

from __future__ import annotations

from collections.abc import Callable

from interactive_shard.telemetry.iteration_index import RankIterations
from interactive_shard.telemetry.schema import Event
from interactive_shard.timeline.events import TimelineWatch

Fetch = Callable[[list[int]], list[Event]]


def _nothing(_: list[int]) -> list[Event]:
    return []


class RankEvents(RankIterations):
    """One rank's watch and its batches (``RankIterations``: log positions by iteration).
    ``checked`` counts an iteration's batches already decoded (and counted)."""

    __slots__ = ("_fetch", "checked", "watch")

    def __init__(self, fetch: Fetch = _nothing) -> None:
        super().__init__()
        self.watch: TimelineWatch | None = None
        self.checked: dict[int, int] = {}  # iteration -> its batches decoded (and counted)
        self._fetch = fetch

    @property
    def by_step(self) -> bool:
        """Its batches are filed by ``Event.step`` (the watch says it is the iteration)."""
        return self.watch is not None and self.watch.step_is_iteration

    def batches(self, it: int) -> list[Event]:
        return self._fetch(self.positions(it))

    @property
    def spans(self) -> int:
        """Spans received (fetches every batch: for ``repr``)."""
        at = self.all_positions().tolist()
        found = (e.payload.get("spans") for e in self._fetch(at) if isinstance(e.payload, dict))
        return sum(len(spans) for spans in found if type(spans) is list)
