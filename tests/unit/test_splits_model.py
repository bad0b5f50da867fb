"""SplitsModel fed with synthetic split events (``interactive_shard.testing``), no ranks."""

from __future__ import annotations

import msgspec
import pytest
import torch
from support import make_store

from interactive_shard.splits.events import Partition, SplitCompile, SplitNothing
from interactive_shard.splits.model import SplitsModel
from interactive_shard.splits.plan import MIB, SplitPlan, SplitPlanError, caps, plan_graph
from interactive_shard.telemetry.schema import Event
from interactive_shard.testing import (
    DDP_BREAK_REASON,
    NOTHING_REASON,
    FakeRun,
    FakeSplits,
    mlp_graph,
    split_event,
    split_net,
    split_net_params,
    traced_graph,
)

AUTOCAST = "torch.bfloat16"


def graph(layers: int = 6) -> FakeSplits:
    """Six 256-wide layers (257 KiB each) under autocast, a no_grad tail: 1 MiB cuts it in 2."""
    return FakeSplits(mlp_graph(layers, 256, autocast=AUTOCAST, no_grad=True), bucket_cap_mb=1)


def model_of(*events: Event) -> SplitsModel:
    return SplitsModel(make_store(events))


def altered(comp: SplitCompile, position: int, **changes: object) -> SplitCompile:
    parts = list(comp.partitions)
    parts[position] = msgspec.structs.replace(parts[position], **changes)
    return msgspec.structs.replace(comp, partitions=parts)


# -- the synthetic events are the real thing --------------------------------------------------
@pytest.mark.parametrize(
    ("autocast", "no_grad"), [(None, False), (AUTOCAST, False), (None, True), (AUTOCAST, True)]
)
def test_mlp_graph_is_the_graph_dynamo_traces(autocast: str | None, no_grad: bool) -> None:
    net = split_net(3, 8, autocast=autocast, no_grad=no_grad)
    assert mlp_graph(3, 8, autocast=autocast, no_grad=no_grad) == traced_graph(
        net, torch.randn(2, 8)
    )
    fqns = [n for n, _ in net.named_parameters()]
    assert fqns == [p.fqn for p in split_net_params(3, 8)]


def test_fake_compile_is_the_planners_partitions_with_what_the_probe_adds() -> None:
    fake = graph()
    comp = fake.compile()
    cap, first = caps(1, None)
    planned = plan_graph(fake.graph, cap, first)
    assert [p.fqns for p in comp.partitions] == [p.fqns for p in planned.partitions]
    assert [p.targets for p in comp.partitions] == [p.targets for p in planned.partitions]
    first_part, second = comp.partitions
    assert first_part.outputs == ["x_1"] and "x_1" in second.inputs  # the value crossing
    assert "l_x_" in first_part.inputs and "l_x_" not in second.inputs
    assert second.outputs == ["linear_6"]  # the head: the graph's output
    assert second.code.startswith(f"def forward(self, {', '.join(second.inputs)}):")
    assert "torch.amp.autocast_mode._enter_autocast('cpu', torch.bfloat16" in second.code
    assert all(p.compile_s > 0 for p in comp.partitions)
    assert comp.break_reasons == [DDP_BREAK_REASON] * 2 and "submod_1" in comp.parent


def test_events_survive_a_recording_round_trip() -> None:
    events = graph().events()
    wire = msgspec.json.decode(msgspec.json.encode(events), type=list[Event])
    model = model_of(*wire)
    assert model.skipped == 0 and model.ranks == [0, 1]
    assert model.compilations(1)[0] == msgspec.structs.replace(model.compilations(0)[0], rank=1)


# -- consuming events -------------------------------------------------------------------------
def test_model_keeps_every_rank_compiles_in_order_and_a_nothing() -> None:
    fake = FakeSplits(mlp_graph(2, 8), world_size=3, compiles=2, nothing={2: NOTHING_REASON})
    model = model_of(*fake.events())
    assert model.ranks == [0, 1, 2]
    assert [c.index for c in model.compilations(0)] == [0, 1]
    assert [c.rank for c in model.compilations(1)] == [1, 1]
    assert model.compilations(2) == [] and model.latest(2) is None
    assert model.nothing(2) == NOTHING_REASON and model.nothing(0) is None
    assert "dynamo skips frames inside torch.nn" in NOTHING_REASON
    latest = model.latest(0)
    assert latest is not None and latest.index == 1
    assert not latest.split and len(latest.partitions) == 1  # 8-wide: one bucket, whole


