"""The run's own cost on the kernel side: ``telemetry.overhead`` (Note [Share of the
step]), ``run.overhead`` and the badge every view's status line ends with."""

from __future__ import annotations

import gc
import time
import weakref

import plotly.graph_objects as go
import pytest
from support import make_store

import interactive_shard as ish
from interactive_shard.features import feature
from interactive_shard.telemetry import overhead
from interactive_shard.telemetry.run_events import Overhead
from interactive_shard.telemetry.schema import Event, record_event
from interactive_shard.telemetry.store import RunStore
from interactive_shard.ui.view_base import badge_html, with_badge


def _said(probe: str, rank: int, spent: float, active: float, t: float = 10.0) -> Event:
    record = Overhead(probe=probe, spent_s=spent, active_s=active, calls=7, iterations=3)
    return record_event(record, rank, 3, t)


def _store(*events: Event) -> RunStore:
    store = make_store()
    store.extend(list(events))
    return store


def test_the_latest_report_of_each_probe_and_rank_counts() -> None:
    store = _store(
        _said("buckets", 0, 0.01, 1.0, t=10.0),
        _said("buckets", 0, 0.03, 2.0, t=11.0),  # cumulative: replaces the first
        _said("ddp", 1, 0.02, 4.0),
    )
    model = overhead.OverheadModel(store)
    assert model.revision == 0 and model.ranks == [] and model.badge() == ""
    assert model.share() == 0.0 and model.most() is None and model.table() == []
    assert model.update() and model.revision == 1 and not model.update()
    assert model.ranks == [0, 1] and model.probes == ["buckets", "ddp"]
    row = model.row("buckets", 0)
    assert row is not None and (row.spent, row.active, row.share) == (0.03, 2.0, 0.015)
    assert model.row("ddp", 0) is None and model.share("ddp", 0) == 0.0
    assert model.table()[0] == {
        "probe": "buckets",
        "rank": 0,
        "spent_s": 0.03,
        "active_s": 2.0,
        "share": 0.015,
        "calls": 7,
        "iterations": 3,
    }


def test_a_ranks_share_adds_its_probes_shares_the_runs_is_their_mean() -> None:
    """Note [Share of the step]: hooks active over the training (2 s) and the channel's
    flushes over the whole run (10 s) each cost their share of a step."""
    store = _store(
        _said("buckets", 0, 0.02, 2.0),  # 1%
        _said("ddp", 0, 0.01, 2.0),  # 0.5%
        _said("sending", 0, 0.05, 10.0),  # 0.5%
        _said("buckets", 1, 0.06, 2.0),  # 3%
        _said("sending", 1, 0.0, 10.0),
    )
    model = overhead.of(store)
    assert overhead.of(store) is model  # one reader per store
    assert model.probes == ["buckets", "ddp", "sending"]  # sending last: every probe shares it
    assert model.share(rank=0) == pytest.approx(0.02)  # not 0.08 s over 10 s
    assert model.share(rank=1) == pytest.approx(0.03)
    assert model.share() == pytest.approx(0.025)
    assert model.share("buckets") == pytest.approx(0.08 / 4.0)  # spent over active, summed
    assert model.spent(rank=0) == pytest.approx(0.08) and model.spent("buckets") == 0.08
    assert model.most() == 1
    assert model.badge() == "probes: 2.5% of the step (most: rank 1, 3.0%)"
    assert model.badge(lambda r: f"{r} · node 1").endswith("(most: rank 1 · node 1, 3.0%)")


def test_shares_never_exceed_one_nor_divide_by_zero() -> None:
    model = overhead.of(_store(_said("timeline", 0, 0.5, 0.0), _said("ddp", 0, 2.0, 1.0)))
    assert model.share("timeline", 0) == 0.0 and model.share("ddp", 0) == 1.0
    assert model.badge() == "probes: 100% of the step"  # one rank: no "most"


@pytest.mark.parametrize(
    ("share", "text"),
    [(0.0, "0%"), (0.00001, "<0.01%"), (0.0012, "0.12%"), (0.018, "1.8%"), (0.25, "25%")],
)
def test_percent(share: float, text: str) -> None:
    assert overhead.percent(share) == text


def test_an_event_that_does_not_fit_is_skipped_and_counted() -> None:
    bad = Event(Overhead.KIND, 0, 1, 1.0, {"probe": "ddp", "spent_s": -1.0, "active_s": 1.0})
    hostile = Event(Overhead.KIND, 1, 1, 1.0, {"probe": ["x"], "spent_s": 0.0, "active_s": 1.0})
    model = overhead.of(_store(_said("ddp", 0, 0.01, 1.0), bad, hostile))
    assert model.skipped == 2 and model.ranks == [0]  # the newest did not fit: the older counts
    assert model.share("ddp", 0) == 0.01


def test_run_overhead_its_figures_summary_and_view() -> None:
    f = feature("overhead")
    store = _store(*f.sample())
    run = ish.Run(store)
    model = run.overhead
    assert type(model).__module__ == "interactive_shard.overhead.model"
    assert model.ranks == [0, 1] and model.most() == 1  # the sample's rank 1 pays more
    for figure in f.report_figures(model):
        go.Figure(figure.to_dict())  # validates: the figures are built unvalidated
    bars = f.report_figures(model)[0]
    assert [t.name for t in bars.data] == ["rank 0", "rank 1"]
    assert bars.layout.title.text.startswith("Probes: ")
    text = f.summary_of(model)
    assert text.splitlines()[0] == model.badge() and "rank 1: " in text
    view = f.view_of(model)
    view.widget  # noqa: B018
    assert "4 probe(s)</b> on 2 rank(s)" in view.status_html.value
    assert "ish-overhead" in view.status_html.value


def test_every_views_status_line_ends_with_the_badge_and_follows_new_reports() -> None:
    store = _store(*feature("buckets").sample())
    run = ish.Run(store)
    view = feature("buckets").view_of(run.buckets)
    view.widget  # noqa: B018
    before = view.status_html.value
    assert before and "ish-overhead" not in before  # nothing said yet: no badge
    store.extend([_said("buckets", 0, 0.01, 1.0), _said("buckets", 1, 0.03, 1.0)])
    view.refresh()  # the view's own data did not change: the badge still comes
    after = view.status_html.value
    assert after.startswith(before) and "probes: 2.0% of the step (most: rank 1, 3.0%)" in after
    assert with_badge("", store) == badge_html(store)
    assert with_badge("x", None) == "x" and badge_html(None) == ""


def test_a_refresh_with_nothing_new_costs_little() -> None:
    store = _store(*feature("overhead").sample(50))
    badge_html(store)
    start = time.perf_counter()
    for _ in range(1000):
        badge_html(store)
    assert (time.perf_counter() - start) / 1000 < 100e-6  # views refresh 10 times a second


def test_the_badge_reader_does_not_keep_its_store_alive() -> None:
    store = make_store([])
    assert overhead.of(store).badge() == ""
    gone = weakref.ref(store)
    del store
    gc.collect()
    assert gone() is None
