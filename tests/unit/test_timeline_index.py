"""The timeline index files batches from the store's rank and step columns (positions,
not events): what it files must equal what reading every event gives, whatever the
order, splits, restarts and chunks of arrival, in numpy or through the payloads."""

from __future__ import annotations

from typing import Any

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st
from support import make_store

from interactive_shard.telemetry.schema import Event
from interactive_shard.timeline.events import TimelineSpans, TimelineWatch
from interactive_shard.timeline.model import TimelineModel


def watch(rank: int, by_step: bool) -> Event:
    w = TimelineWatch(
        target="fsdp2", depth=None, modules=[""], world_size=3, host="h", step_is_iteration=by_step
    )
    return Event(TimelineWatch.KIND, rank, 0, 0.0, msgspec.to_builtins(w))


def batch(rank: int, iteration: int, k: int, by_step: bool) -> Event:
    spans = [{"kind": "forward", "name": f"m{k}", "start": float(k), "end": k + 0.5}]
    step = iteration if by_step else 0  # an old recording's step: the user's ctx.step
    return Event(TimelineSpans.KIND, rank, step, 1.0, {"iteration": iteration, "spans": spans})


def expected(events: list[Event]) -> dict[int, dict[int, list[int]]]:
    """rank -> iteration -> the log positions of its batches, reading every event: a
    rank's batches after its last watch (a watch restarts the rank); a rank watched
    but with no batch since maps to nothing."""
    out: dict[int, dict[int, list[int]]] = {}
    for at, e in enumerate(events):
        if e.kind == TimelineWatch.KIND:
            out[e.rank] = {}
        else:
            out.setdefault(e.rank, {}).setdefault(e.payload["iteration"], []).append(at)
    return out


RANKS = (0, 1, 2, 20)
stream = st.lists(
    st.tuples(
        st.integers(0, 3),  # RANKS[i]: a few close ones (a mask each), one far (a sort)
        st.integers(1, 12),  # iteration
        st.integers(0, 40),  # 0: this item is a watch (restarts the rank) instead
    ),
    max_size=60,
)


@settings(max_examples=150, deadline=None)
@given(
    items=stream,
    by_step=st.lists(st.booleans(), min_size=4, max_size=4),
    watched=st.lists(st.booleans(), min_size=4, max_size=4),
    chunks=st.lists(st.integers(1, 20), max_size=8),
)
def test_filing_equals_reading_every_event(
    items: list[tuple[int, int, int]], by_step: list[bool], watched: list[bool], chunks: list[int]
) -> None:
    events = [watch(r, by_step[i]) for i, r in enumerate(RANKS) if watched[i]]
    for n, (i, it, k) in enumerate(items, 1):  # a batch's span starts at n: arrival order
        r = RANKS[i]
        events.append(watch(r, by_step[i]) if k == 0 else batch(r, it, n, by_step[i]))
    store = make_store()
    m = TimelineModel(store)
    start = 0
    for n in [*chunks, len(events)]:  # arrives in chunks, an update after each
        store.extend(events[start : start + n])
        start += n
        m.update()
    want = expected(events)
    assert m.ranks == sorted(want)
    assert m.iterations() == sorted({it for its in want.values() for it in its})
    for r, its in want.items():
        here = m._index.ranks[r]
        assert m.iterations(r) == sorted(its)
        assert {it: here.positions(it) for it in its} == its
        for it, at in its.items():  # decoded: every batch's spans, in arrival order
            names = [s["name"] for a in at for s in events[a].payload["spans"]]
            assert m.order(r, it, None) == names and m.has(r, it)
        assert not m.has(r, 13) and m._index.ranks[r].positions(13) == []
    assert m.skipped == 0


def test_batches_with_steps_below_one_are_refused_and_counted_when_malformed() -> None:
    good = batch(0, 1, 1, True)
    bad: dict[str, Any] = {"iteration": 0, "spans": "nope"}
    events = [
        watch(0, True),
        good,
        Event(TimelineSpans.KIND, 0, 0, 1.0, bad),  # step 0 and malformed: counted
        Event(TimelineSpans.KIND, 0, -3, 1.0, dict(good.payload)),  # step -3: refused
    ]
    m = TimelineModel(make_store(events))
    assert m.iterations(0) == [1] and m.skipped == 1
    assert m.order(0, 1, None) == ["m1"] and m.skipped == 1


def test_a_rank_beyond_the_rank_column_is_filed_under_its_real_rank() -> None:
    big = 2**40  # the store's rank column holds -1 for it (an event made in Python)
    events = [watch(big, True), batch(big, 2, 1, True), batch(0, 3, 1, False)]
    m = TimelineModel(make_store(events))
    assert m.ranks == [0, big] and m.iterations(big) == [2] and m.iterations() == [2, 3]
    assert m.order(big, 2, None) == ["m1"] and m.skipped == 0


def test_a_late_batch_is_merged_in_order() -> None:
    events = [watch(0, True), *(batch(0, it, 1, True) for it in (1, 2, 5, 6))]
    store = make_store(events)
    m = TimelineModel(store)
    assert m.iterations() == [1, 2, 5, 6]
    store.extend([batch(0, 3, 1, True), batch(0, 7, 1, True), batch(0, 5, 2, True)])
    assert m.update() is True
    assert m.iterations() == m.iterations(0) == [1, 2, 3, 5, 6, 7]
    assert m.order(0, 5, None) == ["m1", "m2"] and m._index.ranks[0].positions(5) == [3, 7]
