"""PrecisionModel: the dtypes every FSDP unit (or a DDP model) showed on every rank.

Consumes the ``precision_*`` events of a ``RunStore`` (``events.py``, ``docs/events.md``)
with a cursor, so it serves a live run and a loaded recording alike. A phase's dtype is
what the probe saw in it; a phase that saw several dtypes (a parameter in bf16 in
forward, fp32 in backward) is their distinct dtypes joined with ``", "`` in the order
first seen (``analysis.SEP``), so it differs from any single planned dtype. ``reduce``
is the dtype of the unit's reduce-scatter / all-reduce (and of any ``reduce`` record).
No widgets, no torch.
"""

from __future__ import annotations

import logging
from collections.abc import Hashable, Iterable
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Any

import msgspec

from interactive_shard.precision import analysis
from interactive_shard.precision._batches import Batches, Iteration, Stream
from interactive_shard.precision._findings import Findings
from interactive_shard.precision.analysis import (
    Draft,
    Finding,
    Held,
    Malformed,
    check_watch,
    tree,
    unknown_unit,
)
from interactive_shard.precision.compare import Comparison, Plan, compare_rank, joined
from interactive_shard.precision.events import (
    PrecisionBatch,
    PrecisionCollective,
    PrecisionFailure,
    PrecisionSeen,
    PrecisionWatch,
    Unit,
)
from interactive_shard.telemetry.consume import Cursor
from interactive_shard.telemetry.schema import Event
from interactive_shard.telemetry.store import RunStore
from interactive_shard.ui.live import ShowsView

log = logging.getLogger(__name__)

REDUCTIONS = frozenset({"reduce_scatter", "all_reduce"})
SMALL = 512  # batches not yet read below which the findings read them all
_RANK, _KIND = attrgetter("rank"), attrgetter("kind")


class ObservedFailure(PrecisionFailure, kw_only=True, frozen=True):
    """A rank's ``precision_failure``, with the rank."""

    rank: int


@dataclass
class _Rank:
    batches: Batches
    watch: PrecisionWatch | None = None
    failures: list[ObservedFailure] = field(default_factory=list)
    units: dict[str, Unit] = field(default_factory=dict)
    unknown: dict[str, None] = field(default_factory=dict)  # reported, not in the watch
    tree: list[Unit] | None = None  # units() as a tree, until a unit is added

    @property
    def latest(self) -> int:
        return max(self.batches.latest, max((f.iteration for f in self.failures), default=0))


