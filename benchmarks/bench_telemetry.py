"""Telemetry throughput: events/s from 2 ranks into the kernel's RunStore, none lost.

Each rank calls ``ctx.emit("scalar", name="x", value=float(i))`` for i in 0..N-1 as
fast as it can. Measured per run:

* ingest rate: 2N / (kernel time at which the store holds all 2N events - the
  earliest first emit on any rank). Both ends use ``time.monotonic()``, one clock
  for every process of a Linux machine;
* emit cost on the rank: (last emit - first emit) / N, in microseconds per event, and
  the rank process's CPU time per event (sending included): with 2 ranks and the
  kernel on 2 cores the first exceeds the second by what the ranks waited for a core;
* the kernel's CPU: its process's CPU seconds per second of the run (collector,
  store, wait loop and view; 1.0 is one core);
* completeness: the store holds exactly N scalar events per rank, in order, with
  values 0..N-1 (a per-rank sequence check);
* view refreshes: a display-less ``MonitorView(cluster).widget`` is registered with
  ``ui.live`` and refreshed by the ``cluster.run`` wait loop; we count refreshes
  per second of the ingest window and the shortest gap between two (ui.live allows
  at most 10/s).

First, in this process, what each stage costs a scalar (``_stages.py``): emit, pack
and encode, decode, store and the monitor's update, sent as columns and as events.

Then three variants, interleaved, each on the defaults users get (``echo=True``) but
what it names: ``monitor`` (a live ``MonitorView`` attached), ``counter`` (a view that
only counts its ticks: what a live view costs) and ``no-echo`` (the live monitor with
``echo=False``: what echoing rank output costs the kernel, issue 22).

Acceptance (issue 12): >= 1,000,000 events/s with the live monitor, and none lost.
"""

from __future__ import annotations

import argparse
import gc
import itertools
import json
import os
import statistics
import sys
import time
from typing import Any

from _stages import print_costs, stage_costs

import interactive_shard as ish
from interactive_shard.monitor.view import MonitorView
from interactive_shard.telemetry.schema import Batch
from interactive_shard.ui import live

ACCEPT_EVENTS_PER_S = 1_000_000.0
VARIANTS = ("monitor", "counter", "no-echo")


def emit_many(ctx: Any, n: int) -> tuple[float, float, float]:
    """Runs on each rank: N small events, as fast as possible; (first, last) emit times
    and the CPU seconds the rank's process used meanwhile (its sending included)."""
    emit = ctx.emit
    cpu = time.process_time()
    t0 = time.monotonic()
    for i in range(n):
        emit("scalar", name="x", value=float(i))
    return t0, time.monotonic(), time.process_time() - cpu


class TimedCluster(ish.Cluster):
    """A Cluster that notes when the collector has stored ``expect`` events of a run.

    ``_on_batch`` is the collector's consumer (``Cluster`` binds it at construction);
    the ranks here emit nothing but the measured events, so every batch counts.
    """

    expect = 0
    arrived = 0
    t_all: float | None = None

    def _on_batch(self, batch: Batch) -> None:
        super()._on_batch(batch)
        self.arrived += batch.size
        if self.t_all is None and self.arrived >= self.expect:
            self.t_all = time.monotonic()

    def reset(self, expect: int) -> None:
        self.expect, self.arrived, self.t_all = expect, 0, None


class TickCounter:
    """A live view whose refresh costs nothing: it records when ``ui.live`` ticked."""

    def __init__(self) -> None:
        self.stamps: list[float] = []

    def refresh(self) -> None:
        self.stamps.append(time.monotonic())


class CountingView(MonitorView):
    """MonitorView that records when each refresh started and how long it took."""

    def __init__(self, source: Any) -> None:
        super().__init__(source)
        self.stamps: list[float] = []
        self.spent: list[float] = []

    def refresh(self) -> None:
        t = time.monotonic()
        super().refresh()
        self.stamps.append(t)
        self.spent.append(time.monotonic() - t)


def _noop(ctx: Any) -> None:
    return None


