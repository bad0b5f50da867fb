"""Events filed by rank and iteration, as numbers (log positions, rows): the one index
every model's per-iteration lookups end in.

Note [One iteration index]
~~~~~~~~~~~~~~~~~~~~~~~~~~

Background: a long run sends 100k events or more of a kind, and a view shows one
iteration of one rank. Touching each event as it arrives (even one field) misses the
cache on each and costs most of a refresh, so no model decodes on arrival: it files
each event under its (rank, iteration) as a number, and fetches and decodes an
iteration's events when one is shown. How a model learns an event's iteration differs
with its events, and stays in the feature: the timeline's batches carry it in the
store's step column (filed in numpy, events untouched), bucket events in their payload
(read in one C-level pass when a walk from the newest does not find it first),
precision batches as a span of iterations, the DDP lifecycle's decoded parts as their
index. What they file is this index.

Algorithm: per rank (``RankIterations``) two numpy columns, iterations ascending
(ties in filing order) and the numbers filed, plus the distinct iterations; an
iteration's numbers are one ``searchsorted`` slice. Filing in order (what probes send)
appends in numpy; a batch that goes back merges once with a stable sort (an
iteration's numbers stay in filing order). ``IterationIndex`` holds every rank's and
keeps the iterations of any rank, merging again only after a restart or a late event.

Caveats: a rank watched again starts over (``restart``: a new ``generation``, so what
was cached of its old events never matches its new ones). The index believes the
iterations it is given: checking them is the feature's (what is filed is >= 1).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

import numpy as np

from interactive_shard.telemetry._columns import Column

_generations = itertools.count(1)
_FEW_RANKS = 8  # ranks in one batch grouped by a mask each (more: by one sort)


class RankIterations:
    """One rank's events by iteration: ``positions(it)`` in filing order, ``iterations()``
    ascending. ``generation`` is new with every instance (a restarted rank)."""

    __slots__ = ("_at", "_its", "_keys", "_list", "generation")

    def __init__(self) -> None:
        self.generation = next(_generations)
        self._its = Column(np.int64, capacity=64)  # one per event, ascending
        self._at = Column(np.int64, capacity=64)  # the number filed with it
        self._keys = Column(np.int64, capacity=64)  # the distinct iterations, ascending
        self._list: list[int] = []  # the same as Python ints (what callers iterate)

    def __len__(self) -> int:
        """Events filed."""
        return len(self._its)

    def iterations(self) -> list[int]:
        """Iterations with an event, ascending (callers do not change the list)."""
        return self._list

    def array(self) -> np.ndarray:
        """``iterations()`` as numpy (a view: do not change it)."""
        return self._keys.view()

    def newest(self) -> int:
        """The highest iteration filed (0: none)."""
        return self._list[-1] if self._list else 0

    def _slice(self, it: int) -> tuple[int, int]:
        its = self._its.view()
        return int(its.searchsorted(it, "left")), int(its.searchsorted(it, "right"))

    def has(self, it: int) -> bool:
        lo, hi = self._slice(it)
        return hi > lo

    def positions(self, it: int) -> list[int]:
        """The numbers filed under ``it``, in filing order."""
        lo, hi = self._slice(it)
        return list(self._at.view()[lo:hi].tolist())

    def between(self, first: int, last: int) -> tuple[np.ndarray, np.ndarray]:
        """(iterations, numbers) of the events of iterations ``first`` to ``last``, by
        iteration, then in filing order."""
        its = self._its.view()
        lo, hi = int(its.searchsorted(first, "left")), int(its.searchsorted(last, "right"))
        return its[lo:hi], self._at.view()[lo:hi]

    def all_positions(self) -> np.ndarray:
        """Every number filed (by iteration, then filing order)."""
        return self._at.view()

    def stamp(self, it: int) -> tuple[int, int]:
        """Changes whenever the iteration's events do (they only ever add up)."""
        lo, hi = self._slice(it)
        return self.generation, hi - lo

    def file(self, its: np.ndarray, positions: np.ndarray) -> np.ndarray:
        """File events: ``its`` and their ``positions`` (aligned int64, in filing order).
        Returns the iterations new to the rank, ascending. Costs numpy only."""
        if not len(its):
            return its[:0]
        known = self._its.view()
        if (not len(known) or its[0] >= known[-1]) and bool(np.all(its[1:] >= its[:-1])):
            self._its.extend(its, len(its))  # the common case: in order
            self._at.extend(positions, len(positions))
            new = _distinct(its)
            if len(known) and new[0] == known[-1]:
                new = new[1:]
            self._keys.extend(new, len(new))
            self._list.extend(new.tolist())
            return new
        # A late event: merged once (stable: an iteration's numbers stay in filing order).
        both = np.concatenate([known, its])
        order = np.argsort(both, kind="stable")
        self._at.replace(np.concatenate([self._at.view(), positions])[order])
        self._its.replace(both[order])
        before = self._keys.view()
        self._keys.replace(_distinct(self._its.view()))
        self._list = self._keys.view().tolist()
        return np.setdiff1d(self._keys.view(), before, assume_unique=True)


