"""Step-time overhead of ``ish.watch(ddp)``: 2-rank gloo DDP on CPU, interleaved variants.

Each rank builds same-seeded copies of one model (a stack of 2048x2048 Linear layers,
>= 25M parameters) and wraps each in its own DDP:

* ``plain``: DDP as is (the C++ Reducer's built-in all-reduce);
* ``probe``: DDP + ``ish.watch`` (default reduction, sampled checksums);
* ``hook``: DDP + torch's Python ``allreduce_hook``, to separate the cost of being a
  Python comm hook from the probe's own bookkeeping;
* ``plain-view`` / ``probe-view``: the same with ``gradient_as_bucket_view=True``.

Why both: the probe watches DDP's own C++ reduction (a process group in front of
the Reducer's), so it should cost the same with copied and with bucket-view
gradients; ``hook`` shows what a Python comm hook would cost instead (one more pass
over the gradients and a Python callback per bucket). Step times on a 2-core machine
vary by a few percent from run to run, hence 12 rounds by default.

A step is a training step: forward, backward, SGD ``step`` and ``zero_grad``. Steps of
the variants alternate one by one, in an order that rotates, so load from other
processes hits all of them alike. Step times are
rank 0's (DDP's all-reduce keeps the ranks in step). Prints, per variant, the median
and lower quartile step time and three ratios to ``plain``: of medians, of lower
quartiles (less sensitive to other load on the machine) and the median of paired
ratios (step i of a variant over step i of its baseline, run back to back); the last
line is a JSON summary. Target: paired probe/plain <= 1.03.

    python benchmarks/bench_probe_overhead.py [--layers 6] [--batch 32] [--rounds 12] [--steps 10]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from typing import Any

import interactive_shard as ish

VARIANTS = ("plain", "probe", "hook", "plain-view", "probe-view")
BASELINE = {"probe": "plain", "hook": "plain", "probe-view": "plain-view"}
TARGET = 1.03


def _build(ctx: Any, layers: int, width: int) -> int:
    import torch
    from torch import nn
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.nn.parallel import DistributedDataParallel as DDP

    models, optimizers = {}, {}
    for name in VARIANTS:
        torch.manual_seed(0)
        net = nn.Sequential(*[nn.Linear(width, width) for _ in range(layers)])
        models[name] = DDP(net, gradient_as_bucket_view=name.endswith("-view"))
        optimizers[name] = torch.optim.SGD(net.parameters(), lr=1e-4)
    ctx.state["probe"] = ish.watch(models["probe"])
    ctx.state["probe-view"] = ish.watch(models["probe-view"])
    models["hook"].register_comm_hook(None, default_hooks.allreduce_hook)
    ctx.state["models"] = models
    ctx.state["optimizers"] = optimizers
    return sum(p.numel() for p in models["plain"].parameters())


def _round(ctx: Any, steps: int, batch: int, width: int, rotate: int) -> dict[str, list[float]]:
    """``steps`` times: one step of every variant, in an order that rotates each time."""
    import torch

    x = torch.randn(batch, width, generator=torch.Generator().manual_seed(ctx.rank))
    times: dict[str, list[float]] = {name: [] for name in VARIANTS}
    for i in range(steps):
        k = (i + rotate) % len(VARIANTS)
        for name in VARIANTS[k:] + VARIANTS[:k]:
            ddp, opt = ctx.state["models"][name], ctx.state["optimizers"][name]
            t0 = time.perf_counter()
            ddp(x).square().mean().backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            times[name].append(time.perf_counter() - t0)
    return times


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--width", type=int, default=2048)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--steps", type=int, default=10, help="steps of each variant per round")
    args = parser.parse_args()

    samples: dict[str, list[float]] = {name: [] for name in VARIANTS}
    t_start = time.monotonic()
    with ish.Cluster(2, timeout=300, echo=False) as cluster:
        numel = cluster.run(_build, args.layers, args.width).results[0]
        print(f"model: {args.layers} x Linear({args.width}, {args.width}) = {numel:,} parameters")
        # Warm-up: bucket rebuild, allocator, gloo buffers.
        cluster.run(_round, 3, args.batch, args.width, 0)
        for r in range(args.rounds):
            times = cluster.run(_round, args.steps, args.batch, args.width, r).results[0]
            for name in VARIANTS:
                samples[name].extend(times[name])
        probe_iterations = cluster.run(lambda ctx: ctx.state["probe"].iteration).results
    medians = {name: statistics.median(ts) for name, ts in samples.items()}
    # Steps i of two variants ran back to back, under the same load: pair them.
    paired = {
        name: statistics.median(a / b for a, b in zip(samples[name], samples[base], strict=True))
        for name, base in BASELINE.items()
    }
    for name in VARIANTS:
        ratio = f"; paired ratio to {BASELINE[name]}: {paired[name]:.3f}" if name in paired else ""
        print(f"{name:>10}: median step {medians[name] * 1e3:7.1f} ms{ratio}")
    print(f"probe iterations seen per rank: {probe_iterations}")
    for name in ("probe", "probe-view"):
        ok = paired[name] <= TARGET
        print(
            f"{name}/{BASELINE[name]} paired {paired[name]:.3f} "
            f"({'within' if ok else 'ABOVE'} {TARGET})"
        )
    print(f"wall time {time.monotonic() - t_start:.0f} s")
    summary = {
        "params": numel,
        "median_ms": {k: round(v * 1e3, 2) for k, v in medians.items()},
        "paired": {k: round(v, 4) for k, v in paired.items()},
    }
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
