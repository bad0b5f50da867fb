"""Rank side of the channel (see ``channel`` for the wire format and its bounds).

The Emitter must never stop training: a payload that cannot leave the rank is refused
at ``emit`` (``PayloadError``, before it is buffered), a batch too large for one
message is split, an event that still cannot be sent is dropped and counted, and a
send to a collector that takes nothing waits at most ``SEND_TIMEOUT_S`` once, then
drops (counted in ``Emitter.dropped``) until the collector takes events again.
"""

from __future__ import annotations

import logging
import operator
import os
import socket
import struct
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

import msgspec
import zmq

from interactive_shard.telemetry import schema
from interactive_shard.telemetry.meter import Meter, restart_all, thread_clock
from interactive_shard.telemetry.run_events import RankInfo, payload
from interactive_shard.telemetry.schema import (
    MAX_MESSAGE_BYTES,
    MAX_STEP,
    MIN_STEP,
    SCALAR,
    SCHEMA_VERSION,
    check_payload,
)

log = logging.getLogger(__name__)

SEND_TIMEOUT_S = 5.0  # longest a rank waits for a collector that takes nothing
CLOSE_LINGER_S = 5.0  # at close, how long queued events may take to leave
SEND_QUEUE_BATCHES = 1000  # batches ZeroMQ queues on the rank before a send waits
_monotonic = time.monotonic  # emit is a hot path: one lookup less
_PLAIN = schema._PLAIN_TYPES
# What the buffer holds: (kind, rank, step, t, payload), encoded as an Event, or a
# scalar's (name, value, step, t) (Note [Columnar scalars] in schema).
_Buffered = tuple[Any, ...]

# Bound methods run by every explicit Emitter.flush() (ctx.flush(), a run's end, close;
# not the timed flushes) before it sends, held weakly: a probe that batches its records
# (the precision probe) emits what it holds, so a flush delivers everything seen so far.
_FLUSH_HOOKS: dict[int, weakref.WeakMethod[Callable[[], None]]] = {}  # id(ref) -> ref


def before_flush(method: Callable[[], None]) -> Callable[[], None]:
    """Run the bound ``method`` at every ``Emitter.flush()`` (weakly held: its object may
    be collected); returns the callable that unregisters it."""
    ref = weakref.WeakMethod(method, _forget)
    _FLUSH_HOOKS[id(ref)] = ref
    return lambda: _forget(ref)


def _forget(ref: weakref.ref[Any]) -> None:
    _FLUSH_HOOKS.pop(id(ref), None)  # dict operations are atomic: no lock (GC calls this)


def _run_flush_hooks() -> None:
    for ref in list(_FLUSH_HOOKS.values()):
        method = ref()
        if method is None:
            continue
        try:
            method()
        except Exception:  # a probe bug must not lose the events already buffered
            log.exception("a flush hook failed: %r", method)


