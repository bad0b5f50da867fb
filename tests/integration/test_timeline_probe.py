"""The timeline probe on real 2-rank runs: FSDP2 eager and per-block compiled, the PR 89330
failure reproduced (views created up front), DDP eager and compiled, bit-identical
training, detach, options (Note [Timeline probe])."""

from __future__ import annotations

import gc
from typing import Any

import msgspec
import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import interactive_shard as ish
from interactive_shard.timeline.events import TimelineSpans, TimelineWatch
from interactive_shard.timeline.examples import FlatViewBlocks, Stack


def _fsdp2(ctx: Any, compiled: bool, steps: int = 2) -> str:
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    model = Stack(blocks=3, width=64)
    for block in model.layers:
        fully_shard(block)
        if compiled:
            block.compile(backend="aot_eager")
    fully_shard(model)
    watch = ish.watch(model, timeline=True)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(steps):
        model(torch.randn(8, 64)).sum().backward()
        opt.step()
        opt.zero_grad()
    return repr(watch.probes["timeline"])


def _raw(run: ish.Run, rank: int, iteration: int) -> list[Any]:
    spans = [
        s
        for e in run.store.of_kind(TimelineSpans.KIND)
        if e.rank == rank
        for b in [msgspec.convert(e.payload, TimelineSpans)]
        if b.iteration == iteration
        for s in b.spans
    ]
    return sorted(spans, key=lambda s: (s.start, s.end))


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_fsdp2_each_units_reduce_scatter_follows_its_backward(
    cluster: ish.Cluster, compiled: bool
) -> None:
    run = cluster.run(_fsdp2, compiled)
    assert all("TimelineProbe(fsdp2, 3 modules, iteration=2" in r for r in run.results)
    kind = "compiled_backward" if compiled else "backward"
    t = run.timeline
    for rank in range(2):
        watch = msgspec.convert(run.store.of_kind(TimelineWatch.KIND)[rank].payload, TimelineWatch)
        assert watch.target == "fsdp2" and watch.modules == ["layers.0", "layers.1", "layers.2"]
        order = t.order(rank=rank, iteration=2, phase="backward", kinds=[kind, "collective"])
        expected = []
        for unit in ("layers.2", "layers.1", "layers.0"):
            expected += [unit, "reduce_scatter"]
        assert [n for n in order if n != "all_gather"] == expected
        spans = t.spans(rank=rank, iteration=2)
        for unit in ("layers.2", "layers.1", "layers.0"):
            (back,) = [s for s in spans if s.kind == kind and s.name == unit]
            (post,) = [s for s in spans if s.name == f"post_backward:{unit}"]
            (pre,) = [s for s in spans if s.name == f"pre_backward:{unit}"]
            assert pre.end <= back.start <= back.end <= post.start  # the unit's backward first
        collectives = [s for s in spans if s.kind == "collective"]
        ops = [(s.detail["op"], s.detail["backward"]) for s in collectives]
        # FSDP2: each unit all-gathers in forward and (resharded after it) again in
        # backward, and reduce-scatters its gradients.
        assert ops.count(("reduce_scatter", True)) == 3
        assert ops.count(("all_gather", False)) == ops.count(("all_gather", True)) == 3
        assert {s.detail["nbytes"] for s in collectives if s.detail["op"] == "reduce_scatter"} == {
            (64 * 64 + 64) * 4
        }
        assert [s.name for s in spans if s.kind == "optimizer"] == ["SGD"]


def _flat(ctx: Any, up_front: bool) -> str:
    torch.manual_seed(0)
    model = FlatViewBlocks(blocks=4, width=256, up_front=up_front)
    watch = ish.watch(model, timeline=True)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(3):
        model(torch.randn(64, 256)).sum().backward()
        opt.step()
        opt.zero_grad()
    return repr(watch)


def test_views_created_up_front_bunch_every_reduction_after_every_compiled_backward(
    cluster: ish.Cluster,
) -> None:
    fresh, up_front = cluster.run(_flat, False), cluster.run(_flat, True)
    kinds = ["compiled_backward", "collective"]
    blocks = [f"blocks.{i}" for i in (3, 2, 1, 0)]
    for rank in range(2):
        order = fresh.timeline.order(rank=rank, iteration=3, kinds=kinds, phase="backward")
        assert order == [x for b in blocks for x in (b, "all_reduce")]
        order = up_front.timeline.order(rank=rank, iteration=3, kinds=kinds, phase="backward")
        assert order == [*blocks, *["all_reduce"] * 4]
    # Interleaved, a rank's all-reduce runs while its earlier blocks compute (on the rank
    # that waits for the other: the straggler's all-reduces finish at once); bunched,
    # none does.
    interleaved = max(fresh.timeline.overlap(rank=r, iteration=3) for r in range(2))
    bunched = max(up_front.timeline.overlap(rank=r, iteration=3) for r in range(2))
    assert bunched < 0.02 and interleaved > bunched + 0.02, (interleaved, bunched)


