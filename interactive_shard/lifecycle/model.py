"""LifecycleModel (``run.ddp``): every DDP instance of a run, its settings, hooks,
iterations, collectives by purpose, the checks that fired and advice from what was seen.

Consumes the ``lifecycle_*`` events of a ``RunStore`` (``events.py``, ``docs/events.md``)
with a cursor, so it serves a live run and a loaded recording alike. No widgets, no torch.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

import msgspec

from interactive_shard import features
from interactive_shard.lifecycle.events import (
    Collective,
    LifecycleCheck,
    LifecycleIteration,
    LifecycleWatch,
)
from interactive_shard.telemetry.consume import Cursor
from interactive_shard.telemetry.store import RunStore
from interactive_shard.ui.live import ShowsView

# Collective.caller -> the purpose the view and `collectives()` report.
PURPOSES = {
    "reducer": "gradients",
    "sync_buffers": "buffers",
    "ddp_init": "construction",
    "delayed_all_reduce": "delayed",
}
PURPOSE_ORDER = ("gradients", "buffers", "construction", "delayed", "other")
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


@dataclass
class Instance:
    """One DDP object on one rank, in creation order (``serial``)."""

    serial: int
    rank: int
    watch: LifecycleWatch
    iterations: list[Iteration] = field(default_factory=list)
    # A new probe (ish.watch again after a detach) counts iterations from 1 again; its
    # indices are shifted past the history (``offset``), decided by the first index seen
    # after the watch: one not past ``rewatched`` (the last index then) is a restart.
    offset: int = 0
    rewatched: int | None = None

    def shift(self, index: int) -> int:
        """``index`` as the probe sent it -> this instance's history index."""
        if self.rewatched is not None and index >= 1:
            if index <= self.rewatched:
                self.offset = self.rewatched
            self.rewatched = None
        return index + self.offset if index >= 1 else index

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

    def iteration(self, index: int) -> Iteration | None:
        return next((it for it in self.iterations if it.index == index), None)


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
        self._events = Cursor(store, _DECODE)
        self._instances: dict[tuple[int, int], Instance] = {}  # (rank, serial)
        self._checks: list[tuple[int, LifecycleCheck]] = []

    # -- consuming events --------------------------------------------------------------------
    def update(self) -> bool:
        changed = False
        for rank, kind, record in self._events.take():
            try:
                self._consume(rank, record)
            except ValueError as err:
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
        if isinstance(record, LifecycleWatch):
            known = self._instances.get((rank, record.ddp))
            if known is None:
                self._instances[(rank, record.ddp)] = Instance(record.ddp, rank, record)
            else:  # watched again in a later run: new settings and hooks, same history
                known.watch = record
                known.rewatched = max((i.index for i in known.iterations), default=0)
            return
        here = self._instances.get((rank, record.ddp))
        if isinstance(record, LifecycleCheck):
            if here is not None:
                index = here.shift(record.iteration)
                record = msgspec.structs.replace(record, iteration=index)
            self._checks.append((rank, record))
            return
        if here is None:
            raise ValueError(f"lifecycle_iteration of DDP instance {record.ddp} before its watch")
        index = here.shift(record.iteration)
        it = here.iteration(index)
        if it is None:
            it = Iteration(index, delayed_names=list(here.watch.delayed))
            here.iterations.append(it)
            here.iterations.sort(key=lambda i: i.index)
        it.forwards += record.forwards
        it.dropped += record.dropped
        it.backward |= record.backward
        if record.finished is not None:
            it.finished = record.finished
        it.waited_for += record.unready
        it.ready += record.ready
        it.collectives += [_observed(c, rank, index) for c in record.collectives]
        if record.walk_s is not None:
            it.walk_s = (it.walk_s or 0.0) + record.walk_s
        it.steps_in_backward += record.steps_in_backward

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
        """Bytes this rank sent per purpose, in ``PURPOSE_ORDER``."""
        found = dict.fromkeys(PURPOSE_ORDER, 0)
        for c in self.collectives(rank, ddp):
            found[c.purpose] += c.nbytes
        return found

    @property
    def findings(self) -> list[Finding]:
        """The checks that fired (one per kind, instance and iteration, ranks merged),
        then the advice: is ``static_graph=True`` safe, what ``find_unused_parameters``
        costs."""
        self.update()
        merged: dict[tuple[str, int, int], tuple[list[int], LifecycleCheck]] = {}
        for rank, check in self._checks:
            key = (check.check, check.ddp, check.iteration)
            ranks = merged.setdefault(key, ([], check))[0]
            if rank not in ranks:
                ranks.append(rank)
        out = [
            Finding(kind, it, sorted(ranks), list(c.fqns), c.message, "error", ddp)
            for (kind, ddp, it), (ranks, c) in merged.items()
        ]
        for inst in self.instances:
            out += _advice(inst)
        return out

    # -- plumbing ----------------------------------------------------------------------------
    def _view(self) -> Any:
        return features.feature_of_model(self).view_of(self)

    def __repr__(self) -> str:
        insts = self.instances
        its = sum(len(i.iterations) for i in insts)
        return (
            f"LifecycleModel(ranks={self.ranks}, instances={len(insts)}, iterations={its}, "
            f"findings={len(self.findings)})"
        )


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
    """Advice from the iterations seen (2 or more, each with a finished backward)."""
    done = [it for it in inst.iterations if it.backward]
    out: list[Finding] = []
    if len(done) < 2:
        return out
    ready = [tuple(it.ready) for it in done[1:]]  # the first iteration's order may differ
    single = all(it.forwards == 1 for it in done)
    if not inst.watch.static_graph and len(set(ready)) == 1 and ready[0] and single:
        out.append(
            Finding(
                "static_graph_safe",
                None,
                [inst.rank],
                [],
                f"DDP instance {inst.serial}: the same {len(ready[0])} parameters became ready "
                f"in the same order in iterations {done[1].index}..{done[-1].index}, one "
                "forward each: static_graph=True would be safe (DDP then skips its per-"
                "iteration bookkeeping).",
                "info",
                inst.serial,
            )
        )
    walks = [it.walk_s for it in done if it.walk_s is not None]
    if inst.watch.find_unused_parameters and walks:
        ms = statistics.median(walks) * 1e3
        unused = sorted({f for it in done for f in it.waited_for})
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
