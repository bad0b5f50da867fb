"""RunStore's index per kind and the Cursor that reads it (Hypothesis: any interleaving)."""

from __future__ import annotations

import logging

import pytest
from hypothesis import given
from hypothesis import strategies as st

from interactive_shard.telemetry.consume import Cursor
from interactive_shard.telemetry.run_events import Scalar, State
from interactive_shard.telemetry.schema import Event
from interactive_shard.telemetry.store import RunInfo, RunStore

KINDS = ("scalar", "state", "log")


def make_store() -> RunStore:
    return RunStore(RunInfo(world_size=2, backend="gloo", device_types=["cpu"]))


def event(i: int, kind: str) -> Event:
    payload = {"name": "x", "value": float(i)} if kind == "scalar" else {"state": "running"}
    return Event(kind, i % 2, i, float(i), payload)


@given(
    st.lists(st.lists(st.sampled_from(KINDS), max_size=8), max_size=8),
    st.sets(st.sampled_from(KINDS)),
)
def test_since_returns_the_kinds_new_events_in_log_order(
    batches: list[list[str]], kinds: set[str]
) -> None:
    store, position, seen, i = make_store(), 0, [], 0
    for batch in batches:
        store.extend(event(i + j, k) for j, k in enumerate(batch))
        i += len(batch)
        events, position = store.since(position, kinds)
        seen += events
        assert position == len(store)
    assert seen == [e for e in store.events() if e.kind in kinds]
    assert store.since(position, kinds) == ([], position)


@given(
    st.lists(st.lists(st.sampled_from(KINDS), max_size=40), max_size=6),
    st.sets(st.sampled_from(KINDS)),
    st.integers(0, 250),
)
def test_since_any_start_reads_runs_or_filters_alike(
    batches: list[list[str]], kinds: set[str], start: int
) -> None:
    """Long runs are read per run, short interleaved ones by filtering the new events:
    either way the kinds' events from ``start`` on, in log order."""
    store, i = make_store(), 0
    for batch in batches:
        store.extend(event(i + j, k) for j, k in enumerate(batch))
        i += len(batch)
    start = min(start, len(store))
    assert store.since(start, kinds) == (
        [e for e in store.events(start) if e.kind in kinds],
        len(store),
    )


def test_a_cursor_converts_in_bulk_and_skips_only_what_does_not_fit(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store = make_store()
    cursor = Cursor(store, {"scalar": Scalar, "state": State})
    good = [event(i, "scalar") for i in range(5)]
    bad = Event("scalar", 0, 9, 9.0, {"name": "x", "value": "not a number"})
    store.extend([*good[:2], event(2, "state"), bad, event(3, "log"), *good[2:]])
    with caplog.at_level(logging.WARNING):
        taken = cursor.take()
    assert [k for _, k, _ in taken] == ["scalar", "scalar", "state", "scalar", "scalar", "scalar"]
    assert [r.value for _, k, r in taken if k == "scalar"] == [0.0, 1.0, 2.0, 3.0, 4.0]
    assert cursor.skipped == 1 and cursor.take() == []
    assert cursor.take_events() == []
    store.append(good[0])
    assert cursor.take_events() == [good[0]]


@given(
    st.lists(st.lists(st.sampled_from(KINDS), max_size=40), max_size=6),
    st.sets(st.sampled_from(KINDS)),
    st.integers(0, 250),
    st.booleans(),
)
def test_positions_and_columns_find_the_kinds_events_untouched(
    batches: list[list[str]], kinds: set[str], start: int, one_rank: bool
) -> None:
    """``positions`` + ``columns`` + ``at`` say what ``since`` does, as numpy columns;
    a batch said to be one rank's (the collector's) files that rank for each event."""
    store, i = make_store(), 0
    for batch in batches:
        made = [event(i + j, k) for j, k in enumerate(batch)]
        if one_rank:
            made = [Event(e.kind, 1, e.step, e.t, e.payload) for e in made]
        store.extend(made, rank=1 if one_rank else None)
        i += len(batch)
    start = min(start, len(store))
    positions, end = store.positions(start, kinds)
    expected = store.since(start, kinds)[0]
    assert end == len(store) and store.at(positions.tolist()) == expected
    ranks, steps = store.columns(positions)
    assert ranks.tolist() == [e.rank for e in expected]
    assert steps.tolist() == [e.step for e in expected]