def _ddp(ctx: Any, compiled: bool) -> dict[str, Any]:
    torch.manual_seed(0)
    model = Stack(blocks=4, width=512)
    ddp = DDP(model, bucket_cap_mb=1)
    target = torch.compile(ddp, backend="aot_eager") if compiled else ddp
    watch = ish.watch(target, timeline=True)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(3):
        target(torch.randn(16, 512)).sum().backward()
        opt.step()
        opt.zero_grad()
    return {
        "probes": sorted(watch.probes),
        "params": [p.detach().clone() for p in model.parameters()],
    }


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_ddp_bucket_all_reduces_on_the_time_axis_match_the_bucket_probe(
    cluster: ish.Cluster, compiled: bool
) -> None:
    run = cluster.run(_ddp, compiled)
    assert run.results[0]["probes"] == (
        ["buckets", "ddp", "splits", "timeline"] if compiled else ["buckets", "ddp", "timeline"]
    )
    t = run.timeline
    overlaps = []
    for rank in range(2):
        for it in (2, 3):
            spans = t.spans(rank=rank, iteration=it)
            reduces = [s for s in spans if s.detail.get("source") == "reducer"]
            buckets = run.buckets.observed(it, rank=rank)
            assert [s.detail["nbytes"] for s in reduces] == [b.nbytes for b in buckets]
            ready = [s.name for s in spans if s.name.startswith("grad_ready:")]
            assert sorted(ready) == sorted(
                f"grad_ready:{n}" for n, _ in Stack(4, 512).named_parameters()
            )
            if compiled:
                pieces = [s for s in spans if s.kind == "compiled_backward"]
                partitions = run.splits.compilations(rank)[-1].partitions
                assert len(pieces) == len(partitions) > 1
            overlaps.append(t.overlap(rank=rank, iteration=it))
    # DDP's all-reduces are asynchronous: they overlap the backward still running. Not
    # in every iteration of a loaded 2-core machine (CI once saw one of the four at 0 %:
    # the last piece's backward done before a descheduled rank launched its bucket).
    assert max(overlaps) > 0, overlaps


def _plain_vs_watched(ctx: Any) -> bool:
    out = []
    for watched in (False, True):
        torch.manual_seed(0)
        model = Stack(blocks=3, width=64)
        ddp = DDP(model)
        watch = ish.watch(ddp, timeline=True) if watched else None
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        gen = torch.Generator().manual_seed(ctx.rank)
        for _ in range(3):
            ddp(torch.randn(8, 64, generator=gen)).pow(2).sum().backward()
            opt.step()
            opt.zero_grad()
        if watch is not None:
            watch.detach()
        out.append([p.detach().clone() for p in model.parameters()])
    return all(torch.equal(a, b) for a, b in zip(*out, strict=True))


def test_training_is_bit_identical_with_the_timeline_probe(cluster: ish.Cluster) -> None:
    assert cluster.run(_plain_vs_watched).results == [True, True]


def _detach(ctx: Any) -> dict[str, Any]:
    from interactive_shard.probing import collectives as _collectives

    gc.collect()  # models earlier tests left watched stop listening when collected
    model = FlatViewBlocks(blocks=2, width=32)
    listeners = len(_collectives._LISTENERS)  # probes earlier tests left attached
    before = {name: getattr(dist, name) for name in ("all_reduce", "reduce_scatter_tensor")}
    impls = [b._compiled_call_impl for b in model.blocks]
    hooks = (len(model._forward_pre_hooks), len(model._forward_hooks))
    watch = ish.watch(model, timeline=True, depth=1)
    patched = dist.all_reduce is not dist.all_reduce.__wrapped__  # type: ignore[attr-defined]
    listening = len(_collectives._LISTENERS) == listeners + 1
    watch.detach()
    probe = watch.probes["timeline"]
    emitted = probe.emitted
    model(torch.randn(4, 32)).sum().backward()
    return {
        "patched": patched and listening,
        "restored": {n: getattr(dist, n) for n in before} == before
        and len(_collectives._LISTENERS) == listeners,
        "impls": [b._compiled_call_impl for b in model.blocks] == impls,
        "hooks": (len(model._forward_pre_hooks), len(model._forward_hooks)) == hooks,
        "silent": probe.emitted == emitted,
    }


def test_detach_restores_everything(cluster: ish.Cluster) -> None:
    for result in cluster.run(_detach).results:
        assert result == {
            "patched": True,
            "restored": True,
            "impls": True,
            "hooks": True,
            "silent": True,
        }


def _options(ctx: Any) -> list[str]:
    model = nn.Linear(4, 4)
    out = []
    for kwargs in ({"depth": 2}, {"timeline": True, "depth": -1}, {"timeline": True, "depth": "x"}):
        try:
            ish.watch(model, **kwargs)
            out.append("accepted")
        except (TypeError, ValueError) as err:
            out.append(str(err))
    ddp = DDP(nn.Linear(4, 4))
    out.append(",".join(sorted(ish.watch(ddp, timeline=False).probes)))
    return out


def test_options_are_checked(cluster: ish.Cluster) -> None:
    need, negative, text, plain = cluster.run(_options).results[0]
    assert "need timeline=True" in need
    assert "depth=-1" in negative and "depth='x'" in text
    assert plain == "buckets,ddp"  # timeline=False: not the timeline
