"""LifecycleModel (``run.ddp``): every DDP instance of a run, its settings, hooks,
iterations, collectives by purpose, the checks that fired and advice from what was seen.

Consumes the ``lifecycle_*`` events of a ``RunStore`` (``events.py``, ``docs/events.md``)
with a cursor, so it serves a live run and a loaded recording alike. No widgets, no torch.

Scale: an update costs what arrived since the last one, in bulk. Each instance keeps
its iterations as numpy columns (``_table.IterationTable``: a batch of events merged in
a few numpy calls); the ``Iteration`` objects of ``Instance.iterations`` are built from
them (and the raw events, for the collectives' details) only when read, and cached.
The figures and the view read the columns.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Any

import msgspec
import numpy as np

from interactive_shard import features
from interactive_shard.lifecycle._table import PURPOSE_ORDER as PURPOSE_ORDER
from interactive_shard.lifecycle._table import PURPOSES as PURPOSES
from interactive_shard.lifecycle._table import IterationTable, NamePool, Parts, decode
from interactive_shard.lifecycle.events import (
    Collective,
    LifecycleCheck,
    LifecycleIteration,
    LifecycleWatch,
)
from interactive_shard.telemetry.consume import Cursor
from interactive_shard.telemetry.schema import Event
from interactive_shard.telemetry.store import RunStore
from interactive_shard.ui.live import ShowsView

log = logging.getLogger(__name__)

SETTINGS = (
    "static_graph",
    "find_unused_parameters",
    "forward_sync_buffers",
    "init_sync_buffers",
    "gradient_as_bucket_view",
    "delayed",
    "hook_param",
    "comm_hook",
    "mixed_precision",
    "optimizer_in_backward",
)
_WATCH, _ITERATION, _CHECK = LifecycleWatch.KIND, LifecycleIteration.KIND, LifecycleCheck.KIND


@dataclass(frozen=True)
class ObservedCollective:
    """One collective of a rank, with what it was for."""

    op: str
    nbytes: int
    purpose: str  # gradients, buffers, construction, delayed, other
    dtype: str
    group: str
    start: float
    end: float | None
    rank: int
    ddp: int | None
    iteration: int  # 0: construction


@dataclass
class Iteration:
    """One backward cycle of one instance on one rank (parts merged)."""

    index: int
    forwards: int = 0
    dropped: int = 0
    backward: bool = False
    finished: bool | None = None
    waited_for: list[str] = field(default_factory=list)  # unready: no gradient came
    ready: list[str] = field(default_factory=list)
    collectives: list[ObservedCollective] = field(default_factory=list)
    walk_s: float | None = None
    steps_in_backward: int = 0
    delayed_names: list[str] = field(default_factory=list)

    @property
    def buffer_bytes(self) -> int:
        return sum(c.nbytes for c in self.collectives if c.purpose == "buffers")

    @property
    def delayed(self) -> list[str]:
        """The delayed parameters, when their all-reduce ran in this iteration."""
        ran = any(c.purpose == "delayed" for c in self.collectives)
        return list(self.delayed_names) if ran else []

    @property
    def delayed_bytes(self) -> int:
        return sum(c.nbytes for c in self.collectives if c.purpose == "delayed")


class Instance:
    """One DDP object on one rank, in creation order (``serial``).

    ``table`` holds its iterations as columns (what the figures read);
    ``iterations`` builds ``Iteration`` objects from it on first read (cached).
    """

    def __init__(self, serial: int, rank: int, watch: LifecycleWatch, model: LifecycleModel):
        self.serial = serial
        self.rank = rank
        self.watches = [watch]  # every watch of it; the last is current
        self.table = IterationTable(model.names)
        self._model = model
        self._built: list[Iteration] = []  # Iteration objects of the first rows
        # A new probe (ish.watch again after a detach) counts iterations from 1 again;
        # its indices are shifted past the history (``offset``), decided by the first
        # index seen after the watch: one not past ``rewatched`` (the last index then)
        # is a restart.
        self.offset = 0
        self.rewatched: int | None = None

    @property
    def watch(self) -> LifecycleWatch:
        return self.watches[-1]

    def rewatch(self, watch: LifecycleWatch) -> None:
        """Watched again in a later run: new settings and hooks, same history."""
        self.watches.append(watch)
        self.rewatched = int(self.table.col("index")[-1]) if len(self.table) else 0

    def shift(self, index: int) -> int:
        """``index`` as the probe sent it -> this instance's history index."""
        if self.rewatched is not None and index >= 1:
            if index <= self.rewatched:
                self.offset = self.rewatched
            self.rewatched = None
        return index + self.offset if index >= 1 else index

    def add(self, parts: Parts) -> None:
        """This instance's parts of a batch (in arrival order, indices as sent)."""
        index = parts.cols["index"]
        index[:] = self.shift(int(index[0])) - int(index[0]) + index
        parts.cols["watch"][:] = len(self.watches) - 1
        self._built[self.table.add(parts) :] = []

    @property
    def settings(self) -> dict[str, Any]:
        return {name: getattr(self.watch, name) for name in SETTINGS}

    @property
    def hooks(self) -> dict[str, int]:
        """fqn -> live DDP hooks on it (Reducer hooks plus the delayed all-reduce's)."""
        return {h.fqn: len(h.reducer) + len(h.delayed) for h in self.watch.hooks}

    @property
    def construction(self) -> list[ObservedCollective]:
        return [_observed(c, self.rank, 0) for c in self.watch.construction]

    @property
    def iteration_count(self) -> int:
        """len(iterations), without building them."""
        return len(self.table)

    @property
    def iterations(self) -> list[Iteration]:
        """Every iteration, in index order (built from the columns when first read)."""
        if len(self._built) < len(self.table):
            self._built += self._build(len(self._built), len(self.table))
        return list(self._built)

    def iteration(self, index: int) -> Iteration | None:
        row = self.table.row(index)
        if row is None:
            return None
        return self._built[row] if row < len(self._built) else self._build(row, row + 1)[0]

    def _build(self, start: int, stop: int) -> list[Iteration]:
        """``Iteration`` objects of rows ``start:stop``, their collectives decoded from
        the raw events (the columns hold only their bytes)."""
        t = self.table
        index = t.col("index")
        low, high = int(index[start]), int(index[stop - 1])
        raw = t.raw_index
        at = np.flatnonzero((raw >= low) & (raw <= high))
        at = at[np.argsort(raw[at], kind="stable")]
        records = self._model._details([t.raw[i] for i in at.tolist()])
        by_index: dict[int, list[ObservedCollective]] = {}
        for i, record in zip(raw[at].tolist(), records, strict=True):
            if record is not None:
                by_index.setdefault(i, []).extend(
                    _observed(c, self.rank, i) for c in record.collectives
                )
        names, cols = (
            t.names.tuples,
            {k: t.col(k)[start:stop].tolist() for k in _BUILT + _BUILT_NAMES},
        )
        out = []
        for k, i in enumerate(cols["index"]):
            finished, walk = cols["finished"][k], cols["walk"][k]
            out.append(
                Iteration(
                    index=i,
                    forwards=cols["forwards"][k],
                    dropped=cols["dropped"][k],
                    backward=cols["backward"][k],
                    finished=None if finished != finished else bool(finished),  # nan: None
                    waited_for=list(names[cols["unready"][k]]),
                    ready=list(names[cols["ready"][k]]),
                    collectives=by_index.get(i, []),
                    walk_s=None if walk != walk else walk,
                    steps_in_backward=cols["steps"][k],
                    delayed_names=list(self.watches[cols["watch"][k]].delayed),
                )
            )
        return out


