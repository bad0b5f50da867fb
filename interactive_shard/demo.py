"""The main job: a real 2-rank CPU tour that writes the views as a report.

The tour trains a small DDP model eagerly (the bucket map: what DDP's buckets hold and
when each is reduced), then a few more steps through ``torch.compile`` of the same DDP
model (the graph splits: where DDPOptimizer cut it, and how the pieces compare with
DDP's runtime buckets). ``ish.watch`` on the compiled model watches both.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


WIDTH = 512  # a block holds 1 MiB of parameters: at a 1 MiB cap, the model compiles in 3 pieces
BUCKET_CAP_MB = 1  # >= DDPOptimizer's 1 MiB first bucket, which torch.compile requires
BACKEND = "aot_eager"  # AOTAutograd without code generation: inductor's cuts, compiled fast


def tour_model() -> Any:
    """A small user model with named layers, so buckets and legends read ``block1.weight``
    rather than ``2.weight`` (an ``nn.Sequential`` names its layers by index). Being a
    user ``nn.Module`` subclass matters for ``torch.compile``: dynamo skips frames inside
    ``torch.nn``, so ``torch.compile(DDP(nn.Sequential(...)))`` would compile nothing."""
    import torch
    from torch import nn

    class TourMLP(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Linear(32, WIDTH)
            self.block1 = nn.Linear(WIDTH, WIDTH)
            self.block2 = nn.Linear(WIDTH, WIDTH)
            self.head = nn.Linear(WIDTH, 1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = torch.relu(self.embed(x))
            h = h + torch.relu(self.block1(h))
            h = h + torch.relu(self.block2(h))
            return self.head(h)

    return TourMLP()


def train(ctx: Any, steps: int = 30, compiled_steps: int = 3) -> dict[str, float]:
    """A small MLP trained with DDP, ``steps`` eager steps then ``compiled_steps`` through
    ``torch.compile`` (the first compiled forward compiles); emits loss and progress every
    step."""
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    import interactive_shard as ish

    torch.manual_seed(0)
    model = tour_model()
    ddp = DDP(model, bucket_cap_mb=BUCKET_CAP_MB)
    compiled = torch.compile(ddp, backend=BACKEND)
    # Watching the compiled model watches the DDP model inside it too: the bucket map
    # (what DDP's buckets hold and when each is reduced) of every step, eager or
    # compiled, and the graph splits of the compile.
    ish.watch(compiled)
    opt = torch.optim.Adam(ddp.parameters(), lr=3e-3)
    gen = torch.Generator().manual_seed(1 + ctx.rank)  # each rank sees its own data
    w_true = torch.randn(32, 1, generator=torch.Generator().manual_seed(42))
    loss = torch.tensor(0.0)
    for step in ctx.steps(steps + compiled_steps):
        x = torch.randn(64, 32, generator=gen)
        y = x @ w_true
        net = ddp if step <= steps else compiled
        loss = nn.functional.mse_loss(net(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        ctx.emit("scalar", name="loss", value=loss.item())
    checksum = torch.tensor([sum(p.sum().item() for p in model.parameters())])
    dist.all_reduce(checksum)
    print(f"rank {ctx.rank}: final loss {loss.item():.4f}")
    return {"loss": loss.item(), "param_checksum": checksum.item() / ctx.world_size}


def run_demo(out: Path, steps: int = 30, compiled_steps: int = 3) -> Path:
    import interactive_shard as ish

    out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    with ish.Cluster(nprocs=2, device="cpu", timeout=120) as cluster:
        log.info("started %r", cluster)
        run = cluster.run(train, steps, compiled_steps)
    run.save(out / "run.jsonl")
    index = run.to_html(out / "index.html")
    log.info("demo finished in %.1f s: %d events", time.monotonic() - started, len(run.store))
    return index
