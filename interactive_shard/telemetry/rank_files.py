"""A job's rank files (``ISH_RECORD=DIR``, ``rank_file.py``) merged into one run's store.

``load_folder(DIR)`` reads every ``*.jsonl`` rank file in ``DIR`` as untrusted input and
loads what is valid, with a ``RecordingWarning`` naming what it left out or cut:

* files of other jobs (another run recorded into the same folder): the newest job is
  loaded, the others are named;
* a file that is not a rank file (a bad header, a ``run.save`` recording);
* a damaged file (a bad line, a cut-off last line): its valid prefix;
* a rank that ended early (no end record: killed): its events up to its last write,
  then a ``failed`` state saying so;
* a rank with no file: named, and marked failed.

Note [One clock for a job's ranks]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
Background: an event's time is its rank's ``time.monotonic()``; ranks on one host share
that clock, ranks on different hosts do not (each counts from its own boot).

Algorithm: each rank's ``RankInfo`` holds ``wall`` (``time.time()``) read with its event
time ``t``, so ``wall - t`` maps the rank's clock to wall time. Per host the loader takes
the median of its ranks' ``wall - t`` and moves every host onto the clock of the host of
the lowest rank, by the difference of those medians: the hosts' wall clocks are as close
as their time sync (NTP: about a millisecond). The timeline then refines a host's offset
from the collectives it shares with rank 0 (``TimelineModel.offset``), as it does live.
The offsets applied are kept in ``RunInfo.extra["clock_offsets_s"]`` by host.

Caveats: a host whose wall clock is off by seconds shifts by as much here; the
timeline's refinement still aligns its spans.

Note [A merged run skips the young collections]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
Background: a merged run's payloads are millions of lists and dicts (7 million at 256
ranks of 300 iterations). The load pauses the garbage collector (Note [Pausing the
collector's GC]); when it comes back on, its first young collection walks them all
(2 of the merge's 6.5 s there), a middle collection walks them again soon after (3 s,
in whatever runs next), and a full one takes them to the oldest generation. They live
as long as the run and make no cycles: those walks find nothing.

Algorithm: at the end of the load, ``gc.freeze()`` then ``gc.unfreeze()`` moves every
object the collector tracks into the oldest generation at once (a list splice, no
walk); the next full collection looks at them, as it would have.

Caveats: the process's other young objects move too (a garbage cycle among them is
collected at the next full collection instead of a young one). Skipped when the
program froze objects itself (``gc.freeze``: unfreezing would thaw them).
"""

from __future__ import annotations

import gc
import operator
import os
import statistics
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

from interactive_shard.telemetry._gc import paused
from interactive_shard.telemetry._recording_checks import (
    MAX_LINE_BYTES,
    Header,
    RecordingError,
    RecordingWarning,
    short,
)
from interactive_shard.telemetry.rank_file import SUFFIX
from interactive_shard.telemetry.rank_state import RankState
from interactive_shard.telemetry.recording import read_header, run_info
from interactive_shard.telemetry.run_events import RankInfo, State, payload
from interactive_shard.telemetry.schema import Event
from interactive_shard.telemetry.store import RunStore

__all__ = ["load_folder"]

_events = msgspec.json.Decoder(list[Event])
_one = msgspec.json.Decoder(Event)
_RANK = operator.attrgetter("rank")
_T = operator.attrgetter("t")
_ENDED = {RankState.FINISHED.value, RankState.FAILED.value}


class RankFileInfo(msgspec.Struct, kw_only=True):
    """``extra["rank_file"]`` of a rank file's header."""

    job: str
    rank: int
    started: float


@dataclass
class RankFile:
    """One rank's file: its header, its valid events, and what was wrong with it."""

    path: Path
    header: Header
    info: RankFileInfo
    events: list[Event] = field(default_factory=list)
    damage: str | None = None  # why reading stopped early (a bad line)


