"""BucketMap fed with events built from their Structs (``buckets/events.py``), as the
probe builds them, and with malformed payloads."""

from __future__ import annotations

import math
from typing import Any

import pytest
from msgspec.structs import asdict
from support import make_store

from interactive_shard.buckets.analysis import DIVERGENCE, UNREADY
from interactive_shard.buckets.events import BucketReduced, DdpIteration, DdpWatch
from interactive_shard.buckets.model import BucketMap
from interactive_shard.telemetry.run_events import Log
from interactive_shard.telemetry.schema import Event
from interactive_shard.telemetry.store import RunStore
from interactive_shard.testing import FakeParam, FakeRun, mlp_params

MIB = 2**20
WATCH, BUCKET, ITERATION = DdpWatch.KIND, BucketReduced.KIND, DdpIteration.KIND


def store_of(events: list[Event], world_size: int = 2) -> RunStore:
    return make_store(events, world_size=world_size)


def bucket_map(run: FakeRun) -> BucketMap:
    return BucketMap(store_of(run.events(), run.world_size))


def watch(rank: int = 0, **over: Any) -> Event:
    info = DdpWatch(
        **{
            "fqns": ["a.weight", "b.weight"],
            "shapes": [(4, 4), (4,)],
            "dtypes": ["torch.float32", "torch.float32"],
            "modules": ["a", "b"],
            "module_types": ["Linear", "Linear"],
            "bucket_cap_mb": None,
            "bucket_cap_mb_list": None,
            "bucket_bytes_cap": 25 * MIB,
            "first_bucket_bytes": MIB,
            "find_unused_parameters": False,
            "static_graph": False,
            "world_size": 2,
            "user_hook": None,
            "checksum": "sampled",
            **over,
        }
    )
    return Event(info.KIND, rank, 0, 0.0, asdict(info))


def bucket(rank: int, iteration: int, index: int, fqns: list[str], **times: float) -> Event:
    reduced = BucketReduced(
        iteration=iteration,
        index=index,
        fqns=fqns,
        shapes=[(4,)] * len(fqns),
        dtypes=["torch.float32"] * len(fqns),
        nbytes=16 * len(fqns),
        ready_t=times.get("ready", 0.0),
        start_t=times.get("start", 0.0),
        end_t=times.get("end", 0.0),
        is_last=False,
    )
    return Event(reduced.KIND, rank, iteration, 0.0, asdict(reduced))


def iteration(rank: int, it: int, **over: Any) -> Event:
    summary = DdpIteration(
        **{
            "iteration": it,
            "backward_start": 10.0,
            "backward_end": 10.010,
            "ready_order": ["b.weight", "a.weight"],
            "ready_t": [10.001, 10.010],
            "unready": [],
            "checksums": {"a.weight": 1.5, "b.weight": -2.0},
            **over,
        }
    )
    return Event(summary.KIND, rank, it, 0.0, asdict(summary))


# -- consuming events -------------------------------------------------------------------------
def test_observed_buckets_sorted_by_index_with_typed_info() -> None:
    events = [watch(0), watch(1), bucket(0, 1, 1, ["a.weight"]), bucket(0, 1, 0, ["b.weight"])]
    bm = BucketMap(store_of(events))
    assert [b.index for b in bm.observed(1)] == [0, 1]
    assert [b.fqns for b in bm.observed(1, rank=0)] == [["b.weight"], ["a.weight"]]
    assert bm.observed(1)[0].shapes == [(4,)] and bm.observed(1)[0].nbytes == 16
    assert bm.observed(1, rank=1) == [] and bm.observed(7) == []
    assert bm.iterations == [1] and bm.ranks == [0, 1] and bm.latest == 1
    info = bm.info
    assert info is not None and info.fqns == ["a.weight", "b.weight"]
    assert info.shapes == [(4, 4), (4,)] and info.cap_mb == 25.0 and info.bucket_cap_mb is None
    assert info.module_of == {"a.weight": "a", "b.weight": "b"}


def test_update_is_incremental_and_counts_revisions() -> None:
    store = store_of([watch(0)])
    bm = BucketMap(store)
    assert bm.update() and bm.revision == 1
    assert not bm.update() and bm.revision == 1
    store.append(Event(Log.KIND, 0, 0, 0.0, asdict(Log(stream="stdout", text="hi"))))
    assert not bm.update()
    store.append(bucket(0, 2, 0, ["a.weight", "b.weight"]))
    assert bm.iterations == [2] and bm.revision == 2  # accessors consume new events


@pytest.mark.parametrize("bad", [0, -1, 1.0, True, "1"])
def test_iterations_count_from_one(bad: Any) -> None:
    bm = BucketMap(store_of([watch(0)]))
    with pytest.raises(ValueError, match="count from 1"):
        bm.observed(bad)


