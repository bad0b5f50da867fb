"""LifecycleModel at scale: bulk updates into columns, lazily built iterations, the
aggregated strip and the view's iteration window (issue 12)."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from support import lifecycle_state as state
from support import make_store

from interactive_shard.ddp import _iteration_columns, model
from interactive_shard.ddp.figures import MAX_COLUMNS, STATE_COLORS, figure_lifecycle
from interactive_shard.ddp.model import LifecycleModel
from interactive_shard.ddp.view import LifecycleView
from interactive_shard.telemetry.schema import Event
from interactive_shard.testing import FakeLifecycle

STATES = list(STATE_COLORS)


FAKES = {
    "healthy": FakeLifecycle(),
    "split": FakeLifecycle(forwards=2, split=True),
    "twice": FakeLifecycle(twice=True),
    "unused-dropped": FakeLifecycle(unused=["0.bias"], dropped_at=2),
    "delayed": FakeLifecycle(delayed=["0.weight"], hook_param="1.bias", steps_in_backward=1),
    "find-unused": FakeLifecycle(find_unused_parameters=True, unused=["0.bias"], shuffled=True),
}


@pytest.mark.parametrize("fake", list(FAKES.values()), ids=list(FAKES))
def test_one_bulk_update_equals_an_update_per_event(fake: FakeLifecycle) -> None:
    events = fake.events()
    whole = LifecycleModel(make_store(events))
    store = make_store()
    one_by_one = LifecycleModel(store)
    for e in events:
        store.append(e)
        one_by_one.update()
    assert state(whole) == state(one_by_one)
    assert whole.skipped == one_by_one.skipped == 0


def test_an_update_decodes_only_the_new_events(monkeypatch: pytest.MonkeyPatch) -> None:
    events = FakeLifecycle(iterations=40).events()
    store = make_store(events[:10])
    m = LifecycleModel(store)
    m.update()
    seen: list[int] = []
    decode = _iteration_columns.decode
    monkeypatch.setattr(
        model, "decode", lambda evs, skip: seen.append(len(evs)) or decode(evs, skip)
    )
    store.extend(events[10:30])
    assert m.update() and seen == [20]  # iteration parts only: no watch came
    store.extend(events[30:])
    assert m.update() and seen == [20, len(events) - 30]
    assert not m.update() and seen == [20, len(events) - 30]
    inst = m.instances[0]
    assert inst.iteration_count == 40 and len(inst.table.raw) == 40


def test_parts_of_one_iteration_across_updates_and_out_of_order() -> None:
    fake = FakeLifecycle(forwards=2, split=True, iterations=3)
    events = fake.rank_events(0)
    store = make_store(events[:3])  # the watch, then iteration 1's first part
    m = LifecycleModel(store)
    assert [it.forwards for it in m.instances[0].iterations] == [2]
    store.extend(events[3:])
    its = m.instances[0].iterations
    assert [(it.index, it.forwards, it.backward) for it in its] == [
        (1, 2, True),
        (2, 2, True),
        (3, 2, True),
    ]
    assert its[0].ready == fake.ready(1) and len(its[0].collectives) == 4
    # A late part of iteration 2 (a flush) merges into its row, not after iteration 3.
    (late,) = [p for p in fake.iteration(1, 2) if p.backward]
    store.append(Event("lifecycle_iteration", 0, 2, 2000.0, msgspec.to_builtins(late)))
    it = m.instances[0].iteration(2)
    assert it is not None and it.ready == fake.ready(2) + fake.ready(2)[2:]
    assert len(it.collectives) == 6 and it.forwards == 2
    assert [i.index for i in m.instances[0].iterations] == [1, 2, 3]


def test_watched_again_in_the_same_update_restarts_after_the_history() -> None:
    fake = FakeLifecycle(iterations=2)
    events = fake.rank_events(0)
    again = msgspec.to_builtins(msgspec.structs.replace(fake.watch(), static_graph=True))
    events.append(Event("lifecycle_watch", 0, 0, 2002.0, again))
    for index in (1, 2):  # a new probe counts from 1 again
        (part,) = fake.iteration(1, index)
        events.append(Event("lifecycle_iteration", 0, index, 2003.0, msgspec.to_builtins(part)))
    m = LifecycleModel(make_store(events))
    inst = m.instances[0]
    assert [it.index for it in inst.iterations] == [1, 2, 3, 4]
    assert inst.settings["static_graph"] is True and inst.offset == 2


def test_iterations_are_built_when_read_and_rebuilt_only_from_what_changed() -> None:
    store = make_store(FakeLifecycle(iterations=30).events())
    m = LifecycleModel(store)
    m.update()
    inst = m.instances[0]
    assert inst.iteration_count == 30 and inst._built == []  # nothing built yet
    one = inst.iteration(7)
    assert one is not None and one.index == 7 and one.buffer_bytes == 256
    assert inst._built == []
    first = inst.iterations
    assert inst.iterations[0] is first[0]  # cached
    assert m.bytes_by_purpose()["gradients"] == 30 * 4 * 4096


def test_parts_of_an_unwatched_instance_are_skipped_and_counted() -> None:
    events = FakeLifecycle(iterations=2).events()
    part = {"iteration": 1, "ddp": 9, "forwards": 1, "dropped": 0, "backward": True}
    orphans = [Event("lifecycle_iteration", 0, 1, 2000.0, dict(part)) for _ in range(5)]
    m = LifecycleModel(make_store([*events, *orphans]))
    m.update()
    assert m.skipped == 5 and len(m.instances[0].iterations) == 2


def test_a_part_whose_details_do_not_fit_is_counted_once() -> None:
    events = FakeLifecycle(iterations=2).rank_events(0)
    payload = msgspec.to_builtins(FakeLifecycle().iteration(1, 3)[0])
    del payload["collectives"][0]["op"]  # its bytes read, its details not
    events.append(Event("lifecycle_iteration", 0, 3, 2000.0, payload))
    m = LifecycleModel(make_store(events))
    assert m.instances[0].iteration_count == 3 and m.skipped == 0
    assert m.instances[0].iterations[2].collectives == [] and m.skipped == 1
    m.collectives(0)
    assert m.skipped == 1


# -- the strip of a long run -------------------------------------------------------------
def long_run() -> LifecycleModel:
    return LifecycleModel(make_store(FakeLifecycle(iterations=1000, dropped_at=505).events()))


def test_a_long_strip_shares_columns_and_says_so() -> None:
    fig = figure_lifecycle(long_run())
    (heat,) = [t.to_plotly_json() for t in fig.data]
    assert len(heat["x"]) == MAX_COLUMNS == 100 and heat["x"][0] == "1–10"
    assert "1000 iteration(s)" in fig.layout.title.text
    assert "10 iterations per column, the worst state shown" in fig.layout.title.text
    dropped = list(heat["y"]).index("dropped forwards")
    bad = [c for c, z in enumerate(heat["z"][dropped]) if STATES[z] == "bad"]
    assert bad == [50]  # iterations 501..510
    assert "(first: 505)" in heat["hovertext"][dropped][50] and "text" not in heat


def test_a_window_shows_each_iteration_exactly() -> None:
    fig = figure_lifecycle(long_run(), window=(500, 510))
    (heat,) = [t.to_plotly_json() for t in fig.data]
    assert list(heat["x"]) == [str(i) for i in range(500, 511)]
    assert "11 iteration(s) (500..510 of 1000)" in fig.layout.title.text
    dropped = list(heat["y"]).index("dropped forwards")
    assert heat["text"][dropped] == ["0"] * 5 + ["1"] + ["0"] * 5


def test_the_view_window_selector_zooms_and_follows() -> None:
    short = LifecycleView(LifecycleModel(make_store(FakeLifecycle().events())))
    short.widget  # noqa: B018
    assert short.window_selector.layout.display == "none"
    view = LifecycleView(long_run())
    view.widget  # noqa: B018
    slider = view.window_selector
    assert slider.layout.display == "" and (slider.min, slider.max) == (1, 1000)
    assert view.chosen_window is None and "per column" in view.lifecycle_figure.layout.title.text
    slider.value = (500, 510)
    assert view.chosen_window == (500, 510)
    assert "(500..510 of 1000)" in view.lifecycle_figure.layout.title.text
    slider.value = (1, 1000)  # the whole range: every iteration, following new ones
    assert view.chosen_window is None
    given = LifecycleView(long_run(), window=(10, 20))
    given.widget  # noqa: B018
    assert tuple(given.window_selector.value) == (10, 20)
    assert "(10..20 of 1000)" in given.lifecycle_figure.layout.title.text


def test_the_view_redraws_strip_and_bytes_in_place() -> None:
    events = FakeLifecycle(iterations=200).events()
    store = make_store(events[:20])
    view = LifecycleView(LifecycleModel(store))
    view.widget  # noqa: B018
    (heat,) = view.lifecycle_figure.data
    bars = list(view.bytes_figure.data)
    assert heat.texttemplate == "%{text}" and "9 iteration(s)" in heat_title(view)
    store.extend(events[20:])
    view.refresh()
    assert view.lifecycle_figure.data[0] is heat and list(view.bytes_figure.data) == bars
    assert "200 iteration(s)" in heat_title(view) and "per column" in heat_title(view)
    assert heat.text is None and heat.texttemplate is None  # 100 columns: hover only
    sent = view.model.bytes_by_purpose(0)["gradients"]
    assert list(bars[0].y) == [sent] and sent == 200 * 4 * 4096


def heat_title(view: LifecycleView) -> str:
    return str(view.lifecycle_figure.layout.title.text)


@pytest.mark.parametrize(
    "payload",
    [
        {"iteration": 2**60, "ddp": 1, "forwards": 1, "dropped": 0, "backward": True},
        {"iteration": 1, "ddp": 1, "forwards": 1, "dropped": 0, "backward": True, "ready": [1]},
        {"iteration": 1, "ddp": 1, "forwards": -1, "dropped": 0, "backward": True},
        {
            "iteration": 1,
            "ddp": 1,
            "forwards": 1,
            "dropped": 0,
            "backward": True,
            "collectives": [{"nbytes": 1, "caller": "nobody"}],
        },
        "not a dict",
    ],
)
def test_a_bad_part_among_good_ones_in_a_bulk_update_is_skipped(payload: Any) -> None:
    events = FakeLifecycle(iterations=4).rank_events(0)
    store = make_store(events[:1])  # the watch
    m = LifecycleModel(store)
    m.update()
    store.extend([*events[1:3], Event("lifecycle_iteration", 0, 1, 2000.0, payload), *events[3:]])
    assert m.update() and m.skipped == 1
    assert [it.index for it in m.instances[0].iterations] == [1, 2, 3, 4]
