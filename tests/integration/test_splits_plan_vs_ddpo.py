"""The split planner against torch's own DDPOptimizer, in this process (no ranks).

Each case traces a model with dynamo (a backend that keeps the graph), then runs the
real ``torch._dynamo.backends.distributed.DDPOptimizer(cap, backend, first)`` on that
graph with a backend that keeps every partition ``GraphModule`` it is handed, and checks
that ``plan_graph(graph_nodes(gm, model), cap, first)`` says the same: how many
partitions, in which order, the fqns and bytes of each bucket (``ddpo.buckets``), the
call targets of each partition (with the global-state copies ``split_module`` put in)
and the regions they enter and leave. Partition fqns are read off DDPOptimizer's
bucket names through dynamo's own source names (``Source.name``, what guards
evaluate), not through ``_graph.param_fqns``, so the mapping is checked too.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import fx, nn
from torch._dynamo.backends.distributed import DDPOptimizer

import interactive_shard as ish
from interactive_shard.splits._graph import calls_of, graph_nodes
from interactive_shard.splits.events import Call, GraphNode, Partition
from interactive_shard.splits.plan import (
    MIB,
    SplitPlanError,
    plan_graph,
    regions_of,
)

LIN600 = 600 * 600 * 4 + 600 * 4  # bytes of a Linear(600, 600): above DDPOptimizer's 1 MiB
RELU = "torch.nn.functional.relu"  # nn.ReLU, inlined


@pytest.fixture(autouse=True)
def fresh_dynamo() -> Iterator[None]:
    # A new model of a class already traced would hit dynamo's cache (no backend call).
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()
    # DDPOptimizer runs the global-state calls of the graphs it splits: none may leak out
    # (ranks forked from this process later would inherit them).
    assert torch.is_grad_enabled() and not torch.is_autocast_enabled("cpu")


# -- the real engine -------------------------------------------------------------------------
@dataclass
class Traced:
    model: nn.Module
    gm: fx.GraphModule
    example_inputs: list[Any]
    nodes: list[GraphNode]


def trace_all(model: nn.Module, *args: Any) -> list[Traced]:
    """Every graph dynamo hands a backend for ``model(*args)``, in order."""
    graphs: list[Traced] = []

    def keep(gm: fx.GraphModule, example_inputs: list[Any]) -> Any:
        graphs.append(Traced(model, gm, example_inputs, graph_nodes(gm, model)))
        return gm.forward

    torch.compile(model, backend=keep, dynamic=False)(*args)
    return graphs


def trace(model: nn.Module, *args: Any) -> Traced:
    """The (single) graph dynamo hands a backend for ``model(*args)``."""
    graphs = trace_all(model, *args)
    assert len(graphs) == 1, f"{type(model).__name__}: {len(graphs)} graphs"
    return graphs[0]


@dataclass
class Real:
    """What DDPOptimizer did: its buckets and the partitions its backend received."""

    ddpo: DDPOptimizer
    names: list[str]  # partition names in execution order ("graph": compiled whole)
    calls: list[list[Call]]  # per partition, read when the backend got it
    fqns: dict[str, str]  # DDPOptimizer's bucket names -> the model's fqns


def source_fqns(traced: Traced) -> dict[str, str]:
    """Placeholder target -> fqn, by evaluating dynamo's source name (``L['self']...``)."""
    self_name = type(traced.model).forward.__code__.co_varnames[0]
    by_id = {}
    for name, p in traced.model.named_parameters(remove_duplicate=False):
        by_id.setdefault(id(p), name)
    out = {}
    for node in traced.gm.graph.find_nodes(op="placeholder"):
        source = node._dynamo_source.name
        if not source.startswith(f"L[{self_name!r}]"):
            continue  # an input
        value = eval(source, {"L": {self_name: traced.model}})
        if id(value) in by_id:
            out[str(node.target)] = by_id[id(value)]
    return out


