"""View refresh at scale: every view's refresh with 100k new events, and with none.

For each feature of the feature list its synthetic run (``Feature.sample``: events
exactly as its probe emits them, 2 ranks) is sized to about ``--events`` events of the
feature's kinds: the monitor's steps, the iterations of a long run, for splits a
recompile storm.
Its view is built (``.widget``, no display) on the first 1 % of the stream, as a live
view is; then the rest arrives at once and we time, on the notebook's thread:

* ``new``: ``view.refresh()`` with the rest new (the model's update included);
* ``unchanged``: a second ``view.refresh()`` with nothing new;
* ``model``: the model's ``update()`` alone over the same events (a second model).

Acceptance (issue 12): ``new`` <= 50 ms, ``unchanged`` <= 5 ms, for every view.

    python benchmarks/bench_views.py [--events 100000] [--feature NAME ...] [--check]
"""

from __future__ import annotations

import argparse
import functools
import gc
import json
import statistics
import sys
import time
from collections.abc import Callable
from importlib import import_module
from typing import Any

import msgspec

from interactive_shard.cluster.run import Run
from interactive_shard.features import FEATURES
from interactive_shard.telemetry import schema
from interactive_shard.telemetry.schema import Event
from interactive_shard.telemetry.store import RunInfo, RunStore

NEW_MS, UNCHANGED_MS = 50.0, 5.0


def _scaled(make: Callable[[int], list[Event]], events: int) -> list[Event]:
    """``make(iterations)`` sized so that it yields about ``events`` events; a sample that
    stops short (a splits run compiles at most a storm's worth) is padded with the run's
    scalars, events of other kinds that its view must pass over."""
    per = max(1, len(make(4)) // 4)
    made = make(max(2, events // per))
    if len(made) >= events // 2:
        return made
    t0 = min(e.t for e in made)
    pad = [
        Event("scalar", i % 2, i // 2, t0 + i * 1e-6, {"name": "loss", "value": float(i)})
        for i in range(events - len(made))
    ]
    return sorted(made + pad, key=lambda e: e.t)


def streams(events: int) -> dict[str, Callable[[], list[Event]]]:
    """Each feature's synthetic run (``Feature.sample``), about ``events`` events long."""
    return {f.name: functools.partial(_scaled, f.sample, events) for f in FEATURES if f.fake}


def _store(world_size: int = 2) -> RunStore:
    return RunStore(RunInfo(world_size=world_size, backend="gloo", device_types=["cpu"]))


def _view(name: str, run: Run) -> Any:
    feature = next(f for f in FEATURES if f.name == name)
    module, cls = feature.view.split(":")
    view_class = getattr(import_module(module), cls)
    return view_class(run) if name == "monitor" else view_class(run.model(name))


def _close(widget: Any) -> None:
    for child in getattr(widget, "children", ()):
        _close(child)
    widget.close()


def wire(events: list[Event]) -> list[Event]:
    """The events as the collector stores them: through the wire format's decoder (its
    payload dicts of plain scalars are not tracked by the garbage collector)."""
    return schema.decode_events(msgspec.msgpack.encode(events))


def measure(name: str, events: list[Event]) -> dict[str, float]:
    head = max(1, len(events) // 100)
    store = _store()
    store.extend(events[:head])
    view = _view(name, Run(store))
    widget = view.widget  # built and registered as a displayed view is
    store.extend(events[head:])
    gc.collect()
    t0 = time.perf_counter()
    view.refresh()
    t1 = time.perf_counter()
    view.refresh()
    t2 = time.perf_counter()
    _close(widget)

    model_class = type(Run(store).model(name))  # a fresh model over the whole stream
    fresh = _store()
    fresh.extend(events[:head])
    model = model_class(fresh)
    model.update()
    fresh.extend(events[head:])
    t3 = time.perf_counter()
    model.update()
    t4 = time.perf_counter()
    return {"new_ms": (t1 - t0) * 1e3, "unchanged_ms": (t2 - t1) * 1e3, "model_ms": (t4 - t3) * 1e3}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=100_000, help="events per feature")
    parser.add_argument("--feature", action="append", help="only these (repeatable)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--check", action="store_true", help="exit 1 if acceptance fails")
    args = parser.parse_args()
    chosen = streams(args.events)
    names = args.feature or list(chosen)
    print(
        f"bench_views: refresh with ~{args.events:,} new events, median of {args.repeats}",
        flush=True,
    )
    summary: dict[str, Any] = {"bench": "views", "events": args.events}
    ok = True
    for name in names:
        events = wire(chosen[name]())
        runs = [measure(name, events) for _ in range(args.repeats)]
        med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        passed = med["new_ms"] <= NEW_MS and med["unchanged_ms"] <= UNCHANGED_MS
        ok &= passed
        summary[name] = {**med, "stream_events": len(events), "pass": passed}
        print(
            f"  {name:<10} {len(events):>8,} events  refresh new {med['new_ms']:8.1f} ms  "
            f"unchanged {med['unchanged_ms']:6.2f} ms  model {med['model_ms']:8.1f} ms  "
            f"{'PASS' if passed else 'FAIL'}",
            flush=True,
        )
    print(
        f"acceptance new <= {NEW_MS:.0f} ms, unchanged <= {UNCHANGED_MS:.0f} ms: "
        f"{'PASS' if ok else 'FAIL'}"
    )
    print(json.dumps(summary))
    return 1 if args.check and not ok else 0


if __name__ == "__main__":
    sys.exit(main())
