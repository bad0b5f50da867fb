"""One DDP training step, shared by every launcher that ``bench_launch.py`` compares.

Each launcher runs exactly ``first_ddp_step()`` on every rank once the process group
is up, and rank 0 reports the wall-clock time (``time.time()``) at which its first
step finished:

* ``interactive_shard``: ``ish_step(ctx)`` returns it (``run.results[0]``);
* ``torch.multiprocessing.spawn``: ``mp_worker`` writes it to a file;
* ``torchrun``: running this file as a script prints ``STEP_DONE <time>``.

Imports of torch stay inside the functions so that a spawned child that re-imports
this module (or the benchmark script) pays nothing extra before it starts its work.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

MARKER = "STEP_DONE"
IN_FEATURES = 64
OUT_FEATURES = 16
BATCH = 32


def first_ddp_step() -> float:
    """Build a small DDP model, run one forward/backward/optimizer step; return time.time()."""
    import torch
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = DDP(nn.Linear(IN_FEATURES, OUT_FEATURES))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(BATCH, IN_FEATURES)
    loss = model(x).square().mean()
    loss.backward()
    opt.step()
    opt.zero_grad()
    return time.time()


def ish_step(ctx: Any) -> float:
    """interactive_shard: the process group is already initialised by the cluster."""
    return first_ddp_step()


def mp_worker(rank: int, world_size: int, port: int, out_path: str) -> None:
    """torch.multiprocessing.spawn target: init the group, step, rank 0 writes the time."""
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    try:
        done = first_ddp_step()
        if rank == 0:
            with open(out_path, "w") as f:
                f.write(repr(done))
    finally:
        dist.destroy_process_group()


def torchrun_main() -> None:
    """torchrun entry point (env:// rendezvous); rank 0 prints the marker line."""
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    try:
        done = first_ddp_step()
        if dist.get_rank() == 0:
            print(f"{MARKER} {done!r}", flush=True)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    torchrun_main()
    sys.exit(0)
