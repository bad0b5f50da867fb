"""TimelineModel: every rank's spans on one time axis, with phases, order and overlap.

Consumes the ``timeline_*`` events of a ``RunStore`` (``events.py``, ``docs/events.md``)
with a cursor, so it serves a live run and a loaded recording alike. An update only
files each new batch under its (rank, iteration), undecoded (``_index.py``): it costs
what arrived, not the run's length. An iteration is decoded when something asks for it,
and what is derived from it (``_iteration.py``: phases, order, overlap) is cached under
a stamp of its data, so a redraw recomputes only what changed; decoded iterations are
kept for the ``CACHED_ITERATIONS`` most recently used, the small per-iteration summary
(``summary``) for every iteration read.

Spans are kept as the rank sent them (its own clock) and aligned on demand: ranks on
rank 0's host share its clock (offset 0); a rank on another host is shifted by the
median, over the collectives it shares with rank 0 in their first shared iterations, of
rank 0's end minus its own (a collective completes nearly at once everywhere). No
widgets, no torch.
"""

from __future__ import annotations

import logging
import pathlib
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

from interactive_shard import features
from interactive_shard.telemetry.consume import Cursor
from interactive_shard.telemetry.store import RunStore
from interactive_shard.timeline._cross_rank import Matches, Offsets, bunched, match, sample
from interactive_shard.timeline._decoding import CACHED_ITERATIONS, Decoded, Decoder, Memo
from interactive_shard.timeline._index import Index
from interactive_shard.timeline._iteration import (
    BACKWARD,
    COLLECTIVE,
    COMPUTE,
    FORWARD,
    PHASES,
    Iteration,
    union,
)
from interactive_shard.timeline._ranks import RankEvents
from interactive_shard.timeline._results import (
    Malformed,
    Matched,
    Summary,
    TimelineFinding,
    TimelineSpan,
)
from interactive_shard.timeline.chrome import chrome_trace, write_chrome_trace
from interactive_shard.timeline.events import KINDS, Span, TimelineSpans, TimelineWatch
from interactive_shard.ui.live import ShowsView

__all__ = [
    "BACKWARD",
    "CACHED_ITERATIONS",
    "COMPUTE",
    "FORWARD",
    "PHASES",
    "Malformed",
    "Matched",
    "Summary",
    "TimelineFinding",
    "TimelineModel",
    "TimelineSpan",
    "union",
]

