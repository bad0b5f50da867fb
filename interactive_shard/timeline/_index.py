"""The timeline model's index of raw ``timeline_spans`` events: per rank, per iteration,
undecoded.

A long run sends one batch per rank and iteration (100k events for 50k iterations on 2
ranks, ~17 spans each); decoding all of them as they arrive would cost seconds, and a
screen shows one iteration at a time. So an update only files each new event under its
(rank, iteration), the event's ``step`` (the payload's ``iteration`` in recordings from
before ``TimelineWatch.step_is_iteration``), and the model decodes an
iteration's batches when something asks for it: a batch whose spans turn out malformed
is counted then (``TimelineModel.skipped``). Reading the events is the cost that is
left: each lies in memory next to its spans, far from the next one, so the loop reads
each event once and everything else works on what it read."""

from __future__ import annotations

import itertools
import operator
from collections.abc import Callable, Iterator
from typing import Any

from interactive_shard.telemetry.schema import Event
from interactive_shard.timeline.events import TimelineWatch

_generations = itertools.count(1)
WATCH = TimelineWatch.KIND


class RankEvents:
    """One rank's watch and its batches. ``raw`` maps an iteration to its batch, or to
    its batches in arrival order when a flush split it (an Event is not tracked by the
    garbage collector; 100k lists or tuples would be, and its collections would cost
    more than filing them). ``generation`` changes when the rank is watched again, so
    results cached for its earlier spans never match its new ones."""

    __slots__ = ("checked", "generation", "raw", "sorted", "watch")

    def __init__(self) -> None:
        self.watch: TimelineWatch | None = None
        self.raw: dict[int, Event | list[Event]] = {}
        self.generation = next(_generations)
        self.checked: dict[int, int] = {}  # iteration -> its batches decoded (and counted)
        self.sorted: list[int] | None = []  # raw's keys ascending (None: to sort again)

    def iterations(self) -> list[int]:
        """Iterations with a batch, ascending (kept while batches come in order)."""
        if self.sorted is None:
            self.sorted = sorted(self.raw)
        return self.sorted

    def batches(self, iteration: int) -> list[Event]:
        found = self.raw.get(iteration)
        if found is None:
            return []
        return found if isinstance(found, list) else [found]

    def stamp(self, iteration: int) -> tuple[int, int]:
        """Changes whenever the iteration's data does: batches only ever add up."""
        found = self.raw.get(iteration)
        count = 0 if found is None else len(found) if isinstance(found, list) else 1
        return self.generation, count

    def note(self, new: list[int], ascending: bool) -> None:
        """``new`` iterations were filed (``ascending``: in increasing order): after the
        known ones, they are appended, else the next ``iterations()`` sorts them all."""
        known = self.sorted
        if known is None or not new:
            return
        if ascending and (not known or new[0] > known[-1]):
            known.extend(new)
        else:
            self.sorted = None

    @property
    def spans(self) -> int:
        """Spans received (reads every batch's length: for ``repr``)."""
        found = (e.payload.get("spans") for e in self._events())
        return sum(len(spans) for spans in found if type(spans) is list)

    def _events(self) -> Iterator[Event]:
        for found in self.raw.values():
            yield from found if isinstance(found, list) else (found,)


class _Filing:
    """One rank's batches being filed by ``Index.add``."""

    __slots__ = ("by_step", "raw", "size", "split")

    def __init__(self, raw: dict[int, Event | list[Event]], by_step: bool) -> None:
        self.raw = raw
        self.by_step = by_step  # file by Event.step (the watch says it is the iteration)
        self.size = len(raw)  # iterations it had: the ones after are new
        self.split: list[tuple[int, Event]] = []


