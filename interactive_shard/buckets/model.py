"""BucketMap: what DDP did with its gradient buckets in a run, and what it should have done.

Consumes the bucket events of a ``RunStore`` (``events.py``, ``docs/events.md``)
incrementally with a cursor, so it serves a live run and a loaded recording alike.
Every accessor first consumes new events. The planned
layout comes from the pure planner (``plan.py``) fed with what the ranks recorded: the
parameter shapes and dtypes, DDP's settings and the gradient-ready order. No widgets.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from typing import Any

from interactive_shard import features
from interactive_shard.buckets import analysis, records
from interactive_shard.buckets._params import key_fqn
from interactive_shard.buckets.analysis import Comparison, Finding, Timeline
from interactive_shard.buckets.plan import Bucket, BucketPlan, ParamSpec, plan_buckets
from interactive_shard.buckets.records import (
    IterationRecord,
    ObservedBucket,
    RecordError,
    WatchInfo,
)
from interactive_shard.telemetry.store import RunStore
from interactive_shard.ui.live import ShowsView

log = logging.getLogger(__name__)

WHAT_IF = ("bucket_cap_mb", "bucket_cap_mb_list", "find_unused_parameters", "static_graph")
_PLAN_CACHE = 64  # what-if plans kept (a slider asks for the same few caps again and again)


class BucketMap(ShowsView):
    """Observed and planned DDP buckets of one run (``run.buckets``).

    >>> bm = run.buckets                       # doctest: +SKIP
    >>> [b.fqns for b in bm.observed(2)]       # rebuilt buckets, rank 0
    >>> bm.compare(2).matches, bm.health
    """

    def __init__(self, store: RunStore) -> None:
        self.store = store
        self.skipped = 0  # events that did not follow the schema (logged, not kept)
        self.revision = 0  # grows whenever new bucket data arrived; views compare it
        self._cursor = 0
        self._infos: dict[int, WatchInfo] = {}
        self._buckets: dict[tuple[int, int], dict[int, ObservedBucket]] = {}
        self._records: dict[tuple[int, int], IterationRecord] = {}
        self._iterations: set[int] = set()
        self._dirty: set[int] = set()  # iterations whose findings must be recomputed
        self._findings: dict[int, list[Finding]] = {}
        self._plans: OrderedDict[tuple[Any, ...], BucketPlan] = OrderedDict()

    # -- consuming events --------------------------------------------------------------------
    def update(self) -> bool:
        """Consume new events; True when bucket data changed."""
        events = self.store.events(self._cursor)
        self._cursor += len(events)
        changed = False
        for e in events:
            if e.kind not in records.KINDS:
                continue
            try:
                self._consume(e.kind, e.rank, e.payload)
            except RecordError as err:
                self.skipped += 1
                log.warning("rank %d: skipped a malformed %s event: %s", e.rank, e.kind, err)
                continue
            changed = True
        if changed:
            self.revision += 1
        return changed

    def _consume(self, kind: str, rank: int, payload: dict[str, Any]) -> None:
        record = records.decode(rank, kind, payload)
        if isinstance(record, WatchInfo):
            if rank in self._infos:  # watching again restarts the rank's iteration count
                self._forget(rank)
            self._infos[rank] = record
            self._plans.clear()
            self._dirty.update(self._iterations)
        elif isinstance(record, ObservedBucket):
            self._buckets.setdefault((record.iteration, rank), {})[record.index] = record
            self._iterations.add(record.iteration)
        else:
            self._records[(record.iteration, rank)] = record
            self._iterations.add(record.iteration)
            self._dirty.add(record.iteration)
            if record.iteration <= 2:  # the ready order the plan uses may have changed
                self._plans.clear()

    def _forget(self, rank: int) -> None:
        log.info("rank %d: ddp_watch again; dropping its earlier bucket events", rank)
        for table in (self._buckets, self._records):
            for key in [k for k in table if k[1] == rank]:
                del table[key]
        self._iterations = {i for i, _ in (*self._buckets, *self._records)}
        self._findings.clear()
        self._dirty = set(self._iterations)

    # -- what was observed -------------------------------------------------------------------
    @property
    def iterations(self) -> list[int]:
        """DDP iterations with any bucket data, ascending (1 = first backward watched)."""
        self.update()
        return sorted(self._iterations)

    @property
    def latest(self) -> int | None:
        its = self.iterations
        return its[-1] if its else None

    @property
    def ranks(self) -> list[int]:
        self.update()
        return sorted(set(self._infos) | {r for _, r in (*self._buckets, *self._records)})

    @property
    def info(self) -> WatchInfo | None:
        """The ``ddp_watch`` report of the lowest rank (all ranks wrap the same model)."""
        self.update()
        return self._infos[min(self._infos)] if self._infos else None

    def observed(self, iteration: int, rank: int = 0) -> list[ObservedBucket]:
        """Buckets of ``iteration`` on ``rank`` by index ([] until they are reported)."""
        _check_iteration(iteration)
        self.update()
        found = self._buckets.get((iteration, rank), {})
        return [found[i] for i in sorted(found)]

    def record(self, iteration: int, rank: int = 0) -> IterationRecord | None:
        """The ``ddp_iteration`` summary (ready order, unready, checksums), if reported."""
        _check_iteration(iteration)
        self.update()
        return self._records.get((iteration, rank))

    @property
    def health(self) -> list[Finding]:
        """Findings ("unready", "divergence") of every iteration, in iteration order."""
        self.update()
        info = self.info
        order = info.fqns if info is not None else []
        for it in sorted(self._dirty):
            per_rank = {r: rec for (i, r), rec in self._records.items() if i == it}
            unready = analysis.unready_finding(
                it, {r: x.unready for r, x in per_rank.items()}, info
            )
            # An unfinished reduction leaves every gradient local, so differing checksums
            # are expected then and the unready finding already explains it.
            stuck = unready is not None and analysis.reduction_unfinished(info)
            divergence = None
            if not stuck:
                divergence = analysis.divergence_finding(
                    it,
                    {r: x.checksums for r, x in per_rank.items()},
                    order,
                    {f for x in per_rank.values() for f in x.repeated},
                )
            found = [unready, divergence]
            self._findings[it] = [f for f in found if f is not None]
        self._dirty.clear()
        return [f for it in sorted(self._findings) for f in self._findings[it]]

    def timeline(self, iteration: int, rank: int = 0) -> Timeline:
        """Bucket ready/start/end against the backward window, and how much overlapped."""
        return analysis.timeline(
            iteration, rank, self.observed(iteration, rank), self.record(iteration, rank)
        )

    # -- what the planner says ---------------------------------------------------------------
    def plan(self, **what_if: Any) -> BucketPlan:
        """Re-plan with ``plan_buckets`` from the recorded parameters, order and settings.

        ``what_if`` overrides DDP's settings (``bucket_cap_mb``, ``bucket_cap_mb_list``,
        ``find_unused_parameters``, ``static_graph``) or the ``ready_order`` (fqns).
        Giving one of the two caps drops the recorded other, as DDP takes only one.
        """
        unknown = set(what_if) - {*WHAT_IF, "ready_order"}
        if unknown:
            raise TypeError(
                f"planned()/plan() got {sorted(unknown)}; what-if settings are "
                f"{[*WHAT_IF, 'ready_order']}"
            )
        info = self.info
        if info is None:
            raise LookupError(
                "no ddp_watch event in this run: ish.watch(ddp_model) reports the model's "
                "parameters and DDP settings in the cluster.run that calls it; call it on "
                "every rank in the same run as the backwards you want to plan"
            )
        settings: dict[str, Any] = {
            # DDP ignores bucket_cap_mb when given a list (the probe may report both).
            "bucket_cap_mb": None if info.bucket_cap_mb_list else info.bucket_cap_mb,
            "bucket_cap_mb_list": info.bucket_cap_mb_list,
            "find_unused_parameters": info.find_unused_parameters,
            "static_graph": info.static_graph,
        }
        if "bucket_cap_mb" in what_if and "bucket_cap_mb_list" not in what_if:
            settings["bucket_cap_mb_list"] = None
        if "bucket_cap_mb_list" in what_if and "bucket_cap_mb" not in what_if:
            settings["bucket_cap_mb"] = None
        settings.update({k: v for k, v in what_if.items() if k != "ready_order"})
        order = what_if.get("ready_order")
        if order is None:
            order = self._recorded_ready_order(info, bool(settings["static_graph"]))
        key = (*(_frozen(settings[k]) for k in WHAT_IF), _frozen(order))
        plan = self._plans.get(key)
        if plan is None:
            params = _specs(info)
            plan = plan_buckets(params, ready_order=order, **settings, **_delay(info, params))
            self._plans[key] = plan
            if len(self._plans) > _PLAN_CACHE:
                self._plans.popitem(last=False)
        self._plans.move_to_end(key)
        return plan

    def planned(self, iteration: int, **what_if: Any) -> list[Bucket]:
        """The buckets the planner expects at ``iteration`` (see ``plan`` for what-ifs)."""
        _check_iteration(iteration)
        return self.plan(**what_if).iteration(iteration)

    def compare(self, iteration: int, rank: int = 0, **what_if: Any) -> Comparison:
        """Planned vs observed buckets of ``iteration`` on ``rank``."""
        return analysis.compare(
            iteration, rank, self.planned(iteration, **what_if), self.observed(iteration, rank)
        )

    def ready_order_source(self) -> str:
        """Where the plan's gradient-ready order comes from, in words."""
        info = self.info
        found = self._ready_record(info.static_graph) if info else None
        if found is None:
            return "assumed: reverse registration order (no ddp_iteration event yet)"
        (iteration, rank), _ = found
        return f"observed on rank {rank} in iteration {iteration}"

    def _ready_record(self, static_graph: bool) -> tuple[tuple[int, int], IterationRecord] | None:
        # DDP rebuilds from the order rank 0 recorded (it broadcasts it), in iteration 1,
        # or iteration 2 with static_graph (iteration 1 then delays every reduction).
        preferred = (2, 1) if static_graph else (1, 2)
        for iteration in preferred:
            ranks = sorted(r for i, r in self._records if i == iteration)
            if ranks:
                return (iteration, ranks[0]), self._records[(iteration, ranks[0])]
        return None

    def _recorded_ready_order(self, info: WatchInfo, static_graph: bool) -> list[str] | None:
        found = self._ready_record(static_graph)
        if found is None:
            return None  # the planner assumes reverse registration order
        known = set(info.fqns)
        seen = [f for f in dict.fromkeys(found[1].ready_order) if f in known]
        # Parameters that got no gradient go last, as DDP's rebuild appends them.
        seen_set = set(seen)
        missing = [f for f in info.fqns if f not in seen_set]
        return seen + missing

    # -- display -------------------------------------------------------------------------------
    def _view(self) -> Any:
        return features.feature_of_model(self).view_of(self)

    def __repr__(self) -> str:
        its = self.iterations
        span = f"iterations {its[0]}..{its[-1]}" if its else "no iterations yet"
        return (
            f"BucketMap(ranks={self.ranks}, {span}, {len(self.health)} finding(s)"
            + (f", {self.skipped} malformed event(s) skipped" if self.skipped else "")
            + ")"
        )


