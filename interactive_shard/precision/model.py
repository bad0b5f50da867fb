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
from dataclasses import dataclass, field
from typing import Any

import msgspec

from interactive_shard import features
from interactive_shard.precision import analysis
from interactive_shard.precision.analysis import (
    Draft,
    Finding,
    Findings,
    Held,
    Malformed,
    aligned,
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
from interactive_shard.telemetry.store import RunStore
from interactive_shard.ui.live import ShowsView

log = logging.getLogger(__name__)

REDUCTIONS = frozenset({"reduce_scatter", "all_reduce"})


class ObservedFailure(PrecisionFailure, kw_only=True, frozen=True):
    """A rank's ``precision_failure``, with the rank."""

    rank: int


@dataclass
class _Rank:
    watch: PrecisionWatch | None = None
    # iteration -> unit -> records, in arrival order
    seen: dict[int, dict[str, list[PrecisionSeen]]] = field(default_factory=dict)
    collectives: dict[int, dict[str, list[PrecisionCollective]]] = field(default_factory=dict)
    failures: list[ObservedFailure] = field(default_factory=list)
    outputs: dict[int, list[tuple[str, list[str]]]] = field(default_factory=dict)
    iterations: set[int] = field(default_factory=set)
    units: dict[str, Unit] = field(default_factory=dict)
    unknown: dict[str, None] = field(default_factory=dict)  # reported, not in the watch
    tree: list[Unit] | None = None  # units() as a tree, until a unit is added
    latest: int = 0


class PrecisionModel(ShowsView):
    """Observed dtypes of one run (``run.precision``).

    >>> p = run.precision                                   # doctest: +SKIP
    >>> p.observed("layers.0", rank=0, iteration=1)["param"]
    'torch.bfloat16'
    >>> p.cast_inputs("layers.0"), p.compare(ish.plan_precision(model, policies)).matches
    >>> p.findings

    ``plan``: a ``PrecisionPlan`` the report compares with (``run.precision.plan = ...``).
    """

    def __init__(self, store: RunStore) -> None:
        self.store = store
        self.revision = 0  # grows whenever precision data arrived; views compare it
        self.plan: Plan | None = None
        self._events = Cursor(store, _DECODE)
        self._ranks: dict[int, _Rank] = {}
        self._findings = Findings()

    # -- consuming events --------------------------------------------------------------------
    def update(self) -> bool:
        """Consume new events; True when precision data changed."""
        changed = False
        for rank, kind, record in self._events.take():
            try:
                self._consume(rank, record)
            except Malformed as err:
                self._events.skip(rank, kind, err)
                continue
            changed = True
        if changed:
            self.revision += 1
        return changed

    @property
    def skipped(self) -> int:
        """Events (or records in them) that could not be read: logged, not kept."""
        return self._events.skipped

    def _consume(self, rank: int, record: Any) -> None:
        if isinstance(record, PrecisionWatch):
            check_watch(record)
        here = self._ranks.setdefault(rank, _Rank())
        if isinstance(record, PrecisionWatch):
            if here.watch is not None or here.iterations:  # watched again: start over
                log.info("rank %d: precision_watch again; dropping its earlier events", rank)
                self._findings.forget(rank)
                here = self._ranks[rank] = _Rank()
            here.watch = record
            here.units = {u.fqn: u for u in record.units}
            return
        if isinstance(record, PrecisionBatch):
            if not all(s.phase != "input" or aligned(s) for s in record.seen):
                raise Malformed("input: dtypes, before and cast differ in length")
            for seen in record.seen:
                self._record(rank, here, seen)
            for collective in record.collectives:
                self._record(rank, here, collective)
        else:
            self._record(rank, here, ObservedFailure(**msgspec.structs.asdict(record), rank=rank))

    def _record(self, rank: int, here: _Rank, record: Any) -> None:
        it = record.iteration
        if isinstance(record, PrecisionSeen):
            here.seen.setdefault(it, {}).setdefault(record.unit, []).append(record)
            if record.phase == "output":
                here.outputs.setdefault(it, []).append((record.unit, record.dtypes))
        elif isinstance(record, PrecisionCollective):
            here.collectives.setdefault(it, {}).setdefault(record.unit, []).append(record)
        else:
            here.failures.append(record)
        here.iterations.add(it)
        here.latest = max(here.latest, it)
        if record.unit not in here.units and record.unit not in here.unknown:
            here.unknown[record.unit] = None
            here.tree = None
        self._findings.dirty(rank, it)

    # -- what was observed -------------------------------------------------------------------
    @property
    def ranks(self) -> list[int]:
        self.update()
        return sorted(self._ranks)

    @property
    def iterations(self) -> list[int]:
        """Iterations any rank reported something of, ascending (1 = the first watched)."""
        self.update()
        return sorted({i for r in self._ranks.values() for i in r.iterations})

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

    @property
    def world_size(self) -> int:
        watches = [r.watch for r in self._ranks.values() if r.watch is not None]
        return watches[0].world_size if watches else self.store.info.world_size

    def units(self, rank: int = 0) -> list[Unit]:
        """The rank's units as a tree, depth first: root first, children in module order
        (units reported but not in the watch come last, without a parent)."""
        here = self._rank(rank)
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
        return list(self._rank(rank).seen.get(iteration, {}).get(fqn, []))

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
        found = self._rank(rank).collectives.get(iteration, {})
        if fqn is not None:
            return list(found.get(fqn, []))
        return [c for mine in found.values() for c in mine]

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
        if not any(self._rank(r).iterations for r in ranks):
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
        reaching a unit uncast: merged over ranks and iterations."""
        self.update()
        return self._findings.merged(self._drafts)

    def _drafts(self, rank: int, iteration: int) -> list[Draft]:
        here, wrapper = self._rank(rank), self.wrapper(rank)
        out: list[Draft] = []
        for u in self.units(rank):
            observed = self.observed(u.fqn, rank=rank, iteration=iteration)
            inputs = [
                s for s in self.seen(u.fqn, rank=rank, iteration=iteration) if s.phase == "input"
            ]
            out += analysis.unit_findings(u, wrapper, observed, inputs[:1])
        outputs = here.outputs.get(iteration, [])
        for f in here.failures:
            if f.iteration == iteration:
                observed = self.observed(f.unit, rank=rank, iteration=iteration)
                unit = here.units.get(f.unit)
                out.append(analysis.failure_finding(f, unit, wrapper, observed, outputs))
        return out

    def _rank(self, rank: int) -> _Rank:
        self.update()
        return self._ranks.get(rank, _EMPTY)

    def _view(self) -> Any:
        return features.feature_of_model(self).view_of(self)

    def __repr__(self) -> str:
        return (
            f"PrecisionModel(ranks={self.ranks}, iterations={len(self.iterations)}, "
            f"failures={len(self.failures)}, skipped={self.skipped})"
        )


_EMPTY = _Rank()
_DECODE: dict[str, type[Any]] = {
    PrecisionWatch.KIND: PrecisionWatch,
    PrecisionBatch.KIND: PrecisionBatch,
    PrecisionFailure.KIND: PrecisionFailure,
}
