"""Rank processes of one generation: start, watch, stop. No run logic here.

A supervisor thread waits on every rank's control pipe, stdout/stderr pipes and
process sentinel at once (``multiprocessing.connection.wait``), and hands what it
sees to callbacks. Starting and killing happen on the caller's thread (usually the
notebook's main thread; that thread matters, see Note [Rank isolation]); the
supervisor only kills what a rank that died left behind (its process group).
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from typing import Any

from interactive_shard.cluster import isolation
from interactive_shard.cluster.messages import Done, Failed, FromRank, Ready, Stop, ToRank
from interactive_shard.cluster.output import LineBuffer
from interactive_shard.cluster.worker import WorkerConfig, main

log = logging.getLogger(__name__)


@dataclass
class RankProc:
    rank: int
    process: Any  # multiprocessing.Process (its class depends on the start method)
    conn: Connection
    outputs: dict[str, Connection]  # stream name -> read end
    ready: bool = False
    # Each stream's unfinished line, bounded (Note [Bounded rank output] in output.py).
    partial: dict[str, LineBuffer] = field(
        default_factory=lambda: {"stdout": LineBuffer(), "stderr": LineBuffer()}
    )
    # Held while reaping or signalling: a reaped pid may be reused, so no signal may be
    # sent to it between the check and the kill.
    lock: threading.Lock = field(default_factory=threading.Lock)

    def kill_group(self, sig: int = signal.SIGKILL) -> None:
        """Signal the rank's process group (its children too) and, unreaped, the rank."""
        with self.lock:
            if not self.process.pid:
                return  # never started
            # A reaped rank's pid may name another process by now, but not while its
            # group has members: the kernel does not reuse an id that a group carries.
            running = self.process.exitcode is None
            isolation.kill_group(self.process.pid, sig, leader=running)

    def join(self, timeout: float) -> None:
        with self.lock:
            self.process.join(timeout=timeout)

    def is_alive(self) -> bool:
        with self.lock:
            return bool(self.process.is_alive())


def describe_exit(exitcode: int | None) -> str:
    if exitcode is None:
        return "is still running"
    if exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        return f"was killed by {name} (exit code {exitcode})"
    return f"exited with code {exitcode}"


