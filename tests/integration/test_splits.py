"""``ish.watch(torch.compile(ddp))`` on real 2-rank gloo runs on CPU: the captured
partitions equal the planner's, the compiled model computes what the uncompiled one
does, and every partition's regions agree with its generated code.

One cluster serves the module. Every rank function resets dynamo first (a model of a
class compiled in an earlier run would otherwise come from dynamo's cache, and the
probe would see no compile) and builds its model from a seed, so the kernel can build
the same model to plan it.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from typing import Any

import cloudpickle
import pytest
import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import interactive_shard as ish
from interactive_shard.splits.model import Compilation

# Ranks may be spawned: ship this module's models and functions by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

WIDTH = 600  # a Linear(600, 600) holds 1.44 MB: one per partition at a 1 MiB cap
ENTER, EXIT, SET_GRAD = "_enter_autocast(", "_exit_autocast(", "_set_grad_enabled("


@pytest.fixture(scope="module")
def compiled(cluster: ish.Cluster) -> Callable[..., ish.Run]:
    """``compiled(backend, name, cap_mb)``: that case's run, run once for the module."""
    runs: dict[tuple[str, str, float], ish.Run] = {}

    def get(backend: str, name: str, cap_mb: float) -> ish.Run:
        key = (backend, name, cap_mb)
        if key not in runs:
            # One case also runs a second input shape (the recompile test reads it).
            again = 6 if key == RECOMPILED else None
            runs[key] = cluster.run(_compile, name, backend, cap_mb, again=again)
        return runs[key]

    return get


# -- models (user nn.Module subclasses: dynamo skips nn.Sequential's own forward) --------------
class Net(nn.Module):
    def __init__(self, layers: int = 4, width: int = WIDTH) -> None:
        super().__init__()
        mods: list[nn.Module] = []
        for _ in range(layers):
            mods += [nn.Linear(width, width), nn.ReLU()]
        self.net = nn.Sequential(*mods)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class Autocast(Net):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.autocast("cpu", torch.bfloat16):
            return self.net(x)


class NoGrad(Net):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            return self.net(x)


class EnableGrad(Net):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.enable_grad():
            return self.net(x)


class PartAutocast(Net):
    """Autocast over the two middle layers only."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.net[1](self.net[0](x))
        with torch.autocast("cpu", torch.bfloat16):
            x = self.net[5](self.net[4](self.net[3](self.net[2](x))))
        return self.net[7](self.net[6](x.float()))


class Broken(Net):
    """A graph break between the halves: dynamo hands DDPOptimizer two graphs."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.net[:4](x)
        torch._dynamo.graph_break()
        return self.net[4:](x)


MODELS: dict[str, type[Net]] = {
    "plain": Net,
    "autocast": Autocast,
    "no_grad": NoGrad,
    "enable_grad": EnableGrad,
    "part_autocast": PartAutocast,
    "broken": Broken,
}


def build(name: str, **kw: Any) -> Net:
    torch.manual_seed(0)
    return MODELS[name](**kw)


def inputs(width: int = WIDTH, batch: int = 4) -> torch.Tensor:
    return torch.randn(batch, width, generator=torch.Generator().manual_seed(1))


# -- rank code ---------------------------------------------------------------------------
def _explain(ddp: DDP, x: torch.Tensor) -> dict[str, Any]:
    out = torch._dynamo.explain(ddp)(x)
    return {"graph_count": out.graph_count, "reasons": [r.reason for r in out.break_reasons]}


