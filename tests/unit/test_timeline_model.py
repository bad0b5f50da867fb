"""TimelineModel on synthetic events (``testing.FakeTimeline``, as the probe sends them).

The fake's defaults: units "0", "1", "2" under the root "", 2 ranks, 2 iterations, per
unit 2 ms forward, 4 ms backward, a 0.2 ms post-backward hook issuing a 3 ms
reduce-scatter; interleaved, each reduce-scatter runs during the next unit's backward.
"""

from __future__ import annotations

import logging
from collections.abc import Collection
from typing import Any

import msgspec
import numpy as np
import pytest
from support import make_store

from interactive_shard import features
from interactive_shard.telemetry.schema import Event
from interactive_shard.telemetry.store import RunStore
from interactive_shard.testing import FakeTimeline
from interactive_shard.timeline.chrome import read_chrome_trace
from interactive_shard.timeline.events import Span, TimelineSpans, TimelineWatch
from interactive_shard.timeline.model import Matched, TimelineModel, TimelineSpan, union

UNITS = ["0", "1", "2"]


def model_of(fake: FakeTimeline | None = None, **kw: Any) -> TimelineModel:
    return TimelineModel(make_store((fake or FakeTimeline(**kw)).events()))


def spans_event(rank: int, iteration: int, spans: list[Any], t: float = 1.0) -> Event:
    """A ``timeline_spans`` event of raw payload dicts (hostile ones too)."""
    return Event("timeline_spans", rank, iteration, t, {"iteration": iteration, "spans": spans})


def span(kind: str, name: str, start: float, end: float, **detail: Any) -> dict[str, Any]:
    return {"kind": kind, "name": name, "start": start, "end": end, "detail": detail}


def watch_event(rank: int, host: str = "node0", t: float = 0.0) -> Event:
    w = TimelineWatch(target="fsdp2", depth=None, modules=[""], world_size=2, host=host)
    return Event(TimelineWatch.KIND, rank, 0, t, msgspec.to_builtins(w))


def hand(spans: list[dict[str, Any]], rank: int = 0) -> TimelineModel:
    return TimelineModel(make_store([watch_event(rank), spans_event(rank, 1, spans)]))


# -- what arrived ------------------------------------------------------------------------------
def test_ranks_iterations_latest_watch_and_repr() -> None:
    m = model_of(world_size=3, iterations=4)
    assert m.ranks == [0, 1, 2]
    assert m.iterations() == [1, 2, 3, 4] and m.iterations(2) == [1, 2, 3, 4]
    assert m.latest() == 4 and m.latest(1) == 4 and m.latest(7) is None
    assert m.iterations(7) == []
    w = m.watch(1)
    assert w is not None and w.modules == ["", *UNITS] and w.host == "node0"
    assert m.watch(9) is None
    assert m.skipped == 0 and m.revision == 1
    assert repr(m) == "TimelineModel(ranks=[0, 1, 2], iterations=4, spans=180, skipped=0)"


def test_empty_model() -> None:
    m = TimelineModel(make_store())
    assert m.ranks == [] and m.iterations() == [] and m.latest() is None
    assert m.origin is None and m.spans() == [] and m.phases() == {}
    assert m.order() == [] and m.overlap() == 0.0 and m.exposed() == 0.0
    assert m.collectives() == [] and m.at(1.0) == {} and m.findings == []
    assert m.offset(1) == 0.0


def test_spans_sorted_aligned_and_filtered() -> None:
    fake = FakeTimeline()
    m = model_of(fake)
    spans = m.spans(rank=1, iteration=2)
    assert len(spans) == 15  # root + 3 forwards, root + 3 backwards, 3 hooks, 3 RS, 1 step
    assert [(s.start, s.end) for s in spans] == sorted((s.start, s.end) for s in spans)
    assert all(isinstance(s, TimelineSpan) and s.rank == 1 and s.iteration == 2 for s in spans)
    true = sorted((s.start, s.end, s.name) for s in fake.true_spans(2)[1])
    assert sorted((s.start, s.end, s.name) for s in spans) == true  # one host: as sent
    every = m.spans(rank=1)
    assert len(every) == 30 and every == sorted(every, key=lambda s: (s.start, s.end))
    hooks = m.spans(rank=0, iteration=1, kinds=["hook"])
    assert [s.name for s in hooks] == [f"post_backward:{u}" for u in reversed(UNITS)]
    assert m.spans(rank=0, iteration=1, kinds="hook") == hooks  # one kind as a str
    assert hooks[0].duration == pytest.approx(fake.hook_s)
    rs = m.spans(rank=0, iteration=1, kinds=["collective"])[0]
    assert rs.detail["op"] == "reduce_scatter" and rs.detail["nbytes"] == 4096
    with pytest.raises(ValueError, match="unknown span kinds \\['bogus'\\]"):
        m.spans(kinds=["hook", "bogus"])