log = logging.getLogger(__name__)
T = TypeVar("T")


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
        self._index = Index(store, self._events.decode)
        self._decoder = Decoder(self._events)
        self._summaries: dict[tuple[int, int], tuple[tuple[int, int], Summary]] = {}
        self._memo = Memo()
        self._offsets = Offsets()

    # -- consuming events --------------------------------------------------------------------
    def update(self) -> bool:
        """File new events (decoded when read); True when timeline data changed."""
        if self._index.position == self.store.version:
            return False  # nothing at all arrived: no lock, no lookup
        changed = self._index.update()
        if changed:
            self.revision += 1
        return changed

    @property
    def skipped(self) -> int:
        """Events (or records in them) that could not be read: logged, not kept. A batch
        is read when its iteration first is, so this counts what was read so far."""
        return self._events.skipped

    # -- what arrived ------------------------------------------------------------------------
    @property
    def ranks(self) -> list[int]:
        self.update()
        return sorted(self._index.ranks)

    def iterations(self, rank: int | None = None) -> list[int]:
        """Iterations with a batch of spans on ``rank`` (None: on any rank), ascending."""
        return list(self._iterations(rank))

    def _iterations(self, rank: int | None) -> list[int]:
        """``iterations(rank)`` without the copy (callers do not change it)."""
        self.update()
        if rank is not None:
            return self._rank(rank).iterations()
        return self._index.iterations()

    def latest(self, rank: int | None = None) -> int | None:
        its = self._iterations(rank)
        return its[-1] if its else None

    def earliest(self, rank: int | None = None) -> int | None:
        its = self._iterations(rank)
        return its[0] if its else None

    def recent(self, n: int, rank: int | None = None) -> list[int]:
        """The latest ``n`` of ``iterations(rank)``, ascending."""
        return self._iterations(rank)[-n:] if n > 0 else []

    def count(self, rank: int | None = None) -> int:
        """``len(iterations(rank))`` without the list (a long run has 10k+)."""
        return len(self._iterations(rank))

    def has(self, rank: int, iteration: int) -> bool:
        """Whether ``rank`` sent a batch of ``iteration``."""
        return self._rank(rank).has(iteration)

    def sample(
        self, most: int, keep: Iterable[int | None] = (), rank: int | None = None
    ) -> tuple[list[int], int]:
        """At most about ``most`` of ``iterations(rank)``: every ``stride``-th, the
        stride the smallest of 1, 2, 5, 10, 20, 50... that fits, plus the latest and
        those of ``keep`` that arrived (a selected iteration stays exact); and the
        stride (1: every one). By position and from a fixed ladder: while a run grows
        the sample stays the same until the stride steps up, so what was read stays
        cached. What overviews of a long run draw."""
        return sample(self._iterations(rank), most, keep)

    def watch(self, rank: int = 0) -> TimelineWatch | None:
        return self._rank(rank).watch

    # -- alignment ---------------------------------------------------------------------------
    def offset(self, rank: int) -> float:
        """Seconds added to ``rank``'s times to put them on rank 0's clock: the median
        over the collectives shared with rank 0 (at most ``ALIGN_SAMPLES``, in their
        first ``ALIGN_ITERATIONS`` shared iterations) of rank 0's end minus its own."""
        here, zero = self._rank(rank), self._rank(0)
        if rank == 0 or here.watch is None or zero.watch is None:
            return 0.0  # no host to tell otherwise: the common case, one machine
        if here.watch.host == zero.watch.host:
            return 0.0
        return self._offsets.get(rank, self.revision, here, zero, self._match)

    @property
    def origin(self) -> float | None:
        """The earliest aligned start of the spans of each rank's first iteration (a
        rank's iterations come in time order; views plot relative to it)."""
        self.update()
        return self._remember(("origin",), self.revision, self._origin)

    def _origin(self) -> float | None:
        firsts = []
        # A snapshot: offset() reads the store again (update), which may file new ranks.
        for rank, here in list(self._index.ranks.items()):
            for it in here.iterations():
                first = self._decode(rank, it).iteration.first
                if first is not None:
                    firsts.append(first + self.offset(rank))
                    break
        return min(firsts, default=None)

    # -- spans -------------------------------------------------------------------------------
    def spans(
        self, rank: int = 0, iteration: int | None = None, kinds: Sequence[str] | None = None
    ) -> list[TimelineSpan]:
        """``rank``'s spans of ``iteration`` (None: all), aligned, by start (then end)."""
        wanted = _kinds(kinds)
        its = self._iterations(rank) if iteration is None else [iteration]
        out = [s for it in its for s in self._aligned(rank, it) if s.kind in wanted]
        return out if len(its) == 1 else sorted(out, key=_order)

    def _aligned(self, rank: int, it: int) -> list[TimelineSpan]:
        dt = self.offset(rank)
        found = self._decode(rank, it)
        if found.aligned is None or found.aligned[0] != dt:
            spans = [_span(s, rank, it, dt) for s in found.iteration.spans]
            found.aligned = (dt, spans)
        return found.aligned[1]

    def at(self, t: float, iteration: int | None = None) -> dict[int, list[TimelineSpan]]:
        """What ran on each rank at aligned time ``t`` (in ``iteration``; None: reads
        every iteration)."""
        return {
            r: [s for s in self.spans(r, iteration) if s.start <= t <= s.end] for r in self.ranks
        }

    # -- phases and order --------------------------------------------------------------------
    def phases(self, rank: int = 0, iteration: int = 1) -> dict[str, tuple[float, float]]:
        """``forward``: the root's span; ``backward``: its end to the first optimizer
        start (or the last end); ``optimizer``: first optimizer start to last end."""
        found, dt = self._iteration(rank, iteration).phases, self.offset(rank)
        return {k: (a + dt, b + dt) for k, (a, b) in found.items()} if dt else dict(found)

    def order(
        self,
        rank: int = 0,
        iteration: int = 1,
        phase: str | None = "backward",
        kinds: Sequence[str] | None = None,
    ) -> list[str]:
        """Names of the spans that started in ``phase`` (None: the iteration), in order."""
        _check(phase)
        found = self._iteration(rank, iteration)
        return [found.spans[i].name for i in found.indices(phase, _kinds(kinds))]

    # -- overlap -----------------------------------------------------------------------------
    def overlap(self, rank: int = 0, iteration: int = 1, phase: str | None = "backward") -> float:
        """The share (0..1) of the time of the collectives that started in ``phase``
        (their union) during which compute ran: the iteration's leaf spans of kind
        forward / compiled_forward for ``"forward"``, backward / compiled_backward for
        ``"backward"``, any of the four otherwise. 0.0 without collectives."""
        if phase == "backward":
            return self.summary(rank, iteration).overlap
        comm, hidden = self._hidden(rank, iteration, phase)
        return hidden / comm if comm > 0 else 0.0

    def exposed(self, rank: int = 0, iteration: int = 1, phase: str | None = "backward") -> float:
        """Seconds of ``phase``'s collectives (their union) that no compute hid."""
        if phase == "backward":
            return self.summary(rank, iteration).exposed
        comm, hidden = self._hidden(rank, iteration, phase)
        return max(comm - hidden, 0.0)

    def overlaps(
        self, rank: int = 0, iteration: int = 1, phase: str | None = "backward"
    ) -> list[tuple[TimelineSpan, float]]:
        """Each collective of ``phase`` with the share of it that compute hid."""
        _check(phase)
        found, aligned = self._iteration(rank, iteration), self._aligned(rank, iteration)
        return [(aligned[i], share) for i, share in found.shares(phase)]

    def summary(self, rank: int = 0, iteration: int = 1) -> Summary:
        """The backward of one (rank, iteration) in numbers: what ``overlap``,
        ``exposed`` and ``findings`` read, kept for every iteration read (a redraw of
        an overview of 10k iterations reads them, not the spans)."""
        here = self._rank(rank)
        stamp = here.stamp(iteration)
        known = self._summaries.get((rank, iteration))
        if known is not None and known[0] == stamp:
            return known[1]
        found = self._iteration(rank, iteration)
        comm, hidden = found.hidden("backward")
        result = Summary(
            collectives=len(found.indices("backward", COLLECTIVE)),
            overlap=hidden / comm if comm > 0 else 0.0,
            exposed=max(comm - hidden, 0.0),
            bunched=found.bunched(),
        )
        self._summaries[(rank, iteration)] = (stamp, result)
        return result

    def _hidden(self, rank: int, it: int, phase: str | None) -> tuple[float, float]:
        _check(phase)
        return self._iteration(rank, it).hidden(phase)

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

    def _match(self, it: int) -> Matches:
        """(group, op, k) -> rank -> the k-th collective with that group and op."""

        stamp = tuple((r, h.stamp(it)) for r, h in sorted(self._index.ranks.items()))
        read = lambda r: self._iteration(r, it)  # noqa: E731
        return self._remember(("match", it), stamp, lambda: match(self._index.ranks, read))

    # -- conclusions -------------------------------------------------------------------------
    @property
    def findings(self) -> list[TimelineFinding]:
        """Iterations whose collectives all started after the backward's last compute
        ended (hooks bunched at the end: no overlap), merged over ranks. Reads every
        iteration once (then its ``summary``): ``findings_of`` reads a few."""
        self.update()
        return self._remember(("findings",), self.revision, lambda: self.findings_of(None))

    def findings_of(self, iterations: Iterable[int] | None) -> list[TimelineFinding]:
        """``findings`` over ``iterations`` only (None: every one); a view of a long
        run checks the latest few."""
        ranks = self.ranks
        chosen = None if iterations is None else sorted(set(iterations))
        hit = [
            (r, it)
            for r in ranks
            for it in (self._iterations(r) if chosen is None else chosen)
            if self._index.ranks[r].has(it) and self.summary(r, it).bunched
        ]
        return [bunched(hit, self.exposed)] if hit else []

    # -- export ------------------------------------------------------------------------------
    def to_chrome_trace(
        self, path: str | pathlib.Path, iterations: Iterable[int] | None = None
    ) -> pathlib.Path:
        """Write every rank's spans (of ``iterations``; None: of every one) as Chrome
        Trace Event Format JSON (``chrome.py``) to ``path``, for ui.perfetto.dev or
        chrome://tracing; returns the path. A long run's trace is large: pass a range,
        e.g. ``iterations=range(100, 110)``."""
        chosen = None if iterations is None else sorted(set(iterations))
        spans = [
            s
            for r in self.ranks
            for it in (self._iterations(r) if chosen is None else chosen)
            for s in self._aligned(r, it)
        ]
        hosts = {str(r): w.host for r in self.ranks if (w := self.watch(r)) is not None}
        other = {"offsets_s": {str(r): self.offset(r) for r in self.ranks}, "hosts": hosts}
        origin = self.origin if chosen is None else min((s.start for s in spans), default=None)
        trace = chrome_trace(spans, origin or 0.0, other)
        return write_chrome_trace(path, trace)

    # -- decoding ----------------------------------------------------------------------------
    def _iteration(self, rank: int, it: int) -> Iteration:
        self.update()
        return self._decode(rank, it).iteration

    def _decode(self, rank: int, it: int) -> Decoded:
        return self._decoder.get(self._index.ranks.get(rank, _EMPTY), rank, it)

    # -- plumbing ----------------------------------------------------------------------------
    def _rank(self, rank: int) -> RankEvents:
        self.update()
        return self._index.ranks.get(rank, _EMPTY)

    def _remember(self, key: tuple[Any, ...], stamp: Any, build: Callable[[], T]) -> T:
        return self._memo.get(key, stamp, build)

    def versus(self, other: TimelineModel, labels: tuple[str, str] = ("eager", "compiled")) -> Any:
        """This run and ``other`` (say eager and compiled) in one view, side by side,
        with a toggle for either alone: ``eager.timeline.versus(compiled.timeline)``."""
        view = features.feature_of_model(self).view  # the view module, as display loads it
        return features.load(view.replace(":TimelineView", ":versus"))(self, other, labels)

    def __repr__(self) -> str:
        self.update()
        spans = sum(r.spans for r in self._index.ranks.values())
        return (
            f"TimelineModel(ranks={self.ranks}, iterations={len(self._iterations(None))}, "
            f"spans={spans}, skipped={self.skipped})"
        )


# -- pure helpers ----------------------------------------------------------------------------
def _check(phase: str | None) -> None:
    if phase is not None and phase not in PHASES:
        raise ValueError(f"phase {phase!r} is not one of {PHASES} or None")


def _kinds(kinds: Sequence[str] | None) -> frozenset[str]:
    if kinds is None:
        return _ALL_KINDS
    wanted = frozenset([kinds] if isinstance(kinds, str) else kinds)
    if not wanted <= _ALL_KINDS:
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


_ALL_KINDS = frozenset(KINDS)
_EMPTY = RankEvents()
_DECODE: dict[str, type[Any]] = {
    TimelineWatch.KIND: TimelineWatch,
    TimelineSpans.KIND: TimelineSpans,
}
