"""The rules a recording obeys: its limits, its header's fields, and what an event may hold.

One place for both directions, so ``save`` refuses to write what ``load`` would refuse
to read (and a saved run always loads whole). ``recording.py`` holds the flow.
"""

from __future__ import annotations

import math
import re
import reprlib
from typing import Annotated, Any

import msgspec

# MAX_PAYLOAD_DEPTH bounds an event payload, a value of the header's ``extra`` and one
# rank's result alike: the channel's bound, so what crossed it can be saved. Far below
# the interpreter's recursion limit (~1000), so nothing that walks a loaded payload
# (models, figures, this module) can recurse out.
from interactive_shard.telemetry.schema import (
    MAX_PAYLOAD_DEPTH,
    MAX_WORLD_SIZE,
    SCHEMA_VERSION,
    Event,
    plain_problem,
)

FORMAT = "interactive_shard.recording"
# The longest line (newline included) a recording may hold: the header or one event.
# Real events are bytes to kilobytes. Decoded JSON takes up to ~30x its size in Python
# objects (a 57 MiB line of empty lists took 1.4 GB), so this bound is what keeps the
# memory one line can cost near a hundred MiB, whatever the file claims.
MAX_LINE_BYTES = 4 * 1024 * 1024
_INT64 = 2**63
_SCALARS = (str, int, float, bool, type(None))

_short = reprlib.Repr()
_short.maxstring = _short.maxother = 40
_short.maxlist = _short.maxdict = _short.maxtuple = 4
_short.maxlevel = 3
_SHORT_CHARS = 100


def short(value: Any) -> str:
    """A repr short enough to quote in an error, whatever ``value`` holds."""
    try:
        text = _short.repr(value)
    except Exception:  # an int past the str-digits limit, a broken __repr__: still say what
        text = f"<a {type(value).__qualname__} that cannot be shown>"
    return text if len(text) <= _SHORT_CHARS else text[: _SHORT_CHARS - 3] + "..."


class RecordingError(ValueError):
    """The file is not a recording this version can read, or a run cannot be saved as one."""


class RecordingWarning(UserWarning):
    """Part of a recording was damaged; the valid prefix was loaded."""


class Header(msgspec.Struct, kw_only=True):
    """Line 1 of a recording. Fields other than the first three may be absent (older
    hand-written files); unknown fields are ignored (a newer writer of the same schema).
    """

    format: str
    schema_version: Annotated[int, msgspec.Meta(ge=1)]
    world_size: Annotated[int, msgspec.Meta(ge=1, le=MAX_WORLD_SIZE)]
    package_version: str = ""
    torch_version: str = ""
    backend: str = ""
    device_types: list[str] = []
    name: str = ""
    extra: dict[str, Any] | None = None
    results: list[Any] | None = None


# What each header field must be, quoted in the error that rejects it.
EXPECTED = {
    "format": f"the string {FORMAT!r}",
    "schema_version": f"an integer from 1 to {SCHEMA_VERSION}",
    "world_size": f"an integer from 1 to {MAX_WORLD_SIZE} (the number of ranks)",
    "package_version": "a string (the interactive_shard version that wrote the file)",
    "torch_version": "a string (the torch version of the run)",
    "backend": "a string such as 'gloo' or 'nccl'",
    "device_types": "a list of strings such as ['cpu']",
    "name": "a string",
    "extra": f"null or an object of plain data (values nest at most {MAX_PAYLOAD_DEPTH} deep)",
    "results": "null or a list with one plain-data entry per rank (world_size entries)",
}
_FIELD_IN_ERROR = re.compile(r"`\$\.(\w+)|required field `(\w+)`")


def validate_header(raw: dict[str, Any]) -> Header | str:
    """Validate a header's fields: the typed header, or what is wrong with which field."""
    try:
        header = msgspec.convert(raw, Header)
    except msgspec.ValidationError as exc:
        match = _FIELD_IN_ERROR.search(str(exc))
        field = (match.group(1) or match.group(2)) if match else None
        if field not in EXPECTED:
            return f"the header is not valid ({exc})"
        value = f"is {short(raw[field])}" if field in raw else "is missing"
        return f"header field {field!r} {value} ({exc}); it must be {EXPECTED[field]}"
    if header.extra is not None:
        problem = _values_problem(header.extra)
        if problem is not None:
            return f"header field 'extra' {problem}; it must be {EXPECTED['extra']}"
    if header.results is not None:
        if len(header.results) != header.world_size:
            return (
                f"header field 'results' has {len(header.results)} entries for world_size "
                f"{header.world_size} ({short(header.results)}); it must be {EXPECTED['results']}"
            )
        for rank, result in enumerate(header.results):
            problem = plain_problem(result, MAX_PAYLOAD_DEPTH)
            if problem is not None:
                return f"header field 'results': rank {rank}'s result {problem}"
    return header


def event_problem(event: Event, world_size: int, *, walk_payload: bool = True) -> str | None:
    """What makes ``event`` invalid in a run of ``world_size`` ranks, or None.

    Types are checked too: a decoded event has them already, but one built in Python
    (``Event`` does not check its arguments) may not. ``walk_payload=False`` skips the
    payload walk, for an event the typed decoder built (it bounded the payload already).
    """
    kind, rank, step, t, payload = event.kind, event.rank, event.step, event.t, event.payload
    if not isinstance(kind, str):
        return f"its kind {short(kind)} is not a string"
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < world_size:
        return f"its rank {short(rank)} is not a rank of this run (0..{world_size - 1})"
    if isinstance(step, bool) or not isinstance(step, int) or not -_INT64 <= step < _INT64:
        return f"its step {short(step)} is not a 64-bit integer"
    if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t):
        return f"its time {short(t)} is not a finite number"
    if not isinstance(payload, dict):
        return f"its payload {short(payload)} is not an object (dict)"
    if walk_payload:
        problem = _values_problem(payload)
        if problem is not None:
            return f"its payload {problem}"
    return None


def _values_problem(mapping: dict[Any, Any]) -> str | None:
    """Why a payload-like dict is not plain data with str keys, or None."""
    for key, value in mapping.items():
        if not isinstance(key, str):
            return f"has a key {short(key)} that is not a string"
        if not isinstance(value, _SCALARS):
            problem = plain_problem(value, MAX_PAYLOAD_DEPTH)
            if problem is not None:
                return f"value {short(key)} {problem}"
    return None
