"""The DDP lifecycle probe on real 2-rank gloo runs: the construction-time sync and the
buffer broadcasts with their bytes, forwards per backward, the three checks, delayed
parameters, the find_unused_parameters walk, bit-identical training and detach (Note
[Lifecycle probe]). Most tests call ``attach`` directly; the last ones go through
``ish.watch`` and ``run.ddp``."""

from __future__ import annotations

import warnings
from typing import Any

import msgspec
import pytest
import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import interactive_shard as ish
from interactive_shard.ddp import probe
from interactive_shard.ddp.events import LifecycleCheck, LifecycleIteration, LifecycleWatch
from interactive_shard.probing.compat import ddp as compat_ddp


class Net(nn.Module):
    """Linear, BatchNorm (40 bytes of buffers), Linear, and a head used on request."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.bn = nn.BatchNorm1d(4)
        self.b = nn.Linear(4, 2)
        self.head = nn.Linear(2, 2)

    def forward(self, x: torch.Tensor, head: bool = True) -> torch.Tensor:
        y = self.b(self.bn(self.a(x)))
        return self.head(y) if head else y


PARAM_BYTES = 4 * (16 + 4 + 4 + 4 + 8 + 2 + 4 + 2)
BUFFER_BYTES = 4 * (4 + 4) + 8  # running mean, var (float32), num_batches_tracked (int64)


def _ddp(**kwargs: Any) -> DDP:
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # broadcast_buffers is deprecated
        return DDP(Net(), **kwargs)


def _x() -> torch.Tensor:
    return torch.randn(8, 4)


def _of(run: ish.Run, kind: type[Any], rank: int = 0) -> list[Any]:
    return [
        msgspec.convert(e.payload, kind) for e in run.store.of_kind(kind.KIND) if e.rank == rank
    ]


def _iterations(run: ish.Run, serial: int, rank: int = 0) -> dict[int, list[LifecycleIteration]]:
    out: dict[int, list[LifecycleIteration]] = {}
    for it in _of(run, LifecycleIteration, rank):
        if it.ddp == serial:
            out.setdefault(it.iteration, []).append(it)
    return out


def _checks(run: ish.Run, rank: int = 0) -> list[LifecycleCheck]:
    return _of(run, LifecycleCheck, rank)


# DDP's buffer settings, and what each syncs: (construction bytes, buffer bytes per forward).
BUFFER_CASES: list[tuple[dict[str, bool], tuple[int, int]]] = [
    ({}, (PARAM_BYTES + BUFFER_BYTES, BUFFER_BYTES)),
    ({"broadcast_buffers": False}, (PARAM_BYTES, 0)),  # no buffers at construction either
]
if compat_ddp.FORWARD_SYNC_BUFFERS:  # torch 2.13: still synced at init
    BUFFER_CASES.append(({"forward_sync_buffers": False}, (PARAM_BYTES + BUFFER_BYTES, 0)))


def _buffers(ctx: Any) -> None:
    for kwargs, _ in BUFFER_CASES:
        ddp = _ddp(**kwargs)
        watch = probe.attach(ddp)
        for _ in range(2):
            ddp(_x()).sum().backward()
        watch.detach()


def test_construction_sync_and_buffer_broadcast_bytes(cluster: ish.Cluster) -> None:
    run = cluster.run(_buffers)
    for rank in range(2):
        watches = _of(run, LifecycleWatch, rank)
        assert [w.recorded_from for w in watches] == ["process_group"] * len(BUFFER_CASES)
        expected = [bytes_ for _, bytes_ in BUFFER_CASES]
        for w, (init_bytes, per_forward) in zip(watches, expected, strict=True):
            assert (w.param_bytes, w.buffer_bytes) == (PARAM_BYTES, BUFFER_BYTES)
            assert [c.caller for c in w.construction] == ["ddp_init"]
            assert sum(c.nbytes for c in w.construction) == init_bytes
            assert w.init_sync_buffers == (init_bytes > PARAM_BYTES)
            assert all(h.reducer == [w.ddp] for h in w.hooks)
            its = _iterations(run, w.ddp, rank)
            assert sorted(its) == [1, 2]
            for parts in its.values():
                colls = [c for p in parts for c in p.collectives]
                synced = [c.nbytes for c in colls if c.caller == "sync_buffers"]
                assert sum(synced) == per_forward
                assert sum(c.nbytes for c in colls if c.caller == "reducer") == PARAM_BYTES
                assert [p.finished for p in parts if p.backward] == [True]
                assert not any(p.walk_s for p in parts)  # find_unused_parameters is off
        assert _checks(run, rank) == []  # a healthy run: no check fires


def _static_two_forwards(ctx: Any) -> None:
    ddp = _ddp(static_graph=True)
    watch = probe.attach(ddp)
    for _ in range(2):
        (ddp(_x()).sum() + ddp(_x()).sum()).backward()
    watch.detach()


@pytest.mark.skipif(
    not compat_ddp.STATIC_GRAPH_MULTI_FORWARD,
    reason="torch before 2.12.1 fails two forwards before one backward with static_graph "
    "in plain torch (an inplace version counter): compat.ddp",
)
def test_static_graph_two_forwards_before_one_backward(cluster: ish.Cluster) -> None:
    run = cluster.run(_static_two_forwards)
    for rank in range(2):
        (w,) = _of(run, LifecycleWatch, rank)
        assert w.static_graph
        its = _iterations(run, w.ddp, rank)
        for parts in its.values():
            assert sum(p.forwards for p in parts) == 2
            assert [p.finished for p in parts if p.backward] == [True]
            assert len(parts[-1].ready) == len(w.params)  # each parameter once
        assert _checks(run, rank) == []


def _unused(ctx: Any, find_unused: bool) -> None:
    ddp = _ddp(find_unused_parameters=find_unused)
    watch = probe.attach(ddp)
    ddp(_x()).sum().backward()
    ddp(_x(), head=False).sum().backward()  # head unused: the Reducer cannot finish
    watch.detach()


def test_unused_parameter_fires_unfinished_in_its_iteration(cluster: ish.Cluster) -> None:
    run = cluster.run(_unused, False)
    for rank in range(2):
        (check,) = _checks(run, rank)
        assert (check.check, check.iteration) == ("unfinished", 2)
        assert check.fqns == ["head.weight", "head.bias"]
        assert "find_unused_parameters=True" in check.message
        (w,) = _of(run, LifecycleWatch, rank)
        its = _iterations(run, w.ddp, rank)
        assert [p.finished for p in its[1] if p.backward] == [True]
        assert [p.finished for p in its[2] if p.backward] == [False]
        assert [p.unready for p in its[2] if p.backward] == [["head.weight", "head.bias"]]


def test_find_unused_parameters_finishes_and_its_walk_is_timed(cluster: ish.Cluster) -> None:
    run = cluster.run(_unused, True)
    for rank in range(2):
        assert _checks(run, rank) == []
        (w,) = _of(run, LifecycleWatch, rank)
        its = _iterations(run, w.ddp, rank)
        for parts in its.values():
            assert [p.finished for p in parts if p.backward] == [True]
            walk = sum(p.walk_s or 0.0 for p in parts)
            assert 0 < walk < 1
        assert [p.unready for p in its[2] if p.backward] == [["head.weight", "head.bias"]]


def _dropped(ctx: Any) -> None:
    ddp = _ddp()
    watch = probe.attach(ddp)
    ddp(_x()).sum().backward()
    ddp(_x())  # output dropped: DDP was prepared for a backward that never comes
    ddp(_x()).sum().backward()
    watch.detach()


def test_forward_without_backward_fires_at_the_next_forward(cluster: ish.Cluster) -> None:
    run = cluster.run(_dropped)
    for rank in range(2):
        (check,) = _checks(run, rank)
        assert (check.check, check.iteration) == ("forward_without_backward", 2)
        (w,) = _of(run, LifecycleWatch, rank)
        its = _iterations(run, w.ddp, rank)
        assert sum(p.forwards for p in its[2]) == 2
        assert sum(p.dropped for p in its[2]) == 1
        assert sum(p.dropped for p in its[1]) == 0


def _twice(ctx: Any) -> None:
    torch.manual_seed(0)
    model = Net()
    old, new = DDP(model), DDP(model)  # a re-run notebook cell
    watch = probe.attach(new)
    new(_x()).sum().backward()
    watch.detach()
    other = Net()
    old2, new2 = DDP(other), DDP(other)
    old2._remove_autograd_hooks()
    watch = probe.attach(new2)
    new2(_x()).sum().backward()
    watch.detach()
    del old, old2


def test_wrapping_twice_fires_double_hooks_until_removed(cluster: ish.Cluster) -> None:
    run = cluster.run(_twice)
    for rank in range(2):
        first, second = _of(run, LifecycleWatch, rank)
        (check,) = _checks(run, rank)  # none for the second pair: the old hooks are gone
        assert check.check == "double_hooks" and check.ddp == first.ddp
        assert (check.iteration, check.others) == (0, [first.ddp - 1])
        assert check.fqns == first.params
        assert "_remove_autograd_hooks()" in check.message
        assert all(h.reducer == [first.ddp - 1, first.ddp] for h in first.hooks)
        assert all(h.reducer == [second.ddp] for h in second.hooks)


def _delayed(ctx: Any) -> None:
    torch.manual_seed(0)
    model = Net()
    ddp = DDP(
        model,
        delay_all_reduce_named_params=[("a.weight", model.a.weight)],
        param_to_hook_all_reduce=model.head.weight,
    )
    watch = probe.attach(ddp)
    for _ in range(2):
        ddp(_x()).sum().backward()
    watch.detach()


def test_delayed_parameters_are_reduced_at_the_hook_parameter(cluster: ish.Cluster) -> None:
    run = cluster.run(_delayed)
    for rank in range(2):
        (w,) = _of(run, LifecycleWatch, rank)
        assert w.delayed == ["a.weight"] and w.hook_param == "head.weight"
        assert "a.weight" not in w.params
        (hooked,) = [h for h in w.hooks if h.fqn == "head.weight"]
        assert hooked.delayed == [w.ddp]
        assert sum(c.nbytes for c in w.construction) == PARAM_BYTES + BUFFER_BYTES
        for parts in _iterations(run, w.ddp, rank).values():
            colls = [c for p in parts for c in p.collectives]
            (delayed,) = [c for c in colls if c.caller == "delayed_all_reduce"]
            assert (delayed.op, delayed.nbytes) == ("all_reduce", 16 * 4)
            reduced = sum(c.nbytes for c in colls if c.caller == "reducer")
            assert reduced == PARAM_BYTES - 16 * 4
            # the head's gradient comes first in backward: its hook starts the delayed
            # all-reduce before the Reducer's bucket
            assert colls.index(delayed) < min(
                i for i, c in enumerate(colls) if c.caller == "reducer"
            )


def _plain_vs_watched(ctx: Any) -> dict[str, bool]:
    from interactive_shard.ddp import _graph_walk_timer

    out, restored = [], False
    for watched in (False, True):
        ddp = _ddp(find_unused_parameters=True)
        hooks = (len(ddp._forward_pre_hooks), len(ddp._forward_hooks))
        walk = _graph_walk_timer.ddp_module._find_tensors
        watch = probe.attach(ddp) if watched else None
        opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
        torch.manual_seed(1)
        for _ in range(3):
            ddp(_x()).sum().backward()
            opt.step()
            opt.zero_grad()
        if watch is not None:
            watch.detach()
            restored = (
                (len(ddp._forward_pre_hooks), len(ddp._forward_hooks)) == hooks
                and _graph_walk_timer.ddp_module._find_tensors is walk
                and "_ish_spy" not in ddp.__dict__
            )
        out.append([p.detach().clone() for p in ddp.parameters()])
    same = all(torch.equal(a, b) for a, b in zip(*out, strict=True))
    return {"identical": same, "restored": restored}


def test_training_is_bit_identical_and_detach_restores(cluster: ish.Cluster) -> None:
    assert cluster.run(_plain_vs_watched).results == [{"identical": True, "restored": True}] * 2


# -- through ish.watch and run.ddp ------------------------------------------------------
class Block(nn.Module):
    """Notebook 02's transformer block, small."""

    def __init__(self, d: int = 16) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(d)
        self.attn = nn.MultiheadAttention(d, num_heads=2, batch_first=True)
        self.norm2 = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm1(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        return x + self.mlp(self.norm2(x))


def _healthy(ctx: Any, kind: str, compiled: bool = False) -> list[str]:
    torch.manual_seed(0)
    if kind == "transformer":
        model: nn.Module = nn.Sequential(nn.Embedding(50, 16), Block(), Block(), nn.Linear(16, 50))
        make = lambda: torch.randint(0, 50, (4, 6))  # noqa: E731
    else:  # notebook 02's MLP, and notebook 06's shape with a BatchNorm buffer
        model = nn.Sequential(nn.Linear(4, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 4))
        make = _x
    ddp = DDP(model)
    target = torch.compile(ddp, backend="aot_eager") if compiled else ddp
    watch = ish.watch(target)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(3):
        target(make()).float().pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
    return sorted(watch.probes)


@pytest.mark.parametrize(
    ("kind", "compiled"), [("mlp", False), ("transformer", False), ("mlp", True)]
)
def test_no_check_fires_on_healthy_runs(cluster: ish.Cluster, kind: str, compiled: bool) -> None:
    run = cluster.run(_healthy, kind, compiled)
    assert "ddp" in run.results[0]
    for rank in range(2):
        (inst,) = run.ddp.instances_of(rank)
        assert [(it.forwards, it.finished) for it in inst.iterations] == [(1, True)] * 3
        grads = [c for c in run.ddp.collectives(rank) if c.purpose == "gradients"]
        assert len(grads) >= 3
    assert not [f for f in run.ddp.findings if f.level == "error"], run.ddp.findings
