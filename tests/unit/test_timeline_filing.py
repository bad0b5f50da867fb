"""How the timeline model files batches: by ``Event.step`` when the rank's watch says
it is the iteration (the payload unread until the iteration is), by the payload's
``iteration`` in recordings made before that (their step was the user's ctx.step)."""

from __future__ import annotations

import msgspec
from support import make_store

from interactive_shard.telemetry.schema import Event
from interactive_shard.testing import FakeTimeline
from interactive_shard.timeline.events import TimelineSpans, TimelineWatch
from interactive_shard.timeline.model import TimelineModel


def old_recording(fake: FakeTimeline, step: int) -> list[Event]:
    """``fake``'s events as a probe before ``step_is_iteration`` sent them: the watch
    without the field, every batch at the user's step ``step``."""
    out = []
    for e in fake.events():
        payload = dict(e.payload)
        if e.kind == TimelineWatch.KIND:
            del payload["step_is_iteration"]
        out.append(Event(e.kind, e.rank, step, e.t, payload))
    return out


def test_batches_are_filed_by_step_without_reading_their_payload() -> None:
    fake = FakeTimeline(iterations=3)
    events = fake.events()
    assert all(e.step == e.payload["iteration"] for e in events if e.kind == TimelineSpans.KIND)
    # Payloads a filing that read them would refuse: filed by their steps all the same.
    odd = [Event(TimelineSpans.KIND, 0, 5, 9.0, {}), Event(TimelineSpans.KIND, 1, 6, 9.0, [])]  # type: ignore[arg-type]
    m = TimelineModel(make_store([*events, *odd]))
    assert m.iterations(0) == [1, 2, 3, 5] and m.iterations(1) == [1, 2, 3, 6]
    assert m.skipped == 0  # not read yet
    assert m.spans(0, 5) == [] and m.spans(1, 6) == [] and m.skipped == 2  # read: counted


def test_a_batch_whose_step_is_not_its_iteration_is_counted_not_shown() -> None:
    fake = FakeTimeline(iterations=2)
    events = fake.events()
    batch = next(e for e in events if e.kind == TimelineSpans.KIND and e.rank == 0)
    wrong = Event(batch.kind, 0, 7, batch.t, batch.payload)  # payload: iteration 1
    m = TimelineModel(make_store([*events, wrong]))
    assert m.iterations(0) == [1, 2, 7]
    assert m.spans(0, 7) == [] and m.skipped == 1
    assert len(m.spans(0, 1)) == 15 and m.skipped == 1  # the real iteration 1 is intact


def test_an_old_recording_is_filed_by_the_payloads_iteration() -> None:
    fake = FakeTimeline(iterations=4)
    old = TimelineModel(make_store(old_recording(fake, step=0)))
    new = TimelineModel(make_store(fake.events()))
    assert old.iterations() == new.iterations() == [1, 2, 3, 4]
    assert old.watch(0) is not None and old.watch(0).step_is_iteration is False  # type: ignore[union-attr]
    for r in (0, 1):
        for it in (1, 4):
            assert old.spans(r, it) == new.spans(r, it) and old.summary(r, it) == new.summary(r, it)
    assert old.skipped == new.skipped == 0


def test_an_update_files_only_what_arrived_since_the_last() -> None:
    events = FakeTimeline(iterations=30).events()
    store = make_store(events[:21])
    m = TimelineModel(store)
    assert m.update() is True and m.iterations() == list(range(1, 11))

    def filed(r: int) -> dict[int, list[int]]:  # iteration -> its batches' log positions
        here = m._index.ranks[r]
        return {it: here.positions(it) for it in here.iterations()}

    before = {r: filed(r) for r in m.ranks}
    store.extend(events[21:])
    assert m.update() is True and m.count() == 30
    for r, was in before.items():  # the earlier batches kept, the new ones after them
        now = filed(r)
        assert list(now)[: len(was)] == list(was) and all(now[it] == p for it, p in was.items())
        assert min(p for it, ps in now.items() if it not in was for p in ps) >= 21
    assert m.update() is False and m.skipped == 0
    assert msgspec.convert(events[-1].payload, TimelineSpans).iteration == m.latest()