def _compile(
    ctx: Any,
    name: str,
    backend: str,
    cap_mb: float,
    *,
    layers: int = 4,
    width: int = WIDTH,
    again: int | None = None,
) -> dict[str, Any]:
    """Compile the model ``name`` in DDP with ``backend``, watched; run it once (and once
    more with batch ``again``); compare with the uncompiled model."""
    torch._dynamo.reset()
    if backend == "inductor":  # no pool of compile workers on 2 cores
        importlib.import_module("torch._inductor.config").compile_threads = 1
    model = build(name, layers=layers, width=width)
    ddp = DDP(model, bucket_cap_mb=cap_mb)
    x = inputs(width)
    explained = _explain(ddp, x)
    torch._dynamo.reset()  # explain's compiles stay out of the watched one's
    compiled = torch.compile(ddp, backend=backend)
    watch = ish.watch(compiled)
    out = compiled(x)
    ref = model(x)
    result = {
        "explain": explained,
        "equal": torch.equal(out, ref),
        "close": torch.allclose(out.float(), ref.float(), rtol=2e-2, atol=2e-2),
        "dtype": str(out.dtype),
        "requires_grad": out.requires_grad,
    }
    if again is not None:
        y = inputs(width, again)
        result["again_equal"] = torch.equal(compiled(y), model(y))
    watch.detach()
    return result


def _sequential(ctx: Any) -> dict[str, Any]:
    torch._dynamo.reset()
    torch.manual_seed(0)
    seq = nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.ReLU(), nn.Linear(WIDTH, WIDTH))
    compiled = torch.compile(DDP(seq, bucket_cap_mb=1), backend="eager")
    watch = ish.watch(compiled)
    x = inputs()
    equal = torch.equal(compiled(x), seq(x))
    compiled(x)
    watch.detach()
    return {"equal": equal}


def _train(ctx: Any, steps: int) -> dict[str, Any]:
    torch._dynamo.reset()
    model = build("plain", layers=3)
    ddp = DDP(model, bucket_cap_mb=1.5)
    compiled = torch.compile(ddp, backend="aot_eager")
    watch = ish.watch(compiled)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    gen = torch.Generator().manual_seed(10 + ctx.rank)
    for _ in ctx.steps(steps):
        opt.zero_grad()
        compiled(torch.randn(4, WIDTH, generator=gen)).pow(2).mean().backward()
        opt.step()
    watch.detach()
    return {"iteration": watch.iteration}


# -- helpers -------------------------------------------------------------------------------
def _check_code(comp: Compilation) -> None:
    """Regions agree with each partition's generated code (what the backend compiled)."""
    for p in comp.partitions:
        at = f"rank {comp.rank} {p.name}: {[r.describe() for r in p.regions]}\n{p.code}"
        assert p.code, at
        autocast = [r for r in p.regions if r.kind == "autocast"]
        grad = [r for r in p.regions if r.kind == "grad"]
        assert p.code.count(ENTER) == sum(r.enters for r in autocast), at
        assert p.code.count(EXIT) == sum(r.exits for r in autocast), at
        assert p.code.count(SET_GRAD) == len(grad), at
        assert (ENTER in p.code) == any(r.enters for r in autocast), at
        for r in autocast:
            assert f"'{r.device_type}', {r.dtype}" in p.code, at
        for r in grad:
            assert f"{SET_GRAD}{r.enabled})" in p.code, at


def _check_explain(comp: Compilation, explained: dict[str, Any]) -> None:
    n = len(comp.partitions)
    assert explained["graph_count"] == n
    if comp.split:
        assert len(comp.break_reasons) == n == len(explained["reasons"])
        assert comp.break_reasons == explained["reasons"]
        assert all("DDPOptimizer intentional graph-break" in r for r in comp.break_reasons)
    else:
        assert comp.break_reasons == [] == explained["reasons"]


def _captured(run: ish.Run, rank: int) -> Compilation:
    return run.splits.compilations(rank)[0]


# -- tests ---------------------------------------------------------------------------------
CASES = [
    ("eager", "autocast", 1.0),
    ("eager", "enable_grad", 2.5),
    ("aot_eager", "autocast", 1.5),
    ("aot_eager", "no_grad", 1.0),
    ("aot_eager", "enable_grad", 1.0),
    ("aot_eager", "part_autocast", 1.0),
    ("aot_eager", "plain", 5.0),
]
RECOMPILED = ("aot_eager", "autocast", 1.5)


