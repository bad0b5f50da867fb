"""The main job: a real 2-rank CPU tour that writes the views as a report."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


def tour_model() -> Any:
    """A small user model with named layers, so buckets and legends read ``block1.weight``
    rather than ``2.weight`` (an ``nn.Sequential`` names its layers by index)."""
    import torch
    from torch import nn

    class TourMLP(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Linear(32, 256)
            self.block1 = nn.Linear(256, 256)
            self.block2 = nn.Linear(256, 256)
            self.head = nn.Linear(256, 1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = torch.relu(self.embed(x))
            h = h + torch.relu(self.block1(h))
            h = h + torch.relu(self.block2(h))
            return self.head(h)

    return TourMLP()


def train(ctx: Any, steps: int = 30) -> dict[str, float]:
    """A small MLP trained with DDP; emits loss and progress every step."""
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    import interactive_shard as ish

    torch.manual_seed(0)
    model = tour_model()
    ddp = DDP(model, bucket_cap_mb=0.1)
    ish.watch(ddp)  # bucket map: what DDP's buckets hold and when each is reduced
    opt = torch.optim.Adam(ddp.parameters(), lr=3e-3)
    gen = torch.Generator().manual_seed(1 + ctx.rank)  # each rank sees its own data
    w_true = torch.randn(32, 1, generator=torch.Generator().manual_seed(42))
    loss = torch.tensor(0.0)
    for _ in ctx.steps(steps):
        x = torch.randn(64, 32, generator=gen)
        y = x @ w_true
        loss = nn.functional.mse_loss(ddp(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        ctx.emit("scalar", name="loss", value=loss.item())
    checksum = torch.tensor([sum(p.sum().item() for p in model.parameters())])
    dist.all_reduce(checksum)
    print(f"rank {ctx.rank}: final loss {loss.item():.4f}")
    return {"loss": loss.item(), "param_checksum": checksum.item() / ctx.world_size}


def run_demo(out: Path, steps: int = 30) -> Path:
    import interactive_shard as ish

    out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    with ish.Cluster(nprocs=2, device="cpu", timeout=120) as cluster:
        log.info("started %r", cluster)
        run = cluster.run(train, steps)
    run.save(out / "run.jsonl")
    index = run.to_html(out / "index.html")
    log.info("demo finished in %.1f s: %d events", time.monotonic() - started, len(run.store))
    return index