def test_malformed_events_are_skipped_and_counted(caplog: pytest.LogCaptureFixture) -> None:
    bad = [
        Event(BUCKET, 0, 1, 0.0, {"iteration": 1, "index": 0}),  # no fqns
        Event(BUCKET, 0, 1, 0.0, {**bucket(0, 1, 0, ["x"]).payload, "index": True}),
        Event(WATCH, 1, 0, 0.0, {**watch(1).payload, "shapes": [[4, 4]]}),  # too short
        Event(ITERATION, 0, 1, 0.0, {**iteration(0, 1).payload, "ready_t": [1.0]}),
        Event(BUCKET, 0, 1, 0.0, {**bucket(0, 1, 0, ["x"]).payload, "iteration": 0}),
    ]
    bm = BucketMap(store_of([watch(0), *bad, bucket(0, 1, 0, ["a.weight"])]))
    # Read at once: the watch, and where each event belongs (its iteration).
    assert bm.iterations == [1] and bm.skipped == 2 and bm.ranks == [0]
    # The rest when their iteration is first read (a view decodes only what it shows).
    assert [b.fqns for b in bm.observed(1)] == [["a.weight"]] and bm.record(1) is None
    assert bm.skipped == len(bad) and bm.health == [] and bm.skipped == len(bad)
    assert "skipped a malformed" in caplog.text and "skipped" in repr(bm)


def test_watching_again_restarts_that_ranks_iterations() -> None:
    events = [watch(0), bucket(0, 1, 0, ["a.weight"]), bucket(0, 2, 0, ["a.weight"])]
    bm = BucketMap(store_of(events))
    assert bm.iterations == [1, 2]
    bm.store.extend([watch(0, bucket_cap_mb=1.0), bucket(0, 1, 0, ["b.weight"])])
    assert bm.iterations == [1] and bm.observed(1)[0].fqns == ["b.weight"]
    assert bm.info is not None and bm.info.bucket_cap_mb == 1.0


# -- planned vs observed ------------------------------------------------------------------------
@pytest.mark.parametrize(
    "settings",
    [
        {},
        {"bucket_cap_mb": 0.02},
        {"bucket_cap_mb_list": [0.01, 0.03]},
        {"bucket_cap_mb": 0.02, "find_unused_parameters": True},
        {"bucket_cap_mb": 0.02, "static_graph": True},
    ],
)
def test_plan_from_recorded_events_matches_observed(settings: dict[str, Any]) -> None:
    bm = bucket_map(FakeRun(mlp_params(6, 48), iterations=4, **settings))
    for it in bm.iterations:
        planned = bm.planned(it)
        assert [b.fqns for b in planned] == [b.fqns for b in bm.observed(it)]
        assert bm.compare(it, rank=1).matches and bm.compare(it).differences == []


def test_rebuilt_buckets_follow_the_ready_order_of_iteration_one() -> None:
    params = mlp_params(3, 32)
    order = [p.fqn for p in params]  # forward order, not DDP's reverse-registration guess
    bm = bucket_map(FakeRun(params, bucket_cap_mb=0.005, ready_order=order))
    assert len(bm.observed(1)) == 1  # iteration 1: one bucket without find_unused_parameters
    assert bm.planned(2)[0].fqns[0] == "layers.0.weight"
    assert bm.compare(2).matches
    assert bm.ready_order_source() == "observed on rank 0 in iteration 1"


def test_what_if_replans_without_running() -> None:
    bm = bucket_map(FakeRun(mlp_params(6, 48), bucket_cap_mb_list=[0.01, 0.03]))
    small = bm.planned(2, bucket_cap_mb=0.005)
    assert len(small) > len(bm.planned(2))
    assert all(b.cap_bytes == int(0.005 * MIB) for b in small)  # recorded list dropped
    c = bm.compare(2, bucket_cap_mb=0.005)
    assert not c.matches and c.bucket_counts == (len(small), len(bm.observed(2)))
    assert c.moved and "planned" in c.differences[0]
    assert bm.plan(bucket_cap_mb=0.005) is bm.plan(bucket_cap_mb=0.005)  # cached
    with pytest.raises(TypeError, match="what-if settings"):
        bm.planned(2, bucket_cap=1)


def test_planning_needs_a_watch_event() -> None:
    bm = BucketMap(store_of([bucket(0, 1, 0, ["a.weight"])]))
    with pytest.raises(LookupError, match=r"ish.watch"):
        bm.planned(1)


