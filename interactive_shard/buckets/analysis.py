"""What the bucket map concludes: health findings, planned-vs-observed, overlap timing.

Pure functions over the records in ``records.py`` and the planner's ``Bucket``; the
``BucketMap`` model calls them and caches the results.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from interactive_shard.buckets.plan import Bucket
from interactive_shard.buckets.records import IterationRecord, ObservedBucket, WatchInfo

UNREADY = "unready"
DIVERGENCE = "divergence"
# Reduced gradients are bit-identical on every rank; a relative tolerance this tight only
# forgives a checksum printed through a different float path, never a real difference.
CHECKSUM_REL_TOL = 1e-9


@dataclass(frozen=True)
class Finding:
    """Something wrong (or worth knowing) about one iteration, in plain words."""

    kind: str  # "unready" | "divergence"
    iteration: int
    ranks: list[int]
    fqns: list[str]
    message: str


def _names(fqns: Sequence[str], limit: int = 6) -> str:
    shown = ", ".join(fqns[:limit])
    return shown + (f" and {len(fqns) - limit} more" if len(fqns) > limit else "")


def _ranks(ranks: Sequence[int]) -> str:
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    return f"ranks {', '.join(map(str, ranks[:-1]))} and {ranks[-1]}"


def reduction_unfinished(info: WatchInfo | None) -> bool:
    """True when a parameter without gradient stops DDP from finishing the reduction."""
    return info is None or not (info.find_unused_parameters or info.static_graph)


def unready_finding(
    iteration: int, per_rank: Mapping[int, Sequence[str]], info: WatchInfo | None
) -> Finding | None:
    """One finding for the parameters whose gradient never became ready this iteration."""
    ranks = sorted(r for r, fqns in per_rank.items() if fqns)
    if not ranks:
        return None
    seen = {f for r in ranks for f in per_rank[r]}
    order = info.fqns if info is not None else sorted(seen)
    fqns = [f for f in order if f in seen] + sorted(seen - set(order))
    head = (
        f"Iteration {iteration}: {len(fqns)} parameter(s) got no gradient on {_ranks(ranks)}: "
        f"{_names(fqns)}. "
    )
    if not reduction_unfinished(info):
        how = "find_unused_parameters=True" if info and info.find_unused_parameters else ""
        how = how or "static_graph=True"
        tail = (
            f"DDP was built with {how}, so it marks them ready itself and training goes "
            "on. If they are never used, freeze or remove them: find_unused_parameters "
            "walks the autograd graph every iteration, which costs time."
        )
    else:
        tail = (
            "DDP waits for every parameter's gradient before it can finish the reduction, so "
            "the next forward fails with 'Expected to have finished reduction in the prior "
            "iteration before starting a new one', and until then every rank keeps its own "
            "local gradients. Fix: use these parameters in the forward (so they get a "
            "gradient), freeze them (requires_grad=False), or pass "
            "find_unused_parameters=True to DDP."
        )
    return Finding(UNREADY, iteration, ranks, fqns, head + tail)


def _same(a: float | None, b: float | None) -> bool:
    if a is None or b is None:
        return a is b
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return math.isclose(a, b, rel_tol=CHECKSUM_REL_TOL, abs_tol=0.0)


def divergence_finding(
    iteration: int,
    per_rank: Mapping[int, Mapping[str, float]],
    order: Sequence[str],
    repeated: Collection[str] = (),
) -> Finding | None:
    """Parameters whose reduced gradient differs across ranks (it must not, after DDP)."""
    ranks = sorted(per_rank)
    if len(ranks) < 2:
        return None
    names = set().union(*(set(c) for c in per_rank.values()))
    if not names:  # checksums "off"
        return None
    position = {f: i for i, f in enumerate(order)}
    diverged: list[str] = []
    odd: set[int] = set()
    for fqn in sorted(names, key=lambda f: (position.get(f, len(position)), f)):
        values = {r: per_rank[r].get(fqn) for r in ranks}
        groups: list[list[int]] = []  # ranks with equal checksums, first-seen order
        for r in ranks:
            for g in groups:
                if _same(values[g[0]], values[r]):
                    g.append(r)
                    break
            else:
                groups.append([r])
        if len(groups) == 1:
            continue
        diverged.append(fqn)
        biggest = max(groups, key=len)
        if 2 * len(biggest) > len(ranks):  # a strict majority agrees: blame the rest
            odd.update(r for g in groups if g is not biggest for r in g)
        else:
            odd.update(ranks)
    if not diverged:
        return None
    message = (
        f"Iteration {iteration}: after DDP's all-reduce, {len(diverged)} parameter(s) hold "
        f"different gradients on {_ranks(sorted(odd))}: {_names(diverged)}. "
        "DDP averages each gradient once, so every rank should hold the same values; the "
        "replicas will now drift apart. Likely causes: reentrant activation checkpointing "
        "(a gradient hook firing twice) without static_graph=True; code that depends on the "
        "rank (a different model path or parameter use per rank); or gradients changed "
        "outside DDP (non-deterministic ops, clipping or hooks applied after the reduction "
        "on only some ranks)."
    )
    twice = [f for f in diverged if f in repeated]
    if twice:
        message += (
            f" Here {_names(twice)} got a gradient twice in one backward, the signature of "
            "reentrant checkpointing: pass static_graph=True to DDP or use "
            "checkpoint(..., use_reentrant=False)."
        )
    return Finding(DIVERGENCE, iteration, sorted(odd), diverged, message)


def grouped(findings: Sequence[Finding]) -> list[tuple[Finding, list[int]]]:
    """The same finding over several iterations (an unused head: every iteration) once:
    ``(first finding, its iterations)`` per kind, ranks and parameters, in first order."""
    groups: dict[tuple[Any, ...], tuple[Finding, list[int]]] = {}
    for f in findings:
        key = (f.kind, tuple(f.ranks), tuple(f.fqns))
        if key in groups:
            groups[key][1].append(f.iteration)
        else:
            groups[key] = (f, [f.iteration])
    return list(groups.values())


def span(iterations: Sequence[int]) -> str:
    """[1, 2, 3, 7] -> "1-3, 7"."""
    runs: list[list[int]] = []
    for it in iterations:
        if runs and it == runs[-1][-1] + 1:
            runs[-1].append(it)
        else:
            runs.append([it])
    return ", ".join(f"{r[0]}-{r[-1]}" if len(r) > 1 else str(r[0]) for r in runs)


# -- planned vs observed -----------------------------------------------------------------------
@dataclass(frozen=True)
class Comparison:
    """Planned and observed buckets of one iteration on one rank, and where they differ."""

    iteration: int
    rank: int
    planned: list[Bucket]
    observed: list[ObservedBucket]
    moved: list[str]  # in a different bucket than planned (or missing on one side)
    reordered: list[int]  # bucket indices holding the planned parameters in another order

    @property
    def bucket_counts(self) -> tuple[int, int]:
        """(planned, observed)."""
        return len(self.planned), len(self.observed)

    @property
    def matches(self) -> bool:
        """True when every bucket holds the planned parameters in the planned order."""
        return [b.fqns for b in self.planned] == [b.fqns for b in self.observed]

    @property
    def summary(self) -> str:
        """The differences in one short line, without names (for a figure title)."""
        return "; ".join(self._differences(named=False)) or "same buckets as planned"

    @property
    def differences(self) -> list[str]:
        """Plain-words list of what differs (empty when the plan matches)."""
        return self._differences(named=True)

    def _differences(self, *, named: bool) -> list[str]:
        out = []
        n_planned, n_observed = self.bucket_counts
        if n_planned != n_observed:
            out.append(f"{n_observed} bucket(s) observed, {n_planned} planned")
        if self.moved:
            which = f": {_names(self.moved)}" if named else ""
            out.append(f"{len(self.moved)} parameter(s) in another bucket{which}")
        if self.reordered and named:
            which = ", ".join(map(str, self.reordered))
            out.append(f"bucket(s) {which}: same parameters, another order")
        elif self.reordered:
            out.append(f"{len(self.reordered)} bucket(s) in another order")
        return out


def compare(
    iteration: int, rank: int, planned: list[Bucket], observed: list[ObservedBucket]
) -> Comparison:
    where_planned = {f: b.index for b in planned for f in b.fqns}
    where_observed = {f: b.index for b in observed for f in b.fqns}
    names = list(where_planned) + [f for f in where_observed if f not in where_planned]
    moved = [f for f in names if where_planned.get(f) != where_observed.get(f)]
    by_index = {b.index: b for b in observed}
    reordered = [
        b.index
        for b in planned
        if b.index in by_index
        and by_index[b.index].fqns != b.fqns
        and Counter(by_index[b.index].fqns) == Counter(b.fqns)
    ]
    return Comparison(iteration, rank, planned, observed, moved, reordered)


# -- timeline ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class BucketTiming:
    """One bucket's reduction, in seconds from the start of backward."""

    index: int
    nbytes: int
    fqns: list[str]
    ready: float
    start: float
    end: float | None  # None: not recorded (the all-reduce had not finished when sent)
    overlap: float  # part of [start, end] inside the backward window

    @property
    def duration(self) -> float:
        return 0.0 if self.end is None else max(self.end - self.start, 0.0)