class PrecisionModel(ShowsView):
    """Observed dtypes of one run (``run.precision``).

    >>> p = run.precision                                   # doctest: +SKIP
    >>> p.observed("layers.0", rank=0, iteration=1)["param"]
    'torch.bfloat16'
    >>> p.cast_inputs("layers.0"), p.compare(ish.plan_precision(model, policies)).matches
    >>> p.findings

    ``plan``: a ``PrecisionPlan`` (``run.precision.plan = ish.plan_precision(...)``): the
    report compares with it, and an observed failure the plan predicted takes the plan's
    fix (the policies it checked, ``Failure.fix``) instead of one read off the error.

    The batches of records are decoded when an iteration they hold is first read (Note
    [Lazy precision batches] in ``_batches.py``): an update costs a pass over the new
    events' ranks, and reading an iteration costs its batches.
    """

    def __init__(self, store: RunStore) -> None:
        self.store = store
        self.revision = 0  # grows whenever precision data arrived; views compare it
        self.plan: Plan | None = None
        # Watches and failures (few) are decoded as they arrive, batches when read.
        self._events = Cursor(store, _DECODE)
        self._version = -1  # the store's version at the last update
        self._stream = Stream(lambda rank: self._here(rank).batches)
        self._ranks: dict[int, _Rank] = {}
        self._findings = Findings()

    # -- consuming events --------------------------------------------------------------------
    def update(self) -> bool:
        """Consume new events; True when precision data changed."""
        if self.store.version == self._version:  # every accessor asks: one length first
            return False
        self._version = self.store.version
        start = self._events.position
        rare, end = self.store.since(start, _RARE)
        new = self._events.take_events()
        if not new:
            return False
        if not rare and (self._events.position == end or not self.store.since(end, _RARE)[0]):
            self._add_batches(new)  # batches only: the common case, no pass over them here
        else:  # in log order: a watch starts its rank over, dropping what came before
            kinds = list(map(_KIND, new))
            at = 0
            for i in [i for i, k in enumerate(kinds) if k != PrecisionBatch.KIND]:
                if at < i:
                    self._add_batches(new[at:i])
                at = i + 1
                self._consume(new[i])
            if at < len(new):
                self._add_batches(new[at:])
        self.revision += 1
        return True

    @property
    def skipped(self) -> int:
        """Events (or records in them) that could not be read: logged, not kept. A batch
        is read when an iteration it holds is (Note [Lazy precision batches])."""
        return self._events.skipped

    def _here(self, rank: int) -> _Rank:
        here = self._ranks.get(rank)
        if here is None:
            here = self._ranks[rank] = _Rank(Batches(rank, self._stream, self._skip_batch))
        return here

    def _skip_batch(self, event: Event, why: object) -> None:
        self._events.skip(event.rank, event.kind, why)

    def _consume(self, event: Event) -> None:
        record = self._events.decode(event)
        if record is None:
            return
        rank = event.rank
        if isinstance(record, PrecisionWatch):
            try:
                check_watch(record)
            except Malformed as err:
                self._events.skip(rank, event.kind, err)
                return
            here = self._here(rank)
            if here.watch is not None or here.batches.any() or here.failures:
                log.info("rank %d: precision_watch again; dropping its earlier events", rank)
                self._findings.forget(rank)
                start = len(self._stream.events)
                batches = Batches(rank, self._stream, self._skip_batch, start=start)
                here = self._ranks[rank] = _Rank(batches)
            here.watch = record
            here.units = {u.fqn: u for u in record.units}
            return
        here = self._here(rank)
        failure = ObservedFailure(**msgspec.structs.asdict(record), rank=rank)
        here.failures.append(failure)
        self._unit_named(here, failure.unit)

    def _add_batches(self, new: list[Event]) -> None:
        self._stream.add(new)  # no pass over them: a rank reads its own when it must

    def _unit_named(self, here: _Rank, fqn: str) -> None:
        if fqn not in here.units and fqn not in here.unknown:
            here.unknown[fqn] = None
            here.tree = None

    def _read(self, rank: int, iteration: int) -> Iteration:
        here = self._rank(rank)
        found = here.batches.read(iteration)
        for fqn in found.units:
            self._unit_named(here, fqn)
        return found

    # -- what was observed -------------------------------------------------------------------
    @property
    def ranks(self) -> list[int]:
        self.update()
        return sorted(self._ranks)

    @property
    def iterations(self) -> list[int]:
        """Iterations any rank reported something of, ascending (1 = the first watched)."""
        self.update()
        self._stream.split_all()  # every rank's batches handed out: ranks found meanwhile too
        found: set[int] = set()
        for r in self._ranks.values():
            found.update(r.batches.iterations())
            found.update(f.iteration for f in r.failures)
        return sorted(found)

    def latest(self, rank: int | None = None) -> int | None:
        """The newest iteration of ``rank`` (None: of any rank); None before any."""
        self.update()
        ranks = self._ranks.values() if rank is None else [self._rank(rank)]
        return max((r.latest for r in ranks), default=0) or None

    def watch(self, rank: int = 0) -> PrecisionWatch | None:
        return self._rank(rank).watch

    def wrapper(self, rank: int = 0) -> str:
        """``fsdp2``, ``fsdp1`` or ``ddp`` (``fsdp2`` before the watch arrived)."""
        w = self.watch(rank)
        return w.wrapper if w is not None else "fsdp2"

    def reduce_rule(self, rank: int = 0) -> str:
        """What FSDP2 reduces in without a ``reduce_dtype`` on the rank's torch
        (``PrecisionWatch.reduce_rule``)."""
        w = self.watch(rank)
        return w.reduce_rule if w is not None else "compute"

    @property
    def world_size(self) -> int:
        watches = [r.watch for r in self._ranks.values() if r.watch is not None]
        return watches[0].world_size if watches else self.store.info.world_size

    def units(self, rank: int = 0) -> list[Unit]:
        """The rank's units as a tree, depth first: root first, children in module order
        (units reported but not in the watch come last, without a parent: those of the
        iterations read so far, the latest always)."""
        here = self._rank(rank)
        if here.latest:
            self._read(rank, here.latest)
        if here.tree is None:
            known = [*here.units.values(), *(unknown_unit(f) for f in sorted(here.unknown))]
            here.tree = tree(known)
        return list(here.tree)

    def unit(self, fqn: str, *, rank: int = 0) -> Unit | None:
        return next((u for u in self.units(rank) if u.fqn == fqn), None)

    def depth(self, fqn: str, *, rank: int = 0) -> int:
        here, n = self._rank(rank).units, 0
        parent = here[fqn].parent if fqn in here else None
        while parent is not None and n < len(here):
            n, parent = n + 1, here[parent].parent if parent in here else None
        return n

    def seen(self, fqn: str, *, rank: int = 0, iteration: int = 1) -> list[PrecisionSeen]:
        """Every record of unit ``fqn`` in ``iteration`` on ``rank``, in arrival order."""
        return list(self._read(rank, iteration).seen.get(fqn, ()))

    def observed(self, fqn: str, *, rank: int = 0, iteration: int = 1) -> dict[str, str]:
        """Phase -> dtype (``"torch.bfloat16"``) of unit ``fqn``; several: joined."""
        found: dict[str, list[str]] = {}
        for s in self.seen(fqn, rank=rank, iteration=iteration):
            found.setdefault(s.phase, []).extend(s.dtypes)
        for c in self.collectives(fqn, rank=rank, iteration=iteration):
            if c.op in REDUCTIONS:
                found.setdefault("reduce", []).append(c.dtype)
        return {p: joined(d) for p, d in found.items() if joined(d)}

    def inputs(self, fqn: str, *, rank: int = 0, iteration: int = 1) -> list[tuple[str, str, bool]]:
        """(before, after, cast) per floating input at the unit's first forward."""
        first = next(
            (s for s in self.seen(fqn, rank=rank, iteration=iteration) if s.phase == "input"), None
        )
        if first is None:
            return []
        before = first.before or first.dtypes
        cast = first.cast or [b != a for b, a in zip(before, first.dtypes, strict=True)]
        return list(zip(before, first.dtypes, cast, strict=True))

    def cast_inputs(self, fqn: str, *, rank: int = 0, iteration: int = 1) -> list[bool]:
        """One per floating input of the unit's first forward in ``iteration``: True when
        the unit cast it, False when the very same tensor passed through."""
        return [c for _, _, c in self.inputs(fqn, rank=rank, iteration=iteration)]

    def collectives(
        self, fqn: str | None = None, *, rank: int = 0, iteration: int = 1
    ) -> list[PrecisionCollective]:
        """The collectives unit ``fqn`` (None: every unit) issued in ``iteration``."""
        found = self._read(rank, iteration).collectives
        if fqn is not None:
            return list(found.get(fqn, []))
        return [c for mine in found.values() for c in mine]

    def content(self, rank: int, iteration: int) -> Hashable:
        """What ``rank`` reported for ``iteration``, without the iteration's number: equal
        for two iterations whose records, failures and units say the same."""
        here = self._rank(rank)
        failed = tuple(
            (f.unit, f.consumer, f.message) for f in here.failures if f.iteration == iteration
        )
        found = self._read(rank, iteration).key()
        return (found, failed, id(here.watch), tuple(here.unknown), self.world_size)

    @property
    def failures(self) -> list[ObservedFailure]:
        """Every rank's failures, by rank then arrival."""
        self.update()
        return [f for r in sorted(self._ranks) for f in self._ranks[r].failures]

    def bytes_held(self, *, rank: int = 0, iteration: int | None = None) -> list[Held]:
        """Bytes each unit holds per category and dtype on ``rank`` (see ``analysis.held``)
        at ``iteration`` (None: the latest)."""
        it = iteration if iteration is not None else self.latest(rank) or 1
        wrapper, size = self.wrapper(rank), self.world_size
        out: list[Held] = []
        for u in self.units(rank):
            out += analysis.held(u, self.observed(u.fqn, rank=rank, iteration=it), wrapper, size)
        return out

    def total_bytes(
        self, *, rank: int = 0, iteration: int | None = None
    ) -> dict[tuple[str, str], int]:
        """(category, dtype) -> bytes over every unit of ``rank``."""
        total: dict[tuple[str, str], int] = {}
        for h in self.bytes_held(rank=rank, iteration=iteration):
            total[(h.category, h.dtype)] = total.get((h.category, h.dtype), 0) + h.nbytes
        return total

    # -- conclusions -------------------------------------------------------------------------
    def compare(
        self, plan: Plan, *, rank: int | None = None, iteration: int | None = None
    ) -> Comparison:
        """Planned vs observed dtypes of every unit and phase both have, on every rank
        (or ``rank``), at ``iteration`` (None: each rank's latest); units on one side
        only and failures planned but not seen (or the reverse) are differences too."""
        self.update()
        ranks = [rank] if rank is not None else sorted(self._ranks)
        if not any(self._rank(r).latest for r in ranks):
            return Comparison(False, ["no rank reported a precision event yet"])
        lines: list[str] = []
        cells: dict[Any, tuple[str, str]] = {}
        compared: dict[int, int] = {}
        for r in ranks:
            it = iteration if iteration is not None else self.latest(r)
            if it is None:
                lines.append(f"rank {r}: nothing observed yet")
                continue
            compared[r] = it
            observed = {u.fqn: self.observed(u.fqn, rank=r, iteration=it) for u in self.units(r)}
            failed = [f for f in self._rank(r).failures if f.iteration == it]
            casts = {u.fqn: self.cast_inputs(u.fqn, rank=r, iteration=it) for u in self.units(r)}
            more, found = compare_rank(r, it, plan, observed, failed, casts)
            lines += more
            cells.update(found)
        return Comparison(not lines, lines, cells, compared)

    @property
    def findings(self) -> list[Finding]:
        """Failures with their fix, policies a unit does not follow, inputs cast twice or
        reaching a unit uncast: merged over ranks and iterations (every iteration is
        read: the first call on a long run decodes it all, later ones what is new)."""
        self.update()
        self._stream.split_all()  # every rank's batches handed out: ranks found meanwhile too
        for rank, here in list(self._ranks.items()):
            for it in sorted({*here.batches.iterations(), *(f.iteration for f in here.failures)}):
                self._check(rank, it)
        return self._findings.merged()

    def findings_read(self, also: Iterable[tuple[int, int]] = ()) -> list[Finding]:
        """The findings of the (rank, iteration)s read so far and of ``also``, merged:
        what a view can afford on a long run (``findings`` reads every iteration). While
        fewer than ``SMALL`` batches are unread, every iteration is read."""
        self.update()
        if len(self._stream.events) <= SMALL + len(self._findings):
            return self.findings
        for rank, it in also:
            if rank in self._ranks and it >= 1:
                self._check(rank, it)
        return self._findings.merged()

    @property
    def findings_count(self) -> int:
        """How many (rank, iteration)s the findings were read from."""
        return len(self._findings)

    def _check(self, rank: int, iteration: int) -> None:
        """Bring the findings of (rank, iteration) up to date. An iteration whose batches
        say what an earlier one's said (compared undecoded, ``Batches.raw_key``) gets its
        findings without being decoded: a long run's iterations repeat one another."""
        here = self._ranks[rank]
        failed = tuple(
            (f.unit, f.consumer, f.message) for f in here.failures if f.iteration == iteration
        )
        planned = id(self.plan) if failed else None  # a plan gives failures their fix
        version: Hashable = (here.batches.version(iteration), failed, len(here.unknown), planned)
        if self._findings.current((rank, iteration), version):
            return
        raw = here.batches.raw_key(iteration)
        content: Hashable = (raw, failed, tuple(here.unknown), id(here.watch), planned)
        if raw is None or not self._findings.known(rank, content):
            self._read(rank, iteration)  # may name units the watch did not
            content = (raw, failed, tuple(here.unknown), id(here.watch), planned)
            version = (here.batches.version(iteration), failed, len(here.unknown), planned)
        self._findings.put(
            (rank, iteration), version, content, lambda: self._drafts(rank, iteration)
        )

    def _drafts(self, rank: int, iteration: int) -> list[Draft]:
        here, wrapper, rule = self._rank(rank), self.wrapper(rank), self.reduce_rule(rank)
        out: list[Draft] = []
        for u in self.units(rank):
            observed = self.observed(u.fqn, rank=rank, iteration=iteration)
            inputs = [
                s for s in self.seen(u.fqn, rank=rank, iteration=iteration) if s.phase == "input"
            ]
            out += analysis.unit_findings(u, wrapper, observed, inputs[:1], reduce_rule=rule)
        outputs = self._read(rank, iteration).outputs
        for f in here.failures:
            if f.iteration == iteration:
                observed = self.observed(f.unit, rank=rank, iteration=iteration)
                unit = here.units.get(f.unit)
                draft = analysis.failure_finding(f, unit, wrapper, observed, outputs)
                out.append(analysis.with_planned_fix(draft, f, self.plan))
        return out

    def _rank(self, rank: int) -> _Rank:
        self.update()
        return self._ranks.get(rank, _EMPTY)

    def __repr__(self) -> str:
        return (
            f"PrecisionModel(ranks={self.ranks}, iterations={len(self.iterations)}, "
            f"failures={len(self.failures)}, skipped={self.skipped})"
        )


_EMPTY = _Rank(Stream().batches_of(-1))
_DECODE: dict[str, type[Any]] = {
    PrecisionWatch.KIND: PrecisionWatch,
    PrecisionBatch.KIND: PrecisionBatch,
    PrecisionFailure.KIND: PrecisionFailure,
}
_RARE = (PrecisionWatch.KIND, PrecisionFailure.KIND)
