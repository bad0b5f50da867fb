"""Bucket figures through ``to_dict()`` and the widget through its Python state."""

from __future__ import annotations

import base64
import gc
import math
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import ipywidgets as widgets
import numpy as np
import plotly.graph_objects as go
import pytest
from support import make_store

from interactive_shard.buckets.events import BucketReduced, DdpIteration, DdpWatch
from interactive_shard.buckets.figures import figure_bucket_map
from interactive_shard.buckets.figures_timeline import (
    NO_FINDINGS,
    figure_bucket_timeline,
    figure_health,
)
from interactive_shard.buckets.model import BucketMap
from interactive_shard.buckets.segments import DIFF, MAX_LEGEND_MODULES
from interactive_shard.buckets.view import BucketMapView, report_figures
from interactive_shard.cluster.run import Run
from interactive_shard.telemetry.schema import Event
from interactive_shard.testing import FakeParam, FakeRun, mlp_params
from interactive_shard.ui import live
from interactive_shard.ui.colors import PALETTE

MIB = 2**20


def make_map(run: FakeRun, events: list[Event] | None = None) -> BucketMap:
    return BucketMap(
        make_store(run.events() if events is None else events, world_size=run.world_size)
    )


def array(value: Any) -> list[Any]:
    """A column of ``to_dict()``: plotly writes numeric numpy arrays as base64 "bdata"."""
    if isinstance(value, dict) and "bdata" in value:
        flat = np.frombuffer(base64.b64decode(value["bdata"]), dtype=value["dtype"])
        shape = [int(n) for n in value.get("shape", str(flat.size)).split(",")]
        return flat.reshape(shape).tolist()
    return np.asarray(value).tolist()


def bars(fig: go.Figure, axis: str) -> list[dict[str, Any]]:
    """Bar traces of one panel from ``to_dict()``, with array columns as lists."""
    out = []
    for t in fig.to_dict()["data"]:
        if t["type"] == "bar" and t["xaxis"] == axis:
            keys = ("x", "y", "base", "text", "hovertext", "customdata")
            out.append({**t, **{k: array(t[k]) for k in keys}})
    return out


def segments(fig: go.Figure, axis: str) -> dict[str, list[tuple[str, float, float, str]]]:
    """bucket label -> [(fqn, base, width, colour)] sorted by base."""
    out: dict[str, list[tuple[str, float, float, str]]] = defaultdict(list)
    for t in bars(fig, axis):
        if t["name"] == "moved parameter":
            continue
        for y, x, base, fqn in zip(t["y"], t["x"], t["base"], t["text"], strict=True):
            out[f"bucket {y}"].append((fqn, base, x, t["marker"]["color"]))
    return {k: sorted(v, key=lambda s: s[1]) for k, v in sorted(out.items(), key=_index)}


def _index(item: tuple[str, Any]) -> int:
    return int(item[0].split()[1])


@pytest.fixture
def mlp_map() -> BucketMap:
    return make_map(FakeRun(mlp_params(4, 32), bucket_cap_mb=0.006, iterations=3))


# -- bucket map figure ----------------------------------------------------------------------------
def test_one_bar_per_bucket_with_one_segment_per_parameter(mlp_map: BucketMap) -> None:
    fig = figure_bucket_map(mlp_map, 2)
    for axis, buckets in (("x", mlp_map.observed(2)), ("x2", mlp_map.planned(2))):
        segs = segments(fig, axis)
        assert list(segs) == [f"bucket {b.index}" for b in buckets]
        for b in buckets:
            row = segs[f"bucket {b.index}"]
            assert [s[0] for s in row] == b.fqns  # GradBucket.parameters() order
            ends = [s[1] + s[2] for s in row]
            assert [s[1] for s in row[1:]] == pytest.approx(ends[:-1])  # stacked
            assert ends[-1] == pytest.approx(b.nbytes / 1024)  # KiB for this size
    layout = fig.to_dict()["layout"]
    assert layout["xaxis"]["title"]["text"] == "bytes (KiB)"
    yaxis = layout["yaxis"]
    assert yaxis["range"][0] > yaxis["range"][1]  # reversed: bucket 0 on top
    assert yaxis["ticktext"] == [f"bucket {b.index}" for b in mlp_map.observed(2)]
    assert "observed = planned" in layout["title"]["text"]


