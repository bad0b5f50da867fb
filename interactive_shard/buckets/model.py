"""BucketMap: what DDP did with its gradient buckets in a run, and what it should have done.

Consumes the bucket events of a ``RunStore`` (``events.py``, ``docs/events.md``)
incrementally, so it serves a live run and a loaded recording alike. Every accessor
first consumes new events. The planned layout comes from the pure planner
(``plan.py``) fed with what the ranks recorded: the parameter shapes and dtypes, DDP's
settings and the gradient-ready order. No widgets.

At scale (10,000 iterations, 100,000 events) an update reads nothing of the new
events: ``bucket`` and ``ddp_iteration`` events are filed unread (``_ingest.py``) and
indexed by iteration in C-level passes when something needs them all; what a live
view shows, the newest iteration, is found walking back from the newest events
(Note [Lazy bucket events] in ``_lazy_events.py``). An iteration's events are decoded when it
is asked for (and cached). Health is decided on the raw payloads except where an
iteration looks unhealthy (``_health.py``), under a time budget when a view asks
(``check_health``). A malformed event is skipped and counted in ``skipped`` when it is
first read: a ``ddp_watch`` at once, another when its iteration is indexed or decoded.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import numpy as np

from interactive_shard.buckets import analysis
from interactive_shard.buckets._health import Health
from interactive_shard.buckets._ingest import BucketEvents
from interactive_shard.buckets._params import key_fqn
from interactive_shard.buckets.analysis import Comparison, Finding, Timeline
from interactive_shard.buckets.plan import Bucket, BucketPlan, ParamSpec, plan_buckets
from interactive_shard.buckets.records import IterationRecord, ObservedBucket, WatchInfo
from interactive_shard.telemetry.store import RunStore
from interactive_shard.ui.live import ShowsView

WHAT_IF = ("bucket_cap_mb", "bucket_cap_mb_list", "find_unused_parameters", "static_graph")
_PLAN_CACHE = 64  # what-if plans kept (a slider asks for the same few caps again and again)
_DECODED_CACHE = 256  # (iteration, rank) entries decoded and kept
READY_HEAD = 4096  # records indexed to find iterations 1 and 2 (where the plan's order is)


class BucketMap(BucketEvents, ShowsView):
    """Observed and planned DDP buckets of one run (``run.buckets``).

    >>> bm = run.buckets                       # doctest: +SKIP
    >>> [b.fqns for b in bm.observed(2)]       # rebuilt buckets, rank 0
    >>> bm.compare(2).matches, bm.health
    """

    def __init__(self, store: RunStore) -> None:
        super().__init__(store)
        self._iterations: tuple[tuple[int, ...], list[int]] = ((), [])  # (state, sorted list)
        self._health = Health()
        # (iteration, rank) -> (bucket events added then, their buckets)
        self._observed: OrderedDict[tuple[int, int], tuple[int, list[ObservedBucket]]] = (
            OrderedDict()
        )
        self._recorded: OrderedDict[tuple[int, int], tuple[int, IterationRecord | None]] = (
            OrderedDict()
        )
        # static_graph -> (records added then, -1: for good; where the rebuild's ready order
        # was recorded, None: nowhere yet)
        self._ready: dict[bool, tuple[int, tuple[tuple[int, int], IterationRecord] | None]] = {}
        self._plans: OrderedDict[tuple[Any, ...], BucketPlan] = OrderedDict()
        self._specs: tuple[WatchInfo, list[tuple[str, ParamSpec]]] | None = None

    def _watched(self) -> None:
        self._plans.clear()
        self._ready.clear()
        self._health.reset()
        self._observed.clear()  # a rank watched again may have been superseded
        self._recorded.clear()

    @property
    def health_revision(self) -> int:
        """Grows whenever the findings found so far change (views redraw their list)."""
        return self._health.revision

    def check_health(self, seconds: float | None = None) -> bool:
        """Look for findings in the records not looked at yet; with ``seconds``, for
        about that long at most (a view's refresh budget: 100,000 new events hold
        50,000 records to compare across ranks), going on at the next call. True when
        every record has been looked at. ``health`` looks at all of them."""
        self.update()
        return self._health.update(self._records, self.info, self._decode_records, seconds)

    @property
    def health_checked(self) -> tuple[int, int]:
        """(records looked at for findings, records): equal once ``health`` is complete."""
        self.update()
        return self._health.checked, len(self._records)

    @property
    def health_so_far(self) -> list[Finding]:
        """The findings of the records looked at so far (``check_health``)."""
        return list(self._health.listed())

    # -- what was observed -------------------------------------------------------------------
    @property
    def iterations(self) -> list[int]:
        """DDP iterations with any bucket data, ascending (1 = first backward watched)."""
        self.update()
        for raw in self._raw:
            raw.index()
        state = (self._buckets.indexed, self._records.indexed, self._forgotten)
        if self._iterations[0] != state:
            alive = np.union1d(self._buckets.filed.array(), self._records.filed.array())
            self._iterations = (state, alive.tolist())
        return list(self._iterations[1])

    @property
    def iteration_count(self) -> int:
        """How many iterations have bucket data (``len(iterations)``)."""
        return len(self.iterations)

    @property
    def latest(self) -> int | None:
        its = self.iterations
        return its[-1] if its else None

    @property
    def newest(self) -> int | None:
        """The latest iteration, from the newest events (what a live view follows): as
        ``latest`` without indexing every bucket event (Note [Lazy bucket events])."""
        self.update()
        known = self.known_ranks
        tops = [raw.newest(known) or 0 for raw in self._raw]
        tops += [its[-1] if (its := raw.filed.iterations()) else 0 for raw in self._raw]
        return max(tops) or None

    @property
    def ranks(self) -> list[int]:
        self.update()
        for raw in self._raw:
            raw.index()
        return self.known_ranks

    @property
    def known_ranks(self) -> list[int]:
        """``ranks`` as known without indexing every bucket event: of the watches, the
        records and the bucket events indexed so far (a live view's rank list)."""
        self.update()
        return sorted(set(self._infos) | self._buckets.ranks | self._records.ranks)

    @property
    def info(self) -> WatchInfo | None:
        """The ``ddp_watch`` report of the lowest rank (all ranks wrap the same model)."""
        self.update()
        return self._infos[min(self._infos)] if self._infos else None

    def observed(self, iteration: int, rank: int = 0) -> list[ObservedBucket]:
        """Buckets of ``iteration`` on ``rank`` by index ([] until they are reported)."""
        _check_iteration(iteration)
        self.update()
        key, count = (iteration, rank), self._buckets.added
        cached = self._observed.get(key)
        if cached is None or cached[0] != count:  # bucket events came since: look again
            by_index: dict[int, ObservedBucket] = {}
            for e in self._events(self._buckets, iteration, rank):  # sent twice: the later
                bucket = self._decode(e)
                if bucket is not None:
                    by_index[bucket.index] = bucket
            cached = (count, [by_index[i] for i in sorted(by_index)])
            _keep(self._observed, key, cached)
        return list(cached[1])

    def record(self, iteration: int, rank: int = 0) -> IterationRecord | None:
        """The ``ddp_iteration`` summary (ready order, unready, checksums), if reported."""
        _check_iteration(iteration)
        self.update()
        key, count = (iteration, rank), self._records.added
        cached = self._recorded.get(key)
        if cached is None or cached[0] != count:
            found = None
            for e in reversed(self._events(self._records, iteration, rank)):
                found = self._decode(e)  # the latest that decodes
                if found is not None:
                    break
            cached = (count, found)
            _keep(self._recorded, key, cached)
        return cached[1]

    @property
    def health(self) -> list[Finding]:
        """Findings ("unready", "divergence") of every iteration, in iteration order."""
        self.check_health()
        return list(self._health.listed())

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
            if self._specs is None or self._specs[0] is not info:  # built once per watch
                self._specs = (info, _specs(info))
            params = self._specs[1]
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
        """Planned vs observed buckets of ``iteration`` on ``rank``.

        Iterations are DDP's own numbers. Refused (ValueError, saying why) for one that
        ran before ``ish.watch``, and for any when DDP had run an unknown number of
        iterations before it (its iteration 1 holds one bucket, later ones the rebuilt
        buckets: which is which cannot be told)."""
        _check_iteration(iteration)
        info = self.info
        if info is not None:
            late = late_watch(info)
            if info.first_iteration is None:
                raise ValueError(f"cannot compare iteration {iteration}: {late}")
            if iteration < info.first_iteration:
                raise ValueError(
                    f"iteration {iteration} ran before ish.watch: {late}. Compare "
                    f"iteration {info.first_iteration} or later."
                )
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
        self.update()
        raw = self._records
        preferred = (2, 1) if static_graph else (1, 2)
        info = self.info
        first = (info.first_iteration or 1) if info is not None else 1
        if first > 1:  # a late watch: the order of the first iteration seen
            preferred = (first, first + 1)
        cached = self._ready.get(static_graph)
        if cached is not None and cached[0] in (-1, raw.added):
            return cached[1]
        # Iterations 1 and 2 come first: index the first records only, unless none is there.
        raw.index(upto=min(len(raw), READY_HEAD))
        found = self._ready_indexed(preferred)
        if found is None and raw.indexed < len(raw):
            raw.index()
            found = self._ready_indexed(preferred)
        # Rank 0 in the preferred iteration: nothing later replaces it (-1: for good).
        final = found is not None and found[0] == (preferred[0], 0)
        self._ready[static_graph] = (-1 if final else raw.added, found)
        return found

    def _ready_indexed(
        self, preferred: tuple[int, int]
    ) -> tuple[tuple[int, int], IterationRecord] | None:
        for iteration in preferred:
            for rank in self._records.filed.ranks_with(iteration):
                record = self.record(iteration, rank)
                if record is not None:
                    return (iteration, rank), record
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


def _keep(cache: OrderedDict[tuple[int, int], Any], key: tuple[int, int], value: Any) -> None:
    cache[key] = value
    if len(cache) > _DECODED_CACHE:
        cache.popitem(last=False)


def late_watch(info: WatchInfo) -> str:
    """What a late ``ish.watch`` means for the iterations seen, in words ("" if on time)."""
    first = info.first_iteration
    if first == 1:
        return ""
    if first is None:
        return (
            "ish.watch came after DDP had already run an unknown number of iterations (DDP "
            "logs its count only for the first ten), so the watched ones are numbered from "
            "1 here and their buckets are DDP's rebuilt ones, whatever their number. Call "
            "ish.watch(ddp) right after wrapping the model to compare with the plan"
        )
    return (
        f"ish.watch came after DDP had run {first - 1} iteration(s), so the first watched "
        f"iteration is DDP's iteration {first} (iterations are numbered as DDP numbers them)"
    )


def _check_iteration(iteration: object) -> None:
    if isinstance(iteration, bool) or not isinstance(iteration, int) or iteration < 1:
        raise ValueError(f"iterations count from 1 (the first backward watched); got {iteration!r}")


def _frozen(value: Any) -> Any:
    return tuple(value) if isinstance(value, list) else value
