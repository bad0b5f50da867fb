"""Hostile messages for the telemetry channel, and two processes that use them.

Imported by tests (``import hostile``) for the message builders. Run as a script it is
a separate process, so neither its sending nor its memory skews what is measured:

    python tests/hostile.py flood ADDRESS TOKEN --messages N [--oversized K]
        sends N small hostile messages (mixed shapes, cycling) on one connection and
        K oversized ones on another; prints one JSON line: what it sent, by the reason
        the collector should count.
    python tests/hostile.py host
        hosts a Collector (no torch imported: its RSS is the channel's own), prints
        {"address", "token"}, then answers each line on stdin with its counts and peak
        RSS ({"rejected_by_reason", "batches", "peak_rss_mib"}); EOF closes it.

Both roles import ``interactive_shard.telemetry`` without the package's ``__init__``
(which imports torch: 2 s and ~250 MiB, for nothing here).
"""

from __future__ import annotations

import argparse
import json
import resource
import struct
import sys
import types
from pathlib import Path
from typing import Any

import msgspec

ROOT = Path(__file__).resolve().parents[1]


def _light_import() -> None:
    if "interactive_shard" not in sys.modules:
        pkg = types.ModuleType("interactive_shard")
        pkg.__path__ = [str(ROOT / "interactive_shard")]
        sys.modules["interactive_shard"] = pkg


if __name__ == "__main__":
    _light_import()

from interactive_shard.telemetry import schema  # noqa: E402

WRONG = "not-the-token"


def message(token: str, body: bytes, *, rank: int = 0, run: int = 1, flags: int = 0) -> bytes:
    """A message with a well-formed header (any token) and ``body`` as it is."""
    field = schema.token_field(token)
    return schema.HEADER.pack(schema.MAGIC, schema.SCHEMA_VERSION, flags, run, rank, field) + body


def raw_header(token_field: bytes, *, version: int = schema.SCHEMA_VERSION, rank: int = 0) -> bytes:
    return schema.HEADER.pack(schema.MAGIC, version, 0, 1, rank, token_field)


def events_body(*events: list[Any]) -> bytes:
    """A body from raw event arrays ``[kind, rank, step, t, payload]`` (not validated)."""
    return msgspec.msgpack.encode(list(events))


def columns_body(events: list[Any], *runs: tuple[Any, ...]) -> bytes:
    """A ``COLUMNS`` body (``schema.Body``) from raw events and raw scalar runs
    ``(before, names, name_of, values, steps, times)`` (not validated)."""
    return msgspec.msgpack.encode([events, list(runs)])


def scalar_run(n: int, **change: Any) -> tuple[Any, ...]:
    """A well-formed run of ``n`` scalars named "x", with some field changed."""
    fields = {
        "before": 0,
        "names": ["x"],
        "name_of": bytes(4 * n),
        "values": struct.pack(f"<{n}d", *range(n)),
        "steps": struct.pack(f"<{n}q", *range(n)),
        "times": struct.pack(f"<{n}d", *range(n)),
    }
    fields.update(change)
    return tuple(fields.values())


def deep(levels: int) -> bytes:
    """msgpack for ``[[[...None...]]]`` nested ``levels`` deep."""
    return b"\x91" * levels + b"\xc0"


def deep_event_body(levels: int) -> bytes:
    """One event whose payload value nests ``levels`` lists (spliced: the encoder recurses)."""
    head = msgspec.msgpack.encode(["scalar", 0, 0, 1.0])
    return b"\x91\x95" + head[1:] + b"\x81\xa1a" + deep(levels)


def old_format(token: str, payload_msgpack: bytes = b"\x80", rank: int = 0) -> bytes:
    """The first wire format (a bare msgpack Batch); kills a collector of that time when
    the token is not ASCII or the payload nests thousands deep."""
    head = msgspec.msgpack.encode([schema.SCHEMA_VERSION, token, 1, rank])
    event = b"\x95" + msgspec.msgpack.encode(["scalar", rank, 0, 1.0])[1:] + payload_msgpack
    return b"\x96" + head[1:] + b"\x91" + event + b"\xc2"


def columnar(token: str, *runs: tuple[Any, ...], events: list[Any] | None = None) -> bytes:
    """A ``COLUMNS`` message (right header, any token) with these raw scalar runs."""
    return message(token, columns_body(events or [], *runs), flags=schema.COLUMNS)