def one_run(cluster: TimedCluster, n: int, variant: str) -> dict[str, Any]:
    # An empty run first, so that a view following the cluster draws an empty run at
    # build time instead of the previous run's 2N events.
    cluster.run(_noop)
    view: CountingView | TickCounter
    cluster.echo = variant != "no-echo"
    if variant in ("monitor", "no-echo"):
        view = CountingView(cluster)
        _ = view.widget  # built (no display needed) and registered with ui.live
        view.stamps.clear()  # the build's own draw is not a tick
        view.spent.clear()
    else:
        view = TickCounter()
        live.register(view)
    cluster.reset(2 * n)
    wall, cpu = time.monotonic(), time.process_time()
    run = cluster.run(emit_many, n)  # its wait loop calls live.tick()
    kernel_s = time.process_time() - cpu
    kernel_cpu = kernel_s / (time.monotonic() - wall)
    t_all = cluster.t_all
    if t_all is None:
        raise AssertionError(f"store got {cluster.arrived} of {2 * n} events from the channel")
    times = run.results
    start = min(t0 for t0, _, _ in times)
    elapsed = t_all - start

    # None lost: exactly N per rank, values 0..N-1 in order.
    scalars = run.store.of_kind("scalar")
    per_rank = {r: [e.payload["value"] for e in scalars if e.rank == r] for r in range(2)}
    counts = {r: len(v) for r, v in per_rank.items()}
    expected = [float(i) for i in range(n)]
    in_order = all(v == expected for v in per_rank.values())
    complete = len(scalars) == 2 * n and all(c == n for c in counts.values()) and in_order

    # Throttled ticks inside the ingest window only (the forced tick when the run
    # ends comes after the last event).
    window = [s for s in view.stamps if start <= s <= t_all]
    gaps = [b - a for a, b in itertools.pairwise(window)]
    out: dict[str, Any] = {
        "events_per_s": 2 * n / elapsed,
        "elapsed_s": elapsed,
        "emit_us": statistics.mean((t1 - t0) / n * 1e6 for t0, t1, _ in times),
        "rank_cpu_us": statistics.mean(c / n * 1e6 for _, _, c in times),
        "kernel_cores": kernel_cpu,  # the kernel's CPU seconds per second of the run
        "kernel_us": kernel_s / (2 * n) * 1e6,  # the kernel's CPU per event, all included
        "stored": len(scalars),
        "per_rank": counts,
        "complete": complete,
        "refreshes_per_s": len(window) / elapsed,
        "min_gap_ms": min(gaps) * 1e3 if gaps else None,  # None: under 2 refreshes
    }
    if isinstance(view, CountingView):
        out["refresh_ms"] = statistics.mean(view.spent) * 1e3 if view.spent else 0.0
        _close(view.widget)
    del run, scalars, per_rank, view
    gc.collect()
    return out


def _close(widget: Any) -> None:
    """Close a widget tree: ipywidgets keeps every open widget (and its data) alive."""
    for child in getattr(widget, "children", ()):
        _close(child)
    widget.close()


def _ms(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.0f} ms"


