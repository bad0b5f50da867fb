"""The channel under a hostile or missing peer: what is refused, counted, bounded."""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Iterator

import hostile
import numpy as np
import pytest
import zmq
from support import wait_for

from interactive_shard.telemetry import (
    Collector,
    Emitter,
    Event,
    PayloadError,
    channel,
    emitter,
    rank,
    schema,
)
from interactive_shard.telemetry.schema import MAX_MESSAGE_BYTES, MAX_PAYLOAD_DEPTH, Batch


@pytest.fixture
def collector() -> Iterator[tuple[Collector, list[Batch]]]:
    received: list[Batch] = []
    c = Collector(received.append)
    yield c, received
    c.close()


@pytest.fixture
def push(collector: tuple[Collector, list[Batch]]) -> Iterator[zmq.Socket]:
    ctx = zmq.Context()
    sock = ctx.socket(zmq.PUSH)
    sock.connect(collector[0].address)
    yield sock
    sock.close(linger=0)
    ctx.term()


def _good(token: str, value: int = 0) -> bytes:
    body = hostile.events_body(["scalar", 0, value, 1.0, {"value": value}])
    return hostile.message(token, body, flags=schema.FINAL)


def test_every_hostile_shape_is_counted_by_reason_and_the_next_good_one_arrives(
    collector: tuple[Collector, list[Batch]], push: zmq.Socket
) -> None:
    c, received = collector
    shapes = {**hostile.unauthenticated_shapes(c.token), **hostile.authenticated_shapes(c.token)}
    expected: dict[str, int] = {}
    for data, reason in shapes.values():
        push.send(data)
        expected[reason] = expected.get(reason, 0) + 1
    push.send(_good(c.token, 7))
    wait_for(lambda: received)
    assert c.rejected_by_reason == expected
    assert c.rejected == len(shapes)
    assert [e.payload for b in received for e in b.events] == [{"value": 7}]
    assert c._thread.is_alive()