# Note [Lock-free emit]
# ~~~~~~~~~~~~~~~~~~~~~
# ``emit`` runs for every event, from any thread (autograd hooks run on others), and a
# lock around its append cost more than the rest of it. So the buffer is one list for
# the emitter's life: ``emit`` appends to it without a lock (``list.append`` is atomic,
# with or without the GIL: CPython locks the list itself when there is none), and only
# sending holds the lock. A send takes the first ``n`` events by slicing and deletes
# them (two atomic list operations): an append between the two lands after index
# ``n`` and stays for the next send. Swapping in a fresh list instead would lose an
# event whose thread read the old list just before the swap and appended just after.


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
        send_timeout: float | None = None,  # None: SEND_TIMEOUT_S
    ) -> None:
        if type(rank) is not int or not 0 <= rank < schema.MAX_WORLD_SIZE:
            top = schema.MAX_WORLD_SIZE - 1
            raise ValueError(f"rank must be an int in 0..{top}, got {rank!r}.")
        self.rank = rank
        self.run = 0
        self._step = 0
        self.dropped = 0  # events that never left: see the module docstring
        self.taken = 0  # events of the current run taken from the buffer to send (or drop)
        self.sending = Meter(steady=True)  # the background flushes' time (Overhead "sending")
        self._max_batch = max_batch
        self._buffer: list[_Buffered] = []
        self._lock = threading.Lock()
        self._stalled = False  # the last send timed out: try without waiting
        self._warned: set[str] = set()
        self._closed = False
        self._interval = flush_interval
        self._open(address, token, SEND_TIMEOUT_S if send_timeout is None else send_timeout)
        self._where = rank_info()
        self._thread = threading.Thread(target=self._flush_loop, name="ish-emitter", daemon=True)
        self._thread.start()

    def _open(self, address: str, token: str, send_timeout: float) -> None:
        """Open the transport (a ZeroMQ PUSH socket to ``address``)."""
        self._token = schema.token_field(token)
        self._encoder = msgspec.msgpack.Encoder()
        self._address = address
        self._ctx = zmq.Context()
        self._sock = self._ctx.socket(zmq.PUSH)
        self._sock.setsockopt(zmq.SNDHWM, SEND_QUEUE_BATCHES)
        self._sock.setsockopt(zmq.SNDTIMEO, max(1, int(send_timeout * 1000)))
        self._sock.connect(address)
        self._send_timeout = send_timeout

    def announce(self) -> None:
        """Say where this rank runs (``RankInfo``): first in each run (``start_run``), and
        once connected (``rank.connect``, ``rank.record``)."""
        self.emit(RankInfo.KIND, {**self._where, "wall": time.time()})

    def emit_fields(self, kind: str, /, **payload: Any) -> None:
        """``emit(kind, payload)`` with the payload's fields as keywords: ``ctx.emit``.

        Its scalar case is ``emit``'s, written out again: a call more would cost a
        tenth of the event (Python calls are most of it).
        """
        if kind == SCALAR and len(payload) == 2:
            value, name = payload.get("value"), payload.get("name")
            if type(value) is float and type(name) is str:
                buffer = self._buffer
                buffer.append((name, value, self._step, _monotonic()))  # atomic: no lock
                if len(buffer) >= self._max_batch:
                    self._send_full()
                return
        self.emit(kind, payload)

    def emit(self, kind: str, payload: dict[str, Any], step: int | None = None) -> None:
        if kind == SCALAR and step is None and len(payload) == 2:
            value, name = payload.get("value"), payload.get("name")
            if type(value) is float and type(name) is str:
                # The common scalar, buffered as 4 fields (Note [Columnar scalars]).
                buffer = self._buffer
                buffer.append((name, value, self._step, _monotonic()))  # atomic: no lock
                if len(buffer) >= self._max_batch:
                    self._send_full()
                return
        # check_payload's common case (scalars under str keys) inline: for the few fields
        # of an event a loop costs less than C-level set tests (0.3 against 0.7 us);
        # anything else (a container, a wrong type) goes through the full check, which
        # names it.
        for key, value in payload.items():
            if type(value) not in _PLAIN or type(key) is not str:
                check_payload(kind, payload)
                break
        if step is None:
            step = self._step  # checked when set
        elif type(step) is not int or not MIN_STEP <= step <= MAX_STEP:
            step = _checked_step(kind, step)
        if type(kind) is not str and not isinstance(kind, str):
            raise schema.PayloadError(f"emit(kind={kind!r}): kind must be a str.")
        # A tuple, not an Event: msgpack encodes both as the same array (Event is
        # array_like), and a tuple is a third cheaper to make on this hot path.
        buffer = self._buffer
        buffer.append((kind, self.rank, step, _monotonic(), payload))  # atomic: no lock
        if len(buffer) >= self._max_batch:
            self._send_full()

    def _send_full(self) -> None:
        with self._lock:
            if len(self._buffer) >= self._max_batch:  # not sent by another thread meanwhile
                self._send_locked(final=False)

    @property
    def step(self) -> int:
        """The step events are tagged with when ``emit`` is given none."""
        return self._step

    @step.setter
    def step(self, value: int) -> None:
        self._step = _checked_step("", value)

    def start_run(self, run: int) -> None:
        """Tag what follows with ``run`` (earlier events go out under the old id)."""
        with self._lock:
            self._send_locked(final=False)
            self.run = run
            self._step = 0
            self.taken = 0
            self.sending.restart()  # each run states its own cost (telemetry/meter.py)
            restart_all()
        self.announce()

    def flush(self, *, final: bool = False) -> None:
        _run_flush_hooks()  # outside the lock: the hooks emit
        with self._lock:
            self._say_sending(now=True)
            self._send_locked(final=final)

    def _say_sending(self, *, now: bool = False) -> None:
        """What the background flushes cost so far (``Overhead`` ``"sending"``), at every
        explicit flush, else at most once a second. Into the buffer, the lock held: a
        run's final flush cannot come between (it would go out after the stream ended)."""
        if now or self.sending.due():
            event = self.sending.overhead("sending")
            if event is not None:
                said = (event.KIND, self.rank, self._step, _monotonic(), payload(event))
                self._buffer.append(said)

    def _send_locked(self, *, final: bool) -> None:
        if self._closed:  # emitted after close(): nowhere to go
            n = len(self._buffer)
            del self._buffer[:n]
            self.dropped += n
            return
        buffer = self._buffer
        if not buffer and not final:
            return
        # Emits append without the lock (Note [Lock-free emit]): take what is there now
        # from the one buffer list; what threads append meanwhile stays for next time.
        n = len(buffer)
        events = buffer[:n]
        del buffer[:n]
        self.taken += n  # the kernel compares it with what arrived (Note [Run outcome])
        self._send_events(events, schema.FINAL if final else 0)

    def _send_events(self, events: list[_Buffered], flags: int) -> None:
        """Send ``events`` in as few messages as fit; drop (and count) what cannot go."""
        try:
            body, columns = schema.pack_body(self.rank, events)
            args = (SCHEMA_VERSION, self._token, self.run, self.rank, body, flags | columns)
            data = schema.encode_message(self._encoder, *args)
        except (TypeError, ValueError, OverflowError, struct.error) as exc:  # an int > 64 bits
            why = f"cannot be encoded ({exc})"
        else:
            if len(data) <= MAX_MESSAGE_BYTES:
                self._send_frame(data, len(events))
                return
            why = f"takes {len(data):,} bytes, more than MAX_MESSAGE_BYTES ({MAX_MESSAGE_BYTES:,})"
        if len(events) > 1:  # halve until each part fits (or is one bad event)
            half = len(events) // 2
            self._send_events(events[:half], 0)
            self._send_events(events[half:], flags)
            return
        kind = events[0][0] if len(events[0]) == 5 else SCALAR
        self._drop(len(events), "unsendable", f"a {kind!r} event {why}")
        if flags:
            self._send_events([], flags)  # the stream still closes

    def _send_frame(self, data: bytearray, n_events: int) -> None:
        try:
            self._sock.send(data, zmq.NOBLOCK if self._stalled else 0, copy=False)
        except zmq.ZMQError as exc:  # zmq.Again: the queue stayed full for send_timeout
            self._stalled = True
            why = "the collector took nothing" if isinstance(exc, zmq.Again) else str(exc)
            self._drop(n_events, "stalled", f"{why} for {self._send_timeout:.0f} s")
            return
        if self._stalled:
            self._stalled = False
            self._warned.discard("stalled")
            log.warning("telemetry: rank %d: collector takes events again", self.rank)

    def _drop(self, n_events: int, key: str, why: str) -> None:
        self.dropped += n_events
        if key not in self._warned:  # once per kind of trouble (per stall)
            self._warned.add(key)
            log.warning(
                "telemetry: rank %d dropped events for %s: %s; %d dropped so far "
                "(Emitter.dropped), training goes on",
                self.rank,
                self._address,
                why,
                self.dropped,
            )

    def _flush_loop(self) -> None:
        while not self._closed:
            time.sleep(self._interval)
            if self._buffer:
                try:
                    with self._lock:  # not flush(): its hooks are for explicit ones
                        began = thread_clock()  # CPU time: not its waits for the GIL
                        self._send_locked(final=False)
                        self.sending.add(thread_clock() - began)
                        self._say_sending()
                except Exception:  # never let the flusher die; emit would block later
                    log.exception("telemetry: rank %d: flushing events failed", self.rank)

    def close(self) -> None:
        """Send what is buffered and a BYE, then disconnect (at most ``CLOSE_LINGER_S``)."""
        with self._lock:
            if self._closed:
                return
            self._send_locked(final=False)
            self._closed = True
            self._close_transport()
        self._after_close()

    def _close_transport(self) -> None:
        """Say goodbye and close the socket (the lock held, the buffer sent)."""
        if not self._stalled:
            bye = schema.encode_message(
                self._encoder, SCHEMA_VERSION, self._token, self.run, self.rank, [], schema.BYE
            )
            try:
                self._sock.send(bye, zmq.NOBLOCK)
            except zmq.ZMQError:
                pass  # nobody to say goodbye to
        self._sock.close(linger=0 if self._stalled else int(CLOSE_LINGER_S * 1000))

    def _after_close(self) -> None:
        self._ctx.term()  # outside the lock: it waits for the queued batches to leave


def rank_info() -> dict[str, Any]:
    """Where this process runs: ``RankInfo``'s fields but ``wall`` (torchrun's variables
    name its node and local rank; a Cluster's ranks are node 0)."""
    return {
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "node": _env_int("GROUP_RANK"),
        "local_rank": _env_int("LOCAL_RANK"),
    }


def _env_int(name: str) -> int:
    value = os.environ.get(name, "")
    return int(value) if value.isdigit() else 0


def _checked_step(kind: Any, step: Any) -> int:
    """A step as the schema holds it (a 64-bit int), or a clear error."""
    if not isinstance(step, bool):
        try:
            value = int(operator.index(step))  # a numpy integer, an IntEnum
        except TypeError:
            pass
        else:
            if MIN_STEP <= value <= MAX_STEP:
                return value
    where = f"emit({kind!r}): step" if kind else "Emitter.step"
    raise schema.PayloadError(
        f"{where} must be a 64-bit int, got {type(step).__qualname__} {step!r}; pass int(step)."
    )