# -- phases and order ------------------------------------------------------------------------------
def test_phases() -> None:
    m = model_of()
    spans = m.spans(0, 1)
    root = next(s for s in spans if s.kind == "forward" and s.name == "")
    step = next(s for s in spans if s.kind == "optimizer")
    assert m.phases(0, 1) == {
        "forward": (root.start, root.end),
        "backward": (root.end, step.start),
        "optimizer": (step.start, step.end),
    }
    assert m.phases(0, 9) == {}


def test_phases_without_optimizer_or_forward() -> None:
    m = hand([span("forward", "", 1, 2), span("backward", "a", 3, 5), span("hook", "h", 5, 6)])
    assert m.phases() == {"forward": (1, 2), "backward": (2, 6)}
    m = hand([span("backward", "a", 3, 5), span("optimizer", "step", 6, 7)])
    assert m.phases() == {"optimizer": (6, 7)}  # no root forward: no backward either
    m = hand([span("compiled_forward", "", 1, 2), span("compiled_forward", "sub", 1.2, 1.8)])
    assert m.phases()["forward"] == (1, 2)


def test_order() -> None:
    m = model_of()
    assert m.order(0, 1, "forward", kinds=["forward"]) == ["", *UNITS]
    assert m.order(0, 1, "backward", kinds=["backward"]) == ["", *reversed(UNITS)]
    hooks = [f"post_backward:{u}" for u in reversed(UNITS)]
    assert m.order(1, 2, "backward", kinds=["hook"]) == hooks
    assert m.order(0, 1, "backward", kinds=["collective"]) == ["reduce_scatter"] * 3
    assert m.order(0, 1, "optimizer") == ["SGD.step"]
    back = m.order(0, 1)  # the default: backward, every kind
    assert back[:3] == ["", "2", "post_backward:2"] and "SGD.step" not in back
    assert len(m.order(0, 1, None)) == 15 and m.order(0, 1, "forward", ["hook"]) == []
    with pytest.raises(ValueError, match="phase 'fwd' is not one of"):
        m.order(0, 1, "fwd")


def test_order_ties_by_end() -> None:
    m = hand(
        [
            span("forward", "", 0, 10),
            span("hook", "long", 11, 14),
            span("hook", "short", 11, 12),
            span("hook", "instant", 11, 11),
        ]
    )
    assert m.order(phase="backward") == ["instant", "short", "long"]


def test_compiled_kinds() -> None:
    m = model_of(compiled=True)
    kinds = {s.kind for s in m.spans(0, 1)}
    assert kinds == {"compiled_forward", "compiled_backward", "hook", "collective", "optimizer"}
    assert m.order(0, 1, "forward", kinds=["compiled_forward"]) == ["", *UNITS]
    assert m.overlap(0, 1) == pytest.approx(model_of().overlap(0, 1))


# -- overlap -------------------------------------------------------------------------------------
def test_interleaved_overlaps_bunched_does_not() -> None:
    fake = FakeTimeline()
    inter, bunched = model_of(fake), model_of(bunched=True)
    # Units 2 and 1's reduce-scatters hide behind the next backward but for the half hook
    # they start in; unit 0's runs after the last backward: exposed.
    hidden = 2 * (fake.collective_s - fake.hook_s / 2)
    assert inter.overlap(0, 1) == pytest.approx(hidden / (3 * fake.collective_s))
    assert inter.exposed(0, 1) == pytest.approx(3 * fake.collective_s - hidden)
    assert bunched.overlap(0, 1) == 0.0
    assert bunched.exposed(0, 1) == pytest.approx(3 * fake.collective_s)
    assert inter.overlap(0, 1) - bunched.overlap(0, 1) > 0.6
    shares = [share for _, share in inter.overlaps(1, 2)]
    assert shares[:2] == pytest.approx([1 - fake.hook_s / 2 / fake.collective_s] * 2)
    assert shares[2] == 0.0
    assert [c.name for c, _ in bunched.overlaps(0, 1)] == ["reduce_scatter"] * 3
    assert all(share == 0.0 for _, share in bunched.overlaps(0, 1))
    assert inter.overlap(0, 1, None) == inter.overlap(0, 1)  # all collectives are backward's
    assert inter.overlap(0, 1, "forward") == 0.0 and inter.exposed(0, 1, "forward") == 0.0


