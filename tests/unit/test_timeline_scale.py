"""The timeline at scale: an update files batches without decoding them, an iteration is
decoded when read (once, cached), and the views of a long run draw a bounded sample that
says so, the selected iteration exactly (issue 12)."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from support import make_store

from interactive_shard.telemetry.schema import Event
from interactive_shard.testing import FakeTimeline
from interactive_shard.timeline import _cross_rank
from interactive_shard.timeline.chrome import read_chrome_trace
from interactive_shard.timeline.events import Span, TimelineSpans
from interactive_shard.timeline.figures import MAX_TIMELINE_ITERATIONS, figure_timeline
from interactive_shard.timeline.figures_collectives import MAX_OVERLAP_ITERATIONS, figure_overlap
from interactive_shard.timeline.model import TimelineModel
from interactive_shard.timeline.view import FINDINGS_WINDOW, RECENT_OPTIONS, TimelineView


@pytest.fixture(scope="module")
def long_events() -> list[Event]:
    return FakeTimeline(iterations=1000, bunched=True).events()


@pytest.fixture
def decodes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The iterations of the timeline_spans batches decoded, in order."""
    seen: list[int] = []
    convert = msgspec.convert

    def counting(obj: Any, type: Any, **kw: Any) -> Any:
        if type is TimelineSpans:
            seen.append(obj.get("iteration") if isinstance(obj, dict) else -1)
        return convert(obj, type, **kw)

    monkeypatch.setattr(msgspec, "convert", counting)
    return seen


def test_update_files_batches_and_decodes_only_what_is_read(decodes: list[int]) -> None:
    store = make_store()
    m = TimelineModel(store)
    store.extend(FakeTimeline(iterations=40).events())
    assert m.update() is True and decodes == []  # 80 batches filed, none read
    assert m.iterations() == list(range(1, 41)) and m.count() == 40 and m.latest() == 40
    assert m.has(1, 7) and not m.has(1, 41) and m.earliest() == 1 and m.recent(2) == [39, 40]
    assert decodes == []
    spans = m.spans(1, 7)
    assert len(spans) == 15 and decodes == [7]  # one batch: rank 1's of iteration 7
    assert m.order(1, 7) and m.overlap(1, 7) > 0 and m.phases(1, 7) and decodes == [7]
    m.collectives(7)
    assert sorted(decodes) == [7, 7]  # rank 0's batch too, once


def test_a_flush_split_iteration_and_a_watch_within_one_update() -> None:
    fake = FakeTimeline(iterations=2)
    events = fake.events()
    watch = next(e for e in events if e.kind == "timeline_watch" and e.rank == 0)
    first, rest = fake.rank_spans(0, 3)[:5], fake.rank_spans(0, 3)[5:]
    parts = [spans_event(0, 3, first), spans_event(0, 3, rest)]
    m = TimelineModel(make_store([*events, *parts]))
    assert m.iterations(0) == [1, 2, 3] and len(m.spans(0, 3)) == 15  # both parts
    again = TimelineModel(make_store([*events, watch, *parts]))  # rank 0 watched again
    assert again.iterations(0) == [3] and again.iterations(1) == [1, 2]
    assert again.iterations() == [1, 2, 3]


def test_iterations_stay_sorted_as_ranks_arrive_apart_and_out_of_order() -> None:
    fake = FakeTimeline(iterations=9)
    batches = {(e.rank, e.step): e for e in fake.events() if e.kind == TimelineSpans.KIND}
    store = make_store([e for e in fake.events() if e.kind != TimelineSpans.KIND])
    m = TimelineModel(store)

    def send(rank: int, *its: int) -> list[int]:
        store.extend(batches[(rank, it)] for it in its)
        return m.iterations()

    assert send(0, 1, 2, 3, 4, 5) == [1, 2, 3, 4, 5] and send(1, 1, 2, 3) == [1, 2, 3, 4, 5]
    assert send(1, 4, 5, 6, 7) == [1, 2, 3, 4, 5, 6, 7]  # rank 1 ahead now
    assert m.iterations(0) == [1, 2, 3, 4, 5] and m.iterations(1) == list(range(1, 8))
    assert send(0, 9, 6) == [1, 2, 3, 4, 5, 6, 7, 9]  # out of order (a late CUDA span)
    assert m.iterations(0) == [1, 2, 3, 4, 5, 6, 9] and m.latest(0) == 9
    assert send(1, 8) == list(range(1, 10)) and m.count() == 9 and m.count(1) == 8


def test_the_decoded_cache_is_bounded_and_counts_a_bad_batch_once() -> None:
    events = FakeTimeline(iterations=30).events()
    bad = Event(TimelineSpans.KIND, 0, 31, 1.0, {"iteration": 31, "spans": [{"kind": "x"}]})
    m = TimelineModel(make_store([*events, bad]))
    m._decoder.limit = 4  # far fewer than the 62 (rank, iteration)s
    first = [m.overlap(r, it) for r in (0, 1) for it in range(1, 32)]
    assert m.skipped == 1 and len(m._decoder._cache) == 4
    assert [m.overlap(r, it) for r in (0, 1) for it in range(1, 32)] == first
    assert [s.name for s in m.spans(0, 31)] == [] and m.skipped == 1  # decoded again