R = TypeVar("R", bound=RankIterations)


class IterationIndex(Generic[R]):
    """Every rank's ``RankIterations`` (``make`` creates one: a feature may keep more per
    rank in a subclass), and the iterations of any rank, ascending."""

    def __init__(self, make: Callable[[], R]) -> None:
        self.ranks: dict[int, R] = {}
        self._make = make
        self._every = Column(np.int64, capacity=64)
        self._every_list: list[int] | None = []  # None: merged again when next asked

    def of(self, rank: int) -> R:
        """``rank``'s (created empty when it has none)."""
        found = self.ranks.get(rank)
        if found is None:
            found = self.ranks[rank] = self._make()
        return found

    def restart(self, rank: int) -> R:
        """Start ``rank`` over (watched again): its events so far are no longer filed."""
        old = self.ranks.get(rank)
        if old is not None and len(old):
            self._every_list = None  # its iterations may be no other rank's
        new = self.ranks[rank] = self._make()
        return new

    def file(self, rank: int, its: np.ndarray, positions: np.ndarray) -> bool:
        """File one rank's events (``RankIterations.file``): True when any."""
        if not len(its):
            return False
        self._note(self.of(rank).file(its, positions))
        return True

    def iterations(self) -> list[int]:
        """Iterations with an event on any rank, ascending: kept up to date as events
        are filed, merged again only after a restart or a late event."""
        if self._every_list is None:
            arrays = [r.array() for r in self.ranks.values()]
            merged = np.unique(np.concatenate(arrays)) if arrays else np.empty(0, np.int64)
            self._every.replace(merged)
            self._every_list = merged.tolist()
        return self._every_list

    def array(self) -> np.ndarray:
        """``iterations()`` as numpy (a view: do not change it)."""
        self.iterations()
        return self._every.view()

    def positions(self, rank: int, it: int) -> list[int]:
        found = self.ranks.get(rank)
        return found.positions(it) if found is not None else []

    def ranks_with(self, it: int) -> list[int]:
        """The ranks with an event of ``it``, ascending."""
        return sorted(r for r, here in self.ranks.items() if here.has(it))

    def _note(self, new: np.ndarray) -> None:
        """Add one rank's new iterations (ascending) to those of any rank. The common
        cases: all beyond the known (the rank ahead), none new (the others)."""
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


def by_rank(ranks: np.ndarray) -> Iterator[tuple[int, np.ndarray]]:
    """(rank, the indices of its entries in ``ranks``, ascending) for each rank in it:
    one pass per rank (a mask) for a few, one stable sort for many."""
    if not len(ranks):
        return
    low, high = int(ranks.min()), int(ranks.max())
    if high - low < _FEW_RANKS:
        for r in range(low, high + 1):
            picked = np.flatnonzero(ranks == r)
            if len(picked):
                yield r, picked
        return
    order = np.argsort(ranks, kind="stable")  # stable: each rank's in filing order
    sorted_ranks = ranks[order]
    cuts = (np.flatnonzero(sorted_ranks[1:] != sorted_ranks[:-1]) + 1).tolist()
    for a, b in zip([0, *cuts], [*cuts, len(order)], strict=True):
        yield int(sorted_ranks[a]), order[a:b]


def _distinct(ascending: np.ndarray) -> np.ndarray:
    """The distinct values of an ascending array."""
    head = np.ones(len(ascending), dtype=bool)
    head[1:] = ascending[1:] != ascending[:-1]
    distinct: np.ndarray = ascending[head]
    return distinct