def test_wrong_token_is_refused_before_the_body_is_decoded(
    collector: tuple[Collector, list[Batch]], push: zmq.Socket, monkeypatch: pytest.MonkeyPatch
) -> None:
    c, received = collector
    decoded: list[int] = []
    real = schema.decode_body

    def spy(flags: int, buf: memoryview) -> tuple[list[Event], list[schema.ScalarRun]]:
        decoded.append(len(buf))
        return real(flags, buf)

    monkeypatch.setattr(schema, "decode_body", spy)
    push.send(hostile.message(hostile.WRONG, b"\x90" * (MAX_MESSAGE_BYTES // 2)))
    push.send(_good(c.token))
    wait_for(lambda: received)
    assert c.rejected_by_reason == {schema.WRONG_TOKEN: 1}
    assert decoded == [len(_good(c.token)) - schema.HEADER_SIZE]  # only the good one


def test_oversized_message_is_counted_and_a_clean_close_is_not(
    collector: tuple[Collector, list[Batch]], push: zmq.Socket
) -> None:
    c, received = collector
    em = Emitter(c.address, c.token, rank=0)
    em.emit("scalar", {"value": 1})
    em.flush(final=True)
    wait_for(lambda: received)
    em.close()  # says BYE first: not a drop
    push.send(hostile.message(hostile.WRONG, b"\x90" * MAX_MESSAGE_BYTES))  # over by its header
    wait_for(lambda: c.rejected)
    time.sleep(0.2)  # the Emitter's disconnect, if it were counted, has been seen by now
    assert c.rejected_by_reason == {channel.CONNECTION_DROPPED: 1}


def test_emitter_splits_a_batch_too_large_for_one_message(
    collector: tuple[Collector, list[Batch]],
) -> None:
    c, received = collector
    em = Emitter(c.address, c.token, rank=0, flush_interval=3600, max_batch=10**6)
    text = "x" * (MAX_MESSAGE_BYTES // 5)
    try:
        for i in range(12):  # ~2.4 messages' worth
            em.emit("blob", {"i": i, "text": text})
        em.emit("blob", {"i": 12, "text": "x" * MAX_MESSAGE_BYTES})  # can never fit: dropped
        em.emit("blob", {"i": 13})
        em.flush(final=True)
        wait_for(lambda: any(b.final for b in received))
    finally:
        em.close()
    assert [e.payload["i"] for b in received for e in b.events] == [*range(12), 13]
    assert len(received) >= 3 and received[-1].final
    assert em.dropped == 1 and c.rejected == 0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_emitter_without_a_collector_never_blocks_the_rank(
    caplog: pytest.LogCaptureFixture,
) -> None:
    em = Emitter(f"tcp://127.0.0.1:{_free_port()}", "tok", rank=0, send_timeout=0.5)
    t0 = time.monotonic()
    for i in range(5000):
        em.emit("scalar", {"value": i})
        em.flush()
    em.close()
    elapsed = time.monotonic() - t0
    assert elapsed < 0.5 + 5.0, f"5,000 flushes and close() took {elapsed:.1f} s"
    assert em.dropped >= 5000 - emitter.SEND_QUEUE_BATCHES  # the queue holds the rest
    stalls = [r for r in caplog.records if "dropped events" in r.getMessage()]
    assert len(stalls) == 1, "one warning per stall, not one per batch"


def test_rank_close_is_bounded_without_a_collector(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(emitter, "SEND_TIMEOUT_S", 0.3)
    em = rank.connect(f"tcp://127.0.0.1:{_free_port()}", "tok", rank=1)
    t0 = time.monotonic()
    for i in range(emitter.SEND_QUEUE_BATCHES + 50):
        em.emit("scalar", {"value": i})
        em.flush()
    rank.close()
    assert time.monotonic() - t0 < 5.0
    assert rank.emitter() is None and em.dropped > 0


def test_collector_close_during_a_long_consumer_call_leaves_the_socket_to_its_thread() -> None:
    inside, errors = threading.Event(), []

    def slow(batch: Batch) -> None:
        inside.set()
        time.sleep(2.5)  # longer than any fixed join timeout of close()

    old_hook = threading.excepthook
    threading.excepthook = lambda args: errors.append(args.exc_value)
    ctx = zmq.Context()
    push = ctx.socket(zmq.PUSH)
    try:
        c = Collector(slow)
        port = int(c.address.rsplit(":", 1)[1])
        push.connect(c.address)
        push.send(_good(c.token))
        assert inside.wait(5)
        c.close()
        assert not c._thread.is_alive()
        assert c._sock.closed and c._ctx.closed
        Collector(lambda b: None, port=port).close()  # the port is free again
    finally:
        threading.excepthook = old_hook
        push.close(linger=0)
        ctx.term()
    assert errors == []


def test_rejections_log_once_then_one_summary_per_interval(
    collector: tuple[Collector, list[Batch]],
    push: zmq.Socket,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    c, _ = collector
    monkeypatch.setattr(channel, "SUMMARY_INTERVAL_S", 0.5)
    caplog.set_level(logging.WARNING, logger=channel.__name__)
    for _ in range(3000):
        push.send(b"garbage garbage garbage garbage garbage garbage garbage garbage garbage!")
    for _ in range(1000):
        push.send(hostile.message(hostile.WRONG, b""))
    wait_for(lambda: c.rejected == 4000)
    time.sleep(1.2)
    lines = [r.getMessage() for r in caplog.records if r.name == channel.__name__]
    assert 2 <= len(lines) <= 4, lines  # first + one summary per 0.5 s of flood
    assert "dropped a message" in lines[0]
    assert "3999 more" in lines[-1] or "in all" in lines[-1]
    assert c.rejected_by_reason == {schema.NOT_OURS: 3000, schema.WRONG_TOKEN: 1000}


def test_token_must_fit_the_header_field() -> None:
    with pytest.raises(ValueError, match=r"1 to 64 UTF-8 bytes.*got 65 bytes"):
        Collector(lambda b: None, token="x" * 65)
    c = Collector(lambda b: None, token="tök\u00e9n")  # any UTF-8, compared as bytes
    c.close()


def test_emit_refuses_what_the_collector_would_refuse() -> None:
    em = Emitter.__new__(Emitter)  # the checks run before any socket use
    em.rank, em._step = 0, 0
    nested: object = 1
    for _ in range(MAX_PAYLOAD_DEPTH + 1):
        nested = [nested]
    with pytest.raises(PayloadError, match=f"more than {MAX_PAYLOAD_DEPTH}"):
        Emitter.emit(em, "probe", {"deep": nested})
    with pytest.raises(PayloadError, match="key 1 is not a str"):
        Emitter.emit(em, "probe", {1: 2})
    with pytest.raises(PayloadError, match="step must be a 64-bit int, got float"):
        Emitter.emit(em, "probe", {}, step=1.5)  # type: ignore[arg-type]
    with pytest.raises(PayloadError, match=r"Emitter\.step must be a 64-bit int"):
        em.step = 2**63  # type: ignore[misc]
    em.step = np.int64(3)  # type: ignore[misc, assignment]
    assert type(em.step) is int and em.step == 3


def test_listener_refuses_batches_for_foreign_or_unknown_ranks() -> None:
    from interactive_shard.cluster.listen import Listener

    def batch(rank: int, *event_ranks: int, final: bool = False) -> Batch:
        events = [Event("scalar", r, 0, 0.0, {"value": 1}) for r in event_ranks]
        return Batch(schema.SCHEMA_VERSION, "tok", 1, rank, events, final)

    with Listener(world_size=2) as listener:
        for bad in (batch(0, 1), batch(0, 0, -1), batch(2, 2, final=True), batch(-1, final=True)):
            with pytest.raises(schema.MessageError):
                listener._on_batch(bad)
        listener._on_batch(batch(1, 1, final=True))
        assert [e.rank for e in listener.run.store.events()] == [1]
        assert listener.streams_closed == {1}
        # The same through the channel: counted by reason.
        ctx = zmq.Context()
        sock = ctx.socket(zmq.PUSH)
        sock.connect(listener.address)
        body = hostile.events_body(["scalar", 1, 0, 1.0, {}])
        sock.send(hostile.message(listener.token, body, rank=0))
        sock.send(hostile.message(listener.token, hostile.events_body(), rank=5, flags=1))
        c = listener._collector
        wait_for(lambda: c.rejected == 2)
        assert c.rejected_by_reason == {schema.RANK_MISMATCH: 1, schema.UNKNOWN_RANK: 1}
        sock.close(linger=0)
        ctx.term()
        assert len(listener.run.store) == 1 and listener.streams_closed == {1}


def test_threads_emitting_while_flushes_run_lose_nothing(
    collector: tuple[Collector, list[Batch]],
) -> None:
    """Note [Lock-free emit]: emits append without a lock while the timed flusher, full
    buffers and explicit flushes send; every event arrives once, each thread's in order."""
    c, received = collector
    em = Emitter(c.address, c.token, rank=0, flush_interval=0.001, max_batch=97)
    threads, per_thread = 4, 5000

    def emit_many(t: int) -> None:
        for i in range(per_thread):
            em.emit("scalar", {"name": f"t{t}", "value": i})
            if i % 1000 == 0:
                em.flush()

    workers = [threading.Thread(target=emit_many, args=(t,)) for t in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    em.flush(final=True)
    wait_for(lambda: any(b.final for b in received))
    em.close()
    seen: dict[str, list[int]] = {}
    for batch in received:
        for e in batch.events:
            if e.kind == "scalar":  # not the emitter's own cost (Overhead "sending")
                seen.setdefault(e.payload["name"], []).append(e.payload["value"])
    assert em.dropped == 0
    assert seen == {f"t{t}": list(range(per_thread)) for t in range(threads)}
