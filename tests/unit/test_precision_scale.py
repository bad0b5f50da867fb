"""PrecisionModel on a long run (issue 12): batches are decoded when an iteration they hold
is read, not when they arrive (Note [Lazy precision batches]); whatever is read, and the
selected iteration, stays exact."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from support import make_store

from interactive_shard.precision import _batches
from interactive_shard.precision.events import PrecisionCollective, PrecisionSeen
from interactive_shard.precision.model import PrecisionModel
from interactive_shard.precision.view import PrecisionView
from interactive_shard.telemetry.schema import Event
from interactive_shard.testing import FakePrecision, fsdp2_policy, mp_net, precision_batch

F32, BF16 = "torch.float32", "torch.bfloat16"
UNIFORM = {k: fsdp2_policy("bf16", "fp32") for k in ("", "1", "2")}


def long_run(iterations: int, world_size: int = 2, *, odd: int | None = None) -> list[Event]:
    """FakePrecision's watches, then its last iteration's batches re-numbered for every
    iteration (what benchmarks/bench_views.py does); in iteration ``odd`` unit 1 computes
    in fp32 (a different iteration somewhere in the middle: a finding)."""
    fake = FakePrecision(mp_net(UNIFORM), world_size=world_size, iterations=2)
    made = fake.events()
    out = [e for e in made if e.kind == "precision_watch"]
    last = [e for e in made if e.kind == "precision_batch" and e.step == 2]
    for it in range(1, iterations + 1):
        for e in last:
            payload = {k: [{**r, "iteration": it} for r in v] for k, v in e.payload.items()}
            if it == odd:
                for r in payload["seen"]:
                    if (r["unit"], r["phase"]) == ("1", "param"):
                        r["dtypes"] = [F32]
            out.append(Event(e.kind, e.rank, it, 1000.0 + it + e.rank * 1e-3, payload))
    return out


@pytest.fixture
def decoded(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Every batch payload decoded, in order."""
    seen: list[Any] = []
    convert = msgspec.convert

    def counting(obj: Any, type: Any, **kw: Any) -> Any:
        if type is _batches.PrecisionBatch:
            seen.append(obj)
        return convert(obj, type, **kw)

    monkeypatch.setattr(_batches.msgspec, "convert", counting)
    return seen


def test_an_update_decodes_nothing_and_reading_decodes_one_iteration(decoded: list[Any]) -> None:
    store = make_store(long_run(3000))
    m = PrecisionModel(store)
    assert m.update() and decoded == []
    assert m.ranks == [0, 1] and m.latest() == 3000 and m.latest(1) == 3000 and decoded == []
    assert m.observed("1", rank=1, iteration=3000)["reduce"] == F32
    assert len(decoded) == 1  # rank 1's batch of its latest iteration
    m.observed("2", rank=1, iteration=3000)
    m.collectives(rank=1, iteration=3000)
    assert len(decoded) == 1  # read once, then from the cache


@pytest.mark.parametrize("iteration", [1, 2, 1499, 1500, 1501, 2999, 3000])
def test_any_iteration_reads_exactly_its_own_records(iteration: int) -> None:
    m = PrecisionModel(make_store(long_run(3000, odd=1500)))
    param = m.observed("1", rank=0, iteration=iteration)["param"]
    assert param == (F32 if iteration == 1500 else BF16)
    seen = m.seen("1", rank=1, iteration=iteration)
    assert seen and {s.iteration for s in seen} == {iteration}
    assert {c.iteration for c in m.collectives(rank=0, iteration=iteration)} == {iteration}
    assert m.observed("1", rank=0, iteration=3001) == {}  # none yet


def test_iterations_and_findings_read_everything_once_asked(decoded: list[Any]) -> None:
    m = PrecisionModel(make_store(long_run(3000, odd=1500)))
    assert m.findings_read([(0, 3000)]) == [] and m.findings_count == 1
    assert m.iterations == list(range(1, 3001))
    found = {(f.kind, f.unit, f.iterations, f.ranks) for f in m.findings}  # all read
    assert found == {  # the odd iteration's, on both ranks
        ("full_precision", "1", (1500,), (0, 1)),
        ("uncast_input", "1", (1500,), (0, 1)),
    }
    assert m.findings_count == 6000
    # decoded: per rank the first of its kind and the odd one, not the 2998 repeats
    assert len(decoded) <= 6
    assert m.findings_read() == m.findings  # the view's findings now know them all