def load_folder(folder: str | os.PathLike[str]) -> RunStore:
    """The newest job's rank files in ``folder``, merged into one store (see the module
    docstring for what is loaded with a warning)."""
    folder = Path(folder)
    paths = sorted(p for p in folder.iterdir() if p.name.endswith(SUFFIX) and p.is_file())
    if not paths:
        raise RecordingError(
            f"{folder} holds no rank files (*{SUFFIX}). A job writes them when its ranks run "
            "with ISH_RECORD set to this folder and call ish.watch(model)."
        )
    files: list[RankFile] = []
    for path in paths:
        found = _header_of(path)
        if isinstance(found, str):
            _warn(f"{path.name} is left out: {found}")
        else:
            files.append(found)
    if not files:
        raise RecordingError(f"{folder}: none of its {len(paths)} *{SUFFIX} files is a rank file.")
    files = _newest_job(files)
    world_size = _world_size(files)
    files = _one_per_rank(files, world_size)
    head = files[0].header
    # The store is filled within the pause too: its scalar rows and runs make objects
    # by the hundred thousand, each collection then walking every event loaded so far.
    with paused():  # Note [Pausing the collector's GC] (_gc.py)
        for f in files:
            _read_events(f)
        events = _merge(files, world_size)
        extra = {"rank_files": len(files), "clock_offsets_s": _clock_offsets(files)}
        store = RunStore(run_info(head, world_size=world_size, name=files[0].info.job, extra=extra))
        store.extend(events)
        _promote()
    return store


def _promote() -> None:
    """Every tracked object into the oldest generation, without a collection (Note [A
    merged run skips the young collections])."""
    if gc.get_freeze_count() == 0:  # nothing frozen by the program: unfreeze thaws ours only
        gc.freeze()
        gc.unfreeze()


def _header_of(path: Path) -> RankFile | str:
    """The file's header and rank file info, or why it is not a rank file."""
    try:
        with path.open("rb") as f:
            header = read_header(path, f.readline(MAX_LINE_BYTES + 1))
    except (RecordingError, OSError) as exc:
        return str(exc)
    raw = (header.extra or {}).get("rank_file")
    try:
        info = msgspec.convert(raw, RankFileInfo)
    except msgspec.ValidationError as exc:
        return f"its header has no valid 'rank_file' entry ({exc}): not written by ISH_RECORD"
    if not 0 <= info.rank < header.world_size:
        return f"its rank {short(info.rank)} is outside its world size {header.world_size}"
    return RankFile(path, header, info)


def _newest_job(files: list[RankFile]) -> list[RankFile]:
    """The files of the job that began last; the others are named in a warning."""
    jobs: dict[str, list[RankFile]] = {}
    for f in files:
        jobs.setdefault(f.info.job, []).append(f)
    newest = max(jobs, key=lambda job: max(f.info.started for f in jobs[job]))
    others = sorted(f.path.name for job, fs in jobs.items() if job != newest for f in fs)
    if others:
        _warn(
            f"loaded job {newest!r} ({len(jobs[newest])} files), the newest in the folder; "
            f"left out {len(others)} files of {len(jobs) - 1} other job(s): "
            f"{_names(others)}. Move them to their own folder to load them."
        )
    return jobs[newest]


def _world_size(files: list[RankFile]) -> int:
    sizes = [f.header.world_size for f in files]
    size = max(set(sizes), key=sizes.count)
    odd = [f.path.name for f in files if f.header.world_size != size]
    if odd:
        _warn(f"left out {_names(odd)}: their world size differs from the job's {size}")
        files[:] = [f for f in files if f.header.world_size == size]
    return size


