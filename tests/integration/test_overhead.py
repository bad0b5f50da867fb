"""The run states its own cost: real 2-rank gloo DDP under ``ish.watch``, each probe's
time per rank in ``run.overhead`` (Note [Share of the step]), the badge on every view's
status line, and each run counting from zero."""

from __future__ import annotations

import time
from typing import Any

import pytest
import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import interactive_shard as ish
from interactive_shard.features import FEATURES

STEPS = 20


def _model() -> DDP:
    torch.manual_seed(0)
    return DDP(nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 8)))


def _steps(ddp: DDP, steps: int) -> float:
    """Train ``steps`` steps; the seconds they took."""
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    x = torch.randn(32, 64)
    start = time.monotonic()
    for _ in range(steps):
        ddp(x).square().mean().backward()
        opt.step()
        opt.zero_grad()
    return time.monotonic() - start


def _watched(ctx: Any) -> list[str]:
    ddp = _model()
    watch = ish.watch(ddp)
    ctx.state["overhead"] = (ddp, watch)
    _steps(ddp, STEPS)
    return sorted(watch.probes)


def _again(ctx: Any) -> float:
    ddp, _ = ctx.state["overhead"]
    time.sleep(0.5)  # before the first step: no probe is active yet
    return _steps(ddp, 5)


def _detach(ctx: Any) -> None:
    _, watch = ctx.state.pop("overhead")
    watch.detach()


@pytest.fixture(scope="module")
def runs(cluster: ish.Cluster) -> Any:
    first = cluster.run(_watched)
    second = cluster.run(_again)
    cluster.run(_detach)
    return first, second


def test_each_probe_states_its_share_of_the_step_on_every_rank(runs: Any) -> None:
    run, _ = runs
    assert run.results[0] == ["buckets", "ddp"]
    overhead = run.overhead
    assert overhead.ranks == [0, 1]
    for probe in ("buckets", "ddp", "collectives", "sending"):
        for rank in (0, 1):
            row = overhead.row(probe, rank)
            assert row is not None, (probe, rank, overhead.table())
            assert 0 < row.share < 1 and row.spent > 0 and row.calls > 0, row
    # the hooks' probes count the watched model's iterations (numbered as DDP does)
    assert overhead.row("buckets", 0).iterations == STEPS  # type: ignore[union-attr]
    # a rank's share adds its probes'; the run's is the mean of its ranks'
    for rank in (0, 1):
        total = sum(r.share for r in overhead.rows() if r.rank == rank)
        assert overhead.share(rank=rank) == pytest.approx(total)
    assert 0 < overhead.share() < 1
    assert overhead.badge().startswith("probes: ") and "of the step" in overhead.badge()


def test_every_view_shows_the_badge_on_its_status_line(runs: Any) -> None:
    run, _ = runs
    badge = run.overhead.badge(str)
    assert badge
    for feature in FEATURES:
        model = run.model(feature.name)
        view = feature.view_of(run if feature.name == "monitor" else model)
        view.widget  # noqa: B018
        line = view._title.value if feature.name == "monitor" else view.status_html.value
        assert "ish-overhead" in line and badge.split(" (")[0] in line, (feature.name, line)


def test_each_run_counts_from_zero(runs: Any) -> None:
    first, second = runs
    trained = max(second.results)  # the seconds each rank's 5 steps took
    for rank in (0, 1):
        row = second.overhead.row("buckets", rank)
        assert row is not None
        # From this run's first callback, after its sleep: not since the first run.
        assert row.active <= trained + 0.05, (row, trained)
        assert row.calls < first.overhead.row("buckets", rank).calls  # type: ignore[union-attr]
        assert row.iterations == STEPS + 5
