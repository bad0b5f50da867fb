"""Recordings: a run's store as JSON Lines, replayable without any process.

Line 1 is a header (format, schema version, package and torch versions, world size,
backend, device types, name, extra, plain-data results); every further line is one
event as a JSON array ``[kind, rank, step, t, payload]``.

Loading trusts nothing in the file, and its memory follows the file's real content:

* The header is validated field by field; a wrong type or value is a
  ``RecordingError`` naming the field and the value. ``world_size`` is at most
  ``MAX_WORLD_SIZE`` (65,536) and ``results`` is null or one entry per rank. A file
  written by a newer schema is refused with a clear error.
* No line may exceed ``MAX_LINE_BYTES`` (4 MiB, newline included); lines are read
  with a bounded read, so a longer one is never held whole.
* A payload value (a value of the header's ``extra``, one rank's result) nests at
  most ``MAX_PAYLOAD_DEPTH`` (10) lists / dicts, as over the channel.
* Events must be valid: rank in ``0..world_size-1``, an integer step, a finite time,
  an object payload.

A truncated or damaged file (a bad, invalid, over-long or over-deep event line) loads
its valid prefix with a ``RecordingWarning`` naming the first bad line; what follows
it is skipped, since a damaged line means the rest cannot be trusted either.

``save`` holds itself to the same rules, so whatever it writes loads whole: an event
that breaks them is a ``RecordingError`` naming the event, and nothing is left on
disk. Results that are not plain data, nest too deep or would make the header
longer than a line are saved as null (the largest first, logged). NaN and infinite
payload values become null (JSON has neither).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import warnings
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import msgspec

from interactive_shard.telemetry._gc import paused
from interactive_shard.telemetry._recording_checks import (
    FORMAT,
    MAX_LINE_BYTES,
    Header,
    RecordingError,
    RecordingWarning,
    event_problem,
    short,
    validate_header,
)
from interactive_shard.telemetry.files import written
from interactive_shard.telemetry.schema import (
    MAX_PAYLOAD_DEPTH,
    SCHEMA_VERSION,
    Event,
    plain_problem,
)
from interactive_shard.telemetry.store import RunInfo, RunStore

__all__ = [
    "FORMAT",
    "MAX_LINE_BYTES",
    "MAX_PAYLOAD_DEPTH",
    "RecordingError",
    "RecordingWarning",
    "load",
    "save",
]

log = logging.getLogger(__name__)

_ENCODE_ERRORS = (TypeError, ValueError, OverflowError, RecursionError, msgspec.EncodeError)
_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(Event)


def save(store: RunStore, path: str | os.PathLike[str], results: list[Any] | None = None) -> Path:
    """Write ``store`` (and results that are plain data; others become null) to ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    header = _header_line(store.info, results, path)
    world_size = store.info.world_size
    # Never a half-written recording under the real name, nor one beside it
    # (Note [Writing a file whole] in files.py).
    with written(path) as f, paused():  # Note [Pausing the collector's GC]
        f.write(header)
        for index, event in enumerate(store.events()):
            f.write(_event_line(event, index, world_size, path))
    return path


def _header_line(info: RunInfo, results: list[Any] | None, path: Path) -> bytes:
    plain = None if results is None else [_plain_or_none(r) for r in results]
    header = {
        "format": FORMAT,
        "schema_version": SCHEMA_VERSION,
        "package_version": info.package_version,
        "torch_version": info.torch_version,
        "world_size": info.world_size,
        "backend": info.backend,
        "device_types": info.device_types,
        "name": info.name,
        "extra": info.extra,
        "results": plain,
    }
    checked = validate_header(header)
    if isinstance(checked, str):
        raise RecordingError(f"cannot save {str(path)!r}: {checked}. Nothing was written.")
    line = _encoder.encode(header) + b"\n"
    if len(line) > MAX_LINE_BYTES and plain:
        # Results are the part of a header that can be large: null the largest until
        # the line fits, as unserialisable ones are, rather than refuse the whole run.
        sizes = [len(_encoder.encode(r)) for r in plain]
        for rank in sorted(range(len(plain)), key=sizes.__getitem__, reverse=True):
            if len(line) <= MAX_LINE_BYTES or plain[rank] is None:
                break
            log.warning(
                "save %s: rank %d's result is %d bytes as JSON, too large for the %d-byte "
                "header line; it is saved as null.",
                path,
                rank,
                sizes[rank],
                MAX_LINE_BYTES,
            )
            plain[rank] = None
            line = _encoder.encode(header) + b"\n"
    if len(line) > MAX_LINE_BYTES:
        raise RecordingError(
            f"cannot save {str(path)!r}: its header is {len(line)} bytes, over the "
            f"{MAX_LINE_BYTES}-byte line limit, even without results. Keep RunInfo.extra "
            "and name small (they are descriptions, not data). Nothing was written."
        )
    return line


def _plain_or_none(value: Any) -> Any:
    try:
        plain = msgspec.json.decode(_encoder.encode(value))
    except (*_ENCODE_ERRORS, msgspec.DecodeError):
        return None
    return plain if plain_problem(plain, MAX_PAYLOAD_DEPTH) is None else None


def _event_line(event: Event, index: int, world_size: int, path: Path) -> bytes:
    line, problem = _encode_event(event, world_size)
    if line is not None:
        return line
    raise RecordingError(
        f"cannot save {str(path)!r}: event {index} (kind {short(event.kind)}, rank "
        f"{short(event.rank)}, step {short(event.step)}): {problem}. Events hold plain "
        "data: numbers, strings, lists and dicts of them (for a tensor .tolist(), for a "
        "dtype str(dtype)), small enough for one line. Nothing was written."
    )


