"""RunMonitor model and view, driven from Python (no kernel, no browser)."""

from __future__ import annotations

from pathlib import Path

import pytest
from support import make_store

from interactive_shard.cluster.run import Run
from interactive_shard.monitor.model import MonitorModel
from interactive_shard.monitor.view import MonitorView, figure_scalars
from interactive_shard.telemetry import Event, RunStore
from interactive_shard.telemetry.rank_state import RankState
from interactive_shard.ui.live import Throttle


def _store() -> RunStore:
    return make_store(name="train")


def _feed(store: RunStore, steps: int) -> None:
    for rank in range(2):
        store.append(Event("state", rank, 0, 0.0, {"state": "running", "detail": ""}))
        for step in range(1, steps + 1):
            store.append(Event("progress", rank, step, 0.0, {"total": 10}))
            store.append(Event("scalar", rank, step, 0.0, {"name": "loss", "value": 1 / step}))
        store.append(Event("log", rank, 0, 0.0, {"stream": "stdout", "text": f"hi {rank}"}))


def test_model_tracks_state_progress_logs_and_scalars() -> None:
    store = _store()
    _feed(store, 4)
    model = MonitorModel(store)
    assert model.update()
    assert not model.update()  # nothing new
    assert [r.state for r in model.ranks] == [RankState.RUNNING] * 2
    assert [(r.step, r.total) for r in model.ranks] == [(4, 10), (4, 10)]
    assert list(model.ranks[1].logs) == ["hi 1"]
    assert model.scalars["loss"][0].values == [1.0, 0.5, 1 / 3, 0.25]
    store.append(Event("state", 0, 0, 0.0, {"state": "failed", "detail": "ValueError: x"}))
    model.update()
    assert model.ranks[0].state is RankState.FAILED
    assert model.ranks[0].detail == "ValueError: x"


def test_figure_has_one_line_per_scalar_and_rank() -> None:
    store = _store()
    _feed(store, 3)
    model = MonitorModel(store)
    model.update()
    fig = figure_scalars(model)
    assert [t.name for t in fig.data] == ["loss · rank 0", "loss · rank 1"]
    assert list(fig.data[0].x) == [1, 2, 3]


def test_view_widget_state_follows_the_store() -> None:
    store = _store()
    run = Run(store)  # a loaded-style run: no cluster
    view = MonitorView(run)
    widget = view.widget
    assert "rank 0" in view._labels[0].value
    assert view._fig_box.layout.display == "none"  # nothing to plot yet
    _feed(store, 5)
    view.refresh()
    assert "running" in view._labels[0].value and "step 5" in view._labels[0].value
    assert (view._bars[1].value, view._bars[1].max) == (5, 10)
    assert "hi 1" in view._logs[1].value
    assert len(view._fig.data) == 2 and list(view._fig.data[0].y)[-1] == 0.2
    assert view._fig_box.layout.display == ""
    _feed(store, 6)  # same traces: updated in place
    view.refresh()
    assert len(view._fig.data) == 2 and len(view._fig.data[0].x) == 11
    assert widget.children[0] is view._title


def test_throttle_limits_rate() -> None:
    throttle = Throttle(interval=10.0)
    assert throttle.ready()
    assert not throttle.ready()
    assert throttle.ready(force=True)


def test_report_is_self_contained(tmp_path: Path) -> None:
    store = _store()
    _feed(store, 3)
    path = Run(store).to_html(tmp_path / "r.html")
    text = path.read_text()
    assert "Plotly" in text and "loss \\u00b7 rank 0" in text
    assert "<script src=" not in text  # nothing fetched from the network


def test_live_figure_thins_long_lines_but_the_report_keeps_all() -> None:
    from interactive_shard.monitor.view import LIVE_POINTS

    store = _store()
    store.extend(
        Event("scalar", 0, step, 0.0, {"name": "loss", "value": float(step)})
        for step in range(1, 10_001)
    )
    model = MonitorModel(store)
    model.update()
    live = figure_scalars(model, LIVE_POINTS).data[0]
    assert len(live.x) <= LIVE_POINTS + 1 and live.x[-1] == 10_000  # the last point stays
    assert len(figure_scalars(model).data[0].x) == 10_000


def test_a_displayed_view_stays_registered_for_live_refresh() -> None:
    import gc

    from interactive_shard.ui import live

    store = _store()
    widget = MonitorView(Run(store)).widget  # the caller keeps only the widget
    gc.collect()
    _feed(store, 2)
    live.tick(force=True)
    assert "step 2" in widget.children[1].children[0].value


def test_a_closed_view_leaves_the_live_registry() -> None:
    from interactive_shard.ui import live

    view = MonitorView(Run(_store()))
    view.widget.close()
    live.tick(force=True)
    assert view not in live._views


