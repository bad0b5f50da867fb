"""Ledger overhead: a DDP step with the collective ledger (what every cluster rank records
by default) over the same step without it.

Two clusters of 2 CPU ranks live side by side: ``ledger`` (the defaults users get) and
``plain`` (its ranks started with ``ISH_LEDGER=0`` and ``TORCH_FR_BUFFER_SIZE=0``: no
listener, no thread, no Flight Recorder). Each round runs ``--steps`` training steps of
DDP(``--layers`` × Linear(``--width``, ``--width``)) plus the user's loss all-reduce on
each cluster, in alternating order; a round's ratio is the median ledger step over the
median plain step, and the result is the median of the rounds (paired: both ran under
the same load). Also reported: the ledger's entries per step and that every one of them
arrived. Acceptance (issue 24): <= 1.01.

    python benchmarks/bench_ledger.py [--rounds 12] [--steps 8] [--check]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from typing import Any

import interactive_shard as ish

LIMIT = 1.01


def train(ctx: Any, steps: int, layers: int, width: int) -> list[float]:
    """``steps`` DDP steps; the seconds each took on this rank."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(0)
    if "model" not in ctx.state:
        blocks = [torch.nn.Linear(width, width) for _ in range(layers)]
        model = DDP(torch.nn.Sequential(*blocks))
        ctx.state["model"] = model, torch.optim.SGD(model.parameters(), lr=1e-3)
    model, opt = ctx.state["model"]
    x = torch.randn(32, width)
    out = []
    for _ in range(steps):
        start = time.perf_counter()
        loss = model(x).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        dist.all_reduce(loss.detach())
        out.append(time.perf_counter() - start)
    return out


def _cluster(ledger: bool) -> ish.Cluster:
    saved = {k: os.environ.get(k) for k in ("ISH_LEDGER", "TORCH_FR_BUFFER_SIZE")}
    if not ledger:
        os.environ.update({"ISH_LEDGER": "0", "TORCH_FR_BUFFER_SIZE": "0"})
    try:
        return ish.Cluster(nprocs=2)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--layers", type=int, default=10)
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--check", action="store_true", help="exit 1 if above the limit")
    a = parser.parse_args()
    started = time.monotonic()
    args = (a.steps, a.layers, a.width)
    with _cluster(ledger=True) as on, _cluster(ledger=False) as off:
        for c in (on, off):
            c.run(train, 2, a.layers, a.width)  # warm up: build the model, first steps
        ratios, medians = [], {"ledger": [], "plain": []}
        entries = 0
        for k in range(a.rounds):
            order = [("ledger", on), ("plain", off)][:: 1 if k % 2 == 0 else -1]
            got = {}
            for name, c in order:
                run = c.run(train, *args)
                got[name] = statistics.median(run.results[0])
                if name == "ledger":
                    entries += len(run.collectives.entries(0))
            ratios.append(got["ledger"] / got["plain"])
            for name in got:
                medians[name].append(got[name])
    ratio = statistics.median(ratios)
    per_step = entries / (a.rounds * a.steps)
    ok = ratio <= LIMIT
    print(
        f"bench_ledger: DDP of {a.layers} x Linear({a.width}, {a.width}), 2 ranks, "
        f"{a.rounds} rounds x {a.steps} steps"
    )
    print(
        f"  step median: ledger {1e3 * statistics.median(medians['ledger']):.1f} ms, "
        f"plain {1e3 * statistics.median(medians['plain']):.1f} ms"
    )
    print(
        f"  ledger/plain paired {ratio:.4f} ({'within' if ok else 'ABOVE'} {LIMIT}); "
        f"rounds {min(ratios):.3f}-{max(ratios):.3f}; {per_step:.2f} entries per step"
    )
    print(f"  wall time {time.monotonic() - started:.0f} s")
    print(
        json.dumps(
            {
                "bench": "ledger",
                "paired": round(ratio, 4),
                "rounds": [round(r, 4) for r in ratios],
                "median_ms": {n: round(1e3 * statistics.median(v), 2) for n, v in medians.items()},
                "entries_per_step": round(per_step, 2),
            }
        )
    )
    return 0 if ok or not a.check else 1


if __name__ == "__main__":
    sys.exit(main())
