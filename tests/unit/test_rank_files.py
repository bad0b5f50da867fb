"""A job's rank files (ISH_RECORD): written by FileEmitter, merged by ish.load(DIR)."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest

import interactive_shard as ish
from interactive_shard.telemetry import rank_info
from interactive_shard.telemetry.rank_file import FileEmitter, job_id
from interactive_shard.telemetry.rank_files import load_folder
from interactive_shard.telemetry.recording import RecordingError, RecordingWarning

STEPS = 5


def _rank(folder: Path, rank: int, world: int = 2, *, job: str = "job", end: bool = True) -> Path:
    """Rank ``rank`` of ``job`` as a script under ISH_RECORD writes it."""
    emitter = FileEmitter(folder, rank, world, job=job)
    emitter.announce()
    emitter.emit("state", {"state": "running", "detail": ""})
    for step in range(1, STEPS + 1):
        emitter.step = step
        emitter.emit("scalar", {"name": "loss", "value": 1.0 / step})
    if end:
        emitter.emit("state", {"state": "finished", "detail": ""})
    emitter.flush(final=True)
    emitter.close()
    return Path(emitter.path)


def _load(folder: Path) -> tuple[ish.Run, list[str]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run = ish.load(folder)
    return run, [str(w.message) for w in caught if w.category is RecordingWarning]


def test_a_jobs_rank_files_load_as_one_run(tmp_path: Path) -> None:
    for rank in range(2):
        _rank(tmp_path, rank)
    run, warned = _load(tmp_path)
    assert warned == []
    assert run.store.info.world_size == 2 and run.store.info.name == "job"
    loss = run.monitor.scalars["loss"]
    for rank in range(2):
        assert loss[rank].steps == list(range(1, STEPS + 1))
        assert run.monitor.ranks[rank].state.value == "finished"
    times = [e.t for e in run.store.events()]
    assert times == sorted(times)  # merged in time order
    assert rank_info.of(run.store).nodes() == {0: [0, 1]}


def test_the_file_is_written_as_the_rank_goes(tmp_path: Path) -> None:
    emitter = FileEmitter(tmp_path, 0, 1, job="live", flush_interval=0.05)
    emitter.emit("scalar", {"name": "loss", "value": 1.0})
    deadline = 100
    while deadline and len(Path(emitter.path).read_bytes().splitlines()) < 2:
        deadline -= 1
        __import__("time").sleep(0.02)
    assert deadline, "the background flush did not write the event"
    emitter.close()


def test_a_rank_that_ended_early_is_named_and_marked_failed(tmp_path: Path) -> None:
    _rank(tmp_path, 0)
    _rank(tmp_path, 1, end=False)
    run, warned = _load(tmp_path)
    assert any("rank 1 ended early" in w for w in warned), warned
    assert run.monitor.ranks[1].state.value == "failed"
    assert "ended early" in run.monitor.ranks[1].detail
    assert run.monitor.scalars["loss"][1].steps == list(range(1, STEPS + 1))


def test_a_cut_off_last_line_loads_the_valid_prefix(tmp_path: Path) -> None:
    _rank(tmp_path, 0)
    path = _rank(tmp_path, 1, end=False)
    data = path.read_bytes()
    path.write_bytes(data[:-7])  # killed while writing its last line
    run, warned = _load(tmp_path)
    assert any(path.name in w and "cut off" in w for w in warned), warned
    assert run.monitor.scalars["loss"][1].steps == list(range(1, STEPS))


def test_an_event_of_another_rank_is_refused(tmp_path: Path) -> None:
    _rank(tmp_path, 0)
    path = _rank(tmp_path, 1)
    lines = path.read_bytes().splitlines(keepends=True)
    stranger = ["scalar", 0, 9, 1.0, {"name": "loss", "value": 9.0}]
    lines.insert(3, json.dumps(stranger).encode() + b"\n")
    path.write_bytes(b"".join(lines))
    run, warned = _load(tmp_path)
    assert any("rank 0 in rank 1's file" in w for w in warned), warned
    assert 9 not in run.monitor.scalars["loss"][0].steps


def test_other_jobs_and_strangers_are_left_out_by_name(tmp_path: Path) -> None:
    old = [_rank(tmp_path, r, job="old") for r in range(2)]
    for rank in range(2):
        _rank(tmp_path, rank, job="new")
    (tmp_path / "notes.jsonl").write_text("not a recording\n")
    run, warned = _load(tmp_path)
    assert run.store.info.name == "new"
    assert any(all(p.name in w for p in old) for w in warned), warned
    assert any("notes.jsonl" in w for w in warned), warned


def test_a_missing_rank_is_named(tmp_path: Path) -> None:
    _rank(tmp_path, 0, world=3)
    _rank(tmp_path, 2, world=3)
    run, warned = _load(tmp_path)
    assert any("no file of rank(s) 1" in w for w in warned), warned
    assert run.monitor.ranks[1].state.value == "failed"


def test_hosts_are_put_on_one_clock(tmp_path: Path) -> None:
    for rank in range(2):
        _rank(tmp_path, rank)
    # Rank 1 ran on another host whose monotonic clock reads 1000 s more at one instant.
    path = next(tmp_path.glob("*rank00001*"))
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    for line in lines[1:]:
        line[3] += 1000.0
        if line[0] == "rank":
            line[4]["host"] = "other"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    run, warned = _load(tmp_path)
    assert warned == []
    offsets = run.store.info.extra["clock_offsets_s"]
    assert offsets["other"] == pytest.approx(-1000.0, abs=0.5)
    last = {e.rank: e.t for e in run.store.events()}
    assert abs(last[0] - last[1]) < 0.5
    assert rank_info.of(run.store).label(1) == "1 · other"


def test_a_folder_without_rank_files_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(RecordingError, match="holds no rank files"):
        load_folder(tmp_path)
    (tmp_path / "x.jsonl").write_text("{}\n")
    with pytest.raises(RecordingError, match="none of its 1"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            load_folder(tmp_path)


def test_a_second_run_of_one_job_never_overwrites(tmp_path: Path) -> None:
    first = _rank(tmp_path, 0, world=1)
    second = _rank(tmp_path, 0, world=1)
    assert first != second and first.exists() and second.exists()
    _, warned = _load(tmp_path)
    assert any("two files" in w for w in warned), warned


def test_the_job_id_comes_from_the_launcher(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("ISH_RUN_ID", "TORCHELASTIC_RUN_ID", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "abc")
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "2")
    assert job_id() == "abc/restart-2"
    monkeypatch.setenv("ISH_RUN_ID", "mine")
    assert job_id() == "mine"


def test_a_bad_rank_or_world_size_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="rank 2, world_size 2"):
        FileEmitter(tmp_path, 2, 2)


def test_the_report_command_takes_a_folder(tmp_path: Path) -> None:
    from interactive_shard.__main__ import main

    for rank in range(2):
        _rank(tmp_path / "job", rank)
    assert main(["report", str(tmp_path / "job")]) == 0
    assert (tmp_path / "job.html").stat().st_size > 10_000
