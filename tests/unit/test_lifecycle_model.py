"""LifecycleModel from synthetic events (``testing.FakeLifecycle``), as the probe sends them."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from support import make_store

from interactive_shard.ddp.events import LifecycleIteration
from interactive_shard.ddp.model import PURPOSE_ORDER, LifecycleModel
from interactive_shard.telemetry.schema import Event
from interactive_shard.testing import FakeLifecycle

PARAMS = ["0.weight", "0.bias", "1.weight", "1.bias"]


def model_of(fake: FakeLifecycle) -> LifecycleModel:
    return LifecycleModel(make_store(fake.events()))


def kinds(m: LifecycleModel) -> list[str]:
    return [f.kind for f in m.findings]


def test_an_instance_with_its_settings_hooks_and_iterations() -> None:
    m = model_of(FakeLifecycle())
    assert m.ranks == [0, 1] and m.skipped == 0 and m.revision == 1
    (inst,) = m.instances
    assert inst.serial == 1 and inst.rank == 0 and m.instances_of(1)[0].rank == 1
    s = inst.settings
    assert s["static_graph"] is False and s["forward_sync_buffers"] is True and s["delayed"] == []
    assert inst.hooks == dict.fromkeys(PARAMS, 1)
    (built,) = inst.construction
    assert (built.purpose, built.op, built.iteration) == ("construction", "broadcast", 0)
    assert built.nbytes == 4 * 4096 + 256  # parameters and buffers
    assert [it.index for it in inst.iterations] == [1, 2, 3]
    it = inst.iterations[0]
    assert (it.forwards, it.dropped, it.backward, it.finished) == (1, 0, True, True)
    assert it.ready == PARAMS[::-1] and it.waited_for == [] and it.walk_s is None
    assert it.buffer_bytes == 256 and it.delayed == [] and it.delayed_bytes == 0
    assert kinds(m) == ["static_graph_safe"]


def test_iteration_parts_merge_into_one_iteration() -> None:
    whole, split = FakeLifecycle(forwards=2), FakeLifecycle(forwards=2, split=True)
    assert len(split.iteration(1, 1)) == 2
    a, b = model_of(whole).instances[0], model_of(split).instances[0]
    for x, y in zip(a.iterations, b.iterations, strict=True):
        assert (x.index, x.forwards, x.backward, x.finished) == (y.index, y.forwards, True, True)
        assert x.ready == y.ready and x.buffer_bytes == y.buffer_bytes == 512
        assert [c.nbytes for c in x.collectives] == [c.nbytes for c in y.collectives]


def test_purposes_and_bytes_by_purpose() -> None:
    fake = FakeLifecycle(delayed=["0.weight"], hook_param="1.bias", iterations=2)
    m = model_of(fake)
    inst = m.instances[0]
    assert inst.settings["delayed"] == ["0.weight"] and inst.hooks["0.weight"] == 0
    assert inst.hooks["1.bias"] == 2  # its Reducer hook and the delayed all-reduce hook
    purposes = [c.purpose for c in m.collectives(rank=0)]
    assert purposes[0] == "construction"
    assert purposes[1:5] == ["buffers", "gradients", "gradients", "delayed"]
    it = inst.iterations[0]
    assert it.delayed == ["0.weight"] and it.delayed_bytes == 4096
    sent = m.bytes_by_purpose(rank=0)
    assert list(sent) == list(PURPOSE_ORDER)
    assert sent == {
        "gradients": 2 * 3 * 4096,
        "buffers": 2 * 256,
        "construction": 3 * 4096 + 256,
        "delayed": 2 * 4096,
        "other": 0,
    }
    assert m.bytes_by_purpose(rank=0, ddp=2) == dict.fromkeys(PURPOSE_ORDER, 0)


def test_no_buffer_broadcast_when_broadcast_buffers_is_off() -> None:
    m = model_of(FakeLifecycle(broadcast_buffers=False))
    inst = m.instances[0]
    assert inst.settings["forward_sync_buffers"] is False
    assert inst.construction[0].nbytes == 4 * 4096  # parameters only
    assert all(it.buffer_bytes == 0 for it in inst.iterations)


def test_checks_merge_over_ranks() -> None:
    m = model_of(FakeLifecycle(unused=["0.bias"], dropped_at=2))
    errors = [f for f in m.findings if f.level == "error"]
    assert [(f.kind, f.iteration) for f in errors] == [
        ("unfinished", 1),
        ("forward_without_backward", 2),
        ("unfinished", 2),
        ("unfinished", 3),
    ]
    assert all(f.ranks == [0, 1] and f.ddp == 1 for f in errors)
    assert (
        errors[0].fqns == ["0.bias"] and "Expected to have finished reduction" in errors[0].message
    )
    it = m.instances[0].iteration(2)
    assert it is not None and (it.forwards, it.dropped, it.finished) == (2, 1, False)
    assert it.waited_for == ["0.bias"]


def test_wrapped_twice_two_instances_and_double_hooks() -> None:
    m = model_of(FakeLifecycle(twice=True))
    first, second = m.instances
    assert (first.serial, second.serial) == (1, 2)
    assert first.hooks == dict.fromkeys(PARAMS, 1) and second.hooks == dict.fromkeys(PARAMS, 2)
    (double,) = [f for f in m.findings if f.kind == "double_hooks"]
    assert double.ddp == 2 and double.fqns == PARAMS and double.ranks == [0, 1]
    assert "_remove_autograd_hooks" in double.message
    assert len(second.iterations) == 3 and m.collectives(0, ddp=2)[0].purpose == "construction"


# -- advice ----------------------------------------------------------------------------------
def test_static_graph_safe_fires_for_the_same_order_and_one_forward() -> None:
    (f,) = [f for f in model_of(FakeLifecycle()).findings if f.kind == "static_graph_safe"]
    assert f.level == "info" and f.ddp == 1 and f.iteration is None
    assert "static_graph=True would be safe" in f.message and "iterations 2..3" in f.message


@pytest.mark.parametrize(
    "fake",
    [
        FakeLifecycle(static_graph=True),
        FakeLifecycle(shuffled=True),
        FakeLifecycle(forwards=2),
        FakeLifecycle(iterations=1),
    ],
    ids=["already-static", "orders-differ", "two-forwards", "one-iteration"],
)
def test_static_graph_safe_stays_quiet(fake: FakeLifecycle) -> None:
    assert "static_graph_safe" not in kinds(model_of(fake))


def test_static_graph_safe_ignores_the_first_iterations_order() -> None:
    fake = FakeLifecycle()
    events = fake.events()
    for e in events:  # the first iteration's order differs: DDP's rebuilt buckets
        if e.kind == LifecycleIteration.KIND and e.payload["iteration"] == 1:
            e.payload["ready"] = list(reversed(e.payload["ready"]))
    assert "static_graph_safe" in kinds(LifecycleModel(make_store(events)))


def test_find_unused_cost_says_whether_it_is_needed() -> None:
    m = model_of(FakeLifecycle(find_unused_parameters=True))
    (f,) = [f for f in m.findings if f.kind == "find_unused_cost"]
    assert "0.4 ms per iteration" in f.message and "find_unused_parameters=False saves" in f.message
    assert f.fqns == [] and m.instances[0].iterations[0].walk_s == pytest.approx(0.0004)
    m = model_of(FakeLifecycle(find_unused_parameters=True, unused=["0.bias"]))
    (f,) = [f for f in m.findings if f.kind == "find_unused_cost"]
    assert "['0.bias'] were unused, so it is needed" in f.message and f.fqns == ["0.bias"]
    assert m.instances[0].iterations[0].finished is True  # the walk found it: no check
    assert "unfinished" not in kinds(m)
    assert "find_unused_cost" not in kinds(model_of(FakeLifecycle()))


# -- robustness and incremental updates ------------------------------------------------------
HOSTILE: list[tuple[str, Any]] = [
    ("lifecycle_watch", {"ddp": 1}),
    ("lifecycle_watch", "not a dict"),
    (
        "lifecycle_iteration",
        {"iteration": 1, "ddp": 9, "forwards": 1, "dropped": 0, "backward": True},
    ),
    (
        "lifecycle_iteration",
        {"iteration": -1, "ddp": 1, "forwards": 1, "dropped": 0, "backward": True},
    ),
    ("lifecycle_check", {"check": "exploded", "iteration": 1, "ddp": 1, "fqns": [], "message": ""}),
    (
        "lifecycle_check",
        {"check": "unfinished", "iteration": 1, "ddp": 1, "fqns": [1], "message": ""},
    ),
]


def test_hostile_payloads_are_skipped_and_counted() -> None:
    events = FakeLifecycle(iterations=2).events()
    bad = [Event(kind, 0, 1, 2000.0, payload) for kind, payload in HOSTILE]
    m = LifecycleModel(make_store([*events, *bad]))
    m.update()
    assert m.skipped == len(HOSTILE) and len(m.instances[0].iterations) == 2
    assert [f.kind for f in m.findings if f.level == "error"] == []


def test_watched_again_keeps_the_history() -> None:
    fake = FakeLifecycle(iterations=2)
    store = make_store(fake.rank_events(0))
    m = LifecycleModel(store)
    assert [it.index for it in m.instances[0].iterations] == [1, 2]
    again = msgspec.structs.replace(fake.watch(), static_graph=True)
    store.append(Event("lifecycle_watch", 0, 0, 2000.0, msgspec.to_builtins(again)))
    # A later cluster.run, same probe: its iterations go on counting.
    (part,) = fake.iteration(1, 3)
    store.append(Event("lifecycle_iteration", 0, 3, 2001.0, msgspec.to_builtins(part)))
    inst = m.instances[0]
    assert inst.settings["static_graph"] is True and [it.index for it in inst.iterations] == [
        1,
        2,
        3,
    ]
    # A new probe (ish.watch again) counts from 1 again: put after the history.
    store.append(Event("lifecycle_watch", 0, 0, 2002.0, msgspec.to_builtins(again)))
    for index in (1, 2):
        for part in fake.iteration(1, index):
            store.append(Event("lifecycle_iteration", 0, index, 2003.0, msgspec.to_builtins(part)))
    assert [it.index for it in m.instances[0].iterations] == [1, 2, 3, 4, 5]
    assert all(it.forwards == 1 for it in m.instances[0].iterations)
    assert {c.iteration for c in m.instances[0].iterations[-1].collectives} == {5}


def test_update_consumes_only_new_events() -> None:
    events = FakeLifecycle().events()
    store = make_store(events[:4])
    m = LifecycleModel(store)
    assert m.update() and m.revision == 1 and not m.update() and m.revision == 1
    store.append(Event("log", 0, 0, 1.0, {"text": "not a lifecycle event"}))
    assert not m.update() and m.revision == 1
    store.extend(events[4:])
    assert m.update() and m.revision == 2
    assert len(m.instances[0].iterations) == 3 and len(m.instances_of(1)[0].iterations) == 3
    assert "instances=1, iterations=3" in repr(m)
