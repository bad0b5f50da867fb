"""Eight real ranks on this machine: every view correct, and the kernel keeping up.

Eight gloo CPU ranks (on 2 cores: a small model) train a DDP ``Stack(blocks=4, width=64)``
watched with ``ish.watch(ddp, timeline=True)`` (bucket, splits-less DDP, lifecycle and
timeline probes), emitting ``--scalars`` scalars per step; rank 7 sleeps 100 ms before each
backward (a straggler). Two variants, interleaved over ``--repeats`` rounds:

* ``views``: every feature's view (monitor, buckets, timeline, lifecycle, precision,
  splits) built on the run as it starts and refreshed live by ``run.wait()``;
* ``plain``: no view.

Measured per run: the ranks' median step time (their own clocks), the run's wall time,
events stored and their rate, every refresh's duration. Checked on every ``views`` run:
the bucket map equals the planner on all 8 ranks and iterations; each bucket all-reduce
of the last iteration is matched on the 8 ranks with rank 7 as its straggler; every DDP
reduction finished with no check fired; the monitor has 8 ranks at their last step with
every scalar (none lost). Prints the step-time ratio views/plain (the kernel's cost to
the ranks) and the refresh figures.

    python benchmarks/bench_eight_ranks.py [--steps 20] [--repeats 3] [--check]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from importlib import import_module
from typing import Any

import interactive_shard as ish
from interactive_shard.features import FEATURES

RANKS = 8
STRAGGLER = 7
REFRESH_MS = 50.0  # issue 12: a refresh at 100k new events; here far fewer arrive


def train(ctx: Any, steps: int, scalars: int) -> list[float]:
    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP

    from interactive_shard.timeline.examples import Stack

    torch.manual_seed(0)
    ddp = DDP(Stack(blocks=4, width=64), bucket_cap_mb=0.02)
    ish.watch(ddp, timeline=True)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    gen = torch.Generator().manual_seed(ctx.rank)
    times = []
    for _ in ctx.steps(steps):
        t0 = time.monotonic()
        loss = ddp(torch.randn(8, 64, generator=gen)).pow(2).mean()
        if ctx.rank == STRAGGLER:
            time.sleep(0.1)  # longer than 8 ranks' scheduling noise on 2 cores
        loss.backward()
        opt.step()
        opt.zero_grad()
        times.append(time.monotonic() - t0)
        value = loss.item()
        for i in range(scalars):
            ctx.emit("scalar", name=f"s{i % 4}", value=value + i)
    return times


class Timed:
    """Wraps a view's refresh to time it (the view is refreshed by ``ui.live``)."""

    def __init__(self, view: Any) -> None:
        self.view, self.spent = view, []
        refresh = view.refresh

        def timed() -> None:
            t = time.perf_counter()
            refresh()
            self.spent.append((time.perf_counter() - t) * 1e3)

        view.refresh = timed


def views_of(run: ish.Run) -> dict[str, Timed]:
    out = {}
    for feature in FEATURES:
        module, cls = feature.view.split(":")
        view_class = getattr(import_module(module), cls)
        view = view_class(run) if feature.name == "monitor" else view_class(run.model(feature.name))
        out[feature.name] = Timed(view)
        _ = view.widget  # built (no display) and registered with ui.live
    return out


def check(run: ish.Run, steps: int, scalars: int) -> dict[str, bool]:
    b, t, d, m = run.buckets, run.timeline, run.ddp, run.monitor
    last = [c for c in t.collectives(iteration=steps) if c.op == "all_reduce"]
    return {
        "buckets equal the plan on every rank": b.ranks == list(range(RANKS))
        and all(b.compare(i, r).matches for i in b.iterations for r in range(RANKS)),
        "all-reduces matched on 8 ranks, straggler 7": bool(last)
        and len(last) == len(b.observed(steps, 0))
        and all(sorted(c.starts) == list(range(RANKS)) and c.straggler == STRAGGLER for c in last),
        "every reduction finished, no check": all(
            it.finished for r in range(RANKS) for i in d.instances_of(r) for it in i.iterations
        )
        and not [f for f in d.findings if f.level == "error"],
        "monitor: 8 ranks, every scalar": [r.step for r in m.ranks] == [steps] * RANKS
        and sum(len(s) for per in m.scalars.values() for s in per.values())
        == RANKS * steps * scalars,
    }


