"""One rank's spans of one iteration, and what the model derives from them: phases, the
phase of every span, the leaf compute that hides collectives, overlap, "bunched".

All on the rank's own clock: the model aligns a rank by adding one offset to every one
of its times, which moves none of a span relative to another, so none of these results
depend on it (``TimelineModel`` adds the offset to the times it returns). Pure: no
store, no widgets.
"""

from __future__ import annotations

import operator
from collections.abc import Iterable, Sequence
from typing import Any

from interactive_shard.timeline.events import Span

FORWARD = frozenset({"forward", "compiled_forward"})
BACKWARD = frozenset({"backward", "compiled_backward"})
COMPUTE = FORWARD | BACKWARD
COLLECTIVE = frozenset({"collective"})
PHASES = ("forward", "backward", "optimizer")
# Compute a phase's collectives may hide behind (None: the whole iteration).
HIDES: dict[str | None, frozenset[str]] = {
    "forward": FORWARD,
    "backward": BACKWARD,
    "optimizer": COMPUTE,
    None: COMPUTE,
}
_ORDER = operator.attrgetter("start", "end")


class Iteration:
    """The spans of one (rank, iteration), sorted by start (then end), with their phases.

    Built once per batch that arrives for it (the model caches it under the iteration's
    stamp); every result below is computed on first use and kept."""

    __slots__ = ("_memo", "phase", "phases", "spans")

    def __init__(self, spans: Iterable[Span]) -> None:
        self.spans: list[Span] = sorted(spans, key=_ORDER)
        self.phases = phases_of(self.spans)
        self.phase: list[str | None] = [phase_of(s.start, self.phases) for s in self.spans]
        self._memo: dict[Any, Any] = {}

    def indices(self, phase: str | None, kinds: frozenset[str]) -> list[int]:
        """Positions (in ``spans``) of the spans of ``kinds`` that started in ``phase``
        (None: anywhere in the iteration)."""
        spans, where = self.spans, self.phase
        if phase is None:
            return [i for i, s in enumerate(spans) if s.kind in kinds]
        return [i for i, s in enumerate(spans) if s.kind in kinds and where[i] == phase]

    def leaves(self) -> list[Span]:
        """The compute spans with no other compute span inside (a parent span is its
        children's time, not more compute)."""
        if "leaves" not in self._memo:
            nested = sorted((s for s in self.spans if s.kind in COMPUTE), key=_nest)
            self._memo["leaves"] = [s for i, s in enumerate(nested) if not _has_inner(nested, i)]
        leaves: list[Span] = self._memo["leaves"]
        return leaves

    def compute(self, phase: str | None) -> list[tuple[float, float]]:
        """The union of the leaf compute spans of the kinds ``phase`` hides behind."""
        key = ("compute", phase)
        if key not in self._memo:
            kinds = HIDES[phase]
            self._memo[key] = union((s.start, s.end) for s in self.leaves() if s.kind in kinds)
        busy: list[tuple[float, float]] = self._memo[key]
        return busy

    def hidden(self, phase: str | None) -> tuple[float, float]:
        """Seconds of ``phase``'s collectives (their union), and of those hidden under
        compute."""
        key = ("hidden", phase)
        if key not in self._memo:
            comm = union(
                (self.spans[i].start, self.spans[i].end) for i in self.indices(phase, COLLECTIVE)
            )
            self._memo[key] = (sum(b - a for a, b in comm), covered(comm, self.compute(phase)))
        result: tuple[float, float] = self._memo[key]
        return result

    def shares(self, phase: str | None) -> list[tuple[int, float]]:
        """Each collective of ``phase`` (its position in ``spans``) with the share of it
        that compute hid."""
        busy = self.compute(phase)
        out: list[tuple[int, float]] = []
        for i in self.indices(phase, COLLECTIVE):
            c = self.spans[i]
            length = c.end - c.start
            out.append((i, covered([(c.start, c.end)], busy) / length if length > 0 else 0.0))
        return out

    def bunched(self) -> bool:
        """Whether every collective of the backward started after its last backward span
        ended (hooks bunched at the end: nothing overlapped)."""
        if "bunched" not in self._memo:
            comm = self.indices("backward", COLLECTIVE)
            busy = self.indices("backward", BACKWARD)
            self._memo["bunched"] = bool(comm and busy) and min(
                self.spans[i].start for i in comm
            ) >= max(self.spans[i].end for i in busy)
        bunched: bool = self._memo["bunched"]
        return bunched

    @property
    def first(self) -> float | None:
        """The earliest start (None: no spans)."""
        return self.spans[0].start if self.spans else None


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


def covered(xs: Sequence[tuple[float, float]], ys: Sequence[tuple[float, float]]) -> float:
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


def phases_of(spans: Sequence[Span]) -> dict[str, tuple[float, float]]:
    """``forward``: the root's span; ``backward``: its end to the first optimizer start
    (or the last end); ``optimizer``: first optimizer start to last end. ``spans`` sorted
    by start."""
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


def phase_of(t: float, phases: dict[str, tuple[float, float]]) -> str | None:
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


def _has_inner(spans: list[Span], i: int) -> bool:
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


def _nest(s: Span) -> tuple[float, float]:
    return s.start, -s.end
