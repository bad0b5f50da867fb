"""Columnar scalars (Note [Columnar scalars]): what the emitter buffers, the wire carries
and the store keeps must read back exactly as the same events sent one by one."""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import hostile
import msgspec
import numpy as np
import pytest
import zmq
from hypothesis import given, settings
from hypothesis import strategies as st

from interactive_shard.cluster.context import RankContext
from interactive_shard.monitor.model import MonitorModel
from interactive_shard.telemetry import Collector, Emitter, Event, recording, schema
from interactive_shard.telemetry._scalar_rows import _Scalar, _scalar_fields
from interactive_shard.telemetry.run_events import Scalar
from interactive_shard.telemetry.schema import SCHEMA_VERSION, Batch
from interactive_shard.telemetry.store import RunInfo, RunStore

RANK = 1
TOKEN = schema.token_field("t" * 16)
_ENCODER = msgspec.msgpack.Encoder()

floats = st.floats(allow_nan=True, allow_infinity=True)
scalar = st.tuples(st.sampled_from(["loss", "lr", "ü"]), floats, st.integers(-(2**63), 2**63 - 1))
other = st.tuples(st.sampled_from(["state", "progress", "bucket"]), st.integers(0, 9))
# Runs of scalars around the length that goes as columns, and other events between.
run_length = st.sampled_from([1, schema.MIN_COLUMNS - 1, schema.MIN_COLUMNS, 45, 70])
scalar_runs = run_length.flatmap(lambda n: st.lists(scalar, min_size=n, max_size=n))
segments = st.lists(
    st.one_of(scalar_runs, st.lists(other, min_size=1, max_size=3)),
    max_size=5,
)


def _buffered(parts: list[list[tuple[Any, ...]]]) -> list[tuple[Any, ...]]:
    """What an Emitter buffers for these parts: scalars as 4 fields, others as 5."""
    out: list[tuple[Any, ...]] = []
    t = 0.0
    for part in parts:
        for item in part:
            t += 1.0
            if len(item) == 3:
                name, value, step = item
                out.append((name, value, step, t))
            else:
                kind, step = item
                out.append((kind, RANK, step, t, {"n": step}))
    return out


def _as_events(buffered: list[tuple[Any, ...]]) -> list[Event]:
    return [Event(*schema._as_event(RANK, b)) if len(b) == 4 else Event(*b) for b in buffered]


def _wire(buffered: list[tuple[Any, ...]]) -> Batch:
    body, flags = schema.pack_body(RANK, buffered)
    data = schema.encode_message(_ENCODER, SCHEMA_VERSION, TOKEN, 1, RANK, body, flags)
    return schema.decode_batch(bytes(data))


def _store() -> RunStore:
    return RunStore(RunInfo(world_size=2, backend="gloo", device_types=["cpu"]))


def _same(a: list[Event], b: list[Event]) -> bool:
    """Equal events, NaN included (msgpack writes a NaN's bits)."""
    return bool(msgspec.msgpack.encode(a) == msgspec.msgpack.encode(b))


def _series(model: MonitorModel) -> dict[tuple[str, int], list[Any]]:
    return {
        (name, rank): [s.steps, np.asarray(s.values).tobytes()]
        for name, per in model.scalars.items()
        for rank, s in per.items()
    }


@settings(max_examples=60, deadline=None)
@given(first=segments, second=segments, start=st.integers(0, 400))
def test_columns_read_back_as_the_events_sent_one_by_one(
    first: list[list[tuple[Any, ...]]], second: list[list[tuple[Any, ...]]], start: int
) -> None:
    columnar, plain = _store(), _store()
    for parts in (first, second):
        buffered = _buffered(parts)
        if not buffered:
            continue
        batch = _wire(buffered)
        assert batch.size == len(buffered)
        runs = [len(list(g)) for n, g in itertools.groupby(map(len, buffered)) if n == 4]
        columns = [n for n in runs if n >= schema.MIN_COLUMNS]  # long runs; short ones: events
        assert [run.size for run in batch.scalars] == columns
        again = schema.decode_batch(schema.encode_batch(batch))  # encode_batch keeps them
        for a, b in zip(again.scalars, batch.scalars, strict=True):
            assert (a.before, a.names) == (b.before, b.names)
            assert all(x.tobytes() == y.tobytes() for x, y in zip(a[2:], b[2:], strict=True))
        columnar.extend(batch.events, rank=batch.rank, scalars=batch.scalars)
        plain.extend(_as_events(buffered))
    assert columnar.version == plain.version
    assert _same(columnar.events(), plain.events())
    assert _same(columnar.events(start), plain.events(start))
    for kinds in (["scalar"], ["state", "scalar"], ["bucket"]):
        got, end = columnar.since(start, kinds)
        want, end_plain = plain.since(start, kinds)
        assert _same(got, want) and end == end_plain
        positions, _ = columnar.positions(start, kinds)
        assert np.array_equal(positions, plain.positions(start, kinds)[0])
        assert _same(columnar.at(positions.tolist()), plain.at(positions.tolist()))
        for a, b in zip(columnar.columns(positions), plain.columns(positions), strict=True):
            assert np.array_equal(a, b)
    (cols, names, rows), (cols_p, names_p, rows_p) = columnar.scalars(), plain.scalars()
    assert rows == rows_p == len(plain.of_kind("scalar"))
    assert [names[i] for i in cols.names] == [names_p[i] for i in cols_p.names]
    for a, b in zip(cols[:4], cols_p[:4], strict=True):
        assert np.array_equal(a, b)
    assert np.array_equal(cols.values, cols_p.values, equal_nan=True)
    monitors = MonitorModel(columnar), MonitorModel(plain)
    for m in monitors:
        m.update()
    assert _series(monitors[0]) == _series(monitors[1])
    assert [r.step for r in monitors[0].ranks] == [r.step for r in monitors[1].ranks]