def run_ddpo(traced: Traced, cap: int, first: int | None = None) -> Real:
    received: list[list[Call]] = []

    def backend(sub: fx.GraphModule, _inputs: list[Any], **_kw: Any) -> Any:
        received.append(calls_of(sub))
        return sub.forward

    ddpo = DDPOptimizer(cap, backend, first)
    result = ddpo.compile_fn(traced.gm, traced.example_inputs)
    if len(ddpo.buckets) == 1:
        names = ["graph"]
    else:
        names = [n.name for n in result.graph.nodes if n.op == "call_module"]
    assert len(names) == len(received)
    return Real(ddpo, names, received, source_fqns(traced))


def _state(c: Call) -> tuple[Any, ...]:
    # An exit copy names the enter copy of its own partition: compare what it does.
    s = c.state
    return (c.op, c.target) if s is None else (c.op, c.target, s.call, s.dtype, s.enabled)


def check(traced: Traced, cap: int, first: int | None = None) -> list[Partition]:
    """Planned == DDPOptimizer for ``traced`` at these caps; returns the planned partitions."""
    real = run_ddpo(traced, cap, first)
    planned = plan_graph(traced.nodes, cap, real.ddpo.first_bucket_cap).partitions
    where = f"{type(traced.model).__name__} cap={cap} first={first}"
    assert [p.name for p in planned] == real.names, where
    assert [p.index for p in planned] == list(range(len(planned)))
    for p, name, calls in zip(planned, real.names, real.calls, strict=True):
        at = f"{where} {name}"
        bucket = real.ddpo.buckets[0 if name == "graph" else int(name.rpartition("_")[2])]
        fqns = list(dict.fromkeys(real.fqns.get(n, n) for n in bucket.params))
        assert p.fqns == fqns, at
        assert p.nbytes == bucket.size, at
        assert p.extended == bucket.opcount_increased_to_capture_external_output, at
        assert p.targets == [c.target for c in calls], at
        assert [_state(c) for c in p.calls] == [_state(c) for c in calls], at
        assert p.regions == regions_of(calls), at
    return planned


def caps_mb(*mb: float) -> list[int]:
    return [int(m * MIB) for m in mb]


# -- models ----------------------------------------------------------------------------------
def layers(widths: list[int]) -> nn.Sequential:
    mods: list[nn.Module] = []
    for a, b in itertools.pairwise(widths):
        mods += [nn.Linear(a, b), nn.ReLU()]
    return nn.Sequential(*mods)


