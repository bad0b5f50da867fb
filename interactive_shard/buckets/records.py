"""What ``BucketMap`` keeps of the bucket events, decoded from their payloads.

Payloads arrive from rank processes, so they are decoded defensively: ``decode`` checks
a payload against its event Struct (``events.py``) with ``msgspec.convert`` and raises
``RecordError`` naming the field that does not match; the model skips that event
(counting it) instead of failing the notebook. No widgets, no torch here.
"""

from __future__ import annotations

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
        return msgspec.convert(payload, record)
    except msgspec.ValidationError as err:
        raise RecordError(f"{kind} event: {err}") from None
