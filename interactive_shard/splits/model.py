"""SplitsModel: the partitions DDPOptimizer cut on every rank, and what the planner says.

Consumes the ``split_compile`` / ``split_nothing`` events of a ``RunStore``
(``events.py``, ``docs/events.md``) with a cursor, so it serves a live run and a loaded
recording alike. Every captured compile carries its dynamo graph, so the reference
planner (``plan.py``) can plan it again here for any cap: the what-if of the view and
``compare()`` without a plan. No widgets, no torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import msgspec

from interactive_shard import features
from interactive_shard.splits.compare import Comparison, compare_graph, versus_runtime
from interactive_shard.splits.events import SplitCompile, SplitNothing
from interactive_shard.splits.plan import MIB, GraphPlan, SplitPlan, caps, plan_graph
from interactive_shard.telemetry.consume import Cursor
from interactive_shard.telemetry.schema import Event
from interactive_shard.telemetry.store import RunStore
from interactive_shard.ui.live import ShowsView

KINDS = frozenset({SplitCompile.KIND, SplitNothing.KIND})


class Compilation(SplitCompile, kw_only=True, frozen=True):
    """One DDPOptimizer compile on one rank: its ``split_compile`` event and the rank."""

    rank: int

    @property
    def split(self) -> bool:
        """Whether the graph was cut (one bucket: compiled whole)."""
        return len(self.partitions) > 1


class Nothing(SplitNothing, kw_only=True, frozen=True):
    """A rank's ``split_nothing``: the compiled model compiled nothing."""

    rank: int


_DECODE: dict[str, type[Compilation] | type[Nothing]] = {
    SplitCompile.KIND: Compilation,
    SplitNothing.KIND: Nothing,
}


@dataclass
class _Rank:
    events: list[Event] = field(default_factory=list)  # split_compile, as they arrived
    decoded: dict[int, Compilation | None] = field(default_factory=dict)  # None: unreadable
    nothing: Nothing | None = None


