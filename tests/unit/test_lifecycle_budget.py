"""LifecycleModel under a refresh's budget (``LifecycleModel.budget``): what a budgeted
update leaves pending, the view saying so, the poller catching up, exact at the end."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from support import lifecycle_state as state
from support import make_store

from interactive_shard.ddp import model
from interactive_shard.ddp.figures import STATE_COLORS, figure_lifecycle
from interactive_shard.ddp.model import LifecycleModel
from interactive_shard.ddp.view import LifecycleView
from interactive_shard.telemetry import consume
from interactive_shard.testing import FakeLifecycle

STATES = list(STATE_COLORS)


# A watch, checks every iteration (unfinished), a dropped forward, parts split in two,
# and a second instance: every path of the summarising, cut into chunks anywhere.
FAKE = FakeLifecycle(iterations=150, unused=["0.bias"], dropped_at=120, split=True, twice=True)


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Chunks of 16 events, and a clock that says one second more at every look: a
    budget of k.5 seconds summarises k chunks (k + 1 when the update took new ones)."""
    ticks = iter(range(10**9))
    monkeypatch.setattr(model, "CHUNK", 16)
    monkeypatch.setattr(consume, "perf_counter", lambda: float(next(ticks)))
    yield


def test_a_budgeted_update_summarises_in_chunks_and_catches_up_exactly(clock: None) -> None:
    events = FAKE.events()
    store = make_store(events[:10])
    m = LifecycleModel(store)
    assert m.update() and m.pending == 0  # outside a budget: everything
    store.extend(events[10:])
    with m.budget(2.5):
        assert m.update()  # one chunk for the new events, then two in the budget
        assert m.pending == len(events) - 10 - 3 * 16
        assert not m.update() and m.pending == len(events) - 10 - 3 * 16  # budget spent
    with m.budget(0.0):
        assert not m.update() and m.instances  # nothing new: nothing summarised
    assert m.pending == len(events) - 10 - 3 * 16
    while m.pending:
        with m.budget(1.5):
            m.update()
    assert state(m) == state(LifecycleModel(make_store(events)))
    assert m.skipped == 0


def test_a_read_outside_the_budget_is_exact(clock: None) -> None:
    events = FAKE.events()
    store = make_store(events[:10])
    m = LifecycleModel(store)
    m.update()
    store.extend(events[10:])
    with m.budget(0.0):
        m.update()
    assert m.pending == len(events) - 10 - 16
    assert m.instances[0].iteration_count == FAKE.iterations and m.pending == 0
    assert state(m) == state(LifecycleModel(make_store(events)))


def test_the_view_says_what_is_left_and_its_poller_finishes(
    clock: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    polls: list[object] = []
    monkeypatch.setattr("interactive_shard.ui.live.keep_polling", polls.append)
    monkeypatch.setattr("interactive_shard.ddp.view.POLL_BUDGET_S", 1.5)  # a chunk
    events = FakeLifecycle(iterations=300, dropped_at=290).events()
    store = make_store(events[:10])
    view = LifecycleView(LifecycleModel(store))
    view.widget  # noqa: B018
    store.extend(events[10:])
    view.refresh()
    left = view.model.pending
    assert left > 0 and polls == [view._catch_up._poll]  # one poller, until it is done
    assert f"reading: {left:,} event(s) to go" in view.status_html.value
    assert f"reading: {left:,} event(s) to go" in str(view.lifecycle_figure.layout.title.text)
    view.refresh()  # nothing new: a redraw, no summarising
    assert view.model.pending == left and len(polls) == 1
    for _ in range(left):  # a chunk a poll
        if view._catch_up._poll():
            break
    assert view.model.pending == 0
    view.refresh()  # the tick after the poller: the whole run, exact
    title = str(view.lifecycle_figure.layout.title.text)
    assert "reading" not in title and "reading" not in view.status_html.value
    exact = figure_lifecycle(LifecycleModel(make_store(events)))
    assert title == exact.layout.title.text and "300 iteration(s)" in title
    (heat,) = view.lifecycle_figure.data
    assert [list(r) for r in heat.z] == [list(r) for r in exact.data[0].z]
    dropped = list(heat.y).index("dropped forwards")
    assert STATES[heat.z[dropped][96]] == "bad"  # iterations 289..291: 290 dropped one