def _line(name: str, r: dict[str, Any]) -> str:
    s = (
        f"{name:<8} {r['events_per_s']:>10,.0f} ev/s  {r['elapsed_s']:.3f} s  "
        f"emit {r['emit_us']:.2f} us/ev (rank CPU {r['rank_cpu_us']:.2f})  "
        f"kernel {r['kernel_cores']:.2f} cores ({r['kernel_us']:.2f} us/ev)  "
        f"stored {r['stored']} {r['per_rank']} "
        f"{'complete' if r['complete'] else 'LOST/OUT OF ORDER'}  "
        f"refreshes {r['refreshes_per_s']:.1f}/s (min gap {_ms(r['min_gap_ms'])})"
    )
    if "refresh_ms" in r:
        s += f" {r['refresh_ms']:.0f} ms each"
    return s


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=200_000, help="events per rank")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--check", action="store_true", help="exit 1 if acceptance fails")
    args = parser.parse_args()
    n = args.n

    print(
        f"bench_telemetry: 2 ranks x {n:,} scalar events, fork, gloo, 1 thread per rank; "
        f"load average {os.getloadavg()[0]:.2f}"
    )
    costs = stage_costs(n, args.repeats)
    print_costs(costs, n)
    results: dict[str, list[dict[str, Any]]] = {v: [] for v in VARIANTS}
    with TimedCluster(nprocs=2, start_method="fork", threads=1) as cluster:
        for rnd in range(args.repeats):
            order = VARIANTS[rnd % 3 :] + VARIANTS[: rnd % 3]
            for name in order:
                r = one_run(cluster, n, name)
                results[name].append(r)
                print(f"  round {rnd + 1}: {_line(name, r)}", flush=True)
                if [v for v in list(live._views) if not getattr(v, "closed", False)]:
                    raise AssertionError("a view outlived its run and would skew the next one")

    def med(name: str, key: str) -> float | None:
        values = [r[key] for r in results[name] if r.get(key) is not None]
        return statistics.median(values) if values else None

    none_lost = all(r["complete"] for rs in results.values() for r in rs)
    keys = (
        "events_per_s",
        "elapsed_s",
        "emit_us",
        "rank_cpu_us",
        "kernel_cores",
        "kernel_us",
        "refreshes_per_s",
        "refresh_ms",
    )
    summary: dict[str, Any] = {
        "bench": "telemetry",
        "events_per_rank": n,
        "loadavg_end": os.getloadavg()[0],
        "repeats": args.repeats,
        "none_lost": none_lost,
        "stages_us": costs,
    }
    print(f"median over {args.repeats} runs each:")
    for name in VARIANTS:
        m = summary[name] = {k: med(name, k) for k in keys if k in results[name][0]}
        gaps = [r["min_gap_ms"] for r in results[name] if r["min_gap_ms"] is not None]
        m["min_gap_ms"] = min(gaps) if gaps else None  # shortest, not median
        each = f", {m['refresh_ms']:.0f} ms each" if "refresh_ms" in m else ""
        print(
            f"  {name:<8} {m['events_per_s']:>10,.0f} ev/s  emit {m['emit_us']:.2f} us/ev  "
            f"(rank CPU {m['rank_cpu_us']:.2f})  kernel {m['kernel_cores']:.2f} cores "
            f"({m['kernel_us']:.2f} us/ev)  "
            f"refreshes {m['refreshes_per_s']:.1f}/s{each}, shortest gap {_ms(m['min_gap_ms'])}"
        )
    ratio = summary["monitor"]["events_per_s"] / summary["counter"]["events_per_s"]
    summary["ratio_monitor/counter"] = ratio
    print(f"  ratio monitor/counter ingest rate: {ratio:.3f}")
    for key in ("events_per_s", "kernel_us"):
        echo = summary["monitor"][key] / summary["no-echo"][key]
        summary[f"ratio_echo/no-echo_{key}"] = echo
        print(f"  ratio echo=True/echo=False {key}: {echo:.3f}")
    print(f"  none lost (count and per-rank sequence, every run): {none_lost}")
    max_hz = max(r["refreshes_per_s"] for rs in results.values() for r in rs)
    rate_ok = summary["monitor"]["events_per_s"] >= ACCEPT_EVENTS_PER_S
    refresh_ok = max_hz <= live.MAX_HZ
    ok = rate_ok and none_lost and refresh_ok
    summary["acceptance"] = {
        ">=1M ev/s with monitor view": rate_ok,
        "none lost": none_lost,
        "refreshes<=10/s": refresh_ok,
    }
    print(f"  most refreshes/s in any run: {max_hz:.1f}")
    print(
        f"acceptance >= {ACCEPT_EVENTS_PER_S:,.0f} ev/s with a live view, none lost, "
        f"<= {live.MAX_HZ:.0f} refreshes/s: {'PASS' if ok else 'FAIL'}"
    )
    print(json.dumps(summary))
    return 1 if args.check and not ok else 0


if __name__ == "__main__":
    sys.exit(main())