def _one_per_rank(files: list[RankFile], world_size: int) -> list[RankFile]:
    """The latest file of each rank (a rank restarted under one job id wrote two)."""
    by_rank: dict[int, RankFile] = {}
    for f in sorted(files, key=lambda f: f.info.started):
        earlier = by_rank.get(f.info.rank)
        if earlier is not None:
            _warn(
                f"rank {f.info.rank} has two files, {earlier.path.name} and {f.path.name}: "
                f"loaded the later, {f.path.name}"
            )
        by_rank[f.info.rank] = f
    missing = sorted(set(range(world_size)) - set(by_rank))
    if missing:
        _warn(
            f"no file of rank(s) {_names([str(r) for r in missing])} of the job's "
            f"{world_size}: those ranks show no events (marked failed)"
        )
    return [by_rank[r] for r in sorted(by_rank)]


def _read_events(f: RankFile) -> None:
    """The file's valid events (a bad line stops it: ``f.damage``)."""
    rank = f.info.rank
    with f.path.open("rb") as stream:
        stream.readline(MAX_LINE_BYTES + 1)  # the header, read already
        for data, whole in _chunks(stream):
            events: list[Event] = []
            if whole:  # a chunk of whole lines: one decode, one check of the ranks
                # Its lines joined by "," each with its newline, "[l1\n,l2\n]": the text
                # a join of the lines makes, without splitting them.
                ended = data.endswith(b"\n")
                joined = data.replace(b"\n", b"\n,")
                body = memoryview(joined)[:-1] if ended else joined  # no "," after the last
                try:
                    events = _events.decode(b"".join((b"[", body, b"]")))
                except (msgspec.DecodeError, RecursionError):
                    pass
                n = len(joined) - len(data) + (0 if ended else 1)  # one "," a newline
                del joined, body
                if len(events) == n and list(map(_RANK, events)).count(rank) == n:
                    f.events += events
                    continue
            # Something is wrong in this chunk (or a line in it is blank): line by line,
            # as before, to find the first bad line and keep what precedes it.
            lines = [line for line in _lines(data) if line.strip()] if whole else [data]
            for n, line in enumerate(lines):  # find the first bad line; keep what precedes
                problem = _problem(line, rank)
                if problem is not None:
                    f.damage = f"line {2 + len(f.events) + n} {problem}"
                    f.events += events[:n] if len(events) == len(lines) else _good(lines[:n])
                    _warn(
                        f"{f.path.name} (rank {rank}) is damaged: {f.damage}; loaded the "
                        f"{len(f.events)} events before it"
                    )
                    return
            f.events += _good(lines)


def _chunks(stream: Any) -> Iterator[tuple[bytes, bool]]:
    """What follows the header, as chunks of whole lines of at most ``MAX_LINE_BYTES``
    together (so none of their lines is over the limit; the last chunk may end in a line
    with no newline), each with True; or, where a line is over the limit, its first
    ``MAX_LINE_BYTES + 1`` bytes with False, and nothing after: a bounded read never
    holds such a line whole, and the file is damaged there."""
    rest = b""  # the start of a line whose end is not read yet
    while True:
        block = stream.read(MAX_LINE_BYTES - len(rest))  # a chunk starts at a line's start
        data = rest + block if rest else block
        if not block:  # the end of the file: a last line with no newline, if any
            if data:
                yield data, True
            return
        end = data.rfind(b"\n") + 1
        if end:
            yield data[:end], True
            rest = data[end:]
        elif len(data) < MAX_LINE_BYTES:
            rest = data  # a short read: only at the end of the file
        else:  # MAX_LINE_BYTES bytes with no newline: the line is longer
            yield data + stream.read(1), False
            return


def _lines(data: bytes) -> list[bytes]:
    """``data``'s lines, each with its newline (the last may have none)."""
    parts = data.split(b"\n")
    lines = [part + b"\n" for part in parts[:-1]]
    if parts[-1]:
        lines.append(parts[-1])
    return lines