def test_compare_lists_moved_and_reordered() -> None:
    events = [
        watch(0, bucket_cap_mb=0.0001),  # 104 bytes: a.weight (64 B) + b.weight (16 B) fit
        iteration(0, 1, ready_order=["a.weight", "b.weight"]),
        bucket(0, 2, 0, ["b.weight", "a.weight"]),  # same parameters, other order
        bucket(0, 3, 0, ["a.weight"]),
        bucket(0, 3, 1, ["b.weight"]),
    ]
    bm = BucketMap(store_of(events))
    assert [b.fqns for b in bm.planned(2)] == [["a.weight", "b.weight"]]
    c2 = bm.compare(2)
    assert c2.reordered == [0] and c2.moved == [] and not c2.matches
    assert c2.differences == ["bucket(s) 0: same parameters, another order"]
    c3 = bm.compare(3)
    assert c3.moved == ["b.weight"] and c3.bucket_counts == (1, 2)


def test_static_graph_plans_from_the_order_of_iteration_two() -> None:
    events = [
        watch(0, static_graph=True, bucket_cap_mb=0.00001),
        iteration(0, 1, ready_order=["b.weight", "a.weight"]),
        iteration(0, 2, ready_order=["a.weight", "b.weight"]),
    ]
    bm = BucketMap(store_of(events))
    assert [b.fqns for b in bm.planned(3)] == [["a.weight"], ["b.weight"]]
    assert bm.ready_order_source() == "observed on rank 0 in iteration 2"


# -- health -------------------------------------------------------------------------------------
def test_unready_parameter_is_named_with_cause_and_fix() -> None:
    bm = bucket_map(FakeRun(mlp_params(2, 8), iterations=2, unready=["layers.1.bias"]))
    findings = [f for f in bm.health if f.kind == UNREADY]
    assert [(f.iteration, f.ranks, f.fqns) for f in findings] == [
        (1, [0, 1], ["layers.1.bias"]),
        (2, [0, 1], ["layers.1.bias"]),
    ]
    message = findings[0].message
    assert "Expected to have finished reduction in the prior iteration" in message
    assert "find_unused_parameters=True" in message and "layers.1.bias" in message


def test_unready_with_find_unused_parameters_is_informational() -> None:
    run = FakeRun(mlp_params(2, 8), unready=["layers.0.bias"], find_unused_parameters=True)
    finding = bucket_map(run).health[0]
    assert finding.kind == UNREADY and "marks them ready itself" in finding.message
    assert "Expected to have finished" not in finding.message


def test_unfinished_reduction_explains_differing_gradients() -> None:
    # find_unused_parameters=False and a parameter without gradient: DDP never reduced,
    # so every gradient is local and differs; that is the unready finding, not divergence.
    run = FakeRun(mlp_params(2, 8), iterations=1, unready=["layers.1.bias"])
    run.diverge = {1: ["layers.0.weight", "layers.0.bias"]}
    (finding,) = bucket_map(run).health
    assert finding.kind == UNREADY and "local gradients" in finding.message
    run.static_graph = True  # DDP copes with unused parameters then: compare checksums
    assert [f.kind for f in bucket_map(run).health] == [UNREADY, DIVERGENCE]


def test_unready_on_one_rank_names_that_rank() -> None:
    events = [watch(0), watch(1), iteration(0, 1), iteration(1, 1, unready=["b.weight"])]
    (finding,) = BucketMap(store_of(events)).health
    assert finding.ranks == [1] and finding.fqns == ["b.weight"] and "on rank 1" in finding.message


def test_divergent_checksums_name_parameters_and_likely_causes() -> None:
    bm = bucket_map(FakeRun(mlp_params(3, 8), iterations=3, diverge={2: ["layers.1.weight"]}))
    (finding,) = bm.health
    assert finding.kind == DIVERGENCE and finding.iteration == 2
    assert finding.fqns == ["layers.1.weight"] and finding.ranks == [0, 1]
    for words in ("checkpointing", "static_graph=True", "rank", "non-deterministic"):
        assert words in finding.message


def test_divergence_blames_the_minority_rank() -> None:
    sums = [{"a.weight": 1.0, "b.weight": 2.0}] * 3 + [{"a.weight": 1.0, "b.weight": 2.5}]
    events = [watch(r) for r in range(4)]
    events += [iteration(r, 1, checksums=s) for r, s in enumerate(sums)]
    (finding,) = BucketMap(store_of(events, world_size=4)).health
    assert finding.ranks == [3] and finding.fqns == ["b.weight"]


def test_equal_nan_missing_and_off_checksums() -> None:
    nan = {"a.weight": math.nan, "b.weight": 1.0}
    same = [watch(0), watch(1), iteration(0, 1, checksums=nan), iteration(1, 1, checksums=nan)]
    assert BucketMap(store_of(same)).health == []
    off = [watch(0), watch(1), iteration(0, 1, checksums={}), iteration(1, 1, checksums={})]
    assert BucketMap(store_of(off)).health == []
    one_missing = [iteration(0, 1, checksums={"a.weight": 1.0}), iteration(1, 1, checksums={})]
    (finding,) = BucketMap(store_of([watch(0), *one_missing])).health
    assert finding.fqns == ["a.weight"]