def test_overlap_counts_leaves_not_the_root() -> None:
    spans = [
        span("forward", "", 0, 10),
        span("backward", "", 10, 30),  # the root: covers everything, has children
        span("backward", "a", 10, 15),
        span("backward", "b", 20, 25),
        span("collective", "all_reduce", 14, 22, op="all_reduce", group="0"),
        span("collective", "all_reduce", 16, 18, op="all_reduce", group="0"),  # in the union
        span("collective", "all_reduce", 26, 26, op="all_reduce", group="0"),  # an instant
        span("optimizer", "step", 31, 32),
    ]
    m = hand(spans)
    assert m.overlap() == pytest.approx(3 / 8)  # [14, 22] hidden by [14, 15] and [20, 22]
    assert m.exposed() == pytest.approx(5)
    assert [share for _, share in m.overlaps()] == pytest.approx([3 / 8, 0.0, 0.0])
    assert m.overlap(phase="forward") == 0.0  # forward compute does not hide backward's
    # A forward leaf hides a collective of the forward; the root forward is not a leaf.
    fwd = hand([span("forward", "", 0, 10), span("forward", "x", 0, 4), spans[4] | {"start": 3}])
    assert fwd.overlap(phase="forward") == pytest.approx(1 / 19)  # [3, 22]: [3, 4] hidden
    alone = hand([span("forward", "", 0, 10), span("collective", "c", 2, 4, op="x")])
    assert alone.overlap(phase="forward") == pytest.approx(1.0)  # a leaf root computes


def test_union() -> None:
    assert union([(3, 4), (0, 1), (0.5, 2), (2, 2.5), (5, 5)]) == [(0, 2.5), (3, 4)]


# -- alignment and collectives across ranks --------------------------------------------------------
def test_one_host_shares_rank_0s_clock() -> None:
    m = model_of(hosts=["h", "h"], skew=[0.0, 0.25])  # one host: its skew is real, not clock
    assert m.offset(1) == 0.0 and m.offset(0) == 0.0
    assert m.spans(1, 1)[0].start == 1000.25


def test_two_hosts_aligned_from_collective_ends() -> None:
    fake = FakeTimeline(hosts=["a", "b"], skew=[0.0, 5.0], delay=[0.0, 0.002])
    m = model_of(fake)
    assert m.offset(1) == pytest.approx(-5.0, abs=1e-9)
    true = sorted((s.start, s.name) for s in fake.true_spans(1)[1])
    got = sorted((s.start, s.name) for s in m.spans(1, 1))
    assert [n for _, n in got] == [n for _, n in true]
    assert [t for t, _ in got] == pytest.approx([t for t, _ in true], abs=1e-9)
    assert m.origin == pytest.approx(fake.t0)
    for c in m.collectives(1):
        assert c.ends[0] == pytest.approx(c.ends[1], abs=1e-9)


def test_offset_is_the_median() -> None:
    events = [watch_event(0, "a"), watch_event(1, "b")]
    ends0, ends1 = [1.0, 2.0, 3.0], [11.0, 12.0, 13.5]  # one late end: an outlier
    for rank, ends in ((0, ends0), (1, ends1)):
        cs = [span("collective", "ar", e - 0.5, e, op="all_reduce", group="0") for e in ends]
        events.append(spans_event(rank, 1, cs))
    m = TimelineModel(make_store(events))
    assert m.offset(1) == -10.0
    assert m.origin == 0.5