@pytest.mark.parametrize(("backend", "name", "cap_mb"), CASES)
def test_captured_equals_planned(
    compiled: Callable[..., ish.Run], backend: str, name: str, cap_mb: float
) -> None:
    run = compiled(backend, name, cap_mb)
    plan = ish.plan_splits(build(name), inputs(), bucket_cap_mb=cap_mb)
    assert run.splits.compare(plan).matches, run.splits.compare(plan)
    assert run.splits.compare().matches, run.splits.compare()
    for rank in range(2):
        comp = _captured(run, rank)
        assert comp.index == 0 and comp.backend == backend
        assert comp.bucket_bytes_cap == int(cap_mb * 2**20)
        assert comp.first_bucket_bytes == 2**20  # DDPOptimizer's default, whatever DDP's
        assert [p.fqns for p in comp.partitions] == [p.fqns for p in plan.partitions]
        assert len(comp.partitions) > 1
        _check_code(comp)
        result = run.results[rank]
        _check_explain(comp, result["explain"])
        assert result["equal"], "compiled output differs from the uncompiled model's"
        if "autocast" in name:
            assert result["dtype"] == ("torch.bfloat16" if name == "autocast" else "torch.float32")
        else:
            assert result["dtype"] == "torch.float32"
        assert result["requires_grad"] is (name != "no_grad")
    # The ranks compiled the same model the same way.
    a, b = (
        [(p.fqns, p.calls, p.regions, p.code) for p in _captured(run, r).partitions]
        for r in range(2)
    )
    assert a == b


def test_autocast_every_partition_enters_and_exits(compiled: Callable[..., ish.Run]) -> None:
    comp = _captured(compiled("eager", "autocast", 1.0), 0)
    assert len(comp.partitions) == 4
    for p in comp.partitions:
        (r,) = p.regions
        assert (r.kind, r.enters, r.exits, r.dtype) == ("autocast", True, True, "torch.bfloat16")
        assert p.code.count(ENTER) == p.code.count(EXIT) == 1


def test_no_grad_every_partition_sets_grad_off_and_the_last_restores_it(
    compiled: Callable[..., ish.Run],
) -> None:
    run = compiled("aot_eager", "no_grad", 1.0)
    comp = _captured(run, 1)
    for p in comp.partitions:
        assert p.targets[0] == "torch._C._set_grad_enabled"
        assert f"{SET_GRAD}False)" in p.code
    assert [r.enabled for r in comp.partitions[-1].regions] == [False, True]
    assert all(f"{SET_GRAD}True)" not in p.code for p in comp.partitions[:-1])
    assert run.results[1]["requires_grad"] is False


def test_one_bucket_compiles_whole(cluster: ish.Cluster) -> None:
    # Below DDPOptimizer's 1 MiB first bucket: no split.
    run = cluster.run(_compile, "autocast", "aot_eager", 25.0, width=64)
    plan = ish.plan_splits(build("autocast", width=64), inputs(64), bucket_cap_mb=25)
    assert run.splits.compare(plan).matches, run.splits.compare(plan)
    for rank in range(2):
        comp = _captured(run, rank)
        assert not comp.split and comp.parent == ""
        (whole,) = comp.partitions
        assert whole.name == "graph" and len(whole.fqns) == 8
        _check_code(comp)
        _check_explain(comp, run.results[rank]["explain"])
        assert run.results[rank]["equal"] and run.results[rank]["dtype"] == "torch.bfloat16"


def test_a_recompile_is_a_second_compilation(compiled: Callable[..., ish.Run]) -> None:
    run = compiled(*RECOMPILED)
    assert run.splits.compare().matches, run.splits.compare()
    for rank in range(2):
        first, second = run.splits.compilations(rank)
        assert (first.index, second.index) == (0, 1)
        assert [p.fqns for p in second.partitions] == [p.fqns for p in first.partitions]
        assert run.results[rank]["again_equal"]
        _check_code(second)
    # The plan of the first input shape matches the first compile of every rank.
    plan = ish.plan_splits(build("autocast"), inputs(), bucket_cap_mb=1.5)
    assert run.splits.compare(plan).matches, run.splits.compare(plan)


