"""TimelineModel: every rank's spans on one time axis, with phases, order and overlap.

Consumes the ``timeline_*`` events of a ``RunStore`` (``events.py``, ``docs/events.md``)
with a cursor, so it serves a live run and a loaded recording alike. Spans are kept as
the rank sent them (its own clock) and aligned on demand: ranks on rank 0's host share
its clock (offset 0); a rank on another host is shifted by the median, over the
collectives it shares with rank 0, of rank 0's end minus its own (a collective completes
nearly at once everywhere). Results per (rank, iteration) are cached under a stamp of
that key's data and the rank's offset, so a redraw recomputes only what changed.
No widgets, no torch.
"""

from __future__ import annotations

import logging
import math
import pathlib
import statistics
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

import msgspec

from interactive_shard import features
from interactive_shard.telemetry.consume import Cursor
from interactive_shard.telemetry.store import RunStore
from interactive_shard.timeline.chrome import chrome_trace, write_chrome_trace
from interactive_shard.timeline.events import KINDS, Span, TimelineSpans, TimelineWatch
from interactive_shard.ui.live import ShowsView

log = logging.getLogger(__name__)
T = TypeVar("T")

FORWARD = frozenset({"forward", "compiled_forward"})
BACKWARD = frozenset({"backward", "compiled_backward"})
COMPUTE = FORWARD | BACKWARD
PHASES = ("forward", "backward", "optimizer")
# Compute a phase's collectives may hide behind (None: the whole iteration).
_HIDES = {"forward": FORWARD, "backward": BACKWARD, "optimizer": COMPUTE, None: COMPUTE}


class TimelineSpan(msgspec.Struct, kw_only=True, frozen=True):
    """A span of one rank, its times in seconds on the aligned clock (rank 0's)."""

    kind: str
    name: str
    start: float
    end: float
    rank: int
    iteration: int
    detail: dict[str, str | int | float | bool] = {}

    @property
    def duration(self) -> float:
        return self.end - self.start


@dataclass(frozen=True)
class Matched:
    """One collective seen on several ranks: the ``index``-th (from 0) of its ``group``
    and ``op`` in the iteration on each of them. Times aligned; ``waited``: how long each
    rank waited in it for the ``straggler`` (the rank that started it last)."""

    index: int
    op: str
    group: str
    nbytes: int
    starts: dict[int, float]
    ends: dict[int, float]
    straggler: int
    waited: dict[int, float]


@dataclass(frozen=True)
class TimelineFinding:
    """Something the timelines show, merged over ranks and iterations."""

    kind: str  # "bunched": no collective of the backward overlapped its compute
    ranks: list[int]
    iterations: list[int]
    message: str


class Malformed(ValueError):
    """A payload that follows its Struct but cannot be a real span."""


@dataclass
class _Rank:
    watch: TimelineWatch | None = None
    spans: dict[int, list[Span]] = field(default_factory=dict)  # iteration -> arrival order
    stamps: dict[int, int] = field(default_factory=dict)  # iteration -> tick of its last batch
    first: float = math.inf  # earliest start, on the rank's clock


