"""The bucket map at scale: long runs, bursts of events, reading lazily (Note [Lazy
bucket events] in ``buckets/_lazy_events.py``) and health under a time budget."""

from __future__ import annotations

from typing import Any

import pytest
from msgspec.structs import asdict
from support import make_store

from interactive_shard.buckets import _health
from interactive_shard.buckets.analysis import DIVERGENCE
from interactive_shard.buckets.events import BucketReduced, DdpWatch
from interactive_shard.buckets.model import READY_HEAD, BucketMap
from interactive_shard.telemetry.schema import Event
from interactive_shard.testing import FakeRun, mlp_params

CAP_MB = 0.0003  # 314 bytes: 2 layers of Linear(8, 8) rebuild into 2 buckets


def long_run(iterations: int, **settings: Any) -> FakeRun:
    return FakeRun(mlp_params(2, 8), iterations=iterations, bucket_cap_mb=CAP_MB, **settings)


def fqns(buckets: list[Any]) -> list[list[str]]:
    return [b.fqns for b in buckets]


@pytest.fixture(scope="module")
def run_events() -> list[Event]:
    return long_run(3000).events()


def test_an_update_reads_nothing_and_the_newest_iteration_is_walked_to(
    run_events: list[Event],
) -> None:
    bm = BucketMap(make_store(run_events))
    assert bm.update() and bm.revision == 1
    raw = (bm._buckets, bm._records)
    assert [r.indexed for r in raw] == [0, 0]  # filed, not read
    assert bm.newest == 3000
    planned = fqns(bm.planned(3000))
    assert len(planned) == 2 and fqns(bm.observed(3000, rank=1)) == planned
    assert bm.record(3000, rank=1) is not None and bm.compare(3000).matches
    # Found walking back from the newest; the plan's ready order is in the first records.
    assert [r.indexed for r in raw] == [0, READY_HEAD] and READY_HEAD < len(bm._records)
    assert bm.iterations == list(range(1, 3001)) and bm.latest == 3000
    assert [r.indexed for r in raw] == [len(r) for r in raw]


def test_an_iteration_far_back_is_found_by_indexing(run_events: list[Event]) -> None:
    bm = BucketMap(make_store(run_events))
    assert fqns(bm.observed(5)) == fqns(bm.planned(5)) and bm.record(5) is not None
    assert bm._buckets.indexed == len(bm._buckets)  # beyond a walk's reach
    assert fqns(bm.observed(1)) == fqns(bm.planned(1)) and len(bm.observed(1)) == 1


def test_the_newest_iteration_follows_events_as_they_arrive(run_events: list[Event]) -> None:
    half = len(run_events) // 2
    store = make_store(run_events[:half])
    bm = BucketMap(store)
    first = bm.newest
    assert first is not None and 1400 < first < 1600
    first_buckets = bm.observed(first)
    store.extend(run_events[half:])
    assert bm.newest == 3000 and fqns(bm.observed(3000)) == fqns(bm.planned(3000))
    assert bm.observed(first) == first_buckets  # looked up again: the same buckets
    extra = [e for e in long_run(3001).events() if e.payload.get("iteration") == 3001]
    store.extend([e for e in extra if e.rank == 0])  # rank 1 has not sent iteration 3001
    assert bm.newest == 3001 and len(bm.observed(3001, rank=0)) == 2
    assert bm.observed(3001, rank=1) == [] and bm.record(3001, rank=1) is None


def test_health_under_a_time_budget_goes_on_where_it_stopped(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_health, "CHUNK", 256)
    run = long_run(2000, diverge={1990: ["layers.1.weight"]})
    bm = BucketMap(make_store(run.events()))
    assert not bm.check_health(0.0)  # one step of 256 records, then out of time
    done, total = bm.health_checked
    assert done == 256 and total == 4000 and bm.health_so_far == []
    steps = 1
    while not bm.check_health(0.0):
        steps += 1
    assert steps == total // 256 and bm.health_checked == (total, total)
    (finding,) = bm.health_so_far
    assert finding.kind == DIVERGENCE and finding.iteration == 1990
    assert bm.health == BucketMap(make_store(run.events())).health == [finding]


def test_iterations_that_cannot_be_read_are_skipped_when_indexed(run_events: list[Event]) -> None:
    good = [e for e in run_events if e.payload.get("iteration", 1) <= 2]
    bucket = next(e for e in good if e.kind == BucketReduced.KIND)
    bad = [
        Event(bucket.kind, 0, 1, 0.0, {**bucket.payload, "iteration": None}),
        Event(
            bucket.kind, 0, 1, 0.0, {k: v for k, v in bucket.payload.items() if k != "iteration"}
        ),
        Event(bucket.kind, 1, 1, 0.0, {**bucket.payload, "iteration": 2**60}),
    ]
    bm = BucketMap(make_store([*good, *bad]))
    assert bm.skipped == 0  # filed unread
    assert bm.iterations == [1, 2] and bm.skipped == 3
    assert fqns(bm.observed(2)) == fqns(bm.planned(2))


def test_a_rank_watched_again_midway_keeps_only_its_new_events() -> None:
    first, again = long_run(50).events(), long_run(3).events()
    rewatch = [e for e in again if e.rank == 0]  # its watch, then iterations 1-3
    bm = BucketMap(make_store(first + rewatch))
    assert bm.newest == 50 and bm.iterations == list(range(1, 51))
    assert bm.observed(40, rank=0) == [] and len(bm.observed(40, rank=1)) == 2
    assert len(bm.observed(3, rank=0)) == 2 and bm.record(4, rank=0) is None
    watch = next(e for e in rewatch if e.kind == DdpWatch.KIND)
    assert bm.info is not None and asdict(bm.info)["fqns"] == watch.payload["fqns"]
