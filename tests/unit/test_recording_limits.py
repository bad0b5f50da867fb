"""Recordings a loader must survive: wrong header fields, invalid or hostile event lines,
and saves that fail without leaving anything behind."""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path
from typing import Any

import pytest
from support import RECORDING_HEADER as HEADER
from support import make_store

import interactive_shard as ish
from interactive_shard.telemetry import Event, RunStore, recording

EVENT = b'["scalar",0,0,0.0,{"name":"loss","value":1.0}]\n'
TOO_DEEP = recording.MAX_PAYLOAD_DEPTH + 1  # lists / dicts nested in one payload value


def _write(path: Path, header: dict[str, Any], *lines: bytes) -> Path:
    path.write_bytes(json.dumps(header).encode() + b"\n" + b"".join(lines))
    return path


def _store(world_size: int = 2, events: tuple[Event, ...] = ()) -> RunStore:
    return make_store(events, world_size=world_size)


# -- header: every field validated, errors name field and value -------------------------
@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("world_size", 10**9),
        ("world_size", 10**7),
        ("world_size", 65_537),
        ("world_size", 0),
        ("world_size", -1),
        ("world_size", "2"),
        ("world_size", 2.0),
        ("world_size", True),
        ("world_size", None),
        ("schema_version", "1"),
        ("schema_version", 0),
        ("schema_version", 1.0),
        ("package_version", 3),
        ("torch_version", ["2"]),
        ("backend", None),
        ("device_types", "cpu"),
        ("device_types", [1]),
        ("name", {"a": 1}),
        ("extra", "xyz"),
        ("extra", [1, 2]),
        ("results", "xyz"),
        ("results", {"0": 1}),
        ("results", [1]),
        ("results", [1, 2, 3]),
    ],
)
def test_wrong_header_field_is_a_recording_error_naming_it(
    tmp_path: Path, field: str, value: Any
) -> None:
    path = _write(tmp_path / "run.jsonl", {**HEADER, field: value}, EVENT)
    with pytest.raises(ish.RecordingError, match=rf"header field '{field}'") as info:
        ish.load(path)
    assert "it must be" in str(info.value) and "run.save" in str(info.value)


def test_missing_world_size_is_named(tmp_path: Path) -> None:
    header = {k: v for k, v in HEADER.items() if k != "world_size"}
    with pytest.raises(ish.RecordingError, match=r"header field 'world_size' is missing"):
        ish.load(_write(tmp_path / "run.jsonl", header, EVENT))


def test_header_error_quotes_a_shortened_value(tmp_path: Path) -> None:
    path = _write(tmp_path / "run.jsonl", {**HEADER, "name": ["x" * 10_000] * 100}, EVENT)
    with pytest.raises(ish.RecordingError, match=r"header field 'name' is \[") as info:
        ish.load(path)
    assert len(str(info.value)) < 500


@pytest.mark.parametrize(
    "first",
    [b"", b"\n", b"[1, 2]\n", b'"interactive_shard.recording"\n', b"[" * 100_000 + b"\n"],
)
def test_not_a_header(tmp_path: Path, first: bytes) -> None:
    path = tmp_path / "run.jsonl"
    path.write_bytes(first + EVENT)
    with pytest.raises(ish.RecordingError, match=r"line 1|empty"):
        ish.load(path)


def test_deeply_nested_header_is_a_recording_error(tmp_path: Path) -> None:
    nested = b"[" * 100_000 + b"]" * 100_000
    line = json.dumps({**HEADER, "extra": {"x": "@"}}).encode().replace(b'"@"', nested)
    (tmp_path / "run.jsonl").write_bytes(line + b"\n" + EVENT)
    with pytest.raises(ish.RecordingError, match="line 1"):
        ish.load(tmp_path / "run.jsonl")
    extra = {"x": json.loads("[" * TOO_DEEP + "]" * TOO_DEEP)}  # decodes, but nests past the bound
    with pytest.raises(ish.RecordingError, match="header field 'extra'"):
        ish.load(_write(tmp_path / "run.jsonl", {**HEADER, "extra": extra}, EVENT))


