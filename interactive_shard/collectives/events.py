"""The collective ledger's event: one msgspec Struct, the only definition.

Emitted on every rank a ``Cluster`` starts by ``interactive_shard.collectives.recorder``
(from the moment the process group exists, no watch needed), and read from torch's own
Flight Recorder dumps by ``ish.load_flight_recorder``. A collective is named by its
process group and its sequence number in that group: 0, 1, ... in the order the rank
issued them (torch's ``collective_seq_id`` minus one), the key that aligns ranks.
Times are ``time.monotonic()`` seconds on the rank.
"""

# docs/events.md is written from this file (tools/gen_event_docs.py). No torch here:
# the kernel imports it to read recordings.

from __future__ import annotations

from typing import Annotated, ClassVar, Literal

import msgspec
from msgspec import Meta

MAX_ENTRIES = 65_536  # per event (the recorder sends at most its ring, 2,048 by default)
MAX_DIMS = 16
MAX_NAME = 512
State = Literal["completed", "pending", "issued"]
Name = Annotated[str, Meta(max_length=MAX_NAME)]
Seconds = Annotated[float, Meta(ge=0)]


class LedgerEntry(msgspec.Struct, kw_only=True, frozen=True, omit_defaults=True):
    """One collective this rank issued. Sent again when its state changes: the latest
    entry for a (group, seq) is the one that holds."""

    group: Annotated[Name, Meta(description="process group name (`ProcessGroup.group_name`)")]
    seq: Annotated[int, Meta(ge=0, le=2**62, description="0-based position in its group")]
    op: Annotated[Name, Meta(description="all_reduce, broadcast, all_gather, ...")]
    dtype: Annotated[Name, Meta(description="dtype of the first tensor sent (empty: unknown)")] = ""
    shape: Annotated[
        list[Annotated[int, Meta(ge=0, le=2**62)]],
        Meta(max_length=MAX_DIMS, description="shape of the first tensor sent"),
    ] = []
    nbytes: Annotated[int, Meta(ge=0, le=2**62, description="bytes this rank sent")] = 0
    caller: Annotated[
        Name,
        Meta(
            description="who issued it: `DDP gradient bucket`, `DDP buffer sync`, "
            "`FSDP all-gather`, the user's `file.py:42 in fn`; empty: unknown"
        ),
    ] = ""
    state: Annotated[
        State,
        Meta(
            description="completed; pending: issued and still waiting (the rank is inside "
            "it); issued: issued, completion not seen"
        ),
    ]
    start: Annotated[Seconds | None, Meta(description="when it was issued")] = None
    end: Annotated[Seconds | None, Meta(description="when it completed")] = None


class LedgerGroup(msgspec.Struct, kw_only=True, frozen=True):
    """A process group and its ranks (global ranks, in group order)."""

    name: Annotated[Name, Meta(description="`ProcessGroup.group_name`")]
    ranks: Annotated[
        list[Annotated[int, Meta(ge=0)]],
        Meta(max_length=65_536, description="its members' global ranks"),
    ]


class Ledger(msgspec.Struct, kw_only=True, frozen=True, omit_defaults=True):
    """A rank's new or changed ledger entries, sent as they come (a few times a second at
    most) and whenever the rank's position or state changed."""

    KIND: ClassVar[str] = "ledger"

    entries: Annotated[
        list[LedgerEntry],
        Meta(max_length=MAX_ENTRIES, description="new entries, and entries whose state changed"),
    ] = []
    groups: Annotated[
        list[LedgerGroup],
        Meta(max_length=4096, description="process groups not announced before in this run"),
    ] = []
    issued: Annotated[
        dict[Name, Annotated[int, Meta(ge=0, le=2**62)]],
        Meta(description="group -> collectives this rank has issued in it so far"),
    ] = {}
    still_s: Annotated[
        Seconds | None,
        Meta(
            description="seconds this rank's position has not moved, sent once it passes "
            "the recorder's threshold while a run is in progress (null: it moves)",
        ),
    ] = None
    in_collective: Annotated[
        bool, Meta(description="when still: the rank is inside a collective (it waits)")
    ] = False
    stack: Annotated[
        list[Name],
        Meta(
            max_length=64, description="when still: where it is, `file:line in fn`, innermost last"
        ),
    ] = []


EVENTS = (Ledger,)  # in docs/events.md