def test_malformed_events_are_skipped_and_counted() -> None:
    good = graph().compile()
    payload = msgspec.to_builtins(good)
    no_graph = {k: v for k, v in payload.items() if k != "graph"}
    bad_index = {**payload, "index": -1}
    bad_part = {**payload, "partitions": [{"index": 0, "name": "submod_0"}]}
    events = [
        Event(SplitCompile.KIND, 0, 0, 1.0, no_graph),
        Event(SplitCompile.KIND, 0, 0, 2.0, bad_index),
        Event(SplitCompile.KIND, 0, 0, 3.0, bad_part),
        Event(SplitNothing.KIND, 1, 0, 4.0, {"reason": "x", "calls": 0}),  # calls >= 1
        Event("log", 0, 0, 5.0, {"text": "not a split event"}),  # not ours: not counted
        split_event(good, 0, 6.0),
    ]
    model = model_of(*events)
    assert model.update() is True and model.skipped == 1  # compiles wait to be read
    assert model.count(0) == 4 and model.compilation(0, 1) is None and model.skipped == 2
    assert [c.index for c in model.compilations(0)] == [0] and model.skipped == 4
    assert model.nothing(1) is None and model.ranks == [0]
    n = len(good.partitions)  # the selector's labels, read off the events undecoded
    b = good.backend
    assert model.headers(0) == [(0, n, b), (-1, n, b), (0, 1, b), (0, n, b)]


