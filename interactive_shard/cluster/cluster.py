"""Cluster: persistent rank processes with a process group, driven from a notebook.

Note [Cluster lifecycle]
------------------------
Background: a notebook wants ranks that outlive one cell (build a model, then step
it), report errors fast, and never leave processes behind.

Algorithm:
1. The kernel makes a private rendezvous directory (mode 0700, removed at close) and
   a telemetry ``Collector`` on loopback. Each generation of ranks meets through a
   fresh ``FileStore`` file there: no listening socket, nothing another user of the
   machine can open (see Note [Rank isolation] in isolation.py).
2. Ranks start (fork where safe, else spawn), each in a process group of its own
   that dies with the kernel, drop every socket inherited from the kernel, join the
   process group (gloo on loopback), say "ready". Stopping a rank, or seeing it die,
   kills its whole group: the rank's own children go with it.
3. ``run(fn)`` sends ``RunCall(run_id, cloudpickle((fn, args, kwargs)))`` to every
   rank (``messages.py``); each replies ``Done`` with its pickled result or
   ``Failed`` with its traceback. A supervisor thread turns replies, output lines
   and process deaths into reports to the run's ``Outcome``.
4. ``Outcome`` (Note [Run outcome] in outcome.py) decides when the run is over: when
   one rank fails the others get ``FAILURE_GRACE_S`` to report. Ranks still running
   then are stuck (typically in a collective with the failed rank): the cluster
   kills them and restarts all ranks (``restart_on_failure``), or marks itself broken
   so the next ``run`` asks for ``restart()``.
5. ``close()`` and ``restart()`` end a run still in progress (``Run.abandon``): its
   ranks that had not replied fail with "ended by cluster.close()". Both hold the
   generation until it is stopped, so an interrupted one is finished by the next call.
   A run that destroyed the process group (``Done.group_lost``) restarts the ranks
   before the next run.

Caveats: ``ctx.state`` lives in the rank processes, so a restart empties it. A rank
stuck in C++ code ignores interrupts; it is killed after a grace period.
"""

from __future__ import annotations

import itertools
import logging
import os
import pickle
import signal
import threading
import time
import warnings
import weakref
from typing import Any

from interactive_shard import features
from interactive_shard.cluster import isolation, options, stacks
from interactive_shard.cluster._support import Resources, pickle_call, preimport_for_fork, weak
from interactive_shard.cluster.errors import RankError
from interactive_shard.cluster.isolation import Rendezvous
from interactive_shard.cluster.messages import STARTUP, Done, Failed, FromRank, Ready, RunCall
from interactive_shard.cluster.outcome import Reply
from interactive_shard.cluster.output import (
    CLUSTER_LOG_CHARS,
    CLUSTER_LOG_LINES,
    LineRing,
    cut_lines,
)
from interactive_shard.cluster.procs import Generation, describe_exit
from interactive_shard.cluster.run import Run
from interactive_shard.cluster.worker import WorkerConfig
from interactive_shard.probing.compat import device as compat_device
from interactive_shard.telemetry import schema
from interactive_shard.telemetry.channel import Collector
from interactive_shard.telemetry.rank_state import RankState
from interactive_shard.telemetry.schema import Batch
from interactive_shard.telemetry.store import RunInfo, RunStore
from interactive_shard.ui import live

log = logging.getLogger(__name__)

INTERRUPT_GRACE_S = 3.0
_run_ids = itertools.count(1)


class ClusterClosedError(RuntimeError):
    """Raised by ``run`` and ``restart`` on a Cluster that was closed: create a new one."""


