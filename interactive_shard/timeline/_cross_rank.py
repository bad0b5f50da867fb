"""What the timeline model works out across ranks and iterations: collectives matched
across ranks, a rank's clock offset from rank 0's, the "bunched" finding's words, and
the sample of a long run's iterations that overviews draw. Pure functions of what the
model passes in (its index, and a function that reads one decoded iteration).
"""

from __future__ import annotations

import statistics
from bisect import bisect_left
from collections.abc import Callable, Iterable, Sequence

from interactive_shard.timeline._iteration import COLLECTIVE, Iteration
from interactive_shard.timeline._ranks import RankEvents
from interactive_shard.timeline._results import TimelineFinding
from interactive_shard.timeline.events import Span

ALIGN_SAMPLES = 64  # collectives a rank on another host is aligned by ...
ALIGN_ITERATIONS = 256  # ... found in at most this many of its first shared iterations
STRIDES = (1, 2, 5)  # a sample's strides: 1, 2, 5, 10, 20, 50, ...
Matches = dict[tuple[str, str, int], dict[int, Span]]


def match(ranks: Iterable[int], read: Callable[[int], Iteration]) -> Matches:
    """(group, op, k) -> rank -> the k-th collective of the iteration (``read(rank)``)
    with that group and op on the rank, by start (then end)."""
    out: Matches = {}
    for r in sorted(ranks):
        counts: dict[tuple[str, str], int] = {}
        found = read(r)
        for i in found.indices(None, COLLECTIVE):
            s = found.spans[i]
            key = (str(s.detail.get("group", "")), str(s.detail.get("op", s.name)))
            k = counts[key] = counts.get(key, -1) + 1
            out.setdefault((*key, k), {})[r] = s
    return out


class Offsets:
    """Each rank's offset from rank 0's clock: the median, over the collectives it shares
    with rank 0 in their first shared iterations (at most ``ALIGN_SAMPLES`` collectives
    in ``ALIGN_ITERATIONS`` iterations), of rank 0's end minus its own. Measured again
    at most once per model revision, and not at all once it has its samples from
    iterations that did not change since: a long run's cached spans stay aligned."""

    def __init__(self) -> None:
        self._known: dict[int, tuple[int, tuple[tuple[int, object, object], ...], bool, float]]
        self._known = {}

    def get(
        self,
        rank: int,
        revision: int,
        here: RankEvents,
        zero: RankEvents,
        matches: Callable[[int], Matches],
    ) -> float:
        known = self._known.get(rank)
        if known is not None and known[0] == revision:
            return known[3]
        if known is not None and known[2] and known[1] == _stamps(known[1], here, zero):
            self._known[rank] = (revision, *known[1:])
            return known[3]
        walked: list[tuple[int, object, object]] = []
        diffs: list[float] = []
        for it in here.iterations():
            if not zero.has(it):
                continue
            walked.append((it, zero.stamp(it), here.stamp(it)))
            diffs += [m[0].end - m[rank].end for m in matches(it).values() if 0 in m and rank in m]
            if len(diffs) >= ALIGN_SAMPLES or len(walked) >= ALIGN_ITERATIONS:
                break
        value = statistics.median(diffs) if diffs else 0.0
        settled = len(diffs) >= ALIGN_SAMPLES or len(walked) >= ALIGN_ITERATIONS
        self._known[rank] = (revision, tuple(walked), settled, value)
        return value


def _stamps(
    walked: tuple[tuple[int, object, object], ...], here: RankEvents, zero: RankEvents
) -> tuple[tuple[int, object, object], ...]:
    return tuple((it, zero.stamp(it), here.stamp(it)) for it, _, _ in walked)


def bunched(hit: list[tuple[int, int]], exposed: Callable[[int, int], float]) -> TimelineFinding:
    """The finding for the (rank, iteration)s ``hit`` whose collectives were bunched."""
    ranks, its = sorted({r for r, _ in hit}), sorted({i for _, i in hit})
    r, it = hit[0]
    message = (
        f"rank(s) {listed(ranks)}, iteration(s) {listed(its)}: every collective of the "
        "backward started after its last backward span ended, so none overlapped it "
        f"(rank {r}, iteration {it}: {exposed(r, it) * 1e3:.3g} ms exposed)"
    )
    return TimelineFinding("bunched", ranks, its, message)


def listed(xs: list[int]) -> str:
    """``0, 1, 4–9``: ascending numbers, runs of three or more as ranges (a long run's
    finding may name 10k iterations)."""
    parts: list[str] = []
    start = 0
    for i in range(1, len(xs) + 1):
        if i == len(xs) or xs[i] != xs[i - 1] + 1:
            run = xs[start:i]
            parts += [f"{run[0]}–{run[-1]}"] if len(run) >= 3 else [str(x) for x in run]
            start = i
    return ", ".join(parts)


def sample(its: list[int], most: int, keep: Iterable[int | None]) -> tuple[list[int], int]:
    """At most about ``most`` of ``its`` (ascending), and the stride (see
    ``TimelineModel.sample``)."""
    stride, k = 1, 0
    while len(its) > most * stride:
        k += 1
        stride = STRIDES[k % 3] * 10 ** (k // 3)
    if stride == 1:
        return list(its), 1
    chosen = {*its[::stride], its[-1]}
    chosen.update(x for x in keep if x is not None and contains(its, x))
    return sorted(chosen), stride


def contains(items: Sequence[int], x: int) -> bool:
    """``x in items`` for an ascending list, by bisection."""
    i = bisect_left(items, x)
    return i < len(items) and items[i] == x
