"""A simulated wide run (64 ranks) streamed into one kernel: shared by ``bench_wide.py``
and ``tests/integration/test_wide_stream.py``.

``_wide_events.rank_streams`` builds every rank's events, a few ranks deliberately
faulty (``Faults``). ``stream`` replays them through the real wire into an
``ish.listen`` Listener: worker processes (``_wide_rank.py``, no torch) host the ranks,
one ``Emitter`` each, while this process drives ``ui.live.tick()`` with every feature's
view built on the Listener's run and times each refresh and each model update.
``check_findings`` says whether the cross-rank findings name the faulty ranks.
"""

from __future__ import annotations

import collections
import dataclasses
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
from _wide_events import DIVERGED_FQN, Faults, rank_streams

import interactive_shard as ish
from interactive_shard.cluster.run import Run
from interactive_shard.features import FEATURES
from interactive_shard.telemetry.schema import Event
from interactive_shard.ui import live

HERE = Path(__file__).resolve().parent
WORKER = HERE / "_wide_rank.py"
VIEWS = tuple(f.name for f in FEATURES)


# -- the replay --------------------------------------------------------------------------
def write_plans(
    streams: dict[int, list[Event]], workers: int, address: str, token: str, folder: Path
) -> list[Path]:
    """One msgpack plan per worker: its ranks (round robin) and their events, interleaved
    by iteration as concurrent ranks would send them."""
    plans = []
    for w in range(workers):
        ranks = [r for r in sorted(streams) if r % workers == w]
        # Sorted by step, stable: per iteration, each rank's events in its own order.
        merged = sorted((e for r in ranks for e in streams[r]), key=lambda e: e.step)
        plan = {
            "address": address,
            "token": token,
            "ranks": ranks,
            "events": [(e.kind, e.rank, e.step, e.payload) for e in merged],
        }
        path = folder / f"plan{w}.msgpack"
        path.write_bytes(msgspec.msgpack.encode(plan))
        plans.append(path)
    return plans


@dataclass
class Timings:
    """Seconds per refresh of each view (by phase) and in each model's updates."""

    phase: str = "streaming"
    refresh: dict[str, dict[str, list[float]]] = field(default_factory=dict)  # view -> phase
    new_events: dict[str, list[int]] = field(default_factory=dict)  # store growth per refresh
    update_s: collections.Counter[str] = field(default_factory=collections.Counter)
    updates: collections.Counter[str] = field(default_factory=collections.Counter)
    errors: dict[str, list[str]] = field(default_factory=dict)  # view -> what its refresh raised


def build_views(run: Run, timings: Timings) -> dict[str, Any]:
    """Each feature's view of ``run``, its widget built without display (as ``bench_views``
    does), its ``refresh`` timed into ``timings``."""
    views = {}
    for name in VIEWS:
        feature = next(f for f in FEATURES if f.name == name)
        view = feature.view_of(run if name == "monitor" else run.model(name))
        _ = view.widget  # built and registered with ui.live, as a displayed view is
        view.refresh = _timed_refresh(name, view.refresh, run, timings)  # ui.live calls this
        views[name] = view
    return views


def _timed_refresh(
    name: str, refresh: Callable[[], None], run: Run, timings: Timings
) -> Callable[[], None]:
    seen = [run.store.version]

    def timed() -> None:
        version = run.store.version
        t0 = time.perf_counter()
        try:
            refresh()
        except Exception as exc:  # ui.live logs it and goes on; the benchmark counts it
            timings.errors.setdefault(name, []).append(f"{type(exc).__name__}: {exc}")
            raise
        spent = time.perf_counter() - t0
        timings.refresh.setdefault(name, {}).setdefault(timings.phase, []).append(spent)
        timings.new_events.setdefault(name, []).append(version - seen[0])
        seen[0] = version

    return timed


@contextmanager
def timed_updates(classes: dict[str, type], timings: Timings) -> Iterator[None]:
    """Time ``update()`` of every instance of ``classes`` (outermost calls only: a model's
    own accessors call it again), restored afterwards. On the class, not the instance:
    the monitor's view builds its own model."""
    # The class's own update, or None when it inherits one (put back by deleting ours).
    own = {name: cls.__dict__.get("update") for name, cls in classes.items()}
    saved = {name: cls.update for name, cls in classes.items()}  # type: ignore[attr-defined]
    depth = collections.Counter[str]()

    def wrap(name: str, update: Callable[[Any], bool]) -> Callable[[Any], bool]:
        def timed(self: Any) -> bool:
            if depth[name]:
                return update(self)
            depth[name] += 1
            t0 = time.perf_counter()
            try:
                return update(self)
            finally:
                depth[name] -= 1
                timings.update_s[name] += time.perf_counter() - t0
                timings.updates[name] += 1

        return timed

    for name, cls in classes.items():
        cls.update = wrap(name, saved[name])  # type: ignore[attr-defined]
    try:
        yield
    finally:
        for name, cls in classes.items():
            if own[name] is None:
                del cls.update  # type: ignore[attr-defined]
            else:
                cls.update = own[name]  # type: ignore[attr-defined]


