"""What ``BucketMap`` keeps of the bucket events, decoded from their payloads.

Payloads arrive from rank processes, so they are decoded defensively: ``decode`` checks
a payload against its event Struct (``events.py``) with ``msgspec.convert`` and raises
``RecordError`` naming the field that does not match; the model skips that event
(counting it) instead of failing the notebook. ``size_problem`` checks what a Struct
cannot: that the parameters' sizes fit the int64s their byte counts are drawn with (a
kernel-side check: the probe builds these events every iteration). No widgets, no torch
here.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Sequence
from typing import Any

import msgspec

from interactive_shard.buckets.events import BucketReduced, DdpIteration, DdpWatch

# One bucket as the probe saw it (lists in ``GradBucket.parameters()`` order), and the
# end-of-backward summary of one DDP iteration on one rank: the events themselves.
ObservedBucket = BucketReduced
IterationRecord = DdpIteration


class RecordError(ValueError):
    """An event payload that does not follow its event Struct."""


class WatchInfo(DdpWatch, kw_only=True, frozen=True):
    """What ``ish.watch(ddp)`` reported about the DDP model on one rank: its ``ddp_watch``
    event and the rank that sent it."""

    rank: int

    @property
    def module_of(self) -> dict[str, str]:
        return dict(zip(self.fqns, self.modules, strict=True))

    @property
    def cap_mb(self) -> float:
        """The cap in MiB that DDP used (its default when none was passed)."""
        return self.bucket_bytes_cap / 2**20

    @property
    def caps_text(self) -> str:
        """DDP's cap argument as the user wrote it (the probe reports caps as
        bytes / 2**20: print 0.02, not 0.01999950408935547)."""
        if self.bucket_cap_mb_list:
            return f"bucket_cap_mb_list=[{', '.join(f'{c:.3g}' for c in self.bucket_cap_mb_list)}]"
        if self.bucket_cap_mb is None:
            return "bucket_cap_mb=default (25)"
        return f"bucket_cap_mb={self.bucket_cap_mb:.3g}"


# The largest dtype (complex128) has 16 bytes: within this many elements an event's
# byte counts (a parameter's, a bucket's, their sum) fit the int64s that numpy and plotly
# hold them in, with room for float rounding. No real model comes near 2**58 elements.
MAX_NUMEL = 2**58
MAX_BYTES = 2**63 - 1
# A float product: a hostile shape of thousands of 2**62 overflows to inf at once,
# where an int product would grow for seconds.
_numel = functools.partial(math.prod, start=1.0)


def _shapes_problem(shapes: Sequence[Sequence[int]]) -> str | None:
    if min(itertools.chain.from_iterable(shapes), default=0) < 0:
        bad = next(s for s in shapes if min(s, default=0) < 0)
        return f"shape {list(bad)[:8]} has a negative size"
    total = sum(map(_numel, shapes))
    if not total <= MAX_NUMEL:  # NaN too: inf * 0
        worst = max(shapes, key=_numel)
        return (
            f"shape {list(worst)[:8]} makes the parameters hold over {MAX_NUMEL:,} elements, "
            "whose bytes do not fit an int64 (a shape is the parameter's tensor.shape)"
        )
    return None


Record = WatchInfo | ObservedBucket | IterationRecord
_RECORDS: dict[str, type[Record]] = {
    DdpWatch.KIND: WatchInfo,
    BucketReduced.KIND: BucketReduced,
    DdpIteration.KIND: DdpIteration,
}
KINDS = frozenset(_RECORDS)


def decode(rank: int, kind: str, payload: dict[str, Any]) -> Record:
    """The record of one bucket event of ``rank``; ``RecordError`` if the payload does not
    fit its Struct (types, constraints, per-parameter list lengths)."""
    record = _RECORDS.get(kind)
    if record is None:
        raise RecordError(f"{kind!r} is not a bucket event kind; they are {sorted(KINDS)}")
    if record is WatchInfo:
        payload = {**payload, "rank": rank}  # the rank is the event's, never the payload's
    try:
        decoded = msgspec.convert(payload, record)
    except msgspec.ValidationError as err:
        raise RecordError(f"{kind} event: {err}") from None
    problem = size_problem(decoded)
    if problem is not None:
        raise RecordError(f"{kind} event: {problem}")
    return decoded


def size_problem(record: Record) -> str | None:
    """Why ``record``'s sizes cannot be drawn (None: they can): a negative size, or more
    elements (``MAX_NUMEL``) or bytes than an int64 holds. The model skips and counts
    such an event, as one that does not fit its Struct."""
    if isinstance(record, IterationRecord):
        return None
    problem = _shapes_problem(record.shapes)
    if problem is None and isinstance(record, WatchInfo) and record.delayed is not None:
        problem = _shapes_problem(record.delayed.shapes)
    if problem is None and isinstance(record, ObservedBucket) and record.nbytes > MAX_BYTES:
        problem = f"nbytes {record.nbytes} does not fit an int64"
    return problem