class MLP(nn.Module):
    def __init__(self, widths: list[int] | None = None) -> None:
        super().__init__()
        self.net = layers(widths or [600] * 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class Autocast(MLP):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.autocast("cpu", torch.bfloat16):
            return self.net(x)


class NoGrad(MLP):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            return self.net(x)


class EnableGrad(MLP):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.enable_grad():
            return self.net(x)


class PartAutocast(MLP):
    """Autocast over the middle layers only: fp32 partitions before and after."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.net[1](self.net[0](x))
        with torch.autocast("cpu", torch.bfloat16):
            for layer in self.net[2:6]:
                x = layer(x)
        return self.net[7](self.net[6](x.float()))


class NestedAutocast(MLP):
    """bf16 outside, autocast disabled for two middle layers inside."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.autocast("cpu", torch.bfloat16):
            x = self.net[1](self.net[0](x))
            with torch.autocast("cpu", enabled=False):
                x = self.net[3](self.net[2](x.float()))
                x = self.net[5](self.net[4](x))
            return self.net[7](self.net[6](x))


class GradToggled(MLP):
    """Grad off for two middle layers, back on after (``no_grad`` inside forward)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.net[1](self.net[0](x))
        with torch.no_grad():
            x = self.net[3](self.net[2](x))
            x = self.net[5](self.net[4](x))
        return self.net[7](self.net[6](x))


class SetGradCalls(MLP):
    """``torch.set_grad_enabled(flag)`` called as a function, twice, mid-forward."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.net[1](self.net[0](x))
        torch.set_grad_enabled(False)
        x = self.net[3](self.net[2](x))
        torch.set_grad_enabled(True)
        return self.net[7](self.net[6](self.net[5](self.net[4](x))))


class AutocastAndNoGrad(MLP):
    """Both kinds of region: no_grad around an autocast block."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            x = self.net[1](self.net[0](x))
            with torch.autocast("cpu", torch.bfloat16):
                x = self.net[5](self.net[4](self.net[3](self.net[2](x))))
        return self.net[7](self.net[6](x.float()))


class Preamble(MLP):
    """Parameter-free ops on the input before the first parameter."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.tanh(x * 2 + 1)
        x = x - x.mean(dim=-1, keepdim=True)
        return self.net(x)


class QuietTail(nn.Module):
    """Forward ends writing a probe's output into a buffer: the bucket the reverse walk
    starts with holds only that, no value used outside it, so DDPOptimizer extends it."""

    def __init__(self) -> None:
        super().__init__()
        self.net = layers([600] * 4)
        self.probe = nn.Linear(600, 600)
        self.register_buffer("seen", torch.zeros(4, 600))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.net(x)
        self.seen.copy_(self.probe(h).detach())
        return h


class Tied(nn.Module):
    """One Linear used twice, and an embedding tied to the output head."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(700, 600)
        self.mid = nn.Linear(600, 600)
        self.head = nn.Linear(600, 700, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.mid(self.emb(ids)))
        h = torch.relu(self.mid(h))
        return self.head(h)


class Branchy(nn.Module):
    """Two parallel branches merged: partitions of one branch do not need the other's."""

    def __init__(self) -> None:
        super().__init__()
        self.a = layers([600, 600, 600])
        self.b = layers([600, 600, 600])
        self.head = nn.Linear(600, 600)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.a(x) + self.b(x))


class Functional(nn.Module):
    """Parameters used directly: ``torch.mm(x, self.w.t())`` (a ``call_method`` on a
    parameter), a ``call_method`` whose self is a function's output, an in-place one."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(600, 600))
        self.v = nn.Parameter(torch.randn(600, 600))
        self.scale = nn.Parameter(torch.ones(600))
        self.shift = nn.Parameter(torch.zeros(600))
        self.lin = nn.Linear(600, 600)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.mm(x, self.w.t())
        h = (h + 1).mul(self.scale)  # call_method on a call_function's output
        h = h.t().t().add(self.shift)  # call_method on a call_method's output
        h = torch.relu(h).matmul(self.v)
        return self.lin(h)


class Frozen(nn.Module):
    """A frozen layer (requires_grad False) and one DDP ignores (``_ddp_ignored``)."""

    def __init__(self) -> None:
        super().__init__()
        self.net = layers([600] * 5)
        for p in self.net[2].parameters():
            p.requires_grad_(False)
        self.net[4].weight._ddp_ignored = True  # type: ignore[attr-defined]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class Broken(MLP):
    """A graph break between the halves: two dynamo graphs."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.net[:4](x)
        torch._dynamo.graph_break()
        return self.net[4:](x)


X = torch.randn(4, 600)
MODELS: dict[str, Callable[[], tuple[nn.Module, tuple[Any, ...]]]] = {
    "mlp": lambda: (MLP(), (X,)),
    "autocast": lambda: (Autocast(), (X,)),
    "no_grad": lambda: (NoGrad(), (X,)),
    "enable_grad": lambda: (EnableGrad(), (X,)),
    "part_autocast": lambda: (PartAutocast(), (X,)),
    "nested_autocast": lambda: (NestedAutocast(), (X,)),
    "grad_toggled": lambda: (GradToggled(), (X,)),
    "set_grad_calls": lambda: (SetGradCalls(), (X,)),
    "autocast_and_no_grad": lambda: (AutocastAndNoGrad(), (X,)),
    "preamble": lambda: (Preamble(), (X,)),
    "quiet_tail": lambda: (QuietTail(), (X,)),
    "tied": lambda: (Tied(), (torch.randint(0, 700, (4, 3)),)),
    "branchy": lambda: (Branchy(), (X,)),
    "functional": lambda: (Functional(), (X,)),
    "frozen": lambda: (Frozen(), (X,)),
}
# 1 MiB: about one layer per partition; 2.5: two; 5: four; 1000: all but the last layer.
CAPS = caps_mb(1, 1.5, 2.5, 5, 1000)