def test_unknown_host_or_nothing_shared_is_offset_0() -> None:
    no_watch = TimelineModel(make_store([spans_event(1, 1, [span("hook", "h", 5, 6)])]))
    assert no_watch.offset(1) == 0.0
    events = [
        watch_event(0, "a"),
        watch_event(1, "b"),
        spans_event(1, 1, [span("hook", "h", 5, 6)]),
    ]
    assert TimelineModel(make_store(events)).offset(1) == 0.0


def test_stragglers_and_waits() -> None:
    fake = FakeTimeline(world_size=3, delay=[0.0, 0.01, 0.004])
    m = model_of(fake)
    found = m.collectives(2)
    assert [(c.index, c.op, c.group, c.nbytes) for c in found] == [
        (k, "reduce_scatter", "0", 4096) for k in range(3)
    ]
    first = found[0]
    assert isinstance(first, Matched) and first.straggler == 1
    assert first.waited == pytest.approx({0: 0.01, 1: 0.0, 2: 0.006})
    assert set(first.starts) == set(first.ends) == {0, 1, 2}
    assert len(set(first.ends.values())) == 1  # completes at once everywhere
    assert all(c.straggler == 1 for c in found)
    assert all(c.waited[0] > 0 for c in model_of(delay=[0.0, 0.01]).collectives(1))


def test_matching_by_group_and_op() -> None:
    def c(op: str, start: float, group: str = "0", nbytes: int = 8) -> dict[str, Any]:
        return span("collective", op, start, start + 1, op=op, group=group, nbytes=nbytes)

    r0 = [c("all_gather", 0), c("reduce_scatter", 2, nbytes=64), c("all_gather", 4, group="1")]
    r1 = [c("reduce_scatter", 1, nbytes=32), c("all_gather", 3), c("all_gather", 8)]
    events = [spans_event(0, 1, r0), spans_event(1, 1, r1), spans_event(2, 1, [c("x", 9)])]
    found = TimelineModel(make_store(events)).collectives(1)
    keys = [(m.group, m.op, m.index, sorted(m.starts)) for m in found]
    assert keys == [
        ("0", "all_gather", 0, [0, 1]),
        ("0", "reduce_scatter", 0, [0, 1]),
        ("1", "all_gather", 0, [0]),  # only the ranks that have it
        ("0", "all_gather", 1, [1]),
        ("0", "x", 0, [2]),
    ]
    rs = found[1]
    assert rs.nbytes == 64 and rs.straggler == 0 and rs.waited == {0: 0.0, 1: 1.0}
    assert found[4].nbytes == 8  # no rank 0: the first rank's


def test_at() -> None:
    m = model_of()
    unit1 = next(s for s in m.spans(0, 1, ["backward"]) if s.name == "1")
    now = m.at((unit1.start + unit1.end) / 2)
    assert sorted(now) == [0, 1]
    names = {(s.kind, s.name) for s in now[0]}
    assert ("backward", "1") in names and ("backward", "") in names
    assert ("collective", "reduce_scatter") in names  # unit 2's, hidden behind unit 1
    assert m.at(unit1.start, iteration=2) == {0: [], 1: []}
    assert m.at(0.0) == {0: [], 1: []}


# -- conclusions -----------------------------------------------------------------------------------
def test_findings_bunched_only() -> None:
    assert model_of().findings == []
    [found] = model_of(bunched=True, compiled=True).findings
    assert found.kind == "bunched" and found.ranks == [0, 1] and found.iterations == [1, 2]
    assert "none overlapped" in found.message and "9 ms exposed" in found.message


