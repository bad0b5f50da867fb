"""Compile time of ``torch.compile(ddp)`` with the split capture over without, interleaved.

A real rank (``ish.Cluster(1)``, gloo on CPU, world size 1; ``--nprocs 2`` for two
ranks compiling at once, which share the 2 cores) builds a user module of ``--layers``
Linear layers (a user ``nn.Module``: ``nn.Sequential`` compiles nothing, Note
[DDPOptimizer splits]), wraps it in DDP with ``--cap-mb`` so that DDPOptimizer cuts it
into several partitions, and compiles it with ``backend="aot_eager"``. Variants:

* ``plain``: ``torch.compile(ddp)`` as is;
* ``splits``: the split capture alone (``interactive_shard.splits.probe.attach``,
  Note [Split capture]), the cost this benchmark is about;
* ``watch``: ``ish.watch(compiled)``, which attaches the split capture and the DDP
  bucket probe (whose forward hooks on the DDP model dynamo traces).

Every compile is fresh: ``torch._dynamo.reset()`` and a new model before it, so each
round measures dynamo + DDPOptimizer + aot_eager, not a cache hit. The timed part is
the first forward (where the compile happens); the first backward runs untimed. Each
round compiles every variant once, in an order that rotates, after one warm-up compile
of each. Compile work is per process, so one rank measures it best; times are rank 0's,
wall clock and process CPU time (less sensitive to other load on the machine).

Prints per variant the median compile time and, against ``plain``, the ratio of
medians and the median of paired ratios (round i over round i); where the capture's own
time goes (timed around the probe's steps: graph records, per-partition calls and code,
the event, the emit); the Python function calls made during one compile of each
variant (``sys.setprofile``, exact, untimed); and ``ish.plan_splits`` on the same model
in this process for reference. The last line is a JSON summary. Target: paired
splits/plain <= 1.05.

    python benchmarks/bench_splits_compile.py [--rounds 10] [--nprocs 1] [--layers 8]
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import interactive_shard as ish

VARIANTS = ("plain", "splits", "watch")
CLOCKS = ("wall", "cpu")
TARGET = 1.05
STEPS = ("graph_nodes", "calls_of", "placeholders_and_outputs", "_code", "_event", "emit")


def _net(layers: int, width: int) -> Any:
    import torch
    from torch import nn

    class Net(nn.Module):  # a user module: dynamo compiles its forward (not nn.Sequential)
        def __init__(self) -> None:
            super().__init__()
            self.layers = nn.ModuleList(nn.Linear(width, width) for _ in range(layers))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            for layer in self.layers:
                x = torch.relu(layer(x))
            return x

    torch.manual_seed(0)
    return Net()


def _timed_steps(spent: dict[str, float]) -> Callable[[], None]:
    """Time the split probe's steps (the names it calls); returns the undo.

    Exclusive times: a step called inside another (``_event`` renders the parent
    graph's code with ``_code``) counts once, in the inner step.
    """
    from interactive_shard.splits import probe
    from interactive_shard.telemetry import rank as telemetry

    targets: list[tuple[Any, str]] = [(probe, n) for n in STEPS[:4]]
    targets += [(probe.SplitProbe, "_event"), (telemetry, "emit")]
    saved = [(obj, name, getattr(obj, name)) for obj, name in targets]

    inner: list[float] = []  # per active step: time spent in steps it called

    def wrap(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            inner.append(0.0)
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                took = time.perf_counter() - start
                spent[name] = spent.get(name, 0.0) + took - inner.pop()
                if inner:
                    inner[-1] += took

        return timed

    for obj, name, fn in saved:
        setattr(obj, name, wrap(name, fn))

    def undo() -> None:
        for obj, name, fn in saved:
            setattr(obj, name, fn)

    return undo


def _compile(
    ctx: Any, variant: str, layers: int, width: int, cap_mb: float, batch: int, count: bool
) -> dict[str, Any]:
    """One fresh compile of a new DDP model on this rank, its first forward measured:
    timed, or (``count``) the Python function calls it makes."""
    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP

    from interactive_shard.splits import probe as split_probe

    torch._dynamo.reset()
    ddp = DDP(_net(layers, width), bucket_cap_mb=cap_mb)
    compiled: Any = torch.compile(ddp, backend="aot_eager")
    x = torch.randn(batch, width, generator=torch.Generator().manual_seed(ctx.rank))
    spent: dict[str, float] = {}
    undo = _timed_steps(spent) if variant != "plain" and not count else None
    handle: Any = None
    if variant == "splits":
        handle = split_probe.attach(compiled)
    elif variant == "watch":
        handle = ish.watch(compiled)
    calls = 0

    def counter(_frame: Any, event: str, _arg: Any) -> None:
        nonlocal calls
        calls += event == "call"

    gc.collect()  # the previous round's graphs: not this round's cost
    if count:
        sys.setprofile(counter)
    start, cpu = time.perf_counter(), time.process_time()
    try:
        out = compiled(x)
    finally:
        sys.setprofile(None)
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    out.square().mean().backward()
    compiles = 0
    if handle is not None:
        probe = handle.probes["splits"] if variant == "watch" else handle
        compiles = probe.compiles
        handle.detach()
    if undo is not None:
        undo()
    return {"wall": wall, "cpu": cpu, "spent": spent, "compiles": compiles, "calls": calls}


def _partitions(ctx: Any, layers: int, width: int, cap_mb: float, batch: int) -> int:
    """How many partitions DDPOptimizer cuts the model into (a backend that counts)."""
    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch._dynamo.reset()
    graphs = []

    def count(gm: Any, _inputs: Any) -> Any:
        graphs.append(gm)
        return gm.forward

    compiled = torch.compile(DDP(_net(layers, width), bucket_cap_mb=cap_mb), backend=count)
    compiled(torch.randn(batch, width))
    torch._dynamo.reset()
    return len(graphs)


def _plan_ms(layers: int, width: int, cap_mb: float, batch: int, repeats: int) -> list[float]:
    import torch

    model, x = _net(layers, width), torch.randn(batch, width)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        plan = ish.plan_splits(model, x, bucket_cap_mb=cap_mb)
        times.append((time.perf_counter() - start) * 1e3)
    assert plan.partitions, "the planner found no partition"
    return times


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10, help="compiles of each variant")
    parser.add_argument("--nprocs", type=int, default=1, help="ranks (all compile at once)")
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--cap-mb", type=float, default=2.0, help="the DDP model's bucket_cap_mb")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=5, help="ish.plan_splits timings")
    args = parser.parse_args()
    shape = (args.layers, args.width, args.cap_mb, args.batch)

    samples: dict[tuple[str, str], list[float]] = {(v, c): [] for v in VARIANTS for c in CLOCKS}
    spent: dict[str, list[float]] = {s: [] for s in STEPS}
    compiles: list[int] = []
    t_start = time.monotonic()
    with ish.Cluster(args.nprocs, timeout=600, echo=False) as cluster:
        partitions = cluster.run(_partitions, *shape).results[0]
        for variant in VARIANTS:  # warm-up: imports, lazy initialisation, allocator
            cluster.run(_compile, variant, *shape, False)
        for r in range(args.rounds):
            k = r % len(VARIANTS)
            for variant in VARIANTS[k:] + VARIANTS[:k]:
                got = cluster.run(_compile, variant, *shape, False).results[0]
                for c in CLOCKS:
                    samples[variant, c].append(got[c])
                if variant == "splits":
                    compiles.append(got["compiles"])
                    for step in STEPS:
                        spent[step].append(got["spent"].get(step, 0.0))
        calls = {v: cluster.run(_compile, v, *shape, True).results[0]["calls"] for v in VARIANTS}
    plan_ms = _plan_ms(*shape, args.repeats)
    assert all(n == 1 for n in compiles), f"the probe saw {compiles} compiles per round"

    numel = args.layers * (args.width * args.width + args.width)
    print(
        f"model: {args.layers} x Linear({args.width}, {args.width}) = {numel:,} parameters, "
        f"bucket_cap_mb={args.cap_mb}: {partitions} partitions; backend aot_eager; "
        f"{args.nprocs} rank(s), gloo, {args.rounds} rounds; rank 0's first forward"
    )
    medians = {k: statistics.median(ts) for k, ts in samples.items()}
    paired = {
        (v, c): [a / b for a, b in zip(samples[v, c], samples["plain", c], strict=True)]
        for v in VARIANTS[1:]
        for c in CLOCKS
    }
    for c in CLOCKS:
        for v in VARIANTS:
            ts = samples[v, c]
            line = (
                f"{v:>6} {c:>4}: median compile {medians[v, c] * 1e3:7.1f} ms "
                f"(min {min(ts) * 1e3:.1f}, max {max(ts) * 1e3:.1f})"
            )
            if v != "plain":
                ps = paired[v, c]
                line += (
                    f"; /plain: medians {medians[v, c] / medians['plain', c]:.3f}, paired "
                    f"{statistics.median(ps):.3f} (min {min(ps):.3f}, max {max(ps):.3f})"
                )
            print(line)
    per_compile = {s: statistics.median(ts) * 1e3 for s, ts in spent.items()}
    capture_ms = sum(per_compile.values())
    share = capture_ms / (medians["plain", "cpu"] * 1e3)
    print(
        "split capture's own steps per compile (median ms): "
        + ", ".join(f"{s} {ms:.2f}" for s, ms in per_compile.items())
        + f"; total {capture_ms:.1f} ms = {share:.1%} of plain's cpu time"
    )
    print(
        "Python function calls in one compile: "
        + ", ".join(
            f"{v} {n:,}" + (f" ({n / calls['plain']:.3f})" if v != "plain" else "")
            for v, n in calls.items()
        )
    )
    for c in CLOCKS:
        ratio = statistics.median(paired["splits", c])
        ok = ratio <= TARGET
        print(f"splits/plain paired {c} {ratio:.3f} ({'within' if ok else 'ABOVE'} {TARGET})")
    print(
        f"ish.plan_splits on the same model (this process): median "
        f"{statistics.median(plan_ms):.1f} ms of {args.repeats}"
    )
    print(f"wall time {time.monotonic() - t_start:.0f} s")
    summary = {
        "nprocs": args.nprocs,
        "rounds": args.rounds,
        "partitions": partitions,
        "median_ms": {f"{v}_{c}": round(m * 1e3, 1) for (v, c), m in medians.items()},
        "paired": {f"{v}_{c}": round(statistics.median(ps), 4) for (v, c), ps in paired.items()},
        "capture_ms": round(capture_ms, 2),
        "capture_share": round(share, 4),
        "calls": calls,
        "plan_ms": round(statistics.median(plan_ms), 1),
    }
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