class TimelineModel(ShowsView):
    """Spans of one run (``run.timeline``).

    >>> tl = run.timeline                                    # doctest: +SKIP
    >>> tl.order(rank=0, iteration=2, phase="backward", kinds=["hook"])
    >>> tl.overlap(rank=0, iteration=2), tl.exposed(rank=0, iteration=2)
    >>> tl.collectives(iteration=2)[0].straggler
    >>> tl.to_chrome_trace("timeline.json")                  # ui.perfetto.dev opens it
    """

    def __init__(self, store: RunStore) -> None:
        self.store = store
        self.revision = 0  # grows whenever timeline data arrived; views compare it
        self._events = Cursor(store, _DECODE)
        self._tick = 0  # grows with every batch taken: stamps never repeat, even on restart
        self._ranks: dict[int, _Rank] = {}
        self._cache: dict[tuple[Any, ...], tuple[Any, Any]] = {}

    # -- consuming events --------------------------------------------------------------------
    def update(self) -> bool:
        """Consume new events; True when timeline data changed."""
        changed = False
        for rank, _kind, record in self._events.take():
            changed = self._consume(rank, record) or changed
        if changed:
            self.revision += 1
        return changed

    @property
    def skipped(self) -> int:
        """Events (or records in them) that could not be read: logged, not kept."""
        return self._events.skipped

    def _consume(self, rank: int, record: TimelineWatch | TimelineSpans) -> bool:
        here = self._ranks.setdefault(rank, _Rank())
        if isinstance(record, TimelineWatch):
            if here.watch is not None or here.spans:  # watched again: start over
                log.info("rank %d: timeline_watch again; dropping its earlier spans", rank)
                here = self._ranks[rank] = _Rank()
            here.watch = record
            self._tick += 1
            return True
        good: list[Span] = []
        for span in record.spans:
            if not (math.isfinite(span.end) and span.start <= span.end):
                self._events.skip(rank, "timeline span (it ends before it starts)", span)
            else:
                good.append(span)
        if not good:
            return False
        self._tick += 1
        here.spans.setdefault(record.iteration, []).extend(good)
        here.stamps[record.iteration] = self._tick
        here.first = min(here.first, *(s.start for s in good))
        return True

    # -- what arrived ------------------------------------------------------------------------
    @property
    def ranks(self) -> list[int]:
        self.update()
        return sorted(self._ranks)

    def iterations(self, rank: int | None = None) -> list[int]:
        """Iterations with spans on ``rank`` (None: on any rank), ascending."""
        self.update()
        ranks = self._ranks.values() if rank is None else [self._rank(rank)]
        return sorted({i for r in ranks for i in r.spans})

    def latest(self, rank: int | None = None) -> int | None:
        return max(self.iterations(rank), default=None)

    def watch(self, rank: int = 0) -> TimelineWatch | None:
        return self._rank(rank).watch

    # -- alignment ---------------------------------------------------------------------------
    def offset(self, rank: int) -> float:
        """Seconds added to ``rank``'s times to put them on rank 0's clock."""
        here, zero = self._rank(rank), self._rank(0)
        if rank == 0 or here.watch is None or zero.watch is None:
            return 0.0  # no host to tell otherwise: the common case, one machine
        if here.watch.host == zero.watch.host:
            return 0.0
        return self._memo(("offset", rank), self._tick, lambda: self._measure(rank))

    def _measure(self, rank: int) -> float:
        diffs = [
            m[0].end - m[rank].end
            for it in self._ranks[rank].spans
            for m in self._match(it).values()
            if 0 in m and rank in m
        ]
        return statistics.median(diffs) if diffs else 0.0

    @property
    def origin(self) -> float | None:
        """The earliest aligned start of any span (views plot relative to it)."""
        self.update()
        firsts = [r.first + self.offset(k) for k, r in self._ranks.items() if r.spans]
        return min(firsts, default=None)

    # -- spans -------------------------------------------------------------------------------
    def spans(
        self, rank: int = 0, iteration: int | None = None, kinds: Sequence[str] | None = None
    ) -> list[TimelineSpan]:
        """``rank``'s spans of ``iteration`` (None: all), aligned, by start (then end)."""
        wanted = _kinds(kinds)
        its = self.iterations(rank) if iteration is None else [iteration]
        out = [s for it in its for s in self._aligned(rank, it) if s.kind in wanted]
        return out if len(its) == 1 else sorted(out, key=_order)

    def _aligned(self, rank: int, it: int) -> list[TimelineSpan]:
        def build() -> list[TimelineSpan]:
            raw, dt = self._rank(rank).spans.get(it, []), self.offset(rank)
            return sorted((_span(s, rank, it, dt) for s in raw), key=_order)

        return self._memo(("spans", rank, it), self._stamp(rank, it), build)

    def at(self, t: float, iteration: int | None = None) -> dict[int, list[TimelineSpan]]:
        """What ran on each rank at aligned time ``t``."""
        return {
            r: [s for s in self.spans(r, iteration) if s.start <= t <= s.end] for r in self.ranks
        }

    # -- phases and order --------------------------------------------------------------------
    def phases(self, rank: int = 0, iteration: int = 1) -> dict[str, tuple[float, float]]:
        """``forward``: the root's span; ``backward``: its end to the first optimizer
        start (or the last end); ``optimizer``: first optimizer start to last end."""
        key, stamp = ("phases", rank, iteration), self._stamp(rank, iteration)
        return dict(self._memo(key, stamp, lambda: _phases(self._aligned(rank, iteration))))

    def order(
        self,
        rank: int = 0,
        iteration: int = 1,
        phase: str | None = "backward",
        kinds: Sequence[str] | None = None,
    ) -> list[str]:
        """Names of the spans that started in ``phase`` (None: the iteration), in order."""
        return [s.name for s in self._in_phase(rank, iteration, phase, _kinds(kinds))]

    def _in_phase(
        self, rank: int, it: int, phase: str | None, kinds: frozenset[str]
    ) -> list[TimelineSpan]:
        if phase is not None and phase not in PHASES:
            raise ValueError(f"phase {phase!r} is not one of {PHASES} or None")
        ph = self.phases(rank, it)
        spans = [s for s in self._aligned(rank, it) if s.kind in kinds]
        return spans if phase is None else [s for s in spans if _phase_of(s.start, ph) == phase]

    # -- overlap -----------------------------------------------------------------------------
    def overlap(self, rank: int = 0, iteration: int = 1, phase: str | None = "backward") -> float:
        """The share (0..1) of the time of the collectives that started in ``phase``
        (their union) during which compute ran: the iteration's leaf spans of kind
        forward / compiled_forward for ``"forward"``, backward / compiled_backward for
        ``"backward"``, any of the four otherwise. 0.0 without collectives."""
        comm, hidden = self._hidden(rank, iteration, phase)
        return hidden / comm if comm > 0 else 0.0

    def exposed(self, rank: int = 0, iteration: int = 1, phase: str | None = "backward") -> float:
        """Seconds of ``phase``'s collectives (their union) that no compute hid."""
        comm, hidden = self._hidden(rank, iteration, phase)
        return max(comm - hidden, 0.0)

    def overlaps(
        self, rank: int = 0, iteration: int = 1, phase: str | None = "backward"
    ) -> list[tuple[TimelineSpan, float]]:
        """Each collective of ``phase`` with the share of it that compute hid."""
        busy = self._compute(rank, iteration, phase)
        out: list[tuple[TimelineSpan, float]] = []
        for c in self._in_phase(rank, iteration, phase, frozenset({"collective"})):
            share = _covered([(c.start, c.end)], busy) / c.duration if c.duration > 0 else 0.0
            out.append((c, share))
        return out

    def _hidden(self, rank: int, it: int, phase: str | None) -> tuple[float, float]:
        def build() -> tuple[float, float]:
            spans = self._in_phase(rank, it, phase, frozenset({"collective"}))
            comm = union((s.start, s.end) for s in spans)
            busy = self._compute(rank, it, phase)
            return sum(b - a for a, b in comm), _covered(comm, busy)

        return self._memo(("hidden", rank, it, phase), self._stamp(rank, it), build)

    def _compute(self, rank: int, it: int, phase: str | None) -> list[tuple[float, float]]:
        """The union of the iteration's leaf compute spans of the kinds ``phase`` hides
        behind (a parent span is its children's time, not more compute)."""

        def build() -> list[tuple[float, float]]:
            kinds = _HIDES[phase]
            return union((s.start, s.end) for s in self._leaves(rank, it) if s.kind in kinds)

        return self._memo(("compute", rank, it, phase), self._stamp(rank, it), build)

    def _leaves(self, rank: int, it: int) -> list[TimelineSpan]:
        def build() -> list[TimelineSpan]:
            spans = sorted((s for s in self._aligned(rank, it) if s.kind in COMPUTE), key=_nest)
            return [s for i, s in enumerate(spans) if not _has_inner(spans, i)]

        return self._memo(("leaves", rank, it), self._stamp(rank, it), build)

    # -- across ranks ------------------------------------------------------------------------
    def collectives(self, iteration: int = 1) -> list[Matched]:
        """The iteration's collectives matched across ranks, by their first start."""
        self.update()
        out: list[Matched] = []
        for (group, op, k), by_rank in self._match(iteration).items():
            starts = {r: s.start + self.offset(r) for r, s in by_rank.items()}
            ends = {r: s.end + self.offset(r) for r, s in by_rank.items()}
            last = max(starts, key=lambda r: (starts[r], -r))
            first = by_rank[0] if 0 in by_rank else by_rank[min(by_rank)]
            waited = {r: starts[last] - t for r, t in starts.items()}
            out.append(Matched(k, op, group, _nbytes(first), starts, ends, last, waited))
        return sorted(out, key=lambda m: (min(m.starts.values()), m.op, m.index))

    def _match(self, it: int) -> dict[tuple[str, str, int], dict[int, Span]]:
        """(group, op, k) -> rank -> the k-th collective with that group and op."""

        def build() -> dict[tuple[str, str, int], dict[int, Span]]:
            out: dict[tuple[str, str, int], dict[int, Span]] = {}
            for r, here in sorted(self._ranks.items()):
                counts: dict[tuple[str, str], int] = {}
                mine = [s for s in here.spans.get(it, []) if s.kind == "collective"]
                for s in sorted(mine, key=lambda s: (s.start, s.end)):
                    key = (str(s.detail.get("group", "")), str(s.detail.get("op", s.name)))
                    k = counts[key] = counts.get(key, -1) + 1
                    out.setdefault((*key, k), {})[r] = s
            return out

        stamp = tuple((r, h.stamps.get(it)) for r, h in sorted(self._ranks.items()))
        return self._memo(("match", it), stamp, build)

    # -- conclusions -------------------------------------------------------------------------
    @property
    def findings(self) -> list[TimelineFinding]:
        """Iterations whose collectives all started after the backward's last compute
        ended (hooks bunched at the end: no overlap), merged over ranks."""
        self.update()
        hit = [
            (r, it)
            for r in sorted(self._ranks)
            for it in self.iterations(r)
            if self._bunched(r, it)
        ]
        if not hit:
            return []
        ranks, its = sorted({r for r, _ in hit}), sorted({i for _, i in hit})
        r, it = hit[0]
        message = (
            f"rank(s) {_listed(ranks)}, iteration(s) {_listed(its)}: every collective of the "
            "backward started after its last backward span ended, so none overlapped it "
            f"(rank {r}, iteration {it}: {self.exposed(r, it) * 1e3:.3g} ms exposed)"
        )
        return [TimelineFinding("bunched", ranks, its, message)]

    def _bunched(self, rank: int, it: int) -> bool:
        comm = self._in_phase(rank, it, "backward", frozenset({"collective"}))
        busy = self._in_phase(rank, it, "backward", BACKWARD)
        return bool(comm and busy) and min(c.start for c in comm) >= max(b.end for b in busy)

    # -- export ------------------------------------------------------------------------------
    def to_chrome_trace(self, path: str | pathlib.Path) -> pathlib.Path:
        """Write every rank's spans as Chrome Trace Event Format JSON (``chrome.py``) to
        ``path``, for ui.perfetto.dev or chrome://tracing; returns the path."""
        spans = [s for r in self.ranks for s in self.spans(r)]
        hosts = {str(r): w.host for r in self.ranks if (w := self.watch(r)) is not None}
        other = {"offsets_s": {str(r): self.offset(r) for r in self.ranks}, "hosts": hosts}
        trace = chrome_trace(spans, self.origin or 0.0, other)
        return write_chrome_trace(path, trace)

    # -- plumbing ----------------------------------------------------------------------------
    def _rank(self, rank: int) -> _Rank:
        self.update()
        return self._ranks.get(rank, _EMPTY)

    def _stamp(self, rank: int, it: int) -> tuple[int | None, float]:
        return self._rank(rank).stamps.get(it), self.offset(rank)

    def _memo(self, key: tuple[Any, ...], stamp: Any, build: Callable[[], T]) -> T:
        hit = self._cache.get(key)
        if hit is not None and hit[0] == stamp:
            return cast(T, hit[1])
        value = build()
        self._cache[key] = (stamp, value)
        return value

    def versus(self, other: TimelineModel, labels: tuple[str, str] = ("eager", "compiled")) -> Any:
        """This run and ``other`` (say eager and compiled) in one view, side by side,
        with a toggle for either alone: ``eager.timeline.versus(compiled.timeline)``."""
        view = features.feature_of_model(self).view  # the view module, as display loads it
        return features.load(view.replace(":TimelineView", ":versus"))(self, other, labels)

    def _view(self) -> Any:
        return features.feature_of_model(self).view_of(self)

    def __repr__(self) -> str:
        self.update()
        spans = sum(len(v) for r in self._ranks.values() for v in r.spans.values())
        return (
            f"TimelineModel(ranks={self.ranks}, iterations={len(self.iterations())}, "
            f"spans={spans}, skipped={self.skipped})"
        )