def stream(
    world_size: int,
    iterations: int,
    workers: int,
    *,
    views: bool = True,
    idle_ticks: int = 10,
    timeout: float = 600,
) -> dict[str, Any]:
    """Generate, replay through ``workers`` processes into one Listener, measure, check.
    ``views=False``: no view is built (the wire and the store alone)."""
    faults = Faults.spread(world_size, iterations)
    t_gen = time.perf_counter()
    streams = rank_streams(world_size, iterations, faults)
    generated_s = time.perf_counter() - t_gen
    expected = {r: collections.Counter(e.kind for e in events) for r, events in streams.items()}
    total = sum(len(v) for v in streams.values())
    timings = Timings()
    with ish.listen(world_size=world_size) as listener, tempfile.TemporaryDirectory() as tmp:
        run = listener.run
        filled = _note_when_full(run, total)
        classes = {name: type(run.model(name)) for name in VIEWS}
        with timed_updates(classes, timings):
            t_setup = time.perf_counter()
            shown = build_views(run, timings) if views else {}
            setup_s = time.perf_counter() - t_setup
            plans = write_plans(streams, workers, listener.address, listener.token, Path(tmp))
            del streams
            results = [Path(tmp) / f"result{w}.json" for w in range(workers)]
            ready = [Path(tmp) / f"ready{w}" for w in range(workers)]
            go = Path(tmp) / "go"
            procs = [
                subprocess.Popen([sys.executable, str(WORKER), str(p), str(out), str(r), str(go)])
                for p, out, r in zip(plans, results, ready, strict=True)
            ]
            try:
                _wait_ready(procs, ready, timeout)
                start = time.monotonic()
                go.touch()
                _drive(listener, procs, timeout)
            finally:
                for p in procs:  # only when _drive failed: they all exited otherwise
                    if p.poll() is None:
                        p.kill()
                    p.wait()
            timings.phase = "catch_up"  # what arrived since the last throttled tick
            live.tick(force=True)
            timings.phase = "idle"
            for _ in range(idle_ticks):
                live.tick(force=True)
            t_check = time.perf_counter()
            findings = check_findings(run, faults, iterations)
            check_s = time.perf_counter() - t_check
            for view in shown.values():
                _close(view.widget)
        workers_out = [msgspec.json.decode(p.read_bytes()) for p in results]
        stored = _stored(run)
        rejected = listener._collector.rejected_by_reason  # no public accessor on a Listener
    t_all = filled[0] if filled else time.monotonic()  # not full: the loss shows below
    lost = {
        r: {k: n - stored.get(r, {}).get(k, 0) for k, n in kinds.items()}
        for r, kinds in expected.items()
    }
    lost = {r: {k: n for k, n in d.items() if n} for r, d in lost.items()}
    lost = {r: d for r, d in lost.items() if d}
    return {
        "world_size": world_size,
        "iterations": iterations,
        "workers": workers,
        "events": total,
        "generated_s": generated_s,
        "views_built_s": setup_s,
        "findings_s": check_s,
        "events_per_s": total / (t_all - start),
        "ingest_s": t_all - start,
        "emit_s": max(w["last_emit"] for w in workers_out) - start,
        "stored": sum(sum(d.values()) for d in stored.values()),
        "lost": lost,
        "dropped": sum(sum(w["dropped"].values()) for w in workers_out),
        "rejected": rejected,
        "torch_in_workers": any(w["torch"] for w in workers_out),
        "refresh": _refresh_summary(timings),
        "models": {
            name: {"update_s": timings.update_s[name], "updates": timings.updates[name]}
            for name in VIEWS
        },
        "findings": findings,
        "faults": dataclasses.asdict(faults),
    }


def _note_when_full(run: Run, total: int) -> list[float]:
    """A list that gets the time at which the store first holds ``total`` events, noted on
    the collector's thread (the main thread may be busy in a refresh then)."""
    store, when = run.store, []
    extend = store.extend

    def counted(events: Any, **kwargs: Any) -> None:
        extend(events, **kwargs)
        if not when and len(store) >= total:
            when.append(time.monotonic())

    store.extend = counted  # type: ignore[method-assign]  # the Listener calls this
    return when


