"""Schema, channel and store: round trips, validation, rejection of bad messages."""

from __future__ import annotations

import msgspec
import pytest
import torch
import zmq
from support import make_store, wait_for

from interactive_shard.telemetry import Collector, Emitter, Event, PayloadError
from interactive_shard.telemetry.consume import Cursor
from interactive_shard.telemetry.rank import before_flush
from interactive_shard.telemetry.schema import SCHEMA_VERSION, Batch, decode_batch, encode_batch


def test_batch_round_trip_keeps_plain_payloads() -> None:
    events = [Event("scalar", 1, 3, 1.5, {"name": "loss", "value": 0.25, "tags": [1, "a"]})]
    batch = Batch(SCHEMA_VERSION, "tok", 7, 1, events, final=True)
    assert decode_batch(encode_batch(batch)) == batch


@pytest.mark.parametrize("bad", [b"", b"\x93\x01", b"not msgpack at all", b"\x95\x01\x02"])
def test_malformed_messages_fail_validation(bad: bytes) -> None:
    with pytest.raises((msgspec.ValidationError, msgspec.DecodeError)):
        decode_batch(bad)


def test_payload_check_names_the_bad_value() -> None:
    emitter_like = Emitter.__new__(Emitter)  # check_payload runs before any socket use
    with pytest.raises(PayloadError, match=r"'grad'.*torch\.Tensor.*\.item\(\)"):
        Emitter.emit(emitter_like, "probe", {"ok": 1, "grad": [torch.ones(1)]})


def test_emitter_to_collector_delivers_everything_in_order() -> None:
    received: list[Batch] = []
    collector = Collector(received.append)
    emitter = Emitter(collector.address, collector.token, rank=1)
    try:
        for i in range(5000):
            emitter.emit("scalar", {"name": "x", "value": i}, step=i)
        emitter.flush(final=True)
        wait_for(lambda: any(b.final for b in received))
        values = [e.payload["value"] for b in received for e in b.events]
        assert values == list(range(5000))
        assert all(b.rank == 1 for b in received)
    finally:
        emitter.close()
        collector.close()


class _Holder:
    """A probe that holds records until an explicit flush (as the precision probe)."""

    def __init__(self, emitter: Emitter, fail: bool = False) -> None:
        self.emitter, self.fail, self.held = emitter, fail, [1, 2]

    def send(self) -> None:
        if self.fail:
            raise RuntimeError("a probe bug")
        for value in self.held:
            self.emitter.emit("scalar", {"name": "held", "value": value})
        self.held = []


def test_explicit_flushes_run_the_hooks_timed_flushes_do_not() -> None:
    received: list[Batch] = []
    collector = Collector(received.append)
    emitter = Emitter(collector.address, collector.token, rank=0, flush_interval=0.005)
    holder, broken = _Holder(emitter), _Holder(emitter, fail=True)
    remove = before_flush(holder.send)
    before_flush(broken.send)  # raises: logged, the flush goes on
    collected = _Holder(emitter)
    before_flush(collected.send)
    del collected  # held weakly: gone with its object
    try:
        emitter.emit("scalar", {"name": "x", "value": 0})
        wait_for(lambda: len(received) == 1)  # the timed flush: no hook ran
        assert holder.held == [1, 2]
        emitter.flush()
        remove()
        holder.held = [3]
        emitter.flush(final=True)
        wait_for(lambda: any(b.final for b in received))
        # (the emitter's own cost, Overhead "sending", goes out with explicit flushes too)
        values = [e.payload["value"] for b in received for e in b.events if e.kind == "scalar"]
        assert values == [0, 1, 2] and holder.held == [3]
    finally:
        emitter.close()
        collector.close()


def test_collector_drops_wrong_token_and_garbage() -> None:
    received: list[Batch] = []
    collector = Collector(received.append)
    ctx = zmq.Context()
    sock = ctx.socket(zmq.PUSH)
    sock.connect(collector.address)
    try:
        sock.send(b"garbage")
        sock.send(encode_batch(Batch(SCHEMA_VERSION, "wrong", 1, 0, [])))
        sock.send(encode_batch(Batch(SCHEMA_VERSION + 1, collector.token, 1, 0, [])))
        sock.send(encode_batch(Batch(SCHEMA_VERSION, collector.token, 1, 0, [], final=True)))
        wait_for(lambda: len(received) == 1)
        assert collector.rejected == 3
    finally:
        sock.close(linger=0)
        ctx.term()
        collector.close()


def test_collector_beyond_loopback_needs_a_token() -> None:
    with pytest.raises(ValueError, match="needs a token"):
        Collector(lambda b: None, host="0.0.0.0")


def test_store_is_append_only_with_cursor() -> None:
    store = make_store()
    store.append(Event("a", 0, 0, 0.0, {}))
    cursor = store.version
    store.extend([Event("b", 1, 0, 0.0, {}), Event("a", 1, 1, 0.0, {})])
    assert [e.kind for e in store.events(cursor)] == ["b", "a"]
    assert len(store.of_kind("a")) == 2
    assert store.version == 3


def test_cursor_takes_new_events_of_its_kinds_decoded_and_counts_what_does_not_fit() -> None:
    class Thing(msgspec.Struct, kw_only=True):
        name: str
        rank: int = -1

    store = make_store(
        [
            Event("thing", 0, 0, 1.0, {"name": "a"}),
            Event("other", 0, 0, 1.0, {"x": 1}),  # not its kind: passed over
            Event("thing", 1, 0, 1.0, {"name": 3}),  # does not fit: skipped, counted
        ]
    )
    cursor = Cursor(store, {"thing": Thing}, with_rank=True)
    assert cursor.take() == [(0, "thing", Thing(name="a", rank=0))]
    assert cursor.skipped == 1 and cursor.take() == []
    store.extend([Event("thing", 1, 0, 2.0, {"name": "b"})])
    assert cursor.take() == [(1, "thing", Thing(name="b", rank=1))]
    cursor.skip(1, "thing", "a model's own check")
    assert cursor.skipped == 2
