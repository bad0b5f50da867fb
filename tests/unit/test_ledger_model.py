"""The ledger's model, view, summary and figure on synthetic ledgers (no ranks): a hang
seen live, a state that never goes back, hostile events skipped and counted."""

from __future__ import annotations

from typing import Any

import plotly.graph_objects as go

from interactive_shard.collectives.events import Ledger, LedgerEntry, LedgerGroup
from interactive_shard.collectives.figures import ledger_figure
from interactive_shard.collectives.model import CollectivesModel
from interactive_shard.collectives.summary import summary
from interactive_shard.collectives.view import CollectivesView
from interactive_shard.features import feature
from interactive_shard.telemetry.schema import Event, record_event
from interactive_shard.telemetry.store import RunInfo, RunStore

GROUP = LedgerGroup(name="0", ranks=[0, 1])


def _store(world_size: int = 2) -> RunStore:
    return RunStore(RunInfo(world_size=world_size, backend="gloo", device_types=["cpu"] * 2))


def _entry(seq: int, state: str = "completed", caller: str = "train.py:9 in step") -> LedgerEntry:
    return LedgerEntry(
        group="0",
        seq=seq,
        op="all_reduce",
        dtype="torch.float32",
        shape=[4],
        caller=caller,
        state=state,  # type: ignore[arg-type]
    )


def _ledger(rank: int, t: float, **fields: Any) -> Event:
    return record_event(Ledger(**fields), rank, 0, t)


def test_a_hang_is_named_live_and_flagged_after_the_threshold() -> None:
    store = _store()
    store.extend(
        [
            _ledger(
                0, 10.0, entries=[_entry(0), _entry(1, "issued")], groups=[GROUP], issued={"0": 2}
            ),
            _ledger(1, 10.0, entries=[_entry(0)], groups=[GROUP], issued={"0": 1}),
        ]
    )
    model = CollectivesModel(store)
    assert model.waiting_for() == [] and not model.hang_flagged()
    stuck = ["train.py:3 in main", "train.py:12 in step"]
    store.extend(
        [
            _ledger(0, 11.5, issued={"0": 2}, still_s=1.0, in_collective=True, stack=stuck),
            _ledger(1, 11.5, issued={"0": 1}, still_s=1.0, stack=["train.py:20 in slow"]),
        ]
    )
    assert model.waiting_for() == [1]
    assert model.pending()[0] is not None and model.pending()[0].seq == 1
    assert model.pending()[1] is None
    assert not model.hang_flagged(threshold=5.0)
    store.append(_ledger(1, 16.0, issued={"0": 1}))  # time passes; nobody moved
    assert model.hang_flagged(threshold=5.0)
    kinds = [f.kind for f in model.findings]
    assert kinds == ["divergence", "hang"]
    assert "rank 1 is at train.py:20 in slow" in model.findings[1].message
    view = CollectivesView(model)
    view.widget  # noqa: B018 - builds it
    assert "HANG" in view.findings_html.value
    fig = ledger_figure(model)
    go.Figure(fig.to_dict())  # valid
    assert {s["type"] for s in fig.layout.to_plotly_json()["shapes"]} == {"rect"}
    assert "rank 0 waits in #1 all_reduce" in summary(model)


def test_a_state_never_goes_back_and_a_caller_once_named_stays() -> None:
    store = _store()
    store.append(_ledger(0, 1.0, entries=[_entry(0, "completed")], issued={"0": 1}))
    store.append(_ledger(0, 2.0, entries=[_entry(0, "issued", caller="")], issued={"0": 1}))
    model = CollectivesModel(store)
    (e,) = model.entries(0)
    assert e.state == "completed" and e.caller == "train.py:9 in step"


def test_hostile_ledger_events_are_skipped_and_counted() -> None:
    store = _store()
    bad = [
        Event(
            "ledger",
            0,
            0,
            1.0,
            {"entries": [{"group": "0", "seq": -1, "op": "x", "state": "completed"}]},
        ),
        Event("ledger", 0, 0, 1.0, {"entries": "nope"}),
        Event("ledger", 1, 0, 1.0, {"issued": {"0": "many"}}),
    ]
    store.extend([*bad, _ledger(0, 2.0, entries=[_entry(0)], issued={"0": 1})])
    model = CollectivesModel(store)
    assert model.skipped == 3 and len(model) == 1 and model.ranks == [0]


def test_the_synthetic_run_agrees_and_its_view_reads_under_a_budget() -> None:
    store = _store()
    store.extend(feature("collectives").sample(200))
    model = CollectivesModel(store)
    with model.budget(0.0):
        model.update()
    assert model.backlog > 0  # a chunk read, the rest left for the poller
    assert model.divergence() is None and model.backlog == 0  # the public API reads it all
    assert len(model.entries(0)) == len(model.entries(1)) == 1 + 200 * 4