def _specs(info: WatchInfo) -> list[tuple[str, ParamSpec]]:
    """The planner's parameters: the Reducer's, then the delayed ones it does not hold."""
    params = [
        (f, ParamSpec(shape, dtype))
        for f, shape, dtype in zip(info.fqns, info.shapes, info.dtypes, strict=True)
    ]
    if info.delayed is not None:
        known = set(info.fqns)
        d = info.delayed
        for name, shape, dtype in zip(d.fqns, d.shapes, d.dtypes, strict=True):
            if key_fqn(name) not in known:  # ".pos" is the parameter "pos"
                params.append((key_fqn(name), ParamSpec(shape, dtype)))
                known.add(key_fqn(name))
    return params


def _delay(info: WatchInfo, params: list[tuple[str, ParamSpec]]) -> dict[str, Any]:
    """DDP's delay arguments as the probe read them; the planner matches names as DDP."""
    if info.delayed is None:
        return {}
    hook = info.delayed.hook
    return {
        "delay_all_reduce_named_params": list(info.delayed.fqns),
        "param_to_hook_all_reduce": hook if hook in {f for f, _ in params} else None,
    }


def _check_iteration(iteration: object) -> None:
    if isinstance(iteration, bool) or not isinstance(iteration, int) or iteration < 1:
        raise ValueError(f"iterations count from 1 (the first backward watched); got {iteration!r}")


def _frozen(value: Any) -> Any:
    return tuple(value) if isinstance(value, list) else value
