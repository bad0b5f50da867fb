"""Run: the handle of one ``cluster.run`` call, live or loaded from a recording."""

from __future__ import annotations

import os
import sys
import threading
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from interactive_shard import features
from interactive_shard.cluster.errors import RankError
from interactive_shard.cluster.outcome import STREAM_GRACE_S, Outcome, Reply, Verdict
from interactive_shard.cluster.output import ECHO_LINES, RunOutput, cut
from interactive_shard.telemetry import rank_files, recording, schema
from interactive_shard.telemetry.rank_state import RankState
from interactive_shard.telemetry.run_events import Log, State, payload
from interactive_shard.telemetry.store import RunStore
from interactive_shard.ui import live
from interactive_shard.ui.live import ShowsView


class RunDriver(Protocol):
    """What moves a live run on (a ``Cluster``): decide it, or stop its ranks' work."""

    def advance(self, run: Run) -> bool:
        """Non-blocking: conclude ``run`` if its outcome is decided; True when finished."""
        ...

    def interrupt(self, run: Run) -> None:
        """Stop the ranks' work on ``run`` (a kernel interrupt) and conclude it."""
        ...


class Run(ShowsView):
    """Results, events and views of one run.

    ``results[rank]`` is each rank's return value; ``store`` holds every event;
    ``wait()`` blocks (keeping views live) and raises ``RankError`` if a rank failed.
    ``outcome`` decides when a live run is over (see Note [Run outcome]).
    """

    def __init__(
        self,
        store: RunStore,
        *,
        driver: RunDriver | None = None,
        run_id: int = 0,
        results: list[Any] | None = None,
    ) -> None:
        n = store.info.world_size
        self.store = store
        self.run_id = run_id
        self.outcome = Outcome(n)
        self._driver = driver
        self._reply_lock = threading.Lock()
        self._results: list[Any] = list(results) if results is not None else [None] * n
        self._tracebacks: dict[int, str] = {}
        self._error: BaseException | None = None
        self._finished = driver is None  # a loaded run is complete
        self._output = RunOutput(n)
        self._when_done: list[Callable[[], None]] = []
        self.missing_events: dict[int, int] = {}  # rank -> events sent that never arrived
        self._models: dict[str, Any] = {}

    # -- reports from the cluster's supervisor / collector threads -------------------
    def record_reply(
        self, rank: int, reply: Reply, value: Any = None, *, sent: int | None = None
    ) -> None:
        """Rank ``rank`` ended: its result (``Reply.DONE``) or its traceback / exit note;
        ``sent``: how many events it sent in the run."""
        with self._reply_lock:
            if rank in self.outcome.replies:
                return  # the first reply counts (e.g. an error, then the process exits)
            if reply is Reply.DONE:
                self._results[rank] = value
                state, detail = RankState.FINISHED, ""
            else:
                self._tracebacks[rank] = value
                state = RankState.FAILED
                detail = cut(str(value).strip().splitlines()[-1]) if value else reply.value
            self.outcome.reply(rank, reply, sent)  # after the result is in place: it may decide
        self.record_state(rank, state, detail)

    def add_output(self, rank: int, stream: str, text: str) -> None:
        """A line rank ``rank`` wrote (Note [Bounded rank output] says what is kept)."""
        if self._output.add(rank, stream, text):
            self._store_line(rank, stream, text, time.monotonic())

    def _store_line(self, rank: int, stream: str, text: str, t: float) -> None:
        line = payload(Log(stream="stderr" if stream == "stderr" else "stdout", text=text))
        self.store.append(schema.Event(Log.KIND, rank, 0, t, line))

    def record_state(self, rank: int, state: RankState, detail: str = "") -> None:
        event = payload(State(state=state, detail=detail))
        self.store.append(schema.Event(State.KIND, rank, 0, time.monotonic(), event))

    # -- deciding -----------------------------------------------------------------------
    @property
    def done(self) -> bool:
        return self._finished

    def wait(self, timeout: float | None = None) -> Run:
        """Block until every rank finished, keeping views live; raise ``RankError``."""
        driver = self._driver
        if not self._finished and driver is not None:
            deadline = None if timeout is None else time.monotonic() + timeout
            try:
                while not driver.advance(self):
                    live.tick()
                    self.outcome.wait_for_change(0.05)
                    if deadline is not None and time.monotonic() > deadline:
                        raise TimeoutError(
                            f"run {self.run_id} is still running after {timeout} s; call "
                            "run.wait() again, or interrupt the kernel to stop it."
                        )
            except KeyboardInterrupt:
                driver.interrupt(self)
                raise
            live.tick(force=True)
        if self._error is not None:
            raise self._error
        return self

    def conclude(
        self, verdict: Verdict, note: str = "", stuck_stacks: dict[int, str] | None = None
    ) -> None:
        """Called once by the driver when the outcome is decided; ``stuck_stacks``: where
        each stuck rank was when it was stopped."""
        for rank in verdict.stuck:
            self.record_state(rank, RankState.FAILED, "stopped: another rank failed")
        for rank, (stream, text, t) in self._output.finish():
            self._store_line(rank, stream, text, t)
        self.missing_events = self.outcome.missing()
        if self.missing_events:
            per_rank = ", ".join(f"rank {r}: {n:,}" for r, n in self.missing_events.items())
            warnings.warn(
                f"run {self.run_id} ended with events its ranks sent still missing ({per_rank}; "
                f"no event arrived for {STREAM_GRACE_S:.0f} s, or the ranks dropped them: "
                "see the ranks' telemetry warnings). Its views and recording lack them.",
                RuntimeWarning,
                stacklevel=2,
            )
        if self._tracebacks:
            if verdict.stuck:
                stuck = f"rank(s) {', '.join(map(str, verdict.stuck))} were stuck and were stopped"
                note = f"{stuck}; {note}" if note else stuck
            self._error = RankError(self._tracebacks, note=note, stuck=stuck_stacks)
        self._finished = True
        callbacks, self._when_done = self._when_done, []
        for callback in callbacks:
            callback()

    def abandon(self, why: str) -> None:
        """End a live run whose ranks were stopped (``why``: by what): ranks that had not
        replied fail with that reason; a run already over is left as it is."""
        if self._finished:
            return
        for rank in self.outcome.pending:
            text = f"[rank {rank}] had not finished run {self.run_id} when {why} stopped it"
            self.record_reply(rank, Reply.DIED, text)
        self.conclude(self.outcome.verdict(), f"ended by {why}")

    def when_done(self, callback: Callable[[], None]) -> None:
        """Call ``callback()`` once the run is over (at once if it is)."""
        if self._finished:
            callback()
        else:
            self._when_done.append(callback)

    # -- results and output ---------------------------------------------------------------
    @property
    def results(self) -> list[Any]:
        """Each rank's return value (waits for the run to finish)."""
        self.wait()
        return self._results

    @property
    def error(self) -> BaseException | None:
        return self._error

    def logs(self, rank: int) -> list[str]:
        """The lines rank ``rank`` wrote to stdout and stderr during this run (the first
        and last of a long output, Note [Bounded rank output] in cluster/output.py)."""
        stored = [
            str(e.payload.get("text", "")) for e in self.store.of_kind(schema.LOG) if e.rank == rank
        ]
        return stored if self._finished else stored + self._output.tail(rank)

    def echo(self) -> None:
        """Print new rank output to the cell, labelled by rank."""
        lines, skipped = self._output.take_echo()
        if skipped:
            sys.stdout.write(
                f"[… {skipped:,} line(s) of rank output not shown: more than {ECHO_LINES:,} "
                "arrived between two refreshes; run.logs(rank) keeps the first and last]\n"
            )
        for rank, stream, text in lines:
            # The cell's own stream, not logging: this is the ranks' output itself.
            (sys.stderr if stream == "stderr" else sys.stdout).write(f"[rank {rank}] {text}\n")

    # -- models and views -------------------------------------------------------------
    # run.monitor, run.buckets, ...: one attribute per entry of features.FEATURES, added
    # below the class (see _FeatureModel); a feature never edits this file.
    def model(self, name: str) -> Any:
        """The model of feature ``name`` for this run, current as of this call."""
        found = self._models.get(name)
        if found is None:
            found = self._models[name] = features.feature(name).build_model(self.store)
        found.update()  # a live run keeps adding events
        return found

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write this run as a JSONL recording (``ish.load(path)`` replays it)."""
        results = self._results if self._finished and self._error is None else None
        return recording.save(self.store, path, results)

    def to_html(self, path: str | os.PathLike[str]) -> Path:
        """Write one self-contained HTML file with this run's figures (works offline)."""
        from interactive_shard.report import write_report

        return write_report(self, path)

    def _view(self) -> Any:
        return features.feature("monitor").view_of(self)

    # The monitor's source protocol (monitor/view.py MonitorSource): a run follows itself.
    @property
    def latest_run(self) -> Run:
        return self

    def live_rank_states(self) -> None:
        return None

    def describe(self) -> str:
        info = self.store.info
        return f"{info.world_size} ranks · {info.backend} · {', '.join(info.device_types)}"

    def __repr__(self) -> str:
        status = "running" if not self._finished else ("failed" if self._error else "finished")
        missing = sum(self.missing_events.values())
        return (
            f"Run(id={self.run_id}, {status}, world_size={self.store.info.world_size}, "
            f"events={len(self.store)}{f', missing_events={missing}' if missing else ''})"
        )


class _FeatureModel:
    """``run.<name>``: the feature's model of the run, brought up to date on access."""

    def __init__(self, feature: features.Feature) -> None:
        self.name = feature.name
        self.__doc__ = f"{feature.title}: the {feature.model.rpartition(':')[2]} of this run."

    def __get__(self, run: Run | None, owner: type[Run]) -> Any:
        return self if run is None else run.model(self.name)


for _feature in features.FEATURES:
    setattr(Run, _feature.name, _FeatureModel(_feature))


def load(path: str | os.PathLike[str]) -> Run:
    """Rebuild a saved run (store, models, views) without starting any process: a
    recording (``run.save``), or a folder of a job's rank files (``ISH_RECORD``)."""
    if Path(path).is_dir():
        return Run(rank_files.load_folder(path))
    store, results = recording.load(path)
    return Run(store, results=results)
