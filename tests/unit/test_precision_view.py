"""Precision figures through ``to_dict()``, the widget through its Python state (headless)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import ipywidgets as widgets
import msgspec
import plotly.graph_objects as go
import pytest
from plotly.callbacks import Points
from support import make_store

import interactive_shard as ish
from interactive_shard import features, report
from interactive_shard.cluster.run import Run
from interactive_shard.precision.events import PHASES
from interactive_shard.precision.figures import (
    DIFF,
    DTYPE_COLORS,
    dtype_class,
    figure_grid,
    report_figures,
)
from interactive_shard.precision.figures_bytes import (
    PATTERNS,
    figure_bytes,
    figure_collectives,
    figure_findings,
    fix_text,
)
from interactive_shard.precision.model import PrecisionModel
from interactive_shard.precision.view import PrecisionView
from interactive_shard.telemetry.schema import Event
from interactive_shard.testing import FakePrecision, fsdp2_policy, mp_net, precision_batch
from interactive_shard.ui import live

F32, BF16, F16 = "torch.float32", "torch.bfloat16", "torch.float16"
FAILING = {"": fsdp2_policy(), "1": fsdp2_policy("bf16"), "2": fsdp2_policy("fp16")}
FIXED = {**FAILING, "2": fsdp2_policy("fp16", output="fp32")}
ROOT, ONE, TWO = (
    "root · Sequential",
    "\u00a0\u00a0\u00a0└ 1 · Inner",
    "\u00a0\u00a0\u00a0└ 2 · Inner",
)
FEATURE = features.Feature(
    name="precision",
    title="Mixed precision per unit (FSDP2, FSDP1, DDP)",
    model="interactive_shard.precision.model:PrecisionModel",
    view="interactive_shard.precision.view:PrecisionView",
    figures="interactive_shard.precision.figures:report_figures",
    events="interactive_shard.precision.events:EVENTS",
)


@pytest.fixture
def registered(monkeypatch: pytest.MonkeyPatch) -> None:
    """The precision feature in the feature list (its probe's session registers it)."""
    if any(f.name == "precision" for f in features.FEATURES):
        return
    listed = (*features.FEATURES, FEATURE)
    monkeypatch.setattr(features, "FEATURES", listed)
    monkeypatch.setattr(report, "FEATURES", listed)


def events_of(policies: dict[str, Any], **kw: Any) -> list[Event]:
    return FakePrecision(mp_net(policies), **kw).events()


def model_of(policies: dict[str, Any], **kw: Any) -> PrecisionModel:
    return PrecisionModel(make_store(events_of(policies, **kw)))


class _Unit:
    def __init__(self, fqn: str, dtypes: dict[str, str]) -> None:
        self.fqn, self.dtypes = fqn, dtypes


class _Failure:
    def __init__(self, unit: str, consumer: str) -> None:
        self.unit, self.consumer, self.message = unit, consumer, "predicted: Half and Float"
        self.fix = {"2": "MixedPrecisionPolicy(output_dtype=torch.float32)"}
        self.fix_note = "give unit '2' output_dtype=torch.float32"


class _Plan:
    def __init__(self, units: list[_Unit], failures: list[_Failure] | None = None) -> None:
        self.units, self.failures = units, failures or []


def plan_of(m: PrecisionModel, iteration: int, **changes: dict[str, str]) -> _Plan:
    """The observation as a plan, with ``changes`` (fqn or "root" -> phases) made to it."""
    units = []
    for u in m.units():
        dtypes = m.observed(u.fqn, iteration=iteration)
        units.append(_Unit(u.fqn, {**dtypes, **changes.get(u.fqn or "root", {})}))
    return _Plan(units)


def traces(fig: go.Figure | go.FigureWidget) -> dict[str, dict[str, Any]]:
    return {t["name"]: t for t in fig.to_dict()["data"]}


def row(heatmap: dict[str, Any], label: str, field: str = "text") -> dict[str, Any]:
    return dict(zip(PHASES, heatmap[field][heatmap["y"].index(label)], strict=True))


# -- the grid ---------------------------------------------------------------------------------
@pytest.mark.parametrize("policies", [FAILING, FIXED])
def test_every_figure_is_valid_plotly(policies: dict[str, Any]) -> None:
    """The figures are built from dicts without plotly's validation (ten times faster):
    validating them here catches a misspelt property."""
    m = model_of(policies)
    predicted = _Plan(plan_of(m, 1).units, [_Failure("", "3")])
    figs = [
        figure_grid(m, iteration=1),
        figure_grid(m, iteration=1, plan=predicted, selected="1"),
        figure_bytes(m, iteration=1),
        figure_collectives(m, iteration=1),
        figure_findings(m, plan=predicted),
        figure_grid(PrecisionModel(make_store())),
    ]
    for fig in figs:
        checked = go.Figure(fig.to_dict())  # raises on an unknown property or a bad value
        assert checked.to_dict()["data"] == fig.to_dict()["data"]


def test_grid_cells_show_the_dtypes_seen_and_the_casts() -> None:
    m = model_of(FIXED)
    fig = figure_grid(m, iteration=2)
    data = traces(fig)
    grid = data["observed"]
    assert grid["y"] == [ROOT, ONE, TWO] and grid["x"] == list(PHASES)
    assert row(grid, ROOT) == dict.fromkeys(PHASES, "fp32")
    one = row(grid, ONE)
    assert one["input"] == "fp32→bf16"  # unit 1 cast its fp32 input
    assert (one["param"], one["grad"], one["reduce"], one["sharded_grad"]) == (
        "bf16",
        "bf16",
        "bf16",
        "fp32",
    )
    two = row(grid, TWO)
    assert two["input"] == "bf16→fp16" and two["output"] == "fp16→fp32"  # output_dtype
    # Colour by dtype: the z index of a cell picks its class's colour.
    classes = list(DTYPE_COLORS)
    assert classes[row(grid, ONE, "z")["param"]] == "bf16"
    assert classes[row(grid, TWO, "z")["param"]] == "fp16"
    assert classes[row(grid, ROOT, "z")["param"]] == "fp32"
    # One legend: fp32, bf16 and fp16 always, in their colours.
    for key in ("fp32", "bf16", "fp16"):
        assert data[key]["marker"]["color"] == DTYPE_COLORS[key]
    assert "failure (✖ at its unit)" not in data and "difference" not in fig.layout.title.text
    hover = row(grid, ONE, "hovertext")["input"]
    assert (
        "input 0: fp32 → bf16 (cast)" in hover and "MixedPrecisionPolicy(param_dtype=bf16" in hover
    )


def test_an_absent_phase_is_an_empty_cell_and_several_dtypes_are_grey() -> None:
    m = model_of(FAILING)
    grid = traces(figure_grid(m))["observed"]
    assert row(grid, ONE, "z")["grad"] is None and row(grid, ONE)["grad"] == ""
    assert dtype_class(f"{BF16}, {F32}") == "several" and dtype_class("torch.int64") == "other"
    assert dtype_class(None) is None


def test_grid_with_a_plan_outlines_every_mismatch_on_both_sides() -> None:
    m = model_of(FIXED)
    plan = plan_of(m, 2, **{"1": {"param": F32}})
    fig = figure_grid(m, iteration=2, plan=plan)
    data = traces(fig)
    assert set(data) >= {"planned", "observed", "planned ≠ observed"}
    assert row(data["planned"], ONE)["param"] == "fp32"
    assert row(data["observed"], ONE)["param"] == "bf16"
    marks = [t for t in fig.to_dict()["data"] if t["name"] == "planned ≠ observed"]
    assert len(marks) == 2 and {t["xaxis"] for t in marks} == {"x", "x2"}
    for t in marks:
        assert t["x"] == ["param"] and t["y"] == [ONE] and t["marker"]["color"] == DIFF
    assert "1 difference(s)" in fig.layout.title.text
    assert [a.text for a in fig.layout.annotations] == ["planned", "observed"]
    same = figure_grid(m, iteration=2, plan=plan_of(m, 2))
    assert traces(same)["planned ≠ observed"]["x"] == []


def test_a_failure_is_marked_at_its_unit() -> None:
    m = model_of(FAILING)
    fig = figure_grid(m)
    failure = traces(fig)["failure (✖ at its unit)"]
    assert failure["x"] == ["failure"] and failure["y"] == [ROOT]
    assert failure["text"] == ["in 3"] and "got Half and Float" in failure["hovertext"][0]
    assert fig.layout.xaxis.categoryarray[-1] == "failure" and "failed" in fig.layout.title.text


def test_the_selected_unit_is_outlined() -> None:
    fig = figure_grid(model_of(FIXED), selected="1")
    [shape] = fig.layout.shapes
    assert (shape.y0, shape.y1) == (0.5, 1.5) and shape.xref == "x domain"


def test_no_data_yet() -> None:
    empty = PrecisionModel(make_store())
    assert "No mixed-precision data yet" in figure_grid(empty).layout.title.text
    assert "No parameters" in figure_bytes(empty).layout.title.text
    assert "No collectives" in figure_collectives(empty).layout.title.text
    assert "No findings" in figure_findings(empty).layout.title.text
    assert report_figures(empty) == []


# -- bytes, collectives, findings -------------------------------------------------------------
def test_bytes_are_stacked_per_unit_and_total_by_category_and_dtype() -> None:
    m = model_of(FIXED)
    fig = figure_bytes(m, iteration=2)
    bars = [t for t in fig.to_dict()["data"] if t["type"] == "bar"]
    per_unit = [t for t in bars if t["xaxis"] == "x"]
    total = [t for t in bars if t["xaxis"] == "x2"]
    names = [t["name"] for t in per_unit]
    assert names[0] == "sharded parameters · fp32"
    assert "unsharded parameters (compute) · bf16" in names
    assert "unsharded parameters (compute) · fp16" in names
    bf16 = next(t for t in per_unit if t["name"].endswith("(compute) · bf16"))
    assert bf16["x"] == [ONE] and bf16["y"] == [272 * 2]
    assert bf16["marker"]["color"] == DTYPE_COLORS["bf16"]
    assert bf16["marker"]["pattern"]["shape"] == PATTERNS["param"]
    assert sum(t["y"][0] for t in total) == sum(m.total_bytes(iteration=2).values())
    assert fig.layout.barmode == "stack" and "sharded over 2 ranks" in fig.layout.title.text


def test_collectives_per_unit_op_and_dtype() -> None:
    m = model_of(FIXED)
    fig = figure_collectives(m, iteration=1)
    data = traces(fig)
    assert set(data) == {"fp32", "bf16", "fp16"}
    fp16 = data["fp16"]
    assert fp16["x"] == [[TWO, TWO, TWO], ["AG fwd", "AG bwd", "RS"]]
    assert fp16["y"] == [272, 272, 544]
    assert data["fp32"]["x"] == [[ROOT, ROOT], ["AG fwd", "RS"]]  # the root is not re-gathered


def test_findings_table_lists_failures_findings_and_predicted_failures() -> None:
    m = model_of(FAILING)
    plan = _Plan([], [_Failure("", "3")])
    table = figure_findings(m, plan=plan).to_dict()["data"][0]
    level, kind, unit, where, what, fix = table["cells"]["values"]
    assert level == ["error", "note", "planned"] and kind[0] == "failure"
    assert unit == ["root", "2", "root"] and where[0] == "0, 1 / 1"
    assert "got Half and Float" in what[0] and "output_dtype=torch.float32" in fix[0]
    assert fix[2].startswith("give unit '2' output_dtype") and "root" not in fix[2]
    assert table["cells"]["font"]["color"][0][0] == DIFF
    assert fix_text({"": "P()"}) == "root: 'P()'" and fix_text(None) == ""


def test_report_figures_and_the_html_report(tmp_path: Path, registered: None) -> None:
    m = model_of(FAILING)
    titles = [f.layout.title.text for f in report_figures(m)]
    assert titles[0].startswith("Dtypes per unit and phase · rank 0, iteration 1")
    assert titles[1].startswith("Bytes held") and titles[2].startswith("Collectives")
    assert titles[3].startswith("Findings and failures")
    run = Run(make_store(events_of(FAILING)))
    run.precision.plan = plan_of(m, 1, root={"param": BF16})
    page = run.to_html(tmp_path / "r.html").read_text(encoding="utf-8")
    assert "Mixed precision per unit" in page and "Dtypes per unit and phase" in page
    assert "1 difference(s)" in page and "got Half and Float" in page
    grid = report_figures(run.precision)[0]
    assert traces(grid)["planned ≠ observed"]["y"] == [ROOT]


def test_a_recording_replays_the_same_view(tmp_path: Path, registered: None) -> None:
    run = Run(make_store(events_of(FIXED)))
    loaded = ish.load(run.save(tmp_path / "run.jsonl"))
    a, b = run.precision, loaded.precision
    assert b.iterations == a.iterations == [1, 2] and b.skipped == 0
    for u in a.units():
        assert b.observed(u.fqn, iteration=2) == a.observed(u.fqn, iteration=2)
        assert b.cast_inputs(u.fqn) == a.cast_inputs(u.fqn)
    assert b.findings == a.findings
    assert figure_grid(b, iteration=2).to_dict() == figure_grid(a, iteration=2).to_dict()


# -- the widget -------------------------------------------------------------------------------
def built(model: PrecisionModel, **kw: Any) -> PrecisionView:
    view = PrecisionView(model, **kw)
    view.widget  # noqa: B018
    return view


def test_widget_is_lazy_registered_and_shows_the_failed_unit() -> None:
    view = PrecisionView(model_of(FAILING))
    assert view._widget is None and view.rank == 0 and view.iteration == 1
    assert view.unit == ""  # the unit that failed
    assert isinstance(view.widget, widgets.VBox) and view in live._views
    assert view.rank_selector.options == (("0", 0), ("1", 1))
    assert (view.iteration_selector.value, view.iteration_selector.max) == (0, 1)  # 0: latest
    assert "0 = latest (1)" in view.iteration_html.value
    assert "failed: 1" in view.iteration_html.value
    assert [v for _, v in view.unit_selector.options] == ["", "1", "2"]
    assert "<b>fsdp2</b> · 3 unit(s)" in view.status_html.value
    assert "2 failure(s)" in view.status_html.value
    assert "failed</b> in iteration 1, in <code>3</code>" in view.unit_html.value
    assert "failure" in view.findings_html.value and "output_dtype=torch.float32" in (
        view.findings_html.value
    )
    assert "No plan" in view.differences_html.value
    assert "failure (✖ at its unit)" in traces(view.grid_figure)


def test_selecting_a_unit_shows_its_policy_dtypes_inputs_and_collectives() -> None:
    view = built(model_of(FIXED))
    view.unit_selector.value = "2"
    text = view.unit_html.value
    assert view.unit == "2" and "<b>2</b> (Inner)" in text
    assert "MixedPrecisionPolicy(param_dtype=fp16, output_dtype=fp32" in text
    assert "272 elements stored in fp32" in text
    assert "input 0:" in text and "<b>cast</b>" in text
    assert "<td>reduce_scatter</td><td>backward</td>" in text and "544 B" in text
    assert view.grid_figure.layout.shapes[0].y0 == 1.5  # the row outlined
    view.select_unit("1")
    assert view.unit_selector.value == "1" and "<b>1</b> (Inner)" in view.unit_html.value
    view.unit_selector.value = ""
    root = view.unit_html.value  # the root (fp32) casts nothing: the same tensor passes
    assert "passed through (the same tensor)" in root and "<b>cast</b>" not in root


def test_clicking_a_row_of_the_grid_selects_its_unit() -> None:
    view = built(model_of(FIXED))
    heatmap = next(t for t in view.grid_figure.data if t.type == "heatmap")
    view._on_grid_click(heatmap, Points(point_inds=[[2, 1]], xs=["param"], ys=[TWO]), None)
    assert view.unit == "2" and "<b>2</b> (Inner)" in view.unit_html.value


def test_set_plan_lists_the_differences_and_highlights_them() -> None:
    m = model_of(FIXED)
    view = built(m)
    view.set_plan(plan_of(m, 2, **{"2": {"output": F16}}))
    assert "1 difference(s)" in view.differences_html.value
    assert "unit &#x27;2&#x27; (output): planned fp16, observed fp32" in (
        view.differences_html.value
    )
    assert "1 difference(s) from the plan" in view.status_html.value
    assert traces(view.grid_figure)["planned ≠ observed"]["y"] == [TWO]
    view.unit_selector.value = "2"
    assert "outline:3px solid" in view.unit_html.value  # the differing chip
    view.set_plan(plan_of(m, 2))
    assert "observed = planned" in view.differences_html.value


def test_predicted_failures_and_their_fix_are_listed() -> None:
    m = model_of(FAILING)
    view = built(m, plan=_Plan(plan_of(m, 1).units, [_Failure("", "3")]))
    assert "predicted failure</b> at <b>root</b>" in view.findings_html.value
    assert "give unit &#x27;2&#x27; output_dtype" in view.findings_html.value
    assert "observed = planned" in view.differences_html.value
    grid = traces(view.grid_figure)
    assert grid["predicted failure"]["y"] == [ROOT] and grid["predicted failure"]["xaxis"] == "x"
    assert grid["failure (✖ at its unit)"]["xaxis"] == "x2"


def test_refresh_follows_a_live_run_and_skips_needless_redraws() -> None:
    events = events_of(FIXED, world_size=1)
    model = PrecisionModel(make_store())
    view = built(model)
    assert "Waiting for" in view.status_html.value
    assert view.unit_selector.options == (("none", None),)
    half = next(i for i, e in enumerate(events) if e.step == 2)
    model.store.extend(events[:half])
    view.refresh()
    assert view.iteration_selector.max == 1 and view.iteration == 1
    assert "failed" not in view.iteration_html.value
    assert [v for _, v in view.unit_selector.options] == ["", "1", "2"]
    drawn = {k: (r.draws, r.whole) for k, r in view._redrawn.items()}

    def redrawn(whole: bool = False) -> list[str]:
        now = {k: (r.draws, r.whole) for k, r in view._redrawn.items()}
        out = [k for k in now if now[k][whole] != drawn[k][whole]]
        drawn.update(now)
        return out

    view.refresh()
    assert redrawn() == []  # nothing new: no figure redrawn
    model.store.append(Event("log", 0, 0, 1.0, {"text": "not a precision event"}))
    view.refresh()
    assert redrawn() == []  # the revision did not change
    model.store.extend(events[half:])
    view.refresh()
    assert view.iteration == 2 and redrawn(whole=True) == []  # 2 says what 1 said: patched
    for fig in (view.grid_figure, view.bytes_figure, view.collectives_figure):
        assert "rank 0, iteration 2" in fig.layout.title.text
    other = [msgspec.structs.replace(r, iteration=3) for r in model.seen("1", iteration=2)]
    other = [msgspec.structs.replace(r, dtypes=[F32]) if r.phase == "grad" else r for r in other]
    model.store.append(precision_batch(other, step=3, t=2000.0))
    view.refresh()
    assert view.iteration == 3 and redrawn() == ["grid", "bytes", "collectives"]
    assert row(traces(view.grid_figure)["observed"], ONE)["grad"] == "fp32"
    view.unit_selector.value = "1"
    assert redrawn() == ["grid"]  # only the grid outlines another row


def test_state_given_before_the_widget_exists() -> None:
    view = PrecisionView(model_of(FIXED), rank=1, iteration=1, unit="2")
    assert (view.rank, view.iteration, view.unit) == (1, 1, "2")
    view.widget  # noqa: B018
    assert view.rank_selector.value == 1 and view.iteration_selector.value == 1
    assert view.unit_selector.value == "2"
    assert "rank 1, iteration 1" in view.grid_figure.layout.title.text
    view.iteration_selector.value = 0
    assert view.iteration == 2 and "iteration 2" in view.grid_figure.layout.title.text
