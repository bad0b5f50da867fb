"""Step-time overhead of the timeline probe at its default depth (or, ``--probe
lifecycle``, of the DDP lifecycle probe): 2-rank gloo on CPU.

Each rank builds same-seeded copies of one model and steps them interleaved:

* ``--model fsdp2`` (default): ``--layers`` blocks of ``Linear(--width, --width)`` + ReLU
  (default 10 x 1024: 10.5M parameters), every block ``fully_shard``-ed, then the root;
* ``--model ddp``: the same blocks under ``DistributedDataParallel`` (25 MiB buckets);
* ``--model flat``: ``timeline.examples.FlatViewBlocks`` (compiled blocks whose weights
  are views of one flat parameter, reduced asynchronously from hooks on the views).

Variants: ``plain`` (as is) and ``watched``: the same with the timeline probe attached
directly (``timeline.probe.attach``: only this probe, not the others ``ish.watch``
would add), default depth: the units / the blocks. A step is forward, backward, SGD
``step`` and ``zero_grad`` on a fixed batch per rank. Steps of the variants alternate
one by one in a rotating order; rank 0's step times. Prints medians, lower quartiles,
the median of paired ratios (step i of each variant back to back), noise, the spans
and events per step, and whether both variants trained bit-identically. The last line
is a JSON summary. Target: paired watched/plain <= 1.05.

``--probe lifecycle`` (``--model ddp`` only) attaches the DDP lifecycle probe instead;
both variants then run with the process-wide collective recorder every cluster rank
has (Note [Lifecycle probe]), so the ratio is the probe's own cost.

    python benchmarks/bench_timeline_probe.py [--model fsdp2|ddp|flat] [--rounds 12]
    python benchmarks/bench_timeline_probe.py --model ddp --probe lifecycle
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from typing import Any

import interactive_shard as ish

VARIANTS = ("plain", "watched")
TARGET = 1.05


def _model(kind: str, layers: int, width: int) -> Any:
    import torch
    from torch import nn

    from interactive_shard.timeline.examples import FlatViewBlocks, Stack

    torch.manual_seed(0)
    if kind == "flat":
        return FlatViewBlocks(blocks=layers, width=width)
    model = Stack(blocks=layers, width=width)
    if kind == "ddp":
        return nn.parallel.DistributedDataParallel(model)
    from torch.distributed.fsdp import fully_shard

    for block in model.layers:
        fully_shard(block)
    fully_shard(model)
    return model


def _build(ctx: Any, kind: str, layers: int, width: int, which: str) -> int:
    import torch

    from interactive_shard.ddp import probe as lifecycle
    from interactive_shard.timeline import probe as timeline

    probe = lifecycle if which == "lifecycle" else timeline

    models = {name: _model(kind, layers, width) for name in VARIANTS}
    ctx.state["models"] = models
    ctx.state["optimizers"] = {
        name: torch.optim.SGD(m.parameters(), lr=1e-4) for name, m in models.items()
    }
    ctx.state["probe"] = probe.attach(models["watched"])
    return sum(p.numel() for p in models["plain"].parameters())


def _step(ctx: Any, name: str, x: Any) -> float:
    model, opt = ctx.state["models"][name], ctx.state["optimizers"][name]
    start = time.perf_counter()
    model(x).square().mean().backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return time.perf_counter() - start


def _round(ctx: Any, steps: int, batch: int, width: int, rotate: int) -> dict[str, Any]:
    import torch

    x = torch.randn(batch, width, generator=torch.Generator().manual_seed(ctx.rank))
    probe = ctx.state["probe"]
    spans, events = getattr(probe, "recorded", 0), probe.emitted
    times: dict[str, list[float]] = {name: [] for name in VARIANTS}
    for i in range(steps):
        k = (i + rotate) % len(VARIANTS)
        for name in VARIANTS[k:] + VARIANTS[:k]:
            times[name].append(_step(ctx, name, x))
    probe.send()
    return {
        **times,
        "spans": getattr(probe, "recorded", 0) - spans,
        "events": probe.emitted - events,
    }


def _identical(ctx: Any) -> bool:
    import torch

    plain, watched = (ctx.state["models"][n].parameters() for n in VARIANTS)

    def local(p: Any) -> Any:
        return p.to_local() if hasattr(p, "to_local") else p

    return all(torch.equal(local(a), local(b)) for a, b in zip(plain, watched, strict=True))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=("fsdp2", "ddp", "flat"), default="fsdp2")
    parser.add_argument("--probe", choices=("timeline", "lifecycle"), default="timeline")
    parser.add_argument("--layers", type=int, default=10)
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--steps", type=int, default=4, help="steps of each variant per round")
    args = parser.parse_args()
    if args.probe == "lifecycle" and args.model != "ddp":
        parser.error("--probe lifecycle watches DDP: use --model ddp")
    shape = (args.batch, args.width)
    samples: dict[str, list[float]] = {name: [] for name in VARIANTS}
    per_round: list[float] = []
    spans = events = 0
    t_start = time.monotonic()
    with ish.Cluster(2, timeout=600, echo=False) as cluster:
        numel = cluster.run(_build, args.model, args.layers, args.width, args.probe).results[0]
        print(
            f"probe: {args.probe}; model: {args.model}, {args.layers} blocks of width "
            f"{args.width} ({numel:,} "
            f"parameters), batch {args.batch}, SGD; 2 ranks, gloo, CPU",
            flush=True,
        )
        cluster.run(_round, 2, *shape, 0)  # warm-up: lazy init, compiles, gloo buffers
        for r in range(args.rounds):
            out = cluster.run(_round, args.steps, *shape, r).results[0]
            for name in VARIANTS:
                samples[name].extend(out[name])
            spans, events = spans + out["spans"], events + out["events"]
            pairs = [a / b for a, b in zip(out["watched"], out["plain"], strict=True)]
            per_round.append(statistics.median(pairs))
        identical = all(cluster.run(_identical).results)
    steps = len(samples["plain"])
    medians = {name: statistics.median(ts) for name, ts in samples.items()}
    quartiles = {name: statistics.quantiles(ts, n=4)[0] for name, ts in samples.items()}
    pairs = [a / b for a, b in zip(samples["watched"], samples["plain"], strict=True)]
    paired = statistics.median(pairs)
    q = statistics.quantiles(samples["plain"], n=4)
    noise = (q[2] - q[0]) / medians["plain"]
    print(f"{args.rounds} rounds x {args.steps} steps per variant, interleaved ({steps} each)")
    for name in VARIANTS:
        print(
            f"{name:>8}: median step {medians[name] * 1e3:7.1f} ms, lower quartile "
            f"{quartiles[name] * 1e3:7.1f} ms"
        )
    print(
        f"{args.probe}/plain: medians {medians['watched'] / medians['plain']:.3f}, lower "
        f"quartiles {quartiles['watched'] / quartiles['plain']:.3f}, paired {paired:.3f}"
    )
    print(
        f"noise: plain's interquartile range is {noise:.1%} of its median; per-round paired "
        f"ratios {min(per_round):.3f} .. {max(per_round):.3f}"
    )
    print(f"spans per step {spans / steps:.0f}, events per step {events / steps:.2f}")
    print(f"bit-identical training with and without the probe: {identical}")
    ok = paired <= TARGET
    print(f"{args.probe}/plain paired {paired:.3f} ({'within' if ok else 'ABOVE'} {TARGET})")
    print(f"wall time {time.monotonic() - t_start:.0f} s")
    summary = {
        "probe": args.probe,
        "model": args.model,
        "params": numel,
        "steps": steps,
        "median_ms": {k: round(v * 1e3, 2) for k, v in medians.items()},
        "paired": round(paired, 4),
        "noise_iqr": round(noise, 4),
        "round_paired": [round(min(per_round), 4), round(max(per_round), 4)],
        "spans_per_step": round(spans / steps, 1),
        "events_per_step": round(events / steps, 2),
        "identical": identical,
    }
    print(json.dumps(summary))
    return 0 if identical else 1


if __name__ == "__main__":
    sys.exit(main())
