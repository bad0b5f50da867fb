"""Bucket size limits and greedy assignment: a pure-Python twin of DDP's.

``BucketCaps`` turns DDP's ``bucket_cap_mb`` / ``bucket_cap_mb_list`` into byte limits as
``torch.nn.parallel.distributed._BucketCapacityConfig`` does (torch 2.13).

``assign_by_size`` reproduces ``torch.distributed._compute_bucket_assignment_by_size``
(``compute_bucket_assignment_by_size`` in ``torch/csrc/distributed/c10d/reducer.cpp``)
step for step; ``tests/unit/test_bucket_plan.py`` checks the two against each other.
See Note [DDP buckets] in ``plan.py`` for where DDP calls it and with which limits.
"""

from __future__ import annotations

import bisect
import functools
import itertools
import operator
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import torch

from interactive_shard.probing.compat import ddp as compat_ddp

# ``std::numeric_limits<size_t>`` would be larger, but DDP passes ``sys.maxsize``.
NO_LIMIT = sys.maxsize
# The reducer gives a bucket of one sparse gradient the limit 0 (``kNoSizeLimit``).
SPARSE_LIMIT = 0

MIB = 1024 * 1024
DEFAULT_BUCKET_CAP_MB = 25
DEFAULT_FIRST_BUCKET_BYTES = compat_ddp.DEFAULT_FIRST_BUCKET_BYTES

Key = tuple[torch.dtype, torch.device]


class Item(NamedTuple):
    """One tensor as the assignment sees it (a plain 4-tuple works as well)."""

    index: int  # type: ignore[assignment]  # reducer index; shadows tuple.index, unused
    key: Key  # (dtype, device): tensors of different keys never share a bucket
    nbytes: int
    sparse: bool = False


def assign_by_size(
    items: Sequence[Item], limits: Sequence[int], *, gradient_ready_order: bool
) -> list[tuple[list[int], int]]:
    """Return ``[(indices, limit), ...]`` exactly as torch's assignment would.

    Algorithm (numbered as in the C++):

    1. Walk ``items`` in the order given. A tensor that expects a sparse gradient gets a
       bucket of its own (limit 0).
    2. Every other tensor joins the open bucket of its ``(dtype, device)`` key. Once the
       bucket's byte count reaches the key's current limit (``>=``), the bucket closes:
       the tensor that crosses the limit is inside it. Each key then advances to the
       next limit in ``limits``; the last limit repeats.
    3. Buckets still open at the end are appended, one per key, in the iteration order
       of the reducer's ``std::unordered_map`` (see ``_open_bucket_order``).
    4. Without ``gradient_ready_order`` (the DDP constructor's call) the buckets are
       sorted by the smallest index they hold. With it (the rebuild) they stay as built.
    """
    if not items:
        raise ValueError("assign_by_size needs at least one tensor")
    return assign_columns(
        [item[0] for item in items],
        [item[1] for item in items],
        [item[2] for item in items],
        [item[3] for item in items],
        limits,
        gradient_ready_order=gradient_ready_order,
    )


def assign_columns(
    indices: Sequence[int],
    keys: Sequence[Key],
    nbytes: Sequence[int],
    sparse: Sequence[bool],
    limits: Sequence[int],
    *,
    gradient_ready_order: bool,
) -> list[tuple[list[int], int]]:
    """``assign_by_size`` on columns (the walk's indices, keys, byte counts, sparse flags).

    Step 2 per key is a search, not a walk: the bucket that opens at position ``s``
    closes at the first ``e`` whose running byte total since ``s`` reaches the limit, a
    ``bisect`` in the key's cumulative sums. That costs one C-level search per bucket
    instead of a Python step per tensor (10,000 parameters: ~1,500 buckets). Buckets
    close in the walk at their crossing tensor, so merging every key's closed buckets
    (and the sparse ones) by that position gives the C++'s append order.
    """
    if not indices:
        raise ValueError("assign_by_size needs at least one tensor")
    if not limits:
        raise ValueError("assign_by_size needs at least one size limit")
    if not any(sparse) and len(set(keys)) == 1:  # the common case: no per-key split
        result = [(list(indices[a:b]), limit) for a, b, limit in spans(nbytes, limits)]
    else:
        result = _many_keys(indices, keys, nbytes, sparse, limits)
    if not gradient_ready_order:  # step 4
        result.sort(key=lambda bucket: min(bucket[0]))
    return result


