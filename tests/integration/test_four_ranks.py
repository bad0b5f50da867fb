"""Four real gloo CPU ranks: every view on one DDP run (bucket map, timeline with its
straggler, lifecycle, monitor), a silent divergence and an unused parameter named across
the ranks, and FSDP2 mixed precision against its plan (issue 12: more ranks)."""

from __future__ import annotations

import time
from typing import Any

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import interactive_shard as ish
from interactive_shard.timeline.examples import Stack

RANKS = 4
STRAGGLER = 3


CLUSTER = {"nprocs": RANKS, "timeout": 180}  # the shared fixture's options (conftest.py)


def _ddp_run(ctx: Any, steps: int = 3) -> dict[str, Any]:
    torch.manual_seed(0)
    model = Stack(blocks=4, width=64)
    ddp = DDP(model, bucket_cap_mb=0.02)
    ish.watch(ddp, timeline=True)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    gen = torch.Generator().manual_seed(ctx.rank)
    for _ in ctx.steps(steps):
        loss = ddp(torch.randn(8, 64, generator=gen)).pow(2).mean()
        if ctx.rank == STRAGGLER:
            time.sleep(0.05)  # late to every bucket's all-reduce
        loss.backward()
        ctx.emit("scalar", name="loss", value=loss.item())
        opt.step()
        opt.zero_grad()
    return {"params": [p.detach().clone() for p in model.parameters()]}


def test_every_view_of_a_ddp_run_on_four_ranks(cluster: ish.Cluster) -> None:
    run = cluster.run(_ddp_run)
    # Monitor: four ranks, each at its last step with its loss line.
    assert [r.step for r in run.monitor.ranks] == [3] * RANKS
    assert sorted(run.monitor.scalars["loss"]) == list(range(RANKS))
    # Bucket map: what DDP did on every rank is what the planner says, and no finding.
    buckets = run.buckets
    assert buckets.ranks == list(range(RANKS)) and buckets.iterations == [1, 2, 3]
    assert all(buckets.compare(i, r).matches for i in (1, 2, 3) for r in range(RANKS))
    assert len(buckets.observed(2, 0)) > 1 and buckets.health == []
    # Timeline: each bucket all-reduce is matched on the four ranks, and the rank that
    # slept before its backward is the straggler the others waited for.
    reduces = [c for c in run.timeline.collectives(iteration=3) if c.op == "all_reduce"]
    assert len(reduces) == len(buckets.observed(3, 0))
    for c in reduces:
        assert sorted(c.starts) == list(range(RANKS))
        assert c.straggler == STRAGGLER
        assert all(c.waited[r] > 0.02 for r in range(RANKS) if r != STRAGGLER)
    # Lifecycle: one instance per rank, every reduction finished, no check fired.
    for rank in range(RANKS):
        (instance,) = run.ddp.instances_of(rank)
        assert [it.finished for it in instance.iterations if it.backward] == [True] * 3
    assert [f for f in run.ddp.findings if f.level == "error"] == []
    # Training itself: the ranks agree.
    first = run.results[0]["params"]
    for other in run.results[1:]:
        assert all(torch.equal(a, b) for a, b in zip(first, other["params"], strict=True))


class Twice(nn.Module):
    """One layer run twice under reentrant checkpointing: its gradient is ready twice,
    DDP reduces the first arrival only, and the ranks silently diverge (notebook 02)."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(8, 8)
        self.head = nn.Linear(8, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from torch.utils.checkpoint import checkpoint

        h = checkpoint(self.layer, x, use_reentrant=True)
        return self.head(checkpoint(self.layer, h, use_reentrant=True))


def _twice(ctx: Any) -> float:
    torch.manual_seed(0)
    ddp = DDP(Twice())
    ish.watch(ddp)
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(ctx.rank), requires_grad=True)
    ddp(x).sum().backward()
    return float(ddp.module.layer.weight.grad.sum())


def test_a_silent_divergence_is_named_across_four_ranks(cluster: ish.Cluster) -> None:
    run = cluster.run(_twice)
    (finding,) = [f for f in run.buckets.health if f.kind == "divergence"]
    assert finding.iteration == 1 and finding.fqns == ["layer.weight"]
    assert finding.ranks == list(range(RANKS)), finding
    assert len(set(run.results)) == RANKS  # four different gradients, no error raised


class Heads(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Linear(16, 16)
        self.head = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor, head: bool = True) -> torch.Tensor:
        y = self.body(x)
        return self.head(y) if head else y


def _unused(ctx: Any) -> None:
    torch.manual_seed(0)
    ddp = DDP(Heads())
    watch = ish.watch(ddp)
    ddp(torch.randn(4, 16)).sum().backward()
    ddp(torch.randn(4, 16), head=False).sum().backward()  # head unused: cannot finish
    watch.detach()


def test_an_unused_parameter_is_named_on_every_rank(cluster: ish.Cluster) -> None:
    run = cluster.run(_unused)
    (finding,) = [f for f in run.ddp.findings if f.kind == "unfinished"]
    assert finding.ranks == list(range(RANKS)) and finding.iteration == 2
    assert finding.fqns == ["head.weight", "head.bias"]


def _fsdp2(ctx: Any) -> None:
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    torch.manual_seed(0)
    model = Stack(blocks=4, width=32)
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for block in model.layers:
        fully_shard(block, mp_policy=policy)
    fully_shard(model, mp_policy=policy)
    ish.watch(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(2):
        model(torch.randn(8, 32)).sum().backward()
        opt.step()
        opt.zero_grad()


def test_fsdp2_mixed_precision_on_four_ranks_is_what_was_planned(cluster: ish.Cluster) -> None:
    from torch.distributed.fsdp import MixedPrecisionPolicy

    run = cluster.run(_fsdp2)
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    torch.manual_seed(0)
    model = Stack(blocks=4, width=32)
    units = ["", *(f"layers.{i}" for i in range(4))]
    plan = ish.plan_precision(model, {fqn: policy for fqn in units})
    assert run.precision.ranks == list(range(RANKS))
    assert run.precision.compare(plan).matches
    for rank in range(RANKS):
        seen = run.precision.observed("layers.2", rank=rank, iteration=2)
        assert (seen["param"], seen["reduce"]) == ("torch.bfloat16", "torch.float32")
        (scatter,) = [
            c
            for c in run.precision.collectives("layers.2", rank=rank, iteration=2)
            if c.op == "reduce_scatter"
        ]
        assert scatter.nbytes == (32 * 32 + 32) * 4  # fp32 reduce: the full unit's grads
