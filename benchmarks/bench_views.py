"""View refresh at scale: every view's refresh with 100k new events, and with none.

For each feature a synthetic stream (``interactive_shard.testing``: events exactly as
its probe emits them) is sized to about ``--events`` events of the feature's kinds: the
monitor gets scalars, buckets / timeline / precision / lifecycle the iterations of a
long run (2 ranks), splits a recompile storm of ``--compiles`` compiles among scalars.
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
import gc
import json
import statistics
import sys
import time
from collections.abc import Callable
from importlib import import_module
from typing import Any

import msgspec

from interactive_shard import testing
from interactive_shard.cluster.run import Run
from interactive_shard.features import FEATURES
from interactive_shard.telemetry import schema
from interactive_shard.telemetry.schema import Event
from interactive_shard.telemetry.store import RunInfo, RunStore

NEW_MS, UNCHANGED_MS = 50.0, 5.0


def scalars(n: int, world_size: int = 2, t0: float = 1000.0) -> list[Event]:
    return [
        Event(
            "scalar", i % world_size, i // world_size, t0 + i * 1e-6, {"name": "loss", "value": i}
        )
        for i in range(n)
    ]


def _scaled(make: Callable[[int], list[Event]], events: int) -> list[Event]:
    """``make(iterations)`` sized so that it yields about ``events`` events."""
    per = max(1, len(make(4)) // 4)
    return make(max(2, events // per))


def precision(events: int, world_size: int = 2) -> list[Event]:
    """A long mixed-precision run of about ``events`` events: ``FakePrecision``'s watches
    and its last iteration's batches copied, re-numbered, for every iteration. (Its
    generator rescans a rank's records at every record: 50k iterations would take hours.)"""
    policies = {k: testing.fsdp2_policy("bf16", "fp32") for k in ("", "1", "2")}
    fake = testing.FakePrecision(testing.mp_net(policies), world_size=world_size, iterations=3)
    made = fake.events()
    out = [e for e in made if e.kind == "precision_watch"]
    last = [e for e in made if e.kind == "precision_batch" and e.step == fake.iterations]
    for it in range(1, max(2, (events - len(out)) // len(last)) + 1):
        for e in last:
            payload = {k: [{**r, "iteration": it} for r in v] for k, v in e.payload.items()}
            out.append(Event(e.kind, e.rank, it, fake.t0 + it + e.rank * 1e-6, payload))
    return out


def streams(events: int, compiles: int) -> dict[str, Callable[[], list[Event]]]:
    params = testing.mlp_params(8, 16)

    def splits() -> list[Event]:
        fake = testing.FakeSplits(testing.mlp_graph(8, 256), bucket_cap_mb=1, compiles=compiles)
        return sorted(scalars(events) + fake.events(), key=lambda e: e.t)

    return {
        "monitor": lambda: scalars(events),
        "buckets": lambda: _scaled(
            lambda n: testing.FakeRun(params, iterations=n).events(), events
        ),
        "splits": splits,
        "precision": lambda: precision(events),
        "timeline": lambda: _scaled(lambda n: testing.FakeTimeline(iterations=n).events(), events),
        "ddp": lambda: _scaled(lambda n: testing.FakeLifecycle(iterations=n).events(), events),
    }


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
    parser.add_argument("--compiles", type=int, default=200, help="splits: compiles")
    parser.add_argument("--feature", action="append", help="only these (repeatable)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--check", action="store_true", help="exit 1 if acceptance fails")
    args = parser.parse_args()
    chosen = streams(args.events, args.compiles)
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