def test_segments_coloured_by_owning_module_with_hover(mlp_map: BucketMap) -> None:
    fig = figure_bucket_map(mlp_map, 2)
    traces = bars(fig, "x") + bars(fig, "x2")
    colour_of = {t["name"]: t["marker"]["color"] for t in traces}
    assert colour_of["layers.0"] == PALETTE[0] and colour_of["layers.3"] == PALETTE[3]
    for t in traces:  # one module per trace, named (with its type) in every hover
        assert all(h.endswith(f"{t['name']} (Linear)") for h in t["hovertext"])
    assert {t["showlegend"] for t in bars(fig, "x2")} == {False}  # legend once
    assert "%{text}" in traces[0]["hovertemplate"]  # the fqn
    (hover, numbers) = next(
        (h, cd)
        for t in traces
        for fqn, h, cd in zip(t["text"], t["hovertext"], t["customdata"], strict=True)
        if fqn == "layers.0.weight"
    )
    assert hover == "shape [32, 32] · torch.float32<br>4,096 bytes · layers.0 (Linear)"
    assert numbers[0] == 4096  # bytes, bucket index, bucket bytes


def test_cap_drawn_as_vertical_line(mlp_map: BucketMap) -> None:
    layout = figure_bucket_map(mlp_map, 2).to_dict()["layout"]
    lines = [s for s in layout["shapes"] if s["type"] == "line"]
    assert {s["xref"] for s in lines} == {"x", "x2"}
    assert all(s["x0"] == s["x1"] == pytest.approx(int(0.006 * MIB) / 1024) for s in lines)
    assert any(a["text"] == "cap 6.14 KiB" for a in layout["annotations"])
    first = figure_bucket_map(mlp_map, 1).to_dict()["layout"]  # one bucket, no cap applies
    assert first.get("shapes", []) == []


def test_cap_far_beyond_the_buckets_is_written_not_drawn() -> None:
    bm = make_map(FakeRun(mlp_params(2, 8), iterations=2))  # default 25 MiB cap, 1 MiB first
    layout = figure_bucket_map(bm, 2).to_dict()["layout"]
    assert layout.get("shapes", []) == []
    assert any(a["text"] == "cap 1 MiB →" for a in layout["annotations"])


def test_differences_are_outlined_red_and_marked(mlp_map: BucketMap) -> None:
    fig = figure_bucket_map(mlp_map, 2, what_if={"bucket_cap_mb": 0.002})
    moved = set(mlp_map.compare(2, bucket_cap_mb=0.002).moved)
    assert moved
    for axis in ("x", "x2"):
        (outline,) = [t for t in bars(fig, axis) if t["name"] == "moved parameter"]
        assert outline["marker"]["line"]["color"] == DIFF
        assert outline["marker"]["color"] == "rgba(0,0,0,0)"  # drawn over the segment
        assert set(outline["text"]) <= moved
        plain = {f for t in bars(fig, axis) if t["name"] != "moved parameter" for f in t["text"]}
        assert set(outline["text"]) == moved & plain
    marks = [t for t in fig.to_dict()["data"] if t["type"] == "scatter"]
    assert marks and all(t["marker"]["color"] == DIFF for t in marks)
    assert [t["showlegend"] for t in marks] == [True] + [False] * (len(marks) - 1)
    title = fig.to_dict()["layout"]["title"]["text"]
    assert "differs" in title and "planned" in title
    assert any("if cap=0.002" in a["text"] for a in fig.layout.annotations)


def test_many_modules_share_one_trace_per_colour() -> None:
    params = [FakeParam(f"m{i}.w", (8,), f"m{i}") for i in range(3 * MAX_LEGEND_MODULES)]
    bm = make_map(FakeRun(params, bucket_cap_mb=0.0001, iterations=2))
    fig = figure_bucket_map(bm, 2)
    colours = [t for t in bars(fig, "x") if t["name"] != "moved parameter"]
    assert len(colours) == len(PALETTE)
    assert sum(len(s) for s in segments(fig, "x").values()) == len(params)


def test_figure_before_any_event_and_without_watch() -> None:
    empty = make_map(FakeRun(mlp_params(1, 4)), events=[])
    fig = figure_bucket_map(empty, 1)
    assert "cannot plan" in fig.layout.title.text and [t["y"] for t in bars(fig, "x")] == [[]]
    assert report_figures(empty) == []