class Cluster(live.ShowsView):
    """``nprocs`` rank processes with an initialised process group.

    >>> with Cluster(nprocs=2) as cluster:          # doctest: +SKIP
    ...     run = cluster.run(lambda ctx: ctx.rank)
    ...     run.results
    [0, 1]
    """

    def __init__(
        self,
        nprocs: int = 2,
        *,
        backend: str = "auto",
        device: str = "auto",
        start_method: str = "auto",
        timeout: float = 60.0,
        threads: int | None = None,
        restart_on_failure: bool = True,
        echo: bool = True,
        telemetry_host: str = "127.0.0.1",
        telemetry_port: int = 0,
        telemetry_token: str | None = None,
    ) -> None:
        import torch
        import torch.distributed  # imported here, so that forked ranks inherit it

        if not isinstance(timeout, (int, float)) or timeout <= 0:
            raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}.")
        self.placement = options.resolve(
            nprocs,
            backend,
            device,
            start_method,
            threads,
            cuda_count=torch.cuda.device_count(),  # NVML where it can: no cuInit here
            cuda_initialized=torch.cuda.is_initialized(),  # type: ignore[no-untyped-call]
            fork_safe=compat_device.autograd_survives_fork,
        )
        if self.placement.start_method == "fork":
            preimport_for_fork()
        self.nprocs = nprocs
        self.timeout = float(timeout)
        self.restart_on_failure = restart_on_failure
        self.echo = echo
        # Each rank's latest lines over all runs (Note [Bounded rank output], output.py).
        self._logs = [LineRing(CLUSTER_LOG_LINES, CLUSTER_LOG_CHARS) for _ in range(nprocs)]
        self._group_lost = False  # a run destroyed the process group: restart before the next
        self._lock = threading.Lock()
        self._rank_states = [RankState.STARTING] * nprocs
        self._exit_notes: dict[int, str] = {}
        self._startup_errors: dict[int, str] = {}
        self._runs: weakref.WeakValueDictionary[int, Run] = weakref.WeakValueDictionary()
        self._current: Run | None = None
        self._latest: Run | None = None
        self._generation_no = 0
        self._closed = False
        collector = Collector(
            weak(self._on_batch), host=telemetry_host, port=telemetry_port, token=telemetry_token
        )
        # Everything that must be released, held apart from self so that garbage
        # collection of the Cluster can run the finalizer (no orphan ranks).
        self._res = Resources(collector, Rendezvous())
        self._finalizer = weakref.finalize(self, self._res.close)
        try:
            self._start()
        except BaseException:
            self.close()
            raise

    # -- public ---------------------------------------------------------------------------
    @property
    def backend(self) -> str:
        return self.placement.backend

    @property
    def devices(self) -> tuple[str, ...]:
        return self.placement.devices

    @property
    def rank_states(self) -> list[RankState]:
        return list(self._rank_states)

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def latest_run(self) -> Run | None:
        return self._latest

    @property
    def logs(self) -> list[list[str]]:
        """Each rank's latest output lines, over all runs (at most ``CLUSTER_LOG_LINES``
        per rank; ``logs_dropped`` counts the older ones)."""
        with self._lock:
            return [ring.lines() for ring in self._logs]

    @property
    def logs_dropped(self) -> list[int]:
        """Per rank, how many older lines ``logs`` no longer holds."""
        with self._lock:
            return [ring.dropped for ring in self._logs]

    @property
    def telemetry(self) -> tuple[str, str]:
        """(address, token) for ranks started elsewhere (``ish.telemetry.rank.connect``)."""
        return self._collector.address, self._collector.token

    def run(self, fn: Any, *args: Any, wait: bool = True, **kwargs: Any) -> Run:
        """Run ``fn(ctx, *args, **kwargs)`` on every rank; return the ``Run``.

        ``wait=True`` blocks until all ranks finished (views stay live) and raises
        ``RankError`` if any failed; ``wait=False`` returns at once: call
        ``run.wait()`` later.
        """
        self._ready_for_run()
        if not callable(fn):
            raise TypeError(f"cluster.run needs a function fn(ctx, ...), got {fn!r}.")
        call = pickle_call(fn, args, kwargs)
        run_id = next(_run_ids)
        import torch

        from interactive_shard import __version__

        info = RunInfo(
            world_size=self.nprocs,
            backend=self.backend,
            device_types=self.placement.device_types,
            package_version=__version__,
            torch_version=str(torch.__version__),
            name=getattr(fn, "__qualname__", repr(fn)),
        )
        run = Run(RunStore(info), driver=self, run_id=run_id)
        with self._lock:
            self._runs[run_id] = run
            self._current = self._latest = run
            self._rank_states = [RankState.RUNNING] * self.nprocs
        for rank in range(self.nprocs):
            run.record_state(rank, RankState.RUNNING)
        assert self._gen is not None
        for rank in range(self.nprocs):
            self._gen.send(rank, RunCall(run_id, call))
        if wait:
            return run.wait()
        live.keep_polling(lambda: self.advance(run))
        return run

    def restart(self) -> None:
        """Kill the ranks and start fresh ones (``ctx.state`` is emptied). A run still
        in progress ends with a ``RankError`` saying so."""
        self._check_open()
        try:
            self._stop_generation(graceful=False)
        finally:
            self._end_current("cluster.restart()")
        self._start()

    def close(self) -> None:
        """Stop every rank and release ports. A run still in progress gets the ranks'
        grace period to finish, then ends with a ``RankError`` saying so.

        Safe to call twice, and to interrupt: an interrupt while the ranks leave kills
        them at once; a second ``close()`` finishes what an interrupted one left.
        """
        self._closed = True
        try:
            self._stop_generation(graceful=True)
        finally:
            self._res.close()  # idempotent: a second close finishes an interrupted one
            self._finalizer.detach()
            self._end_current("cluster.close()")  # interrupted too: nothing will reply

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- display: the run monitor (monitor/view.py MonitorSource) -------------------------
    def _view(self) -> Any:
        return features.feature("monitor").view_of(self)

    def live_rank_states(self) -> list[RankState]:
        return self.rank_states

    def describe(self) -> str:
        devices = ", ".join(sorted(set(self.devices)))
        closed = " · closed" if self._closed else ""
        return (
            f"Cluster · {self.nprocs} ranks · {self.backend} on {devices}"
            f" · {self.placement.start_method}{closed}"
        )

    def __repr__(self) -> str:
        states = ", ".join(s.value for s in self._rank_states)
        status = "closed" if self._closed else states
        return (
            f"Cluster(nprocs={self.nprocs}, backend={self.backend!r}, "
            f"devices={list(self.devices)}, start_method={self.placement.start_method!r}, "
            f"ranks=[{status}])"
        )

    # -- lifecycle --------------------------------------------------------------------------
    @property
    def _gen(self) -> Generation | None:
        return self._res.gen

    @property
    def _collector(self) -> Collector:
        return self._res.collector

    def _start(self) -> None:
        self._generation_no += 1
        self._group_lost = False
        self._exit_notes.clear()
        self._startup_errors.clear()
        self._rank_states = [RankState.STARTING] * self.nprocs
        address, token = self._collector.address, self._collector.token
        forkserver = self.placement.start_method == "forkserver"  # the ranks' parent
        pdeathsig = isolation.pdeathsig_is_safe(self.placement.start_method)
        configs = [
            WorkerConfig(
                rank=r,
                world_size=self.nprocs,
                device=self.devices[r],
                backend=self.backend,
                threads=self.placement.threads,
                store_file=self._res.rendezvous.store_file(self._generation_no),
                timeout=self.timeout,
                telemetry_address=address,
                telemetry_token=token,
                parent_pid=0 if forkserver else os.getpid(),
                pdeathsig=pdeathsig,
            )
            for r in range(self.nprocs)
        ]
        self._res.gen = gen = Generation(
            configs,
            self.placement.start_method,
            weak(self._on_message),
            weak(self._on_output),
            weak(self._on_exit),
        )
        deadline = time.monotonic() + self.timeout + 30  # spawn imports torch first
        while not all(r.ready for r in gen.ranks):
            failed = self._startup_errors or self._exit_notes
            if failed or time.monotonic() > deadline:
                tracebacks = {**self._exit_notes, **self._startup_errors}
                if not tracebacks:
                    pending = [r.rank for r in gen.ranks if not r.ready]
                    tracebacks = {r: f"rank {r} did not start within the timeout" for r in pending}
                self._stop_generation(graceful=False)
                raise RankError(tracebacks, note="could not start the cluster")
            time.sleep(0.005)
        self._rank_states = [RankState.IDLE] * self.nprocs

    def _stop_generation(self, *, graceful: bool) -> None:
        gen = self._res.gen
        if gen is not None:
            gen.stop(graceful=graceful)  # held until stopped: an interrupted stop is redone
            self._res.gen = None

    def _end_current(self, why: str) -> None:
        """End the run in progress, if any, once its ranks are gone."""
        with self._lock:
            run, self._current = self._current, None
        if run is not None and not run.done:
            run.abandon(why)

    def _check_open(self) -> None:
        if self._closed:
            raise ClusterClosedError("this Cluster is closed; create a new one.")

    def _ready_for_run(self) -> None:
        self._check_open()
        if self._current is not None and not self.advance(self._current):
            raise RuntimeError(
                f"run {self._current.run_id} is still in progress on this cluster; call "
                "run.wait() (or interrupt it) before starting another."
            )
        if RankState.FAILED in self._rank_states or self._group_lost:
            notes = [n.splitlines()[0] for n in self._exit_notes.values()]
            if self._group_lost:
                notes.append("the last run destroyed the process group")
            why = "; ".join(notes) or "the process group failed in the last run"
            if not self.restart_on_failure:
                raise RuntimeError(
                    f"the cluster's ranks are down ({why}); call cluster.restart() first."
                )
            warnings.warn(
                f"restarting the cluster's ranks ({why}); ctx.state is empty now.",
                RuntimeWarning,
                stacklevel=3,
            )
            self.restart()

    # -- callbacks from the supervisor / collector threads ---------------------------------
    def _on_message(self, rank: int, msg: FromRank) -> None:
        if isinstance(msg, Ready):
            return
        if isinstance(msg, Failed) and msg.run_id == STARTUP:
            with self._lock:
                self._startup_errors[rank] = msg.traceback
            return
        run = self._runs.get(msg.run_id)
        if run is None:
            return
        if isinstance(msg, Done):
            if msg.group_lost:
                self._group_lost = True
            try:
                result = pickle.loads(msg.result)
            except BaseException as exc:  # SystemExit too: the supervisor must live on
                why = cut_lines(f"[rank {rank}] result could not be unpickled: {exc!r}")
                run.record_reply(rank, Reply.ERROR, why, sent=msg.sent)
            else:
                run.record_reply(rank, Reply.DONE, result, sent=msg.sent)
        else:
            kind = Reply.BROKEN if msg.broken else Reply.ERROR
            run.record_reply(rank, kind, cut_lines(msg.traceback), sent=msg.sent)

    def _on_output(self, rank: int, stream: str, line: str) -> None:
        with self._lock:
            self._logs[rank].add(line)
            run = self._current or self._latest
        if run is not None:
            run.add_output(rank, stream, line)

    def _on_exit(self, rank: int, exitcode: int | None) -> None:
        if self._closed:
            return  # we stopped it
        with self._lock:
            tail = "\n".join(self._logs[rank].lines()[-15:])
            note = f"rank {rank} {describe_exit(exitcode)}"
            self._exit_notes[rank] = f"{note}\nlast output:\n{tail}" if tail else note
            self._rank_states[rank] = RankState.FAILED
            run = self._current
        if run is not None:
            run.record_reply(rank, Reply.DIED, self._exit_notes[rank])

    def _on_batch(self, batch: Batch) -> None:
        schema.check_batch(batch, self.nprocs)  # raises: the collector counts and drops it
        run = self._runs.get(batch.run)
        if run is None:
            return
        run.store.extend(batch.events, rank=batch.rank, scalars=batch.scalars)  # all its rank's
        run.outcome.received(batch.rank, batch.size)
        if batch.final:
            run.outcome.stream_closed(batch.rank)

    # -- driving a run (run.py RunDriver): decide, fail, interrupt --------------------------
    def advance(self, run: Run) -> bool:
        """Non-blocking: conclude ``run`` if its outcome is decided. True when finished."""
        if run.done:
            return True
        decided = run.outcome.decided()
        if self.echo:
            run.echo()
        if decided:
            self._finish(run)
        return decided

    def _finish(self, run: Run) -> None:
        verdict = run.outcome.verdict()
        note = ""
        if verdict.restart and verdict.failed:
            if self.restart_on_failure:
                note = "the cluster restarted its ranks; ctx.state is empty"
            else:
                note = "the cluster's ranks are down: call cluster.restart()"
        stuck_stacks: dict[int, str] = {}
        if verdict.stuck and self._gen is not None:
            stuck_stacks = self._stacks_of(verdict.stuck)
            self._gen.signal(verdict.stuck, signal.SIGKILL)
        run.conclude(verdict, note, stuck_stacks)
        with self._lock:
            self._current = None
            fresh = RankState.FAILED if verdict.restart else RankState.IDLE
            self._rank_states = [fresh] * self.nprocs
        if verdict.restart and self.restart_on_failure and not self._closed:
            self.restart()

    def _stacks_of(self, ranks: list[int]) -> dict[int, str]:
        """Each stuck rank's stack before it is killed (Note [Stuck rank stacks])."""
        assert self._gen is not None
        with self._lock:
            marks = {r: self._logs[r].total for r in ranks}
        self._gen.signal(ranks, stacks.DUMP_SIGNAL)
        deadline = time.monotonic() + stacks.WAIT_S
        seen, quiet_since = -1, time.monotonic()
        while time.monotonic() < deadline:
            with self._lock:
                new = {r: self._logs[r].since(marks[r]) for r in ranks}
            count = sum(map(len, new.values()))
            if count != seen:
                seen, quiet_since = count, time.monotonic()
            elif all(map(stacks.has_dump, new.values())):
                if time.monotonic() - quiet_since >= stacks.QUIET_S:
                    break
            time.sleep(0.01)
        return {r: stacks.user_stack(lines) for r, lines in new.items() if stacks.has_dump(lines)}

    def interrupt(self, run: Run) -> None:
        """Stop the ranks' work on ``run``: SIGINT, then kill whoever does not come back."""
        if self._gen is None:  # closed, or a restart that failed: the ranks are gone
            self._end_current("the cluster's ranks are gone")
            run.abandon("the cluster's ranks are gone")  # if it was not the current one
            return
        self._gen.signal(run.outcome.pending, signal.SIGINT)
        deadline = time.monotonic() + INTERRUPT_GRACE_S
        while run.outcome.pending and time.monotonic() < deadline:
            try:
                time.sleep(0.02)
            except KeyboardInterrupt:  # a second interrupt: stop waiting, kill below
                break
        self._gen.signal(run.outcome.pending, signal.SIGKILL)
        while True:  # the kill lands within ms; let the supervisor see it
            try:
                self._wait_replies(run)
                break
            except KeyboardInterrupt:
                continue
        self._finish(run)

    def _wait_replies(self, run: Run, timeout: float = 5.0) -> None:
        deadline = time.monotonic() + timeout
        while run.outcome.pending and time.monotonic() < deadline:
            run.outcome.wait_for_change(0.05)
