"""Property-based tests of the wire decoder and of event validation (Hypothesis).

The properties: whatever arrives, decoding raises ``msgspec.DecodeError`` (its
``ValidationError`` and ``schema.MessageError`` included) and nothing else; an event is
accepted exactly when an independent reading of the schema (``_valid_event`` below)
says it is valid; what ``emit`` accepts, the collector accepts; the collector counts
every message it does not pass on.
"""

from __future__ import annotations

import datetime
import math
from collections.abc import Iterator
from typing import Any

import hostile
import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from interactive_shard.telemetry import Collector, PayloadError, schema
from interactive_shard.telemetry.schema import MAX_PAYLOAD_DEPTH, MAX_WORLD_SIZE, Event

FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
TOKEN = "fuzz-token"
INT64 = 2**63


# -- an independent reading of the schema ---------------------------------------------------
def _depth(value: Any) -> int:
    if isinstance(value, (list, tuple)):
        return 1 + max(map(_depth, value), default=0)
    if isinstance(value, dict):
        return 1 + max(map(_depth, value.values()), default=0)
    return 0


def _plain(value: Any) -> bool:
    if value is None or isinstance(value, (str, bool, int, float)):
        return True
    if isinstance(value, (list, tuple)):
        return all(map(_plain, value))
    if isinstance(value, dict):
        return all(isinstance(k, str) for k in value) and all(map(_plain, value.values()))
    return False  # bytes, Ext, datetime...


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _valid_event(raw: Any) -> bool:
    """[kind, rank, step, t] or [kind, rank, step, t, payload], exactly."""
    if not isinstance(raw, (list, tuple)) or len(raw) not in (4, 5):
        return False
    kind, rank, step, t = raw[:4]
    payload = raw[4] if len(raw) == 5 else {}
    return (
        isinstance(kind, str)
        and _is_int(rank)
        and 0 <= rank < MAX_WORLD_SIZE
        and _is_int(step)
        and -INT64 <= step < INT64
        and (_is_int(t) or isinstance(t, float))
        and math.isfinite(float(t))
        and isinstance(payload, dict)
        and all(isinstance(k, str) for k in payload)
        and all(_plain(v) and _depth(v) <= MAX_PAYLOAD_DEPTH for v in payload.values())
    )


# -- strategies ---------------------------------------------------------------------------
msgpack_ints = st.integers(-INT64, 2**64 - 1)
scalars = st.none() | st.booleans() | msgpack_ints | st.floats() | st.text(max_size=8)
plain = st.recursive(
    scalars,
    lambda kids: (
        st.lists(kids, max_size=3) | st.dictionaries(st.text(max_size=4), kids, max_size=3)
    ),
    max_leaves=12,
)
ext = st.builds(msgspec.msgpack.Ext, st.integers(0, 127), st.binary(max_size=8))
stamps = st.datetimes(timezones=st.just(datetime.timezone.utc))
odd_keys = st.dictionaries(
    msgpack_ints | st.booleans() | st.none() | st.floats(), scalars, min_size=1
)


def _nest(value: Any, levels: int) -> Any:
    for _ in range(levels):
        value = [value]
    return value


deep = st.builds(_nest, scalars, st.integers(MAX_PAYLOAD_DEPTH - 2, MAX_PAYLOAD_DEPTH + 6))
weird = scalars | st.binary(max_size=8) | ext | stamps | odd_keys | deep | plain
valid_events = st.tuples(
    st.text(max_size=10),
    st.integers(0, MAX_WORLD_SIZE - 1),
    st.integers(-INT64, INT64 - 1),
    st.floats(allow_nan=False, allow_infinity=False),
    st.dictionaries(st.text(max_size=5), plain | deep, max_size=4),
).map(list)