# -- timeline and health ------------------------------------------------------------------------
def test_delayed_parameters_get_a_row_of_their_own_in_both_panels() -> None:
    delayed = ["layers.1.weight", "layers.1.bias"]
    run = FakeRun(
        mlp_params(3, 16), bucket_cap_mb=0.001, delayed=delayed, delay_hook="layers.0.weight"
    )
    bm = make_map(run)
    plan = bm.plan()
    assert plan.delayed is not None and plan.delayed.fqns == delayed
    assert plan.delayed.hook == "layers.0.weight"
    assert bm.compare(2).matches and bm.compare(1).matches
    fig = figure_bucket_map(bm, 2)
    layout = fig.to_dict()["layout"]
    below = max(len(bm.observed(2)), len(bm.planned(2)))
    for axis in ("yaxis", "yaxis2"):
        assert layout[axis]["ticktext"][-1] == "delayed"
        assert layout[axis]["tickvals"][-1] == below
    for axis in ("x", "x2"):
        rows = [t for t in bars(fig, axis) if t["y"] and t["y"] == [below] * len(t["y"])]
        assert [f for t in rows for f in t["text"]] == delayed
        assert all(t["marker"]["pattern"]["shape"] == "/" for t in rows)
        hook = "from the gradient hook on layers.0.weight"
        assert all(hook in h for t in rows for h in t["hovertext"])
        in_buckets = {f for t in bars(fig, axis) if below not in t["y"] for f in t["text"]}
        assert not in_buckets & set(delayed)
    notes = [a["text"] for a in layout["annotations"]]
    size = 4 * (16 * 16 + 16)
    assert notes.count(f"{size / 1024:.3g} KiB · all-reduced at layers.0.weight's hook") == 2
    assert any("observed</b>: " in n and "+ delayed" in n for n in notes)
    assert "observed = planned" in layout["title"]["text"]
    view = BucketMapView(bm)
    view.widget  # noqa: B018
    assert "+ 2 delayed (in no bucket, all-reduced at layers.0.weight's hook)" in (
        view.status_html.value
    )


def test_timeline_figure_shows_window_stages_and_total(mlp_map: BucketMap) -> None:
    tl = mlp_map.timeline(2)
    fig = figure_bucket_timeline(mlp_map, 2).to_dict()
    names = [t["name"] for t in fig["data"]]
    assert names[:3] == [
        "ready, waiting for earlier buckets",
        "reduction during backward (hidden)",
        "reduction after backward (exposed)",
    ]
    wait, hidden, exposed = ({k: array(t[k]) for k in ("x", "y", "base")} for t in fig["data"][:3])
    assert len(wait["y"]) == len(tl.buckets)
    for i, b in enumerate(tl.buckets):  # the three stages tile [ready, end]
        assert wait["base"][i] == pytest.approx(b.ready * 1e3)
        assert hidden["base"][i] == pytest.approx(b.start * 1e3)
        assert hidden["x"][i] == pytest.approx(b.overlap * 1e3)
        assert exposed["base"][i] + exposed["x"][i] == pytest.approx(b.end * 1e3)
    (window,) = fig["layout"]["shapes"]
    assert window["x0"] == 0 and window["x1"] == pytest.approx(tl.backward_end * 1e3)
    assert (
        f"{tl.overlap_fraction:.0%} of reduction time overlapped" in fig["layout"]["title"]["text"]
    )
    assert array(fig["data"][3]["text"]) == [f for f, _ in tl.gradients]


def twice(end_t: float | None) -> BucketMap:
    """Rank 0 of a real 2-rank run of notebook 02's layer checkpointed twice (probe payloads)."""
    bucket = {
        "iteration": 1,
        "index": 0,
        "fqns": ["layer.weight", "layer.bias", "head.weight", "head.bias"],
        "shapes": [[8, 8], [8], [1, 8], [1]],
        "dtypes": ["torch.float32"] * 4,
        "nbytes": 324,
        "ready_t": 968.403759572,
        "start_t": 968.403799096,
        "end_t": end_t,
        "is_last": True,
    }
    iteration = {
        "iteration": 1,
        "backward_start": 968.403065991,
        "backward_end": 968.408759551,
        "ready_order": ["head.bias", "head.weight", "layer.bias", "layer.weight"],
        "ready_t": [968.403065991, 968.403185716, 968.408734785, 968.408759551],
        "unready": [],
        "repeated": ["layer.weight", "layer.bias"],
        "checksums": {},
    }
    events = [
        Event(BucketReduced.KIND, 0, 1, 0.0, bucket),
        Event(DdpIteration.KIND, 0, 1, 0.0, iteration),
    ]
    return make_map(FakeRun(mlp_params(1, 4)), events=events)


