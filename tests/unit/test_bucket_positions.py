"""The bucket map files events by their log positions (Note [Lazy bucket events] in
``buckets/_lazy_events.py``): an update touches no event, and every lookup equals what
decoding every event gives, however the events arrive."""

from __future__ import annotations

from typing import Any
from unittest import mock

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st
from support import make_store

from interactive_shard.buckets import _lazy_events
from interactive_shard.buckets.events import BucketReduced, DdpIteration, DdpWatch
from interactive_shard.buckets.model import BucketMap
from interactive_shard.telemetry.schema import Event
from interactive_shard.telemetry.store import RunStore
from interactive_shard.testing import FakeRun, mlp_params

WATCH, BUCKET, ITERATION = DdpWatch.KIND, BucketReduced.KIND, DdpIteration.KIND
CAP_MB = 0.0003  # 2 layers of Linear(8, 8) rebuild into 2 buckets


def run(iterations: int) -> list[Event]:
    return FakeRun(mlp_params(2, 8), iterations=iterations, bucket_cap_mb=CAP_MB).events()


def counting(store: RunStore) -> list[int]:
    """The positions ``store.at`` is asked for from now on."""
    asked: list[int] = []
    fetch = store.at

    def at(positions: Any) -> list[Event]:
        positions = list(positions)
        asked.extend(positions)
        return fetch(positions)

    store.at = at  # type: ignore[method-assign]
    return asked


def test_an_update_files_the_new_events_by_position_and_touches_none() -> None:
    events = run(200)
    store = make_store(events[:100])
    bm = BucketMap(store)
    assert bm.update()
    asked = counting(store)
    filed = len(bm._buckets), len(bm._records)
    store.extend(events[100:])
    assert bm.update() and not bm.update()
    new = events[100:]
    assert len(bm._buckets) - filed[0] == sum(e.kind == BUCKET for e in new)
    assert len(bm._records) - filed[1] == sum(e.kind == ITERATION for e in new)
    assert asked == [] and [r.indexed for r in (bm._buckets, bm._records)] == [0, 0]
    # The newest iteration and its buckets: a few events fetched from the end.
    assert bm.newest == 200 and len(bm.observed(200, rank=1)) == 2
    assert 0 < len(set(asked)) < len(events) // 4 and min(asked) > len(events) // 2


def counted(events: list[Event]) -> list[int]:
    """Where the bucket and record events that count are: a rank watched again keeps
    only what came after its last watch."""
    watches: dict[int, list[int]] = {}
    for i, e in enumerate(events):
        if e.kind == WATCH:
            watches.setdefault(e.rank, []).append(i)
    return [
        i
        for i, e in enumerate(events)
        if e.kind != WATCH and not (len(watches.get(e.rank, [])) > 1 and i < watches[e.rank][-1])
    ]


def decoded(e: Event) -> Any:
    try:
        return msgspec.convert(e.payload, BucketReduced if e.kind == BUCKET else DdpIteration)
    except (msgspec.ValidationError, TypeError):
        return None


def reference(events: list[Event]) -> dict[tuple[str, int, int], list[Any]]:
    """(kind, iteration, rank) -> the decodable records of the events that count, in
    log order."""
    found: dict[tuple[str, int, int], list[Any]] = {}
    for i in counted(events):
        e = events[i]
        record = decoded(e)
        if record is not None:
            found.setdefault((e.kind, record.iteration, e.rank), []).append(record)
    return found


def malformed(events: list[Event]) -> int:
    """What a model that read every iteration counts: each event whose iteration
    cannot be read, and each that counts and does not decode."""
    unread = sum(e.kind != WATCH and e.payload.get("iteration") is None for e in events)
    live = counted(events)
    return unread + sum(
        events[i].payload.get("iteration") is not None and decoded(events[i]) is None for i in live
    )


@st.composite
def streams(draw: st.DrawFn) -> tuple[list[Event], list[int]]:
    """A run's events (a rank perhaps watched again, malformed events among them), cut
    into batches."""
    events = run(draw(st.integers(1, 12)))
    if draw(st.booleans()):  # rank 0 or 1 watched again, then a few iterations
        rank = draw(st.integers(0, 1))
        events += [e for e in run(draw(st.integers(1, 4))) if e.rank == rank]
    for _ in range(draw(st.integers(0, 3))):
        at = draw(st.integers(1, len(events)))
        like = events[at - 1]
        if like.kind == WATCH:
            continue
        if draw(st.booleans()):  # no iteration: skipped when indexed
            payload = {**like.payload, "iteration": None}
        else:  # its iteration readable, a field not: skipped when decoded
            payload = {
                **like.payload,
                "backward_start" if like.kind == ITERATION else "nbytes": "x",
            }
        events.insert(at, Event(like.kind, like.rank, like.step, like.t, payload))
    cuts = sorted(draw(st.lists(st.integers(0, len(events)), max_size=4)))
    return events, [*cuts, len(events)]