def test_ddp_of_a_sequential_compiles_nothing(cluster: ish.Cluster) -> None:
    run = cluster.run(_sequential)
    for rank in range(2):
        assert run.splits.compilations(rank) == []
        reason = run.splits.nothing(rank)
        assert reason is not None and "torch.nn" in reason, reason
        assert run.results[rank]["equal"]
    seq = nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.ReLU(), nn.Linear(WIDTH, WIDTH))
    plan = ish.plan_splits(seq, inputs(), bucket_cap_mb=1)
    assert plan.nothing is not None and "torch.nn" in plan.nothing
    assert run.splits.compare(plan).matches
    assert not run.splits.compare().matches  # no plan: nothing compiled is a difference


def test_bucket_map_of_a_compiled_model(cluster: ish.Cluster) -> None:
    run = cluster.run(_train, 3)
    assert run.results[0]["iteration"] == 3
    buckets = run.buckets
    assert buckets.iterations == [1, 2, 3]
    for rank in range(2):
        assert len(run.splits.compilations(rank)) == 1
        first, rebuilt = buckets.observed(1, rank), buckets.observed(2, rank)
        assert rebuilt and buckets.observed(3, rank)
        # Rebuilt in the order the compiled backward made gradients ready: the last
        # partition's first.
        record = buckets.record(1, rank)
        assert record is not None and record.unready == []
        assert [f for b in rebuilt for f in b.fqns] == record.ready_order
        assert record.ready_order[0].startswith("net.4.")
        fqns = sorted(f for b in rebuilt for f in b.fqns)
        assert (
            fqns
            == sorted(f for b in first for f in b.fqns)
            == sorted(n for n, _ in build("plain", layers=3).named_parameters())
        )
    plan = ish.plan_splits(build("plain", layers=3), inputs(), bucket_cap_mb=1.5)
    assert run.splits.compare(plan).matches and len(plan.partitions) == 2
    lines = run.splits.versus_runtime(0)
    assert lines[0].startswith("DDPOptimizer (compile time): 2 partition(s)")
    assert any(line.startswith("DDP (run time):") for line in lines)


@pytest.mark.slow
def test_inductor_slow(cluster: ish.Cluster) -> None:
    """The one inductor case (~15-30 s cold on 2 CPU cores): planned == captured, and the
    compiled output is bf16 and close to the uncompiled one (inductor fuses: not equal)."""
    run = cluster.run(_compile, "autocast", "inductor", 1.5, layers=2, width=520)
    plan = ish.plan_splits(build("autocast", layers=2, width=520), inputs(520), bucket_cap_mb=1.5)
    assert run.splits.compare(plan).matches, run.splits.compare(plan)
    assert run.splits.compare().matches, run.splits.compare()
    for rank in range(2):
        comp = _captured(run, rank)
        assert comp.backend == "inductor" and len(comp.partitions) == 2
        _check_code(comp)
        _check_explain(comp, run.results[rank]["explain"])
        result = run.results[rank]
        assert result["close"] and result["dtype"] == "torch.bfloat16"


@pytest.mark.slow
def test_a_graph_break_gives_two_compilations(compiled: Callable[..., ish.Run]) -> None:
    run = compiled("eager", "broken", 1.0)
    plan = ish.plan_splits(build("broken"), inputs(), bucket_cap_mb=1.0)
    assert len(plan.graphs) == 2
    assert run.splits.compare(plan).matches, run.splits.compare(plan)
    assert run.splits.compare().matches, run.splits.compare()
    for rank in range(2):
        comps = run.splits.compilations(rank)
        assert [c.index for c in comps] == [0, 1]
        assert [len(c.partitions) for c in comps] == [2, 2]
        assert [p.fqns for c in comps for p in c.partitions] == [
            [f"net.{i}.weight", f"net.{i}.bias"] for i in (0, 2, 4, 6)
        ]
        assert run.results[rank]["equal"]
        explained = run.results[rank]["explain"]
        assert explained["graph_count"] == 4
        assert [r for c in comps for r in c.break_reasons] == explained["reasons"]
