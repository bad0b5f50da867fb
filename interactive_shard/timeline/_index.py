"""The timeline model's index of raw ``timeline_spans`` events: per rank, per iteration,
undecoded, as log positions (``_ranks.py``).

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

from interactive_shard.telemetry._columns import Column
from interactive_shard.telemetry.schema import Event
from interactive_shard.telemetry.store import RunStore
from interactive_shard.timeline._ranks import RankEvents
from interactive_shard.timeline.events import TimelineSpans, TimelineWatch

WATCH = TimelineWatch.KIND
SPANS = TimelineSpans.KIND
_NO_RANK = -1  # the rank column's value for a rank that does not fit it
_FEW_RANKS = 8  # ranks in one update filed by a mask each (more: by one sort)


class Index:
    """Every rank's ``RankEvents``; ``update`` files what arrived since the last one
    (watches restart a rank)."""

    def __init__(self, store: RunStore, decode: Callable[[Event], Any | None]) -> None:
        self.store = store
        self.position = 0  # where the next update starts in the store's log
        self.ranks: dict[int, RankEvents] = {}
        self._decode = decode  # a cursor's: None (counted) when the event does not fit
        self._every = Column(np.int64, capacity=64)  # iterations of any rank, ascending
        self._every_list: list[int] | None = []  # the same as ints (None: stale)

    def iterations(self) -> list[int]:
        """Iterations with a batch on any rank, ascending: kept up to date as batches
        are filed, merged again only after a rank restarted or a late batch."""
        if self._every_list is None:
            arrays = [r.array() for r in self.ranks.values()]
            merged = np.unique(np.concatenate(arrays)) if arrays else np.empty(0, np.int64)
            self._every.replace(merged)
            self._every_list = merged.tolist()
        return self._every_list

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
        low, high = int(ranks.min()), int(ranks.max())
        if high - low < _FEW_RANKS:  # a pass per rank (a mask) beats a sort of them all
            picks = [np.flatnonzero(ranks == r) for r in range(low, high + 1)]
            groups = [(low + k, positions[p], steps[p]) for k, p in enumerate(picks) if len(p)]
        else:
            order = np.argsort(ranks, kind="stable")  # stable: each rank's in log order
            sorted_ranks = ranks[order]
            cuts = (np.flatnonzero(sorted_ranks[1:] != sorted_ranks[:-1]) + 1).tolist()
            bounds = list(zip([0, *cuts], [*cuts, len(order)], strict=True))
            groups = [
                (int(sorted_ranks[a]), positions[order[a:b]], steps[order[a:b]]) for a, b in bounds
            ]
        changed = False
        slow: list[int] = []
        for rank, at, its in groups:
            here = self.ranks.get(rank)
            if rank == _NO_RANK or here is None or not here.by_step:
                slow += at.tolist()
                continue
            good = its >= 1
            if not good.all():  # refused: counted when malformed (decoding says why)
                for event in self.store.at(at[~good]):
                    self._decode(event)
                at, its = at[good], its[good]
            changed = self._filed(here, its, at) or changed
        if slow:
            slow.sort()
            changed = self._file_events(slow) or changed
        return changed

    def _file_events(self, positions: list[int]) -> bool:
        """File batches by reading them: the payload's ``iteration`` (or the step, for
        a rank that files by step but does not fit the rank column)."""
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
            here = self.ranks.get(rank)
            if here is None:  # a rank with no watch: known once a batch of it is filed
                here = self.ranks[rank] = RankEvents(self.store.at)
            filed = np.array(its, dtype=np.int64), np.array(where, dtype=np.int64)
            changed = self._filed(here, *filed) or changed
        for event in refused:  # counted as malformed (decoding says why)
            self._decode(event)
        return changed

    def _filed(self, here: RankEvents, its: np.ndarray, at: np.ndarray) -> bool:
        """File one rank's batches and note its new iterations: True when any."""
        if not len(its):
            return False
        self._note(here.file(its, at))
        return True

    def _add_watch(self, event: Event) -> bool:
        record = self._decode(event)
        if not isinstance(record, TimelineWatch):
            return False
        here = self.ranks.get(event.rank)
        if here is None or here.watch is not None or len(here):  # watched again: start over
            if here is not None and len(here):
                self._every_list = None  # its iterations may be no other rank's
            here = self.ranks[event.rank] = RankEvents(self.store.at)
        here.watch = record
        return True

    def _note(self, new: np.ndarray) -> None:
        """Add ``new`` (one rank's new iterations, ascending) to the iterations of any
        rank. The common cases: all beyond the known (the rank ahead), none new (the
        others); else merged when next asked."""
        if self._every_list is None or not len(new):
            return
        every = self._every.view()
        if len(every) and new[0] <= every[-1]:
            at = np.minimum(every.searchsorted(new), len(every) - 1)
            new = new[every[at] != new]
            if not len(new):
                return
            if new[0] <= every[-1]:
                self._every_list = None  # out of order: merged when asked
                return
        self._every.extend(new, len(new))
        self._every_list.extend(new.tolist())