@st.composite
def near_valid_events(draw: st.DrawFn) -> list[Any]:
    """A valid event with one thing changed: a field, a payload value, the length."""
    event = draw(valid_events)
    how = draw(st.sampled_from(["field", "payload", "drop", "extra", "none"]))
    if how == "field":
        event[draw(st.integers(0, 4))] = draw(weird)
    elif how == "payload":
        event[4][draw(st.text(max_size=3))] = draw(weird)
    elif how == "drop":
        del event[draw(st.integers(3, 4)) :]
    elif how == "extra":
        event.append(draw(weird))
    return event


# -- properties ---------------------------------------------------------------------------
def _decode_or_none(body: bytes) -> list[Event] | None:
    try:
        return schema.decode_events(body)
    except msgspec.DecodeError:  # ValidationError and MessageError are subclasses
        return None


@FAST
@given(st.binary(max_size=400))
def test_arbitrary_bytes_raise_only_decode_errors(data: bytes) -> None:
    for attempt in (data, hostile.message(TOKEN, data)):
        try:
            batch = schema.decode_batch(attempt)
        except msgspec.DecodeError:
            continue
        assert all(_valid_event(msgspec.structs.astuple(e)) for e in batch.events)


@FAST
@given(st.lists(near_valid_events(), min_size=1, max_size=4))
def test_an_event_is_accepted_exactly_when_it_is_valid(events: list[list[Any]]) -> None:
    body = msgspec.msgpack.encode(events)
    decoded = _decode_or_none(body)
    assert (decoded is not None) == all(map(_valid_event, events))
    if decoded is not None:  # and accepted as sent
        # (an integer time arrives as the float it stands for)
        sent = [[*e[:3], float(e[3]), *(e[4:] or [{}])] for e in events]
        assert msgspec.msgpack.encode(decoded) == msgspec.msgpack.encode(sent)


@FAST
@given(st.dictionaries(st.text(max_size=4) | st.integers(), weird, max_size=4))
def test_what_emit_accepts_the_collector_accepts(payload: dict[Any, Any]) -> None:
    try:
        schema.check_payload("probe", payload)
    except PayloadError:
        return
    events = [Event("probe", 3, 1, 2.5, payload)]
    try:
        data = schema.encode_message(
            msgspec.msgpack.Encoder(), 1, schema.token_field(TOKEN), 1, 3, events
        )
    except (TypeError, ValueError, OverflowError):  # the Emitter drops (and counts) these
        return
    batch = schema.decode_batch(data)
    assert msgspec.msgpack.encode(batch.events) == msgspec.msgpack.encode(events)


@FAST
@given(
    st.integers(1, 64),
    st.integers(-3, 70),
    st.lists(st.integers(-3, 70), max_size=5),
)
def test_check_batch_refuses_exactly_foreign_or_unknown_ranks(
    world_size: int, rank: int, event_ranks: list[int]
) -> None:
    events = [Event("x", r, 0, 0.0) for r in event_ranks]
    batch = schema.Batch(schema.SCHEMA_VERSION, TOKEN, 1, rank, events)
    ok = 0 <= rank < world_size and all(r == rank for r in event_ranks)
    try:
        schema.check_batch(batch, world_size)
    except schema.MessageError as exc:
        assert not ok
        assert exc.reason in (schema.UNKNOWN_RANK, schema.RANK_MISMATCH)
    else:
        assert ok


@pytest.fixture(scope="module")
def collector() -> Iterator[tuple[Collector, list[schema.Batch]]]:
    received: list[schema.Batch] = []
    c = Collector(received.append, token=TOKEN)
    yield c, received
    c.close()


@FAST
@given(
    st.binary(max_size=200) | st.lists(near_valid_events(), max_size=3).map(msgspec.msgpack.encode)
)
def test_the_collector_counts_every_message_it_does_not_pass_on(
    collector: tuple[Collector, list[schema.Batch]], body: bytes
) -> None:
    c, received = collector
    before = c.rejected + len(received)
    for data in (body, hostile.message(TOKEN, body), hostile.message("other", body)):
        c._receive(memoryview(data))  # as the thread does; raises nothing
    assert c.rejected + len(received) == before + 3