def test_model_skips_an_event_it_cannot_read_and_keeps_the_ones_after(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store = _store()
    store.append(Event("state", 0, 0, 0.0, {"state": "exploded"}))  # no such RankState
    store.append(Event("scalar", 0, 1, 0.0, {"name": "loss", "value": 0.5}))
    store.append(Event("scalar", 1, 1, 0.0, {"name": "loss", "value": 10**400}))  # no float
    store.append(Event("state", 1, 0, 0.0, {"state": "running"}))
    model = MonitorModel(store)
    assert model.update()
    assert model.scalars["loss"][0].values == [0.5]
    assert 1 not in model.scalars["loss"]
    assert [r.state for r in model.ranks] == [RankState.STARTING, RankState.RUNNING]
    assert model.skipped == 2
    said = [r.getMessage() for r in caplog.records if "cannot read" in r.getMessage()]
    assert sorted(m.split()[5] for m in said) == ["scalar", "state"]  # once per kind
    store.append(Event("scalar", 1, 2, 0.0, {"name": "loss", "value": "high"}))
    model.update()
    assert model.skipped == 3 and len(caplog.records) == len(said)  # counted, not said


def test_events_built_with_their_structs_are_what_the_model_reads() -> None:
    from interactive_shard.telemetry.run_events import Log, Progress, Scalar, State, payload

    store = _store()
    sent = [
        (State.KIND, 0, payload(State(state=RankState.RUNNING))),
        (Progress.KIND, 3, payload(Progress(total=9))),
        (Scalar.KIND, 3, payload(Scalar(name="loss", value=0.5))),
        (Log.KIND, 0, payload(Log(stream="stderr", text="careful"))),
    ]
    assert sent[0][2] == {"state": "running", "detail": ""}  # plain data: the enum's value
    store.extend(Event(kind, 1, step, 0.0, p) for kind, step, p in sent)
    model = MonitorModel(store)
    model.update()
    rank = model.ranks[1]
    assert (rank.state, rank.step, rank.total, list(rank.logs)) == (
        RankState.RUNNING,
        3,
        9,
        ["careful"],
    )
    assert model.scalars["loss"][1].values == [0.5] and model.skipped == 0


def test_model_counts_a_scalar_that_is_not_a_number_and_reads_an_empty_progress() -> None:
    store = _store()
    store.append(Event("scalar", 0, 2, 0.0, {"name": "loss", "value": "high"}))
    store.append(Event("progress", 1, 4, 0.0, {}))  # older recordings: total not known
    model = MonitorModel(store)
    model.update()
    assert model.scalars == {} and model.skipped == 1
    assert (model.ranks[1].step, model.ranks[1].total) == (4, None)


def test_scalars_in_bulk_keep_each_series_order_across_names_ranks_and_bad_events() -> None:
    store = _store()
    events = [
        Event("scalar", i % 2, i, 0.0, {"name": ("loss", "lr")[i % 3 == 0], "value": i})
        for i in range(1, 301)
    ]
    events[7] = Event("scalar", 5, 8, 0.0, {"value": 1.0})  # a rank outside the run
    events[9] = Event("scalar", 0, 10, 0.0, {"name": "loss", "value": True})  # not a number
    store.extend(events)
    model = MonitorModel(store)
    model.update()
    expect: dict[tuple[str, int], list[float]] = {}
    for e in events:
        if e.rank < 2 and type(e.payload["value"]) is int:
            expect.setdefault((e.payload["name"], e.rank), []).append(float(e.step))
    got = {(n, r): s.values for n, per in model.scalars.items() for r, s in per.items()}
    assert got == expect and model.skipped == 2
    assert [r.step for r in model.ranks] == [300, 299]
    assert model.scalars["loss"][0].steps == [int(v) for v in expect[("loss", 0)]]


def test_a_thinned_line_says_so_in_the_title() -> None:
    from interactive_shard.monitor.figures import LIVE_POINTS, REPORT_POINTS, report_figures

    store = _store()
    store.extend(Event("scalar", 0, i, 0.0, {"name": "loss", "value": i}) for i in range(12_000))
    model = MonitorModel(store)
    model.update()
    assert "every 6th point of 12,000 shown" in figure_scalars(model, LIVE_POINTS).layout.title.text
    (report,) = report_figures(model)
    assert len(report.data[0].x) <= REPORT_POINTS + 1 and "12,000" in report.layout.title.text
    assert figure_scalars(model).layout.title.text == "Scalars emitted by the ranks"


def _scalars(n: int, start: int = 0) -> list[Event]:
    names = ("loss", "lr")
    return [
        Event("scalar", i % 2, i, float(i), {"name": names[i // 2 % 2], "value": float(i)})
        for i in range(start, start + n)
    ]


def _series(model: MonitorModel) -> dict[tuple[str, int], tuple[list[int], list[float]]]:
    return {
        (name, rank): (s.steps, s.values)
        for name, per_rank in model.scalars.items()
        for rank, s in per_rank.items()
    }