class Generation:
    """One set of rank processes sharing a process group."""

    def __init__(
        self,
        configs: list[WorkerConfig],
        start_method: str,
        on_message: Callable[[int, FromRank], None],
        on_output: Callable[[int, str, str], None],
        on_exit: Callable[[int, int | None], None],
    ) -> None:
        self._on_message, self._on_output, self._on_exit = on_message, on_output, on_exit
        ctx: Any = mp.get_context(start_method)  # its Process class depends on the method
        self.ranks: list[RankProc] = []
        for cfg in configs:
            parent_conn, child_conn = ctx.Pipe()
            outs = {s: ctx.Pipe(duplex=False) for s in ("stdout", "stderr")}
            proc = ctx.Process(
                target=main,
                args=(cfg, child_conn, outs["stdout"][1], outs["stderr"][1]),
                name=f"ish-rank{cfg.rank}",
                daemon=True,
            )
            proc.start()
            for end in (child_conn, outs["stdout"][1], outs["stderr"][1]):
                end.close()  # the child holds these now; EOF reaches us when it dies
            for read_end, _ in outs.values():
                # A pipe found readable may have been drained since: never block on it.
                os.set_blocking(read_end.fileno(), False)
            self.ranks.append(
                RankProc(cfg.rank, proc, parent_conn, {s: p[0] for s, p in outs.items()})
            )
        self.stopping = False
        self._stopped = False
        self._halt = threading.Event()  # the supervisor thread ends
        self._thread = threading.Thread(target=self._supervise, name="ish-supervisor", daemon=True)
        self._thread.start()

    # -- supervisor thread ----------------------------------------------------------------
    def _supervise(self) -> None:
        watched: dict[Any, tuple[RankProc, str]] = {}  # connection or sentinel -> its rank
        for r in self.ranks:
            watched[r.conn] = (r, "control")
            for stream, conn in r.outputs.items():
                watched[conn] = (r, stream)
            watched[r.process.sentinel] = (r, "exit")
        while watched and not self._halt.is_set():
            ready: list[Any] = wait(list(watched), timeout=0.2)
            for obj in ready:
                if obj not in watched:
                    continue  # drained with its rank's death
                try:
                    self._handle(obj, watched)
                except BaseException:  # anything a rank sends: the thread must live on
                    log.exception("supervisor: handling rank output failed; carrying on")

    def _handle(self, obj: Any, watched: dict[Any, tuple[RankProc, str]]) -> None:
        rank, what = watched[obj]
        if what == "control":
            self._read_control(rank, obj, watched)
        elif what == "exit":
            # Its children go with it (before the reap: the pid is still ours).
            rank.kill_group()
            # Drain output first so the last stderr lines explain the death.
            del watched[obj]
            self._drain(rank, watched)
            rank.join(timeout=1)
            if not self.stopping:  # a rank we stop is no news
                self._on_exit(rank.rank, rank.process.exitcode)
        else:
            self._read_output(rank, what, obj, watched)

    def _read_control(
        self, rank: RankProc, conn: Connection, watched: dict[Any, tuple[RankProc, str]]
    ) -> None:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            del watched[conn]
            return
        except BaseException:  # a message that does not unpickle (framing is intact)
            log.exception("rank %d sent an unreadable control message; ignored", rank.rank)
            return
        if isinstance(msg, Ready):
            rank.ready = True
        elif not isinstance(msg, Done | Failed):
            log.warning("rank %d sent %r on its control pipe; ignored", rank.rank, type(msg))
            return
        else:  # the rank flushed before replying: its run's output is in the pipes now
            self._drain_output(rank, watched)
            for stream, lines in rank.partial.items():  # a last line without its newline
                for line in lines.close():
                    self._on_output(rank.rank, stream, line)
        self._on_message(rank.rank, msg)

    def _read_output(
        self,
        rank: RankProc,
        stream: str,
        conn: Connection,
        watched: dict[Any, tuple[RankProc, str]],
    ) -> None:
        try:
            data = os.read(conn.fileno(), 65536)
        except BlockingIOError:
            return  # drained already (see _drain_output)
        except OSError:
            data = b""
        if not data:
            del watched[conn]
            lines = rank.partial[stream].close()
        else:
            lines = rank.partial[stream].feed(data)
        for line in lines:
            self._on_output(rank.rank, stream, line)

    def _drain_output(
        self, rank: RankProc, watched: dict[Any, tuple[RankProc, str]], max_reads: int = 64
    ) -> None:
        for stream, conn in rank.outputs.items():
            for _ in range(max_reads):  # bounded: a thread of the rank may print on
                if conn not in watched or not conn.poll(0):
                    break
                self._read_output(rank, stream, conn, watched)

    def _drain(self, rank: RankProc, watched: dict[Any, tuple[RankProc, str]]) -> None:
        for stream, conn in rank.outputs.items():
            while conn in watched and conn.poll(0):
                self._read_output(rank, stream, conn, watched)
        while rank.conn in watched and rank.conn.poll(0):
            self._read_control(rank, rank.conn, watched)

    # -- called from the owner's thread ---------------------------------------------------
    def send(self, rank: int, msg: ToRank) -> None:
        self.ranks[rank].conn.send(msg)

    def signal(self, ranks: list[int], sig: int) -> None:
        """Send ``sig`` to ranks; SIGKILL takes each rank's process group with it."""
        for r in ranks:
            rank = self.ranks[r]
            if sig == signal.SIGKILL:
                rank.kill_group()
                continue
            with rank.lock:
                if rank.process.is_alive() and rank.process.pid:
                    try:
                        os.kill(rank.process.pid, sig)
                    except ProcessLookupError:
                        pass

    def stop(self, *, graceful: bool, grace_s: float = 3.0) -> None:
        """Ask ranks to leave (graceful) or kill them; kill what they leave; reap all.

        Safe to interrupt: an interrupt while the ranks leave kills them at once, and
        the interrupt is raised once all is released. Safe to call again: a stop that
        was cut short is finished.
        """
        self.stopping = True  # deaths from here on are ours: not reported
        if self._stopped:
            return
        interrupted = False
        if graceful:
            try:
                self._leave(grace_s)
            except KeyboardInterrupt:
                interrupted = True
        for r in self.ranks:
            r.kill_group()  # ranks still running, and whatever the ranks started
        for r in self.ranks:
            r.join(timeout=5)
        self._halt.set()
        self._thread.join(timeout=2)
        for r in self.ranks:
            for conn in (r.conn, *r.outputs.values()):
                conn.close()
        self._stopped = True
        for r in self.ranks:
            try:
                r.process.close()  # its sentinel's fd
            except ValueError:  # still running after the kill (a rank in the kernel's D state)
                log.warning("rank %d outlived SIGKILL by 5 s; left to the OS", r.rank)
        if interrupted:
            raise KeyboardInterrupt

    def _leave(self, grace_s: float) -> None:
        for r in self.ranks:
            try:
                r.conn.send(Stop())
            except (OSError, ValueError):
                pass
        # Wait on the sentinels, not join(): an unreaped rank keeps its pid, so its group
        # can be killed after this without racing pid reuse.
        pending = [r.process.sentinel for r in self.ranks]
        deadline = time.monotonic() + grace_s
        while pending and (left := deadline - time.monotonic()) > 0:
            # Short waits: an interrupt delivered to another thread is only seen between
            # them (the main thread sleeps in select until then).
            for done in wait(pending, timeout=min(left, 0.1)):
                pending.remove(done)
