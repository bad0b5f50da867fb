"""Recordings: round trip, damaged files load their valid prefix, newer schema refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support import make_store

import interactive_shard as ish
from interactive_shard.telemetry import Event, RunInfo, RunStore, recording


def _store(n: int = 10) -> RunStore:
    return make_store(
        (
            Event("scalar", i % 2, i, float(i), {"name": "loss", "value": 1.0 / (i + 1)})
            for i in range(n)
        ),
        torch_version="2.13.0",
    )


def test_round_trip(tmp_path: Path) -> None:
    path = recording.save(_store(), tmp_path / "run.jsonl", results=[1, {"a": [1, 2]}])
    run = ish.load(path)
    assert run.store.events() == _store().events()
    assert run.results == [1, {"a": [1, 2]}]
    assert run.store.info.world_size == 2 and run.store.info.torch_version == "2.13.0"
    assert run.done and run.error is None


def test_unserialisable_results_become_none(tmp_path: Path) -> None:
    path = recording.save(_store(), tmp_path / "run.jsonl", results=[object(), 3])
    assert ish.load(path).results == [None, 3]


def test_truncated_file_loads_valid_prefix_with_warning(tmp_path: Path) -> None:
    path = recording.save(_store(10), tmp_path / "run.jsonl")
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 7])  # cut inside the last event
    with pytest.warns(ish.RecordingWarning, match="line 11"):
        run = ish.load(path)
    assert len(run.store) == 9


def test_corrupted_line_in_the_middle(tmp_path: Path) -> None:
    path = recording.save(_store(10), tmp_path / "run.jsonl")
    lines = path.read_bytes().splitlines(keepends=True)
    lines[4] = b'["scalar", "not a rank", 0, 0.0, {}]\n'
    path.write_bytes(b"".join(lines))
    with pytest.warns(ish.RecordingWarning, match="line 5"):
        run = ish.load(path)
    assert len(run.store) == 3


def test_newer_schema_is_refused_clearly(tmp_path: Path) -> None:
    path = recording.save(_store(), tmp_path / "run.jsonl")
    lines = path.read_text().splitlines()
    header = json.loads(lines[0])
    header["schema_version"] = 99
    path.write_text("\n".join([json.dumps(header), *lines[1:]]) + "\n")
    with pytest.raises(ish.RecordingError, match=r"schema version 99.*Upgrade"):
        ish.load(path)


def test_not_a_recording(tmp_path: Path) -> None:
    path = tmp_path / "x.jsonl"
    path.write_text('{"hello": 1}\n')
    with pytest.raises(ish.RecordingError, match="does not start an interactive_shard"):
        ish.load(path)
    with pytest.raises(FileNotFoundError):
        ish.load(tmp_path / "missing.jsonl")


# Written by run.save before headers and events were validated (schema 1): it must load
# unchanged, every field included.
RECORDED_BEFORE_VALIDATION = """\
{"format":"interactive_shard.recording","schema_version":1,"package_version":"0.1.0",\
"torch_version":"2.13.0","world_size":2,"backend":"gloo","device_types":["cpu"],\
"name":"demo","extra":{"model":"mlp","sizes":[4,8]},"results":[{"loss":0.25},null]}
["state",0,0,10.5,{"state":"running","detail":""}]
["log",1,0,10.75,{"stream":"stdout","text":"hello [rank] {x}"}]
["scalar",0,1,11.0,{"name":"loss","value":0.25}]
["bucket",1,1,11.5,{"index":0,"params":["w","b"],"shape":[[4,8],[8]],"bytes":160,"ready":null}]
["progress",0,2,12.0,{}]
"""


def test_recording_written_before_validation_still_loads(tmp_path: Path) -> None:
    path = tmp_path / "old.jsonl"
    path.write_text(RECORDED_BEFORE_VALIDATION)
    run = ish.load(path)
    assert run.store.info == RunInfo(
        world_size=2,
        backend="gloo",
        device_types=["cpu"],
        package_version="0.1.0",
        torch_version="2.13.0",
        name="demo",
        extra={"model": "mlp", "sizes": [4, 8]},
    )
    assert run.results == [{"loss": 0.25}, None]
    assert [e.kind for e in run.store.events()] == ["state", "log", "scalar", "bucket", "progress"]
    assert run.store.events()[3].payload["shape"] == [[4, 8], [8]]
    # and saving it again writes the same bytes
    assert recording.save(run.store, tmp_path / "again.jsonl", run.results).read_text() == (
        RECORDED_BEFORE_VALIDATION
    )
