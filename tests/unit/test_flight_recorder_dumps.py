"""Flight Recorder dump files (``ish.load_flight_recorder``): hand-made dumps of torch's two
forms load into a ledger whose verdicts hold; hostile files are refused with a
``RecordingError`` naming the file and the problem, never run, never a hang."""

from __future__ import annotations

import json
import os
import pickle
import time
from pathlib import Path
from typing import Any

import pytest

import interactive_shard as ish
from interactive_shard.collectives import dumps


def entry(seq: int, shape: list[int], *, record: int = 0, retired: bool = True) -> dict[str, Any]:
    """One entry as torch's pickle holds it (a tuple for the group, frames innermost first)."""
    return {
        "record_id": record,
        "collective_seq_id": seq,
        "profiling_name": "gloo:all_reduce",
        "process_group": ("0", "default_pg"),
        "is_p2p": False,
        "input_sizes": [shape],
        "input_dtypes": ["Float"],
        "retired": retired,
        "state": "scheduled",
        "time_created_ns": 1_000_000_000 * (10 + seq),
        "time_discovered_completed_ns": None,
        "frames": [
            {"name": "all_reduce", "filename": "/x/torch/distributed/c10d.py", "line": 9},
            {"name": "train", "filename": "/job/train.py", "line": 40 + seq},
        ],
    }


def dump(*entries: dict[str, Any]) -> dict[str, Any]:
    return {
        "version": "2.10",
        "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1]"}},
        "entries": list(entries),
    }


def write(path: Path, obj: Any, form: str = "pickle") -> Path:
    if form == "json":
        path.write_text(json.dumps(obj))
    else:
        path.write_bytes(pickle.dumps(obj, protocol=2))  # torch's own protocol
    return path


def refused(path: Path, *words: str) -> str:
    with pytest.raises(ish.RecordingError) as err:
        ish.load_flight_recorder([path])
    message = str(err.value)
    assert str(path) in message and "A Flight Recorder dump is" in message, message
    for word in words:
        assert word in message, message
    return message


# -- dumps that load ------------------------------------------------------------------------
@pytest.mark.parametrize("form", ["pickle", "json"])
def test_a_shape_divergence_in_dumps_is_found(tmp_path: Path, form: str) -> None:
    files = [
        write(tmp_path / "fr_dump_1", dump(entry(1, [4]), entry(2, [2, 2], record=1)), form),
        write(tmp_path / "fr_dump_0", dump(entry(1, [4]), entry(2, [4], record=1)), form),
    ]
    run = ish.load(files)  # a list: the dumps, their ranks from the names
    ledger = run.collectives
    assert run.store.info.backend == "gloo" and run.store.info.world_size == 2
    assert ledger.groups == {"0": [0, 1]}  # from pg_config
    assert [(e.seq, e.op, e.dtype, e.shape) for e in ledger.entries(0)] == [
        (0, "all_reduce", "torch.float32", [4]),
        (1, "all_reduce", "torch.float32", [4]),
    ]
    d = ledger.divergence()
    assert d is not None and (d.kind, d.ranks, d.seq) == ("shape", [1], 1)
    per_rank = d.per_rank[1]
    assert per_rank is not None and per_rank.shape == [2, 2]
    if form == "pickle":
        assert per_rank.caller == "train.py:42 in train"  # only the pickle holds stacks
    assert ish.load(run.save(tmp_path / "run.jsonl")).collectives.divergence() == d


def test_a_dump_taken_at_a_hang_names_who_the_others_wait_for(tmp_path: Path) -> None:
    waiting = write(tmp_path / "a", dump(entry(1, [4]), entry(2, [4], record=1, retired=False)))
    late = write(tmp_path / "b", dump(entry(1, [4])))
    ledger = ish.load_flight_recorder({0: waiting, 1: late}).collectives
    assert ledger.waiting_for() == [1]
    pending = ledger.pending()
    assert pending[1] is None and pending[0] is not None and pending[0].seq == 1
    assert ledger.still()[0].stack[-1] == "c10d.py:9 in all_reduce"  # innermost last
    d = ledger.divergence()
    assert d is not None and (d.kind, d.ranks) == ("missing", [1])


def test_names_without_a_rank_are_ranked_by_order_and_duplicates_are_refused(
    tmp_path: Path,
) -> None:
    a = write(tmp_path / "first.pkl", dump(entry(1, [4])))
    b = write(tmp_path / "second.pkl", dump(entry(1, [2])))
    d = ish.load((a, b)).collectives.divergence()  # a tuple too; ranks 0, 1 by order
    assert d is not None and d.ranks == [1]
    c = write(tmp_path / "trace_0", dump())
    with pytest.raises(ish.RecordingError, match="both rank 0"):
        ish.load_flight_recorder([c, write(tmp_path / "other_0", dump())])
    with pytest.raises(ish.RecordingError, match="is not a rank"):
        ish.load_flight_recorder({-1: c})