def _wait_ready(procs: list[subprocess.Popen[bytes]], ready: list[Path], timeout: float) -> None:
    """Wait until every worker connected its ranks (start-up is not what we measure)."""
    deadline = time.monotonic() + timeout
    while not all(p.exists() for p in ready):
        failed = [p.returncode for p in procs if p.poll() not in (None, 0)]
        if failed or time.monotonic() > deadline:
            raise RuntimeError(f"workers did not start (exit {failed})")
        time.sleep(0.005)


def _drive(listener: Any, procs: list[subprocess.Popen[bytes]], timeout: float) -> None:
    """Tick the views until every rank closed its stream and every worker exited."""
    world = listener.run.store.info.world_size
    deadline = time.monotonic() + timeout
    while len(listener.streams_closed) < world:
        failed = [p for p in procs if p.poll() not in (None, 0)]
        if failed:
            raise RuntimeError(f"worker(s) failed: exit {[p.returncode for p in failed]}")
        if time.monotonic() > deadline:
            missing = sorted(set(range(world)) - listener.streams_closed)
            raise TimeoutError(f"ranks {missing[:8]}... did not close their streams")
        live.tick()
        time.sleep(0.002)
    for p in procs:
        p.wait(timeout=30)
        if p.returncode:
            raise RuntimeError(f"a worker exited {p.returncode}")


def _stored(run: Run) -> dict[int, dict[str, int]]:
    out: dict[int, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    for e in run.store.events():
        out[e.rank][e.kind] += 1
    return {r: dict(c) for r, c in out.items()}


def _refresh_summary(timings: Timings) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for name in VIEWS:
        phases = timings.refresh.get(name, {})
        row: dict[str, Any] = {
            "max_new_events": max(timings.new_events.get(name, [0])),
            "errors": timings.errors.get(name, []),
        }
        for phase in ("streaming", "catch_up", "idle"):
            spent = phases.get(phase, [])
            row[phase] = {
                "n": len(spent),
                "max_ms": max(spent) * 1e3 if spent else None,
                "median_ms": statistics.median(spent) * 1e3 if spent else None,
            }
        out[name] = row
    return out


def _close(widget: Any) -> None:
    for child in getattr(widget, "children", ()):
        _close(child)
    widget.close()


# -- cross-rank findings -----------------------------------------------------------------
def check_findings(run: Run, faults: Faults, iterations: int) -> dict[str, dict[str, Any]]:
    """Per feature: what its model concluded across ranks, what we expected, and ``ok``."""
    world = run.store.info.world_size
    everyone = list(range(world))
    out: dict[str, dict[str, Any]] = {}

    health = run.model("buckets").health
    diverged = [(f.iteration, f.ranks, f.fqns) for f in health if f.kind == "divergence"]
    want = [(faults.diverge_at, [faults.diverged], [DIVERGED_FQN])]
    out["buckets"] = {"divergence": diverged, "expected": want, "ok": diverged == want}

    timeline = run.model("timeline")
    sample = sorted({1, max(1, iterations // 2), iterations})
    stragglers = sorted({m.straggler for it in sample for m in timeline.collectives(it)})
    matched = [len(timeline.collectives(it)) for it in sample]
    out["timeline"] = {
        "stragglers": stragglers,
        "collectives": matched,
        "expected": [faults.straggler],
        "ok": stragglers == [faults.straggler] and all(matched),
    }

    found = run.model("ddp").findings
    unfinished = [f for f in found if f.kind == "unfinished"]
    dropped = [(f.iteration, f.ranks) for f in found if f.kind == "forward_without_backward"]
    out["ddp"] = {
        "unfinished_iterations": len(unfinished),
        "unfinished_all_ranks": all(f.ranks == everyone for f in unfinished),
        "forward_without_backward": dropped,
        "expected": [(faults.dropped_at, [faults.dropped])],
        "ok": len(unfinished) == iterations
        and all(f.ranks == everyone for f in unfinished)
        and dropped == [(faults.dropped_at, [faults.dropped])],
    }

    splits = run.model("splits")
    nothing = [r for r in splits.ranks if splits.nothing(r) is not None]
    out["splits"] = {
        "nothing": nothing,
        "ranks": len(splits.ranks),
        "expected": [faults.nothing],
        "ok": nothing == [faults.nothing] and len(splits.ranks) == world,
    }

    # Unit "1" computing in float32 under a bf16 policy: full_precision, and its input,
    # cast to bf16 by the policy, reaches float32 weights (uncast_input); on that rank only.
    precision = [(f.kind, f.unit, list(f.ranks)) for f in run.model("precision").findings]
    odd = [faults.full_precision]
    out["precision"] = {
        "findings": precision,
        "expected": ("full_precision", "1", odd),
        "ok": ("full_precision", "1", odd) in precision and all(r == odd for *_, r in precision),
    }
    return out
