"""The ranks' ``precision_batch`` events, kept undecoded and read one iteration at a time.

Note [Lazy precision batches]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~

Background: a batch holds one iteration's records on one rank (about 25 for a small
model, hundreds for a 32-unit one) and decoding it into its Structs costs tens of
microseconds; a long run sends 100k of them, and a view shows one iteration. Even
reading one attribute of each of 100k new events costs tens of milliseconds.

Algorithm: new batches go to one ``Stream`` (every rank, arrival order) untouched,
except the newest batch of each rank, peeked for the rank's latest iteration. A
batch's span is the iterations of the first and last record of its lists: the probe
sends records in the order seen, so a rank's iterations never decrease from record to
record. An iteration's batches are found by walking from the newest batch back (what
a live view shows) or from the oldest forward, ``BUDGET`` batches at most; further in,
the stream hands every batch to its rank's ``Batches`` (one numpy pass over their
ranks) and a binary search over the rank's spans finds them; ``iterations()`` files
them all in the shared index (Note [One iteration index]). Only then are they
decoded, and the iteration's records kept in a small cache (``CACHE`` iterations,
checked against the batches they came from). A batch that does not decode, whose
records leave its span, or whose first or last records cannot be read is skipped and
counted (``skip``) when first met, never before.

Caveats: this relies on a rank's iterations never decreasing from batch to batch
(the probe counts forwards; watching again starts a new ``Batches`` at the watch's
position). A stream that breaks this (a hostile one) may have some of its records not
found; nothing fails. A rank is known from its watch, or from a batch at either end of
an update, or once its batches were handed out.
"""

from __future__ import annotations

import re
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from operator import attrgetter, itemgetter
from typing import Any

import msgspec
import numpy as np

from interactive_shard.precision.analysis import aligned
from interactive_shard.precision.events import (
    PrecisionBatch,
    PrecisionCollective,
    PrecisionSeen,
)
from interactive_shard.telemetry.iteration_index import RankIterations
from interactive_shard.telemetry.schema import Event

CACHE = 64  # decoded iterations kept per rank (a view shows one, a report two)
MAX_SPAN = 64  # iterations one batch may cover (the probe's cover one)
BUDGET = 512  # batches walked from either end before an iteration is searched for
_RANK = attrgetter("rank")
_ENCODE = msgspec.json.Encoder().encode
# A record's "iteration" key and value, as msgspec writes them (a string holding these
# characters is escaped in JSON: its quotes are preceded by backslashes, never matched).
_NUMBERS = re.compile(rb'"iteration":-?\d+')
_BAD = (-1, -1)  # the span of a batch whose first or last records cannot be read


@dataclass
class Iteration:
    """The records one rank reported for one iteration, by unit, in arrival order."""

    seen: dict[str, list[PrecisionSeen]] = field(default_factory=dict)
    collectives: dict[str, list[PrecisionCollective]] = field(default_factory=dict)
    outputs: list[tuple[str, list[str]]] = field(default_factory=list)  # (unit, dtypes)
    units: dict[str, None] = field(default_factory=dict)  # every unit named, first seen first
    _key: tuple[Any, ...] | None = None

    def key(self) -> tuple[Any, ...]:
        """What the records say, without the iteration number: two iterations with one
        key have the same findings and figures."""
        if self._key is None:
            self._key = self._make_key()
        return self._key

    def _make_key(self) -> tuple[Any, ...]:
        seen = tuple(
            (s.unit, s.phase, *s.dtypes, "|", *s.before, "|", *s.cast)
            for mine in self.seen.values()
            for s in mine
        )
        colls = tuple(
            (c.unit, c.op, c.dtype, c.backward) for mine in self.collectives.values() for c in mine
        )
        return (seen, colls, tuple(u for u, _ in self.outputs))


def span(payload: Any) -> tuple[int, int] | None:
    """(first, last) iteration of a batch's records, None for an empty batch, ``_BAD``
    when they cannot be read (or the span is not a plain range of iterations)."""
    try:
        ends: list[Any] = []
        for key in ("seen", "collectives"):
            records = payload.get(key)
            if records:
                ends += (records[0]["iteration"], records[-1]["iteration"])
    except (AttributeError, KeyError, TypeError, IndexError):
        return _BAD
    if not ends:
        return None
    if not all(type(i) is int for i in ends):
        return _BAD
    first, last = min(ends), max(ends)
    return (first, last) if 1 <= first and last - first <= MAX_SPAN else _BAD


