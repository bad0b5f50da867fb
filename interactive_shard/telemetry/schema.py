"""Typed, versioned telemetry events: the only data that crosses a process boundary.

An event is ``(kind, rank, step, t, payload)``. ``t`` is ``time.monotonic()`` on the
rank (one clock for all processes of a machine on Linux), ``payload`` holds plain data
only: str, int, float, bool, None, and lists / dicts of those. Never tensors, never
pickles: a probe sends fqns, shapes, dtypes as strings, byte counts and times.

Events travel in batches (``Batch``) encoded with msgpack and decoded with a typed
``msgspec`` decoder, so a malformed or hostile message fails validation instead of
reaching the store.
"""

from __future__ import annotations

from typing import Any

import msgspec

SCHEMA_VERSION = 1
# The most ranks a run may have: a bound on what a header or a message may claim, so
# per-rank state allocated from it stays small (real jobs are far below it).
MAX_WORLD_SIZE = 65_536

# Built-in event kinds. Features add their own (e.g. "bucket").
LOG = "log"  # payload: stream ("stdout" | "stderr"), text (one line)
SCALAR = "scalar"  # payload: name, value
PROGRESS = "progress"  # payload: total (int | None)
STATE = "state"  # payload: state (a RankState value), detail

_PLAIN_SCALARS = (str, int, float, bool, type(None))


class Event(msgspec.Struct, array_like=True, frozen=True):
    """One observation made on a rank (or by the kernel about a rank)."""

    kind: str
    rank: int
    step: int
    t: float
    payload: dict[str, Any] = {}


class Batch(msgspec.Struct, array_like=True):
    """What a rank sends: a run's events, in order. ``final`` closes the run's stream."""

    version: int
    token: str
    run: int
    rank: int
    events: list[Event]
    final: bool = False


class PayloadError(TypeError):
    """A payload value is not plain data (a tensor, an object...)."""


def check_payload(kind: str, payload: dict[str, Any]) -> None:
    """Raise ``PayloadError`` naming the first value that is not plain data.

    Scalars are checked inline (the common case, kept cheap: probes emit every step);
    containers are walked.
    """
    for key, value in payload.items():
        if isinstance(value, _PLAIN_SCALARS):
            continue
        bad = _first_non_plain(value)
        if bad is not None:
            raise PayloadError(
                f"emit({kind!r}): payload value {key!r} contains a {type(bad).__module__}."
                f"{type(bad).__qualname__}, which cannot leave the rank. Send plain data: "
                "numbers, strings, lists and dicts of them (for a tensor use .item() or "
                ".tolist(), for a dtype str(dtype))."
            )


def _first_non_plain(value: Any) -> Any | None:
    if isinstance(value, _PLAIN_SCALARS):
        return None
    if isinstance(value, (list, tuple)):
        for item in value:
            bad = _first_non_plain(item)
            if bad is not None:
                return bad
        return None
    if isinstance(value, dict):
        for k, item in value.items():
            if not isinstance(k, str):
                return k
            bad = _first_non_plain(item)
            if bad is not None:
                return bad
        return None
    return value


_encoder = msgspec.msgpack.Encoder()
_batch_decoder = msgspec.msgpack.Decoder(Batch)


def encode_batch(batch: Batch) -> bytes:
    return _encoder.encode(batch)


def decode_batch(data: bytes) -> Batch:
    """Decode and validate one message; raises ``msgspec.ValidationError``/``DecodeError``."""
    return _batch_decoder.decode(data)
