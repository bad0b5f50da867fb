"""Where a scalar's time goes, stage by stage, in this one process (no ranks): sent as
columns (Note [Columnar scalars]) beside the same scalars sent as events.

* emit: ``ctx.emit("scalar", name="x", value=...)`` into an Emitter whose messages go
  to a socket nobody reads, its sends included (a float value goes as columns; an int
  value, the same event otherwise, takes the event path);
* pack + encode: the buffered tuples into one message (the rank's send);
* decode: the collector's ``schema.decode_body`` of that message;
* store: ``RunStore.extend`` of the decoded batch;
* monitor: a fresh ``MonitorModel``'s update over all of them.

Each figure is microseconds per event, the median of ``repeats``.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import msgspec
import zmq

from interactive_shard.cluster.context import RankContext
from interactive_shard.monitor.model import MonitorModel
from interactive_shard.telemetry import schema
from interactive_shard.telemetry.emitter import Emitter
from interactive_shard.telemetry.store import RunInfo, RunStore

BATCH = 2000  # the Emitter's max_batch: what one message holds
STAGES = ("emit", "pack + encode", "decode", "store", "monitor")
PATHS = ("columns", "events")


def _median_us(run: Callable[[], object], n: int, repeats: int) -> float:
    spent = []
    for _ in range(repeats):
        t = time.perf_counter()
        run()
        spent.append(time.perf_counter() - t)
    return statistics.median(spent) / n * 1e6


def _emit_us(n: int, repeats: int, value: Callable[[int], float | int]) -> float:
    ctx = zmq.Context()
    sink = ctx.socket(zmq.PULL)  # bound, never read: ZeroMQ queues what arrives
    port = sink.bind_to_random_port("tcp://127.0.0.1")
    emitter = Emitter(f"tcp://127.0.0.1:{port}", "bench-token", 0)
    rank = RankContext(0, 1, "cpu", "gloo", emitter)
    values = [value(i) for i in range(n)]

    def emit_all() -> None:
        emit = rank.emit
        for v in values:
            emit("scalar", name="x", value=v)
        emitter.flush()

    try:
        return _median_us(emit_all, n, repeats)
    finally:
        emitter.close()
        sink.close(linger=0)
        ctx.term()


def stage_costs(n: int, repeats: int) -> dict[str, dict[str, float]]:
    """Microseconds per event of each stage, for each path."""
    t0 = time.monotonic()
    buffered = [("x", float(i), i // 100, t0 + i * 1e-6) for i in range(n)]
    batches = [buffered[i : i + BATCH] for i in range(0, n, BATCH)]
    least = schema.MIN_COLUMNS
    out: dict[str, dict[str, float]] = {}
    for path, value in zip(PATHS, (float, int), strict=True):
        # The event path: no run is long enough to go as columns.
        schema.MIN_COLUMNS = least if path == "columns" else BATCH + 1
        try:
            out[path] = {"emit": _emit_us(n, repeats, value), **_kernel(batches, n, repeats)}
        finally:
            schema.MIN_COLUMNS = least
    return out


def _kernel(batches: list[list[tuple[Any, ...]]], n: int, repeats: int) -> dict[str, float]:
    """Pack + encode, decode, store and monitor, each timed over all of ``batches``."""
    encoder, token = msgspec.msgpack.Encoder(), schema.token_field("bench-token")
    messages: list[tuple[int, memoryview]] = []
    decoded: list[tuple[list[schema.Event], list[schema.ScalarRun]]] = []
    stores: list[RunStore] = []

    def pack() -> None:
        messages.clear()
        for batch in batches:
            body, flags = schema.pack_body(0, batch)
            data = schema.encode_message(encoder, 1, token, 1, 0, body, flags)
            messages.append((flags, memoryview(data)[schema.HEADER_SIZE :]))

    def decode() -> None:
        decoded[:] = [schema.decode_body(flags, body) for flags, body in messages]

    def store() -> None:
        stores[:] = [RunStore(RunInfo(world_size=1, backend="gloo", device_types=["cpu"]))]
        for events, scalars in decoded:
            stores[0].extend(events, rank=0, scalars=scalars)

    def monitor() -> None:
        MonitorModel(stores[0]).update()

    stages = (pack, decode, store, monitor)
    return {name: _median_us(run, n, repeats) for name, run in zip(STAGES[1:], stages, strict=True)}


def print_costs(costs: dict[str, dict[str, float]], n: int) -> None:
    print(f"where a scalar's time goes ({n:,} in this process, us per event, median):")
    print(f"  {'stage':<14}" + "".join(f"{path:>10}" for path in PATHS) + "   events/columns")
    for stage in STAGES:
        a, b = (costs[path][stage] for path in PATHS)
        print(f"  {stage:<14}{a:>10.3f}{b:>10.3f}   {b / a:>8.1f}x")
    kernel = {path: sum(costs[path][s] for s in STAGES[2:]) for path in PATHS}
    print(
        f"  {'kernel (sum)':<14}"
        + "".join(f"{kernel[p]:>10.3f}" for p in PATHS)
        + f"   {kernel['events'] / kernel['columns']:>8.1f}x"
    )