def _encode_event(event: Event, world_size: int) -> tuple[bytes | None, str | None]:
    problem = event_problem(event, world_size)
    if problem is not None:
        return None, problem
    try:
        line = _encoder.encode(event) + b"\n"
    except _ENCODE_ERRORS as exc:
        return None, f"cannot be encoded as JSON ({exc})"
    if len(line) > MAX_LINE_BYTES:
        return None, f"is {len(line)} bytes as JSON, over the {MAX_LINE_BYTES}-byte line limit"
    try:  # decoded as load will: save and load can never disagree on a line
        _decoder.decode(line)
    except msgspec.DecodeError as exc:
        return None, f"would not load back ({exc})"
    return line, None


def load(path: str | os.PathLike[str]) -> tuple[RunStore, list[Any] | None]:
    """Read a recording: the rebuilt store and the saved results (or None)."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"no recording at {str(path)!r}")
    with path.open("rb") as f:
        # A bounded read: a line over the limit is never held whole.
        lines = iter(partial(f.readline, MAX_LINE_BYTES + 1), b"")
        header = read_header(path, next(lines, b""))
        world_size = header.world_size
        store = RunStore(run_info(header))
        with paused():  # Note [Pausing the collector's GC]: 2.5 -> 0.85 s at 3k iterations
            events = _read_events(path, lines, world_size)
        store.extend(events)
    return store, header.results


def _read_events(path: Path, lines: Iterator[bytes], world_size: int) -> list[Event]:
    """The valid prefix of the event lines (a warning names the first bad one)."""
    events: list[Event] = []
    for lineno, line in enumerate(lines, start=2):
        event, problem = _decode_event(line, world_size)
        if event is not None:
            events.append(event)
        elif problem is not None:
            warnings.warn(
                f"{path}: line {lineno} is damaged ({problem}); loaded the "
                f"{len(events)} events before it and skipped the rest.",
                RecordingWarning,
                stacklevel=3,  # load's caller
            )
            break  # stop reading: the rest is never read, let alone held
    return events


def _decode_event(line: bytes, world_size: int) -> tuple[Event | None, str | None]:
    """The line's event, or what is wrong with it; (None, None) for a blank line."""
    if len(line) > MAX_LINE_BYTES:
        return None, f"longer than the {MAX_LINE_BYTES}-byte line limit"
    if not line.strip():
        return None, None
    if not line.endswith(b"\n"):
        return None, "line is cut off (no newline): truncated file"
    try:
        event = _decoder.decode(line)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        return None, str(exc)
    except RecursionError:  # deeper than the decoder goes: far beyond MAX_PAYLOAD_DEPTH
        return None, f"nests more than {MAX_PAYLOAD_DEPTH} lists / dicts deep"
    # The typed decoder has bounded the payload's depth and types already (schema.Event's
    # Payload): walking it again cost more than decoding (10k-iteration recordings).
    problem = event_problem(event, world_size, walk_payload=False)
    return (event, None) if problem is None else (None, f"the event is invalid: {problem}")


def run_info(header: Header, **changes: Any) -> RunInfo:
    """The ``RunInfo`` a recording's header describes (``changes``: fields set instead)."""
    info = RunInfo(
        world_size=header.world_size,
        backend=header.backend,
        device_types=header.device_types,
        schema_version=header.schema_version,
        package_version=header.package_version,
        torch_version=header.torch_version,
        name=header.name,
        extra=header.extra or {},
    )
    return dataclasses.replace(info, **changes)


def read_header(path: Path, line: bytes) -> Header:
    """Line 1 of the file at ``path``, validated (a ``RecordingError`` says what is wrong)."""
    if not line.strip():
        raise RecordingError(
            f"{path} is empty: it has no header line. Recordings are written by run.save(path)."
        )
    if len(line) > MAX_LINE_BYTES:
        raise RecordingError(
            f"{path}: line 1 is longer than the {MAX_LINE_BYTES}-byte line limit, so it is "
            "not a recording header. Recordings are written by run.save(path)."
        )
    try:
        raw = msgspec.json.decode(line)
    except (msgspec.DecodeError, RecursionError) as exc:
        why = "it nests too deeply" if isinstance(exc, RecursionError) else str(exc)
        raise RecordingError(
            f"{path}: line 1 is not a recording header ({why}). Recordings are written by "
            "run.save(path)."
        ) from None
    if not isinstance(raw, dict) or raw.get("format") != FORMAT:
        raise RecordingError(
            f"{path}: line 1 does not start an interactive_shard recording "
            f"(expected format {FORMAT!r}). Recordings are written by run.save(path)."
        )
    version = raw.get("schema_version")
    # Refuse a newer schema before reading other fields: their meaning may have changed.
    if isinstance(version, int) and not isinstance(version, bool) and version > SCHEMA_VERSION:
        raise RecordingError(
            f"{path} uses event schema version {short(version)}, written by interactive_shard "
            f"{short(raw.get('package_version', '?'))}; this version reads up to schema "
            f"{SCHEMA_VERSION}. Upgrade interactive_shard to open it."
        )
    header = validate_header(raw)
    if isinstance(header, str):
        raise RecordingError(
            f"{path}: {header}. The file is damaged or was edited: fix line 1, or re-save "
            "the run with run.save(path)."
        )
    return header
