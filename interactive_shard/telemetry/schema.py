"""Typed, versioned telemetry events: the only data that crosses a process boundary.

An event is ``(kind, rank, step, t, payload)``. ``t`` is ``time.monotonic()`` on the
rank (one clock for all processes of a machine on Linux), ``payload`` holds plain data
only: str, int, float, bool, None, and lists / dicts (str keys) of those, nested at
most ``MAX_PAYLOAD_DEPTH`` containers deep. Never tensors, never pickles: a probe sends
fqns, shapes, dtypes as strings, byte counts and times.

Events travel in batches. On the wire a batch is one ZeroMQ frame: a fixed-size header
(``HEADER``: magic, schema version, flags, run, rank, token), then the events as a
msgpack array. The header is read, and the token compared, before a byte of the body
is decoded; the body is decoded by a typed ``msgspec`` decoder whose types bound the
nesting depth and admit no msgpack bin / ext / timestamp values, so a malformed or
hostile message fails with ``msgspec.DecodeError`` instead of reaching the store.
"""

from __future__ import annotations

import itertools
import operator
import struct
import sys
from typing import TYPE_CHECKING, Annotated, Any, NamedTuple

import msgspec
import numpy as np

SCHEMA_VERSION = 1
# The most ranks a run may have: a bound on what a header or message may claim, so
# per-rank state allocated from it stays small (real jobs are far below it).
MAX_WORLD_SIZE = 65_536
# Containers a payload value may nest ({"a": [[1]]} nests 2). Bounds the decoder's
# recursion far below the C stack; real payloads (shapes, config dicts) nest 1-4.
# Not higher: msgspec builds its type tree for the bound once per process, in time
# and memory that double per level (10 levels: ~25 ms at import; 16: ~2 s).
MAX_PAYLOAD_DEPTH = 10
# The largest message (header + body) a collector accepts. A legitimate batch is far
# smaller (2,000 scalar events take ~90 KB; a DDP watch of 10k parameters ~1.2 MB): the
# Emitter splits batches to fit. It bounds what one message may cost the kernel: its
# bytes, and the objects decoding it builds (at most one per body byte).
MAX_MESSAGE_BYTES = 4 * 1024 * 1024
# Token bytes (UTF-8) carried in the header's fixed-size field.
MAX_TOKEN_BYTES = 64

# Built-in event kinds: every run has them (the cluster emits them, the monitor reads
# them). Their payloads are the Structs of telemetry/run_events.py, which take these names as
# their KIND. Features add their own kinds (e.g. "bucket").
LOG = "log"  # run_events.Log: one line of a rank's stdout / stderr
SCALAR = "scalar"  # run_events.Scalar: a number at a step
PROGRESS = "progress"  # run_events.Progress: a step of ctx.steps(total) begins
STATE = "state"  # run_events.State: a rank's state changed
RANK = "rank"  # run_events.RankInfo: where a rank runs (host, node, process, clock)
OVERHEAD = "overhead"  # run_events.Overhead: what a probe's own work cost a rank

_RANK = operator.attrgetter("rank")
_PLAIN_SCALARS = (str, int, float, bool, type(None))
_PLAIN_TYPES = frozenset(_PLAIN_SCALARS)


def _plain(depth: int) -> Any:
    """The type of a payload value nesting at most ``depth`` containers.

    Built with ``|`` (types.UnionType): ``typing.Union`` hashes its arguments to
    deduplicate them, which takes time doubling per level here.
    """
    t: Any = str | int | float | bool | None
    for _ in range(depth):
        t = str | int | float | bool | None | list[t] | dict[str, t]
    return t


if TYPE_CHECKING:
    Payload = dict[str, Any]
else:  # what the decoder enforces
    Payload = dict[str, _plain(MAX_PAYLOAD_DEPTH)]
_Rank = Annotated[int, msgspec.Meta(ge=0, lt=MAX_WORLD_SIZE)]
MIN_STEP, MAX_STEP = -(2**63), 2**63 - 1  # 64-bit, as models' arrays and recordings hold it
_Step = Annotated[int, msgspec.Meta(ge=MIN_STEP, le=MAX_STEP)]
_Time = Annotated[float, msgspec.Meta(ge=-sys.float_info.max, le=sys.float_info.max)]  # finite


