"""A late ``ish.watch``: DDP already ran some iterations. The probes number iterations as
DDP numbers them, and the bucket map refuses to compare an iteration it did not see,
saying why (before, a late watch's first iteration was called 1 and compared with the
plan's single bucket: "13 bucket(s) observed, 1 planned")."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import interactive_shard as ish
from interactive_shard.buckets.summary import summary
from interactive_shard.probing.compat import ddp as compat_ddp


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(*[nn.Linear(128, 128) for _ in range(4)])


def _late(ctx: Any, before: int, after: int = 3, forget: bool = False) -> int | None:
    ddp = DDP(_model(), bucket_cap_mb=0.1)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)

    def step() -> None:
        opt.zero_grad()
        ddp(torch.randn(4, 128)).pow(2).mean().backward()
        opt.step()

    for _ in range(before):
        step()
    if forget:  # as a torchrun rank whose recorder started after DDP was built
        from interactive_shard.probing import collective_log

        collective_log.recorder().instance(ddp).born = False  # type: ignore[union-attr]
    ish.watch(ddp)
    for _ in ctx.steps(after):
        step()
    return compat_ddp.iterations_done(ddp)


@pytest.mark.parametrize("before", [0, 1, 2, 12])
def test_a_late_watch_numbers_iterations_as_ddp_does(cluster: ish.Cluster, before: int) -> None:
    run = cluster.run(_late, before)
    assert run.buckets.iterations == [before + 1, before + 2, before + 3]
    assert run.buckets.info is not None and run.buckets.info.first_iteration == before + 1
    for it in run.buckets.iterations:
        comparison = run.buckets.compare(it)
        assert comparison.matches, comparison.differences
    (instance,) = run.ddp.instances_of(0)
    assert [it.index for it in instance.iterations] == run.buckets.iterations  # they agree
    text = summary(run.buckets)
    if before:
        first = f"first watched iteration is DDP's iteration {before + 1}"
        with pytest.raises(ValueError, match=first):
            run.buckets.compare(1)
        assert f"DDP had run {before} iteration(s)" in text
    else:
        assert "Watched late" not in text


@pytest.mark.parametrize(("before", "known"), [(0, 1), (1, None), (3, 4), (12, None)])
def test_ddps_own_count_read_where_construction_was_not_seen(
    cluster: ish.Cluster, before: int, known: int | None
) -> None:
    """DDP logs its count only up to ten, and one iteration reads as none: then the
    iterations are numbered from 1 and comparing them is refused."""
    run = cluster.run(_late, before, forget=True)
    assert run.buckets.info is not None
    assert run.buckets.info.first_iteration == known
    if known is None:
        assert run.buckets.iterations == [1, 2, 3]
        with pytest.raises(ValueError, match="unknown number of iterations"):
            run.buckets.compare(2)
    else:
        assert run.buckets.iterations[0] == known
        assert run.buckets.compare(known + 1).matches
