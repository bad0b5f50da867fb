"""Split figures through ``to_dict()``, the widget through its Python state (headless)."""

from __future__ import annotations

import html
import math
from collections import Counter
from pathlib import Path
from typing import Any

import ipywidgets as widgets
import msgspec
import plotly.graph_objects as go
import pytest
from plotly.callbacks import Points
from support import make_store

from interactive_shard.cluster.run import Run
from interactive_shard.splits.events import SplitCompile
from interactive_shard.splits.figures import (
    figure_cap_sweep,
    figure_compare,
    figure_lanes,
    figure_nothing,
    figure_versus_runtime,
    report_figures,
)
from interactive_shard.splits.figures_lanes import DIFF, MAX_HEIGHT, bands, segments
from interactive_shard.splits.model import SplitsModel
from interactive_shard.splits.view import PRE, SplitsView
from interactive_shard.telemetry.schema import Event
from interactive_shard.testing import (
    NOTHING_REASON,
    FakeRun,
    FakeSplits,
    mlp_graph,
    split_event,
    split_net_params,
)
from interactive_shard.ui import live
from interactive_shard.ui.text import literal
from interactive_shard.ui.view_base import LATEST

MIB = 2**20


def fake(layers: int = 6, **kw: Any) -> FakeSplits:
    """Six 257 KiB layers under autocast, a no_grad tail: a 1 MiB cap cuts it in two."""
    graph = mlp_graph(layers, 256, autocast="torch.bfloat16", no_grad=True)
    return FakeSplits(graph, bucket_cap_mb=1, **kw)


def model_of(events: list[Event]) -> SplitsModel:
    return SplitsModel(make_store(events))


@pytest.fixture
def splits() -> SplitsModel:
    return model_of(fake(nothing={1: NOTHING_REASON}).events())


def traces(fig: go.Figure | go.FigureWidget) -> dict[str, dict[str, Any]]:
    return {t["name"]: t for t in fig.to_dict()["data"]}


def wrong(comp: SplitCompile) -> SplitCompile:
    """The compile with partition 1's last parameter dropped."""
    parts = list(comp.partitions)
    parts[1] = msgspec.structs.replace(parts[1], fqns=parts[1].fqns[:-1])
    return msgspec.structs.replace(comp, partitions=parts)


# -- lanes ------------------------------------------------------------------------------------
def test_every_figure_is_valid_plotly(splits: SplitsModel) -> None:
    """The figures are built from dicts without plotly's validation (ten times faster):
    validating them here catches a misspelt property."""
    altered = model_of([split_event(wrong(fake().compile()), 0)])
    figs = [
        figure_lanes(splits, 0, selected=1),
        figure_compare(splits, 0),
        figure_compare(splits, 0, bucket_cap_mb=0.5),
        figure_compare(splits, 0, bucket_cap_mb=0.001),  # refused: the error panel
        figure_compare(altered, 0),
        figure_cap_sweep(splits, 0, current_mb=2.0),
        figure_versus_runtime(splits, 0),
        figure_nothing(splits, 1),
        figure_nothing(model_of([]), 0),
    ]
    for fig in figs:
        checked = go.Figure(fig.to_dict())  # raises on an unknown property or a bad value
        assert checked.to_dict()["data"] == fig.to_dict()["data"]


def test_lanes_show_every_call_of_every_partition_in_order(splits: SplitsModel) -> None:
    comp = splits.latest(0)
    assert comp is not None and len(comp.partitions) == 2
    fig = figure_lanes(splits, 0)
    data = traces(fig)
    calls, enters, exits = (
        data["calls"],
        data["enters a region (▶)"],
        data["leaves a region (◀)"],
    )
    assert len(calls["y"]) + len(enters["y"]) + len(exits["y"]) == sum(
        len(p.calls) for p in comp.partitions
    )
    rows = sorted([*calls["y"], *enters["y"], *exits["y"]])
    assert rows == list(range(len(rows)))  # one row per call: a staircase
    assert Counter(calls["customdata"]) == {
        i: sum(c.state is None for c in p.calls) for i, p in enumerate(comp.partitions)
    }
    plain = [
        t for p in comp.partitions for t in p.targets if "autocast" not in t and "grad" not in t
    ]
    shown = {"torch._C._nn.linear": "linear", "torch.relu": "relu", "float": ".float()"}
    assert [shown.get(t, t.rpartition(".")[2]) for t in plain] == list(calls["text"])
    ticks = fig.to_dict()["layout"]["xaxis"]["ticktext"]
    assert ticks == ["submod_0<br>514 KiB", "submod_1<br>1 MiB"]
    assert "2 partitions (the graph was cut" in fig.layout.title.text