def test_timeline_of_a_nested_backward_shows_its_reduction_and_the_second_arrival() -> None:
    fig = figure_bucket_timeline(twice(968.408168092), 1).to_dict()
    hidden = fig["data"][1]
    assert array(hidden["x"]) == [pytest.approx(4.369, abs=1e-3)]  # DDP reduced in the nested one
    title = fig["layout"]["title"]["text"]
    assert "100% of reduction time overlapped backward (exposed 0.00 ms of 4.37 ms)" in title
    assert "ready twice (reentrant checkpoint): layer.weight, layer.bias" in title


def test_timeline_says_when_reduction_times_are_unknown() -> None:
    # end_t null: the probe sent the bucket before its all-reduce finished (DDP never ended
    # the iteration). It used to be drawn as a 0 ms reduction, "exposed 0.00 ms of 0.00 ms".
    bm = twice(None)
    fig = figure_bucket_timeline(bm, 1).to_dict()
    title = fig["layout"]["title"]["text"]
    assert "reduction times unknown" in title and "0.00 ms of 0.00 ms" not in title
    (marker,) = [t for t in fig["data"] if t["name"] == "reduction launched, end not recorded"]
    assert array(marker["x"]) == [pytest.approx(0.733, abs=1e-3)]
    assert [array(t["x"]) for t in fig["data"][1:3]] == [[0.0], [0.0]]  # no bar drawn
    assert bm.timeline(1).unknown_end == [0] and bm.timeline(1).comm_time == 0.0


def test_health_table_rows() -> None:
    run = FakeRun(
        mlp_params(2, 8),
        unready=["layers.1.bias"],
        find_unused_parameters=True,
        diverge={3: ["layers.0.bias"]},
    )
    bm = make_map(run)
    cells = figure_health(bm).to_dict()["data"][0]["cells"]["values"]
    assert cells[1] == ["unready", "unready", "unready", "divergence"]
    assert cells[3][-1] == "layers.0.bias"
    clean = figure_health(make_map(FakeRun(mlp_params(1, 4))))
    assert clean.to_dict()["data"][0]["cells"]["values"][4] == [NO_FINDINGS]


def test_report_figures_and_html_report(mlp_map: BucketMap, tmp_path: Path) -> None:
    figures = report_figures(mlp_map)
    titles = [f.layout.title.text for f in figures]
    assert "iteration 1" in titles[0] and "iteration 3" in titles[1]
    assert "Bucket reductions" in titles[2] and "health" in titles[3]
    page = Run(mlp_map.store).to_html(tmp_path / "r.html").read_text()
    assert "DDP gradient buckets" in page and "layers.0.weight" in page


# -- widget --------------------------------------------------------------------------------------
def planned_rows(view: BucketMapView) -> int:
    return len({y for t in view.map_figure.data if t.xaxis == "x2" for y in t.y})


def test_widget_is_lazy_and_registered_live(mlp_map: BucketMap) -> None:
    view = BucketMapView(mlp_map)
    assert view._widget is None and view.iteration == 3 and view.rank == 0
    assert isinstance(view.widget, widgets.VBox) and view in live._views
    selector = view.iteration_selector
    assert (selector.value, selector.min, selector.max) == (0, 0, 3)  # 0 follows the latest
    assert view.iteration_note.value == "0 = latest (3) · 1: initial buckets · 2: rebuilt"
    assert view.rank_selector.options == (("0", 0), ("1", 1))
    assert "iteration 3" in view.map_figure.layout.title.text
    assert "no findings" in view.health_html.value


def test_cap_slider_replans_instantly_and_reset_restores(mlp_map: BucketMap) -> None:
    view = BucketMapView(mlp_map)
    view.widget  # noqa: B018
    before = planned_rows(view)
    assert view.cap_slider.value == pytest.approx(0.006, rel=0.2)
    view.cap_slider.value = 0.001
    assert view.cap_mb == 0.001 and planned_rows(view) == len(
        mlp_map.planned(3, bucket_cap_mb=0.001)
    )
    assert planned_rows(view) > before and "differs" in view.map_figure.layout.title.text
    assert "what if bucket_cap_mb=0.001" in view.status_html.value
    view.cap_slider.value = 1.0
    assert planned_rows(view) == len(mlp_map.planned(3, bucket_cap_mb=1.0))
    view.reset_button.click()
    assert view.cap_mb is None and planned_rows(view) == before
    assert "observed = planned" in view.map_figure.layout.title.text


