"""LifecycleModel (``run.ddp``): every DDP instance of a run, its settings, hooks,
iterations, collectives by purpose, the checks that fired and advice from what was seen.

Consumes the ``lifecycle_*`` events of a ``RunStore`` (``events.py``, ``docs/events.md``)
with a cursor, so it serves a live run and a loaded recording alike. No widgets, no torch.

Scale: an update costs what arrived since the last one, in bulk. Each instance keeps
its iterations as numpy columns (``_iteration_columns.IterationTable``: a batch of events merged in
a few numpy calls); the ``Iteration`` objects of ``Instance.iterations`` are built from
them (and the raw events, for the collectives' details) only when read, and cached.
The figures and the view read the columns.

A view's refresh has a budget (``budget``): 100,000 new events cost more to summarise
(~5 us each: their collectives' bytes, ready orders) than a refresh may take. An update
files what arrived at once (``pending`` counts it) and summarises it, in store order, in
chunks of ``CHUNK`` events until the budget is spent (one at least, when new ones came);
the view says how much is left and a poller finishes it between ticks. Outside
``budget`` (``run.ddp``, the report, tests) an update summarises everything: what the
public API returns is always exact.
"""

from __future__ import annotations

from collections import deque
from itertools import compress
from operator import attrgetter
from typing import Any

import msgspec
import numpy as np

from interactive_shard.ddp._instance import SETTINGS as SETTINGS
from interactive_shard.ddp._instance import Finding as Finding
from interactive_shard.ddp._instance import Instance as Instance
from interactive_shard.ddp._instance import Iteration as Iteration
from interactive_shard.ddp._instance import ObservedCollective as ObservedCollective
from interactive_shard.ddp._instance import advice
from interactive_shard.ddp._iteration_columns import PURPOSE_ORDER as PURPOSE_ORDER
from interactive_shard.ddp._iteration_columns import PURPOSES as PURPOSES
from interactive_shard.ddp._iteration_columns import CheckRecord, NamePool, Parts, decode
from interactive_shard.ddp.events import LifecycleCheck, LifecycleIteration, LifecycleWatch
from interactive_shard.telemetry.consume import Budget, Cursor
from interactive_shard.telemetry.schema import Event
from interactive_shard.telemetry.store import RunStore
from interactive_shard.ui.live import ShowsView

_WATCH, _ITERATION, _CHECK = LifecycleWatch.KIND, LifecycleIteration.KIND, LifecycleCheck.KIND
CHUNK = 1024  # events summarised between two looks at the clock (~5 ms) under a budget


