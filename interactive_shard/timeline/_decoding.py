"""Decoding an iteration's batches when the timeline model reads it, and keeping the
result: the most recently used ``CACHED_ITERATIONS`` (rank, iteration)s, each under the
stamp of the batches it came from (a new batch of it decodes only that batch).

A malformed batch, or a span in one that ends before it starts, is counted once, ever:
``RankEvents.checked`` remembers how many of an iteration's batches were, so decoding
it again after the cache let it go counts nothing twice.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, TypeVar, cast

import msgspec

from interactive_shard.telemetry.consume import Cursor
from interactive_shard.telemetry.schema import Event
from interactive_shard.timeline._iteration import Iteration
from interactive_shard.timeline._ranks import RankEvents
from interactive_shard.timeline._results import TimelineSpan
from interactive_shard.timeline.events import Span, TimelineSpans

T = TypeVar("T")
CACHED_ITERATIONS = 4096  # decoded (rank, iteration)s kept, most recently used
BAD_SPAN = "timeline span (it ends before it starts)"
BAD_STEP = "timeline_spans (its step is not its iteration)"


class Decoded:
    """A (rank, iteration) decoded: its good spans in arrival order and their Iteration,
    under the stamp of the batches they came from; ``aligned`` at one offset."""

    __slots__ = ("aligned", "good", "iteration", "stamp")

    def __init__(self, stamp: tuple[int, int], good: list[Span]) -> None:
        self.stamp = stamp
        self.good = good
        self.iteration = Iteration(good)
        self.aligned: tuple[float, list[TimelineSpan]] | None = None


class Decoder:
    """``get(here, rank, iteration)``: the iteration decoded, from the cache while its
    stamp holds. ``cursor`` counts and logs what does not decode."""

    def __init__(self, cursor: Cursor) -> None:
        self.cursor = cursor
        self.limit = CACHED_ITERATIONS
        self._cache: OrderedDict[tuple[int, int], Decoded] = OrderedDict()

    def get(self, here: RankEvents, rank: int, it: int) -> Decoded:
        stamp, key = here.stamp(it), (rank, it)
        found = self._cache.get(key)
        if found is not None and found.stamp == stamp:
            self._cache.move_to_end(key)
            return found
        batches = here.batches(it)
        good: list[Span] = []
        start = 0
        if found is not None and found.stamp[0] == stamp[0]:  # the same rank, more batches
            good, start = list(found.good), found.stamp[1]
        counted = here.checked.get(it, 0)
        for k in range(start, len(batches)):
            good += self._good_spans(rank, it, batches[k], count=k >= counted)
        if batches:
            here.checked[it] = max(counted, len(batches))
        found = self._cache[key] = Decoded(stamp, good)
        self._cache.move_to_end(key)
        while len(self._cache) > self.limit:
            self._cache.popitem(last=False)
        return found

    def _good_spans(self, rank: int, it: int, event: Event, *, count: bool) -> list[Span]:
        try:
            batch = msgspec.convert(event.payload, TimelineSpans)
        except (msgspec.ValidationError, TypeError) as err:
            if count:
                self.cursor.skip(rank, event.kind, err)
            return []
        if batch.iteration != it:  # filed by a step that is not its iteration
            if count:
                self.cursor.skip(rank, BAD_STEP, f"step {it}, iteration {batch.iteration}")
            return []
        good = [s for s in batch.spans if math.isfinite(s.end) and s.start <= s.end]
        if count and len(good) < len(batch.spans):
            for s in batch.spans:
                if not (math.isfinite(s.end) and s.start <= s.end):
                    self.cursor.skip(rank, BAD_SPAN, s)
        return good


class Memo:
    """``get(key, stamp, build)``: ``build()``, cached under ``key`` while ``stamp``
    stays (the most recently used ``limit`` keys)."""

    def __init__(self, limit: int = CACHED_ITERATIONS) -> None:
        self.limit = limit
        self._cache: OrderedDict[tuple[Any, ...], tuple[Any, Any]] = OrderedDict()

    def get(self, key: tuple[Any, ...], stamp: Any, build: Callable[[], T]) -> T:
        hit = self._cache.get(key)
        if hit is not None and hit[0] == stamp:
            self._cache.move_to_end(key)
            return cast(T, hit[1])
        value = build()
        self._cache[key] = (stamp, value)
        self._cache.move_to_end(key)
        while len(self._cache) > self.limit:
            self._cache.popitem(last=False)
        return value
