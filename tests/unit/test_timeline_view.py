"""Timeline figures through ``to_dict()``, the widget through its Python state (headless)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import ipywidgets as widgets
import msgspec
import plotly.graph_objects as go
import pytest
from support import make_store

from interactive_shard.cluster.run import Run
from interactive_shard.telemetry.schema import Event
from interactive_shard.testing import FakeTimeline
from interactive_shard.timeline.events import KINDS, Span, TimelineSpans
from interactive_shard.timeline.figures import (
    WAITING,
    backward_order,
    figure_side_by_side,
    figure_timeline,
    report_figures,
)
from interactive_shard.timeline.figures_collectives import figure_collectives, figure_overlap
from interactive_shard.timeline.figures_lanes import KIND_COLORS, nesting
from interactive_shard.timeline.model import TimelineModel, TimelineSpan
from interactive_shard.timeline.view import ALL, TimelineView, versus
from interactive_shard.ui import live


def model_of(events: list[Event]) -> TimelineModel:
    return TimelineModel(make_store(events))


@pytest.fixture
def eager() -> TimelineModel:
    """2 ranks, 2 iterations; rank 1 starts every iteration 2 ms late (a straggler)."""
    return model_of(FakeTimeline(delay=[0.0, 0.002]).events())


@pytest.fixture
def compiled() -> TimelineModel:
    """The same run compiled, its hooks bunched after the backward: no overlap."""
    return model_of(FakeTimeline(compiled=True, bunched=True).events())


def data_of(fig: go.Figure | go.FigureWidget) -> list[dict[str, Any]]:
    """Every trace as a dict (arrays as numpy: ``to_dict()`` would base64 them)."""
    return [t.to_plotly_json() for t in fig.data]


def traces(fig: go.Figure | go.FigureWidget) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for t in data_of(fig):
        out.setdefault(t["name"], []).append(t)
    return out


def bars(fig: go.Figure | go.FigureWidget, kind: str) -> dict[str, Any]:
    (bar,) = [t for t in traces(fig)[kind] if t["type"] == "bar"]
    return bar


def spans_event(rank: int, iteration: int, spans: list[Span]) -> Event:
    batch = TimelineSpans(iteration=iteration, spans=spans)
    return Event(batch.KIND, rank, iteration, spans[-1].end, msgspec.to_builtins(batch))


def overlap_words(model: TimelineModel, rank: int, iteration: int) -> str:
    share, exposed = model.overlap(rank, iteration), model.exposed(rank, iteration)
    return f"backward overlap {share:.0%} · exposed {exposed * 1e3:.3g} ms"


# -- the timeline -----------------------------------------------------------------------------
def test_one_trace_per_kind_with_bars_at_the_span_times(eager: TimelineModel) -> None:
    fig = figure_timeline(eager, iteration=2)
    data = traces(fig)
    spans = [s for r in eager.ranks for s in eager.spans(r, 2)]
    kinds = {s.kind for s in spans}
    assert kinds == {"forward", "backward", "hook", "collective", "optimizer"}
    assert all(len(data[k]) == 1 for k in kinds)  # one trace per kind, not per span
    origin = eager.origin
    assert origin is not None
    for kind in kinds:
        bar = bars(fig, kind)
        mine = [s for s in spans if s.kind == kind]  # rank by rank, in start order
        assert list(bar["base"]) == pytest.approx([(s.start - origin) * 1e3 for s in mine])
        assert list(bar["x"]) == pytest.approx([s.duration * 1e3 for s in mine])
        assert bar["orientation"] == "h" and bar["marker"]["color"] == KIND_COLORS[kind]
    assert [t["showlegend"] for t in data_of(fig) if t["name"] in kinds] == [True] * 5


def test_lanes_per_rank_with_nested_compute_below_its_parent(eager: TimelineModel) -> None:
    fig = figure_timeline(eager, iteration=1)
    labels = list(fig.layout.yaxis.ticktext)
    assert labels == [
        f"rank {r} · {lane}"
        for r in (0, 1)
        for lane in ("compute", "compute ›1", "hooks", "collectives", "optimizer")
    ]
    forward = bars(fig, "forward")
    rows = {(labels[y], round(x, 6)) for y, x in zip(forward["y"], forward["x"], strict=True)}
    root = next(s for s in eager.spans(0, 1) if s.kind == "forward" and s.name == "")
    assert ("rank 0 · compute", round(root.duration * 1e3, 6)) in rows  # the root on top
    units = [y for y in forward["y"] if labels[y] == "rank 0 · compute ›1"]
    assert len(units) == 3  # its units one row below
    hooks = bars(fig, "hook")
    assert {labels[y] for y in hooks["y"]} == {"rank 0 · hooks", "rank 1 · hooks"}
    shallow = figure_timeline(eager, iteration=1, depth=0)
    assert "rank 0 · compute ›1" not in shallow.layout.yaxis.ticktext
    assert len(bars(shallow, "forward")["y"]) == 2  # each rank's root only
    assert fig.layout.yaxis.fixedrange and fig.layout.dragmode == "zoom"  # zoom moves time
    assert fig.layout.barmode == "overlay"


def test_nesting_puts_partial_overlaps_deeper_so_a_row_never_overlaps() -> None:
    def s(start: float, end: float) -> TimelineSpan:
        return TimelineSpan(kind="backward", name="", start=start, end=end, rank=0, iteration=1)

    spans = [s(0, 10), s(1, 4), s(4, 6), s(5, 8), s(2, 3), s(10, 11)]
    assert nesting(spans) == [0, 1, 1, 2, 2, 0]


def test_title_carries_each_ranks_overlap_and_exposed_time(eager: TimelineModel) -> None:
    one = figure_timeline(eager, iteration=2, ranks=[0]).layout.title.text
    assert one == f"Timeline · iteration 2 · rank 0 · {overlap_words(eager, 0, 2)}"
    both = figure_timeline(eager, iteration=2).layout.title.text
    assert both.startswith("Timeline · iteration 2 · 2 ranks<br><sup>")
    assert f"rank 0: {overlap_words(eager, 0, 2)}" in both
    assert f"rank 1: {overlap_words(eager, 1, 2)}" in both
    every = figure_timeline(eager, ranks=[1]).layout.title.text
    assert "iterations 1–2 · rank 1 · backward overlap" in every and "(mean of 2" in every
    assert 0 < eager.overlap(0, 2) < 1


def test_every_iteration_shows_all_spans_and_each_backward_phase(eager: TimelineModel) -> None:
    fig = figure_timeline(eager)
    total = sum(len(eager.spans(r)) for r in eager.ranks)
    drawn = sum(len(t["x"]) for t in data_of(fig) if t["name"] in KINDS)
    assert drawn == total
    (window,) = traces(fig)["backward phase"]
    assert len(window["base"]) == 4 and window["hoverinfo"] == "skip"  # 2 ranks x 2
    back = eager.phases(1, 2)["backward"]
    origin = eager.origin
    assert origin is not None
    assert any(b == pytest.approx((back[0] - origin) * 1e3) for b in window["base"])


def test_hover_names_the_span_and_a_collectives_bytes_op_dtype_group(
    eager: TimelineModel,
) -> None:
    fig = figure_timeline(eager, iteration=2, ranks=[0])
    text = bars(fig, "collective")["hovertext"][0]
    assert text.startswith("<b>reduce_scatter</b> · collective<br>rank 0 · iteration 2<br>start")
    assert "reduce_scatter · 4 KiB · torch.float32<br>group 0 (2 ranks)" in text
    assert "issued during backward" in text
    assert bars(fig, "forward")["hovertext"][0].startswith("<b>root</b> · forward")


def test_instants_are_markers_in_the_kinds_legend_group() -> None:
    spans = [
        Span(kind="forward", name="", start=1.0, end=1.002),
        Span(kind="hook", name="grad_ready:w", start=1.003, end=1.003, detail={"param": "w"}),
        Span(kind="hook", name="post_backward:0", start=1.004, end=1.005),
    ]
    fig = figure_timeline(model_of([spans_event(0, 1, spans)]))
    hooks = traces(fig)["hook"]
    marks = next(t for t in hooks if t["type"] == "scatter")
    assert list(marks["x"]) == pytest.approx([3.0]) and marks["mode"] == "markers"
    assert "(instant)" in marks["hovertext"][0] and "param=w" in marks["hovertext"][0]
    assert [t["showlegend"] for t in hooks] == [True, False]  # the bar's legend entry only


def test_a_few_thousand_spans_stay_one_trace_per_kind() -> None:
    big = model_of(FakeTimeline(units=[str(i) for i in range(120)], iterations=4).events())
    fig = figure_timeline(big)
    n = sum(len(big.spans(r)) for r in big.ranks)
    assert n > 3000
    assert len(fig.data) == 6  # the backward phase and five kinds
    assert fig.layout.height <= 1400


def test_no_spans_says_how_to_watch() -> None:
    fig = figure_timeline(model_of([]))
    assert fig.data == () and "No timeline spans yet" in fig.layout.title.text
    assert fig.layout.annotations[0].text == WAITING
    assert report_figures(model_of([])) == []


# -- side by side, overlap, collectives -------------------------------------------------------
def test_side_by_side_stacks_both_runs_on_their_own_iteration_time(
    eager: TimelineModel, compiled: TimelineModel
) -> None:
    fig = figure_side_by_side(eager, compiled, iteration=2)
    layout = fig.to_dict()["layout"]
    assert {"yaxis", "yaxis2", "xaxis", "xaxis2"} <= set(layout)
    assert layout["xaxis"]["matches"] == "x2"  # shared time axis
    titles = [a["text"] for a in layout["annotations"]]
    assert titles == [
        f"eager · iteration 2 · {overlap_words(eager, 0, 2)}",
        f"compiled · iteration 2 · {overlap_words(compiled, 0, 2)}",
    ]
    assert compiled.overlap(0, 2) == 0 and eager.overlap(0, 2) > 0
    top, low = bars(fig, "forward"), bars(fig, "compiled_forward")
    assert (top["yaxis"], low["yaxis"]) == ("y", "y2")
    assert min(top["base"]) == pytest.approx(0) and min(low["base"]) == pytest.approx(0)
    legend = [t["name"] for t in data_of(fig) if t["showlegend"]]
    assert sorted(legend) == sorted(set(legend))  # every kind once in the legend
    hooks = [t for t in data_of(fig) if t["name"] == "hook"]
    assert [t["yaxis"] for t in hooks] == ["y", "y2"]
    latest = figure_side_by_side(eager, compiled, labels=("a", "b"))
    assert "a vs b · rank 0" in latest.layout.title.text


def test_overlap_figure_has_every_iteration_of_every_rank(
    eager: TimelineModel, compiled: TimelineModel
) -> None:
    fig = figure_overlap(eager)
    data = traces(fig)
    assert list(data) == ["rank 0", "rank 1"]
    for r in (0, 1):
        (bar,) = data[f"rank {r}"]
        assert list(bar["x"]) == [1, 2]
        assert list(bar["y"]) == pytest.approx([100 * eager.overlap(r, it) for it in (1, 2)])
        assert f"exposed {eager.exposed(r, 1) * 1e3:.3g} ms" in bar["hovertext"][0]
    assert all(y == 0 for t in figure_overlap(compiled).data for y in t.y)


def test_collectives_mark_the_straggler_and_the_wait(eager: TimelineModel) -> None:
    fig = figure_collectives(eager, 2)
    data = traces(fig)
    matched = eager.collectives(2)
    assert len(matched) == 3 and all(m.straggler == 1 for m in matched)
    (late,) = data["rank 1"]
    assert list(late["y"]) == pytest.approx([2.0] * 3)  # 2 ms after rank 0 issued it
    assert list(data["rank 0"][0]["y"]) == pytest.approx([0.0] * 3)
    (ring,) = data["straggler (the others waited)"]
    assert list(ring["y"]) == pytest.approx([2.0] * 3)
    assert "waited 2 ms for the last" in data["rank 0"][0]["hovertext"][0]
    assert "longest wait 2 ms" in fig.layout.title.text
    tie = figure_collectives(model_of(FakeTimeline().events()), 1)
    assert "straggler (the others waited)" not in traces(tie)  # nobody waited


def test_backward_order_is_the_models_order_with_kinds(eager: TimelineModel) -> None:
    spans = backward_order(eager, 0, 2)
    assert [s.name for s in spans] == eager.order(0, 2, "backward")
    assert [s.name for s in spans if s.kind == "hook"] == eager.order(0, 2, "backward", ["hook"])
    assert [s.start for s in spans] == sorted(s.start for s in spans)


def test_report_figures_and_html_report(eager: TimelineModel, tmp_path: Path) -> None:
    titles = [f.layout.title.text for f in report_figures(eager)]
    assert titles[0].startswith("Timeline · iteration 2 · 2 ranks")
    assert titles[1].startswith("Backward overlap per iteration")
    assert titles[2].startswith("Collectives · iteration 2")
    one = model_of(FakeTimeline(world_size=1).events())
    assert len(report_figures(one)) == 2  # no collectives across ranks
    page = Run(make_store(FakeTimeline().events())).to_html(tmp_path / "r.html")
    assert "Backward overlap per iteration" in page.read_text(encoding="utf-8")


# -- the widget -------------------------------------------------------------------------------
def built(view: TimelineView) -> TimelineView:
    view.widget  # noqa: B018
    return view


def test_widget_is_lazy_registered_and_shows_the_latest_iteration(eager: TimelineModel) -> None:
    view = TimelineView(eager)
    assert view._widget is None and view.iteration == 2 and view.ranks == [0, 1]
    assert isinstance(view.widget, widgets.VBox) and view in live._views
    assert view.rank_selector.options == (("all", -1), ("rank 0", 0), ("rank 1", 1))
    assert [v for _, v in view.iteration_selector.options] == [0, -1, 1, 2]
    assert view.timeline_figure.layout.title.text.startswith("Timeline · iteration 2 · 2 ranks")
    assert view.run_toggle.layout.display == "none"  # one run: no toggle
    assert "<b>fsdp2</b> · 2 rank(s) · 2 iteration(s)" in view.status_html.value
    assert "run.timeline.to_chrome_trace(" in view.export_html.value
    assert "Collectives · iteration 2" in view.collectives_figure.layout.title.text
    assert view.overlap_figure.layout.title.text.startswith("Backward overlap")


def test_order_panel_lists_the_backward_in_start_order_with_kinds(eager: TimelineModel) -> None:
    view = built(TimelineView(eager))
    text = view.order_html.value
    names = eager.order(0, 2, "backward")
    assert f"rank 0, iteration 2: {len(names)} span(s) in start order" in text
    shown = [chunk.split("</code>")[0] for chunk in text.split("<code>")[1:]]
    assert shown == [n or "root" for n in names]
    assert f"background:{KIND_COLORS['hook']}" in text and ">hook</span>" in text


def test_controls_choose_ranks_iteration_and_depth(eager: TimelineModel) -> None:
    view = built(TimelineView(eager))
    view.rank_selector.value = (1,)
    assert view.ranks == [1] and view.chosen_ranks == (1,)
    assert "rank 1 · backward overlap" in view.timeline_figure.layout.title.text
    assert "rank 1, iteration 2" in view.order_html.value
    view.iteration_selector.value = 1
    assert "iteration 1 · rank 1" in view.timeline_figure.layout.title.text
    view.iteration_selector.value = ALL
    assert view.iteration is None and view.single == 2
    assert "iterations 1–2" in view.timeline_figure.layout.title.text
    view.depth_selector.value = 0
    assert view.depth == 0 and "›1" not in "".join(view.timeline_figure.layout.yaxis.ticktext)
    view.rank_selector.value = (-1,)
    assert view.chosen_ranks is None and view.ranks == [0, 1]


def test_state_given_before_the_widget_exists(eager: TimelineModel) -> None:
    view = TimelineView(eager, ranks=[1], iteration=1, depth=0)
    assert (view.ranks, view.iteration, view.depth) == ([1], 1, 0)
    view.widget  # noqa: B018
    assert view.rank_selector.value == (1,) and view.iteration_selector.value == 1
    assert view.depth_selector.value == 0
    assert view.timeline_figure.layout.title.text.startswith("Timeline · iteration 1 · rank 1")
    with pytest.raises(ValueError, match="showing='both'"):
        TimelineView(eager, showing="both")


def test_versus_toggles_between_each_run_and_side_by_side(
    eager: TimelineModel, compiled: TimelineModel
) -> None:
    view = built(versus(eager, compiled))
    assert view.showing == "both" and view.run_toggle.layout.display == ""
    assert [v for _, v in view.run_toggle.options] == ["a", "b", "both"]
    assert [label for label, _ in view.run_toggle.options] == ["eager", "compiled", "side by side"]
    fig = view.timeline_figure
    assert fig.layout.title.text == "eager vs compiled · rank 0"
    assert [a.text.split(" · ")[0] for a in fig.layout.annotations] == ["eager", "compiled"]
    assert "<b>eager</b>" in view.order_html.value and "<b>compiled</b>" in view.order_html.value
    assert "none overlapped it" in view.status_html.value  # the compiled run's finding
    view.run_toggle.value = "b"
    assert view.current is compiled
    assert fig.layout.title.text.startswith("Timeline · compiled · iteration 2")
    assert any(t.name == "compiled_backward" for t in fig.data)
    view.run_toggle.value = "a"
    assert fig.layout.title.text.startswith("Timeline · eager · iteration 2")
    assert not any(t.name == "compiled_backward" for t in fig.data)


def test_empty_state_then_a_live_run_redraws_only_on_new_data() -> None:
    fake = FakeTimeline()
    model = model_of([])
    view = built(TimelineView(model))
    assert "ish.watch(model, timeline=True)" in view.status_html.value
    assert "No timeline spans yet" in view.timeline_figure.layout.title.text
    assert view.details.layout.display == "none"
    events = fake.events()
    model.store.extend([e for e in events if e.step <= 1])
    view.refresh()
    assert view.details.layout.display == "" and view.iteration == 1
    assert "iteration 1 · 2 ranks" in view.timeline_figure.layout.title.text
    drawn = {k: r.draws for k, r in view._redrawn.items()}

    def redrawn() -> list[str]:
        now = {k: r.draws for k, r in view._redrawn.items()}
        out = [k for k in now if now[k] != drawn[k]]
        drawn.update(now)
        return out

    view.refresh()
    assert redrawn() == []  # nothing new: no figure rebuilt
    model.store.append(Event("log", 0, 0, 1.0, {"text": "not a timeline event"}))
    view.refresh()
    assert redrawn() == []  # the revision did not change
    model.store.extend([e for e in events if e.step == 2])
    view.refresh()
    assert view.iteration == 2 and [v for _, v in view.iteration_selector.options][-1] == 2
    assert redrawn() == ["timeline", "overlap", "collectives"]
    assert "iteration 2 · 2 ranks" in view.timeline_figure.layout.title.text  # patched
    view.depth_selector.value = 0
    assert redrawn() == ["timeline"]  # a control redraws only what it changes


def test_the_unvalidated_figures_validate_and_a_view_patches_what_changed() -> None:
    # The figures are built from plain dicts (ui.plain_figure): plotly must accept them.
    model = model_of(FakeTimeline(iterations=3).events())
    empty = model_of([])
    for fig in (
        figure_timeline(model),
        figure_timeline(model, iteration=2, ranks=[1], depth=0),
        figure_overlap(model, 2),
        figure_collectives(model, 2),
        figure_timeline(empty),
        figure_overlap(empty),
        figure_collectives(empty),
    ):
        assert go.Figure(fig.to_dict()).to_dict()["layout"]["title"]["text"]
    view = built(TimelineView(model))
    whole = {k: r.whole for k, r in view._redrawn.items()}
    view.iteration_selector.value = 2  # the same traces, other values: patched
    assert {k: r.whole for k, r in view._redrawn.items()} == whole
    assert "iteration 2" in view.timeline_figure.layout.title.text
    assert "iteration 2" in view.collectives_figure.layout.title.text
    drawn = figure_timeline(model, iteration=2)
    assert [list(t.x) for t in view.timeline_figure.data] == [list(t.x) for t in drawn.data]