@pytest.mark.parametrize("name", list(MODELS))
def test_planner_equals_ddpoptimizer(name: str) -> None:
    model, args = MODELS[name]()
    traced = trace(model, *args)
    counts = [len(check(traced, cap)) for cap in CAPS]
    for first in caps_mb(0.25, 1, 2.5):
        check(traced, int(2.5 * MIB), first)
    assert counts[0] > 1, counts  # 1 MiB cuts every one of these models
    # Both caps above the model: compiled whole. (The default 1 MiB first bucket cuts
    # off the last layer of these models whatever the cap.)
    (whole,) = check(traced, 1000 * MIB, 1000 * MIB)
    assert whole.name == "graph"


# -- what the cases are there to show ------------------------------------------------------
def _traced(name: str) -> Traced:
    model, args = MODELS[name]()
    return trace(model, *args)


def test_tiny_cap_cuts_one_partition_per_layer() -> None:
    planned = check(_traced("mlp"), MIB)
    assert [p.fqns for p in planned] == [[f"net.{i}.weight", f"net.{i}.bias"] for i in (0, 2, 4, 6)]
    assert [p.nbytes for p in planned] == [LIN600] * 4
    assert [p.targets for p in planned] == [["torch._C._nn.linear", RELU]] * 4


def test_cap_above_the_model_compiles_it_whole() -> None:
    traced = _traced("mlp")
    (whole,) = check(traced, 1000 * MIB, 1000 * MIB)
    assert whole.name == "graph" and whole.nbytes == 4 * LIN600
    # Gradient-ready order: the last layer's parameters first.
    assert whole.fqns[:2] == ["net.6.weight", "net.6.bias"]
    assert whole.targets == ["torch._C._nn.linear", RELU] * 4
    # The default first bucket (1 MiB) still cuts off the last layer.
    last, rest = check(traced, 1000 * MIB)[::-1]
    assert last.fqns == ["net.6.weight", "net.6.bias"] and len(rest.fqns) == 6


def test_model_below_the_first_bucket_compiles_whole() -> None:
    traced = trace(MLP([64] * 5), torch.randn(2, 64))
    (whole,) = check(traced, 25 * MIB)
    assert whole.name == "graph" and whole.extended == 0


def test_size_equal_to_the_cap_closes_the_bucket() -> None:
    # ``>= cap``: a bucket holding exactly the cap is full.
    planned = check(_traced("mlp"), LIN600, LIN600)
    assert len(planned) == 4
    planned = check(_traced("mlp"), LIN600 + 1, LIN600 + 1)
    assert [len(p.fqns) for p in planned] == [4, 4]


def test_preamble_joins_the_first_partition() -> None:
    planned = check(_traced("preamble"), MIB)
    assert len(planned) == 4
    first = planned[0].targets
    assert first[: first.index("torch._C._nn.linear")] == [
        "_operator.mul",
        "_operator.add",
        "torch.tanh",
        "mean",
        "_operator.sub",
    ]


def test_a_bucket_without_external_output_is_extended() -> None:
    planned = check(_traced("quiet_tail"), MIB)
    assert planned[-1].extended > 0
    assert planned[-1].fqns[:2] == ["probe.weight", "probe.bias"]
    assert all(p.extended == 0 for p in planned[:-1])


def test_autocast_regions_in_every_partition() -> None:
    planned = check(_traced("autocast"), MIB)
    assert len(planned) == 4
    for p in planned:
        (region,) = p.regions
        assert (region.kind, region.enters, region.exits) == ("autocast", True, True)
        assert (region.device_type, region.dtype) == ("cpu", "torch.bfloat16")
        assert p.targets[0].endswith("_enter_autocast")
        assert p.targets[-1].endswith("_exit_autocast")