def test_region_bands_and_entry_exit_marks_follow_the_partitions_calls(
    splits: SplitsModel,
) -> None:
    comp = splits.latest(0)
    assert comp is not None
    segs = segments(comp.partitions)
    for lane, p in enumerate(comp.partitions):  # one segment per region of the partition
        mine = [s for s in segs if s.lane == lane]
        assert [s.label.split()[0] for s in mine] == [r.kind for r in p.regions]
        assert [(s.entered, s.exited) for s in mine] == [(r.enters, r.exits) for r in p.regions]
    (autocast,) = [b for b in bands(comp.partitions) if b.label.startswith("autocast")]
    assert (autocast.first, autocast.last) == (0, 1)  # one region across both partitions
    layout = figure_lanes(splits, 0).to_dict()["layout"]
    regions = [s for s in layout["shapes"] if s.get("name") == "region"]
    assert len(regions) == len(segs) + 1  # each lane's segment, and the band across lanes
    across = [s for s in regions if s["x1"] - s["x0"] > 1]
    assert len(across) == 1 and across[0]["line"]["dash"] == "dot"
    data = traces(figure_lanes(splits, 0))
    assert list(data["enters a region (▶)"]["text"]) == [
        "autocast cpu bfloat16",
        "autocast cpu bfloat16",
        "grad off",
        "grad on",
    ]
    assert list(data["leaves a region (◀)"]["text"]) == ["end autocast cpu bfloat16"] * 2
    legend = [name for name in data if name.startswith("region: ")]
    assert legend == ["region: autocast cpu bfloat16", "region: grad off", "region: grad on"]


def test_hover_names_target_partition_parameters_and_bytes(splits: SplitsModel) -> None:
    hover = traces(figure_lanes(splits, 0))["calls"]["hovertext"][0]
    assert hover.startswith("<b>torch._C._nn.linear</b> (call_function)<br>node linear<br>")
    assert "<b>submod_0</b>: 4 parameter(s), 514 KiB" in hover and "layers.0.weight" in hover


def test_selected_lane_is_outlined(splits: SplitsModel) -> None:
    shapes = figure_lanes(splits, 0, selected=1).to_dict()["layout"]["shapes"]
    (outline,) = [s for s in shapes if s.get("name") == "selected"]
    assert outline["x0"] < 1 < outline["x1"]
    assert not [s for s in figure_lanes(splits, 0).layout.shapes if s.name == "selected"]


def test_a_big_graph_is_drawn_with_decimated_labels() -> None:
    big = FakeSplits(mlp_graph(150, 512, autocast="torch.float16"), bucket_cap_mb=4)
    model = model_of(big.events())
    comp = model.latest(0)
    assert comp is not None and sum(len(p.calls) for p in comp.partitions) > 300
    fig = figure_lanes(model, 0)
    calls = traces(fig)["calls"]
    labelled = [t for t in calls["text"] if t]
    assert 0 < len(labelled) < len(calls["text"]) / 3
    assert fig.layout.height == MAX_HEIGHT
    ticks = fig.to_dict()["layout"]["xaxis"]["tickvals"]
    assert len(ticks) <= 10 and ticks[0] == 0  # numbered lanes, not 39 names


def test_nothing_compiled_states_the_reason(splits: SplitsModel) -> None:
    for fig in (figure_nothing(splits, 1), figure_lanes(splits, 1), figure_compare(splits, 1)):
        layout = fig.to_dict()["layout"]
        assert fig.data == () and "Nothing compiled · rank 1" in layout["title"]["text"]
        text = layout["annotations"][0]["text"].replace("<br>", " ")
        assert html.escape("dynamo skips frames inside torch.nn") in text
    waiting = figure_nothing(model_of([]), 0)
    assert "No compile captured yet" in waiting.layout.title.text


