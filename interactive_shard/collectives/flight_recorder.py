"""torch's Flight Recorder entries, read as ledger entries: what the rank's recorder reads
of its own ring, and what ``ish.load_flight_recorder`` reads of a job's dumps.

A dump is hostile input (a file, another process): it is decoded into the Structs below,
whose bounds msgspec checks, never unpickled into arbitrary objects; a field that does
not fit is refused with its name (``msgspec.ValidationError`` says where). Pure: no
torch.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Annotated

import msgspec
from msgspec import Meta

from interactive_shard.collectives.events import MAX_DIMS, MAX_NAME, LedgerEntry, State

MAX_FR_ENTRIES = 1 << 20  # entries in one dump (torch's rings hold thousands)
Count = Annotated[int, Meta(ge=0, le=2**62)]
Text = Annotated[str, Meta(max_length=4096)]

# Flight Recorder's dtype names (c10 ScalarType) -> torch's.
DTYPES = {
    "Float": "torch.float32",
    "Double": "torch.float64",
    "Half": "torch.float16",
    "BFloat16": "torch.bfloat16",
    "Long": "torch.int64",
    "Int": "torch.int32",
    "Short": "torch.int16",
    "Char": "torch.int8",
    "Byte": "torch.uint8",
    "Bool": "torch.bool",
}
_ITEM_BYTES = {
    "Float": 4,
    "Double": 8,
    "Half": 2,
    "BFloat16": 2,
    "Long": 8,
    "Int": 4,
    "Short": 2,
    "Char": 1,
    "Byte": 1,
    "Bool": 1,
}


class Frame(msgspec.Struct, frozen=True):
    name: Text = ""
    filename: Text = ""
    line: Count = 0


class FrEntry(msgspec.Struct, frozen=True):
    """One Flight Recorder entry (the fields the ledger reads; others are ignored)."""

    record_id: Count
    collective_seq_id: Count
    profiling_name: Text
    process_group: Annotated[list[Text], Meta(min_length=1, max_length=2)]
    is_p2p: bool = False
    input_sizes: Annotated[
        list[Annotated[list[Count], Meta(max_length=MAX_DIMS)]], Meta(max_length=4096)
    ] = []
    input_dtypes: Annotated[list[Text], Meta(max_length=4096)] = []
    retired: bool = False
    state: Text = ""
    time_created_ns: Count = 0
    time_discovered_completed_ns: Count | None = 0
    frames: Annotated[list[Frame], Meta(max_length=1024)] = []  # the pickle form's, innermost first


class PgConfig(msgspec.Struct, frozen=True):
    """A process group as a dump describes it. ``ranks`` is text (``"[0, 1]"``) in the
    releases measured, and ``"[]"`` for gloo groups before 2.14: usable or not, never an
    error (the ledger infers members from the entries)."""

    name: Text = ""
    desc: Text = ""
    ranks: (
        Annotated[str, Meta(max_length=1 << 20)]
        | Annotated[list[Annotated[int, Meta(ge=0)]], Meta(max_length=65_536)]
    ) = ""


class FrDump(msgspec.Struct, frozen=True):
    """A Flight Recorder dump (its JSON form, or its pickle's plain data converted): its
    entries, oldest first, and its groups by name."""

    entries: Annotated[list[FrEntry], Meta(max_length=MAX_FR_ENTRIES)] = []
    version: Text = ""
    pg_config: Annotated[dict[Text, PgConfig], Meta(max_length=65_536)] = {}


def decode_json(data: bytes) -> FrDump:
    """A dump from its JSON bytes; ``msgspec.ValidationError`` / ``DecodeError`` name
    what does not fit."""
    return msgspec.json.decode(data, type=FrDump)


def op_name(profiling_name: str) -> str:
    """``"gloo:all_reduce"`` / ``"nccl:all_reduce_coalesced"`` -> ``"all_reduce"``."""
    op = profiling_name.rpartition(":")[2]
    return {"allreduce": "all_reduce", "allgather": "all_gather"}.get(op, op) or "?"


def to_ledger(
    dump: FrDump,
    *,
    callers: Mapping[tuple[str, int], str] | None = None,
    wall_to_monotonic: float = 0.0,
    after: int = -1,
    unfinished: State = "pending",
) -> list[LedgerEntry]:
    """The collectives of ``dump`` (p2p left out) with ``record_id > after`` as ledger
    entries; ``callers`` ((group, seq) -> caller) names those Python saw issued, the
    others were issued from C++ (DDP's Reducer) or by code not watched; times move to
    the rank's monotonic clock by ``wall_to_monotonic`` (seconds to add). An entry not
    retired is ``unfinished``: pending in a dump taken at a hang, issued (completion not
    seen: the recorder retires entries lazily) in one read while the rank moves on."""
    callers = callers or {}
    # A (group, seq) seen twice is an older process group's: a forked rank inherits its
    # parent's ring, and a group made again counts from 1. The newest record holds.
    newest = {
        (e.process_group[0], e.collective_seq_id): e.record_id for e in dump.entries if not e.is_p2p
    }
    out = []
    for e in dump.entries:
        if e.is_p2p or e.record_id <= after or e.collective_seq_id < 1:
            continue
        if newest[(e.process_group[0], e.collective_seq_id)] != e.record_id:
            continue
        group, seq = e.process_group[0], e.collective_seq_id - 1
        shape = e.input_sizes[0] if e.input_sizes else []
        kind = e.input_dtypes[0] if e.input_dtypes else ""
        numel = sum(_numel(s) for s in e.input_sizes)
        state: State = "completed" if e.retired or e.state == "completed" else unfinished
        start = e.time_created_ns / 1e9 + wall_to_monotonic if e.time_created_ns else None
        done = e.time_discovered_completed_ns
        end = done / 1e9 + wall_to_monotonic if done else None
        out.append(
            LedgerEntry(
                group=group,
                seq=seq,
                op=op_name(e.profiling_name),
                dtype=DTYPES.get(kind, kind),
                shape=list(shape),
                nbytes=min(numel * _ITEM_BYTES.get(kind, 0), 2**62),
                caller=callers.get((group, seq)) or _where(e.frames),
                state=state,
                start=start if start is None or start >= 0 else None,
                end=end if end is None or end >= 0 else None,
            )
        )
    return out


def _numel(shape: Iterable[int]) -> int:
    n = 1
    for d in shape:
        n = min(n * d, 2**62)
    return n


def _where(frames: list[Frame]) -> str:
    """The innermost frame outside torch and this package (its wrappers call torch for the
    user), as ``file:line in fn`` (empty: none)."""
    for f in frames:
        if f.filename and "/torch/" not in f.filename and "/interactive_shard/" not in f.filename:
            return frame_text(f)
    return ""


def frame_text(f: Frame) -> str:
    """``file.py:42 in fn``, cut to a ledger name's length."""
    return f"{f.filename.rpartition('/')[2]}:{f.line} in {f.name}"[:MAX_NAME]