# -- hostile files --------------------------------------------------------------------------
def test_a_pickle_that_would_run_code_is_refused_and_never_run(tmp_path: Path) -> None:
    ran = tmp_path / "ran"

    class Payload:
        def __reduce__(self) -> Any:
            return (os.mkdir, (str(ran),))

    for protocol in (2, 4):  # GLOBAL, STACK_GLOBAL
        path = tmp_path / f"fr_dump_{protocol}"
        path.write_bytes(pickle.dumps({"entries": [Payload()]}, protocol=protocol))
        refused(path, "asks for", "mkdir", "was not loaded")
        assert not ran.exists()


def test_the_unpickler_refuses_globals_even_past_the_scan(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ran = tmp_path / "ran"
    path = tmp_path / "fr_dump_0"
    path.write_bytes(b"\x80\x02cos\nmkdir\nX" + _text(str(ran)) + b"\x85R.")
    monkeypatch.setattr(dumps, "_scan", lambda data: 1)  # the first wall down
    refused(path, "asks for 'os.mkdir'")
    assert not ran.exists()


@pytest.mark.parametrize(
    ("data", "word"),
    [
        (b"\x80\x02})R.", "opcode REDUCE"),  # a call with no global: still refused
        (b"\x80\x02}}b.", "opcode BUILD"),
        (b"\x80\x02(c__builtin__\nlist\no.", "asks for '__builtin__.list'"),
        (b"\x80\x02" + pickle.dumps({"entries": []}, protocol=2)[2:12], "truncated"),
        (b'{"entries": [{"record_id": 0, "collective_', "not valid JSON"),
        (b"garbage that is no dump", "neither JSON nor a complete pickle"),
        (b"   ", "it is empty"),
        (b'{"extra": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "nests far deeper"),
    ],
    ids=["reduce", "build", "obj", "cut pickle", "cut json", "garbage", "empty", "deep json"],
)
def test_damaged_or_foreign_files_are_refused(tmp_path: Path, data: bytes, word: str) -> None:
    path = tmp_path / "fr_dump_0"
    path.write_bytes(data)
    refused(path, word)


@pytest.mark.parametrize("form", ["pickle", "json"])
@pytest.mark.parametrize(
    ("field", "value", "shown"),
    [
        ("collective_seq_id", "seven", "'seven'"),
        ("collective_seq_id", 10**30, str(10**30)),
        ("input_sizes", [[4]] * 5000, "[[4], [4], [4], [4], [4], [4], ...]"),
        ("process_group", 17, "17"),
    ],
    ids=["wrong type", "huge seq", "too many sizes", "group not a pair"],
)
def test_a_field_that_does_not_fit_is_named_with_its_value(
    tmp_path: Path, form: str, field: str, value: Any, shown: str
) -> None:
    path = write(tmp_path / "fr_dump_0", dump(entry(1, [4]), {**entry(2, [4]), field: value}), form)
    refused(path, f"`entries[1].{field}` is {shown}")


def test_an_oversized_file_is_refused_unread(tmp_path: Path) -> None:
    path = tmp_path / "fr_dump_0"
    with path.open("wb") as f:
        f.truncate(dumps.MAX_FILE_BYTES + 1)  # sparse: nothing to read in it
    start = time.monotonic()
    refused(path, f"{dumps.MAX_FILE_BYTES + 1:,} bytes, over")
    assert time.monotonic() - start < 1


def test_ten_million_entries_are_refused_in_bounded_time(tmp_path: Path) -> None:
    path = tmp_path / "fr_dump_0"
    path.write_bytes(pickle.dumps(dump(*[entry(1, [4])] * 10**7), protocol=2))
    start = time.monotonic()
    refused(path, f"more than {dumps.MAX_PICKLE_OPS:,} opcodes")
    assert time.monotonic() - start < 20


def test_a_memo_bomb_is_refused_before_it_is_walked(tmp_path: Path) -> None:
    sizes: list[Any] = [4]
    for _ in range(60):  # 2**60 lists reached from 60 distinct ones
        sizes = [sizes, sizes]
    path = tmp_path / "fr_dump_0"
    path.write_bytes(pickle.dumps(dump({**entry(1, [4]), "input_sizes": sizes}), protocol=2))
    assert path.stat().st_size < 2_000
    start = time.monotonic()
    refused(path, "reach more than")
    assert time.monotonic() - start < 2


def test_tuples_nested_deep_as_a_key_are_refused_before_hashing(tmp_path: Path) -> None:
    # Loading it would hash a million nested tuples in C: a crash of the interpreter.
    path = tmp_path / "fr_dump_0"
    path.write_bytes(b"\x80\x02})" + b"\x85" * 1_000_000 + b"Ns.")
    refused(path, "tuples nested over")


def _text(s: str) -> bytes:
    """A pickle BINUNICODE argument."""
    raw = s.encode()
    return len(raw).to_bytes(4, "little") + raw