@settings(max_examples=60, deadline=None)
@given(streams(), st.sampled_from([(4096, 64), (6, 2), (1, 1)]))
def test_lookups_equal_decoding_every_event(
    stream: tuple[list[Event], list[int]], walk: tuple[int, int]
) -> None:
    events, cuts = stream
    store = make_store([])
    bm = BucketMap(store)
    with (
        mock.patch.object(_lazy_events, "WALK", walk[0]),
        mock.patch.object(_lazy_events, "CHUNK", walk[1]),
    ):
        done = 0
        for cut in cuts:
            store.extend(events[done:cut])
            done = cut
            want = reference(events[:cut])
            top = max((key[1] for key in want), default=None)
            assert bm.newest == top
            for rank in (0, 1):
                if top is not None:  # what a live view asks: the newest iteration
                    assert lookups(bm, top, rank) == expected(want, top, rank)
        assert bm.iterations == sorted({key[1] for key in want})
        for iteration in bm.iterations:
            for rank in (0, 1):
                assert lookups(bm, iteration, rank) == expected(want, iteration, rank)
    # Each counted once: those read (all of the live ones by now; a superseded one if
    # it was looked up before its rank was watched again).
    bad = sum(decoded(e) is None for e in events if e.kind != WATCH)
    assert malformed(events) <= bm.skipped <= bad


def lookups(bm: BucketMap, iteration: int, rank: int) -> tuple[list[Any], Any]:
    return [msgspec.to_builtins(b) for b in bm.observed(iteration, rank)], msgspec.to_builtins(
        bm.record(iteration, rank)
    )


def expected(want: dict[tuple[str, int, int], list[Any]], iteration: int, rank: int) -> Any:
    by_index = {b.index: b for b in want.get((BUCKET, iteration, rank), [])}  # the later
    records = want.get((ITERATION, iteration, rank), [])
    return [msgspec.to_builtins(by_index[i]) for i in sorted(by_index)], msgspec.to_builtins(
        records[-1] if records else None
    )


def test_malformed_events_are_counted_once_when_read() -> None:
    events = run(3)
    bucket = next(e for e in events if e.kind == BUCKET and e.rank == 1)
    record = next(e for e in events if e.kind == ITERATION and e.rank == 0)
    events += [
        Event(BUCKET, 1, 3, 2000.0, {**bucket.payload, "iteration": None}),
        Event(ITERATION, 0, 3, 2000.0, {**record.payload, "iteration": 3, "checksums": 7}),
    ]
    bm = BucketMap(make_store(events))
    assert bm.skipped == 0  # filed unread
    assert bm.iterations == [1, 2, 3] and bm.skipped == 1  # no iteration: when indexed
    assert bm.record(3, rank=0) is not None and bm.skipped == 2  # the older one decodes
    assert bm.record(3, rank=0) is not None and bm.health == [] and bm.skipped == 2


def test_a_lookup_sees_new_events_when_indexing_drops_as_many() -> None:
    # Indexing drops an unreadable event's row: with one new event, as many rows as
    # when iteration 2 was looked up, and the lookup must not be served from then.
    events = run(2)
    last = events.pop()  # iteration 2's last bucket on rank 1
    assert (last.kind, last.rank, last.payload["iteration"]) == (BUCKET, 1, 2)
    at, like = next((i, e) for i, e in enumerate(events) if e.kind == BUCKET)
    events.insert(
        at + 1, Event(BUCKET, like.rank, like.step, like.t, {**like.payload, "iteration": None})
    )
    store = make_store(events)
    bm = BucketMap(store)
    assert len(bm.observed(2, rank=1)) == 1  # found walking back: the unreadable one unread
    store.extend([last])
    assert bm.iterations == [1, 2] and bm.skipped == 1  # indexed: the unreadable one dropped
    assert [b.index for b in bm.observed(2, rank=1)] == [0, 1]
