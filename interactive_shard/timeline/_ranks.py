"""One rank's batches of ``timeline_spans``, filed by iteration as log positions in
numpy arrays (``RankEvents``): the index ``_index.py`` keeps one per rank.

Positions, not events: an Event lies far from the next in memory, so touching 100k of
them (even one field) misses the cache on each; the store's columns give each event's
rank and step without touching it, and a batch is fetched (``store.at``) only when its
iteration is read."""

from __future__ import annotations

import itertools
from collections.abc import Callable

import numpy as np

from interactive_shard.telemetry._columns import Column
from interactive_shard.telemetry.schema import Event
from interactive_shard.timeline.events import TimelineWatch

_generations = itertools.count(1)
Fetch = Callable[[list[int]], list[Event]]


def _nothing(_: list[int]) -> list[Event]:
    return []


class RankEvents:
    """One rank's watch and its batches: ``iterations()`` ascending, each with the log
    position of its first batch (``first``, aligned), and the later ones of an iteration
    a flush split (``more``, in arrival order: rare). ``generation`` changes when the
    rank is watched again, so results cached for its earlier spans never match its new
    ones; ``checked`` counts an iteration's batches already decoded (and counted)."""

    __slots__ = ("_fetch", "_list", "checked", "first", "generation", "its", "more", "watch")

    def __init__(self, fetch: Fetch = _nothing) -> None:
        self.watch: TimelineWatch | None = None
        self.generation = next(_generations)
        self.checked: dict[int, int] = {}  # iteration -> its batches decoded (and counted)
        self.its = Column(np.int64, capacity=64)
        self.first = Column(np.int64, capacity=64)
        self.more: dict[int, list[int]] = {}
        self._list: list[int] = []  # its as Python ints (what callers iterate)
        self._fetch = fetch

    @property
    def by_step(self) -> bool:
        """Its batches are filed by ``Event.step`` (the watch says it is the iteration)."""
        return self.watch is not None and self.watch.step_is_iteration

    def iterations(self) -> list[int]:
        """Iterations with a batch, ascending (callers do not change the list)."""
        return self._list

    def array(self) -> np.ndarray:
        """``iterations()`` as numpy (a view: do not change it)."""
        return self.its.view()

    def __len__(self) -> int:
        return len(self.its)

    def _find(self, it: int) -> int:
        its = self.its.view()
        i = int(its.searchsorted(it))
        return i if i < len(its) and its[i] == it else -1

    def has(self, it: int) -> bool:
        return self._find(it) >= 0

    def positions(self, it: int) -> list[int]:
        """The log positions of the iteration's batches, in arrival order."""
        i = self._find(it)
        if i < 0:
            return []
        return [int(self.first.view()[i]), *self.more.get(it, ())]

    def batches(self, it: int) -> list[Event]:
        return self._fetch(self.positions(it))

    def stamp(self, it: int) -> tuple[int, int]:
        """Changes whenever the iteration's data does: batches only ever add up."""
        if self._find(it) < 0:
            return self.generation, 0
        return self.generation, 1 + len(self.more.get(it, ()))

    @property
    def spans(self) -> int:
        """Spans received (fetches every batch: for ``repr``)."""
        at = [*self.first.view().tolist(), *itertools.chain.from_iterable(self.more.values())]
        found = (e.payload.get("spans") for e in self._fetch(at) if isinstance(e.payload, dict))
        return sum(len(spans) for spans in found if type(spans) is list)

    def file(self, its: np.ndarray, positions: np.ndarray) -> np.ndarray:
        """File batches: ``its`` (each >= 1) and their ``positions`` (ascending: log
        order), int64. Returns the iterations new to the rank, ascending. Costs what
        arrived in numpy; a Python step only per batch of an iteration already filed."""
        if not len(its):
            return its
        if len(its) == 1 or bool(np.all(its[1:] > its[:-1])):  # the common case: in order
            u_its, u_pos = its, positions
            dup_its = dup_pos = its[:0]
        else:
            order = np.argsort(its, kind="stable")  # stable: an iteration's in log order
            s_its, s_pos = its[order], positions[order]
            head = np.ones(len(s_its), dtype=bool)
            head[1:] = s_its[1:] != s_its[:-1]
            u_its, u_pos, dup_its, dup_pos = s_its[head], s_pos[head], s_its[~head], s_pos[~head]
        known = self.its.view()
        if len(known) and u_its[0] <= known[-1]:  # some may be known already
            at = np.minimum(known.searchsorted(u_its), len(known) - 1)
            old = known[at] == u_its
            if old.any():  # their batches come after the ones filed: arrival order holds
                self._more(u_its[old], u_pos[old])
                u_its, u_pos = u_its[~old], u_pos[~old]
        self._more(dup_its, dup_pos)
        if not len(u_its):
            return u_its
        if not len(known) or u_its[0] > known[-1]:
            self.its.extend(u_its, len(u_its))
            self.first.extend(u_pos, len(u_pos))
            self._list.extend(u_its.tolist())
        else:  # out of order (a late batch): merged, once
            both_its = np.concatenate([known, u_its])
            order = np.argsort(both_its, kind="stable")
            self.first.replace(np.concatenate([self.first.view(), u_pos])[order])
            self.its.replace(both_its[order])
            self._list = self.its.view().tolist()
        return u_its

    def _more(self, its: np.ndarray, positions: np.ndarray) -> None:
        more = self.more
        for it, at in zip(its.tolist(), positions.tolist(), strict=True):
            found = more.get(it)
            if found is None:
                more[it] = [at]
            else:
                found.append(at)
