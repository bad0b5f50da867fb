"""Spans as Chrome Trace Event Format JSON: what ui.perfetto.dev and chrome://tracing open.

The object form (``{"traceEvents": [...], "displayTimeUnit": "ms", "otherData": {...}}``)
of the format's spec ("Trace Event Format", Google, 2016): one complete event (``"ph":
"X"``) per span, ``ts`` and ``dur`` in microseconds from ``origin``; a span that starts
and ends at once is an instant (``"ph": "i"``, thread scoped). A rank is a process
(``pid``), a lane a thread (``tid``): 1 compute (nested forwards and backwards nest on
one thread, as complete events do in every viewer), 2 hooks, 3 collectives, 4 the
optimizer. Spans of a lane that overlap without nesting (collectives in flight at once)
would be dropped by a viewer: they go on more threads of the lane (``tid`` + 10, + 20...).
Metadata events name and order them. Pure: ``write_chrome_trace`` is the only I/O.
"""

from __future__ import annotations

import json
import math
import pathlib
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

import msgspec

from interactive_shard.telemetry.files import write_bytes

if TYPE_CHECKING:
    from interactive_shard.timeline.model import TimelineSpan

LANES = {
    "forward": 1,
    "backward": 1,
    "compiled_forward": 1,
    "compiled_backward": 1,
    "hook": 2,
    "collective": 3,
    "optimizer": 4,
}
LANE_NAMES = {1: "compute", 2: "hooks", 3: "collectives", 4: "optimizer"}
ROOT = "(root)"  # the watched model's own span is named "": viewers show no empty name


def event_name(span: TimelineSpan) -> str:
    """The name a span has in the trace."""
    return span.name or ROOT


def chrome_trace(
    spans: Iterable[TimelineSpan], origin: float, other: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """The trace of ``spans`` (aligned seconds), ``ts`` relative to ``origin``."""
    # Times in whole nanoseconds first: rounding is monotonic, so a child never ends
    # after its parent for having been rounded apart from it.
    timed = sorted(((_ns(s.start - origin), _ns(s.end - origin), s) for s in spans),
                   key=lambda x: (x[2].rank, LANES[x[2].kind], x[0], -x[1]))  # fmt: skip
    events: list[dict[str, Any]] = []
    open_: dict[tuple[int, int], list[list[int]]] = {}  # (rank, lane) -> per thread: ends
    for start, end, s in timed:
        stacks = open_.setdefault((s.rank, LANES[s.kind]), [])
        k = _fit(stacks, start, end)
        event: dict[str, Any] = {
            "name": event_name(s),
            "cat": s.kind,
            "ph": "X" if end > start else "i",
            "ts": start / 1000,
            "pid": s.rank,
            "tid": LANES[s.kind] + 10 * k,
            "args": {**s.detail, "iteration": s.iteration},
        }
        if end > start:
            event["dur"] = (end - start) / 1000
        else:
            event["s"] = "t"
        events.append(event)
    meta: list[dict[str, Any]] = []
    for rank in sorted({r for r, _ in open_}):
        meta.append(_meta(rank, 0, "process_name", name=f"rank {rank}"))
        meta.append(_meta(rank, 0, "process_sort_index", sort_index=rank))
        for lane in sorted(lane for r, lane in open_ if r == rank):
            for k in range(len(open_[(rank, lane)])):
                name = LANE_NAMES[lane] + (f" {k + 1}" if k else "")
                meta.append(_meta(rank, lane + 10 * k, "thread_name", name=name))
                meta.append(
                    _meta(rank, lane + 10 * k, "thread_sort_index", sort_index=lane * 1000 + k)
                )
    data = {"producer": "interactive_shard", "origin_s": origin, **(other or {})}
    return {"traceEvents": meta + events, "displayTimeUnit": "ms", "otherData": data}


def _fit(stacks: list[list[int]], start: int, end: int) -> int:
    """The first thread of a lane where [start, end] nests (inside the innermost span
    still open there, or after it ended); a new thread when none. Spans come by start,
    longest first. Viewers drop a complete event that overlaps one on its thread
    without nesting: collectives in flight at once do (DDP's buckets, FSDP's prefetch)."""
    for k, ends in enumerate(stacks):
        while ends and ends[-1] <= start and not (ends[-1] == start == end):
            ends.pop()
        if not ends or end <= ends[-1]:
            ends.append(end)
            return k
    stacks.append([end])
    return len(stacks) - 1


def write_chrome_trace(path: str | pathlib.Path, trace: Mapping[str, Any]) -> pathlib.Path:
    """Write ``trace`` as JSON to ``path`` (its folder must exist); returns the path."""
    out = pathlib.Path(path).expanduser()
    if out.is_dir():
        raise IsADirectoryError(f"to_chrome_trace({str(path)!r}): that is a folder; name a file")
    if not out.parent.is_dir():
        raise FileNotFoundError(
            f"to_chrome_trace({str(path)!r}): folder {str(out.parent)!r} does not exist"
        )
    # msgspec writes a long run's trace ~10x faster than json.dumps (a NaN or infinity
    # in a span's detail becomes null: JSON has neither).
    return write_bytes(out, msgspec.json.encode(trace))  # whole or not at all


def read_chrome_trace(path: str | pathlib.Path) -> list[dict[str, Any]]:
    """The events of a Chrome trace file (object or array form)."""
    try:
        found = json.loads(pathlib.Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"{str(path)!r} is not a readable Chrome trace: {err}") from err
    events = found.get("traceEvents") if isinstance(found, dict) else found
    if not isinstance(events, list) or not all(isinstance(e, dict) for e in events):
        raise ValueError(f"{str(path)!r} is not a Chrome trace: no list of event objects")
    return events


def _ns(seconds: float) -> int:
    if not math.isfinite(seconds):
        raise ValueError(f"a span time {seconds!r} s from the origin is not finite")
    return round(seconds * 1e9)


def _meta(pid: int, tid: int, event: str, **args: Any) -> dict[str, Any]:
    return {"name": event, "ph": "M", "pid": pid, "tid": tid, "args": args}
