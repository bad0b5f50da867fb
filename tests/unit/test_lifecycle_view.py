"""Lifecycle figures through ``to_plotly_json()``, the widget through its Python state."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import ipywidgets as widgets
import plotly.graph_objects as go
import pytest
from support import make_store

from interactive_shard import features, report
from interactive_shard.cluster.run import Run
from interactive_shard.ddp.figures import (
    PURPOSE_COLORS,
    ROWS,
    STATE_COLORS,
    figure_bytes,
    figure_hooks,
    figure_lifecycle,
    instance_label,
    report_figures,
)
from interactive_shard.ddp.model import PURPOSE_ORDER, LifecycleModel
from interactive_shard.ddp.view import LEVEL_COLORS, LifecycleView
from interactive_shard.telemetry.schema import Event
from interactive_shard.testing import FakeLifecycle
from interactive_shard.ui import live
from interactive_shard.ui.view_base import LATEST

PARAMS = ["0.weight", "0.bias", "1.weight", "1.bias"]
STATES = list(STATE_COLORS)
FEATURE = features.Feature(
    name="ddp",
    title="DDP lifecycle",
    model="interactive_shard.ddp.model:LifecycleModel",
    view="interactive_shard.ddp.view:LifecycleView",
    figures="interactive_shard.ddp.figures:report_figures",
    events="interactive_shard.ddp.events:EVENTS",
)


@pytest.fixture
def registered(monkeypatch: pytest.MonkeyPatch) -> None:
    """The ddp feature in the feature list (the lead's registration may not be in yet)."""
    if any(f.name == "ddp" for f in features.FEATURES):
        return
    listed = (*features.FEATURES, FEATURE)
    monkeypatch.setattr(features, "FEATURES", listed)
    monkeypatch.setattr(report, "FEATURES", listed)


def model_of(fake: FakeLifecycle) -> LifecycleModel:
    return LifecycleModel(make_store(fake.events()))


def strip(fig: go.Figure | go.FigureWidget) -> dict[str, Any]:
    (heat,) = [t.to_plotly_json() for t in fig.data]
    assert heat["type"] == "heatmap"
    return heat


def row(heat: dict[str, Any], name: str, field: str = "text") -> list[Any]:
    return list(heat[field][list(heat["y"]).index(name)])


# -- figures -----------------------------------------------------------------------------------
def test_lifecycle_strip_has_a_row_per_stage_and_a_column_per_iteration() -> None:
    fig = figure_lifecycle(model_of(FakeLifecycle()))
    heat = strip(fig)
    assert list(heat["x"]) == ["1", "2", "3"] and list(heat["y"]) == list(ROWS)
    assert row(heat, "forwards") == ["1", "1", "1"]
    assert row(heat, "reduction finished") == ["✓", "✓", "✓"]
    assert row(heat, "buffer sync") == ["256 B"] * 3 and row(heat, "dropped forwards") == ["0"] * 3
    assert [STATES[z] for z in row(heat, "reduction finished", "z")] == ["ok"] * 3
    assert (
        "ready order: 1.bias, 1.weight, 0.bias, 0.weight" in row(heat, "backward", "hovertext")[0]
    )
    assert fig.layout.title.text == "Lifecycle · DDP #1 · defaults · rank 0 · 3 iteration(s)"
    # The colour scale is flat bands: each state's z index lands on its colour.
    scale = heat["colorscale"]
    assert [c for _, c in scale[::2]] == list(STATE_COLORS.values())


def test_an_unfinished_reduction_and_a_dropped_forward_are_red() -> None:
    fig = figure_lifecycle(model_of(FakeLifecycle(unused=["0.bias"], dropped_at=2)))
    heat = strip(fig)
    assert row(heat, "reduction finished") == ["✗", "✗", "✗"]
    assert [STATES[z] for z in row(heat, "reduction finished", "z")] == ["bad"] * 3
    assert "no gradient for 0.bias" in row(heat, "reduction finished", "hovertext")[0]
    assert row(heat, "dropped forwards") == ["0", "1", "0"]
    assert [STATES[z] for z in row(heat, "dropped forwards", "z")] == ["none", "bad", "none"]
    assert [STATES[z] for z in row(heat, "forwards", "z")] == ["ok", "warn", "ok"]
    assert fig.layout.title.text.endswith("3 with a mistake") and STATE_COLORS["bad"] == "#D55E00"


def test_delayed_bytes_steps_and_walk_in_the_strip() -> None:
    fake = FakeLifecycle(
        delayed=["0.weight"], hook_param="1.bias", steps_in_backward=1, find_unused_parameters=True
    )
    m = model_of(fake)
    heat = strip(figure_lifecycle(m))
    assert row(heat, "delayed all-reduce") == ["4 KiB"] * 3
    assert "outside the Reducer: 0.weight" in row(heat, "delayed all-reduce", "hovertext")[0]
    assert row(heat, "optimizer steps in backward") == ["1"] * 3
    assert "find_unused walk 0.4 ms" in row(heat, "forwards", "hovertext")[0]
    assert "find_unused, 1 delayed" in instance_label(m.instances[0])


def test_hooks_bar_per_parameter_double_hooks_red() -> None:
    m = model_of(FakeLifecycle(twice=True))
    fig = figure_hooks(m)  # the newest instance
    (bar,) = [t.to_plotly_json() for t in fig.data]
    assert list(bar["x"]) == PARAMS and list(bar["y"]) == [2, 2, 2, 2]
    assert list(bar["marker"]["color"]) == [STATE_COLORS["bad"]] * 4
    assert fig.layout.title.text.startswith("Live DDP hooks per parameter · DDP #2")
    assert "4 hooked twice or more" in fig.layout.title.text
    (old,) = [t.to_plotly_json() for t in figure_hooks(m, ddp=1).data]
    assert list(old["y"]) == [1, 1, 1, 1] and list(old["marker"]["color"]) == ["#0072B2"] * 4


def test_bytes_stacked_by_purpose_per_instance() -> None:
    m = model_of(FakeLifecycle(twice=True, iterations=2))
    fig = figure_bytes(m, rank=1)
    bars = {t.name: t.to_plotly_json() for t in fig.data}
    assert list(bars) == list(PURPOSE_ORDER) and fig.layout.barmode == "stack"
    for purpose, b in bars.items():
        assert (
            list(b["x"]) == ["DDP #1", "DDP #2"] and b["marker"]["color"] == PURPOSE_COLORS[purpose]
        )
        assert list(b["y"]) == [m.bytes_by_purpose(1, s)[purpose] for s in (1, 2)]
    assert list(bars["gradients"]["y"]) == [2 * 4 * 4096] * 2
    assert fig.layout.title.text.startswith("Bytes sent by purpose · rank 1")


def test_no_instance_says_how_to_watch() -> None:
    m = LifecycleModel(make_store())
    for fig in (figure_lifecycle(m), figure_hooks(m), figure_bytes(m)):
        assert "ish.watch(ddp)" in fig.layout.title.text and not fig.data
    assert report_figures(m) == []


def test_report_figures_and_html_report(registered: None, tmp_path: Path) -> None:
    m = model_of(FakeLifecycle(twice=True))
    titles = [f.layout.title.text for f in report_figures(m)]
    assert [t.split(" · ")[0] for t in titles] == [
        "Lifecycle",
        "Live DDP hooks per parameter",
        "Lifecycle",
        "Live DDP hooks per parameter",
        "Bytes sent by purpose",
    ]
    assert "DDP #1" in titles[0] and "DDP #2" in titles[2]
    page = Run(make_store(FakeLifecycle().events())).to_html(tmp_path / "r.html")
    text = page.read_text(encoding="utf-8")
    assert "DDP lifecycle" in text and "Bytes sent by purpose" in text


# -- the widget --------------------------------------------------------------------------------
def built(view: LifecycleView) -> LifecycleView:
    view.widget  # noqa: B018
    return view


def test_widget_is_lazy_registered_and_shows_the_newest_instance() -> None:
    m = model_of(FakeLifecycle(twice=True, unused=["0.bias"]))
    view = LifecycleView(m)
    assert view._widget is None and view.ddp == 2 and view.rank == 0
    assert isinstance(view.widget, widgets.VBox) and view in live._views
    assert [v for _, v in view.ddp_selector.options] == [LATEST, 1, 2]
    assert view.ddp_selector.options[1][0] == "DDP #1 · defaults"
    assert [v for _, v in view.rank_selector.options] == [0, 1]
    assert "DDP #2" in view.lifecycle_figure.layout.title.text
    assert "DDP #2" in view.hooks_figure.layout.title.text
    assert "<b>2 DDP instance(s)</b> on rank 0 · 6 iteration(s)" in view.status_html.value
    settings = view.settings_html.value
    assert "<code>static_graph</code></td><td>False" in settings and "16 KiB" in settings
    findings = view.findings_html.value
    assert f"color:{LEVEL_COLORS['error']}'>error · double_hooks" in findings
    assert "Fix: use every parameter in the loss" in findings  # the check's own fix text


def test_advice_in_another_colour() -> None:
    view = built(LifecycleView(model_of(FakeLifecycle(find_unused_parameters=True))))
    text = view.findings_html.value
    assert f"color:{LEVEL_COLORS['info']}'>info · find_unused_cost" in text
    assert LEVEL_COLORS["info"] != LEVEL_COLORS["error"] and "static_graph_safe" in text


def test_selectors_switch_instance_and_rank() -> None:
    m = model_of(FakeLifecycle(twice=True))
    view = built(LifecycleView(m))
    view.ddp_selector.value = 1
    assert view.ddp == 1 and "DDP #1" in view.lifecycle_figure.layout.title.text
    assert list(view.hooks_figure.data[0].y) == [1, 1, 1, 1]
    assert "double_hooks" not in view.findings_html.value  # that finding is instance 2's
    view.rank_selector.value = 1
    assert view.rank == 1 and "rank 1" in view.lifecycle_figure.layout.title.text
    assert "rank 1" in view.bytes_figure.layout.title.text
    view.ddp_selector.value = LATEST
    assert view.ddp == 2


def test_state_given_before_the_widget_exists() -> None:
    view = LifecycleView(model_of(FakeLifecycle(twice=True)), ddp=1, rank=1)
    assert (view.ddp, view.rank) == (1, 1)
    view.widget  # noqa: B018
    assert view.ddp_selector.value == 1 and view.rank_selector.value == 1
    assert "DDP #1 · defaults · rank 1" in view.lifecycle_figure.layout.title.text


def test_empty_state_then_a_live_run_redraws_only_on_new_data() -> None:
    fake = FakeLifecycle()
    m = LifecycleModel(make_store())
    view = built(LifecycleView(m))
    assert "watch a DDP model with <code>ish.watch(ddp)</code>" in view.status_html.value
    assert view.details.layout.display == "none" and view.ddp is None
    events = fake.events()
    m.store.extend([e for e in events if e.step <= 1])
    view.refresh()
    assert view.details.layout.display == "" and view.ddp == 1
    assert "1 iteration(s)" in view.lifecycle_figure.layout.title.text
    drawn = {k: r.draws for k, r in view._redrawn.items()}

    def redrawn() -> list[str]:
        now = {k: r.draws for k, r in view._redrawn.items()}
        out = [k for k in now if now[k] != drawn[k]]
        drawn.update(now)
        return out

    view.refresh()
    assert redrawn() == []  # nothing new: no figure redrawn
    m.store.append(Event("log", 0, 0, 1.0, {"text": "not a lifecycle event"}))
    view.refresh()
    assert redrawn() == []  # the revision did not change
    m.store.extend([e for e in events if e.step >= 2])
    view.refresh()
    assert redrawn() == ["lifecycle", "bytes"]  # the hooks come with a watch
    view.ddp_selector.value = 1  # the same instance as "newest": nothing to redraw
    assert redrawn() == []
    view.rank_selector.value = 1
    assert redrawn() == ["lifecycle", "hooks", "bytes"]