def test_new_batches_after_an_index_are_found_by_the_walk() -> None:
    events = long_run(1200)
    store = make_store(events[: len(events) // 2])
    m = PrecisionModel(store)
    assert m.iterations == list(range(1, 601))  # rank 0's 600, rank 1's 599: all indexed
    store.extend(events[len(events) // 2 :])
    assert m.latest(0) == 1200 and m.observed("2", rank=0, iteration=1100)["param"] == BF16
    assert m.iterations == list(range(1, 1201))


def test_a_batch_split_over_two_events_and_one_spanning_two_iterations() -> None:
    records = [
        PrecisionSeen(iteration=1, unit="1", phase="param", dtypes=[BF16]),
        PrecisionSeen(iteration=1, unit="1", phase="grad", dtypes=[BF16]),
    ]
    spanning = [
        PrecisionSeen(iteration=1, unit="1", phase="sharded_param", dtypes=[F32]),
        PrecisionSeen(iteration=2, unit="1", phase="param", dtypes=[F32]),
    ]
    reduce = PrecisionCollective(
        iteration=2, unit="1", op="reduce_scatter", dtype=F32, nbytes=8, backward=True
    )
    m = PrecisionModel(
        make_store(
            [
                precision_batch(records, t=1.0),
                precision_batch([*spanning, reduce], t=2.0),
            ]
        )
    )
    assert m.observed("1", iteration=1) == {"param": BF16, "grad": BF16, "sharded_param": F32}
    assert m.observed("1", iteration=2) == {"param": F32, "reduce": F32}
    assert m.iterations == [1, 2] and m.latest() == 2 and m.skipped == 0


def test_watching_again_in_the_middle_of_one_update_drops_what_came_before() -> None:
    first = long_run(700)
    again = [
        Event(e.kind, e.rank, e.step, e.t + 5000.0, e.payload) for e in long_run(3)
    ]  # its watches come first: they start both ranks over
    m = PrecisionModel(make_store([*first, *again]))
    assert m.latest(0) == 3 and m.iterations == [1, 2, 3]
    assert m.observed("1", rank=1, iteration=2)["param"] == BF16


def test_a_rank_seen_only_in_the_middle_of_an_update_is_found_once_handed_out() -> None:
    lone = PrecisionSeen(iteration=1, unit="ghost", phase="param", dtypes=[F32])
    events = long_run(400, world_size=1)
    middle = len(events) // 2
    stream = [*events[:middle], precision_batch([lone], rank=5, t=1.0), *events[middle:]]
    m = PrecisionModel(make_store(stream))
    assert m.ranks == [0]  # rank 5 sent no watch and is at neither end of the update
    assert m.iterations == list(range(1, 401))  # every batch handed out
    assert m.ranks == [0, 5] and m.observed("ghost", rank=5) == {"param": F32}


def test_the_view_on_a_long_run_reads_a_few_iterations_and_says_so(decoded: list[Any]) -> None:
    m = PrecisionModel(make_store(long_run(3000, odd=1500)))
    view = PrecisionView(m)
    view.widget  # noqa: B018
    assert len(decoded) <= 8  # the latest, the first (findings) per rank: not 6000
    assert view.iteration == 3000 and view.iteration_selector.max == 3000
    assert "3000 iteration(s)" in view.status_html.value
    text = view.findings_html.value
    assert "none" in text and "of 6,000 rank-iterations read" in text
    view.iteration_selector.value = 1500  # the selected iteration is exact
    assert view.iteration == 1500 and "iteration 1500" in view.grid_figure.layout.title.text
    assert "full_precision</b> at <b>1</b>" in view.findings_html.value  # the shown one read