# -- pure helpers ----------------------------------------------------------------------------
def union(intervals: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    """Merge intervals into disjoint ones, ascending (empty ones dropped)."""
    out: list[tuple[float, float]] = []
    for a, b in sorted(i for i in intervals if i[1] > i[0]):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def _covered(xs: list[tuple[float, float]], ys: list[tuple[float, float]]) -> float:
    """Length of the intersection of two disjoint ascending interval lists."""
    total, i, j = 0.0, 0, 0
    while i < len(xs) and j < len(ys):
        lo, hi = max(xs[i][0], ys[j][0]), min(xs[i][1], ys[j][1])
        total += max(hi - lo, 0.0)
        if xs[i][1] < ys[j][1]:
            i += 1
        else:
            j += 1
    return total


def _has_inner(spans: list[TimelineSpan], i: int) -> bool:
    """Whether a span other than ``spans[i]``'s interval lies inside it (``spans`` sorted
    by start, longest first: only later ones can). Stops at the first: a parent's first
    child is found at once."""
    s = spans[i]
    for o in spans[i + 1 :]:
        if o.start > s.end:
            return False
        if o.end <= s.end and (o.start, o.end) != (s.start, s.end):
            return True
    return False


def _phases(spans: list[TimelineSpan]) -> dict[str, tuple[float, float]]:
    out: dict[str, tuple[float, float]] = {}
    root = next((s for s in spans if s.kind in FORWARD and s.name == ""), None)
    steps = [s for s in spans if s.kind == "optimizer"]
    if root is not None:
        out["forward"] = (root.start, root.end)
        end = steps[0].start if steps else max(s.end for s in spans)
        out["backward"] = (root.end, max(end, root.end))
    if steps:
        out["optimizer"] = (steps[0].start, max(s.end for s in steps))
    return out


def _phase_of(t: float, phases: dict[str, tuple[float, float]]) -> str | None:
    """The phase a span starting at ``t`` belongs to (half-open: the optimizer's start
    belongs to the optimizer, the forward's end to the backward)."""
    step, back, fwd = phases.get("optimizer"), phases.get("backward"), phases.get("forward")
    if step is not None and t >= step[0]:
        return "optimizer"
    if back is not None and t >= back[0]:
        return "backward"
    if fwd is not None and fwd[0] <= t < fwd[1]:
        return "forward"
    return None


def _kinds(kinds: Sequence[str] | None) -> frozenset[str]:
    if kinds is None:
        return frozenset(KINDS)
    wanted = frozenset([kinds] if isinstance(kinds, str) else kinds)
    if not wanted <= frozenset(KINDS):
        raise ValueError(f"unknown span kinds {sorted(wanted - set(KINDS))}; kinds are {KINDS}")
    return wanted


def _span(s: Span, rank: int, it: int, dt: float) -> TimelineSpan:
    return TimelineSpan(
        kind=s.kind,
        name=s.name,
        start=s.start + dt,
        end=s.end + dt,
        rank=rank,
        iteration=it,
        detail=s.detail,
    )


def _nbytes(s: Span) -> int:
    n = s.detail.get("nbytes", s.detail.get("bytes", 0))
    return n if isinstance(n, int) and not isinstance(n, bool) else 0


def _order(s: TimelineSpan) -> tuple[float, float]:
    return s.start, s.end


def _nest(s: TimelineSpan) -> tuple[float, float]:
    return s.start, -s.end


def _listed(xs: list[int]) -> str:
    return ", ".join(map(str, xs))


_EMPTY = _Rank()
_DECODE: dict[str, type[Any]] = {
    TimelineWatch.KIND: TimelineWatch,
    TimelineSpans.KIND: TimelineSpans,
}