def test_a_recording_of_columnar_scalars_loads_as_their_events(tmp_path: Path) -> None:
    store = _store()
    buffered = _buffered([[("loss", 1.0 / (i + 1), i) for i in range(100)], [("state", 3)]])
    batch = _wire(buffered)
    store.extend(batch.events, rank=RANK, scalars=batch.scalars)
    loaded, _ = recording.load(recording.save(store, tmp_path / "run.jsonl"))
    assert _same(loaded.events(), _as_events(buffered))
    cols, names, _ = loaded.scalars()
    assert names == ["loss"] and cols.values.tolist() == [1.0 / (i + 1) for i in range(100)]


def test_a_columnar_batch_arrives_through_a_collector_in_order() -> None:
    received: list[Batch] = []
    collector = Collector(received.append)
    emitter = Emitter(collector.address, collector.token, RANK, flush_interval=60)
    try:
        ctx = RankContext(RANK, 2, "cpu", "gloo", emitter)
        for i in range(50):
            ctx.emit("scalar", name="loss", value=float(i))
        ctx.emit("state", state="running")
        for i in range(40):
            ctx.emit("scalar", name=("a", "b")[i % 2], value=-float(i))
        emitter.flush(final=True)
        deadline = time.monotonic() + 10
        while not (received and received[-1].final):
            assert time.monotonic() < deadline, "the batch did not arrive"
            time.sleep(0.01)
    finally:
        emitter.close()
        collector.close()
    (batch,) = received
    assert [run.before for run in batch.scalars] == [0, 1] and len(batch.events) == 1
    store = _store()
    store.extend(batch.events, rank=batch.rank, scalars=batch.scalars)
    payloads = [(e.kind, e.payload) for e in store.events()]
    assert payloads[49:51] == [
        ("scalar", {"name": "loss", "value": 49.0}),
        ("state", {"state": "running"}),
    ]
    assert payloads[-1] == ("scalar", {"name": "b", "value": -39.0}) and len(payloads) == 91


@pytest.fixture
def emitter() -> Iterator[Emitter]:
    ctx = zmq.Context()
    sink = ctx.socket(zmq.PULL)  # takes messages, never reads them
    port = sink.bind_to_random_port("tcp://127.0.0.1")
    em = Emitter(f"tcp://127.0.0.1:{port}", "t" * 16, RANK, flush_interval=60, max_batch=10**6)
    yield em
    em.close()
    sink.close(linger=0)
    ctx.term()


def test_only_a_name_and_a_float_are_buffered_as_columns(emitter: Emitter) -> None:
    ctx = RankContext(RANK, 2, "cpu", "gloo", emitter)
    ctx.emit("scalar", name="loss", value=0.5)  # the columnar case
    ctx.emit("scalar", name="loss", value=1)  # an int stays an int: an event
    ctx.emit("scalar", value=0.5)  # the default name
    ctx.emit("scalar", name="loss", value=0.5, tag="a")
    ctx.emit("scalar", name=1, value=0.5)
    ctx.emit("metric", name="loss", value=0.5)
    ctx.emit("metric", kind="a field named kind")  # kind is positional only
    emitter.emit("scalar", {"name": "loss", "value": 0.5})  # the dict entry: columnar too
    emitter.emit("scalar", {"name": "loss", "value": 0.5}, step=3)  # a step of its own
    assert [len(b) for b in emitter._buffer] == [4, 5, 5, 5, 5, 5, 5, 4, 5]
    assert emitter._buffer[-1][2] == 3 and emitter._buffer[6][4] == {"kind": "a field named kind"}
    with pytest.raises(schema.PayloadError, match="not plain data"):
        ctx.emit("scalar", name="loss", value=object())


def test_the_store_reads_scalar_payloads_as_the_scalar_struct_does() -> None:
    assert _Scalar.__struct_fields__ == Scalar.__struct_fields__
    assert _Scalar.__struct_defaults__ == Scalar.__struct_defaults__
    payloads: list[dict[str, Any]] = [
        {"name": "a", "value": 1},
        {"value": 2.5},
        {"name": "a", "value": True},
        {"name": "a", "value": 10**400},
        {"name": 3, "value": 1.0},
        {"name": "a"},
        {"name": "a", "value": "high"},
        {"name": "a", "value": float("nan"), "extra": [1]},
    ]
    names, values = _scalar_fields(payloads)
    for payload, name, value in zip(payloads, names, values, strict=True):
        try:
            want: Scalar | None = msgspec.convert(payload, Scalar)
        except msgspec.ValidationError:
            want = None
        if want is None:
            assert name is None and math.isnan(value)
        else:
            assert name == want.name and (value == want.value or math.isnan(want.value))
    names, values = _scalar_fields(payloads[:2])  # the C-loop case
    assert names == ["a", "value"] and values.tolist() == [1.0, 2.5]


def test_extend_with_columns_needs_their_rank() -> None:
    run = schema.open_scalars(
        msgspec.msgpack.decode(hostile.columns_body([], hostile.scalar_run(2)), type=schema.Body)
    )
    with pytest.raises(ValueError, match="needs the rank"):
        _store().extend([], scalars=run)