class SplitsModel(ShowsView):
    """Captured and planned graph splits of one run (``run.splits``).

    >>> s = run.splits                               # doctest: +SKIP
    >>> [p.fqns for p in s.compilations(0)[0].partitions]
    >>> s.compare(ish.plan_splits(model, x, bucket_cap_mb=1)).matches

    A compile carries its whole graph (a decode costs about a millisecond): it is decoded
    when first read (``compilation``, ``compilations``), not when it arrives. Positions
    (``compilation``, ``plan``, ``headers``) count the compiles a rank sent; they are the
    positions in ``compilations`` unless one of them could not be read (then skipped and
    counted in ``skipped`` when first read).
    """

    def __init__(self, store: RunStore) -> None:
        self.store = store
        self.revision = 0  # grows whenever split data arrived; views compare it
        self._events = Cursor(store, _DECODE, with_rank=True)
        self._version = -1  # the store's version at the last update
        self._ranks: dict[int, _Rank] = {}
        self._buckets: Any = None  # the run's bucket map, for versus_runtime (incremental)
        self._versus: tuple[Any, ...] | None = None  # (key, lines) of the last versus_runtime

    def update(self) -> bool:
        """Consume new events; True when split data changed."""
        if self.store.version == self._version:  # every accessor asks: one length first
            return False
        self._version = self.store.version
        new = self._events.take_events()
        for e in new:
            here = self._ranks.setdefault(e.rank, _Rank())
            if e.kind == SplitCompile.KIND:
                here.events.append(e)  # decoded when read
            else:
                record = self._events.decode(e)
                if record is None:
                    if not here.events and here.nothing is None:
                        del self._ranks[e.rank]  # a rank known only from an unreadable event
                    continue
                here.nothing = record
        if new:
            self.revision += 1
        return bool(new)

    @property
    def skipped(self) -> int:
        """Events (or records in them) that could not be read: logged, not kept. A compile
        is read when first asked for."""
        return self._events.skipped

    # -- what was captured ----------------------------------------------------------------
    @property
    def ranks(self) -> list[int]:
        self.update()
        return sorted(self._ranks)

    def count(self, rank: int = 0) -> int:
        """How many compiles ``rank`` sent (read or not)."""
        self.update()
        here = self._ranks.get(rank)
        return len(here.events) if here is not None else 0

    def compilation(self, rank: int = 0, position: int = -1) -> Compilation | None:
        """``rank``'s compile at ``position`` (negative: from the newest), decoded once; None
        when there is none there or it could not be read."""
        self.update()
        here = self._ranks.get(rank)
        n = len(here.events) if here is not None else 0
        if here is None or not -n <= position < n:
            return None
        position %= n
        if position not in here.decoded:
            here.decoded[position] = self._events.decode(here.events[position])
        return here.decoded[position]

    def headers(self, rank: int = 0) -> list[tuple[int, int, str] | None]:
        """(index, partitions, backend) of each compile ``rank`` sent, read off the events
        without decoding them (None: not readable so)."""
        self.update()
        here = self._ranks.get(rank)
        return [_header(e.payload) for e in here.events] if here is not None else []

    def compilations(self, rank: int = 0) -> list[Compilation]:
        """Every DDPOptimizer compile of the watched model on ``rank``, in order (each
        decoded once)."""
        found = (self.compilation(rank, i) for i in range(self.count(rank)))
        return [c for c in found if c is not None]

    def nothing(self, rank: int = 0) -> str | None:
        """Why ``rank``'s compiled model compiled nothing (None: it compiled, or has not run)."""
        self.update()
        found = self._ranks.get(rank, _Rank()).nothing
        return None if found is None else found.reason

    def latest(self, rank: int = 0) -> Compilation | None:
        """The newest compile of ``rank`` that could be read."""
        for position in range(self.count(rank) - 1, -1, -1):
            found = self.compilation(rank, position)
            if found is not None:
                return found
        return None

    def content(self, rank: int, position: int) -> bytes:
        """What compile ``position`` of ``rank`` says but for its index and rank (its
        encoding): a recompile storm repeats one compile, and a view then only retitles."""
        comp = self.compilation(rank, position)
        if comp is None:
            return b""
        return msgspec.msgpack.encode(msgspec.structs.replace(comp, index=0, rank=0))

    # -- what the planner says ------------------------------------------------------------
    def plan(
        self,
        rank: int = 0,
        index: int = -1,
        *,
        bucket_cap_mb: float | None = None,
        first_bucket_cap_mb: float | None = None,
    ) -> GraphPlan:
        """Plan a captured compile's graph again (``index``: its position, -1 the newest),
        at its own caps or at the caps given."""
        if not self.count(rank):
            raise LookupError(f"rank {rank} reported no compile yet (ranks with one: {self.ranks})")
        comp = self.compilation(rank, index)
        if comp is None:
            raise LookupError(f"rank {rank}'s compile at {index} could not be read (malformed)")
        if not comp.graph:
            raise LookupError(
                f"rank {rank}'s compile {comp.index} came without its graph (too large for "
                "one telemetry message): it cannot be planned again here"
            )
        cap_mb = comp.bucket_bytes_cap / MIB if bucket_cap_mb is None else bucket_cap_mb
        first_mb = (
            comp.first_bucket_bytes / MIB if first_bucket_cap_mb is None else first_bucket_cap_mb
        )
        cap, first = caps(cap_mb, first_mb)
        return plan_graph(comp.graph, cap, first)

    def compare(
        self, plan: SplitPlan | GraphPlan | None = None, *, rank: int | None = None
    ) -> Comparison:
        """Planned vs captured partitions (count, fqns, bytes, targets, regions).

        ``plan``: from ``ish.plan_splits`` (its graphs are compared with each rank's first
        compiles, in order), one ``GraphPlan``, or None: every captured compile against
        the planner run on its own graph and caps. ``rank``: one rank (default: all).
        """
        self.update()
        ranks = [rank] if rank is not None else sorted(self._ranks)
        if not ranks:
            return Comparison(False, ["no rank reported a compile or a split_nothing yet"])
        differences: list[str] = []
        for r in ranks:
            here = self._ranks.get(r, _Rank())
            differences += _compare_rank(r, self.compilations(r), here.nothing, plan)
        return Comparison(not differences, differences)

    def versus_runtime(self, rank: int = 0) -> list[str]:
        """The compile-time partitions next to DDP's runtime buckets of the same run, in
        words (from the run's bucket map: ``ish.watch`` attaches both)."""
        key = (self.store.version, rank)
        if self._versus is not None and self._versus[0] == key:  # a live view asks every time
            return list(self._versus[1])
        comp = self.latest(rank)
        if comp is None:
            return ["no compile captured yet"]
        if self._buckets is None:  # built once: a live view asks at every refresh
            self._buckets = features.feature("buckets").build_model(self.store)
        buckets = self._buckets
        # The latest iteration whose end-of-backward record arrived: all its buckets are in.
        done = next(
            (i for i in reversed(buckets.iterations) if buckets.record(i, rank) is not None), None
        )
        runtime = buckets.observed(done, rank) if done is not None else []
        info = getattr(buckets, "info", None)
        lines = versus_runtime(comp, runtime, info)
        self._versus = (key, lines)
        return list(lines)


def _compare_rank(
    rank: int,
    compilations: list[Compilation],
    nothing: Nothing | None,
    plan: SplitPlan | GraphPlan | None,
) -> list[str]:
    where = f"rank {rank}"
    if isinstance(plan, SplitPlan) and plan.nothing:
        if nothing is None:
            return [
                f"{where}: the plan says nothing is compiled ({plan.nothing}); the rank compiled"
            ]
        return []
    if nothing is not None and not compilations:
        return [f"{where}: compiled nothing ({nothing.reason})"]
    if not compilations:
        return [f"{where}: no compile captured yet"]
    if plan is None:
        unsent = [c.index for c in compilations if not c.graph]
        if unsent:
            return [f"{where}: compiles {unsent} came without their graph (too large to send)"]
        pairs = [
            (c, plan_graph(c.graph, c.bucket_bytes_cap, c.first_bucket_bytes)) for c in compilations
        ]
    else:
        graphs = plan.graphs if isinstance(plan, SplitPlan) else [plan]
        if len(graphs) > len(compilations):
            return [f"{where}: {len(graphs)} graph(s) planned, {len(compilations)} compiled"]
        pairs = list(zip(compilations, graphs, strict=False))
    out: list[str] = []
    for comp, planned in pairs:
        out += compare_graph(f"{where}, compile {comp.index}", planned, comp)
    return out


def _header(payload: Any) -> tuple[int, int, str] | None:
    """(index, partitions, backend) of a compile's payload, None when they do not read."""
    try:
        index, parts, backend = payload["index"], payload["partitions"], payload["backend"]
    except (KeyError, TypeError):
        return None
    if type(index) is not int or not isinstance(parts, list) or not isinstance(backend, str):
        return None
    return index, len(parts), backend
