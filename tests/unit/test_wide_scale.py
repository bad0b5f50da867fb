"""What a 256-rank run (``benchmarks/bench_wide.py``) needed: the rank file reader's
chunks (whole lines, a bounded read), a cursor's read with nothing new, and the
timeline's origin while ranks keep arriving."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest
from support import make_store

from interactive_shard.telemetry import rank_files
from interactive_shard.telemetry.rank_file import FileEmitter
from interactive_shard.telemetry.recording import RecordingWarning
from interactive_shard.telemetry.schema import Event
from interactive_shard.testing import FakeTimeline
from interactive_shard.timeline.model import TimelineModel

LIMIT = 512  # the line limit in these tests (a header fits): a file is many chunks


def _file(folder: Path, events: int = 40) -> Path:
    emitter = FileEmitter(folder, 0, 1, job="job")
    emitter.announce()
    for step in range(1, events + 1):
        emitter.emit("thing", {"n": step, "pad": "x" * (20 + step % 9)}, step=step)
    emitter.emit("state", {"state": "finished"}, step=events)
    emitter.flush(final=True)
    emitter.close()
    return Path(emitter.path)


def _load(folder: Path) -> tuple[list[Event], list[str]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        store = rank_files.load_folder(folder)
    return store.events(), [str(w.message) for w in caught if w.category is RecordingWarning]


@pytest.fixture
def small_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rank_files, "MAX_LINE_BYTES", LIMIT)


def _body(path: Path) -> tuple[bytes, list[bytes]]:
    head, *lines = path.read_bytes().splitlines(keepends=True)
    return head, lines


@pytest.mark.usefixtures("small_limit")
def test_a_file_read_in_many_chunks_loads_whole(tmp_path: Path) -> None:
    path = _file(tmp_path)
    assert path.stat().st_size > 4 * LIMIT
    events, warned = _load(tmp_path)
    assert warned == []
    assert [e.payload["n"] for e in events if e.kind == "thing"] == list(range(1, 41))


@pytest.mark.usefixtures("small_limit")
def test_blank_lines_are_skipped_and_a_last_line_without_newline_kept(tmp_path: Path) -> None:
    path = _file(tmp_path)
    head, lines = _body(path)
    lines[5:5] = [b"\n", b"  \t\n"]
    path.write_bytes(head + b"".join(lines).rstrip(b"\n"))
    events, warned = _load(tmp_path)
    assert warned == []
    assert sum(e.kind == "thing" for e in events) == 40


@pytest.mark.usefixtures("small_limit")
@pytest.mark.parametrize("padding", [b"", b" "])
def test_a_line_over_the_limit_stops_the_file_there(tmp_path: Path, padding: bytes) -> None:
    path = _file(tmp_path)
    head, lines = _body(path)
    # A valid event made long (with leading blanks, too: still over the limit).
    lines.insert(10, padding * LIMIT + b'["thing",0,3,1.0,{"n":0,"pad":"' + b"y" * LIMIT + b'"}]\n')
    path.write_bytes(head + b"".join(lines))
    events, warned = _load(tmp_path)
    assert any(f"line 12 is longer than the {LIMIT}-byte line limit" in w for w in warned), warned
    assert [e.payload["n"] for e in events if e.kind == "thing"] == list(range(1, 10))


@pytest.mark.usefixtures("small_limit")
def test_an_event_of_another_rank_in_a_later_chunk_is_named(tmp_path: Path) -> None:
    path = _file(tmp_path)
    head, lines = _body(path)
    lines.insert(30, b'["thing",3,3,1.0,{"n":0}]\n')
    path.write_bytes(head + b"".join(lines))
    events, warned = _load(tmp_path)
    assert any("line 32 holds an event of rank 3 in rank 0's file" in w for w in warned), warned
    assert [e.payload["n"] for e in events if e.kind == "thing"] == list(range(1, 30))


def test_a_cursor_with_nothing_new_reads_nothing() -> None:
    store = make_store([Event("log", r, 0, 0.0, {"line": "x"}) for r in range(2)])
    assert store.since(2, ("log",)) == ([], 2)
    assert store.since(5, ("log", "scalar")) == ([], 2)  # beyond the end: nothing either


def test_the_origin_reads_while_more_ranks_arrive() -> None:
    # The collector stores more ranks while the origin goes over those filed so far:
    # offset() reads them (update), which files them mid-way.
    fake = FakeTimeline(world_size=3, iterations=2)
    events = fake.events()
    store = make_store([e for e in events if e.rank == 1], world_size=3)
    model = TimelineModel(store)
    assert model.ranks == [1]
    decode, later = model._decode, [e for e in events if e.rank != 1]

    def arriving(rank: int, it: int) -> Any:
        if later:
            store.extend(later)
            later.clear()
        return decode(rank, it)

    model._decode = arriving  # type: ignore[method-assign]
    assert model.origin is not None
    assert model.ranks == [0, 1, 2]