def spans(nbytes: Sequence[int], limits: Sequence[int]) -> list[tuple[int, int, int]]:
    """Step 2 for the tensors of one key, in walk order: ``[(start, stop, limit), ...]``,
    each bucket a slice of the walk; the last one may still be open (it did not reach
    its limit). Needs at least one limit."""
    if len(nbytes) >= _NUMPY_FROM:
        found = _spans_numpy(nbytes, limits)
        if found is not None:
            return found
    total = list(itertools.accumulate(nbytes))  # non-decreasing: bytes are >= 0
    last, n = len(limits) - 1, len(total)
    out: list[tuple[int, int, int]] = []
    start = base = level = 0
    while start < n:
        limit = limits[level]
        end = bisect.bisect_left(total, base + limit, start)  # first e: bytes >= limit
        if end >= n:
            out.append((start, n, limit))
            break
        out.append((start, end + 1, limit))
        base, start, level = total[end], end + 1, min(level + 1, last)
    return out


_NUMPY_FROM = 512  # below this the pure-Python search is as fast
_INT64_SAFE = 2**62  # totals and search targets stay below int64's limit


def _spans_numpy(nbytes: Sequence[int], limits: Sequence[int]) -> list[tuple[int, int, int]] | None:
    """``spans`` with one vectorised search for every bucket under the last (repeating)
    limit: ``ends[s]`` is where a bucket opened at ``s`` closes, so the walk from bucket
    to bucket is a list lookup each (5,000 buckets: ~1 ms, not ~5). None when a total
    could overflow int64 (``ParamSpec`` shapes are unbounded): the caller then searches
    in Python ints."""
    grand = sum(nbytes)
    if grand >= _INT64_SAFE:
        return None
    sizes = np.array(nbytes, dtype=np.int64)
    total = np.cumsum(sizes)
    n, last = len(sizes), len(limits) - 1
    out: list[tuple[int, int, int]] = []
    start = base = level = 0
    while start < n and level < last:  # the limits before the last one: a bucket each
        limit = limits[level]
        if base + limit > grand:  # never reached: the bucket stays open
            out.append((start, n, limit))
            return out
        end = max(start, int(np.searchsorted(total, base + limit)))
        if end >= n:
            out.append((start, n, limit))
            return out
        out.append((start, end + 1, limit))
        base, start, level = int(total[end]), end + 1, level + 1
    if start >= n:
        return out
    limit = limits[last]
    if base + limit > grand:
        out.append((start, n, limit))
        return out
    # Targets: the bytes before each tensor plus the limit (<= grand: no overflow).
    ends = np.searchsorted(total, total - sizes + limit)
    ends = np.maximum(ends, np.arange(n)).tolist()  # a zero limit closes at the opener
    while start < n:
        end = ends[start]
        if end >= n:
            out.append((start, n, limit))
            break
        out.append((start, end + 1, limit))
        start = end + 1
    return out


def _many_keys(
    indices: Sequence[int],
    keys: Sequence[Key],
    nbytes: Sequence[int],
    sparse: Sequence[bool],
    limits: Sequence[int],
) -> list[tuple[list[int], int]]:
    walks: dict[Key, list[int]] = {}  # key -> positions in the walk; first appearance order
    closed: list[tuple[int, list[int], int]] = []  # (position of the crossing tensor, ...)
    for position, (key, is_sparse) in enumerate(zip(keys, sparse, strict=True)):
        if is_sparse:  # step 1
            closed.append((position, [indices[position]], SPARSE_LIMIT))
        else:
            walks.setdefault(key, []).append(position)
    still_open: dict[Key, tuple[list[int], int]] = {}
    for key, walk in walks.items():  # step 2, per key
        for start, stop, limit in spans([nbytes[p] for p in walk], limits):
            members = [indices[p] for p in walk[start:stop]]
            total = sum(nbytes[p] for p in walk[start:stop])
            if total >= limit:
                closed.append((walk[stop - 1], members, limit))
            else:  # only the last span can fall short: the key's open bucket
                still_open[key] = (members, limit)
    closed.sort(key=operator.itemgetter(0))
    result = [(members, limit) for _, members, limit in closed]
    for key in _open_bucket_order(tuple(walks)):  # step 3
        if key in still_open:
            result.append(still_open[key])
    return result