def test_compiles_are_decoded_when_read_not_when_they_arrive(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake = graph()
    model = model_of(*[split_event(fake.compile(i), 0, 1000.0 + i) for i in range(50)])
    decoded: list[Event] = []
    decode = model._events.decode
    monkeypatch.setattr(model._events, "decode", lambda e: decoded.append(e) or decode(e))
    assert model.update() and model.count(0) == 50 and decoded == []
    assert [h[0] for h in model.headers(0)] == list(range(50)) and decoded == []
    latest = model.latest(0)
    assert latest is not None and latest.index == 49 and len(decoded) == 1
    assert model.content(0, 3) == model.content(0, -1)  # recompiles: one content, two indices
    assert model.plan(0, 3).partitions == plan_graph(fake.graph, MIB, MIB).partitions
    assert len(decoded) == 2  # compile 3
    assert [c.index for c in model.compilations(0)] == list(range(50)) and len(decoded) == 50
    model.compilations(0)
    assert len(decoded) == 50  # each decoded once


def test_revision_grows_only_when_split_data_arrives() -> None:
    fake = graph()
    model = model_of()
    assert model.update() is False and model.revision == 0
    model.store.append(Event("log", 0, 0, 1.0, {"text": "hello"}))
    assert model.update() is False and model.revision == 0
    model.store.append(split_event(fake.compile(0), 0))
    assert model.update() is True and model.revision == 1
    assert model.update() is False and model.revision == 1
    model.store.extend([split_event(fake.compile(1), 0), split_event(fake.compile(0), 1)])
    assert model.compilations(0)[-1].index == 1  # reading brings it up to date
    assert model.revision == 2 and model.ranks == [0, 1]


# -- planned vs captured ----------------------------------------------------------------------
def test_captured_equals_planned_for_the_fake_run() -> None:
    model = model_of(*graph().events())
    result = model.compare()
    assert result.matches and result.differences == []
    assert "matches" in repr(result)


def test_an_altered_partition_is_named_in_the_differences() -> None:
    comp = graph().compile()
    dropped = comp.partitions[1].fqns[-1]
    wrong = altered(comp, 1, fqns=comp.partitions[1].fqns[:-1])
    model = model_of(split_event(wrong, 0))
    result = model.compare()
    assert not result.matches
    (line,) = result.differences
    assert line.startswith("rank 0, compile 0, partition 1 (submod_1): parameters planned")
    assert (
        repr(dropped) in line.split("captured")[0]
        and repr(dropped) not in line.split("captured")[1]
    )


def test_a_partition_compiled_outside_its_autocast_region_is_caught() -> None:
    """PR 113374's bug, undone by hand: partition 1 without its _enter/_exit copies."""
    comp = graph().compile()
    second = comp.partitions[1]
    calls = [c for c in second.calls if c.state is None or c.state.call == "set_grad"]
    undone = altered(comp, 1, calls=calls, regions=[r for r in second.regions if r.kind == "grad"])
    differences = model_of(split_event(undone, 0)).compare().differences
    assert len(differences) == 2
    calls_line, regions_line = differences
    assert "partition 1 (submod_1): calls differ from call 0" in calls_line
    assert "planned torch.amp.autocast_mode._enter_autocast, captured torch._C._nn.linear" in (
        calls_line
    )
    assert "regions planned ['autocast(cpu, torch.bfloat16) [enters, exits]'" in regions_line


def test_compare_with_a_plan_at_other_caps_and_with_a_nothing_plan() -> None:
    fake = graph()
    model = model_of(*fake.events())
    other = model.plan(0, 0, bucket_cap_mb=0.5, first_bucket_cap_mb=0.25)
    result = model.compare(other, rank=0)
    assert not result.matches
    first = "rank 0, compile 0: caps planned 512 KiB (first 256 KiB)"
    assert result.differences[0].startswith(first)
    assert any(
        f"{len(other.partitions)} partition(s) planned, 2 captured" in d for d in result.differences
    )
    nothing = SplitPlan([], MIB, MIB, nothing=NOTHING_REASON)
    (line,) = model.compare(nothing, rank=1).differences
    assert "the plan says nothing is compiled" in line and "the rank compiled" in line


def test_a_rank_that_compiled_nothing_is_a_difference_and_no_rank_says_so() -> None:
    model = model_of(*FakeSplits(mlp_graph(2, 8), nothing={1: NOTHING_REASON}).events())
    (line,) = model.compare().differences
    assert line.startswith("rank 1: compiled nothing (dynamo skips frames inside torch.nn")
    assert model.compare(rank=0).matches
    empty = model_of().compare()
    assert not empty.matches and "no rank reported" in empty.differences[0]


# -- what-if caps -----------------------------------------------------------------------------
def test_what_if_caps_replan_the_captured_graph() -> None:
    model = model_of(*FakeSplits(mlp_graph(8, 256), bucket_cap_mb=25).events())
    assert len(model.plan(0).partitions) == 2  # the 1 MiB first bucket, then the rest
    counts = [
        len(model.plan(0, bucket_cap_mb=mb, first_bucket_cap_mb=0.25).partitions)
        for mb in (0.25, 0.5, 1, 2, 4)
    ]
    assert counts == [8, 5, 3, 2, 2]  # smaller cap: more pieces
    small = model.plan(0, bucket_cap_mb=0.25, first_bucket_cap_mb=0.25)
    assert [p.fqns for p in small.partitions][:2] == [
        ["layers.0.weight", "layers.0.bias"],
        ["layers.1.weight", "layers.1.bias"],
    ]  # one 257 KiB layer a piece, the head with the last one
    assert small.partitions[-1].fqns == [
        "head.weight",
        "head.bias",
        "layers.7.weight",
        "layers.7.bias",
    ]
    captured = model.latest(0)
    assert captured is not None
    assert sum(p.nbytes for p in small.partitions) == sum(p.nbytes for p in captured.partitions)


def test_a_cap_below_the_first_bucket_cap_is_refused_with_the_fix() -> None:
    model = model_of(*graph().events())
    with pytest.raises(SplitPlanError, match="First bucket should be smaller/equal"):
        model.plan(0, bucket_cap_mb=0.5)
    with pytest.raises(SplitPlanError, match="give a positive size"):
        model.plan(0, bucket_cap_mb=0)
    with pytest.raises(LookupError, match="rank 3 reported no compile"):
        model.plan(3)


# -- compile time vs run time -----------------------------------------------------------------
def test_versus_runtime_reads_the_runs_bucket_map() -> None:
    fake = graph()
    ddp = FakeRun(split_net_params(6, 256), bucket_cap_mb=1, iterations=2)
    model = model_of(*fake.events())
    lines = model.versus_runtime(0)
    assert lines[0].startswith("DDPOptimizer (compile time): 2 partition(s), cap 1 MiB")
    assert lines[1].startswith("DDP (run time): no bucket observed yet")
    model.store.extend(ddp.events())  # the bucket map arrives after the compile
    lines = model.versus_runtime(0)
    assert lines[1].startswith("DDP (run time): 2 bucket(s), cap 1 MiB, first bucket 1 MiB")
    assert "Same groups of parameters" in lines[2]
    assert model_of().versus_runtime(0) == ["no compile captured yet"]


def test_versus_runtime_names_a_ddp_bucket_spanning_partitions() -> None:
    fake = FakeSplits(mlp_graph(6, 256), bucket_cap_mb=1)
    ddp = FakeRun(split_net_params(6, 256), bucket_cap_mb=2, iterations=1)  # 2 MiB buckets
    model = model_of(*fake.events(), *ddp.events())
    lines = model.versus_runtime(0)
    assert "DDP (run time): 1 bucket(s)" in lines[1]
    assert any(
        line.startswith("DDP bucket 0 holds gradients of partitions [0, 1]") for line in lines
    )
    assert lines[-1].startswith("The groups differ")


def test_partition_records_keep_their_shape() -> None:
    part = graph().compile().partitions[0]
    assert isinstance(part, Partition) and part.targets == [c.target for c in part.calls]
    assert [r.describe() for r in part.regions] == ["autocast(cpu, torch.bfloat16) [enters, exits]"]