def test_part_autocast_spans_only_its_partitions() -> None:
    planned = check(_traced("part_autocast"), MIB)
    assert [len(p.regions) for p in planned] == [1, 1, 1, 0]
    enter = "torch.amp.autocast_mode._enter_autocast"
    # Entered after partition 0's first layer (the original node), at the start of the
    # next ones (copies); every one exits it at its end (copies, then the original).
    assert planned[0].targets.index(enter) == 2
    assert all(p.targets[0] == enter for p in planned[1:3])
    assert all(p.regions[0].enters and p.regions[0].exits for p in planned[:3])


def test_nested_autocast_copies_both_regions() -> None:
    planned = check(_traced("nested_autocast"), MIB)
    inner = [p for p in planned if len(p.regions) == 2]
    assert inner, [p.regions for p in planned]
    for p in inner:  # the outer region first, its exit last
        outer, nested = p.regions
        assert (outer.dtype, outer.enabled) == ("torch.bfloat16", True)
        assert (nested.dtype, nested.enabled) == (None, False)  # autocast turned off
        assert nested.enters and nested.exits and outer.enters and outer.exits
        exits = [c.state.enter for c in p.calls if c.state and c.state.call == "exit_autocast"]
        enters = [c.name for c in p.calls if c.state and c.state.call == "enter_autocast"]
        assert exits == enters[::-1]


def test_no_grad_sets_grad_off_in_every_partition() -> None:
    planned = check(_traced("no_grad"), MIB)
    for p in planned:
        assert p.targets[0] == "torch._C._set_grad_enabled"
        assert p.regions[0].kind == "grad" and p.regions[0].enabled is False
    # The last partition restores grad mode: a second grad region, enabled.
    assert [r.enabled for r in planned[-1].regions] == [False, True]
    assert planned[-1].regions[0].exits


def test_enable_grad_with_grad_on_adds_no_state_node() -> None:
    planned = check(_traced("enable_grad"), MIB)
    assert all(p.regions == [] for p in planned)


def test_enable_grad_under_outer_no_grad_is_a_grad_region() -> None:
    # Traced with grad off, the graph turns it on and, at its end, off again; DDPOptimizer
    # runs the split graph (on fake tensors) to compile it: do that with grad off too.
    with torch.no_grad():
        traced = _traced("enable_grad")
        planned = check(traced, MIB)
    assert all(p.regions and p.regions[0].enabled is True for p in planned)


def test_branches_run_in_split_modules_topological_order() -> None:
    traced = _traced("branchy")
    names = [p.name for p in check(traced, MIB)]
    assert names != sorted(names), names  # a root partition popped off the stack first
    for cap in caps_mb(1.5, 2.5):
        check(traced, cap)


def test_functional_parameters_count_where_ddpoptimizer_counts_them() -> None:
    (whole,) = check(_traced("functional"), 1000 * MIB, 1000 * MIB)
    # DDPOptimizer counts a call_method's parameter arguments only when its self is a
    # node with a string target (a placeholder, another method's result): not for
    # ``(h + 1).mul(self.scale)`` nor ``torch.relu(h).matmul(self.v)``.
    assert sorted(whole.fqns) == ["lin.bias", "lin.weight", "shift", "w"]


def test_tied_weights_count_twice_under_one_fqn() -> None:
    (whole,) = check(_traced("tied"), 1000 * MIB, 1000 * MIB)
    assert whole.fqns == ["emb.weight", "mid.weight", "mid.bias"]
    emb, lin = 700 * 600 * 4, LIN600
    assert whole.nbytes == 2 * emb + 2 * lin  # every use counts, as DDPOptimizer adds