@functools.lru_cache(maxsize=256)
def _open_bucket_order(keys: tuple[Key, ...]) -> tuple[Key, ...]:
    """Order in which the reducer's hash map yields ``keys`` (given in insertion order).

    The map is a ``std::unordered_map`` keyed by ``(dtype, device)``: its order depends
    on the hash values and the C++ standard library. With libstdc++ and up to about five
    keys it is the reverse of insertion order; beyond that it varies. To be exact we ask
    torch itself, with one empty tensor per key; where that is impossible (no such
    private function, or a device that cannot be allocated here) we assume the reverse.
    """
    if len(keys) <= 1:
        return keys
    fallback = tuple(reversed(keys))
    compute = compat_ddp.compute_bucket_assignment()
    if compute is None:
        return fallback
    try:
        probes = [torch.empty(0, dtype=dtype, device=device) for dtype, device in keys]
        buckets, _ = compute(probes, [NO_LIMIT], [False] * len(keys), list(range(len(keys))))
    except (RuntimeError, TypeError, ValueError, AssertionError):
        return fallback
    order = tuple(keys[bucket[0]] for bucket in buckets)
    return order if sorted(map(_sort_key, order)) == sorted(map(_sort_key, keys)) else fallback


def _sort_key(key: Key) -> tuple[str, str]:
    return (str(key[0]), str(key[1]))


@dataclass(frozen=True)
class BucketCaps:
    """Size limits in bytes, derived from DDP's arguments as ``_BucketCapacityConfig``."""

    bucket_cap_bytes: int
    first_bucket_cap_bytes: int  # first bucket of a rebuild (1 MiB by default)
    bucket_cap_bytes_list: tuple[int, ...] = ()  # per bucket; the last one repeats

    def __post_init__(self) -> None:
        values = (self.bucket_cap_bytes, self.first_bucket_cap_bytes, *self.bucket_cap_bytes_list)
        if not all(isinstance(v, int) and v >= 0 for v in values):
            raise ValueError(f"bucket caps must be byte counts >= 0, got {self!r}")
        object.__setattr__(self, "bucket_cap_bytes_list", tuple(self.bucket_cap_bytes_list))

    @classmethod
    def from_mb(cls, bucket_cap_mb: float | None, bucket_cap_mb_list: Any) -> BucketCaps:
        if bucket_cap_mb is not None and bucket_cap_mb_list is not None:
            raise ValueError(
                f"got bucket_cap_mb={bucket_cap_mb!r} and bucket_cap_mb_list="
                f"{bucket_cap_mb_list!r}; DDP ignores bucket_cap_mb when a list is given: "
                "pass only one of them"
            )
        if bucket_cap_mb_list is not None:
            listed = isinstance(bucket_cap_mb_list, Iterable) and not isinstance(
                bucket_cap_mb_list, (str, bytes)
            )
            caps = list(bucket_cap_mb_list) if listed else []
            if not caps:
                raise ValueError(
                    f"bucket_cap_mb_list={bucket_cap_mb_list!r}: give a non-empty list of MiB, "
                    "e.g. [1, 25], or None for one cap"
                )
            for cap in caps:
                _check_mb("bucket_cap_mb_list entry", cap)
            top = int(max(caps) * MIB)
            return cls(top, top, tuple(int(cap * MIB) for cap in caps))
        if bucket_cap_mb is None:
            return cls(DEFAULT_BUCKET_CAP_MB * MIB, DEFAULT_FIRST_BUCKET_BYTES)
        _check_mb("bucket_cap_mb", bucket_cap_mb)
        return cls(int(bucket_cap_mb * MIB), int(bucket_cap_mb * MIB))

    def first_iteration_limits(self, *, find_unused: bool, static_graph: bool) -> list[int]:
        if self.bucket_cap_bytes_list:
            return list(self.bucket_cap_bytes_list)
        if static_graph or not find_unused:
            return [NO_LIMIT]
        if self.first_bucket_cap_bytes < self.bucket_cap_bytes:
            return [self.first_bucket_cap_bytes, self.bucket_cap_bytes]
        return [self.bucket_cap_bytes]

    def rebuild_limits(self) -> list[int]:
        if self.bucket_cap_bytes_list:
            return list(self.bucket_cap_bytes_list)
        return [self.first_bucket_cap_bytes, self.bucket_cap_bytes]


def _check_mb(what: str, value: object) -> None:
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    # Finite in bytes too: int(1e308 * MIB) overflows (a hostile recording's cap). NaN
    # fails the comparison.
    if not number or not 0 <= value <= sys.float_info.max / MIB:  # type: ignore[operator]
        raise ValueError(
            f"{what}={value!r}: give a size in MiB >= 0 (under {sys.float_info.max / MIB:.3g}), "
            "e.g. 25 or 0.5"
        )
