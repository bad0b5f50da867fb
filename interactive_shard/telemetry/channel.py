"""The channel from ranks to the notebook kernel: ZeroMQ PUSH/PULL carrying batches.

Background
----------
Ranks started by a ``Cluster`` and ranks started by ``torchrun`` on other hosts send
events the same way: a PUSH socket on the rank, one PULL socket in the kernel.
ZeroMQ gives framing, reconnection and back-pressure (a full queue holds the sender
back), so no event is lost while the kernel is busy. The port is open to anyone who
can reach it, so the collector treats every message as hostile until proven not.

Wire format: one frame per batch, ``schema.HEADER`` (84 bytes: magic ``ish\\x02``,
schema version, flags FINAL / BYE / COLUMNS, run, rank, a 64-byte token field) then the
events as a msgpack array, or with COLUMNS a ``schema.Body``: the events and runs of
scalars as columns (Note [Columnar scalars]). Algorithm of the collector, per message:

1. ZeroMQ drops a connection that announces a frame over ``MAX_MESSAGE_BYTES`` before
   reading it (``MAXMSGSIZE``), and holds at most ``RECV_QUEUE_MESSAGES`` per peer.
2. The header is unpacked and the token field compared in constant time; nothing of
   the body is decoded for a message that fails.
3. The body is decoded by a typed decoder (``schema.Event``): bounded nesting, no
   bin / ext values (but a ``Scalars`` run's columns, bytes checked in numpy by
   ``schema.open_scalars``), finite times. The consumer (``on_batch``) checks ranks against
   the world size (``schema.check_batch``).
4. Any failure in 1-3 is counted by reason (``rejected_by_reason``) and the message
   dropped; the collector thread never dies of a message.

Caveats
-------
* Nothing on this socket is unpickled.
* The collector binds to loopback by default. Binding elsewhere requires a token,
  which every message carries (a shared secret, not encryption: use it on trusted
  networks only). A token holder can still send events in any rank's name.
* A dropped connection is only visible as a disconnect (ZeroMQ says not why): one
  that ends without the Emitter's BYE (oversized frame, peer died) counts as
  ``CONNECTION_DROPPED``.
* Ranks never block for long on a missing notebook: a send waits at most
  ``SEND_TIMEOUT_S``, then the Emitter drops (and counts, ``Emitter.dropped``) until
  the collector takes events again.

Debugging: ``collector.rejected_by_reason`` (``Listener.refused``); the
``interactive_shard.telemetry.channel`` logger warns at the first rejection of each
reason (what it was, the rank the message claims, the peer's address), then sums up
the rest at most every ``SUMMARY_INTERVAL_S``.
"""

from __future__ import annotations

import hmac
import ipaddress
import logging
import secrets
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import msgspec
import zmq
from zmq.utils.monitor import parse_monitor_message

from interactive_shard.telemetry import schema
from interactive_shard.telemetry._gc import paused
from interactive_shard.telemetry.emitter import Emitter
from interactive_shard.telemetry.schema import MAX_MESSAGE_BYTES, Batch

__all__ = ["Collector", "Emitter"]

log = logging.getLogger(__name__)

# Messages ZeroMQ queues per connected peer before it stops reading that peer: with
# MAX_MESSAGE_BYTES it bounds what one peer's queue may hold (64 MiB); ranks keep
# their own queue, so throughput does not need more.
RECV_QUEUE_MESSAGES = 16
SUMMARY_INTERVAL_S = 10.0  # at most one rejection summary line per this many seconds
CLOSE_TIMEOUT_S = 10.0  # how long close() waits for the thread to finish its message
_POLL_MS = 50  # how often the thread looks at the stop flag when idle
_DRAIN = 256  # messages read before the thread looks at the monitor and the stop flag
CONNECTION_DROPPED = "connection dropped (oversized frame, or the peer died)"
CONSUMER_FAILED = "consumer failed"


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _peer(frame: zmq.Frame | None) -> str:
    """`` from ADDRESS``: where ``frame`` came from, when ZeroMQ says."""
    if frame is None:
        return ""
    try:
        return f" from {frame.get('Peer-Address')}"
    except (zmq.ZMQError, AttributeError, TypeError):
        return ""


