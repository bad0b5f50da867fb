"""Telemetry under a flood: 1M hostile messages at a live 2-rank cluster, none of its
events lost.

A separate process (``tests/hostile.py flood``) sends ``--messages`` small hostile
messages (a cycle of every shape the collector refuses: garbage, old wire format,
wrong or non-UTF-8 token, bin / ext / timestamp values, NaN times, nesting 5,000 and
100,000 deep, newer schema, bad ranks) on one connection, and ``--oversized`` messages
over ``MAX_MESSAGE_BYTES`` on another. Meanwhile the cluster runs, back to back, runs
in which each rank emits ``-n`` numbered scalar events. Measured:

* good events kept / sent, and whether each rank's sequence arrived whole and in order;
* hostile messages counted by the collector, by reason, against what was sent;
* peak RSS of this process (it hosts the collector) over its RSS before the flood,
  sampled every 20 ms with psutil;
* duration of the flood (sender started to last message counted), and its rate.

Acceptance: every good event kept in order, every small hostile message counted, at
least one dropped connection counted for the oversized ones, RSS growth < 300 MiB.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psutil

import interactive_shard as ish
from interactive_shard.telemetry import channel

HOSTILE = Path(__file__).resolve().parents[1] / "tests" / "hostile.py"
ACCEPT_RSS_GROWTH_MIB = 300.0


def emit_numbered(ctx: Any, n: int) -> None:
    for i in range(n):
        ctx.emit("scalar", name="seq", value=i)


class PeakRss:
    """Samples this process's RSS on a thread until stopped."""

    def __init__(self) -> None:
        self.proc = psutil.Process()
        self.base = self.peak = self.proc.memory_info().rss / 2**20
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.02):
            self.peak = max(self.peak, self.proc.memory_info().rss / 2**20)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=1_000_000, help="small hostile ones")
    parser.add_argument("--oversized", type=int, default=100)
    parser.add_argument("-n", type=int, default=20_000, help="good events per rank per run")
    parser.add_argument("--repeats", type=int, default=1, help="ignored (run_all passes it)")
    parser.add_argument("--check", action="store_true", help="exit 1 if acceptance fails")
    args = parser.parse_args()
    print(
        f"bench_flood: {args.messages:,} hostile + {args.oversized} oversized messages at a "
        f"2-rank cluster running {args.n:,} events per rank per run; "
        f"load average {os.getloadavg()[0]:.2f}",
        flush=True,
    )
    with ish.Cluster(nprocs=2, start_method="fork", threads=1, echo=False) as cluster:
        address, token = cluster.telemetry
        collector = cluster._collector
        cluster.run(emit_numbered, 10)  # warm: the first run pays for imports
        rss = PeakRss()
        cmd = [sys.executable, str(HOSTILE), "flood", address, token]
        cmd += ["--messages", str(args.messages), "--oversized", str(args.oversized)]
        t_start = time.monotonic()
        flood = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
        sent_good = kept_good = runs = 0
        in_order = True
        while flood.poll() is None or runs == 0:
            run = cluster.run(emit_numbered, args.n)
            scalars = run.store.of_kind("scalar")
            for rank in range(2):
                values = [e.payload["value"] for e in scalars if e.rank == rank]
                in_order &= values == list(range(args.n))
                kept_good += len(values)
            sent_good += 2 * args.n
            runs += 1
        sent = json.loads(flood.communicate()[0])
        small = {r: n for r, n in sent.items() if r != "oversized"}
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and any(
            collector.rejected_by_reason.get(r, 0) < n for r, n in small.items()
        ):
            time.sleep(0.05)
        t_last = time.monotonic()
        rss.stop()
        counted = dict(collector.rejected_by_reason)
    duration = t_last - t_start  # the sender's start-up (~0.3 s) included
    hostile_counted = sum(counted.get(r, 0) for r in small)
    dropped = counted.get(channel.CONNECTION_DROPPED, 0)
    growth = rss.peak - rss.base
    print(
        f"  good events kept/sent: {kept_good:,}/{sent_good:,} in {runs} runs, in order: {in_order}"
    )
    print(f"  hostile counted/sent: {hostile_counted:,}/{sum(small.values()):,}; oversized sent "
          f"{sent.get('oversized', 0)}, dropped connections counted {dropped}")  # fmt: skip
    for reason, n in sorted(counted.items(), key=lambda kv: -kv[1]):
        print(f"    {n:>9,}  {reason}")
    print(f"  flood duration {duration:.1f} s ({hostile_counted / max(duration, 1e-9):,.0f} msg/s)")
    print(f"  RSS before {rss.base:.0f} MiB, peak {rss.peak:.0f} MiB (growth {growth:.0f} MiB)")
    ok = (
        in_order
        and kept_good == sent_good
        and hostile_counted == sum(small.values())
        and (dropped >= 1 or not sent.get("oversized"))
        and growth < ACCEPT_RSS_GROWTH_MIB
    )
    print(f"acceptance (none lost, all counted, RSS growth < 300 MiB): {'PASS' if ok else 'FAIL'}")
    summary = {
        "bench": "flood",
        "good_kept": kept_good,
        "good_sent": sent_good,
        "in_order": in_order,
        "hostile_counted": hostile_counted,
        "hostile_sent": sum(small.values()),
        "oversized_sent": sent.get("oversized", 0),
        "dropped_connections": dropped,
        "duration_s": duration,
        "rss_base_mib": rss.base,
        "rss_peak_mib": rss.peak,
        "ok": ok,
    }
    print(json.dumps(summary))
    return 1 if args.check and not ok else 0


if __name__ == "__main__":
    sys.exit(main())
