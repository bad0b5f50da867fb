"""Property-based tests of the recording loader: whatever the file holds, ``load`` raises
nothing but ``RecordingError``, every event it returns is valid, and what ``save``
writes comes back exactly."""

from __future__ import annotations

import json
import math
import warnings
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support import RECORDING_HEADER as HEADER

import interactive_shard as ish
from interactive_shard.telemetry import Event, RunInfo, RunStore, recording

FAST = settings(
    max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
INT64 = st.integers(-(2**63), 2**63 - 1)
FINITE = st.floats(allow_nan=False, allow_infinity=False)
SCALARS = st.none() | st.booleans() | INT64 | FINITE | st.text(max_size=8)


# Strategies are built once: building a recursive one per draw is what makes generation slow.
PLAIN = st.recursive(
    SCALARS,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=6,
)
PAYLOAD = st.dictionaries(st.text(max_size=4), PLAIN, max_size=3)


# Any JSON text: plain values, big or odd numbers, deep nesting, not-quite-JSON.
JSON_TEXT = st.one_of(
    PLAIN.map(json.dumps),
    st.integers().map(str),
    st.sampled_from(["1e400", "-0", "1.5e-400", "NaN", '"\\ud800"', "", "[", "{}", "[1,]"]),
    st.integers(1, 3000).map(lambda n: "[" * n + "]" * n),
    st.integers(1, 3000).map(lambda n: '{"a":' * n + "1" + "}" * n),
)


@st.composite
def event_line(draw: st.DrawFn) -> bytes:
    """A valid event line, or one with a field replaced, dropped or added."""
    fields = [
        json.dumps(draw(st.sampled_from(["scalar", "log", "state", "bucket"]))),
        str(draw(st.integers(-1, 3))),
        str(draw(INT64)),
        json.dumps(draw(FINITE)),
        json.dumps(draw(PAYLOAD)),
    ]
    mutation = draw(st.sampled_from(["none", "replace", "drop", "add"]))
    if mutation == "replace":
        fields[draw(st.integers(0, 4))] = draw(JSON_TEXT)
    elif mutation == "drop":
        del fields[draw(st.integers(0, 4))]
    elif mutation == "add":
        fields.append(draw(JSON_TEXT))
    return ("[" + ",".join(fields) + "]\n").encode()


@st.composite
def near_valid_file(draw: st.DrawFn) -> bytes:
    world_size = draw(st.integers(1, 4))
    header = {**HEADER, "world_size": world_size}
    if draw(st.booleans()):
        header["results"] = draw(st.lists(PLAIN, min_size=world_size, max_size=world_size))
    if draw(st.booleans()):  # half of the headers are broken: fields dropped or replaced
        for field in draw(st.lists(st.sampled_from([*HEADER, "other"]), min_size=1, max_size=3)):
            if draw(st.booleans()):
                header.pop(field, None)
            else:
                header[field] = draw(PLAIN | st.integers(-2, 70_000) | st.lists(PLAIN))
    data = json.dumps(header).encode() + b"\n" + b"".join(draw(st.lists(event_line(), max_size=6)))
    if draw(st.booleans()) and data:  # damage the bytes too: cut, or overwrite a stretch
        at = draw(st.integers(0, len(data) - 1))
        data = data[:at] + draw(st.binary(max_size=4)) + data[at + draw(st.integers(0, 3)) :]
    return data


def _depth(value: Any) -> int:
    if isinstance(value, list):
        return 1 + max(map(_depth, value), default=0)
    if isinstance(value, dict):
        return 1 + max(map(_depth, value.values()), default=0)
    return 0


def _load_checked(path: Path) -> ish.Run | None:
    """Load ``path``; None if refused. Asserts what a loaded run always satisfies."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            run = ish.load(path)
        except ish.RecordingError:
            return None
    assert all(issubclass(w.category, ish.RecordingWarning) for w in caught)
    info = run.store.info
    assert isinstance(info.world_size, int) and 1 <= info.world_size <= 65_536
    assert isinstance(info.backend, str) and isinstance(info.name, str)
    assert all(isinstance(d, str) for d in info.device_types)
    assert isinstance(info.extra, dict)
    assert run.results is not None and len(run.results) == info.world_size
    for e in run.store.events():
        assert isinstance(e.kind, str) and 0 <= e.rank < info.world_size
        assert isinstance(e.step, int) and not isinstance(e.step, bool)
        assert isinstance(e.t, float) and math.isfinite(e.t)
        assert isinstance(e.payload, dict) and all(isinstance(k, str) for k in e.payload)
        assert all(_depth(v) <= recording.MAX_PAYLOAD_DEPTH for v in e.payload.values())
    return run


@FAST
@given(data=st.binary(max_size=300))
def test_arbitrary_bytes_load_or_are_refused(tmp_path: Path, data: bytes) -> None:
    path = tmp_path / "run.jsonl"
    path.write_bytes(data)
    _load_checked(path)


@FAST
@given(data=near_valid_file())
def test_near_valid_files_load_valid_events_or_are_refused(tmp_path: Path, data: bytes) -> None:
    path = tmp_path / "run.jsonl"
    path.write_bytes(data)
    _load_checked(path)


@st.composite
def stores(draw: st.DrawFn) -> tuple[RunStore, list[Any] | None]:
    world_size = draw(st.integers(1, 4))
    info = RunInfo(
        world_size=world_size,
        backend=draw(st.text(max_size=6)),
        device_types=draw(st.lists(st.text(max_size=4), max_size=2)),
        package_version=draw(st.text(max_size=6)),
        torch_version=draw(st.text(max_size=6)),
        name=draw(st.text(max_size=6)),
        extra=draw(PAYLOAD),
    )
    store = RunStore(info)
    # st.tuples, not st.builds: builds would resolve Event's type hints on every draw.
    event = st.tuples(
        st.text(max_size=6), st.integers(0, world_size - 1), INT64, FINITE, PAYLOAD
    ).map(lambda fields: Event(*fields))
    store.extend(draw(st.lists(event, max_size=8)))
    results = draw(st.none() | st.lists(PLAIN, min_size=world_size, max_size=world_size))
    return store, results


@FAST
@given(saved=stores())
def test_save_round_trips_exactly(tmp_path: Path, saved: tuple[RunStore, Any]) -> None:
    store, results = saved
    path = recording.save(store, tmp_path / "run.jsonl", results)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a saved file loads whole
        run = _load_checked(path)
    assert run is not None
    assert run.store.info == store.info
    assert run.store.events() == store.events()
    assert run.results == (results if results is not None else [None] * store.info.world_size)
