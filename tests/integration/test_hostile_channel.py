"""A hostile peer on the telemetry port of a live cluster: refused, counted, harmless.

The peer is this test (its own PUSH socket) or ``tests/hostile.py`` run as a separate
process. Each test ends with a normal run whose events must all arrive, in order.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import hostile
import psutil
import pytest
import zmq
from support import wait_for

import interactive_shard as ish
from interactive_shard.telemetry import channel, schema

HOSTILE = str(hostile.ROOT / "tests" / "hostile.py")
RSS_LIMIT_MIB = 300


CLUSTER = {"timeout": 20, "echo": False}  # the shared fixture's options (conftest.py)


@pytest.fixture
def push(cluster: ish.Cluster) -> Iterator[zmq.Socket]:
    ctx = zmq.Context()
    sock = ctx.socket(zmq.PUSH)
    sock.setsockopt(zmq.SNDTIMEO, 10_000)
    sock.connect(cluster.telemetry[0])
    yield sock
    sock.close(linger=0)
    ctx.term()


def emit_numbered(ctx: Any, n: int, chunks: int = 1, pause: float = 0.0) -> None:
    for i in range(n):
        ctx.emit("scalar", name="seq", value=i)
        if pause and (i + 1) % (n // chunks) == 0:
            ctx.flush()
            time.sleep(pause)


def _assert_all_arrived(run: ish.Run, n: int) -> None:
    scalars = run.store.of_kind("scalar")
    for rank in range(2):
        assert [e.payload["value"] for e in scalars if e.rank == rank] == list(range(n))


def test_no_single_message_stops_the_collector(cluster: ish.Cluster, push: zmq.Socket) -> None:
    token = cluster.telemetry[1]
    shapes = {**hostile.unauthenticated_shapes(token), **hostile.authenticated_shapes(token)}
    body = hostile.events_body(["scalar", 1, 0, 1.0, {"value": -1}])
    shapes["event of another rank"] = (hostile.message(token, body, rank=0), "")
    shapes["unknown rank"] = (hostile.message(token, body, rank=7, flags=schema.FINAL), "")
    collector = cluster._collector
    before = collector.rejected
    for data, _ in shapes.values():
        push.send(data)
    wait_for(lambda: collector.rejected - before >= len(shapes), timeout=5)
    run = cluster.run(emit_numbered, 200)
    _assert_all_arrived(run, 200)
    assert collector.rejected - before == len(shapes)
    assert {schema.RANK_MISMATCH, schema.UNKNOWN_RANK} <= set(collector.rejected_by_reason)


def test_a_flood_of_hostile_messages_loses_no_good_event(cluster: ish.Cluster) -> None:
    address, token = cluster.telemetry
    collector = cluster._collector
    before = dict(collector.rejected_by_reason)
    cmd = [sys.executable, HOSTILE, "flood", address, token, "--messages", "20000"]
    flood = subprocess.Popen([*cmd, "--oversized", "10"], stdout=subprocess.PIPE, text=True)
    try:
        wait_for(
            lambda: collector.rejected > sum(before.values()) + 500, timeout=30
        )  # it is under way
        run = cluster.run(emit_numbered, 4000, 20, 0.05)  # 1 s of events, in 20 batches
        out, _ = flood.communicate(timeout=60)
    finally:
        flood.kill()
        flood.wait()
    _assert_all_arrived(run, 4000)
    sent = json.loads(out)

    def counted(reason: str) -> int:
        return collector.rejected_by_reason.get(reason, 0) - before.get(reason, 0)

    small = {r: n for r, n in sent.items() if r != "oversized"}
    wait_for(lambda: all(counted(r) >= n for r, n in small.items()), timeout=30)
    assert {r: counted(r) for r in small} == small
    assert counted(channel.CONNECTION_DROPPED) >= 1


def test_oversized_unauthenticated_flood_keeps_collector_memory_bounded() -> None:
    """Six 57 MiB messages (once: 2 GB of decoded objects), 200 just under the limit with a
    wrong token, 20 over it: the host's peak RSS stays under RSS_LIMIT_MIB."""
    host = subprocess.Popen(
        [sys.executable, HOSTILE, "host"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert host.stdin is not None and host.stdout is not None
    peak = [0.0]
    done = threading.Event()

    def watch() -> None:  # psutil from outside: the host's own memory only
        proc = psutil.Process(host.pid)
        while not done.is_set():
            try:
                peak[0] = max(peak[0], proc.memory_info().rss / 2**20)
            except psutil.Error:
                return
            if peak[0] > RSS_LIMIT_MIB:
                host.kill()  # no need to let it reach gigabytes
                return
            time.sleep(0.01)

    ctx = zmq.Context()
    try:
        ready = json.loads(host.stdout.readline())
        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        n = 57 * 2**20  # {"a": [[], [], ...]}: msgpack array32 of n empty arrays
        payload = b"\x81\xa1a\xdd" + n.to_bytes(4, "big") + b"\x90" * n
        huge = hostile.old_format(hostile.WRONG, payload)
        near = hostile.message(hostile.WRONG, b"\x90" * (schema.MAX_MESSAGE_BYTES - 200))
        over = hostile.message(hostile.WRONG, b"\x90" * schema.MAX_MESSAGE_BYTES)
        big, small = ctx.socket(zmq.PUSH), ctx.socket(zmq.PUSH)
        for sock in (big, small):
            sock.setsockopt(zmq.RECONNECT_IVL, 10)
            sock.setsockopt(zmq.SNDTIMEO, 20_000)
            sock.connect(ready["address"])
        for i in range(200):
            small.send(near, copy=False)
            if i % 10 == 0:
                big.send(over, copy=False)
            if i % 40 == 0:
                big.send(huge, copy=False)
        good = hostile.events_body(["scalar", 0, 0, 1.0, {"value": 1}])
        small.send(hostile.message(ready["token"], good, flags=schema.FINAL))
        small.close(linger=20_000)  # waits until all of it went out
        big.close(linger=0)
        stats: dict[str, Any] = {}

        def arrived() -> bool:
            host.stdin.write("stats\n")
            host.stdin.flush()
            stats.update(json.loads(host.stdout.readline()))
            return bool(stats["batches"])

        wait_for(arrived, timeout=30)
    finally:
        done.set()
        ctx.term()
        host.kill()
        host.wait()
    assert max(peak[0], stats["peak_rss_mib"]) < RSS_LIMIT_MIB, (peak[0], stats)
    assert stats["rejected_by_reason"][schema.WRONG_TOKEN] == 200
    assert stats["rejected_by_reason"][channel.CONNECTION_DROPPED] >= 1