class Event(msgspec.Struct, array_like=True, frozen=True, forbid_unknown_fields=True, gc=False):
    """One observation made on a rank (or by the kernel about a rank).

    Decoding refuses extra trailing fields rather than skipping them: a skip would walk
    a value of any depth (a newer schema is refused by version instead). ``gc=False``:
    a store holds millions of events, and plain data cannot form a cycle through one
    (never put an Event inside its own payload); decoding is ~8% faster, a full
    collection with 1M events alive ~2x.
    """

    kind: str
    rank: _Rank
    step: _Step
    t: _Time
    payload: Payload = {}


def record_event(record: Any, rank: int, step: int, t: float) -> Event:
    """``record`` (an event Struct with its ``KIND``) as the Event a probe sends."""
    return Event(record.KIND, rank, step, t, msgspec.to_builtins(record))


class Scalars(msgspec.Struct, array_like=True, frozen=True, forbid_unknown_fields=True, gc=False):
    """A run of a batch's scalar events as columns, on the wire (Note [Columnar scalars]).

    Each bytes field holds one little-endian value per scalar; the kernel reads them as
    numpy arrays (``open_scalars``) and never builds an event object for them.
    """

    before: Annotated[int, msgspec.Meta(ge=0)]  # how many of the batch's events precede it
    names: list[str]  # the distinct names of the run
    name_of: bytes  # uint32: each scalar's index into names
    values: bytes  # float64
    steps: bytes  # int64
    times: bytes  # float64, finite


class Body(msgspec.Struct, array_like=True, frozen=True, forbid_unknown_fields=True, gc=False):
    """A message body with columnar scalars (flag ``COLUMNS``): the batch's other events
    and its scalar runs, each placed by ``Scalars.before``."""

    events: list[Event]
    scalars: list[Scalars]


class ScalarRun(NamedTuple):
    """A checked ``Scalars``: aligned numpy arrays (read-only views of the message)."""

    before: int
    names: list[str]
    name_of: np.ndarray  # uint32, each < len(names)
    values: np.ndarray  # float64
    steps: np.ndarray  # int64
    times: np.ndarray  # float64, finite

    @property
    def size(self) -> int:
        """How many scalars it holds."""
        return len(self.values)


class Batch(msgspec.Struct, array_like=True):
    """What a rank sends: a run's events, in order. ``final`` closes the run's stream.

    ``scalars``: runs of scalar events sent as columns, each placed among ``events`` by
    its ``before`` (``RunStore.extend`` keeps the rank's order).
    """

    version: int
    token: str
    run: int
    rank: int
    events: list[Event]
    final: bool = False
    scalars: list[ScalarRun] = []

    @property
    def size(self) -> int:
        """How many events the batch carries, columnar scalars included."""
        return len(self.events) + sum(run.size for run in self.scalars)


class PayloadError(TypeError):
    """A payload value is not plain data (a tensor, an object...)."""