def test_over_long_header_is_refused(tmp_path: Path) -> None:
    header = {**HEADER, "name": "x" * recording.MAX_LINE_BYTES}
    with pytest.raises(ish.RecordingError, match="line 1 is longer than"):
        ish.load(_write(tmp_path / "run.jsonl", header, EVENT))


def test_older_minimal_header_still_loads(tmp_path: Path) -> None:
    """Only format, schema_version and world_size are required; extra may be null."""
    header = {"format": HEADER["format"], "schema_version": 1, "world_size": 2, "extra": None}
    run = ish.load(_write(tmp_path / "run.jsonl", header, EVENT))
    assert run.store.info.backend == "" and run.store.info.extra == {} and len(run.store) == 1


# -- events: an invalid line is a damaged line (valid prefix + warning) ----------------------
@pytest.mark.parametrize(
    "bad",
    [
        b'["scalar",2,0,0.0,{}]',  # rank == world_size
        b'["scalar",-1,0,0.0,{}]',
        b'["scalar",100000000000000000000000,0,0.0,{}]',
        b'["scalar",0,1.5,0.0,{}]',  # step not an int
        b'["scalar",0,true,0.0,{}]',
        b'["scalar",0,100000000000000000000000,0.0,{}]',
        b'["scalar",0,0,1e400,{}]',  # time not finite
        b'["scalar",0,0,"now",{}]',
        b"[7,0,0,0.0,{}]",  # kind not a str
        b'["scalar",0,0,0.0,[1]]',  # payload not an object
        b'["scalar",0,0,0.0,{"a":' + b"[" * 100_000 + b"]" * 100_000 + b"}]",
        b'["scalar",0,0,0.0,{"a":' + b"[" * TOO_DEEP + b"]" * TOO_DEEP + b"}]",
        b'["scalar",0,0,0.0,{"a":' + b'{"b":' * TOO_DEEP + b"1" + b"}" * TOO_DEEP + b"}]",
    ],
)
def test_invalid_event_line_loads_valid_prefix(tmp_path: Path, bad: bytes) -> None:
    path = _write(tmp_path / "run.jsonl", HEADER, EVENT, EVENT, bad + b"\n", EVENT)
    with pytest.warns(ish.RecordingWarning, match="line 4 is damaged"):
        run = ish.load(path)
    assert len(run.store) == 2


def test_nesting_up_to_the_bound_loads(tmp_path: Path) -> None:
    depth = recording.MAX_PAYLOAD_DEPTH
    line = b'["scalar",0,0,0.0,{"a":' + b"[" * depth + b"]" * depth + b"}]\n"
    run = ish.load(_write(tmp_path / "run.jsonl", HEADER, line, EVENT))
    assert len(run.store) == 2


def test_over_long_line_loads_valid_prefix_without_holding_it(tmp_path: Path) -> None:
    limit = recording.MAX_LINE_BYTES
    body = b'["log",0,0,0.0,{"text":"'
    fits = body + b"x" * (limit - len(body) - 4) + b'"}]\n'
    assert len(fits) == limit
    over = body + b"x" * (3 * limit) + b'"}]\n'
    path = _write(tmp_path / "run.jsonl", HEADER, EVENT, fits, over, EVENT)
    with pytest.warns(ish.RecordingWarning, match=r"line 4 is damaged \(longer than"):
        run = ish.load(path)
    assert len(run.store) == 2 and len(run.store.events()[1].payload["text"]) > limit - 40


def test_blank_lines_are_skipped(tmp_path: Path) -> None:
    run = ish.load(_write(tmp_path / "run.jsonl", HEADER, EVENT, b"\n", b"  \n", EVENT))
    assert len(run.store) == 2