# -- planned vs captured, what-if, runtime ----------------------------------------------------
def test_compare_figure_marks_the_differing_partition() -> None:
    comp = fake().compile()
    model = model_of([split_event(wrong(comp), 0)])
    fig = figure_compare(model, 0)
    bars = {t["name"]: t for t in fig.to_dict()["data"] if t["type"] == "bar"}
    for side in ("captured", "planned"):
        assert list(bars[side]["marker"]["line"]["color"]) == [bars[side]["marker"]["color"], DIFF]
    (marks,) = [t for t in fig.to_dict()["data"] if t["type"] == "scatter" and t["xaxis"] == "x"]
    assert list(marks["y"]) == [1]
    assert "1 difference(s) from the plan" in fig.layout.title.text
    note = fig.layout.annotations[-1].text
    assert note.startswith("compile 0, partition 1 (submod_1): parameters planned")
    clean = figure_compare(model_of(fake().events()), 0)
    assert "captured = planned" in clean.layout.title.text
    assert all(w == 0 for t in clean.data if t.type == "bar" for w in t.marker.line.width)


def test_compare_figure_replans_and_reports_a_refused_cap(splits: SplitsModel) -> None:
    fig = figure_compare(splits, 0, bucket_cap_mb=1, first_bucket_cap_mb=0.25)
    planned = next(t for t in fig.data if t.type == "bar" and t.name == "planned")
    assert len(planned.y) == len(
        splits.plan(0, bucket_cap_mb=1, first_bucket_cap_mb=0.25).partitions
    )
    assert "<b>what if</b> cap 1 MiB (first 256 KiB)" in fig.layout.title.text
    refused = figure_compare(splits, 0, bucket_cap_mb=0.5)
    assert "cannot plan: bucket_cap_mb=0.5 is below" in refused.layout.title.text
    assert [len(t.y) for t in refused.data if t.type == "bar"] == [2, 0]  # captured still shown


def test_cap_sweep_shows_more_pieces_at_smaller_caps() -> None:
    model = model_of(FakeSplits(mlp_graph(40, 512), bucket_cap_mb=25).events())  # 40 MiB
    fig = figure_cap_sweep(model, 0, current_mb=4)
    (line,) = fig.data
    assert list(line.x) == [1, 2, 4, 8, 16, 25, 32, 64, 128]
    counts = list(line.y)
    assert counts == [len(model.plan(0, bucket_cap_mb=c).partitions) for c in line.x]
    assert counts == sorted(counts, reverse=True) and counts[0] == 40
    assert counts[-1] == 2  # whatever the cap: DDPOptimizer's 1 MiB first bucket, the rest
    assert [s.x0 for s in fig.layout.shapes] == [25, 4]  # the run's cap, the what-if


def test_versus_runtime_table_lists_the_models_lines() -> None:
    ddp = FakeRun(split_net_params(6, 256), bucket_cap_mb=1, iterations=1)
    model = model_of([*fake().events(), *ddp.events()])
    (table,) = figure_versus_runtime(model, 0).data
    assert list(table.cells.values[0]) == [literal(s) for s in model.versus_runtime(0)]


def test_report_figures_and_html_report(tmp_path: Path) -> None:
    events = fake(compiles=2, nothing={1: NOTHING_REASON}).events()
    model = model_of(events)
    titles = [f.layout.title.text for f in report_figures(model)]
    assert titles[0].startswith("<b>Nothing compiled · rank 1")
    assert "Graph splits · rank 0 · compile 0" in titles[1]
    assert "Planned vs captured · rank 0 · compile 0" in titles[2]
    assert "Graph splits · rank 0 · compile 1" in titles[3]
    assert "What a cap does" in titles[5] and "runtime buckets" in titles[6]
    assert report_figures(model_of([])) == []
    page = Run(make_store(events)).to_html(tmp_path / "r.html").read_text(encoding="utf-8")
    assert "torch.compile graph splits (DDPOptimizer)" in page
    assert "submod_1" in page and "Nothing compiled" in page


# -- the widget -------------------------------------------------------------------------------
def built(model: SplitsModel, **kw: Any) -> SplitsView:
    view = SplitsView(model, **kw)
    view.widget  # noqa: B018
    return view


def planned_count(fig: go.FigureWidget) -> int:
    return sum(len(t.y) for t in fig.data if t.type == "bar" and t.name == "planned")


