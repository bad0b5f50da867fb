"""The Chrome Trace Event Format writer (``timeline/chrome.py``) against the format's spec.

A real consumer (Perfetto's trace processor, in Chromium) reads the same files in
``tests/browser/test_chrome_trace.py``.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest
from support import make_store

from interactive_shard.testing import FakeTimeline
from interactive_shard.timeline.chrome import (
    LANES,
    ROOT,
    chrome_trace,
    event_name,
    read_chrome_trace,
    write_chrome_trace,
)
from interactive_shard.timeline.events import KINDS
from interactive_shard.timeline.model import TimelineModel, TimelineSpan


def ts(
    kind: str, name: str, start: float, end: float, rank: int = 0, **detail: Any
) -> TimelineSpan:
    return TimelineSpan(
        kind=kind, name=name, start=start, end=end, rank=rank, iteration=3, detail=detail
    )


def test_complete_and_instant_events() -> None:
    spans = [
        ts("forward", "", 100.0, 100.5),
        ts("collective", "all_reduce", 100.25, 100.75, rank=1, op="all_reduce", nbytes=8),
        ts("hook", "grad_ready:w", 100.5, 100.5),
    ]
    trace = chrome_trace(spans, origin=100.0, other={"hosts": {"0": "a"}})
    assert trace["displayTimeUnit"] == "ms"
    assert trace["otherData"] == {
        "producer": "interactive_shard",
        "origin_s": 100.0,
        "hosts": {"0": "a"},
    }
    events = [e for e in trace["traceEvents"] if e["ph"] != "M"]
    assert events == [
        {"name": ROOT, "cat": "forward", "ph": "X", "ts": 0.0, "pid": 0, "tid": 1,
         "args": {"iteration": 3}, "dur": 500000.0},
        {"name": "grad_ready:w", "cat": "hook", "ph": "i", "ts": 500000.0, "pid": 0, "tid": 2,
         "args": {"iteration": 3}, "s": "t"},
        {"name": "all_reduce", "cat": "collective", "ph": "X", "ts": 250000.0, "pid": 1,
         "tid": 3, "args": {"op": "all_reduce", "nbytes": 8, "iteration": 3}, "dur": 500000.0},
    ]  # fmt: skip
    json.dumps(trace, allow_nan=False)  # plain JSON


def test_metadata_names_and_orders_ranks_and_lanes() -> None:
    spans = [ts(k, "x", 1.0, 2.0, rank=r) for r in (2, 0) for k in ("backward", "optimizer")]
    meta = [e for e in chrome_trace(spans, 0.0)["traceEvents"] if e["ph"] == "M"]
    got = [(e["pid"], e["tid"], e["name"], e["args"]) for e in meta]
    assert got == [
        (0, 0, "process_name", {"name": "rank 0"}),
        (0, 0, "process_sort_index", {"sort_index": 0}),
        (0, 1, "thread_name", {"name": "compute"}),
        (0, 1, "thread_sort_index", {"sort_index": 1000}),
        (0, 4, "thread_name", {"name": "optimizer"}),
        (0, 4, "thread_sort_index", {"sort_index": 4000}),
        (2, 0, "process_name", {"name": "rank 2"}),
        (2, 0, "process_sort_index", {"sort_index": 2}),
        (2, 1, "thread_name", {"name": "compute"}),
        (2, 1, "thread_sort_index", {"sort_index": 1000}),
        (2, 4, "thread_name", {"name": "optimizer"}),
        (2, 4, "thread_sort_index", {"sort_index": 4000}),
    ]


def test_lanes() -> None:
    assert set(LANES) == set(KINDS)
    assert {LANES[k] for k in ("forward", "backward", "compiled_forward", "compiled_backward")} == {
        1
    }
    assert (LANES["hook"], LANES["collective"], LANES["optimizer"]) == (2, 3, 4)


def test_nesting_survives_rounding() -> None:
    # Ends 0.4 ns apart: each duration rounded on its own could put the child past its
    # parent; both ends are rounded first, so the child ends with it at worst.
    parent = ts("backward", "", 1000.0000001234, 1000.0030004567)
    child = ts("backward", "a", 1000.0000011234, 1000.0030004567 - 4e-10)
    p, c = [e for e in chrome_trace([child, parent], 1000.0)["traceEvents"] if e["ph"] == "X"]
    assert c["ts"] > p["ts"] and c["ts"] + c["dur"] <= p["ts"] + p["dur"] + 1e-9


def test_a_parent_comes_before_the_children_it_starts_with() -> None:
    parent, child = ts("forward", "", 1.0, 3.0), ts("forward", "a", 1.0, 2.0)
    events = [e for e in chrome_trace([child, parent], 0.0)["traceEvents"] if e["ph"] == "X"]
    assert [e["name"] for e in events] == [ROOT, "a"]


def test_overlapping_spans_of_a_lane_go_on_more_threads() -> None:
    # Three all-reduces in flight at once (each issued before the last completed), and a
    # fourth once all are done: complete events on one thread must nest, these cannot.
    spans = [ts("collective", f"ar{i}", i, i + 2.5) for i in range(3)]
    spans.append(ts("collective", "ar3", 10, 11))
    trace = chrome_trace([*spans, ts("hook", "h", 0, 1), ts("hook", "inner", 0.5, 0.5)], 0.0)
    tids = {e["name"]: e["tid"] for e in trace["traceEvents"] if e["ph"] != "M"}
    assert tids == {"ar0": 3, "ar1": 13, "ar2": 23, "ar3": 3, "h": 2, "inner": 2}
    names = {
        (e["tid"], e["args"].get("name"))
        for e in trace["traceEvents"]
        if e["name"] == "thread_name"
    }
    assert names == {(2, "hooks"), (3, "collectives"), (13, "collectives 2"), (23, "collectives 3")}


def test_every_thread_nests(tmp_path: Path) -> None:
    rng = random.Random(5)
    spans = []
    for i in range(300):  # random intervals, some sharing ends, some instants
        a = rng.choice([0.0, 1.0, rng.random() * 10])
        b = rng.choice([a, a + 1.0, a + rng.random() * 3])
        spans.append(ts(rng.choice(["backward", "collective"]), str(i), a, b))
    events = [e for e in chrome_trace(spans, 0.0)["traceEvents"] if e["ph"] in "Xi"]
    assert len(events) == 300
    by_thread: dict[int, list[tuple[int, int]]] = {}
    for e in events:
        t0 = round(e["ts"] * 1000)
        by_thread.setdefault(e["tid"], []).append((t0, t0 + round(e.get("dur", 0) * 1000)))
    for intervals in by_thread.values():
        for a0, a1 in intervals:
            for b0, b1 in intervals:
                disjoint = a1 <= b0 or b1 <= a0
                nested = (a0 <= b0 and b1 <= a1) or (b0 <= a0 and a1 <= b1)
                assert disjoint or nested


def test_non_finite_times_are_refused() -> None:
    with pytest.raises(ValueError, match="not finite"):
        chrome_trace([ts("hook", "x", float("inf"), float("inf"))], 0.0)


def test_event_name() -> None:
    assert event_name(ts("forward", "", 0, 1)) == ROOT
    assert event_name(ts("forward", "layers.0", 0, 1)) == "layers.0"


def test_write_and_read(tmp_path: Path) -> None:
    trace = chrome_trace([ts("forward", "", 1.0, 2.0)], 1.0)
    path = write_chrome_trace(str(tmp_path / "t.json"), trace)
    assert path == tmp_path / "t.json"
    assert read_chrome_trace(path) == trace["traceEvents"]
    array = tmp_path / "array.json"  # the format's other form: a bare list of events
    array.write_text(json.dumps(trace["traceEvents"]))
    assert read_chrome_trace(array) == trace["traceEvents"]


@pytest.mark.parametrize("text", ["{", '{"traceEvents": 3}', "[1, 2]", '"x"'])
def test_read_refuses_what_is_not_a_trace(tmp_path: Path, text: str) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(text)
    with pytest.raises(ValueError, match=r"bad\.json"):
        read_chrome_trace(bad)
    with pytest.raises(ValueError, match=r"missing\.json"):
        read_chrome_trace(tmp_path / "missing.json")


def test_write_names_the_path_it_cannot_write(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"folder .*no/such.* does not exist"):
        write_chrome_trace(tmp_path / "no" / "such" / "t.json", {})
    with pytest.raises(IsADirectoryError, match="that is a folder"):
        write_chrome_trace(tmp_path, {})


def test_model_export_round_trip(tmp_path: Path) -> None:
    m = TimelineModel(make_store(FakeTimeline(world_size=3, compiled=True).events()))
    events = read_chrome_trace(m.to_chrome_trace(tmp_path / "t.json"))
    spans = [s for r in m.ranks for s in m.spans(r)]
    data = [e for e in events if e["ph"] in ("X", "i")]
    origin = m.origin
    assert origin is not None
    key = lambda e: (e["pid"], e["ts"], e["name"])  # noqa: E731
    want = sorted(
        (
            {"pid": s.rank, "ts": round((s.start - origin) * 1e6, 3), "name": event_name(s),
             "cat": s.kind, "dur": s.duration * 1e6, "iteration": s.iteration}
            for s in spans
        ),
        key=key,
    )  # fmt: skip
    got = sorted(data, key=key)
    assert len(got) == len(want) == 90
    for g, w in zip(got, want, strict=True):
        assert (g["pid"], g["ts"], g["name"], g["cat"]) == (w["pid"], w["ts"], w["name"], w["cat"])
        assert (
            g["dur"] == pytest.approx(w["dur"], abs=2e-3)
            and g["args"]["iteration"] == w["iteration"]
        )