_BUILT = ("index", "forwards", "dropped", "backward", "finished", "walk", "steps", "watch")
_BUILT_NAMES = ("ready", "unready")


@dataclass(frozen=True)
class Finding:
    """A check that fired (merged over ranks) or advice from what was observed."""

    kind: str  # unfinished, forward_without_backward, double_hooks, static_graph_safe, ...
    iteration: int | None
    ranks: list[int]
    fqns: list[str]
    message: str
    level: str = "error"  # error: a check fired; info: advice
    ddp: int | None = None


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
        self._checks: list[Finding] = []  # merged over ranks, in order of arrival
        self._merged: dict[tuple[str, int, int], int] = {}  # (check, ddp, it) -> position
        self._advice: tuple[int, list[Finding]] = (-1, [])
        self._undecodable: set[int] = set()  # id() of raw parts whose details failed

    # -- consuming events --------------------------------------------------------------------
    def update(self) -> bool:
        start = self._events.position
        events = self._events.take_events()
        if not events:
            return False
        # The store's per-kind index says whether watches or checks came too (usually
        # not): if none did, every event is an iteration part and none is looked at here.
        if self.store.since(start, (_WATCH, _CHECK))[0]:
            changed = self._mixed(events)
        else:
            changed = self._segment(events, np.arange(len(events)), [])
        if changed:
            self.revision += 1
        return changed

    @property
    def skipped(self) -> int:
        """Events (or records in them) that could not be read: logged, not kept."""
        return self._events.skipped

    def _mixed(self, events: list[Event]) -> bool:
        """Events of every kind, in order: iteration parts in bulk between watches
        (a watch changes which instance a part belongs to, and its shift)."""
        kinds = list(map(attrgetter("kind"), events))
        rare = [i for i, k in enumerate(kinds) if k != _ITERATION]
        changed, begin, checks = False, 0, []
        for i in [*rare, len(events)]:
            watch = i < len(events) and kinds[i] == _WATCH
            if i < len(events) and not watch:
                checks.append(i)
                continue
            changed |= self._between(events, begin, i, checks)
            record = self._events.decode(events[i]) if watch else None
            if record is not None:
                self._watch(events[i].rank, record)
                changed = True
            begin, checks = i + 1, []
        return changed

    def _between(self, events: list[Event], begin: int, end: int, checks: list[int]) -> bool:
        """Events ``begin:end``: iteration parts, and checks at positions ``checks``."""
        parts, at, prev = [], [], begin
        for stop in [*checks, end]:
            parts += events[prev:stop]
            at.append(np.arange(prev, stop))
            prev = stop + 1
        decoded = []
        for i in checks:
            record = self._events.decode(events[i])
            if record is not None:
                decoded.append((i, events[i].rank, record))
        return self._segment(parts, np.concatenate(at), decoded)

    def _segment(
        self, events: list[Event], at: Any, checks: list[tuple[int, int, LifecycleCheck]]
    ) -> bool:
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
            self._instances[(rank, record.ddp)] = Instance(record.ddp, rank, record, self)
        else:
            known.rewatch(record)

    def _check(self, rank: int, check: LifecycleCheck) -> None:
        """One check merged into the findings (one per kind, instance and iteration)."""
        here = self._instances.get((rank, check.ddp))
        if here is not None:
            check = msgspec.structs.replace(check, iteration=here.shift(check.iteration))
        key = (check.check, check.ddp, check.iteration)
        at = self._merged.get(key)
        if at is None:
            self._merged[key] = len(self._checks)
            self._checks.append(
                Finding(
                    check.check,
                    check.iteration,
                    [rank],
                    list(check.fqns),
                    check.message,
                    "error",
                    check.ddp,
                )
            )
        elif rank not in (found := self._checks[at]).ranks:
            self._checks[at] = dataclasses.replace(found, ranks=sorted([*found.ranks, rank]))

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
            self._advice = (self.revision, [f for i in self.instances for f in _advice(i)])
        return [*self._checks, *self._advice[1]]

    # -- plumbing ----------------------------------------------------------------------------
    def _view(self) -> Any:
        return features.feature_of_model(self).view_of(self)

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