class MessageError(msgspec.DecodeError):
    """A message or batch the kernel refuses; ``reason`` is its key in the counts."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


# Reasons a message is refused: keys of ``Collector.rejected_by_reason``.
SHORT = "shorter than a header"
NOT_OURS = "not an interactive_shard message"
WRONG_TOKEN = "wrong token"
OVERSIZED = "oversized"
NEWER_SCHEMA = "newer schema"
BAD_RANK = "rank outside 0..MAX_WORLD_SIZE-1"
MALFORMED = "malformed body"
UNKNOWN_RANK = "rank outside the run"
RANK_MISMATCH = "event rank != batch rank"


def check_payload(kind: str, payload: dict[str, Any]) -> None:
    """Raise ``PayloadError`` naming the first value that is not plain data.

    Scalars are checked inline (the common case, kept cheap: probes emit every step);
    containers are walked, with their depth. What passes, the collector decodes.
    """
    for key, value in payload.items():
        if type(value) in _PLAIN_TYPES and type(key) is str:  # exact types: fastest test
            continue
        if not isinstance(key, str):
            raise PayloadError(f"emit({kind!r}): payload key {key!r} is not a str.")
        problem = plain_problem(value, MAX_PAYLOAD_DEPTH)
        if problem is not None:
            raise PayloadError(
                f"emit({kind!r}): payload value {key!r} {problem}. Send plain data: numbers, "
                "strings, lists and dicts (str keys) of them (for a tensor use .item() or "
                ".tolist(), for a dtype str(dtype); flatten what nests deeper)."
            )


def plain_problem(value: Any, depth: int) -> str | None:
    """Why ``value`` is not plain data nesting at most ``depth`` containers, or None.

    Used by ``check_payload`` on the rank and by the recording checks in the kernel.
    The walk stops at the depth bound, so a cyclic or hostile value cannot recurse out.
    """
    if isinstance(value, _PLAIN_SCALARS):
        return None
    if isinstance(value, dict):
        for k in value:
            if not isinstance(k, str):
                return f"has a key {k!r} that is not a string"
        items: Any = value.values()
    elif isinstance(value, (list, tuple)):
        items = value
    else:
        kind = type(value)
        return f"holds a {kind.__module__}.{kind.__qualname__}, which is not plain data"
    if depth == 0:
        return f"nests more than {MAX_PAYLOAD_DEPTH} lists/dicts deep"
    for item in items:
        problem = plain_problem(item, depth - 1)
        if problem is not None:
            return problem
    return None


def check_batch(batch: Batch, world_size: int) -> None:
    """Raise ``MessageError`` unless ``batch`` speaks for one rank of a run of ``world_size``.

    The batch's rank must lie in ``0..world_size-1`` and every event must be that
    rank's. Called by the consumers that know the world size (``Cluster``, ``Listener``).
    """
    rank = batch.rank
    if not 0 <= rank < world_size:
        raise MessageError(
            UNKNOWN_RANK, f"batch from rank {rank}; this run has ranks 0..{world_size - 1}"
        )
    ranks = set(map(_RANK, batch.events))  # C loops: this runs for every event received
    if ranks - {rank}:
        other = min(ranks - {rank})
        raise MessageError(
            RANK_MISMATCH, f"batch from rank {rank} carries an event of rank {other}"
        )


# -- wire format ---------------------------------------------------------------------------
# magic, schema version, flags, (pad), run, rank, token (NUL-padded UTF-8): 84 bytes.
HEADER = struct.Struct("<4sHBxqi64s")
HEADER_SIZE = HEADER.size
MAGIC = b"ish\x02"  # \x02: the second wire format (the first was a bare msgpack Batch)
FINAL = 1  # flag: the batch closes its run's stream
BYE = 2  # flag: the sender is closing its connection (nothing follows)
COLUMNS = 4  # flag: the body is a ``Body`` (columnar scalars), not a list of events


class Header(NamedTuple):
    version: int
    flags: int
    run: int
    rank: int
    token: bytes  # the raw, padded field


def token_field(token: str) -> bytes:
    """The header's token field for ``token``; ``ValueError`` if it cannot be carried."""
    try:
        raw = token.encode("utf-8") if isinstance(token, str) else None
    except UnicodeEncodeError:  # lone surrogates
        raw = None
    if raw is None or not 0 < len(raw) <= MAX_TOKEN_BYTES or b"\0" in raw:
        size = f"{type(token).__name__} that is not UTF-8" if raw is None else f"{len(raw)} bytes"
        raise ValueError(
            f"telemetry token must be a str of 1 to {MAX_TOKEN_BYTES} UTF-8 bytes without "
            f"NUL, got {size}. Use secrets.token_hex(16), or leave it out to get one."
        )
    return raw.ljust(MAX_TOKEN_BYTES, b"\0")


def read_header(buf: Any) -> Header:
    """The header of a message (any bytes-like); ``MessageError`` if there is none."""
    if buf[:4] != MAGIC:
        raise MessageError(NOT_OURS, f"starts with {bytes(buf[:4])!r}, not {MAGIC!r}")
    if len(buf) < HEADER_SIZE:
        raise MessageError(SHORT, f"{len(buf)} bytes, shorter than the {HEADER_SIZE}-byte header")
    _, version, flags, run, rank, token = HEADER.unpack_from(buf)
    return Header(version, flags, run, rank, token)