def test_widget_is_lazy_registered_and_shows_the_latest_compile(splits: SplitsModel) -> None:
    view = SplitsView(splits)
    assert view._widget is None and view.rank == 0 and view.index == 0
    assert isinstance(view.widget, widgets.VBox) and view in live._views
    assert view.rank_selector.options == (("0", 0), ("1", 1))
    # 0 follows the latest; the compiles count from 1 (the first: position 0, "compile 0").
    assert view.compile_selector.options == (("latest", 0), ("0 · 2 partition(s) · aot_eager", 1))
    assert [v for _, v in view.partition_selector.options] == [0, 1]
    assert "Graph splits · rank 0 · compile 0" in view.lanes_figure.layout.title.text
    assert "2 partition(s), backend <code>aot_eager</code>" in view.status_html.value
    assert "captured = planned" in view.differences_html.value
    assert "Same groups" not in view.runtime_html.value  # no bucket map in this run
    assert "no bucket observed yet" in view.runtime_html.value


def test_selecting_a_partition_shows_its_code_parameters_and_bytes(splits: SplitsModel) -> None:
    view = built(splits)
    comp = splits.latest(0)
    assert comp is not None
    first, second = comp.partitions
    assert html.escape(first.code) in view.code_html.value
    assert (
        "<b>submod_0</b> (partition 0 of 2) · 514 KiB in 4 parameter(s)"
        in view.partition_html.value
    )
    view.partition_selector.value = 1
    assert html.escape(second.code) in view.code_html.value
    assert html.escape(first.code) not in view.code_html.value
    text = view.partition_html.value
    assert all(f"<code>{f}</code>" in text for f in second.fqns)
    assert f"<b>inputs</b>: {', '.join(second.inputs)}" in text
    assert f"<b>outputs</b>: {', '.join(second.outputs)}" in text
    assert "compiled by <code>aot_eager</code>" in text and "DDPOptimizer intentional" in text
    outline = [s for s in view.lanes_figure.layout.shapes if s.name == "selected"]
    assert len(outline) == 1 and outline[0].x0 < 1 < outline[0].x1


def test_clicking_a_call_selects_its_partition(splits: SplitsModel) -> None:
    view = built(splits)
    calls = next(t for t in view.lanes_figure.data if t.name == "calls")
    last = len(calls.customdata) - 1
    points = Points(
        point_inds=[last], xs=[calls.x[last]], ys=[calls.y[last]], trace_name="calls", trace_index=0
    )
    view._on_lane_click(calls, points, None)
    assert view.partition == 1 and view.partition_selector.value == 1
    assert "<b>submod_1</b>" in view.partition_html.value
    view._on_lane_click(
        calls, Points(point_inds=[0], xs=[0], ys=[0], trace_name="calls", trace_index=0), None
    )
    assert view.partition_selector.value == 0


def test_cap_sliders_replan_instantly_and_show_the_planners_refusal(splits: SplitsModel) -> None:
    view = built(splits)
    assert view.cap_slider.value == pytest.approx(
        1.0
    ) and view.first_cap_slider.value == pytest.approx(1.0)
    assert planned_count(view.what_if_figure) == 2
    view.first_cap_slider.value = 0.125
    view.cap_slider.value = 0.25
    plan = splits.plan(0, bucket_cap_mb=0.25, first_bucket_cap_mb=0.125)
    assert (view.cap_mb, view.first_cap_mb) == (0.25, 0.125)
    assert planned_count(view.what_if_figure) == len(plan.partitions) == 6
    assert "<b>6 partition(s)</b>" in view.what_if_html.value
    assert "more pieces: more all-reduce overlaps backward" in view.what_if_html.value
    sweep_lines = [s.x0 for s in view.sweep_figure.layout.shapes]
    assert sweep_lines == [1, 0.25]
    view.first_cap_slider.value = 1.0  # now the cap (0.25 MiB) is below the first bucket's
    assert "cannot plan:" in view.what_if_html.value
    assert "First bucket should be smaller/equal" in html.unescape(view.what_if_html.value)
    assert "cannot plan" in view.what_if_figure.layout.title.text
    view.reset_button.click()
    assert (view.cap_mb, view.first_cap_mb) == (None, None)
    assert view.cap_slider.value == pytest.approx(1.0) and planned_count(view.what_if_figure) == 2
    assert "at the compile's own cap 1 MiB" in view.what_if_html.value