def test_selectors_choose_iteration_and_rank(mlp_map: BucketMap) -> None:
    view = BucketMapView(mlp_map)
    view.widget  # noqa: B018
    view.iteration_selector.value = 1
    assert "iteration 1 · rank 0" in view.map_figure.layout.title.text
    assert "iteration 1 · rank 0" in view.timeline_figure.layout.title.text
    view.rank_selector.value = 1
    assert "iteration 1 · rank 1" in view.map_figure.layout.title.text


def test_refresh_follows_a_live_run_and_skips_needless_redraws() -> None:
    run = FakeRun(mlp_params(3, 16), bucket_cap_mb=0.002, iterations=3)
    events = run.events()
    bm = make_map(run, events=[e for e in events if e.kind == DdpWatch.KIND])
    view = BucketMapView(bm)
    view.widget  # noqa: B018
    assert view.iteration is None and "No bucket data" in view.map_figure.layout.title.text
    bm.store.extend([e for e in events if e.payload.get("iteration") == 1])
    view.refresh()
    assert view.iteration_selector.max == 1 and "latest (1)" in view.iteration_note.value
    bm.store.extend([e for e in events if e.payload.get("iteration", 1) > 1])
    view.refresh()
    assert view.iteration == 3 and "iteration 3" in view.map_figure.layout.title.text
    map_, timeline = view._redrawn["map"], view._redrawn["timeline"]
    drawn = (map_.draws, timeline.draws)
    view.refresh()
    assert (map_.draws, timeline.draws) == drawn  # nothing new: nothing redrawn
    view.cap_slider.value = 0.01
    # The timeline does not depend on the cap.
    assert (map_.draws, timeline.draws) == (drawn[0] + 1, drawn[1])


def test_displaying_the_map_shows_the_view(
    mlp_map: BucketMap, monkeypatch: pytest.MonkeyPatch
) -> None:
    shown: list[Any] = []
    monkeypatch.setattr("IPython.display.display", lambda obj: shown.append(obj))
    mlp_map._ipython_display_()
    (widget,) = shown
    assert isinstance(widget, widgets.VBox)
    assert Counter(type(c).__name__ for c in widget.children)["FigureWidget"] == 2


def test_state_given_before_the_widget_exists(mlp_map: BucketMap) -> None:
    view = BucketMapView(mlp_map, iteration=2, rank=1, cap_mb=0.002)
    assert (view.iteration, view.rank, view.what_if) == (2, 1, {"bucket_cap_mb": 0.002})
    view.widget  # noqa: B018
    assert view.iteration_selector.value == 2 and view.rank_selector.value == 1
    assert view.cap_slider.value == 0.002
    assert planned_rows(view) == len(mlp_map.planned(2, bucket_cap_mb=0.002))
    assert "iteration 2 · rank 1" in view.map_figure.layout.title.text
    view.iteration_selector.value = 0  # back to following the latest
    assert view.iteration == 3 and "iteration 3" in view.map_figure.layout.title.text


def test_a_displayed_view_stays_live_without_other_references(mlp_map: BucketMap) -> None:
    widget = BucketMapView(mlp_map).widget
    gc.collect()
    views = [v for v in live._views if isinstance(v, BucketMapView) and v._widget is widget]
    assert len(views) == 1  # held by its widget, so ui.live still refreshes it


def test_a_browser_snapping_the_slider_does_not_start_a_what_if(mlp_map: BucketMap) -> None:
    view = BucketMapView(mlp_map)
    view.widget  # noqa: B018
    slider = view.cap_slider
    steps = (math.log2(slider.value) - slider.min) / slider.step
    assert steps == pytest.approx(round(steps))  # the recorded cap lies on the grid
    slider.value = slider.value * 2 ** (slider.step / 3)  # what a front end's snap looks like
    assert view.cap_mb is None and "what if" not in view.status_html.value
    slider.value = 2 ** (math.log2(slider.value) - slider.step)  # one notch: the user
    assert view.cap_mb is not None and "what if" in view.status_html.value


def test_health_list_groups_a_finding_repeated_every_iteration() -> None:
    run = FakeRun(mlp_params(2, 8), iterations=4, unready=["layers.1.bias"])
    run.find_unused_parameters = True
    run.diverge = {3: ["layers.0.weight"]}
    view = BucketMapView(make_map(run))
    view.widget  # noqa: B018
    text = view.health_html.value
    assert "5 finding(s)" in text and text.count("<li>") == 2
    assert "<b>unready</b> (iterations 1-4)" in text and "<b>divergence</b> (iteration 3)" in text