def _close(widget: Any) -> None:
    for child in getattr(widget, "children", ()):
        _close(child)
    widget.close()


def one(cluster: ish.Cluster, variant: str, steps: int, scalars: int) -> dict[str, Any]:
    t0 = time.monotonic()
    run = cluster.run(train, steps, scalars, wait=False)
    views = views_of(run) if variant == "views" else {}
    built = time.monotonic() - t0
    run.wait()
    wall = time.monotonic() - t0
    step_s = statistics.median(t for times in run.results for t in times[1:])
    out: dict[str, Any] = {
        "step_ms": step_s * 1e3,
        "wall_s": wall,
        "build_s": built,
        "events": len(run.store),
        "events_per_s": len(run.store) / wall,
    }
    if views:
        out["checks"] = check(run, steps, scalars)
        out["refresh_ms"] = {
            name: (statistics.median(v.spent), max(v.spent)) if v.spent else (0.0, 0.0)
            for name, v in views.items()
        }
        for v in views.values():
            _close(v.view.widget)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--scalars", type=int, default=50, help="scalars per rank and step")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--check", action="store_true", help="exit 1 if a check fails")
    args = parser.parse_args()
    print(
        f"bench_eight_ranks: {RANKS} ranks, {args.steps} steps, {args.scalars} scalars a step, "
        f"load average {os.getloadavg()[0]:.2f}",
        flush=True,
    )
    results: dict[str, list[dict[str, Any]]] = {"views": [], "plain": []}
    with ish.Cluster(RANKS, timeout=600, echo=False) as cluster:
        # Warm up: imports (plotly's figure widgets take seconds the first time), the
        # process group, DDP's first build.
        for v in views_of(cluster.run(train, 2, 0)).values():
            _close(v.view.widget)
        for rnd in range(args.repeats):
            for variant in ("views", "plain") if rnd % 2 == 0 else ("plain", "views"):
                r = one(cluster, variant, args.steps, args.scalars)
                results[variant].append(r)
                print(
                    f"  round {rnd + 1} {variant:<5}: step {r['step_ms']:.1f} ms, wall "
                    f"{r['wall_s']:.1f} s (views built in {r['build_s']:.1f} s), "
                    f"{r['events']:,} events",
                    flush=True,
                )
    checks = [r["checks"] for r in results["views"]]
    ok = all(all(c.values()) for c in checks)
    for name in checks[0]:
        print(f"  check: {name}: {all(c[name] for c in checks)}")
    refresh: dict[str, Any] = {}
    for feature in FEATURES:
        med = statistics.median(r["refresh_ms"][feature.name][0] for r in results["views"])
        top = max(r["refresh_ms"][feature.name][1] for r in results["views"])
        refresh[feature.name] = {"median_ms": med, "max_ms": top}
        print(f"  refresh {feature.name:<10} median {med:6.1f} ms, longest {top:6.1f} ms")
    step = {v: statistics.median(r["step_ms"] for r in rs) for v, rs in results.items()}
    ratio = step["views"] / step["plain"]
    print(f"  step views {step['views']:.1f} ms / plain {step['plain']:.1f} ms = {ratio:.3f}")
    print(f"checks: {'PASS' if ok else 'FAIL'}")
    summary = {
        "bench": "eight_ranks",
        "steps": args.steps,
        "step_ms": step,
        "ratio_views/plain": ratio,
        "refresh": refresh,
        "events": statistics.median(r["events"] for r in results["views"]),
        "checks_pass": ok,
    }
    print(json.dumps(summary))
    return 1 if args.check and not ok else 0


if __name__ == "__main__":
    sys.exit(main())
