"""The timeline model's index of raw ``timeline_spans`` events: per rank, per iteration,
undecoded, as log positions (``_ranks.py``, on the shared ``IterationIndex``).

A long run sends one batch per rank and iteration (100k events for 50k iterations on 2
ranks, ~17 spans each); decoding all of them as they arrive would cost seconds, and a
screen shows one iteration at a time. So an update only files each new event under its
(rank, iteration), and the model decodes an iteration's batches when something asks for
it: a batch whose spans turn out malformed is counted then (``TimelineModel.skipped``).

Note (filing without touching the events)
-----------------------------------------
Background: each event lies in memory next to its spans, far from the next one, so any
pass over 100k of them (even reading ``e.rank``) misses the cache on each: reading them
was most of an update (183 of 255 ms at 100k). Algorithm: the store keeps every event's
rank and step as numpy columns (filled while the events were hot); a rank whose watch
says ``step_is_iteration`` has its batches filed from those alone, in numpy, holding log
positions (``RankEvents.file``); the decoder checks the payload's iteration agrees when
it reads the batch. Caveats: recordings from before that field (the iteration only in
the payload) and batches of a rank not yet watched are read one by one, as before; a
rank that does not fit the rank column (-1 there: made in Python) is read from its
events too, so it is filed under its real rank."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from interactive_shard.telemetry.iteration_index import IterationIndex, by_rank
from interactive_shard.telemetry.schema import Event
from interactive_shard.telemetry.store import RunStore
from interactive_shard.timeline._ranks import RankEvents
from interactive_shard.timeline.events import TimelineSpans, TimelineWatch

WATCH = TimelineWatch.KIND
SPANS = TimelineSpans.KIND
_NO_RANK = -1  # the rank column's value for a rank that does not fit it


class Index:
    """Every rank's ``RankEvents`` (``IterationIndex``); ``update`` files what arrived
    since the last one (watches restart a rank)."""

    def __init__(self, store: RunStore, decode: Callable[[Event], Any | None]) -> None:
        self.store = store
        self.position = 0  # where the next update starts in the store's log
        self._filed = IterationIndex(lambda: RankEvents(store.at))
        self.ranks = self._filed.ranks
        self._decode = decode  # a cursor's: None (counted) when the event does not fit

    def iterations(self) -> list[int]:
        """Iterations with a batch on any rank, ascending."""
        return self._filed.iterations()

    def update(self) -> bool:
        """File the batches and watches stored since the last update, in log order:
        True when any was filed."""
        store = self.store
        spans, end = store.positions(self.position, (SPANS,))
        watches, _ = store.positions(self.position, (WATCH,))
        watches = watches[watches < end]  # arrived after ``end``: the next update's
        self.position = end
        changed = False
        cuts = spans.searchsorted(watches).tolist()
        start = 0
        for at, cut in zip(watches.tolist(), cuts, strict=True):  # rare: restarts a rank
            changed = self._file(spans[start:cut]) or changed
            changed = self._add_watch(store.at([at])[0]) or changed
            start = cut
        return self._file(spans[start:]) or changed

    def _file(self, positions: np.ndarray) -> bool:
        """File the batches at ``positions`` (no watch among them), rank by rank."""
        if not len(positions):
            return False
        ranks, steps = self.store.columns(positions)
        changed = False
        slow: list[int] = []
        for rank, picked in by_rank(ranks):
            at, its = positions[picked], steps[picked]
            here = self.ranks.get(rank)
            if rank == _NO_RANK or here is None or not here.by_step:
                slow += at.tolist()
                continue
            good = its >= 1
            if not good.all():  # refused: counted when malformed (decoding says why)
                for event in self.store.at(at[~good]):
                    self._decode(event)
                at, its = at[good], its[good]
            changed = self._filed.file(rank, its, at) or changed
        if slow:
            slow.sort()
            changed = self._file_events(slow) or changed
        return changed

    def _file_events(self, positions: list[int]) -> bool:
        """File batches by reading them: the payload's ``iteration`` (or the step, for
        a rank that files by step but does not fit the rank column). A rank with no
        watch is known once a batch of it is filed."""
        filing: dict[int, tuple[list[int], list[int]]] = {}
        refused: list[Event] = []
        for at, event in zip(positions, self.store.at(positions), strict=True):
            here = self.ranks.get(event.rank)
            if here is not None and here.by_step:
                it = event.step
            else:
                try:
                    it = event.payload["iteration"]
                except (KeyError, TypeError):
                    refused.append(event)
                    continue
            if type(it) is not int or it < 1:
                refused.append(event)
                continue
            mine = filing.get(event.rank)
            if mine is None:
                mine = filing[event.rank] = ([], [])
            mine[0].append(it)
            mine[1].append(at)
        changed = False
        for rank, (its, where) in filing.items():
            filed = np.array(its, dtype=np.int64), np.array(where, dtype=np.int64)
            changed = self._filed.file(rank, *filed) or changed
        for event in refused:  # counted as malformed (decoding says why)
            self._decode(event)
        return changed

    def _add_watch(self, event: Event) -> bool:
        record = self._decode(event)
        if not isinstance(record, TimelineWatch):
            return False
        here = self.ranks.get(event.rank)
        if here is None or here.watch is not None or len(here):  # watched again: start over
            here = self._filed.restart(event.rank)
        here.watch = record
        return True
