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

from interactive_shard import features
from interactive_shard.splits.compare import Comparison, compare_graph, versus_runtime
from interactive_shard.splits.events import SplitCompile, SplitNothing
from interactive_shard.splits.plan import MIB, GraphPlan, SplitPlan, caps, plan_graph
from interactive_shard.telemetry.consume import Cursor
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
    compilations: list[Compilation] = field(default_factory=list)
    nothing: Nothing | None = None


class SplitsModel(ShowsView):
    """Captured and planned graph splits of one run (``run.splits``).

    >>> s = run.splits                               # doctest: +SKIP
    >>> [p.fqns for p in s.compilations(0)[0].partitions]
    >>> s.compare(ish.plan_splits(model, x, bucket_cap_mb=1)).matches
    """

    def __init__(self, store: RunStore) -> None:
        self.store = store
        self.revision = 0  # grows whenever split data arrived; views compare it
        self._events = Cursor(store, _DECODE, with_rank=True)
        self._ranks: dict[int, _Rank] = {}
        self._buckets: Any = None  # the run's bucket map, for versus_runtime (incremental)

    def update(self) -> bool:
        """Consume new events; True when split data changed."""
        changed = False
        for rank, _kind, record in self._events.take():
            here = self._ranks.setdefault(rank, _Rank())
            if isinstance(record, Compilation):
                here.compilations.append(record)
            else:
                here.nothing = record
            changed = True
        if changed:
            self.revision += 1
        return changed

    @property
    def skipped(self) -> int:
        """Events (or records in them) that could not be read: logged, not kept."""
        return self._events.skipped

    # -- what was captured ----------------------------------------------------------------
    @property
    def ranks(self) -> list[int]:
        self.update()
        return sorted(self._ranks)

    def compilations(self, rank: int = 0) -> list[Compilation]:
        """Every DDPOptimizer compile of the watched model on ``rank``, in order."""
        self.update()
        return list(self._ranks.get(rank, _Rank()).compilations)

    def nothing(self, rank: int = 0) -> str | None:
        """Why ``rank``'s compiled model compiled nothing (None: it compiled, or has not run)."""
        self.update()
        found = self._ranks.get(rank, _Rank()).nothing
        return None if found is None else found.reason

    def latest(self, rank: int = 0) -> Compilation | None:
        found = self.compilations(rank)
        return found[-1] if found else None

    # -- what the planner says ------------------------------------------------------------
    def plan(
        self,
        rank: int = 0,
        index: int = -1,
        *,
        bucket_cap_mb: float | None = None,
        first_bucket_cap_mb: float | None = None,
    ) -> GraphPlan:
        """Plan a captured compile's graph again, at its own caps or at the caps given."""
        found = self.compilations(rank)
        if not found:
            raise LookupError(f"rank {rank} reported no compile yet (ranks with one: {self.ranks})")
        comp = found[index]
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
            differences += _compare_rank(r, here, plan)
        return Comparison(not differences, differences)

    def versus_runtime(self, rank: int = 0) -> list[str]:
        """The compile-time partitions next to DDP's runtime buckets of the same run, in
        words (from the run's bucket map: ``ish.watch`` attaches both)."""
        comp = self.latest(rank)
        if comp is None:
            return ["no compile captured yet"]
        if self._buckets is None:  # built once: a live view asks at every refresh
            self._buckets = features.feature("buckets").build_model(self.store)
        buckets = self._buckets
        # The latest iteration whose end-of-backward record arrived: all its buckets are in.
        done = [i for i in reversed(buckets.iterations) if buckets.record(i, rank) is not None]
        runtime = buckets.observed(done[0], rank) if done else []
        info = getattr(buckets, "info", None)
        return versus_runtime(comp, runtime, info)

    def _view(self) -> Any:
        return features.feature_of_model(self).view_of(self)


def _compare_rank(rank: int, here: _Rank, plan: SplitPlan | GraphPlan | None) -> list[str]:
    where = f"rank {rank}"
    if isinstance(plan, SplitPlan) and plan.nothing:
        if here.nothing is None:
            return [
                f"{where}: the plan says nothing is compiled ({plan.nothing}); the rank compiled"
            ]
        return []
    if here.nothing is not None and not here.compilations:
        return [f"{where}: compiled nothing ({here.nothing.reason})"]
    if not here.compilations:
        return [f"{where}: no compile captured yet"]
    if plan is None:
        unsent = [c.index for c in here.compilations if not c.graph]
        if unsent:
            return [f"{where}: compiles {unsent} came without their graph (too large to send)"]
        pairs = [
            (c, plan_graph(c.graph, c.bucket_bytes_cap, c.first_bucket_bytes))
            for c in here.compilations
        ]
    else:
        graphs = plan.graphs if isinstance(plan, SplitPlan) else [plan]
        if len(graphs) > len(here.compilations):
            return [f"{where}: {len(graphs)} graph(s) planned, {len(here.compilations)} compiled"]
        pairs = list(zip(here.compilations, graphs, strict=False))
    out: list[str] = []
    for comp, planned in pairs:
        out += compare_graph(f"{where}, compile {comp.index}", planned, comp)
    return out