def check_header(header: Header) -> None:
    """What an authenticated header must satisfy before its body is decoded."""
    if header.version > SCHEMA_VERSION:
        raise MessageError(
            NEWER_SCHEMA,
            f"schema version {header.version} is newer than {SCHEMA_VERSION}: "
            "upgrade interactive_shard in the notebook",
        )
    if not 0 <= header.rank < MAX_WORLD_SIZE:
        raise MessageError(BAD_RANK, f"rank {header.rank} outside 0..{MAX_WORLD_SIZE - 1}")


def encode_message(
    encoder: msgspec.msgpack.Encoder,
    version: int,
    token: bytes,
    run: int,
    rank: int,
    body: Any,
    flags: int = 0,
) -> bytearray:
    """One message: header, then the body (encoded in place after it, no copy): a
    sequence of events, or with flag ``COLUMNS`` a ``Body``'s fields."""
    buf = bytearray(HEADER.pack(MAGIC, version, flags, run, rank, token))
    encoder.encode_into(body, buf, HEADER_SIZE)
    return buf


# Note [Columnar scalars]
# ~~~~~~~~~~~~~~~~~~~~~~~
# Scalars are what a rank sends most (a loss, a learning rate, every step), and as
# events each costs the kernel ~1.4 us: msgspec builds an Event and a payload dict
# (~0.6 us), the store files it (~0.2 us) and the monitor reads it back (~0.6 us, a
# cache miss each). So the Emitter buffers a scalar whose payload is exactly a name and
# a float as a 4-tuple ``(name, value, step, t)``, and ``pack_body`` sends a long run
# of them (``MIN_COLUMNS`` or more, in a row) as one ``Scalars``: its columns travel as
# little-endian bytes, the kernel checks them in numpy (``open_scalars``) and the store
# keeps them as columns, building an Event only when one is read as an event. Shorter
# runs go as events: a run's fixed cost (six arrays) would exceed what it saves. Order
# is kept: each run says how many of the batch's other events come before it.

MIN_COLUMNS = 32  # scalars in a row that go as one columnar run
_LEN = len
# The wire's columns are little-endian whatever the machine: name_of, values, steps, times.
_U32, _F64, _I64 = np.dtype("<u4"), np.dtype("<f8"), np.dtype("<i8")
_WIRE = (_U32, _F64, _I64, _F64)


def pack_body(rank: int, buffered: list[tuple[Any, ...]]) -> tuple[Any, int]:
    """What to encode for the buffered tuples (``Emitter``'s), and the flags it needs:
    the events themselves, or a ``Body`` when a run of scalars is long enough."""
    lengths = list(map(_LEN, buffered))
    scalars = lengths.count(4)
    if scalars < MIN_COLUMNS:
        return [_as_event(rank, e) if len(e) == 4 else e for e in buffered], 0
    if scalars == len(buffered):  # the common case when scalars are what is sent
        return ([], [_scalar_run(0, buffered)]), COLUMNS
    events: list[tuple[Any, ...]] = []
    runs: list[tuple[Any, ...]] = []
    i = 0
    for length, group in itertools.groupby(lengths):
        part = buffered[i : i + len(list(group))]
        i += len(part)
        if length != 4:
            events.extend(part)
        elif len(part) < MIN_COLUMNS:
            events.extend(_as_event(rank, e) for e in part)
        else:
            runs.append(_scalar_run(len(events), part))
    return (events, runs), COLUMNS


_COLUMN = [operator.itemgetter(i) for i in range(4)]


def _scalar_run(before: int, part: list[tuple[Any, ...]]) -> tuple[Any, ...]:
    """A ``Scalars`` (as a tuple: msgpack encodes both alike) of buffered scalars; each
    column packed by ``struct`` from a C-level map (faster here than numpy's fromiter)."""
    n = len(part)
    names = list(map(_COLUMN[0], part))
    distinct = list(dict.fromkeys(names))
    if len(distinct) == 1:
        name_of = bytes(4 * n)  # every index 0
    else:
        index = {name: i for i, name in enumerate(distinct)}
        name_of = struct.pack(f"<{n}I", *map(index.__getitem__, names))
    values = struct.pack(f"<{n}d", *map(_COLUMN[1], part))
    steps = struct.pack(f"<{n}q", *map(_COLUMN[2], part))
    return (before, distinct, name_of, values, steps, struct.pack(f"<{n}d", *map(_COLUMN[3], part)))


