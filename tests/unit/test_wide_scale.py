"""What a 256-rank run (``benchmarks/bench_wide.py``) needed: the rank file reader's
chunks (whole lines, a bounded read), a cursor's read with nothing new, the timeline's
origin while ranks keep arriving, the bucket map's newest iteration not walked again
while nothing arrives, and a run's store not kept alive by its rank reader."""

from __future__ import annotations

import gc
import warnings
import weakref
from pathlib import Path
from typing import Any

import pytest
from support import make_store

from interactive_shard.buckets.model import BucketMap
from interactive_shard.telemetry import rank_files, rank_info
from interactive_shard.telemetry.rank_file import FileEmitter
from interactive_shard.telemetry.recording import RecordingWarning
from interactive_shard.telemetry.schema import Event
from interactive_shard.testing import FakeRun, FakeTimeline, mlp_params
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


def test_the_rank_reader_does_not_keep_its_store_alive() -> None:
    store = make_store([Event("rank", 1, 0, 0.0, {"host": "a", "pid": 1, "wall": 1.0})])
    assert rank_info.of(store).label(1) == "1"
    gone = weakref.ref(store)
    del store
    gc.collect()
    assert gone() is None


def test_the_newest_bucket_iteration_is_walked_to_once_while_nothing_arrives() -> None:
    def events(first: int, last: int) -> list[Event]:
        fake = FakeRun(mlp_params(2, 8), world_size=4, iterations=last)
        return [e for e in fake.events() if e.kind == "ddp_watch" or e.step >= first]

    store = make_store(events(1, 3), world_size=4)
    bm = BucketMap(store)
    walked = 0
    walk = bm._buckets._walk

    def counted() -> Any:
        nonlocal walked
        walked += 1
        return walk()

    bm._buckets._walk = counted  # type: ignore[method-assign]
    assert bm.newest == 3 and bm.newest == 3
    assert walked == 1  # asked again, nothing new: the same answer, not walked again
    store.extend(e for e in events(4, 4) if e.kind != "ddp_watch" and e.step == 4)
    assert bm.newest == 4 and walked == 2


def test_a_merge_leaves_what_the_program_froze_frozen(tmp_path: Path) -> None:
    _file(tmp_path)
    rank_files.load_folder(tmp_path)
    assert gc.get_freeze_count() == 0  # what the load froze, it unfroze
    gc.freeze()
    try:
        events, warned = _load(tmp_path)
        assert warned == [] and len(events) == 42
        assert gc.get_freeze_count() > 0  # still frozen (fewer as frozen objects are freed)
    finally:
        gc.unfreeze()
