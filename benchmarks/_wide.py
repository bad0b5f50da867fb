"""A simulated wide run (64 ranks and more) streamed into one kernel, or recorded into
one file per rank and merged: shared by ``bench_wide.py`` and
``tests/integration/test_wide_stream.py``.

``_wide_events.rank_streams`` builds every rank's events, a few ranks deliberately
faulty (``Faults``). ``stream`` replays them through the real wire into an
``ish.listen`` Listener: worker processes (``_wide_rank.py``, no torch) host the ranks,
one ``Emitter`` each, while this process drives ``ui.live.tick()`` with every feature's
view built on the Listener's run and times each refresh and each model update.
``record`` replays them into rank files instead (one ``FileEmitter`` a rank, as
``ISH_RECORD=DIR`` records without a notebook), times ``ish.load(DIR)`` (the merge) and
opens every view on the loaded run. ``check_findings`` says whether the cross-rank
findings name the faulty ranks.

Every simulated rank also says where it runs first (a ``rank`` event: ``RankInfo``) and
that it finished last (a ``state`` event), as a real rank does; the emitter may add its
own ``overhead`` events (what its sending cost): counted apart, neither lost nor extra.
"""

from __future__ import annotations

import collections
import dataclasses
import gc
import os
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
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
from interactive_shard.telemetry.schema import RANK, STATE, Event
from interactive_shard.ui import live

HERE = Path(__file__).resolve().parent
WORKER = HERE / "_wide_rank.py"
VIEWS = tuple(f.name for f in FEATURES)
# What each simulated rank sends besides its stream (_wide_rank.py): a RankInfo first,
# a finished state last.
BOOKENDS = {RANK: 1, STATE: 1}