@dataclass(frozen=True)
class Timeline:
    """Backward window and bucket reductions of one iteration on one rank.

    ``overlap_fraction`` is the share of communication time hidden behind backward
    compute: the union of the reduction intervals, intersected with the backward window,
    over that union (reductions can overlap each other, so a plain sum would count
    shared time twice). ``approximate`` says the window was guessed from bucket ready
    times because the iteration's ``ddp_iteration`` event is missing. Buckets whose end
    was not recorded count in neither; ``unknown_end`` lists them.
    """

    iteration: int
    rank: int
    backward_start: float  # absolute (rank clock); every other time is relative to it
    backward_end: float  # relative: the length of the backward window
    buckets: list[BucketTiming]
    gradients: list[tuple[str, float]]  # (fqn, ready time)
    comm_time: float
    hidden_time: float
    approximate: bool = False
    repeated: list[str] = field(default_factory=list)  # ready twice (reentrant checkpoint)

    @property
    def unknown_end(self) -> list[int]:
        return [b.index for b in self.buckets if b.end is None]

    @property
    def overlap_fraction(self) -> float:
        return self.hidden_time / self.comm_time if self.comm_time > 0 else 0.0

    @property
    def exposed_time(self) -> float:
        return self.comm_time - self.hidden_time


def _union(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    merged: list[tuple[float, float]] = []
    for a, b in sorted(i for i in intervals if i[1] > i[0]):
        if merged and a <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], b))
        else:
            merged.append((a, b))
    return merged