class Index:
    """Every rank's ``RankEvents``; ``add`` files new events (watches restart a rank)."""

    def __init__(self, decode: Callable[[Event], Any | None]) -> None:
        self.ranks: dict[int, RankEvents] = {}
        self._decode = decode  # a cursor's: None (counted) when the event does not fit
        self._every: list[int] | None = []  # iterations of any rank, ascending (None: stale)
        self._members: set[int] = set()

    def iterations(self) -> list[int]:
        """Iterations with a batch on any rank, ascending: kept up to date as batches
        are filed (while they read hot), sorted again only after a rank restarted."""
        if self._every is None:
            self._members = set().union(*(r.raw for r in self.ranks.values()))
            self._every = sorted(self._members)
        return self._every

    def add(self, events: list[Event]) -> bool:
        """File ``events`` (batches and watches, in store order): each batch by its rank
        and iteration, in one loop that reads each event once. A long run's events lie
        far apart in memory (each next to its spans), so reading them is most of the
        cost: the loop does no more than read and file, and what it filed is read back
        from the dicts afterwards (new keys come last, in insertion order). A rank whose
        watch says ``step_is_iteration`` is filed by ``Event.step``, its payload unread
        (a third of the loop's time at 100k batches); the decoder checks the two agree."""
        filing: dict[int, _Filing] = {}
        refused: list[Event] = []
        changed = False
        for event in events:
            if event.kind == WATCH:  # rare: restarts the rank from here on
                changed = self._close(filing.pop(event.rank, None), event.rank) or changed
                changed = self._add_watch(event) or changed
                continue
            mine = filing.get(event.rank)
            if mine is None:
                mine = filing[event.rank] = self._filing(event.rank)
            if mine.by_step:
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
            # A fresh int, not the event's: that one lies next to the event, far from the
            # next one, and every later pass over the new iterations (order, membership,
            # the lists) would miss the cache on each; fresh ones lie together.
            it += 0
            if mine.raw.setdefault(it, event) is not event:
                mine.split.append((it, event))  # a flush split the iteration
        for rank, mine in filing.items():
            changed = self._close(mine, rank) or changed
        for event in refused:  # counted as malformed (decoding says why)
            self._decode(event)
        return changed

    def _filing(self, rank: int) -> _Filing:
        here = self.ranks.get(rank)
        if here is None:  # a rank with no watch: known once a batch of it is filed
            return _Filing({}, False)
        watch = here.watch
        return _Filing(here.raw, watch is not None and watch.step_is_iteration)

    def _close(self, filing: _Filing | None, rank: int) -> bool:
        """Finish filing ``rank``'s batches: its split iterations, and the iterations
        new to it (the keys its dict gained) noted. True when it filed any."""
        if filing is None:
            return False
        raw = filing.raw
        if not raw:
            return False  # every batch refused
        if rank not in self.ranks:
            self.ranks[rank] = RankEvents()
            self.ranks[rank].raw = raw
        new = list(itertools.islice(raw, filing.size, None))
        for it, event in filing.split:  # its batches, in arrival order
            old = raw[it]
            raw[it] = [*old, event] if isinstance(old, list) else [old, event]
        ascending = _ascending(new)
        self.ranks[rank].note(new, ascending)
        self._note(new, ascending)
        return bool(new or filing.split)

    def _add_watch(self, event: Event) -> bool:
        record = self._decode(event)
        if not isinstance(record, TimelineWatch):
            return False
        here = self.ranks.get(event.rank)
        if here is None or here.watch is not None or here.raw:  # watched again: start over
            if here is not None and here.raw:
                self._every = None  # its iterations may be no other rank's
            here = self.ranks[event.rank] = RankEvents()
        here.watch = record
        return True

    def _note(self, new: list[int], ascending: bool) -> None:
        """Add ``new`` (one rank's) to the iterations of any rank. The common cases run
        in C: all new (the rank ahead), none new (the others); ranks a few iterations
        apart (a live run) add the few beyond the last."""
        every, members = self._every, self._members
        if every is None or not new:
            return
        if members.isdisjoint(new):
            fresh = new
        elif members.issuperset(new):
            return
        else:
            fresh = [it for it in new if it not in members]
            ascending = _ascending(fresh)
        members.update(fresh)
        if ascending and (not every or fresh[0] > every[-1]):
            every.extend(fresh)
        else:
            self._every = None  # out of order: sorted when asked


def _ascending(xs: list[int]) -> bool:
    return all(map(operator.lt, xs, xs[1:]))
