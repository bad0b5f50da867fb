"""The bucket map's health findings, kept per iteration and updated with new records.

Most iterations are healthy: every rank got every gradient and holds the same reduced
checksums. That is decided on the raw payloads in C-level passes: each new
``ddp_iteration`` record's ``checksums`` is compared (``==``, a C loop over the dict)
with the first record seen of its iteration, and its ``unready`` list is tested for
emptiness. Only the iterations where that fails (or that had findings) are decoded
and analysed in Python (``analysis.unready_finding`` / ``divergence_finding``), from
all their records. Equal raw dicts decode to equal checksums, so the shortcut never
hides a finding; a record that does not decode is skipped there, as before.
"""

from __future__ import annotations

import itertools
import operator
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from interactive_shard.buckets import analysis
from interactive_shard.buckets._lazy_events import PAYLOAD, RawEvents
from interactive_shard.buckets.analysis import Finding
from interactive_shard.buckets.records import IterationRecord, WatchInfo
from interactive_shard.telemetry.schema import Event

Decode = Callable[[list[Event]], list[IterationRecord | None]]
CHUNK = 512  # records per step when looking with a time budget


class Health:
    """Findings per iteration of the records in a ``RawEvents`` (``ddp_iteration``)."""

    def __init__(self) -> None:
        self.findings: dict[int, list[Finding]] = {}
        self.revision = 0  # grows whenever findings change
        self._seen = 0  # records looked at so far
        self._first: dict[int, Any] = {}  # iteration -> checksums of its first record
        self._listed: tuple[int, list[Finding]] = (-1, [])

    def reset(self) -> None:
        """Look at every record again (the watch info changed, or a rank was forgotten)."""
        self._seen = 0
        self._first.clear()
        if self.findings:
            self.findings.clear()
            self.revision += 1

    def listed(self) -> list[Finding]:
        """Every finding, in iteration order (cached until findings change)."""
        if self._listed[0] != self.revision:
            found = [f for it in sorted(self.findings) for f in self.findings[it]]
            self._listed = (self.revision, found)
        return self._listed[1]

    def pending(self, records: RawEvents) -> int:
        """Records not looked at yet."""
        return len(records) - self._seen

    @property
    def checked(self) -> int:
        """Records looked at so far (in arrival order)."""
        return self._seen

    def update(
        self,
        records: RawEvents,
        info: WatchInfo | None,
        decode: Decode,
        seconds: float | None = None,
    ) -> bool:
        """Look at the new records; with ``seconds``, stop once that much time is spent
        (in steps of ``CHUNK`` records) and go on at the next call. True when none is
        left."""
        deadline = None if seconds is None else time.perf_counter() + seconds
        while self._seen < len(records):
            if deadline is None:
                self._step(records, info, decode, len(records))
            else:
                self._step(records, info, decode, min(len(records), self._seen + CHUNK))
                if time.perf_counter() >= deadline:
                    break
        return self._seen == len(records)

    def _step(self, records: RawEvents, info: WatchInfo | None, decode: Decode, end: int) -> None:
        start = self._seen
        if records.indexed < end:  # the health check is what indexes records
            before = records.indexed
            end = before + len(records.index(upto=end))  # unreadable ones leave the list
        self._seen = end
        alive = records.alive[start:end]
        iterations = records.iterations[start:end][alive]
        events = records.between(start, end)
        if not alive.all():
            events = [e for e, keep in zip(events, alive.tolist(), strict=True) if keep]
        keys = iterations.tolist()
        # The common case in one C-level pass over the records, each payload read while
        # in cache: its checksums equal those of its iteration's first record, and no
        # gradient is unready. ``all`` stops at the first record that fails; then every
        # record is looked at (setdefault again: the rest were not noted yet).
        if all(map(operator.and_, self._agree(keys, events), map(operator.not_, _unready(events)))):
            suspect = np.empty(0, dtype=np.int64)
        else:
            sums = list(_sums(events))
            agree = np.fromiter(
                map(operator.eq, map(self._first.setdefault, keys, sums), sums), bool, len(sums)
            )
            ready = ~np.fromiter(map(bool, _unready(events)), bool, len(sums))
            suspect = np.unique(iterations[~(agree & ready)])
        if self.findings:  # new records of an iteration with findings: look again
            had = [it for it in np.unique(iterations).tolist() if it in self.findings]
            suspect = np.union1d(suspect, np.array(had, dtype=np.int64))
        if len(suspect):
            self._analyse(records, suspect, info, decode)

    def _agree(self, keys: list[int], events: list[Event]) -> Iterator[bool]:
        """Per record: its checksums equal those of the first record of its iteration
        (noted here when it is that first one). Lazy: consumed with the pass above."""
        return map(operator.eq, map(self._first.setdefault, keys, _sums(events)), _sums(events))

    def _analyse(
        self, records: RawEvents, iterations: np.ndarray, info: WatchInfo | None, decode: Decode
    ) -> None:
        """Findings of ``iterations`` from all their live records, decoded."""
        column = records.iterations
        where = np.flatnonzero(np.isin(column, iterations) & records.alive)
        where = where[np.argsort(column[where], kind="stable")]  # arrival order within one
        events = records.at(where)
        decoded = decode(events)
        cuts = np.flatnonzero(np.diff(column[where])) + 1
        order = info.fqns if info is not None else []
        stuck_possible = analysis.reduction_unfinished(info)
        changed = False
        for group in np.split(np.arange(len(where)), cuts):
            if not len(group):
                continue
            it = int(column[where[group[0]]])
            per_rank: dict[int, IterationRecord] = {}
            for i in group.tolist():
                record = decoded[i]
                if record is not None:  # the last record of a rank wins
                    per_rank[events[i].rank] = record
            found = _findings(it, per_rank, info, order, stuck_possible)
            if found:
                self.findings[it] = found
                changed = True
            elif self.findings.pop(it, None) is not None:
                changed = True
        if changed:
            self.revision += 1


def _unready(events: list[Event]) -> Iterator[Any]:
    return map(dict.get, map(PAYLOAD, events), itertools.repeat("unready"))


def _sums(events: list[Event]) -> Iterator[Any]:
    return map(dict.get, map(PAYLOAD, events), itertools.repeat("checksums"))


def _findings(
    it: int,
    per_rank: dict[int, IterationRecord],
    info: WatchInfo | None,
    order: list[str],
    stuck_possible: bool,
) -> list[Finding]:
    unready = analysis.unready_finding(it, {r: x.unready for r, x in per_rank.items()}, info)
    # An unfinished reduction leaves every gradient local, so differing checksums are
    # expected then and the unready finding already explains it.
    divergence = None
    if unready is None or not stuck_possible:
        divergence = analysis.divergence_finding(
            it,
            {r: x.checksums for r, x in per_rank.items()},
            order,
            {f for x in per_rank.values() for f in x.repeated},
        )
    return [f for f in (unready, divergence) if f is not None]