# -- incremental ----------------------------------------------------------------------------------
class CountingStore(RunStore):
    def __init__(self, store: RunStore) -> None:
        super().__init__(store.info)
        self.starts: list[int] = []
        self.read: list[int] = []  # positions whose columns were read

    def positions(self, start: int, kinds: Collection[str]) -> tuple[np.ndarray, int]:
        self.starts.append(start)
        return super().positions(start, kinds)

    def columns(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        self.read += positions.tolist()
        return super().columns(positions)


def test_update_consumes_only_new_events() -> None:
    events = FakeTimeline(iterations=3).events()
    store = CountingStore(make_store())
    m = TimelineModel(store)
    assert m.update() is False and m.revision == 0
    store.extend(events[:4])  # the watches and iteration 1
    assert m.update() is True and m.revision == 1 and m.iterations() == [1]
    assert m.update() is False and m.revision == 1
    store.extend(events[4:])
    store.starts.clear()
    store.read.clear()
    assert m.update() is True and set(store.starts) == {4}
    assert store.read == list(range(4, len(events)))  # the new batches only, once each
    assert m.iterations() == [1, 2, 3] and m.revision == 2
    store.append(Event("log", 0, 0, 1.0, {"line": "x"}))  # not ours: no change
    assert m.update() is False and m.revision == 2


def test_a_later_batch_of_an_iteration_refreshes_its_results() -> None:
    first = [span("forward", "", 0, 10), span("backward", "a", 10, 15)]
    first.append(span("collective", "rs", 12, 18, op="reduce_scatter", group="0"))
    store = make_store([watch_event(0), spans_event(0, 1, first)])
    m = TimelineModel(store)
    assert m.phases() == {"forward": (0, 10), "backward": (10, 18)}
    assert m.overlap() == pytest.approx(0.5) and m.order() == ["a", "rs"]
    more = [span("backward", "b", 15, 20), span("optimizer", "step", 21, 22)]
    store.append(spans_event(0, 1, more))  # the rest of iteration 1 (a flush split it)
    assert m.phases()["backward"] == (10, 21) and m.phases()["optimizer"] == (21, 22)
    assert m.overlap() == pytest.approx(1.0) and m.order() == ["a", "rs", "b"]
    assert m.revision == 2


def test_watch_again_restarts_the_rank() -> None:
    fake = FakeTimeline(iterations=2)
    store = make_store(fake.events())
    m = TimelineModel(store)
    assert m.iterations(0) == [1, 2] and len(m.spans(0, 1)) == 15
    store.append(watch_event(0, "other", t=2000.0))
    assert m.iterations(0) == [] and m.spans(0, 1) == [] and m.watch(0).host == "other"  # type: ignore[union-attr]
    assert m.iterations(1) == [1, 2]
    store.append(spans_event(0, 1, [span("hook", "h", 3000, 3001)]))
    assert m.order(0, 1, None) == ["h"]


def test_cached_results_follow_the_offset() -> None:
    store = make_store([watch_event(0, "a"), watch_event(1, "b")])
    r0 = [span("collective", "ar", 1, 2, op="all_reduce", group="0")]
    r1 = [span("collective", "ar", 10, 12, op="all_reduce", group="0")]
    store.extend([spans_event(0, 1, r0), spans_event(1, 1, r1)])
    m = TimelineModel(store)
    assert m.spans(1, 1)[0].start == -0.0 and m.offset(1) == -10.0
    store.extend([spans_event(0, 2, r0), spans_event(1, 2, [r1[0] | {"end": 11.0}])])
    store.extend([spans_event(0, 3, r0), spans_event(1, 3, [r1[0] | {"end": 11.0}])])
    assert m.offset(1) == -9.0 and m.spans(1, 1)[0].start == 1.0  # iteration 1 realigned


# -- hostile input ---------------------------------------------------------------------------------
BAD_SPANS = [
    span("bogus", "x", 1, 2),  # unknown kind
    span("hook", "x", -1, 2),  # before the clock's zero
    span("hook", "x", float("nan"), 2),
    span("hook", "x", 1, float("nan")),
    {"kind": "hook", "name": "x", "start": 1},  # no end
    {"kind": "hook", "name": 3, "start": 1, "end": 2},  # a name that is not a str
    span("hook", "x", 1, 2) | {"detail": {"deep": [1, 2]}},  # detail values are scalars
    span("hook", "x", True, 2),  # bool is not a time
    "not a span",
]


@pytest.mark.parametrize("bad", BAD_SPANS, ids=range(len(BAD_SPANS)))
def test_a_malformed_batch_is_skipped_and_counted(
    bad: Any, caplog: pytest.LogCaptureFixture
) -> None:
    good = spans_event(0, 1, [span("hook", "ok", 1, 2)])
    m = TimelineModel(make_store([watch_event(0), spans_event(0, 1, [bad]), good]))
    with caplog.at_level(logging.WARNING):
        assert m.order(0, 1, None) == ["ok"]
    assert m.skipped == 1 and "skipped a malformed timeline_spans" in caplog.text


def test_spans_ending_before_they_start_are_skipped_one_by_one() -> None:
    spans = [span("hook", "ok", 1, 2), span("hook", "back", 5, 4), span("hook", "inf", 1, 1e400)]
    m = TimelineModel(make_store([spans_event(0, 1, spans)]))
    assert m.order(0, 1, None) == ["ok"] and m.skipped == 2
    # Batches are decoded when their iteration is first read: until then the batch only
    # files its iteration, and its malformed spans are counted when read.
    only_bad = TimelineModel(make_store([spans_event(0, 1, [span("hook", "back", 5, 4)])]))
    assert only_bad.update() is True and only_bad.skipped == 0 and only_bad.iterations() == [1]
    assert only_bad.spans(0, 1) == [] and only_bad.skipped == 1
    assert only_bad.order(0, 1, None) == [] and only_bad.skipped == 1  # counted once


@pytest.mark.parametrize(
    "payload",
    [
        {"iteration": 0, "spans": []},  # iterations count from 1
        {"iteration": "1", "spans": []},
        {"spans": []},
    ],
)
def test_malformed_spans_events_are_skipped(payload: dict[str, Any]) -> None:
    m = TimelineModel(make_store([Event(TimelineSpans.KIND, 0, 1, 1.0, payload)]))
    assert m.ranks == [] and m.skipped == 1  # no iteration to file it under


def test_a_batch_is_checked_when_its_iteration_is_read() -> None:
    bad = Event(TimelineSpans.KIND, 0, 1, 1.0, {"iteration": 1, "spans": {"a": 1}})
    good = spans_event(0, 2, [span("hook", "ok", 1, 2)])
    m = TimelineModel(make_store([bad, good]))
    assert m.iterations() == [1, 2] and m.skipped == 0  # filed by iteration, unread
    assert m.spans(0, 1) == [] and m.skipped == 1
    assert m.order(0, 1, None) == [] and m.summary(0, 1).collectives == 0
    assert m.skipped == 1  # read again (from the cache or not): counted once
    assert m.order(0, 2, None) == ["ok"] and m.skipped == 1


@pytest.mark.parametrize(
    "change",
    [{"target": "tpu"}, {"world_size": 0}, {"host": None}, {"modules": "x"}, {"extra": 1}],
)
def test_malformed_watches_are_skipped(change: dict[str, Any]) -> None:
    w = TimelineWatch(target="ddp", depth=None, modules=[], world_size=2, host="h")
    payload = msgspec.to_builtins(w) | change
    m = TimelineModel(make_store([Event(TimelineWatch.KIND, 0, 0, 1.0, payload)]))
    if "extra" in change:  # an unknown field: a newer probe's, ignored
        assert m.watch(0) == w and m.skipped == 0
    else:
        assert m.watch(0) is None and m.skipped == 1


def test_fake_spans_follow_the_struct() -> None:
    for e in FakeTimeline(compiled=True, bunched=True).events():
        if e.kind == TimelineSpans.KIND:
            batch = msgspec.convert(e.payload, TimelineSpans)
            assert batch.spans == sorted(batch.spans, key=lambda s: s.end)
            assert all(isinstance(s, Span) for s in batch.spans)


# -- export and display --------------------------------------------------------------------------
def test_to_chrome_trace(tmp_path: Any) -> None:
    m = model_of(hosts=["a", "b"], skew=[0.0, 2.0])
    path = m.to_chrome_trace(tmp_path / "trace.json")
    assert path == tmp_path / "trace.json"
    events = [e for e in read_chrome_trace(path) if e["ph"] in "Xi"]
    spans = [s for r in m.ranks for s in m.spans(r)]
    assert len(events) == len(spans) == 60
    assert sorted(e.get("dur", 0.0) for e in events) == pytest.approx(
        sorted(s.duration * 1e6 for s in spans), abs=2e-3
    )
    assert min(e["ts"] for e in events) == 0.0
    with pytest.raises(FileNotFoundError, match="nowhere"):
        m.to_chrome_trace(tmp_path / "nowhere" / "trace.json")
    with pytest.raises(IsADirectoryError, match=str(tmp_path.name)):
        m.to_chrome_trace(tmp_path)


def test_feature_entry_finds_the_model() -> None:
    if "timeline" not in [f.name for f in features.FEATURES]:
        pytest.skip("the timeline feature is not registered in features.py yet")
    assert features.feature_of_model(model_of()).name == "timeline"
