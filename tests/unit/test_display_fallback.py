"""A displayed view's mime bundle: the live widget for widget front ends, and a text
summary, escaped HTML and a small plotly figure for every other (ui/fallback.py)."""

from __future__ import annotations

import gc
import json
from pathlib import Path
from typing import Any

import nbformat
import pytest
from support import make_store, notebook_params

from interactive_shard import features
from interactive_shard.cluster.run import Run
from interactive_shard.ui import fallback, live

# Every feature's synthetic run (Feature.fake): a new feature is tested by its entry.
DISPLAYED = [f.name for f in features.FEATURES if f.fake and f.name != "monitor"]
# What each summary must say, in words a reader looks for (a feature not named here is
# still checked for its title, widget, escaped page and figure).
SAYS = {
    "buckets": ["8 parameters", "bucket_cap_mb=0.006", "bucket 0:", "KiB", "world size 2"],
    "splits": ["rank 0: 1 graph(s) compiled", "submod_0", "backend", "DDP (run time)"],
    "precision": ["fsdp2", "3 unit(s)", "param_dtype=bf16", "seen in iteration 2", "reduce fp32"],
    "timeline": ["rank 0, iteration 2", "backward", "hidden by compute"],
    "ddp": ["DDP instance(s) on rank 0", "check(s) fired", "0.bias got no gradient"],
}


def shown(widget: Any) -> dict[str, Any]:
    """What IPython sends for ``widget`` (the display hook shows the view's widget)."""
    from IPython.core.formatters import DisplayFormatter

    data, _ = DisplayFormatter().format(widget)
    return data


@pytest.mark.parametrize("name", DISPLAYED)
def test_a_feature_bundle_keeps_the_widget_and_says_the_view(name: str) -> None:
    run = Run(make_store(features.feature(name).sample()))
    widget = getattr(run, name)._view().widget
    data = shown(widget)
    assert data[fallback.WIDGET_MIME]["model_id"] == widget.model_id
    assert data[fallback.WIDGET_MIME]["version_major"] == 2
    text, page = data["text/plain"], data["text/html"]
    assert text.startswith(f"{features.feature(name).title} ({fallback.NOTE})\n")
    for words in SAYS.get(name, []):
        assert words in text, f"{name} summary lacks {words!r}:\n{text}"
    assert f'data-ish-summary="{name}"' in page and "<script" not in page
    fig = data[fallback.PLOTLY_MIME]
    assert fig["data"] and "template" not in fig["layout"]
    assert len(json.dumps(fig)) <= fallback.MAX_FIGURE_CHARS


@pytest.mark.parametrize("name", DISPLAYED)
def test_displaying_run_feature_shows_its_live_view(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    shown_objects: list[Any] = []
    monkeypatch.setattr("IPython.display.display", shown_objects.append)
    run = Run(make_store(features.feature(name).sample()))
    getattr(run, name)._ipython_display_()
    (widget,) = shown_objects
    view = widget._ish_view
    assert features.feature_of_view(view).name == name
    gc.collect()  # the displayed widget alone keeps its view alive, and live
    assert view in live._views
    view.refresh()


def test_the_run_shows_the_monitor_with_its_ranks() -> None:
    data = shown(Run(make_store(features.feature("buckets").sample()))._view().widget)
    text = data["text/plain"]
    assert text.startswith(f"Run monitor ({fallback.NOTE})\n2 ranks · gloo · cpu · run 0")
    assert "rank 0:" in text and "rank 1:" in text and "step 3" in text
    assert fallback.WIDGET_MIME in data


def test_a_summary_that_fails_says_so_and_keeps_the_widget(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    run = Run(make_store(features.feature("buckets").sample()))

    def broken(model: Any) -> str:
        raise ValueError("no luck")

    monkeypatch.setattr("interactive_shard.buckets.summary.summary", broken)
    data = shown(run.buckets._view().widget)
    assert "no summary (ValueError: no luck)" in data["text/plain"]
    assert fallback.WIDGET_MIME in data and fallback.PLOTLY_MIME not in data


def test_html_is_escaped_and_a_large_figure_is_left_out() -> None:
    page = fallback.to_html(fallback.Static("x", "Title <b>", "line & <script>", None))
    assert "<li>line &amp; &lt;script&gt;</li>" in page and "Title &lt;b&gt;" in page
    import plotly.graph_objects as go

    big = go.Figure(go.Scatter(y=[float(i) / 7 for i in range(5_000)]))
    assert fallback.figure_json(big) is None
    assert fallback.figure_json(go.Figure(go.Scatter(y=[1, 2]))) is not None
    # A large one keeps its points and drops its hover sentences.
    hover = [f"span {i}: a long sentence that says what it is" for i in range(300)]
    fig = go.Figure(go.Bar(x=list(range(300)), hovertext=hover, hoverinfo="text"))
    (trace,) = fallback.figure_json(fig)["data"]  # type: ignore[index]
    assert len(trace["x"]) == 300 and "hovertext" not in trace and trace["hoverinfo"] == "x+y+name"


def test_a_closed_widget_shows_nothing() -> None:
    run = Run(make_store(features.feature("buckets").sample()))
    widget = run.buckets._view().widget
    widget.close()
    assert fallback.WIDGET_MIME not in shown(widget)


def test_every_feature_names_a_summary() -> None:
    for f in features.FEATURES:
        assert f.summary is not None and callable(features.load(f.summary)), f.name


MAX_NOTEBOOK_BYTES = 200_000  # 02 (seven bucket maps of a 29-parameter model): 190 kB


@pytest.mark.parametrize("notebook", notebook_params())
def test_committed_notebooks_carry_the_fallbacks_and_stay_small(notebook: Path) -> None:
    nb = nbformat.read(notebook, as_version=4)
    assert "widgets" not in nb.metadata, "saved widget state: build it with tools/build_notebook.py"
    assert notebook.stat().st_size <= MAX_NOTEBOOK_BYTES
    views = [
        out["data"]
        for cell in nb.cells
        if cell.cell_type == "code"
        for out in cell.get("outputs", [])
        if fallback.WIDGET_MIME in out.get("data", {})
    ]
    assert views, f"{notebook.name} shows no view"
    for data in views:
        assert "static summary" in data["text/plain"] and "ish-summary" in data["text/html"]
