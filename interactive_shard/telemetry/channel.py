"""The channel from ranks to the notebook kernel: ZeroMQ PUSH/PULL carrying msgpack.

Background
----------
Ranks started by a ``Cluster`` and ranks started by ``torchrun`` on other hosts send
events the same way: a PUSH socket on the rank, one PULL socket in the kernel.
ZeroMQ gives framing, reconnection and back-pressure (a full queue blocks the
sender instead of dropping), so no event is lost while the kernel is busy.

Caveats
-------
* Nothing on this socket is unpickled: every message is decoded by a typed msgspec
  decoder, and a message that fails (malformed, oversized, wrong token) is counted
  and dropped.
* The collector binds to loopback by default. Binding elsewhere requires a token,
  which every message must carry (a shared secret, not encryption: use it on
  trusted networks only).
"""

from __future__ import annotations

import ipaddress
import logging
import secrets
import threading
import time
from collections.abc import Callable
from typing import Any

import msgspec
import zmq

from interactive_shard.telemetry.schema import (
    SCHEMA_VERSION,
    Batch,
    Event,
    check_payload,
    decode_batch,
    encode_batch,
)

log = logging.getLogger(__name__)

MAX_MESSAGE_BYTES = 64 * 1024 * 1024


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class Collector:
    """Kernel side: receives batches on a background thread and hands them on.

    ``on_batch`` runs on the collector thread; it must be quick and thread-safe
    (``RunStore.extend`` is).
    """

    def __init__(
        self,
        on_batch: Callable[[Batch], None],
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        token: str | None = None,
    ) -> None:
        if not _is_loopback(host) and not token:
            raise ValueError(
                f"Collector(host={host!r}) listens beyond this machine, so it needs a "
                "token: pass token=secrets.token_hex(16) and give the same token to the "
                "ranks (ish.telemetry.connect(address, token))."
            )
        self.token = token or secrets.token_hex(16)
        self.rejected = 0
        self._on_batch = on_batch
        self._ctx = zmq.Context()
        self._sock = self._ctx.socket(zmq.PULL)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE_BYTES)
        if port:
            self._sock.bind(f"tcp://{host}:{port}")
        else:
            port = self._sock.bind_to_random_port(f"tcp://{host}")
        self.address = f"tcp://{host}:{port}"
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="ish-collector", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        poller = zmq.Poller()
        poller.register(self._sock, zmq.POLLIN)
        while not self._stop.is_set():
            if not poller.poll(100):
                continue
            while True:
                try:
                    data = self._sock.recv(zmq.NOBLOCK, copy=True)
                except zmq.Again:
                    break
                except zmq.ZMQError:  # socket closed under us during shutdown
                    return
                self._receive(data)

    def _receive(self, data: bytes) -> None:
        try:
            batch = decode_batch(data)
        except (msgspec.ValidationError, msgspec.DecodeError) as exc:
            self._reject(f"malformed message ({exc})")
            return
        if not secrets.compare_digest(batch.token, self.token):
            self._reject("wrong token")
            return
        if batch.version > SCHEMA_VERSION:
            self._reject(f"schema version {batch.version} is newer than {SCHEMA_VERSION}")
            return
        try:
            self._on_batch(batch)
        except Exception:  # a consumer bug must not kill the channel
            log.exception("telemetry consumer failed on a batch from rank %d", batch.rank)

    def _reject(self, why: str) -> None:
        self.rejected += 1
        if self.rejected == 1 or self.rejected % 1000 == 0:
            log.warning("telemetry: dropped %d message(s); latest: %s", self.rejected, why)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2)
        self._sock.close(linger=0)
        self._ctx.term()


class Emitter:
    """Rank side: buffers events and sends them in batches.

    ``emit`` may be called from any thread (autograd hooks run on other threads);
    a daemon thread flushes every ``flush_interval`` seconds, and a full buffer is
    flushed inline.
    """

    def __init__(
        self,
        address: str,
        token: str,
        rank: int,
        *,
        flush_interval: float = 0.02,
        max_batch: int = 2000,
    ) -> None:
        self.rank = rank
        self.run = 0
        self.step = 0
        self._token = token
        self._max_batch = max_batch
        self._buffer: list[Event] = []
        self._lock = threading.Lock()
        self._ctx = zmq.Context()
        self._sock = self._ctx.socket(zmq.PUSH)
        self._sock.setsockopt(zmq.LINGER, 5000)  # let queued events out at close
        self._sock.connect(address)
        self._closed = False
        self._interval = flush_interval
        self._thread = threading.Thread(target=self._flush_loop, name="ish-emitter", daemon=True)
        self._thread.start()

    def emit(self, kind: str, payload: dict[str, Any], step: int | None = None) -> None:
        check_payload(kind, payload)
        event = Event(
            kind, self.rank, self.step if step is None else step, time.monotonic(), payload
        )
        with self._lock:
            self._buffer.append(event)
            if len(self._buffer) >= self._max_batch:
                self._send_locked(final=False)

    def start_run(self, run: int) -> None:
        """Tag what follows with ``run`` (earlier events go out under the old id)."""
        with self._lock:
            self._send_locked(final=False)
            self.run = run
            self.step = 0

    def flush(self, *, final: bool = False) -> None:
        with self._lock:
            self._send_locked(final=final)

    def _send_locked(self, *, final: bool) -> None:
        if self._closed or (not self._buffer and not final):
            return
        events, self._buffer = self._buffer, []
        batch = Batch(SCHEMA_VERSION, self._token, self.run, self.rank, events, final)
        self._sock.send(encode_batch(batch), copy=False)

    def _flush_loop(self) -> None:
        while not self._closed:
            time.sleep(self._interval)
            if self._buffer:
                self.flush()

    def close(self) -> None:
        self.flush()
        with self._lock:
            self._closed = True
            self._sock.close()
        self._ctx.term()