# -- the replay --------------------------------------------------------------------------
def write_plans(
    streams: dict[int, list[Event]],
    workers: int,
    folder: Path,
    *,
    address: str = "",
    token: str = "",
    record: dict[str, Any] | None = None,
) -> list[Path]:
    """One msgpack plan per worker: its ranks (round robin) and their events, interleaved
    by iteration as concurrent ranks would send them; streamed to ``address``, or
    recorded as ``record`` says (``_wide_rank.py``)."""
    plans = []
    for w in range(workers):
        ranks = [r for r in sorted(streams) if r % workers == w]
        # Sorted by step, stable: per iteration, each rank's events in its own order.
        merged = sorted((e for r in ranks for e in streams[r]), key=lambda e: e.step)
        plan = {
            "address": address,
            "token": token,
            "ranks": ranks,
            "record": record,
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


@contextmanager
def gc_pauses() -> Iterator[dict[str, Any]]:
    """The garbage collector's work while the block runs, whichever thread it ran on:
    ``{"collections": per generation, "seconds": total, "longest_s"}`` (filled at exit).
    A wide run's store holds millions of payload lists and dicts: every full collection
    walks them all."""
    out: dict[str, Any] = {"collections": [0, 0, 0], "seconds": 0.0, "longest_s": 0.0}
    started: list[float] = []

    def note(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            started.append(time.perf_counter())
        elif started:
            spent = time.perf_counter() - started.pop()
            out["collections"][info["generation"]] += 1
            out["seconds"] += spent
            out["longest_s"] = max(out["longest_s"], spent)

    gc.callbacks.append(note)
    try:
        yield out
    finally:
        gc.callbacks.remove(note)


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
    expected = expected_counts(streams)
    total = sum(sum(c.values()) for c in expected.values())
    timings = Timings()
    with ish.listen(world_size=world_size) as listener, tempfile.TemporaryDirectory() as tmp:
        run = listener.run
        filled = _note_when_full(run, total)
        classes = {name: type(run.model(name)) for name in VIEWS}
        with timed_updates(classes, timings):
            t_setup = time.perf_counter()
            shown = build_views(run, timings) if views else {}
            setup_s = time.perf_counter() - t_setup
            plans = write_plans(
                streams, workers, Path(tmp), address=listener.address, token=listener.token
            )
            del streams
            procs, results, start = _start_workers(plans, Path(tmp), timeout)
            with gc_pauses() as collected:  # the stream and the catch-up
                try:
                    _drive(listener, procs, timeout)
                finally:
                    _reap(procs)  # only when _drive failed: they all exited otherwise
                timings.phase = "catch_up"  # what arrived since the last throttled tick
                live.tick(force=True)
            findings, check_s = _settle(run, shown, timings, faults, iterations, idle_ticks)
        workers_out = [msgspec.json.decode(p.read_bytes()) for p in results]
        tally = _tally(run, expected)
        rejected = listener.refused
    t_all = filled[0] if filled else time.monotonic()  # not full: the loss shows below
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
        **tally,
        "dropped": sum(sum(w["dropped"].values()) for w in workers_out),
        "rejected": rejected,
        "gc": collected,
        "torch_in_workers": any(w["torch"] for w in workers_out),
        "refresh": _refresh_summary(timings),
        "models": {
            name: {"update_s": timings.update_s[name], "updates": timings.updates[name]}
            for name in VIEWS
        },
        "findings": findings,
        "faults": dataclasses.asdict(faults),
    }


def record(
    world_size: int,
    iterations: int,
    workers: int,
    *,
    idle_ticks: int = 10,
    timeout: float = 600,
    keep: Path | None = None,
) -> dict[str, Any]:
    """Generate, replay through ``workers`` processes into one rank file per rank
    (``FileEmitter``, as ``ISH_RECORD`` records), merge them with ``ish.load(folder)``
    (timed), check that the loaded run holds what each rank emitted, open every view on
    it and refresh them, check the findings. ``keep``: record into this (empty) folder
    and leave the files there (to profile the merge on them); else a temporary one."""
    faults = Faults.spread(world_size, iterations)
    t_gen = time.perf_counter()
    streams = rank_streams(world_size, iterations, faults)
    generated_s = time.perf_counter() - t_gen
    expected = expected_counts(streams)
    total = sum(sum(c.values()) for c in expected.values())
    job = f"bench-wide-{os.getpid()}-{time.time_ns()}"
    with tempfile.TemporaryDirectory() as tmp:
        folder = keep if keep is not None else Path(tmp) / "record"
        spec = {"folder": str(folder), "world_size": world_size, "job": job}
        plans = write_plans(streams, workers, Path(tmp), record=spec)
        del streams
        procs, results, start = _start_workers(plans, Path(tmp), timeout)
        try:
            for p in procs:
                p.wait(timeout=max(1.0, start + timeout - time.monotonic()))
                if p.returncode:
                    raise RuntimeError(f"a worker exited {p.returncode}")
        finally:
            _reap(procs)
        written_s = time.monotonic() - start  # every rank's file written and closed
        workers_out = [msgspec.json.decode(p.read_bytes()) for p in results]
        files = sorted(folder.glob("*.jsonl"))
        size = sum(f.stat().st_size for f in files)
        with gc_pauses() as merge_gc:
            merged, merge_warnings = load_timed(folder)
        run = merged["run"]
        tally = _tally(run, expected)
        timings = Timings(phase="catch_up")
        classes = {name: type(run.model(name)) for name in VIEWS}
        with timed_updates(classes, timings), gc_pauses() as views_gc:
            t_setup = time.perf_counter()
            shown = build_views(run, timings)
            setup_s = time.perf_counter() - t_setup
            live.tick(force=True)  # the first refresh: the whole run is there
            findings, check_s = _settle(run, shown, timings, faults, iterations, idle_ticks)
    return {
        "world_size": world_size,
        "iterations": iterations,
        "workers": workers,
        "events": total,
        "generated_s": generated_s,
        "written_s": written_s,
        "emit_s": max(w["last_emit"] for w in workers_out) - start,
        "files": len(files),
        "bytes": size,
        "merge_s": merged["seconds"],
        "merge_warnings": merge_warnings,
        "merge_gc": merge_gc,
        "views_gc": views_gc,
        "views_built_s": setup_s,
        "findings_s": check_s,
        **tally,
        "dropped": sum(sum(w["dropped"].values()) for w in workers_out),
        "torch_in_workers": any(w["torch"] for w in workers_out),
        "refresh": _refresh_summary(timings),
        "models": {
            name: {"update_s": timings.update_s[name], "updates": timings.updates[name]}
            for name in VIEWS
        },
        "findings": findings,
        "faults": dataclasses.asdict(faults),
    }


def load_timed(folder: Path) -> tuple[dict[str, Any], list[str]]:
    """``ish.load(folder)`` timed (``{"run", "seconds"}``), and the warnings it gave."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ish.RecordingWarning)
        t0 = time.perf_counter()
        run = ish.load(folder)
        seconds = time.perf_counter() - t0
    return {"run": run, "seconds": seconds}, [str(w.message) for w in caught]


def expected_counts(streams: dict[int, list[Event]]) -> dict[int, collections.Counter[str]]:
    """Per rank, the events of each kind it sends: its stream and ``BOOKENDS``."""
    out = {r: collections.Counter(e.kind for e in events) for r, events in streams.items()}
    for counts in out.values():
        counts.update(BOOKENDS)
    return out


def _tally(run: Run, expected: dict[int, collections.Counter[str]]) -> dict[str, Any]:
    """What the store holds against what the ranks sent: ``stored`` (events of the
    kinds sent), ``lost`` and ``surplus`` by rank and kind (empty: none), and
    ``emitter_own`` (events of other kinds, by kind: the emitter's ``overhead``)."""
    stored = _stored(run)
    lost: dict[int, dict[str, int]] = {}
    surplus: dict[int, dict[str, int]] = {}
    own: collections.Counter[str] = collections.Counter()
    for r in sorted(set(expected) | set(stored)):
        want, got = expected.get(r, collections.Counter()), stored.get(r, {})
        if short := {k: n - got.get(k, 0) for k, n in want.items() if got.get(k, 0) < n}:
            lost[r] = short
        more = {k: n - want[k] for k, n in got.items() if k in want and n > want[k]}
        if more:
            surplus[r] = more
        own.update({k: n for k, n in got.items() if k not in want})
    kept = sum(n for r, d in stored.items() for k, n in d.items() if k in expected.get(r, {}))
    return {"stored": kept, "lost": lost, "surplus": surplus, "emitter_own": dict(own)}


def _start_workers(
    plans: list[Path], tmp: Path, timeout: float
) -> tuple[list[subprocess.Popen[bytes]], list[Path], float]:
    """One worker per plan, started at once when all are ready: (processes, their
    result files, the monotonic time of the start signal)."""
    results = [tmp / f"result{w}.json" for w in range(len(plans))]
    ready = [tmp / f"ready{w}" for w in range(len(plans))]
    go = tmp / "go"
    procs = [
        subprocess.Popen([sys.executable, str(WORKER), str(p), str(out), str(r), str(go)])
        for p, out, r in zip(plans, results, ready, strict=True)
    ]
    try:
        _wait_ready(procs, ready, timeout)
    except BaseException:
        _reap(procs)
        raise
    start = time.monotonic()
    go.touch()
    return procs, results, start


def _reap(procs: list[subprocess.Popen[bytes]]) -> None:
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.wait()


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


def _settle(
    run: Any, shown: dict[str, Any], timings: Any, faults: Any, iterations: int, idle_ticks: int
) -> tuple[Any, float]:
    """The idle refreshes, then the findings and how long checking them took; the views
    close."""
    timings.phase = "idle"
    for _ in range(idle_ticks):
        live.tick(force=True)
    t_check = time.perf_counter()
    findings = check_findings(run, faults, iterations)
    check_s = time.perf_counter() - t_check
    for view in shown.values():
        _close(view.widget)
    return findings, check_s