def test_a_browser_snapping_the_slider_does_not_start_a_what_if(splits: SplitsModel) -> None:
    view = built(splits)
    slider = view.cap_slider
    steps = (math.log2(slider.value) - slider.min) / slider.step
    assert steps == pytest.approx(round(steps))  # the recorded cap lies on the grid
    slider.value = slider.value * 2 ** (slider.step / 3)
    assert view.cap_mb is None
    slider.value = 2 ** (math.log2(slider.value) + slider.step)
    assert view.cap_mb is not None


def test_set_plan_compares_with_the_users_plan(splits: SplitsModel) -> None:
    view = built(splits)
    other = splits.plan(0, bucket_cap_mb=1, first_bucket_cap_mb=0.25)
    view.set_plan(other)
    assert view.differences() and view.differences()[0].startswith(
        "rank 0, compile 0: caps planned"
    )
    assert f"{len(view.differences())} difference(s)" in view.differences_html.value
    assert "difference(s) from the plan" in view.compare_figure.layout.title.text
    view.set_plan(None)
    assert view.differences() == [] and "captured = planned" in view.differences_html.value


def test_an_altered_capture_is_listed_in_the_view() -> None:
    view = built(model_of([split_event(wrong(fake().compile()), 0)]))
    (line,) = view.differences()
    assert "partition 1 (submod_1): parameters planned" in line
    assert html.escape(line) in view.differences_html.value


def test_a_rank_that_compiled_nothing_shows_the_reason(splits: SplitsModel) -> None:
    view = built(splits, rank=1)
    assert "nothing compiled: dynamo skips frames inside torch.nn" in view.status_html.value
    assert "Nothing compiled · rank 1" in view.lanes_figure.layout.title.text
    assert view.details.layout.display == "none" and view.code_html.value == PRE_EMPTY
    view.rank_selector.value = 0
    assert view.details.layout.display == "" and "def forward(self, l_x_" in view.code_html.value


PRE_EMPTY = PRE.format("(no generated code captured)")


def test_refresh_follows_a_live_run_and_skips_needless_redraws() -> None:
    run = fake(compiles=2)
    model = model_of([])
    view = built(model)
    assert "Waiting for" in view.status_html.value and view.details.layout.display == "none"
    model.store.append(split_event(run.compile(0), 0))
    view.refresh()
    assert [v for _, v in view.compile_selector.options] == [LATEST, 1] and view.index == 0
    assert "compile 0" in view.lanes_figure.layout.title.text
    drawn = {k: (r.draws, r.whole) for k, r in view._redrawn.items()}

    def redrawn(whole: bool = False) -> list[str]:
        now = {k: (r.draws, r.whole) for k, r in view._redrawn.items()}
        out = [k for k in now if now[k][whole] != drawn[k][whole]]
        drawn.update(now)
        return out

    view.refresh()
    assert redrawn() == []  # nothing new: no figure redrawn
    model.store.append(Event("log", 0, 0, 1.0, {"text": "not a split event"}))
    view.refresh()
    assert redrawn() == []  # the revision did not change
    model.store.append(split_event(run.compile(1), 0))
    view.refresh()
    assert view.index == 1 and redrawn(whole=True) == []  # a recompile of the same graph
    for fig in (view.lanes_figure, view.compare_figure, view.what_if_figure, view.sweep_figure):
        assert "compile 1" in fig.layout.title.text
    other = fake(layers=4).compile(2)  # another graph
    model.store.append(split_event(other, 0))
    view.refresh()
    assert view.index == 2 and redrawn() == ["lanes", "compare", "what_if", "sweep"]
    view.cap_slider.value = 2.0
    assert redrawn() == ["what_if", "sweep"]


def test_state_given_before_the_widget_exists() -> None:
    model = model_of(fake(compiles=2).events())
    view = SplitsView(model, rank=1, index=0, partition=1, cap_mb=0.5, first_cap_mb=0.25)
    assert (view.rank, view.index, view.what_if) == (
        1,
        0,
        {"bucket_cap_mb": 0.5, "first_bucket_cap_mb": 0.25},
    )
    view.widget  # noqa: B018
    assert view.compile_selector.value == 1 and view.partition_selector.value == 1
    assert view.cap_slider.value == pytest.approx(0.5)
    expected = model.plan(1, 0, bucket_cap_mb=0.5, first_bucket_cap_mb=0.25)
    assert planned_count(view.what_if_figure) == len(expected.partitions)
    view.compile_selector.value = LATEST
    assert view.index == 1 and "compile 1" in view.lanes_figure.layout.title.text
