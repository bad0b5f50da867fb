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

The run states its own cost (``run.overhead``): after the rounds, each watched variant
trains alone for ``--alone`` steps, in a run of its own, and the shares its probes
reported there (rank 0 and 1; the watch's total: buckets, ddp and the sending of their
events) are printed beside the paired ratio - 1 (a share is of the step with the
probes, s / (T + s); the ratio's excess is of the plain step, s / T: the share is
converted, share / (1 - share), before they are compared). The noise: twice the
standard error of the rounds' median paired ratios. The collective ledger's cost
(``collectives``) is printed apart: every variant pays it.

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
WATCHED = ("probe", "probe-view")
WATCH_PROBES = ("buckets", "ddp", "sending")  # what ish.watch(ddp) adds to a step
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


def _alone(ctx: Any, name: str, steps: int, batch: int, width: int) -> None:
    """``steps`` steps of variant ``name`` only: its probes' span is its own steps."""
    import torch

    x = torch.randn(batch, width, generator=torch.Generator().manual_seed(ctx.rank))
    ddp, opt = ctx.state["models"][name], ctx.state["optimizers"][name]
    for _ in range(steps):
        ddp(x).square().mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)


def _self_reported(run: Any) -> dict[str, Any]:
    """Per rank each probe's share (``run.overhead``) and the watch's total; ``total``:
    the ranks' mean of it."""
    model = run.overhead
    out: dict[str, Any] = {}
    for rank in model.ranks:
        shares = {p: model.share(p, rank) for p in model.probes}
        out[str(rank)] = {**shares, "watch": sum(shares.get(p, 0.0) for p in WATCH_PROBES)}
    ranks = [v["watch"] for v in out.values()]
    out["total"] = sum(ranks) / len(ranks) if ranks else 0.0
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--width", type=int, default=2048)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--steps", type=int, default=10, help="steps of each variant per round")

    parser.add_argument("--alone", type=int, default=30, help="steps of each watched variant alone")
    args = parser.parse_args()

    samples: dict[str, list[float]] = {name: [] for name in VARIANTS}
    rounds: dict[str, list[float]] = {name: [] for name in BASELINE}  # per round: its median
    reported: dict[str, dict[str, Any]] = {}
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
            for name, base in BASELINE.items():
                pairs = zip(times[name], times[base], strict=True)
                rounds[name].append(statistics.median(a / b for a, b in pairs))
        probe_iterations = cluster.run(lambda ctx: ctx.state["probe"].iteration).results
        for name in WATCHED:
            run = cluster.run(_alone, name, args.alone, args.batch, args.width)
            reported[name] = _self_reported(run)
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
    noise = {
        name: 2 * statistics.stdev(rs) / len(rs) ** 0.5 if len(rs) > 1 else float("inf")
        for name, rs in rounds.items()
    }
    agree = {}
    print(f"self-reported (run.overhead, each watched variant alone for {args.alone} steps):")
    for name in WATCHED:
        got = reported[name]
        for rank in ("0", "1"):
            mine = got.get(rank, {})
            each = ", ".join(f"{p} {v:.3%}" for p, v in mine.items() if p != "watch")
            print(f"  {name} rank {rank}: {each}; the watch {mine.get('watch', 0.0):.3%}")
        share = got["total"]
        excess = share / (1 - share)  # of the plain step, as the ratio's excess is
        agree[name] = abs((paired[name] - 1) - excess) <= noise[name]
        print(
            f"  {name}: paired ratio - 1 = {paired[name] - 1:+.2%} ± {noise[name]:.2%} (noise); "
            f"self-reported {share:.3%} of the step = {excess:+.3%} of the plain step: "
            f"{'within' if agree[name] else 'OUTSIDE'} the noise"
        )
    print(f"wall time {time.monotonic() - t_start:.0f} s")
    summary = {
        "params": numel,
        "median_ms": {k: round(v * 1e3, 2) for k, v in medians.items()},
        "paired": {k: round(v, 4) for k, v in paired.items()},
        "noise": {k: round(v, 4) for k, v in noise.items()},
        "self_reported": {
            name: {k: v if isinstance(v, dict) else round(v, 5) for k, v in got.items()}
            for name, got in reported.items()
        },
        "agree": agree,
    }
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