def test_health_recomputes_only_when_iterations_change() -> None:
    store = store_of([watch(0), watch(1), iteration(0, 1)])
    bm = BucketMap(store)
    assert bm.health == []
    store.append(iteration(1, 1, checksums={"a.weight": 9.0, "b.weight": -2.0}))
    assert [f.kind for f in bm.health] == [DIVERGENCE]


# -- timeline -----------------------------------------------------------------------------------
def test_timeline_overlap_maths() -> None:
    events = [
        watch(0),
        iteration(0, 1, backward_start=10.0, backward_end=10.010),
        bucket(0, 1, 0, ["b.weight"], ready=10.001, start=10.002, end=10.004),  # inside
        bucket(0, 1, 1, ["a.weight"], ready=10.008, start=10.008, end=10.014),  # 2 of 6 ms
        bucket(0, 1, 2, ["c"], ready=10.009, start=10.012, end=10.016),  # overlaps bucket 1
    ]
    tl = BucketMap(store_of(events)).timeline(1)
    assert tl.backward_start == 10.0 and tl.backward_end == pytest.approx(0.010)
    assert [b.index for b in tl.buckets] == [0, 1, 2]
    b0, b1, b2 = tl.buckets
    assert (b0.ready, b0.start, b0.end) == pytest.approx((0.001, 0.002, 0.004))
    assert b0.overlap == pytest.approx(0.002) and b1.overlap == pytest.approx(0.002)
    assert b2.overlap == 0.0 and b1.duration == pytest.approx(0.006)
    # union of reductions: [2, 4] + [8, 16] = 10 ms, of which 2 + 2 = 4 ms in backward
    assert tl.comm_time == pytest.approx(0.010) and tl.hidden_time == pytest.approx(0.004)
    assert tl.overlap_fraction == pytest.approx(0.4) and tl.exposed_time == pytest.approx(0.006)
    assert tl.gradients == [("b.weight", pytest.approx(0.001)), ("a.weight", pytest.approx(0.01))]
    assert not tl.approximate


def test_timeline_without_iteration_event_is_approximate() -> None:
    events = [bucket(0, 1, 0, ["a"], ready=5.0, start=5.0, end=5.5)]
    tl = BucketMap(store_of(events)).timeline(1)
    assert tl.approximate and tl.backward_end == 0.0 and tl.overlap_fraction == 0.0
    empty = BucketMap(store_of([watch(0)])).timeline(3)
    assert empty.buckets == [] and empty.comm_time == 0.0


def test_reduction_end_not_recorded_counts_in_no_total() -> None:
    unfinished = bucket(0, 1, 1, ["a.weight"], ready=10.008, start=10.009)
    unfinished.payload["end_t"] = None  # the probe's "not finished when sent"
    events = [
        watch(0),
        iteration(0, 1, backward_start=10.0, backward_end=10.010),
        bucket(0, 1, 0, ["b.weight"], ready=10.001, start=10.002, end=10.004),
        unfinished,
    ]
    bm = BucketMap(store_of(events))
    tl = bm.timeline(1)
    assert bm.skipped == 0 and tl.unknown_end == [1]
    assert tl.buckets[1].end is None and tl.buckets[1].duration == 0.0
    assert tl.comm_time == pytest.approx(0.002) and tl.overlap_fraction == 1.0


# -- scale --------------------------------------------------------------------------------------
def test_thousand_parameters_in_about_a_hundred_buckets() -> None:
    params = [FakeParam(f"m{i // 2}.{'wb'[i % 2]}", (32, 32), f"m{i // 2}") for i in range(1000)]
    bm = bucket_map(FakeRun(params, bucket_cap_mb=10 * 4096 / MIB, iterations=2))
    assert len(bm.observed(2)) == 100 and len(bm.observed(1)) == 1
    assert bm.compare(2).matches and bm.timeline(2).overlap_fraction > 0


def test_iteration_without_any_gradient_and_repeated_parameters() -> None:
    none_ready = {"backward_start": None, "backward_end": None, "ready_order": [], "ready_t": []}
    events = [
        watch(0),
        watch(1),
        iteration(0, 1, **none_ready, unready=["a.weight", "b.weight"]),
        iteration(0, 2, repeated=["b.weight"]),
        iteration(1, 2, repeated=["b.weight"], checksums={"a.weight": 1.5, "b.weight": 7.0}),
    ]
    bm = BucketMap(store_of(events))
    assert bm.skipped == 0 and bm.timeline(1).approximate
    record = bm.record(1)
    assert record is not None and record.backward_start is None
    unready, divergence = bm.health
    assert unready.fqns == ["a.weight", "b.weight"] and divergence.fqns == ["b.weight"]
    assert (
        "got a gradient twice" in divergence.message and "use_reentrant=False" in divergence.message
    )