class Collector:
    """Kernel side: receives batches on a background thread and hands them on.

    ``on_batch`` runs on the collector thread; it must be quick and thread-safe
    (``RunStore.extend`` is). It may raise ``schema.MessageError`` to refuse a batch
    (counted under the error's reason). The thread owns the sockets from start to
    close; ``close()`` asks it to stop and waits.
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
                "ranks (interactive_shard.telemetry.rank.connect(address, token))."
            )
        self.token = token or secrets.token_hex(16)
        self._token = schema.token_field(self.token)
        self.rejected = 0  # messages refused, all reasons (see rejected_by_reason)
        self._by_reason: Counter[str] = Counter()
        self._on_batch = on_batch
        self._said_bye: set[int] = set()  # fds of peers that closed cleanly
        self._logged: set[str] = set()  # reasons whose first rejection was logged
        self._since_summary: Counter[str] = Counter()
        self._last_summary = time.monotonic()
        self._ctx = zmq.Context()
        self._sock = self._ctx.socket(zmq.PULL)
        try:
            self._sock.setsockopt(zmq.LINGER, 0)
            self._sock.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE_BYTES)
            self._sock.setsockopt(zmq.RCVHWM, RECV_QUEUE_MESSAGES)
            if port:
                self._sock.bind(f"tcp://{host}:{port}")
            else:
                port = self._sock.bind_to_random_port(f"tcp://{host}")
            self._monitor = self._sock.get_monitor_socket(zmq.EVENT_DISCONNECTED)
        except BaseException:
            self._sock.close(linger=0)
            self._ctx.term()
            raise
        self.address = f"tcp://{host}:{port}"
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="ish-collector", daemon=True)
        self._thread.start()

    # -- the collector thread: sole user of the sockets ---------------------------------
    def _loop(self) -> None:
        poller = zmq.Poller()
        poller.register(self._sock, zmq.POLLIN)
        poller.register(self._monitor, zmq.POLLIN)
        try:
            while not self._stop.is_set():
                try:
                    ready = dict(poller.poll(_POLL_MS))
                    if self._sock in ready:
                        self._drain()
                    if self._monitor in ready:
                        self._read_monitor()
                    self._summarize()
                except Exception:  # unreachable by design; never let the thread die
                    log.exception("telemetry collector: unexpected error; carrying on")
                    time.sleep(0.1)
        finally:
            self._release()

    def _drain(self) -> bool:
        """Read up to ``_DRAIN`` queued messages; True when more may be waiting."""
        for _ in range(_DRAIN):
            if self._stop.is_set():
                return False
            try:
                frame = self._sock.recv(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return False
            self._receive(frame.buffer, frame)
        return True

    def _receive(self, buf: Any, frame: zmq.Frame | None = None) -> None:
        """Handle one message; every failure is counted, none escapes."""
        try:
            batch = self._open(buf, frame)
        except schema.MessageError as exc:
            self._reject(exc.reason, str(exc), frame)
            return
        except msgspec.DecodeError as exc:  # ValidationError included
            self._reject(schema.MALFORMED, str(exc), frame)
            return
        except Exception as exc:  # RecursionError or any other surprise of the decoder
            self._reject(schema.MALFORMED, f"{type(exc).__name__}: {exc}", frame)
            return
        if batch is None:
            return
        try:
            self._on_batch(batch)
        except schema.MessageError as exc:
            self._reject(exc.reason, str(exc), frame)
        except Exception:  # a consumer bug must not kill the channel
            if not self._by_reason[CONSUMER_FAILED]:
                log.exception("telemetry consumer failed on a batch from rank %d", batch.rank)
            self._reject(CONSUMER_FAILED, "the consumer raised (logged above)", frame)

    def _open(self, buf: Any, frame: zmq.Frame | None) -> Batch | None:
        """Steps 2-3: authenticate, then decode; None for a BYE."""
        header = schema.read_header(buf)
        if not hmac.compare_digest(header.token, self._token):
            raise schema.MessageError(
                schema.WRONG_TOKEN,
                f"the token does not match (the message says rank {header.rank})",
            )
        if len(buf) > MAX_MESSAGE_BYTES:
            raise schema.MessageError(schema.OVERSIZED, f"{len(buf)} > {MAX_MESSAGE_BYTES} bytes")
        schema.check_header(header)
        if header.flags & schema.BYE:
            if frame is not None:
                self._said_bye.add(frame.get(zmq.SRCFD))
            return None
        with paused():  # Note [Pausing the collector's GC]: nested payloads, 6x faster
            events, scalars = schema.decode_body(header.flags, buf[schema.HEADER_SIZE :])
        final = bool(header.flags & schema.FINAL)
        return Batch(header.version, self.token, header.run, header.rank, events, final, scalars)

    def _read_monitor(self) -> None:
        while True:
            try:
                event = parse_monitor_message(self._monitor.recv_multipart(zmq.NOBLOCK))
            except zmq.Again:
                return
            if event["event"] != zmq.EVENT_DISCONNECTED:
                continue
            fd = event["value"]
            # Its BYE may still be queued behind the event, behind other peers' messages
            # (64 peers may hold RECV_QUEUE_MESSAGES each): read until it or the end.
            while fd not in self._said_bye and self._drain():
                pass
            if fd in self._said_bye:
                self._said_bye.discard(fd)
            else:
                self._reject(CONNECTION_DROPPED, f"a peer disconnected without BYE (fd {fd})")

    def _release(self) -> None:
        try:
            self._sock.disable_monitor()
        except zmq.ZMQError:
            pass
        self._monitor.close(linger=0)
        self._sock.close(linger=0)
        self._ctx.term()

    # -- counting and rate-limited logging ----------------------------------------------
    @property
    def rejected_by_reason(self) -> dict[str, int]:
        """How many messages were refused, by reason (``schema.WRONG_TOKEN``...)."""
        return dict(self._by_reason)

    def _reject(self, reason: str, detail: str, frame: zmq.Frame | None = None) -> None:
        """Count a refused message; log the first of each reason (a bounded few lines
        however many arrive: the reasons are the schema's)."""
        self.rejected += 1
        self._by_reason[reason] += 1
        if reason in self._logged:
            self._since_summary[reason] += 1
            return
        if not self._logged:
            self._last_summary = time.monotonic()
        self._logged.add(reason)
        log.warning(
            "telemetry: dropped a message (%s: %s)%s; further drops are counted in "
            "rejected_by_reason (Listener.refused) and summarised at most every %.0f s",
            reason,
            detail[:200],
            _peer(frame),
            SUMMARY_INTERVAL_S,
        )

    def _summarize(self) -> None:
        now = time.monotonic()
        if not self._since_summary or now - self._last_summary < SUMMARY_INTERVAL_S:
            return
        counts = ", ".join(f"{r}: {n}" for r, n in self._since_summary.most_common())
        log.warning(
            "telemetry: dropped %d more message(s) in %.0f s (%s); %d in all",
            sum(self._since_summary.values()),
            now - self._last_summary,
            counts,
            self.rejected,
        )
        self._since_summary.clear()
        self._last_summary = now

    def close(self, timeout: float = CLOSE_TIMEOUT_S) -> None:
        """Stop the thread; it closes the sockets itself. Safe to call twice."""
        self._stop.set()
        if threading.current_thread() is self._thread:
            return  # called from on_batch: the loop ends after this message
        self._thread.join(timeout)
        if self._thread.is_alive():
            log.warning(
                "telemetry collector still busy after %.0f s; it releases its port when "
                "its consumer returns",
                timeout,
            )