def _problem(line: bytes, rank: int) -> str | None:
    if len(line) > MAX_LINE_BYTES:
        return f"is longer than the {MAX_LINE_BYTES}-byte line limit"
    if not line.endswith(b"\n"):
        return "is cut off (no newline): the rank stopped while writing it"
    try:
        event = _one.decode(line)
    except (msgspec.DecodeError, RecursionError) as exc:
        return f"is not a valid event ({exc})"
    if event.rank != rank:
        return f"holds an event of rank {event.rank} in rank {rank}'s file"
    return None


def _good(lines: list[bytes]) -> list[Event]:
    return [_one.decode(line) for line in lines]


def _merge(files: list[RankFile], world_size: int) -> list[Event]:
    """Every file's events on one clock (Note [One clock for a job's ranks]), in time
    order, each rank closed by a state: its own, or ``failed`` when it ended early."""
    offsets = _clock_offsets(files)
    hosts = _hosts(files)
    events: list[Event] = []
    for f in files:
        dt = offsets.get(hosts.get(f.info.rank, ""), 0.0)
        ours = f.events if dt == 0.0 else [_shifted(e, dt) for e in f.events]
        events += ours
        if not _ended(ours):
            events.append(_early_end(f, ours))
    seen = {f.info.rank for f in files}
    for rank in sorted(set(range(world_size)) - seen):
        note = State(state=RankState.FAILED, detail="no recording file of this rank")
        events.append(
            Event(State.KIND, rank, 0, min((e.t for e in events), default=0.0), payload(note))
        )
    times = np.fromiter(map(_T, events), float, len(events))
    order = np.argsort(times, kind="stable")
    return list(map(events.__getitem__, order.tolist()))


def _shifted(event: Event, dt: float) -> Event:
    return Event(event.kind, event.rank, event.step, event.t + dt, event.payload)


def _ended(events: list[Event]) -> bool:
    for event in reversed(events):
        if event.kind == State.KIND:
            return event.payload.get("state") in _ENDED
    return False


def _early_end(f: RankFile, events: list[Event]) -> Event:
    """A ``failed`` state for a rank whose file has no end record, with a warning."""
    last = events[-1] if events else None
    t = last.t if last is not None else 0.0
    step = max((e.step for e in events), default=0)
    first = events[0].t if events else t
    detail = (
        f"ended early: its recording stops {t - first:.1f} s after it began, at step {step}, "
        "with no end record (killed?)"
    )
    _warn(f"rank {f.info.rank} {detail}; loaded its {len(events)} events ({f.path.name})")
    return Event(
        State.KIND, f.info.rank, step, t, payload(State(state=RankState.FAILED, detail=detail))
    )


def _hosts(files: list[RankFile]) -> dict[int, str]:
    """Each rank's host, from its first ``RankInfo``."""
    return {f.info.rank: info.host for f in files if (info := _rank_info(f)) is not None}


def _rank_info(f: RankFile) -> RankInfo | None:
    for event in f.events:
        if event.kind == RankInfo.KIND:
            try:
                return msgspec.convert(event.payload, RankInfo)
            except msgspec.ValidationError:
                return None
    return None


def _clock_offsets(files: list[RankFile]) -> dict[str, float]:
    """Seconds added to each host's times (Note [One clock for a job's ranks])."""
    anchors: dict[str, list[float]] = {}
    first_host = None
    for f in files:
        info = _rank_info(f)
        at = next((e.t for e in f.events if e.kind == RankInfo.KIND), None)
        if info is None or at is None or info.wall <= 0:
            continue
        first_host = first_host or info.host
        anchors.setdefault(info.host, []).append(info.wall - at)
    if first_host is None:
        return {}
    medians = {host: statistics.median(values) for host, values in anchors.items()}
    return {host: m - medians[first_host] for host, m in medians.items()}


def _names(names: list[str], most: int = 8) -> str:
    shown = ", ".join(names[:most])
    return shown if len(names) <= most else f"{shown} and {len(names) - most} more"


def _warn(message: str) -> None:
    warnings.warn(message, RecordingWarning, stacklevel=4)  # ish.load's caller