class LifecycleModel(ShowsView):
    """DDP lifecycles of one run (``run.ddp``).

    >>> d = run.ddp                                           # doctest: +SKIP
    >>> d.instances[0].settings["static_graph"], d.instances[0].iterations[0].forwards
    >>> [c.purpose for c in d.collectives(rank=0)], [f.kind for f in d.findings]
    """

    def __init__(self, store: RunStore) -> None:
        self.store = store
        self.revision = 0
        self.names = NamePool()  # ready orders and unready sets of every instance
        self._events = Cursor(store, _DECODE)
        self._instances: dict[tuple[int, int], Instance] = {}  # (rank, serial)
        # The checks, merged over ranks, in order of arrival: a Finding per key (check,
        # ddp, iteration), rebuilt at the end of an update for the keys it touched.
        self._checks: list[Finding] = []
        self._merged: dict[tuple[str, int, int], int] = {}  # key -> position
        self._ranks: list[list[int]] = []
        self._first: list[tuple[str, int, Any, str, int]] = []  # the first check's fields
        self._touched: set[int] = set()
        self._advice: tuple[int, list[Finding]] = (-1, [])
        self._undecodable: set[int] = set()  # id() of raw parts whose details failed
        # Events taken from the store, not summarised yet: (events, only parts?) in store
        # order; the first is summarised from ``_backlog_at`` on.
        self._backlog: deque[tuple[list[Event], bool]] = deque()
        self._backlog_at = 0
        self.pending = 0  # events in the backlog: what a budgeted update left
        # A view's refresh sets one (``with model.budget(seconds):``): see ``Budget``.
        self.budget = Budget()

    # -- consuming events --------------------------------------------------------------------
    def update(self) -> bool:
        """Take the new events and summarise them (all of them, outside ``budget``);
        True when anything changed."""
        start = self._events.position
        # A view reads the model a few dozen times a refresh: the store's size says at
        # once whether anything arrived (its per-kind index, a little more).
        events = self._events.take_events() if self.store.version != start else []
        if events:
            # The store's per-kind index says whether watches or checks came too (usually
            # not): if none did, every event is an iteration part, none looked at here.
            mixed = bool(self.store.since(start, (_WATCH, _CHECK))[0])
            self._backlog.append((events, mixed))
            self.pending += len(events)
        # New events: some progress (a chunk, in store order) even when the budget is spent.
        changed = bool(events) and self._summarise()
        while self._backlog and not self.budget.spent:
            changed |= self._summarise()
        self._findings_of_checks()
        if changed:
            self.revision += 1
        return changed

    def _summarise(self) -> bool:
        """The backlog's first events: all of its first entry without a budget, else
        ``CHUNK`` of them (any split summarises alike: parts merge across updates)."""
        events, mixed = self._backlog[0]
        at = self._backlog_at
        end = min(at + CHUNK, len(events)) if self.budget.limited else len(events)
        chunk = events if (at, end) == (0, len(events)) else events[at:end]
        if end == len(events):
            self._backlog.popleft()
            self._backlog_at = 0
        else:
            self._backlog_at = end
        self.pending -= len(chunk)
        if mixed:
            return self._mixed(chunk)
        return self._segment(chunk, np.arange(len(chunk)), [])

    @property
    def skipped(self) -> int:
        """Events (or records in them) that could not be read: logged, not kept."""
        return self._events.skipped

    def _mixed(self, events: list[Event]) -> bool:
        """Events of every kind, in order: between two watches (a watch changes which
        instance a part belongs to, and its shift) the parts in bulk, the checks too."""
        kinds = list(map(attrgetter("kind"), events))
        part = np.fromiter(map(_ITERATION.__eq__, kinds), bool, len(kinds))
        watches = [i for i in np.flatnonzero(~part).tolist() if kinds[i] == _WATCH]
        changed, begin = False, 0
        for end in [*watches, len(events)]:
            changed |= self._between(events[begin:end], part[begin:end], begin)
            record = self._events.decode(events[end]) if end < len(events) else None
            if record is not None:
                self._watch(events[end].rank, record)
                changed = True
            begin = end + 1
        return changed

    def _between(self, events: list[Event], part: Any, offset: int) -> bool:
        """Parts (where ``part``) and checks, no watch among them; ``offset``: the
        position of the first in the batch."""
        checks = list(compress(events, ~part))
        records = self._decode_checks(checks)
        at = np.flatnonzero(~part)
        kept = [
            (int(at[i]) + offset, e.rank, r)
            for i, (e, r) in enumerate(zip(checks, records, strict=True))
            if r is not None
        ]
        return self._segment(list(compress(events, part)), np.flatnonzero(part) + offset, kept)

    def _decode_checks(self, events: list[Event]) -> list[Any]:
        """Check records (gc-free twins of ``LifecycleCheck``: a broken run sends one per
        iteration) in one msgspec call; one by one, skipping, when that fails."""
        try:
            return msgspec.convert([e.payload for e in events], list[CheckRecord])
        except (msgspec.ValidationError, TypeError):
            out: list[Any] = []
            for e in events:
                try:
                    out.append(msgspec.convert(e.payload, CheckRecord))
                except (msgspec.ValidationError, TypeError) as err:
                    self._events.skip(e.rank, e.kind, err)
                    out.append(None)
            return out

    def _segment(self, events: list[Event], at: Any, checks: list[tuple[int, int, Any]]) -> bool:
        """Iteration parts (store order; ``at``: their positions) and the checks among
        them, with no watch in between: the parts go to their instances' tables in bulk.
        Order matters only for an instance watched again, whose first part or check
        decides its shift (``Instance.shift``): both go in position order."""
        parts = decode(events, self._skip_part) if events else None
        adds: list[tuple[int, Instance, Parts]] = []
        if parts is not None and len(parts):
            at = at[parts.cols["at"]]
            for (rank, ddp), sel in _groups(parts.cols["rank"], parts.cols["ddp"]):
                inst = self._instances.get((rank, ddp))
                if inst is None:
                    self._orphans(rank, ddp, len(sel))
                else:
                    adds.append((int(at[sel[0]]), inst, parts.take(sel)))
        adds.sort(key=lambda a: a[0])
        pending = iter(adds)
        nxt = next(pending, None)
        for position, rank, check in checks:
            while nxt is not None and nxt[0] < position:
                nxt[1].add(nxt[2])
                nxt = next(pending, None)
            self._check(rank, check)
        while nxt is not None:
            nxt[1].add(nxt[2])
            nxt = next(pending, None)
        return bool(adds or checks)

    def _skip_part(self, event: Event, why: Exception) -> None:
        self._events.skip(event.rank, event.kind, why)

    def _orphans(self, rank: int, ddp: int, n: int) -> None:
        """Parts of an instance not watched (yet): skipped, one warning for them all."""
        why = f"{n} lifecycle_iteration event(s) of DDP instance {ddp} before its watch"
        self._events.skip(rank, _ITERATION, why)
        self._events.skipped += n - 1

    def _watch(self, rank: int, record: LifecycleWatch) -> None:
        known = self._instances.get((rank, record.ddp))
        if known is None:
            inst = Instance(record.ddp, rank, record, self.names, self._details)
            self._instances[(rank, record.ddp)] = inst
        else:
            known.rewatch(record)

    def _check(self, rank: int, check: Any) -> None:
        """One check merged into the findings (one per kind, instance and iteration)."""
        here = self._instances.get((rank, check.ddp))
        iteration = check.iteration if here is None else here.shift(check.iteration)
        key = (check.check, check.ddp, iteration)
        at = self._merged.get(key)
        if at is None:
            at = self._merged[key] = len(self._ranks)
            self._ranks.append([rank])
            self._first.append((check.check, iteration, check.fqns, check.message, check.ddp))
            self._touched.add(at)
        elif rank not in self._ranks[at]:
            self._ranks[at] = sorted([*self._ranks[at], rank])
            self._touched.add(at)

    def _findings_of_checks(self) -> None:
        """A Finding for each check key this update touched: new objects (the Findings
        handed out before stay as they were); the first check's fqns and message."""
        for at in sorted(self._touched):
            kind, iteration, fqns, message, ddp = self._first[at]
            found = Finding(kind, iteration, self._ranks[at], list(fqns), message, "error", ddp)
            if at < len(self._checks):
                self._checks[at] = found
            else:
                self._checks.append(found)
        self._touched.clear()

    def _details(self, events: list[Event]) -> list[LifecycleIteration | None]:
        """Full records of raw parts (for their collectives), one msgspec call; a part
        whose details do not fit is skipped, and counted once."""
        try:
            whole: list[LifecycleIteration | None]
            whole = msgspec.convert([e.payload for e in events], list[LifecycleIteration])
            return whole
        except (msgspec.ValidationError, TypeError):
            out: list[LifecycleIteration | None] = []
            for e in events:
                try:
                    out.append(msgspec.convert(e.payload, LifecycleIteration))
                except (msgspec.ValidationError, TypeError) as err:
                    if id(e) not in self._undecodable:
                        self._undecodable.add(id(e))
                        self._events.skip(e.rank, e.kind, err)
                    out.append(None)
            return out

    # -- what was observed -------------------------------------------------------------------
    @property
    def ranks(self) -> list[int]:
        self.update()
        return sorted({r for r, _ in self._instances})

    def instances_of(self, rank: int = 0) -> list[Instance]:
        """The DDP instances ``rank`` watched, in creation order."""
        self.update()
        return [i for (r, _), i in sorted(self._instances.items()) if r == rank]

    @property
    def instances(self) -> list[Instance]:
        """The lowest rank's instances (every rank wraps the same models)."""
        ranks = self.ranks
        return self.instances_of(ranks[0]) if ranks else []

    def collectives(self, rank: int = 0, ddp: int | None = None) -> list[ObservedCollective]:
        """Every collective ``rank`` reported: construction syncs, then each iteration's."""
        out: list[ObservedCollective] = []
        for inst in self.instances_of(rank):
            if ddp is None or inst.serial == ddp:
                out += inst.construction
                out += [c for it in inst.iterations for c in it.collectives]
        return sorted(out, key=lambda c: c.start)

    def bytes_by_purpose(self, rank: int = 0, ddp: int | None = None) -> dict[str, int]:
        """Bytes this rank sent per purpose, in ``PURPOSE_ORDER`` (from the columns'
        totals: no collective is built)."""
        found = dict.fromkeys(PURPOSE_ORDER, 0)
        for inst in self.instances_of(rank):
            if ddp is None or inst.serial == ddp:
                for c in inst.construction:
                    found[c.purpose] += c.nbytes
                for purpose, n in zip(PURPOSE_ORDER, inst.table.total.tolist(), strict=True):
                    found[purpose] += n
        return found

    @property
    def checks(self) -> list[Finding]:
        """The checks that fired: one per kind, instance and iteration, ranks merged."""
        self.update()
        return list(self._checks)

    @property
    def findings(self) -> list[Finding]:
        """The checks that fired (one per kind, instance and iteration, ranks merged),
        then the advice: is ``static_graph=True`` safe, what ``find_unused_parameters``
        costs."""
        self.update()
        if self._advice[0] != self.revision:
            self._advice = (self.revision, [f for i in self.instances for f in advice(i)])
        return [*self._checks, *self._advice[1]]

    # -- plumbing ----------------------------------------------------------------------------

    def __repr__(self) -> str:
        insts = self.instances
        its = sum(i.iteration_count for i in insts)
        return (
            f"LifecycleModel(ranks={self.ranks}, instances={len(insts)}, iterations={its}, "
            f"findings={len(self.findings)})"
        )


def _groups(rank: Any, ddp: Any) -> list[tuple[tuple[int, int], Any]]:
    """(rank, ddp) -> the positions of its parts, in order (a sort, not a Python loop)."""
    ranks, rank_code = np.unique(rank, return_inverse=True)
    ddps, ddp_code = np.unique(ddp, return_inverse=True)
    keys, group = np.unique(rank_code * len(ddps) + ddp_code, return_inverse=True)
    order = np.argsort(group, kind="stable")
    split = np.split(order, np.cumsum(np.bincount(group))[:-1])
    pairs = zip((ranks[keys // len(ddps)]).tolist(), (ddps[keys % len(ddps)]).tolist(), strict=True)
    return list(zip(pairs, split, strict=True))


_DECODE: dict[str, type[Any]] = {
    LifecycleWatch.KIND: LifecycleWatch,
    LifecycleIteration.KIND: LifecycleIteration,
    LifecycleCheck.KIND: LifecycleCheck,
}