class Stream:
    """Every rank's batches in arrival order (``events``), handed out to each rank's
    ``Batches`` only when one needs its own list (``split``): touching 100k new events
    one by one costs more than a view may spend."""

    def __init__(self, batches_of: Callable[[int], Batches] | None = None) -> None:
        self.events: list[Event] = []
        self.split = 0  # events[:split] are in their rank's Batches.own
        self.ranks: dict[int, Batches] = {}  # the current Batches of each rank
        self._made = batches_of  # creates a rank's Batches (and its model state)

    def batches_of(self, rank: int) -> Batches:
        found = self.ranks.get(rank)
        if found is None:
            found = self._made(rank) if self._made is not None else Batches(rank, self, _ignore)
        return found

    def add(self, new: list[Event]) -> None:
        start = len(self.events)
        for event in (new[0], new[-1]):  # a rank without a watch, seen where it is cheap
            self.batches_of(event.rank)
        self.events.extend(new)
        for batches in self.ranks.values():
            batches.newest(start)

    def split_all(self) -> None:
        """Hand every event not yet handed out to its rank (one numpy pass over ranks)."""
        new = self.events[self.split :]
        if not new:
            return
        at = self.split
        self.split = len(self.events)
        ranks = np.array(list(map(_RANK, new)))
        for r in np.unique(ranks).tolist():
            picked = np.flatnonzero(ranks == r)
            batches = self.batches_of(r)
            picked = picked[picked >= batches.start - at]  # before its watch: not its own
            if len(picked):
                got = itemgetter(*picked.tolist())(new)
                batches.own.extend([got] if len(picked) == 1 else got)


