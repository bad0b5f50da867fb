"""Advice is evidence: what ``run.ddp.findings`` recommends runs, on the model it saw.

Note [Undefined gradients] (``probing/__init__.py``): a parameter whose output the loss
ignores gets an undefined gradient through DDP's ``_DDPSink``; it is unused, not ready,
and then neither ``static_graph=True`` nor ``find_unused_parameters=False`` may be
recommended (both crash with "Expected to have finished reduction").
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import interactive_shard as ish


class Encoder(nn.Module):
    """Two outputs, as a Hugging Face encoder's hidden states and pooler."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 8))
        self.pooler = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        h = self.body(x)
        return {"hidden": h, "pooled": self.pooler(h)}


def _train(ctx: Any, use_pooler: bool, steps: int = 4, **ddp_kwargs: Any) -> str:
    torch.manual_seed(0)
    ddp = DDP(Encoder(), **ddp_kwargs)
    ish.watch(ddp)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    gen = torch.Generator().manual_seed(ctx.rank)
    try:
        for _ in ctx.steps(steps):
            out = ddp(torch.randn(4, 8, generator=gen))
            loss = out["hidden"].pow(2).mean()
            if use_pooler:
                loss = loss + out["pooled"].pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
    except RuntimeError as exc:
        return str(exc).splitlines()[0]
    return "ok"


def _advice(run: ish.Run) -> dict[str, str]:
    return {f.kind: f.message for f in run.ddp.findings if f.level == "info"}


def test_a_parameter_the_loss_ignores_is_unused_and_no_crashing_setting_is_advised(
    cluster: ish.Cluster,
) -> None:
    run = cluster.run(_train, False, find_unused_parameters=True)
    assert run.results == ["ok", "ok"]
    advice = _advice(run)
    assert "static_graph_safe" not in advice
    assert (
        "['pooler.bias', 'pooler.weight'] were unused, so it is needed"
        in advice["find_unused_cost"]
    )
    assert "static_graph=True" not in advice["find_unused_cost"]
    for it in run.buckets.iterations:
        record = run.buckets.record(it, 0)
        assert record is not None and sorted(record.unready) == ["pooler.bias", "pooler.weight"]
    # What was not advised would indeed have crashed, on this torch too.
    for setting in ({"static_graph": True}, {"find_unused_parameters": False}):
        crashed = cluster.run(_train, False, **setting).results
        assert all("Expected to have finished reduction" in r for r in crashed), setting


@pytest.mark.parametrize("kind", ["static_graph_safe", "find_unused_cost"])
def test_what_is_advised_when_every_parameter_is_used_runs(cluster: ish.Cluster, kind: str) -> None:
    run = cluster.run(_train, True, find_unused_parameters=True)
    advice = _advice(run)
    if kind == "static_graph_safe":
        assert "static_graph=True would be safe" in advice[kind]
        assert cluster.run(_train, True, static_graph=True).results == ["ok", "ok"]
    else:
        assert "find_unused_parameters=False saves that" in advice[kind]
        assert cluster.run(_train, True).results == ["ok", "ok"]