def test_frozen_and_ddp_ignored_parameters() -> None:
    (whole,) = check(_traced("frozen"), 1000 * MIB, 1000 * MIB)
    assert not {"net.2.weight", "net.2.bias"} & set(whole.fqns)
    # Measured on 2.13: dynamo's fake example values drop DDP's ``_ddp_ignored`` marker,
    # so DDPOptimizer counts an ignored parameter anyway (and so does the planner).
    assert "net.4.weight" in whole.fqns


# -- ish.plan_splits: the kernel's trace -----------------------------------------------------
def test_plan_splits_equals_the_planner_on_the_traced_graph() -> None:
    model, (x,) = MODELS["autocast"]()
    plan = ish.plan_splits(model, x, bucket_cap_mb=1.5)
    assert plan.nothing is None and len(plan.graphs) == 1
    assert plan.partitions == check(trace(model, x), int(1.5 * MIB))
    # Planning again (the trace dropped its cache entries) gives the same plan.
    assert ish.plan_splits(model, x, bucket_cap_mb=1.5).partitions == plan.partitions


def test_plan_splits_plans_every_graph_of_a_forward_with_graph_breaks() -> None:
    model = Broken()
    plan = ish.plan_splits(model, X, bucket_cap_mb=1)
    graphs = trace_all(model, X)
    assert len(plan.graphs) == len(graphs) == 2
    for planned, traced in zip(plan.graphs, graphs, strict=True):
        assert planned.partitions == check(traced, MIB)
    assert [p.fqns for p in plan.partitions] == [
        [f"net.{i}.weight", f"net.{i}.bias"] for i in (0, 2, 4, 6)
    ]


def test_plan_splits_of_a_sequential_says_nothing_is_compiled() -> None:
    plan = ish.plan_splits(layers([600] * 3), X, bucket_cap_mb=1)
    assert plan.partitions == [] and plan.graphs == []
    assert plan.nothing is not None and "torch.nn" in plan.nothing
    assert "nn.Module subclass" in plan.nothing


@pytest.mark.parametrize("cap_mb", [0.5, 0.999])
def test_caps_below_the_first_bucket_are_refused(cap_mb: float) -> None:
    with pytest.raises(SplitPlanError, match=rf"bucket_cap_mb={cap_mb}.*bucket_cap_mb >= 1"):
        ish.plan_splits(MLP(), X, bucket_cap_mb=cap_mb)
    # ... as DDPOptimizer refuses them.
    with pytest.raises(AssertionError, match="First bucket should be smaller/equal"):
        DDPOptimizer(int(cap_mb * MIB), lambda gm, _: gm.forward)
    # A smaller first-bucket cap makes them fine.
    plan = ish.plan_splits(MLP(), X, bucket_cap_mb=cap_mb, first_bucket_cap_mb=0.25)
    assert len(plan.partitions) == 4


@pytest.mark.parametrize("cap_mb", [0, -1.0])
def test_non_positive_caps_are_refused(cap_mb: float) -> None:
    with pytest.raises(SplitPlanError, match=rf"bucket_cap_mb={cap_mb!r}"):
        ish.plan_splits(MLP(), X, bucket_cap_mb=cap_mb)


# -- random widths and caps ------------------------------------------------------------------
@settings(max_examples=6, deadline=None, derandomize=True)
@given(
    widths=st.lists(st.integers(64, 720), min_size=3, max_size=6),
    kind=st.sampled_from([MLP, Autocast, NoGrad, GradToggled]),
    caps=st.lists(st.floats(1.0, 6.0), min_size=2, max_size=4),
    first=st.sampled_from([None, 0.1, 0.5]),
)
@pytest.mark.slow
def test_random_widths_and_caps(
    widths: list[int], kind: type[MLP], caps: list[float], first: float | None
) -> None:
    if kind is GradToggled:
        widths = (widths * 5)[:5]  # it reads layers 0..7
    torch._dynamo.reset()
    traced = trace(kind(widths), torch.randn(2, widths[0]))
    for cap in caps:
        check(traced, int(cap * MIB), None if first is None else int(first * MIB))
