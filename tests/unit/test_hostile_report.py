"""A hostile recording, or a feature that fails, costs its own section only: the report
is written with every other section and ``python -m interactive_shard report`` exits 0;
a live view that fails says why in its place and the other views go on redrawing
(``ui/failure.py``)."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import ipywidgets as widgets
import pytest
from support import make_store

import interactive_shard as ish
from interactive_shard import features, report
from interactive_shard.__main__ import main
from interactive_shard.buckets.figures import figure_bucket_map
from interactive_shard.buckets.figures_timeline import report_figures
from interactive_shard.cluster.run import Run
from interactive_shard.telemetry import Event, recording
from interactive_shard.testing import FakeRun, mlp_params
from interactive_shard.ui import live

ERROR = "<script>alert('a name from the run')</script>"


def _events(*, hostile: bool) -> list[Event]:
    """A 2-rank DDP run with scalars; ``hostile``: rank 0's first bucket event says its
    first parameter has shape [2**62, 4], 2**64 elements (more bytes than an int64)."""
    events = FakeRun(mlp_params(2, 8), iterations=2).events()
    events += [Event("scalar", r, s, 1000.0 + s, {"name": "loss", "value": 1.0 / (s + 1)})
               for r in (0, 1) for s in range(1, 4)]  # fmt: skip
    if hostile:
        at = next(i for i, e in enumerate(events) if e.kind == "bucket" and e.rank == 0)
        e = events[at]
        shapes = [[2**62, 4], *e.payload["shapes"][1:]]
        events[at] = Event(e.kind, e.rank, e.step, e.t, {**e.payload, "shapes": shapes})
    return events


def _recording(tmp_path: Path, *, hostile: bool = True) -> Path:
    return recording.save(make_store(_events(hostile=hostile)), tmp_path / "run.jsonl")


# -- a bucket event too large for an int64 ------------------------------------------------------
def test_a_bucket_too_large_for_an_int64_is_skipped_and_counted(tmp_path: Path) -> None:
    path = _recording(tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the file itself is sound: it loads whole
        run = ish.load(path)
    clean = ish.load(_recording(tmp_path / "clean", hostile=False)).buckets
    bm = run.buckets
    shown = bm.observed(1, 0)
    assert bm.skipped == 1
    assert len(shown) == len(clean.observed(1, 0)) - 1
    assert bm.observed(1, 1) == clean.observed(1, 1)  # the other rank's are all there
    figure_bucket_map(bm, 1, 0).to_html()
    assert len(report_figures(bm)) == len(report_figures(clean))


def test_a_cap_too_large_in_bytes_cannot_be_planned_and_the_map_says_so() -> None:
    events = _events(hostile=False)
    for i, e in enumerate(events):
        if e.kind == "ddp_watch":  # int(1e308 * 2**20) overflows: DDP could not have run
            events[i] = Event(e.kind, e.rank, e.step, e.t, {**e.payload, "bucket_cap_mb": 1e308})
    fig = figure_bucket_map(Run(make_store(events)).buckets, 1, 0)
    assert "cannot plan: bucket_cap_mb=1e+308: give a size in MiB" in fig.layout.title.text


def test_the_report_of_a_hostile_recording_is_written_and_the_command_exits_0(
    tmp_path: Path,
) -> None:
    path = _recording(tmp_path)
    assert main(["report", str(path)]) == 0
    page = path.with_suffix(".html").read_text(encoding="utf-8")
    for title in ("Scalars", "DDP gradient buckets"):
        assert f"<h2>{title}</h2>" in page
    assert "ish-failed" not in page


# -- a feature that fails ------------------------------------------------------------------------
def broken_figures(model: Any) -> list[Any]:
    raise ValueError(ERROR)


class BrokenView(live.LazyWidget):
    """A view whose widget cannot be built."""

    def __init__(self, model: Any) -> None:
        self.model = model

    def _build(self) -> None:
        raise ValueError(ERROR)

    def refresh(self) -> None:
        pass


class FailingRedraw(live.LazyWidget):
    """A view built fine whose redraws raise (``fail``) or count themselves."""

    def __init__(self, model: Any, fail: bool = True) -> None:
        self.model, self.fail, self.redraws = model, fail, 0

    def _build(self) -> None:
        self._widget = widgets.VBox([widgets.HTML("drawn")])

    def refresh(self) -> None:
        self.redraws += 1
        if self.fail:
            raise ValueError(ERROR)


BROKEN = features.Feature(
    name="broken",
    title="Broken <feature>",
    model="interactive_shard.monitor.model:MonitorModel",
    view="test_hostile_report:BrokenView",
    figures="test_hostile_report:broken_figures",
    events="interactive_shard.telemetry.run_events:EVENTS",
    always=True,
)
FAILING = features.Feature(
    name="failing",
    title="Failing redraws",
    model="interactive_shard.monitor.model:MonitorModel",
    view="test_hostile_report:FailingRedraw",
    figures="interactive_shard.monitor.figures:report_figures",
)


@pytest.fixture
def registered(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two test features in the feature list, between the package's own."""
    listed = (features.FEATURES[0], BROKEN, FAILING, *features.FEATURES[1:])
    monkeypatch.setattr(features, "FEATURES", listed)
    monkeypatch.setattr(report, "FEATURES", listed)


def test_a_failing_section_is_a_message_and_the_others_are_drawn(
    registered: None, tmp_path: Path
) -> None:
    path = _recording(tmp_path, hostile=False)
    assert main(["report", str(path), "--out", str(tmp_path / "r.html")]) == 0
    page = (tmp_path / "r.html").read_text(encoding="utf-8")
    assert "<h2>Broken &lt;feature&gt;</h2>" in page
    failed = page[page.index("ish-failed") :]
    failed = failed[: failed.index("</div>")]
    assert "Broken &lt;feature&gt;: this section could not be shown (ValueError: " in failed
    assert "&lt;script&gt;alert(&#x27;a name from the run&#x27;)&lt;/script&gt;" in failed
    assert ERROR not in page  # the error's text is escaped
    for title in ("Scalars", "DDP gradient buckets"):  # before and after it
        assert f"<h2>{title}</h2>" in page


def test_a_view_that_cannot_be_built_says_why_in_its_place(registered: None) -> None:
    run = Run(make_store(_events(hostile=False)))
    view = BROKEN.view_of(BROKEN.build_model(run.store))
    shown = view.widget
    assert isinstance(shown, widgets.HTML)
    assert "Broken &lt;feature&gt;: this section could not be shown" in shown.value
    assert "&lt;script&gt;" in shown.value and ERROR not in shown.value
    assert view not in live._views  # nothing to redraw
    other = features.feature("buckets")
    assert other.view_of(run.model("buckets")).widget.children  # the others build as usual


def test_a_view_whose_redraw_fails_says_why_and_the_others_go_on(registered: None) -> None:
    model = FAILING.build_model(make_store(_events(hostile=False)))
    failing, healthy = FailingRedraw(model), FailingRedraw(model, fail=False)
    shown = [failing.widget, healthy.widget]  # built, and so redrawn by ui.live
    live.tick(force=True)
    (note,) = shown[0].children
    assert "Failing redraws: this section could not be shown (ValueError: &lt;script&gt;" in (
        note.value
    )
    live.tick(force=True)
    assert failing.redraws == 1 and healthy.redraws == 2  # the failed one is left alone
    assert shown[1].children[0].value == "drawn"
