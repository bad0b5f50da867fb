"""Recordings: a run's store as JSON Lines, replayable without any process.

Line 1 is a header (format, schema version, package and torch versions, world size,
backend, device types, plain-data results); every further line is one event as a
JSON array ``[kind, rank, step, t, payload]``.

A truncated or corrupted file loads its valid prefix with a warning that names the
first bad line; a file written by a newer schema is refused with a clear error.
"""

from __future__ import annotations

import logging
import os
import warnings
from pathlib import Path
from typing import Any

import msgspec

from interactive_shard.telemetry.schema import SCHEMA_VERSION, Event
from interactive_shard.telemetry.store import RunInfo, RunStore

log = logging.getLogger(__name__)

FORMAT = "interactive_shard.recording"


class RecordingError(ValueError):
    """The file is not a recording this version can read."""


class RecordingWarning(UserWarning):
    """Part of a recording was damaged; the valid prefix was loaded."""


def _plain_or_none(value: Any) -> Any:
    try:
        return msgspec.json.decode(msgspec.json.encode(value))
    except (TypeError, msgspec.EncodeError):
        return None


def save(store: RunStore, path: str | os.PathLike[str], results: list[Any] | None = None) -> Path:
    """Write ``store`` (and results that are plain data; others become null) to ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    info = store.info
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
        "results": [_plain_or_none(r) for r in results] if results is not None else None,
    }
    encoder = msgspec.json.Encoder()
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("wb") as f:
        f.write(encoder.encode(header) + b"\n")
        for event in store.events():
            f.write(encoder.encode(event) + b"\n")
    tmp.replace(path)  # never leave a half-written recording under the real name
    return path


def load(path: str | os.PathLike[str]) -> tuple[RunStore, list[Any] | None]:
    """Read a recording: the rebuilt store and the saved results (or None)."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"no recording at {str(path)!r}")
    with path.open("rb") as f:
        first = f.readline()
        header = _read_header(path, first)
        store = RunStore(
            RunInfo(
                world_size=int(header["world_size"]),
                backend=str(header.get("backend", "")),
                device_types=list(header.get("device_types", [])),
                schema_version=int(header["schema_version"]),
                package_version=str(header.get("package_version", "")),
                torch_version=str(header.get("torch_version", "")),
                name=str(header.get("name", "")),
                extra=dict(header.get("extra") or {}),
            )
        )
        decoder = msgspec.json.Decoder(Event)
        events: list[Event] = []
        for lineno, line in enumerate(f, start=2):
            if not line.strip():
                continue
            try:
                if not line.endswith(b"\n"):
                    raise msgspec.DecodeError("line is cut off (no newline): truncated file")
                events.append(decoder.decode(line))
            except (msgspec.DecodeError, msgspec.ValidationError) as exc:
                warnings.warn(
                    f"{path}: line {lineno} is damaged ({exc}); loaded the {len(events)} "
                    f"events before it and skipped the rest.",
                    RecordingWarning,
                    stacklevel=2,
                )
                break
        store.extend(events)
    return store, header.get("results")


def _read_header(path: Path, line: bytes) -> dict[str, Any]:
    try:
        header = msgspec.json.decode(line)
    except msgspec.DecodeError as exc:
        raise RecordingError(
            f"{path}: line 1 is not a recording header ({exc}). Recordings are written by "
            "run.save(path)."
        ) from None
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise RecordingError(
            f"{path}: line 1 does not start an interactive_shard recording "
            f"(expected format {FORMAT!r}). Recordings are written by run.save(path)."
        )
    version = header.get("schema_version")
    if not isinstance(version, int) or version > SCHEMA_VERSION:
        raise RecordingError(
            f"{path} uses event schema version {version!r}, written by interactive_shard "
            f"{header.get('package_version', '?')}; this version reads up to schema "
            f"{SCHEMA_VERSION}. Upgrade interactive_shard to open it."
        )
    if "world_size" not in header:
        raise RecordingError(f"{path}: header has no 'world_size'; the file is damaged.")
    return header