def authenticated_shapes(token: str) -> dict[str, tuple[bytes, str]]:
    """Messages with the right token that must still be refused: name -> (bytes, reason)."""
    ok = ["scalar", 0, 0, 1.0]
    ts = msgspec.msgpack.Ext(-1, struct.pack(">I", 1))  # the timestamp extension
    return {
        "deep payload": (message(token, deep_event_body(5_000)), schema.MALFORMED),
        "deep body": (message(token, deep(100_000)), schema.MALFORMED),
        "bin value": (message(token, events_body([*ok, {"a": b"\x00"}])), schema.MALFORMED),
        "ext value": (
            message(token, events_body([*ok, {"a": msgspec.msgpack.Ext(5, b"x")}])),
            schema.MALFORMED,
        ),
        "timestamp value": (message(token, events_body([*ok, {"a": ts}])), schema.MALFORMED),
        "nan time": (message(token, events_body(["scalar", 0, 0, float("nan")])), schema.MALFORMED),
        "int key": (message(token, events_body([*ok, {1: 2}])), schema.MALFORMED),
        "truncated": (message(token, events_body([*ok, {}])[:-3]), schema.MALFORMED),
        "columns misaligned": (
            columnar(token, scalar_run(3, steps=struct.pack("<2q", 0, 1))),
            schema.MALFORMED,
        ),
        "columns name index out of range": (
            columnar(token, scalar_run(2, name_of=struct.pack("<2I", 0, 1))),
            schema.MALFORMED,
        ),
        "columns without names": (columnar(token, scalar_run(2, names=[])), schema.MALFORMED),
        "columns time not finite": (
            columnar(token, scalar_run(1, times=struct.pack("<d", float("inf")))),
            schema.MALFORMED,
        ),
        "columns placed beyond the events": (
            columnar(token, scalar_run(1, before=1)),
            schema.MALFORMED,
        ),
        "columns flag on a list of events": (
            message(token, events_body([*ok, {}]), flags=schema.COLUMNS),
            schema.MALFORMED,
        ),
        "newer schema": (
            raw_header(schema.token_field(token), version=schema.SCHEMA_VERSION + 1),
            schema.NEWER_SCHEMA,
        ),
        "negative rank": (raw_header(schema.token_field(token), rank=-1), schema.BAD_RANK),
    }


def unauthenticated_shapes(token: str) -> dict[str, tuple[bytes, str]]:
    """Messages without the right token: name -> (bytes, reason)."""
    non_utf8 = b"\xff\xfe" + schema.token_field(token)[2:]
    return {
        "empty": (b"", schema.NOT_OURS),
        "cut header": (schema.MAGIC + b"\x01\x00", schema.SHORT),
        "garbage": (b"\x00garbage, not even a header" * 4, schema.NOT_OURS),
        "old format, non-ASCII token": (old_format("tök\u00e9n-\u2603"), schema.NOT_OURS),
        "old format, right token, deep": (
            old_format(token, b"\x81\xa1a" + deep(5_000)),
            schema.NOT_OURS,
        ),
        "wrong token": (message(WRONG, events_body(["scalar", 0, 0, 1.0])), schema.WRONG_TOKEN),
        "wrong token, deep body": (message(WRONG, deep(100_000)), schema.WRONG_TOKEN),
        "non-UTF-8 token field": (raw_header(non_utf8) + b"\x90", schema.WRONG_TOKEN),
    }


def flood(address: str, token: str, messages: int, oversized: int) -> dict[str, int]:
    """Send the hostile mix; what was sent, by expected reason (see the module doc)."""
    import zmq

    shapes = {**unauthenticated_shapes(token), **authenticated_shapes(token)}
    cycle = [data for data, _ in shapes.values()]
    reasons = [reason for _, reason in shapes.values()]
    sent: dict[str, int] = {}
    ctx = zmq.Context()
    small, big = ctx.socket(zmq.PUSH), ctx.socket(zmq.PUSH)
    for sock in (small, big):
        sock.setsockopt(zmq.SNDTIMEO, 20_000)  # a collector that went away: give up
        sock.setsockopt(zmq.LINGER, 20_000)
        sock.setsockopt(zmq.RECONNECT_IVL, 10)
        sock.connect(address)
    huge = message(WRONG, b"\x90" * schema.MAX_MESSAGE_BYTES)  # over by the header
    try:
        for i in range(messages):
            small.send(cycle[i % len(cycle)], copy=True)
            sent[reasons[i % len(cycle)]] = sent.get(reasons[i % len(cycle)], 0) + 1
            if oversized and i % max(1, messages // oversized) == 0:
                big.send(huge, copy=False)
                sent["oversized"] = sent.get("oversized", 0) + 1
    finally:
        small.close()
        big.close(linger=0)
        ctx.term()
    return sent


def _peak_rss_mib() -> float:
    """This process's peak RSS. Not ``ru_maxrss``: Linux carries that over from the
    parent across fork and exec, so it would report the test process's own peak."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB elsewhere too


def host() -> None:
    from interactive_shard.telemetry.channel import Collector

    batches = 0

    def count(batch: schema.Batch) -> None:
        nonlocal batches
        batches += 1

    collector = Collector(count)
    print(json.dumps({"address": collector.address, "token": collector.token}), flush=True)
    for _ in sys.stdin:
        stats = {"rejected_by_reason": dict(collector.rejected_by_reason), "batches": batches}
        print(json.dumps({**stats, "peak_rss_mib": _peak_rss_mib()}), flush=True)
    collector.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="role", required=True)
    f = sub.add_parser("flood")
    f.add_argument("address")
    f.add_argument("token")
    f.add_argument("--messages", type=int, default=20_000)
    f.add_argument("--oversized", type=int, default=0)
    sub.add_parser("host")
    args = parser.parse_args()
    if args.role == "host":
        host()
    else:
        print(json.dumps(flood(args.address, args.token, args.messages, args.oversized)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