def test_findings_name_runs_of_iterations_as_ranges() -> None:
    m = TimelineModel(make_store(FakeTimeline(iterations=12, bunched=True).events()))
    [found] = m.findings
    assert found.iterations == list(range(1, 13)) and "iteration(s) 1–12:" in found.message
    assert _cross_rank.listed([1, 2, 4, 5, 6, 9]) == "1, 2, 4–6, 9"
    [recent] = m.findings_of(range(10, 13))
    assert recent.iterations == [10, 11, 12] and "iteration(s) 10–12:" in recent.message
    assert TimelineModel(make_store(FakeTimeline().events())).findings_of([1]) == []


def test_sample_keeps_its_iterations_while_the_run_grows() -> None:
    its = list(range(1, 501))
    shown, stride = _cross_rank.sample(its, 50, keep=[123, None, 9999])
    assert stride == 10 and len(shown) <= 52
    assert 123 in shown and 500 in shown and 9999 not in shown  # kept: only what arrived
    grown, again = _cross_rank.sample(list(range(1, 1000)), 50, keep=[])
    assert again == 20 and set(grown) >= set(its[::20])  # the next stride keeps its picks
    assert _cross_rank.sample([3, 4], 50, keep=[]) == ([3, 4], 1)


def test_overlap_overview_of_a_long_run_is_decimated_and_says_so(
    long_events: list[Event],
) -> None:
    m = TimelineModel(make_store(long_events))
    fig = figure_overlap(m, selected=123)
    assert "every 20th iteration shown (52 of 1,000)" in fig.layout.title.text
    for trace in fig.data:
        xs = list(trace.x)
        assert len(xs) <= MAX_OVERLAP_ITERATIONS + 2 and {123, 1000} <= set(xs)
    rank0 = fig.data[0]
    assert list(rank0.y) == pytest.approx([100 * m.overlap(0, it) for it in rank0.x])
    small = figure_overlap(TimelineModel(make_store(FakeTimeline(iterations=3).events())))
    assert "shown" not in small.layout.title.text and small.layout.xaxis.dtick == 1


def test_every_iteration_of_a_long_run_draws_a_sample_and_says_so(
    long_events: list[Event],
) -> None:
    m = TimelineModel(make_store(long_events))
    fig = figure_timeline(m)
    title = fig.layout.title.text
    assert "iterations 1–1000" in title and "every 50th iteration shown (21 of 1,000)" in title
    (window,) = [t for t in fig.data if t.name == "backward phase"]
    assert len(window.base) == 2 * 21 <= 2 * (MAX_TIMELINE_ITERATIONS + 1)
    drawn = {t.name: len(t.x) for t in fig.data if t.name == "optimizer"}
    assert drawn == {"optimizer": 2 * 21}  # one step per rank and iteration drawn
    exact = figure_timeline(m, iteration=777, ranks=[1])
    assert "iteration 777 · rank 1" in exact.layout.title.text
    assert "shown" not in exact.layout.title.text


def test_chrome_trace_of_some_iterations(tmp_path: Any, long_events: list[Event]) -> None:
    m = TimelineModel(make_store(long_events))
    path = m.to_chrome_trace(tmp_path / "t.json", iterations=range(500, 503))
    events = [e for e in read_chrome_trace(path) if e["ph"] in "Xi"]
    assert len(events) == 2 * 3 * 15 and {e["args"]["iteration"] for e in events} == {
        500,
        501,
        502,
    }
    assert min(e["ts"] for e in events) == 0.0  # relative to their own first span


def test_a_second_host_is_aligned_by_its_first_iterations() -> None:
    fake = FakeTimeline(hosts=["a", "b"], skew=[0.0, 5.0], iterations=30)
    store = make_store(fake.events())
    m = TimelineModel(store)
    assert m.offset(1) == pytest.approx(-5.0, abs=1e-9)
    later = FakeTimeline(hosts=["a", "b"], skew=[0.0, 7.0], iterations=60)
    store.extend(e for e in later.events() if e.step > 30)  # rank 1's clock jumped
    assert m.latest() == 60 and m.offset(1) == pytest.approx(-5.0, abs=1e-9)  # settled


def test_long_run_view_bounds_its_selector_status_and_reads(
    long_events: list[Event], decodes: list[int]
) -> None:
    store = make_store(long_events[:20])
    view = TimelineView(TimelineModel(store))
    view.widget  # noqa: B018
    store.extend(long_events[20:])
    decodes.clear()
    view.refresh()
    assert len(decodes) < 200  # of 2,000 batches: what the panels show
    values = [v for _, v in view.iteration_selector.options]
    assert values[:3] == [0, -1, 1] and values[-RECENT_OPTIONS:] == list(range(951, 1001))
    assert len(values) == 3 + RECENT_OPTIONS
    status = view.status_html.value
    assert "1,000 iteration(s)" in status and "iteration(s) 981–1000" in status
    assert f"(the latest {FINDINGS_WINDOW} of 1,000 iterations checked" in status
    view.iteration_box.value = 123  # "go to": any iteration
    assert 123 not in values and view.iteration_selector.value == 123
    assert 123 in [v for _, v in view.iteration_selector.options]  # listed now
    assert view.timeline_figure.layout.title.text.startswith("Timeline · iteration 123 · 2")
    assert 123 in view.overlap_figure.data[0].x  # the selected iteration, exactly
    view.iteration_box.value = 0
    assert view.iteration_selector.value == 0 and view.iteration == 1000
    decodes.clear()
    view.refresh()
    assert decodes == []  # nothing new: nothing read


def spans_event(rank: int, iteration: int, spans: list[Span]) -> Event:
    batch = TimelineSpans(iteration=iteration, spans=spans)
    return Event(batch.KIND, rank, iteration, spans[-1].end, msgspec.to_builtins(batch))