class Batches:
    """One rank's batches since its watch (``start``: its first position in the stream):
    ``own`` holds those the stream handed out, the stream's tail the others.

    ``skip(event, why)``: called once per batch found malformed."""

    def __init__(
        self,
        rank: int,
        stream: Stream,
        skip: Callable[[Event, object], None],
        *,
        start: int = 0,
    ) -> None:
        self.rank = rank
        self.stream = stream
        self.start = start  # its first position in the stream (its watch's)
        self.own: list[Event] = []
        self.latest = 0  # the newest batch's last iteration (0: none yet)
        self._skip = skip
        self._spans: list[tuple[int, int] | None] = []  # of own[: len(_spans)]
        self._filed = RankIterations()  # indices into ``own`` by iteration (indexed part)
        self._bad: set[int] = set()  # ids of the batches found malformed
        self._cache: OrderedDict[int, tuple[int, tuple[int, ...], Iteration]] = OrderedDict()
        self._iterations: tuple[int, list[int]] | None = None  # (size, sorted)
        self._found: dict[int, tuple[int, list[Event]]] = {}  # iteration -> (size, batches)
        stream.ranks[rank] = self

    @property
    def size(self) -> int:
        """A number that grows with every batch the stream got (of any rank)."""
        return len(self.stream.events)

    def any(self) -> bool:
        return bool(self.own) or self.latest > 0

    def newest(self, since: int) -> None:
        """Read ``latest`` off this rank's newest readable batch among those from ``since``."""
        events = self.stream.events
        for j in range(len(events) - 1, max(since, self.start) - 1, -1):
            e = events[j]
            if e.rank == self.rank:
                s = span(e.payload)
                if s is not None and s is not _BAD:
                    self.latest = max(self.latest, s[1])
                    return

    # -- finding an iteration's batches -------------------------------------------------------
    def batches(self, iteration: int) -> list[Event]:
        """This rank's batches holding records of ``iteration``, in arrival order."""
        size = self.size
        if self._iterations is not None and self._iterations[0] == size:
            return list(map(self.own.__getitem__, self._filed.positions(iteration)))  # indexed
        hit = self._found.get(iteration)
        if hit is not None and hit[0] == size:
            return hit[1]
        found = self._walk(iteration, back=True)
        if found is None:
            found = self._walk(iteration, back=False)
        if found is None:
            self.stream.split_all()
            found = self._search(iteration)
        if len(self._found) >= CACHE:
            self._found.clear()
        self._found[iteration] = (size, found)
        return found

    def _mine(self, back: bool) -> Iterator[Event]:
        """This rank's batches, newest first (``back``) or oldest first."""
        tail = self.stream.events
        first = max(self.stream.split, self.start)
        if back:
            for j in range(len(tail) - 1, first - 1, -1):
                yield tail[j]
            yield from reversed(self.own)
        else:
            yield from self.own
            for j in range(first, len(tail)):
                yield tail[j]

    def _walk(self, iteration: int, *, back: bool) -> list[Event] | None:
        """The batches of ``iteration`` walking from the newest (or the oldest) batch; None
        when ``BUDGET`` batches did not get there (the iteration lies further in)."""
        out: list[Event] = []
        budget = BUDGET
        for e in self._mine(back):
            budget -= 1
            if budget < 0:
                return None
            if e.rank != self.rank:
                continue
            s = self._span(e)
            if s is None:
                continue
            if (s[1] < iteration) if back else (s[0] > iteration):
                break
            if s[0] <= iteration <= s[1]:
                out.append(e)
        return out[::-1] if back else out

    def _search(self, iteration: int) -> list[Event]:
        """The batches of ``iteration`` in ``own`` (all handed out): a binary search over
        their spans (a rank's iterations never decrease), unreadable ones stepped over."""
        own = self.own
        lo, hi = 0, len(own)
        while lo < hi:
            mid = (lo + hi) // 2
            k, s = mid, self._span(own[mid])
            while s is None and k + 1 < hi:
                k += 1
                s = self._span(own[k])
            if s is None:
                hi = mid  # nothing readable in [mid, hi)
            elif s[1] < iteration:
                lo = k + 1
            else:
                hi = k
        out = []
        for e in own[lo:]:
            s = self._span(e)
            if s is None:
                continue
            if s[0] > iteration:
                break
            out.append(e)
        return out

    def _span(self, e: Event) -> tuple[int, int] | None:
        """The batch's span; None when it has no records or cannot be read (rejected)."""
        s = span(e.payload)
        if s is _BAD:
            self._reject(e, "its records' iterations cannot be read")
            return None
        return s

    def iterations(self) -> list[int]:
        """Every iteration some batch holds records of, ascending (indexes them all)."""
        if self._iterations is None or self._iterations[0] != self.size:
            self.stream.split_all()
            its: list[int] = []
            rows: list[int] = []
            for row in range(len(self._spans), len(self.own)):
                s = self._span(self.own[row])
                self._spans.append(s)
                if s is not None:  # filed under each iteration of its span (mostly one)
                    its += range(s[0], s[1] + 1)
                    rows += [row] * (s[1] - s[0] + 1)
            self._filed.file(np.array(its, dtype=np.int64), np.array(rows, dtype=np.int64))
            self._iterations = (self.size, self._filed.iterations())
        return self._iterations[1]

    # -- reading an iteration -----------------------------------------------------------------
    def raw_key(self, iteration: int) -> tuple[Any, ...] | None:
        """What the batches of ``iteration`` say, compared undecoded: each one's JSON
        without its iterations' numbers (and where ``iteration`` lies in its span). Two
        iterations with one key hold the same records; None when one will not encode.
        (A fifth of a decode: the findings of a long run's repeats cost this much.)"""
        out: list[Any] = []
        for e in self.batches(iteration):
            s = span(e.payload)
            try:
                text = _ENCODE(e.payload)
            except (TypeError, ValueError, OverflowError):
                return None
            out.append((_NUMBERS.sub(b"", text), iteration - s[0] if s and s is not _BAD else 0))
        return tuple(out)

    def version(self, iteration: int) -> tuple[int, ...]:
        """Changes when the batches holding ``iteration`` change."""
        return tuple(id(e) for e in self.batches(iteration) if id(e) not in self._bad)

    def read(self, iteration: int) -> Iteration:
        """The records of ``iteration`` (decoded once, then from the cache)."""
        size = self.size
        hit = self._cache.get(iteration)
        if hit is not None and hit[0] == size:
            self._cache.move_to_end(iteration)
            return hit[2]
        where = self.version(iteration)
        if hit is not None and hit[1] == where:  # new batches, none of this iteration
            self._cache[iteration] = (size, where, hit[2])
            self._cache.move_to_end(iteration)
            return hit[2]
        out = Iteration()
        for e in self.batches(iteration):
            batch = self._decode(e)
            if batch is None:
                continue
            for s in batch.seen:
                if s.iteration == iteration:
                    out.seen.setdefault(s.unit, []).append(s)
                    out.units.setdefault(s.unit)
                    if s.phase == "output":
                        out.outputs.append((s.unit, s.dtypes))
            for c in batch.collectives:
                if c.iteration == iteration:
                    out.collectives.setdefault(c.unit, []).append(c)
                    out.units.setdefault(c.unit)
        self._cache[iteration] = (size, self.version(iteration), out)
        if len(self._cache) > CACHE:
            self._cache.popitem(last=False)
        return out

    def _decode(self, event: Event) -> PrecisionBatch | None:
        if id(event) in self._bad:
            return None
        try:
            batch = msgspec.convert(event.payload, PrecisionBatch)
        except (msgspec.ValidationError, TypeError) as err:
            self._reject(event, err)
            return None
        if not all(s.phase != "input" or aligned(s) for s in batch.seen):
            self._reject(event, "input: dtypes, before and cast differ in length")
            return None
        s = span(event.payload)
        its = [r.iteration for r in batch.seen] + [r.iteration for r in batch.collectives]
        if s is None or s is _BAD or any(not s[0] <= i <= s[1] for i in its):
            self._reject(event, "its records' iterations are out of order")
            return None
        return batch

    def _reject(self, event: Event, why: object) -> None:
        if id(event) not in self._bad:
            self._bad.add(id(event))
            self._cache.clear()  # an iteration read with this batch may have held its records
            self._skip(event, why)


def _ignore(_event: Event, _why: object) -> None:
    pass
