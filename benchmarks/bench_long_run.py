"""A 10,000-iteration run: its recording saves and loads in seconds, every view opens
and follows its iteration selector quickly, and the HTML report stays small.

A synthetic 2-rank run (``interactive_shard.testing``: events exactly as the probes emit
them) of ``--iterations`` iterations with the bucket, timeline, lifecycle and precision
probes' events, two scalars a step and a recompiled graph split. Measured: save and
load (``run.save`` / ``ish.load``: every line validated) with the file size; per view,
opening it on the loaded run (``.widget`` built, as a cell displaying it does) and then
choosing another iteration (``iteration_selector.value``, where the view has one);
``run.to_html`` and the report's size (``REPORT_LIMIT_MB`` documented in the README).

    python benchmarks/bench_long_run.py [--iterations 10000] [--check]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from importlib import import_module
from pathlib import Path
from typing import Any

import bench_views  # this folder: the precision stream

import interactive_shard as ish
from interactive_shard import testing
from interactive_shard.features import FEATURES
from interactive_shard.telemetry.schema import Event
from interactive_shard.telemetry.store import RunInfo, RunStore

LOAD_S = 10.0  # "in seconds"
OPEN_MS = 1000.0  # a view opening on the whole run: one cell's display
SELECT_MS = 200.0  # choosing another iteration
REPORT_LIMIT_MB = 10.0


def events(iterations: int) -> list[Event]:
    """Every probe's events of an ``iterations``-long 2-rank run, in time order."""
    params = testing.mlp_params(8, 16)
    parts = [
        testing.FakeRun(params, iterations=iterations).events(),
        testing.FakeTimeline(iterations=iterations).events(),
        testing.FakeLifecycle(iterations=iterations).events(),
        bench_views.precision(2 * iterations + 2),  # FakePrecision itself is quadratic
        testing.FakeSplits(testing.mlp_graph(4, 256), bucket_cap_mb=1, compiles=2).events(),
        [
            Event("scalar", r, i, 1000.0 + i, {"name": name, "value": 1.0 / i})
            for i in range(1, iterations + 1)
            for r in range(2)
            for name in ("loss", "lr")
        ],
    ]
    return sorted((e for p in parts for e in p), key=lambda e: e.t)


def _close(widget: Any) -> None:
    for child in getattr(widget, "children", ()):
        _close(child)
    widget.close()


def views(run: ish.Run, iterations: int) -> dict[str, dict[str, float]]:
    from interactive_shard.monitor.view import MonitorView

    _close(MonitorView(ish.Run(RunStore(run.store.info))).widget)  # imports: not a view's cost
    out = {}
    for feature in FEATURES:
        module, cls = feature.view.split(":")
        view_class = getattr(import_module(module), cls)
        t0 = time.perf_counter()
        view = view_class(run) if feature.name == "monitor" else view_class(run.model(feature.name))
        widget = view.widget
        t1 = time.perf_counter()
        timing = {"open_ms": (t1 - t0) * 1e3}
        selector = getattr(view, "iteration_selector", None)
        if selector is not None:
            options = [
                o[1] if isinstance(o, tuple) else o for o in getattr(selector, "options", ())
            ]
            target = options[len(options) // 2] if options else iterations // 2
            t1 = time.perf_counter()
            selector.value = target
            view.refresh()
            timing["select_ms"] = (time.perf_counter() - t1) * 1e3
        out[feature.name] = timing
        _close(widget)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=10_000)
    parser.add_argument("--repeats", type=int, default=1, help="(one run: it is long)")
    parser.add_argument("--check", action="store_true", help="exit 1 if acceptance fails")
    args = parser.parse_args()
    t0 = time.perf_counter()
    stream = events(args.iterations)
    print(
        f"bench_long_run: {args.iterations:,} iterations, 2 ranks, {len(stream):,} events "
        f"(generated in {time.perf_counter() - t0:.1f} s)",
        flush=True,
    )
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "long.jsonl"
        store = RunStore(RunInfo(world_size=2, backend="gloo", device_types=["cpu"]))
        store.extend(stream)
        t0 = time.perf_counter()
        ish.Run(store).save(path)
        save_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        run = ish.load(path)
        load_s = time.perf_counter() - t0
        size_mb = path.stat().st_size / 2**20
        print(f"  save {save_s:.2f} s, load {load_s:.2f} s, {size_mb:.1f} MiB", flush=True)
        opened = views(run, args.iterations)
        for name, timing in opened.items():
            select = f", select {timing['select_ms']:.0f} ms" if "select_ms" in timing else ""
            print(f"  view {name:<10} open {timing['open_ms']:.0f} ms{select}", flush=True)
        t0 = time.perf_counter()
        report = run.to_html(Path(tmp) / "report.html")
        html_s = time.perf_counter() - t0
        report_mb = Path(report).stat().st_size / 2**20
    print(f"  report {html_s:.1f} s, {report_mb:.2f} MiB (limit {REPORT_LIMIT_MB:.0f} MiB)")
    ok = (
        load_s <= LOAD_S
        and report_mb <= REPORT_LIMIT_MB
        and all(t["open_ms"] <= OPEN_MS for t in opened.values())
        and all(t.get("select_ms", 0.0) <= SELECT_MS for t in opened.values())
    )
    print(
        f"acceptance load <= {LOAD_S:.0f} s, open <= {OPEN_MS:.0f} ms, select <= "
        f"{SELECT_MS:.0f} ms, report <= {REPORT_LIMIT_MB:.0f} MiB: {'PASS' if ok else 'FAIL'}"
    )
    summary = {
        "bench": "long_run",
        "iterations": args.iterations,
        "events": len(stream),
        "save_s": save_s,
        "load_s": load_s,
        "recording_mib": size_mb,
        "views": opened,
        "report_s": html_s,
        "report_mib": report_mb,
        "pass": ok,
    }
    print(json.dumps(summary))
    return 1 if args.check and not ok else 0


if __name__ == "__main__":
    sys.exit(main())
