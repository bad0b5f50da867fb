"""How long the bucket map takes for 1,000 parameters in 100 buckets (prints, never asserts).

Two models: 500 modules (legend by colour) and 50 modules (legend by module). Each
stage is timed warm, best of ``REPEAT`` runs, next to the 100 ms a live redraw may take
at ``ui.live``'s 10 Hz.

    .venv/bin/python benchmarks/bench_bucket_figure.py
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from interactive_shard.buckets.figures import figure_bucket_map
from interactive_shard.buckets.figures_timeline import figure_bucket_timeline, report_figures
from interactive_shard.buckets.model import BucketMap
from interactive_shard.buckets.view import BucketMapView
from interactive_shard.telemetry.store import RunInfo, RunStore
from interactive_shard.testing import FakeParam, FakeRun

PARAMS, BUCKETS, REPEAT = 1000, 100, 5
PARAM_BYTES = 32 * 32 * 4
CAP_MB = PARAMS // BUCKETS * PARAM_BYTES / 2**20  # exactly 10 parameters per bucket
FRAME_S = 0.1


def best(fn: Callable[[], Any]) -> float:
    times = []
    for _ in range(REPEAT):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def scenario(modules: int) -> None:
    per = PARAMS // modules
    params = [FakeParam(f"m{i // per}.p{i % per}", (32, 32), f"m{i // per}") for i in range(PARAMS)]
    store = RunStore(RunInfo(world_size=2, backend="gloo", device_types=["cpu"]))
    events = FakeRun(params, bucket_cap_mb=CAP_MB, iterations=3).events()

    def consume() -> BucketMap:
        store = RunStore(RunInfo(world_size=2, backend="gloo", device_types=["cpu"]))
        store.extend(events)
        bm = BucketMap(store)
        bm.update()
        return bm

    store.extend(events)
    bm = BucketMap(store)
    assert len(bm.observed(3)) == BUCKETS and bm.compare(3).matches
    view = BucketMapView(bm)
    view.widget  # noqa: B018
    caps = iter([CAP_MB / 2 ** (k % 7) for k in range(1, 100)])

    def slide() -> None:
        view.cap_slider.value = next(caps)

    print(f"\n{PARAMS} params in {BUCKETS} buckets, {modules} modules, {len(events)} events")
    rows = [
        ("consume events (3 iterations x 2 ranks)", consume),
        ("plan (what-if, uncached)", lambda: bm.plan(bucket_cap_mb=next(caps) * 1.0001)),
        ("compare planned vs observed", lambda: bm.compare(3)),
        ("health", lambda: (bm._dirty.update(bm.iterations), bm.health)),
        ("figure_bucket_map", lambda: figure_bucket_map(bm, 3)),
        ("figure_bucket_map + to_dict", lambda: figure_bucket_map(bm, 3).to_dict()),
        ("figure_bucket_timeline", lambda: figure_bucket_timeline(bm, 3)),
        ("report_figures", lambda: report_figures(bm)),
        ("widget: slider move -> map FigureWidget redrawn", slide),
    ]
    for name, fn in rows:
        s = best(fn)
        print(f"  {name:<52} {s * 1e3:8.1f} ms   {s / FRAME_S:5.2f} x a 10 Hz frame")


if __name__ == "__main__":
    for modules in (500, 50):
        scenario(modules)
