"""The bucket view on long runs: a selector for 10,000 iterations, redraws in place, a
burst's health checked between ticks, the 7B layout's map."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from support import make_store

from interactive_shard.buckets import _health
from interactive_shard.buckets import view as view_module
from interactive_shard.buckets.figures import figure_bucket_map
from interactive_shard.buckets.figures_timeline import figure_bucket_timeline, figure_health
from interactive_shard.buckets.model import BucketMap
from interactive_shard.buckets.view import BucketMapView
from interactive_shard.example_models import llama_7b
from interactive_shard.telemetry.schema import Event
from interactive_shard.testing import FakeRun, mlp_params, module_params


def shown(figure: Any) -> list[tuple[Any, ...]]:
    """What a figure draws, trace by trace, whether a FigureWidget or a go.Figure."""
    out = []
    for t in figure.data:
        columns = (np.asarray(t[k] if t[k] is not None else []).tolist() for k in ("x", "y"))
        out.append((t.type, t.name, t.showlegend, *columns))
    return out


def test_the_selector_reaches_any_of_ten_thousand_iterations() -> None:
    bm = BucketMap(make_store(FakeRun(mlp_params(1, 4), iterations=10_000).events()))
    view = BucketMapView(bm)
    view.widget  # noqa: B018
    selector = view.iteration_selector
    assert (selector.value, selector.min, selector.max) == (0, 0, 10_000)
    assert view.iteration_note.value.startswith("0 = latest (10,000)")
    assert "iteration 10000 · rank 0" in view.map_figure.layout.title.text
    selector.value = 4321
    assert view.iteration == 4321
    assert "iteration 4321 · rank 0" in view.map_figure.layout.title.text
    assert "iteration 4321 · rank 0" in view.timeline_figure.layout.title.text
    selector.value = 0
    assert view.iteration == 10_000 and "iteration 10000" in view.map_figure.layout.title.text


def test_following_the_latest_redraws_in_place_what_a_new_figure_shows() -> None:
    events = FakeRun(mlp_params(3, 16), bucket_cap_mb=0.002, iterations=8).events()
    store = make_store([e for e in events if e.payload.get("iteration", 0) <= 4])
    bm = BucketMap(store)
    view = BucketMapView(bm)
    view.widget  # noqa: B018
    map_, timeline = view._redrawn["map"], view._redrawn["timeline"]
    whole = (map_.whole, timeline.whole)
    for last in (5, 6, 8):
        store.extend([e for e in events if e.payload.get("iteration", 0) in range(last - 1, last)])
        store.extend([e for e in events if e.payload.get("iteration", 0) in range(last, last + 1)])
        view.refresh()
        assert view.iteration == last
        assert shown(view.map_figure) == shown(figure_bucket_map(bm, last))
        assert shown(view.timeline_figure) == shown(figure_bucket_timeline(bm, last))
        title = figure_bucket_map(bm, last).layout.title.text
        assert view.map_figure.layout.title.text == title
    assert (map_.whole, timeline.whole) == whole  # every redraw in place


def test_a_burst_shows_how_far_health_got_and_a_poller_finishes_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pollers: list[Callable[[], bool]] = []
    monkeypatch.setattr(view_module.live, "keep_polling", pollers.append)
    monkeypatch.setattr(view_module, "HEALTH_BUDGET_S", 0.0)
    monkeypatch.setattr(_health, "CHUNK", 64)
    run = FakeRun(mlp_params(2, 8), iterations=400, diverge={390: ["layers.1.weight"]})
    events = run.events()
    store = make_store(events[:10])
    view = BucketMapView(BucketMap(store))
    view.widget  # noqa: B018
    store.extend(events[10:])
    view.refresh()
    done, total = view.model.health_checked
    assert total == 800 and done < 100  # one step of 64 records (4 read at the build)
    text = f"no findings (looked at {done} of 800 iteration records so far…)"
    assert text in view.health_html.value
    (poll,) = pollers
    while not poll():
        view.refresh()  # what ui.live's tick does after each ask
    view.refresh()
    assert view.model.health_checked == (800, 800) and "looked at" not in view.health_html.value
    assert "<b>divergence</b> (iteration 390)" in view.health_html.value
    view.refresh()
    assert len(pollers) == 1  # nothing left: no other poller


def test_the_health_table_groups_a_finding_repeated_over_many_iterations() -> None:
    run = FakeRun(
        mlp_params(2, 8), iterations=60, unready=["layers.1.bias"], find_unused_parameters=True
    )
    fig = figure_health(BucketMap(make_store(run.events())))
    cells = fig.to_dict()["data"][0]["cells"]["values"]
    assert cells[0] == ["1-60"] and cells[1] == ["unready"] and cells[3] == ["layers.1.bias"]
    assert "60 findings, one row per finding repeated over iterations" in fig.layout.title.text


def seven_billion_run(bytes_per_s: float) -> FakeRun:
    params = module_params(llama_7b())
    return FakeRun(params, iterations=2, bytes_per_s=bytes_per_s)


def test_the_map_of_a_seven_billion_layout() -> None:
    # 25 GiB of gradients at 1 TB/s: each iteration's reductions end before the next.
    bm = BucketMap(make_store(seven_billion_run(1e12).events()))
    assert bm.compare(2).matches and len(bm.observed(2)) > 100
    fig = figure_bucket_map(bm, 2)
    for axis in ("x", "x2"):
        bars = [t for t in fig.data if t.type == "bar" and t.xaxis == axis]
        segments = [f for t in bars if t.name != "moved parameter" for f in t.text]
        assert len(segments) == 291 and len(set(segments)) == 291
        assert len(bars) <= 9  # 291 modules: a trace per colour, plus the outline
    assert fig.layout.height <= 1400 and "observed = planned" in fig.layout.title.text


def test_buckets_out_of_iteration_order_are_all_found_once_indexed() -> None:
    # At 1 GB/s iteration 1's reductions outlast iteration 2's start: sorted by time,
    # a rank's bucket events go 1, 2, 1, ... (the probe never sends them so).
    bm = BucketMap(make_store(seven_billion_run(1e9).events()))
    assert bm.iterations == [1, 2] and not bm._buckets.ordered
    assert bm.compare(2).matches and bm.compare(1, rank=1).matches


def test_a_view_built_before_any_event_follows_a_burst(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(view_module.live, "keep_polling", lambda poll: None)
    events: list[Event] = FakeRun(mlp_params(2, 8), iterations=300).events()
    store = make_store([])
    view = BucketMapView(BucketMap(store))
    view.widget  # noqa: B018
    assert view.iteration is None and view.iteration_note.value == "0 = latest · no iteration yet"
    store.extend(events)
    view.refresh()
    assert view.iteration == 300 and view.iteration_selector.max == 300
    assert "iteration 300 · rank 0" in view.map_figure.layout.title.text