def _clip(a: float, b: float, lo: float, hi: float) -> float:
    return max(0.0, min(b, hi) - max(a, lo))


def timeline(
    iteration: int, rank: int, buckets: list[ObservedBucket], record: IterationRecord | None
) -> Timeline:
    window_known = record is not None and record.backward_start is not None
    if record is not None and record.backward_start is not None:
        t0, t1 = record.backward_start, record.backward_end or record.backward_start
        grads = [(f, t - t0) for f, t in zip(record.ready_order, record.ready_t, strict=True)]
    else:
        ready = [b.ready_t for b in buckets] or [0.0]
        t0, t1, grads = min(ready), max(ready), []
    window = t1 - t0
    timings = [
        BucketTiming(
            index=b.index,
            nbytes=b.nbytes,
            fqns=b.fqns,
            ready=b.ready_t - t0,
            start=b.start_t - t0,
            end=None if b.end_t is None else b.end_t - t0,
            overlap=0.0 if b.end_t is None else _clip(b.start_t - t0, b.end_t - t0, 0.0, window),
        )
        for b in buckets
    ]
    merged = _union([(b.start, b.end) for b in timings if b.end is not None])
    comm = sum(b - a for a, b in merged)
    hidden = sum(_clip(a, b, 0.0, window) for a, b in merged)
    return Timeline(
        iteration,
        rank,
        t0,
        window,
        timings,
        grads,
        comm,
        hidden,
        approximate=not window_known,
        repeated=list(record.repeated) if record is not None else [],
    )
