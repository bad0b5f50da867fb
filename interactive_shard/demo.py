"""The main job: a real 2-rank CPU tour that writes the views as a report.

The tour trains a small DDP model eagerly (the bucket map: what DDP's buckets hold and
when each is reduced), then a few more steps through ``torch.compile`` of the same DDP
model (the graph splits: where DDPOptimizer cut it, and how the pieces compare with
DDP's runtime buckets, and the compiled steps' timeline: each piece's backward, the
hooks and the bucket all-reduces on one time axis). ``ish.watch`` on the compiled model
watches all three. Last, on the
same ranks and in the same run, a few steps of a narrow copy of the model under FSDP2
with a bfloat16 policy that reduces in float32, every block a unit of its own (the
mixed-precision view: each unit's dtype per phase, planned in the kernel by
``ish.plan_precision`` and observed on the ranks). One run, one report.
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
# The FSDP2 phase: narrow, since bfloat16 matmuls are slow on CPUs without bf16 instructions.
PRECISION_WIDTH = 64
PRECISION_UNITS = ("block1", "block2", "")  # fully_shard order: inner units, then the root
BATCH, FEATURES = 64, 32


def tour_model(width: int = WIDTH) -> Any:
    """A small user model with named layers, so buckets and legends read ``block1.weight``
    rather than ``2.weight`` (an ``nn.Sequential`` names its layers by index). Being a
    user ``nn.Module`` subclass matters for ``torch.compile``: dynamo skips frames inside
    ``torch.nn``, so ``torch.compile(DDP(nn.Sequential(...)))`` would compile nothing."""
    import torch
    from torch import nn

    class TourMLP(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Linear(FEATURES, width)
            self.block1 = nn.Linear(width, width)
            self.block2 = nn.Linear(width, width)
            self.head = nn.Linear(width, 1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = torch.relu(self.embed(x))
            h = h + torch.relu(self.block1(h))
            h = h + torch.relu(self.block2(h))
            return self.head(h)

    return TourMLP()


def precision_policies() -> dict[str, Any]:
    """The FSDP2 phase's policies, by unit (``ish.plan_precision`` takes the same dict):
    compute in bfloat16, reduce-scatter gradients in float32."""
    import torch
    from torch.distributed.fsdp import MixedPrecisionPolicy

    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    return dict.fromkeys(PRECISION_UNITS, policy)


def precision_model(world_size: int) -> Any:
    """``tour_model(PRECISION_WIDTH)`` sharded by FSDP2 over the CPU ranks, one unit per
    block plus the root (which owns ``embed`` and ``head``)."""
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    model = tour_model(PRECISION_WIDTH)
    mesh = init_device_mesh("cpu", (world_size,))
    for fqn, policy in precision_policies().items():
        fully_shard(model.get_submodule(fqn), mesh=mesh, mp_policy=policy)
    return model


def train(
    ctx: Any, steps: int = 30, compiled_steps: int = 3, precision_steps: int = 3
) -> dict[str, float]:
    """A small MLP trained with DDP, ``steps`` eager steps then ``compiled_steps`` through
    ``torch.compile`` (the first compiled forward compiles), then ``precision_steps`` of a
    narrow copy under FSDP2 mixed precision; emits loss and progress every step."""
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
    # compiled, the graph splits of the compile, and (timeline=True) the compiled
    # steps' timeline: each piece's compiled backward, DDP's gradient-ready hooks and
    # bucket all-reduces on one time axis.
    ish.watch(compiled, timeline=True)
    opt = torch.optim.Adam(ddp.parameters(), lr=3e-3)
    # Watched before its first forward: each unit's dtypes in every phase (the view
    # counts iterations from the first FSDP2 forward).
    sharded = precision_model(ctx.world_size) if precision_steps else None
    if sharded is not None:
        ish.watch(sharded)
        sharded_opt = torch.optim.Adam(sharded.parameters(), lr=3e-3)
    gen = torch.Generator().manual_seed(1 + ctx.rank)  # each rank sees its own data
    w_true = torch.randn(FEATURES, 1, generator=torch.Generator().manual_seed(42))
    loss = fsdp2_loss = torch.tensor(0.0)
    for step in ctx.steps(steps + compiled_steps + precision_steps):
        x = torch.randn(BATCH, FEATURES, generator=gen)
        y = x @ w_true
        if step > steps + compiled_steps and sharded is not None:
            # bfloat16 out of the root; the loss in float32
            fsdp2_loss = nn.functional.mse_loss(sharded(x).float(), y)
            sharded_opt.zero_grad()
            fsdp2_loss.backward()
            sharded_opt.step()
            ctx.emit("scalar", name="FSDP2 bf16 loss", value=fsdp2_loss.item())
            continue
        net = ddp if step <= steps else compiled
        loss = nn.functional.mse_loss(net(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        ctx.emit("scalar", name="loss", value=loss.item())
    checksum = torch.tensor([sum(p.sum().item() for p in model.parameters())])
    dist.all_reduce(checksum)
    print(f"rank {ctx.rank}: final loss {loss.item():.4f}")
    return {
        "loss": loss.item(),
        "param_checksum": checksum.item() / ctx.world_size,
        "fsdp2_loss": fsdp2_loss.item(),
    }


def run_demo(out: Path, steps: int = 30, compiled_steps: int = 3, precision_steps: int = 3) -> Path:
    import torch

    import interactive_shard as ish

    out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    with ish.Cluster(nprocs=2, device="cpu", timeout=120) as cluster:
        log.info("started %r", cluster)
        run = cluster.run(train, steps, compiled_steps, precision_steps)
    if precision_steps:
        # Planned in this process, without ranks: the report shows planned vs observed.
        precision = run.model("precision")  # run.precision
        precision.plan = ish.plan_precision(
            tour_model(PRECISION_WIDTH),
            precision_policies(),
            example_inputs=torch.randn(BATCH, FEATURES),
        )
        comparison = precision.compare(precision.plan)
        if not comparison.matches:
            log.warning("precision: observed differs from the plan: %s", comparison.differences)
    ledger = run.model("collectives")  # run.collectives: every rank recorded it
    divergence = ledger.divergence()
    if divergence is None:
        log.info("ledger: %d collectives, the ranks agree", len(ledger))
    else:
        log.warning("ledger: %s", divergence.message)
    run.save(out / "run.jsonl")
    index = run.to_html(out / "index.html")
    log.info("demo finished in %.1f s: %d events", time.monotonic() - started, len(run.store))
    return index