def _as_event(rank: int, scalar: tuple[Any, ...]) -> tuple[Any, ...]:
    name, value, step, t = scalar
    return (SCALAR, rank, step, t, {"name": name, "value": value})


def open_scalars(body: Body) -> list[ScalarRun]:
    """The columnar runs of a decoded ``Body``, checked; ``MessageError`` if one is not
    well formed (columns of unequal lengths, a name index out of range, a time that is
    not finite, runs out of order)."""
    runs = []
    before = 0
    for i, s in enumerate(body.scalars):
        where = f"scalar run {i}"
        if not before <= s.before <= len(body.events):
            span = f"{before}..{len(body.events)}"
            raise MessageError(MALFORMED, f"{where}: before={s.before} outside {span}")
        before = s.before
        n, rest = divmod(len(s.values), 8)
        if rest or len(s.steps) != 8 * n or len(s.times) != 8 * n or len(s.name_of) != 4 * n:
            sizes = f"{len(s.name_of)}, {len(s.values)}, {len(s.steps)}, {len(s.times)}"
            raise MessageError(MALFORMED, f"{where}: column bytes {sizes} do not align")
        name_of = np.frombuffer(s.name_of, _U32)
        times = np.frombuffer(s.times, _F64)
        if n and (not s.names or int(name_of.max()) >= len(s.names)):
            raise MessageError(MALFORMED, f"{where}: a name index >= its {len(s.names)} name(s)")
        if not np.isfinite(times).all():
            raise MessageError(MALFORMED, f"{where}: a time is not finite")
        values, steps = np.frombuffer(s.values, _F64), np.frombuffer(s.steps, _I64)
        runs.append(ScalarRun(s.before, s.names, name_of, values, steps, times))
    return runs


_encoder = msgspec.msgpack.Encoder()
_events_decoder = msgspec.msgpack.Decoder(list[Event])
_body_decoder = msgspec.msgpack.Decoder(Body)


def decode_events(body: Any) -> list[Event]:
    """Decode a message body; raises ``msgspec.DecodeError`` (or its ``ValidationError``)."""
    return _events_decoder.decode(body)


def decode_body(flags: int, body: Any) -> tuple[list[Event], list[ScalarRun]]:
    """A message body's events and columnar scalar runs, by the header's ``flags``;
    raises ``msgspec.DecodeError`` (``MessageError``, ``ValidationError``)."""
    if not flags & COLUMNS:
        return _events_decoder.decode(body), []
    decoded = _body_decoder.decode(body)
    return decoded.events, open_scalars(decoded)


def encode_batch(batch: Batch) -> bytes:
    flags = (FINAL if batch.final else 0) | (COLUMNS if batch.scalars else 0)
    token = token_field(batch.token)
    body: Any = batch.events
    if batch.scalars:
        runs = [(r.before, r.names, *map(_wire_bytes, r[2:], _WIRE)) for r in batch.scalars]
        body = (batch.events, runs)
    args = (batch.version, token, batch.run, batch.rank, body, flags)
    return bytes(encode_message(_encoder, *args))


def _wire_bytes(column: np.ndarray, dtype: Any) -> bytes:
    return np.asarray(column, dtype).tobytes()


def decode_batch(data: Any) -> Batch:
    """Decode and validate one message (token not checked); raises ``msgspec.DecodeError``.

    ``MessageError`` and ``msgspec.ValidationError`` are the subclasses it raises.
    """
    view = memoryview(data)
    header = read_header(view)
    check_header(header)
    try:
        token = header.token.rstrip(b"\0").decode("utf-8")
    except UnicodeDecodeError:
        raise MessageError(WRONG_TOKEN, "the token field is not UTF-8") from None
    events, scalars = decode_body(header.flags, view[HEADER_SIZE:])
    final = bool(header.flags & FINAL)
    return Batch(header.version, token, header.run, header.rank, events, final, scalars)
