"""Run: the handle of one ``cluster.run`` call, live or loaded from a recording."""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from interactive_shard import features
from interactive_shard.cluster.errors import RankError
from interactive_shard.cluster.state import RankState
from interactive_shard.telemetry import recording, schema
from interactive_shard.telemetry.store import RunStore
from interactive_shard.ui.live import ShowsView

if TYPE_CHECKING:
    from interactive_shard.cluster.cluster import Cluster

# After one rank fails, wait this long for the others to report before deciding.
FAILURE_GRACE_S = 1.0
# After every rank replied, wait at most this long for their event streams to close.
STREAM_GRACE_S = 5.0


class Run(ShowsView):
    """Results, events and views of one run.

    ``results[rank]`` is each rank's return value; ``store`` holds every event;
    ``wait()`` blocks (keeping views live) and raises ``RankError`` if a rank failed.
    """

    def __init__(
        self,
        store: RunStore,
        *,
        cluster: Cluster | None = None,
        run_id: int = 0,
        results: list[Any] | None = None,
    ) -> None:
        n = store.info.world_size
        self.store = store
        self.run_id = run_id
        self._cluster = cluster
        self._cond = threading.Condition()
        self._results: list[Any] = list(results) if results is not None else [None] * n
        # rank -> "done" | "error" | "broken" (its process group failed) | "died"
        self._replied: dict[int, str] = {}
        self._tracebacks: dict[int, str] = {}
        self._streams_closed: set[int] = set()
        self._first_failure: float | None = None
        self._last_reply = 0.0
        self._error: BaseException | None = None
        self._finished = cluster is None  # a loaded run is complete
        self._echo_cursor = 0
        self._models: dict[str, Any] = {}

    # -- reports from the cluster's supervisor / collector threads -------------------
    def _reply(self, rank: int, outcome: str, value: Any = None) -> None:
        with self._cond:
            if rank in self._replied:
                return
            self._replied[rank] = outcome
            self._last_reply = time.monotonic()
            if outcome == "done":
                self._results[rank] = value
                state, detail = RankState.FINISHED, ""
            else:
                self._tracebacks[rank] = value
                self._first_failure = self._first_failure or self._last_reply
                state = RankState.FAILED
                detail = str(value).strip().splitlines()[-1] if value else outcome
            self._cond.notify_all()
        self._state_event(rank, state, detail)

    def _stream_closed(self, rank: int) -> None:
        with self._cond:
            self._streams_closed.add(rank)
            self._cond.notify_all()

    def _state_event(self, rank: int, state: RankState, detail: str = "") -> None:
        payload = {"state": state.value, "detail": detail}
        self.store.append(schema.Event(schema.STATE, rank, 0, time.monotonic(), payload))

    # -- decisions ----------------------------------------------------------------------
    def _pending(self) -> list[int]:
        return [r for r in range(self.store.info.world_size) if r not in self._replied]

    def _decided(self, now: float) -> bool:
        if self._pending():
            return self._first_failure is not None and now - self._first_failure >= FAILURE_GRACE_S
        streams_open = set(self._replied) - self._streams_closed - self._dead()
        return not streams_open or now - self._last_reply >= STREAM_GRACE_S

    def _dead(self) -> set[int]:
        return {r for r, outcome in self._replied.items() if outcome == "died"}

    @property
    def done(self) -> bool:
        return self._finished

    def wait(self, timeout: float | None = None) -> Run:
        """Block until every rank finished, keeping views live; raise ``RankError``."""
        if not self._finished:
            assert self._cluster is not None
            self._cluster._wait_run(self, timeout)
        if self._error is not None:
            raise self._error
        return self

    def _conclude(self, note: str = "") -> None:
        """Called once by the cluster when the run is decided."""
        pending = self._pending()
        for rank in pending:
            self._state_event(rank, RankState.FAILED, "stopped: another rank failed")
        if self._tracebacks:
            if pending:
                stuck = f"rank(s) {', '.join(map(str, pending))} were stuck and were stopped"
                note = f"{stuck}; {note}" if note else stuck
            self._error = RankError(self._tracebacks, note=note)
        self._finished = True

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
        """Every line rank ``rank`` wrote to stdout and stderr during this run."""
        return [
            str(e.payload.get("text", "")) for e in self.store.of_kind(schema.LOG) if e.rank == rank
        ]

    def _echo(self) -> None:
        """Print new rank output to the cell, labelled by rank."""
        events = self.store.events(self._echo_cursor)
        self._echo_cursor += len(events)
        for e in events:
            if e.kind == schema.LOG:
                stream = sys.stderr if e.payload.get("stream") == "stderr" else sys.stdout
                # The cell's own stream, not logging: this is the ranks' output itself.
                stream.write(f"[rank {e.rank}] {e.payload.get('text', '')}\n")

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
        return (
            f"Run(id={self.run_id}, {status}, world_size={self.store.info.world_size}, "
            f"events={len(self.store)})"
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
    """Rebuild a saved run (store, models, views) without starting any process."""
    store, results = recording.load(path)
    return Run(store, results=results)