# -- save: refuses what load would refuse, names the event, leaves nothing behind ---------
@pytest.mark.parametrize(
    ("event", "why"),
    [
        (Event("probe", 1, 3, 0.0, {"w": object()}), r"value 'w' holds a builtins\.object"),
        (Event("probe", 1, 3, 0.0, {"w": b"raw"}), r"value 'w' holds a builtins\.bytes"),
        (Event("probe", 1, 3, 0.0, {"w": [{1: 2}]}), "key 1 that is not a string"),
        (Event("probe", 2, 3, 0.0, {}), r"rank 2 is not a rank of this run \(0\.\.1\)"),
        (Event("probe", 1, 3, math.nan, {}), "time nan is not a finite number"),
        (
            Event("probe", 1, 3, 0.0, {"deep": json.loads("[" * TOO_DEEP + "]" * TOO_DEEP)}),
            "nests more",
        ),
        (Event("probe", 1, 3, 0.0, {"t": "x" * recording.MAX_LINE_BYTES}), "line limit"),
        (Event("probe", 10**5000, 3, 0.0, {}), "rank <a int that cannot be shown>"),
        (Event("probe", 1, 3, 0.0, {"n": 10**5000}), "cannot be encoded as JSON"),
    ],
)
def test_save_refuses_an_invalid_event_and_leaves_no_file(
    tmp_path: Path, event: Event, why: str
) -> None:
    good = Event("scalar", 0, 0, 0.0, {"value": 1})
    store = _store(events=(good, good, event, good))
    target = tmp_path / "run.jsonl"
    recording.save(_store(events=(good,)), target)  # an earlier save stays intact
    before = target.read_bytes()
    with pytest.raises(ish.RecordingError, match=r"event 2 \(kind 'probe', rank [^,]+, step 3\)"):
        recording.save(store, target)
    with pytest.raises(ish.RecordingError, match=why):
        recording.save(store, tmp_path / "other.jsonl")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.jsonl"]
    assert target.read_bytes() == before


def test_save_cleans_up_when_the_final_rename_fails(tmp_path: Path) -> None:
    (tmp_path / "run.jsonl").mkdir()  # the target name is taken by a folder
    with pytest.raises(OSError):
        recording.save(_store(events=(Event("scalar", 0, 0, 0.0, {}),)), tmp_path / "run.jsonl")
    assert [p.name for p in tmp_path.iterdir()] == ["run.jsonl"]


def test_save_refuses_results_of_the_wrong_length(tmp_path: Path) -> None:
    with pytest.raises(ish.RecordingError, match="'results' has 3 entries for world_size 2"):
        recording.save(_store(), tmp_path / "run.jsonl", results=[1, 2, 3])
    assert list(tmp_path.iterdir()) == []


def test_save_refuses_a_bad_run_info(tmp_path: Path) -> None:
    store = _store()
    store.info.world_size = 10**7
    with pytest.raises(ish.RecordingError, match="header field 'world_size' is 10000000"):
        recording.save(store, tmp_path / "run.jsonl")
    store.info.world_size, store.info.extra = 2, {"model": object()}
    with pytest.raises(ish.RecordingError, match=r"header field 'extra'.*builtins\.object"):
        recording.save(store, tmp_path / "run.jsonl")
    assert list(tmp_path.iterdir()) == []


def test_results_too_large_for_a_line_are_saved_as_null(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    big = "x" * recording.MAX_LINE_BYTES
    with caplog.at_level(logging.WARNING):
        path = recording.save(_store(), tmp_path / "run.jsonl", results=[big, {"ok": 1}])
    assert "rank 0's result" in caplog.text
    assert ish.load(path).results == [None, {"ok": 1}]
    deep = json.loads("[" * TOO_DEEP + "]" * TOO_DEEP)
    path = recording.save(_store(), tmp_path / "run.jsonl", results=[deep, 1])
    assert ish.load(path).results == [None, 1]