def _observed(c: Collective, rank: int, iteration: int) -> ObservedCollective:
    return ObservedCollective(
        op=c.op,
        nbytes=c.nbytes,
        purpose=PURPOSES.get(c.caller, "other"),
        dtype=c.dtype,
        group=c.group,
        start=c.start,
        end=c.end,
        rank=rank,
        ddp=c.ddp,
        iteration=iteration,
    )


def _advice(inst: Instance) -> list[Finding]:
    """Advice from the iterations seen (2 or more, each with a finished backward), read
    from the columns (numpy over the whole history: microseconds per thousand)."""
    t = inst.table
    done = np.flatnonzero(t.col("backward"))
    out: list[Finding] = []
    if len(done) < 2:
        return out
    index, names = t.col("index"), t.names.tuples
    ready = t.col("ready")[done[1:]]  # the first iteration's order may differ
    first = names[int(ready[0])]
    single = bool(np.all(t.col("forwards")[done] == 1))
    if not inst.watch.static_graph and bool(np.all(ready == ready[0])) and first and single:
        out.append(
            Finding(
                "static_graph_safe",
                None,
                [inst.rank],
                [],
                f"DDP instance {inst.serial}: the same {len(first)} parameters became ready "
                f"in the same order in iterations {index[done[1]]}..{index[done[-1]]}, one "
                "forward each: static_graph=True would be safe (DDP then skips its per-"
                "iteration bookkeeping).",
                "info",
                inst.serial,
            )
        )
    walks = t.col("walk")[done]
    walks = walks[~np.isnan(walks)]
    if inst.watch.find_unused_parameters and len(walks):
        ms = float(np.median(walks)) * 1e3
        seen = np.unique(t.col("unready")[done]).tolist()
        unused = sorted({f for i in seen for f in names[i]})
        if unused:
            text = f"parameters {unused} were unused, so it is needed (or static_graph=True)"
        else:
            text = "no parameter was ever unused: find_unused_parameters=False saves that"
        out.append(
            Finding(
                "find_unused_cost",
                None,
                [inst.rank],
                unused,
                f"DDP instance {inst.serial}: find_unused_parameters=True walks the autograd "
                f"graph after every forward, {ms:.3g} ms per iteration here; {text}.",
                "info",
                inst.serial,
            )
        )
    return out


_DECODE: dict[str, type[Any]] = {
    LifecycleWatch.KIND: LifecycleWatch,
    LifecycleIteration.KIND: LifecycleIteration,
    LifecycleCheck.KIND: LifecycleCheck,
}
