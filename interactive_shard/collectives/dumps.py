"""torch's Flight Recorder dump files, read into the collective ledger: one ``Ledger``
event per rank in a ``RunStore`` (``ish.load_flight_recorder`` makes the ``Run``).

Note [Reading Flight Recorder dumps]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~

Background: a torchrun job with the Flight Recorder on (``TORCH_FR_BUFFER_SIZE``) writes
one file per rank, ``${TORCH_FR_DUMP_TEMP_FILE}${rank}``: the pickle of plain dicts that
``torch._C._distributed_c10d._dump_fr_trace()`` returns, or the JSON form of
``_dump_fr_trace_json()`` (what each form holds, by release: ``probing/compat/
flight_recorder.py``). A file is hostile input. Loading a pickle can import and call
anything; even one of plain data can crash the interpreter (a tuple nested a million
deep, used as a dict key: hashing it recurses in C) or take hours to walk (lists that
share lists, a "memo bomb": 40 small opcodes reach 2**40 objects).

Algorithm (``read_dump``), each refusal a ``RecordingError`` naming the file:

1. A file over ``MAX_FILE_BYTES`` is refused before it is read.
2. JSON (it starts with ``{``) is decoded straight into ``FrDump`` (its bounds checked).
3. A pickle's opcodes are scanned first, building nothing (``pickletools``): at most
   ``MAX_PICKLE_OPS``, only those plain data needs (no global, no call, no object
   construction), tuples nested at most ``MAX_TUPLE_DEPTH``.
4. It is loaded by an unpickler whose ``find_class`` refuses every global (a second
   wall: step 3 already refused them).
5. Its objects are counted as ``msgspec.convert`` will reach them (a shared one each time),
   at most ``NODES_PER_OP`` per opcode and ``MAX_NODES``; then converted to ``FrDump``.
6. Each rank's entries become ledger entries (``to_ledger``); ``issued`` per group is its
   highest ``collective_seq_id``, groups come from ``pg_config`` where it names them.

Caveats: a dump has no ``still`` report, so a rank whose newest collective is not
completed is read as waiting in it (a dump taken at a hang, or racing the collective's
retirement: ``probing/compat/flight_recorder.py``), with that entry's stack.
The ranks' dumps are snapshots, perhaps taken at different moments.
"""

from __future__ import annotations

import io
import os
import pickle
import pickletools
import re
import reprlib
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeAlias

import msgspec

from interactive_shard.collectives.events import MAX_NAME, Ledger, LedgerGroup
from interactive_shard.collectives.flight_recorder import (
    FrDump,
    FrEntry,
    decode_json,
    frame_text,
    to_ledger,
)
from interactive_shard.telemetry.recording import RecordingError
from interactive_shard.telemetry.schema import MAX_WORLD_SIZE, record_event
from interactive_shard.telemetry.store import RunInfo, RunStore

MAX_FILE_BYTES = 256 * 1024 * 1024  # torch's default ring (2,000 entries) dumps a few MB
MAX_PICKLE_OPS = 1 << 23  # ~2 s to scan; a 2,048-entry dump with stacks takes ~0.3M
MAX_NODES = 1 << 24  # objects reached, shared ones each time
NODES_PER_OP = 64  # torch shares each frame dict among entries: ~1.02 per opcode measured
MAX_TUPLE_DEPTH = 32  # a dump's tuples hold strings
ENTRIES_PER_EVENT = 4096  # one event stays small, as the recorder's
HOW_TO_FIX = (
    "A Flight Recorder dump is the file torch writes per rank "
    "(${TORCH_FR_DUMP_TEMP_FILE}<rank>), or the bytes of "
    "torch._C._distributed_c10d._dump_fr_trace() (a pickle of plain dicts) or "
    "_dump_fr_trace_json(): an object whose `entries` list the rank's collectives; "
    "pass those files unchanged."
)

PathLike: TypeAlias = str | os.PathLike[str]
Paths: TypeAlias = PathLike | Sequence[PathLike] | Mapping[int, PathLike]

_RANK_IN_NAME = re.compile(r"(\d+)$")
_AT = re.compile(r"at `\$((?:\.\w+|\[\d+\])*)`")
_STEP = re.compile(r"\.(\w+)|\[(\d+)\]")
_PUSH = frozenset(
    "NONE NEWTRUE NEWFALSE INT BININT BININT1 BININT2 LONG LONG1 LONG4 FLOAT BINFLOAT "
    "STRING BINSTRING SHORT_BINSTRING BINBYTES SHORT_BINBYTES BINBYTES8 UNICODE "
    "BINUNICODE SHORT_BINUNICODE BINUNICODE8 EMPTY_LIST EMPTY_DICT EMPTY_TUPLE".split()
)
_GET = frozenset({"GET", "BINGET", "LONG_BINGET"})
_PUT = frozenset({"PUT", "BINPUT", "LONG_BINPUT"})
_TO_MARK = frozenset({"TUPLE", "LIST", "DICT", "APPENDS", "SETITEMS", "POP_MARK"})
_TUPLE_N = {"TUPLE1": 1, "TUPLE2": 2, "TUPLE3": 3}
_POPS = {"APPEND": 1, "SETITEM": 2, "POP": 1, "STOP": 1}
_SHOW = reprlib.Repr()
_SHOW.maxstring = _SHOW.maxother = 80


class _Refused(Exception):
    """What is wrong with a file (``read_dump`` names the file and how to fix it)."""


def read_dumps(paths: Paths) -> RunStore:
    """A store with one ``ledger`` event per rank read from its Flight Recorder dump.

    ``paths``: one file, a list of files (the digits that end each name are its rank,
    as torch names them; names without: their order), or ``{rank: file}``.
    """
    files = rank_files(paths)
    dumps = {rank: read_dump(path) for rank, path in files.items()}
    return to_store(dumps, files)


def rank_files(paths: Paths) -> dict[int, Path]:
    """Rank -> file; two files of one rank are refused (which is which is unknown)."""
    if isinstance(paths, str | os.PathLike):
        paths = [paths]
    if isinstance(paths, Mapping):
        pairs = [(_rank(r, p), _path(p)) for r, p in paths.items()]
    else:
        files = [_path(p) for p in paths]
        found = [_RANK_IN_NAME.search(f.name) or _RANK_IN_NAME.search(f.stem) for f in files]
        ranks = [int(m.group(1)) if m else -1 for m in found]
        if -1 in ranks:
            ranks = list(range(len(files)))
        pairs = [(_rank(r, f), f) for r, f in zip(ranks, files, strict=True)]
    if not pairs:
        raise RecordingError(f"no Flight Recorder dump given: pass one file per rank. {HOW_TO_FIX}")
    out: dict[int, Path] = {}
    for rank, path in pairs:
        if rank in out:
            raise RecordingError(
                f"{out[rank]} and {path} are both rank {rank} (the digits that end a dump's "
                "name are its rank, as torch writes ${TORCH_FR_DUMP_TEMP_FILE}<rank>): pass "
                "one file per rank, or {rank: path} to say which is which."
            )
        out[rank] = path
    return out


def _path(p: Any) -> Path:
    if not isinstance(p, str | os.PathLike):
        raise TypeError(f"a dump's path is a str or os.PathLike, not {type(p).__name__}: {p!r}")
    return Path(p)


def _rank(rank: Any, path: Any) -> int:
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < MAX_WORLD_SIZE:
        raise RecordingError(
            f"{path}: rank {_SHOW.repr(rank)} is not a rank (an int from 0 to "
            f"{MAX_WORLD_SIZE - 1}); name the file ...<rank> as torch does, or pass "
            "{rank: path}."
        )
    return rank


def read_dump(path: PathLike) -> FrDump:
    """One rank's dump, JSON or pickle, checked (Note [Reading Flight Recorder dumps])."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"no Flight Recorder dump at {str(path)!r}")
    size = path.stat().st_size
    if size <= MAX_FILE_BYTES:
        with path.open("rb") as f:
            data = f.read(MAX_FILE_BYTES + 1)  # it may have grown since
        size = len(data)
    if size > MAX_FILE_BYTES:
        raise RecordingError(
            f"{path} is {size:,} bytes, over the {MAX_FILE_BYTES:,}-byte limit for a dump "
            f"(a ring of thousands of entries takes a few MB): not read. {HOW_TO_FIX}"
        )
    try:
        if not data.strip():
            raise _Refused("it is empty")
        if data.lstrip()[:1] == b"{":
            return _from_json(data)
        return _from_pickle(data)
    except _Refused as why:
        raise RecordingError(f"{path} is not a Flight Recorder dump: {why}. {HOW_TO_FIX}") from None


def _from_json(data: bytes) -> FrDump:
    try:
        return decode_json(data)
    except msgspec.ValidationError as err:
        # decoded again untyped, only to show the value (a large file's would cost GBs)
        small = len(data) <= 16 * 1024 * 1024
        raise _Refused(_invalid(err, lambda: msgspec.json.decode(data) if small else {})) from None
    except msgspec.DecodeError as err:
        raise _Refused(f"it is not valid JSON ({err}; a truncated file?)") from None
    except RecursionError:
        raise _Refused("its JSON nests far deeper than a dump's") from None


def _from_pickle(data: bytes) -> FrDump:
    ops = _scan(data)
    try:
        obj = _Unpickler(io.BytesIO(data)).load()
    except _Refused:
        raise
    except Exception as err:  # whatever a damaged pickle makes the unpickler raise
        raise _Refused(f"it is a damaged pickle ({type(err).__name__}: {err})") from None
    _count(obj, min(MAX_NODES, NODES_PER_OP * ops + 4096), ops)
    try:
        return msgspec.convert(obj, FrDump)
    except msgspec.ValidationError as err:
        raise _Refused(_invalid(err, lambda: obj)) from None


class _Unpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        raise _Refused(_global(f"{module}.{name}"))


def _global(name: str) -> str:
    return (
        f"it is a pickle that asks for {_SHOW.repr(name)}: loading it would import and run "
        "code, so it was not loaded (a dump holds dicts, lists, strings and numbers only)"
    )


def _scan(data: bytes) -> int:
    """The pickle's opcode count, after checking each (step 3 of the Note); nothing is
    built. Only tuples' nesting is followed: they alone are hashed when nested."""
    stack: list[int] = []  # per stack item: how deep it nests tuples
    marks: list[int] = []
    memo: dict[Any, int] = {}
    texts = ["", ""]  # the last two strings pushed (STACK_GLOBAL's module and name)
    ops = 0
    try:
        for op, arg, _ in pickletools.genops(data):
            ops += 1
            if ops > MAX_PICKLE_OPS:
                raise _Refused(
                    f"it is a pickle of more than {MAX_PICKLE_OPS:,} opcodes (a dump of "
                    "2,048 entries with their stacks takes ~300,000)"
                )
            name = op.name
            if name in _PUSH:
                stack.append(0)
                if isinstance(arg, str):
                    texts = [texts[1], arg]
            elif name in _GET:
                stack.append(memo.get(arg, 0))
            elif name in _PUT:
                memo[arg] = stack[-1]
            elif name == "MEMOIZE":
                memo[len(memo)] = stack[-1]
            elif name == "MARK":
                marks.append(len(stack))
            elif name in _TO_MARK:
                start = marks.pop()
                items = stack[start:]
                del stack[start:]
                if name == "TUPLE":
                    stack.append(1 + max(items, default=0))
                elif name in ("LIST", "DICT"):
                    stack.append(0)
            elif name in _TUPLE_N:
                n = _TUPLE_N[name]
                if len(stack) < n:
                    raise IndexError("a tuple of missing items")
                items = stack[-n:]
                del stack[-n:]
                stack.append(1 + max(items))
            elif name in _POPS:
                for _ in range(_POPS[name]):
                    stack.pop()
            elif name == "DUP":
                stack.append(stack[-1])
            elif name in ("GLOBAL", "STACK_GLOBAL"):
                asked = str(arg).replace(" ", ".") if name == "GLOBAL" else ".".join(texts)
                raise _Refused(_global(asked))
            elif name not in ("PROTO", "FRAME"):
                raise _Refused(
                    f"it is a pickle with the opcode {name}, which builds or calls objects "
                    "other than plain data: it was not loaded"
                )
            if stack and stack[-1] > MAX_TUPLE_DEPTH:
                raise _Refused(f"it is a pickle of tuples nested over {MAX_TUPLE_DEPTH} deep")
    except _Refused:
        raise
    except Exception as err:  # pickletools' reading of a cut or garbled opcode stream
        raise _Refused(
            f"it is neither JSON nor a complete pickle ({type(err).__name__}: {err}; "
            "a truncated file?)"
        ) from None
    return ops


def _count(obj: Any, budget: int, ops: int) -> None:
    """Refuse ``obj`` when more than ``budget`` objects are reached from it (step 5)."""
    todo = [obj]
    reached = 0
    while todo:
        x = todo.pop()
        reached += 1
        if reached > budget:
            raise _Refused(
                f"its pickle's {ops:,} opcodes reach more than {budget:,} objects (lists "
                "and dicts shared many times over, or simply too many): reading it would "
                "not end in reasonable time"
            )
        if isinstance(x, dict):
            todo.extend(x.keys())
            todo.extend(x.values())
        elif isinstance(x, list | tuple):
            todo.extend(x)


def _invalid(err: msgspec.ValidationError, raw: Any) -> str:
    """What msgspec refused, where, and the value found there."""
    where = _AT.search(str(err))
    if where is None:
        return f"it does not fit a dump ({err})"
    try:
        value: Any = raw()
        for key, index in _STEP.findall(where.group(1)):
            value = value[key] if key else value[int(index)]
        shown = f" is {_show(value)}"
    except Exception:  # a value the path does not reach, or a file too deep to decode
        shown = ""
    return f"`{where.group(1).lstrip('.') or 'its top level'}`{shown}: {err}"


def _show(value: Any) -> str:
    if isinstance(value, int) and value.bit_length() > 256:
        return f"an int of {value.bit_length():,} bits"
    return _SHOW.repr(value)


def to_store(dumps: Mapping[int, FrDump], files: Mapping[int, Path]) -> RunStore:
    """The run of these ranks' dumps: one ``ledger`` event each (step 6)."""
    everything = [e for d in dumps.values() for e in d.entries]
    world_size = max(dumps) + 1
    store = RunStore(
        RunInfo(
            world_size=world_size,
            backend=_backend(everything),
            device_types=["unknown"] * world_size,
            name="Flight Recorder dumps",
            extra={"flight_recorder_version": next((d.version for d in dumps.values()), "")},
        )
    )
    t = max((e.time_created_ns for e in everything), default=0) / 1e9
    names = {e.process_group[0] for e in everything}
    groups = _groups(dumps.values(), names)
    for rank in sorted(dumps):
        ledger = _ledger(dumps[rank], t, groups)
        try:  # as the model will read it: a ledger it could not read would be lost
            msgspec.convert(msgspec.to_builtins(ledger), Ledger)
        except msgspec.ValidationError as err:
            raise RecordingError(
                f"{files[rank]} is not a Flight Recorder dump the ledger can hold: {err} "
                f"(names are at most {MAX_NAME} characters). {HOW_TO_FIX}"
            ) from None
        entries = ledger.entries
        n = ENTRIES_PER_EVENT
        chunks = [entries[i : i + n] for i in range(0, len(entries), n)] or [[]]
        for i, chunk in enumerate(chunks):
            # the position, groups and where it waits come with its last entries
            last = i == len(chunks) - 1
            part = msgspec.structs.replace(ledger, entries=chunk) if last else Ledger(entries=chunk)
            store.append(record_event(part, rank, 0, t))
    return store


def _ledger(dump: FrDump, t: float, groups: list[LedgerGroup]) -> Ledger:
    issued: dict[str, int] = {}
    for e in dump.entries:
        if not e.is_p2p and e.collective_seq_id >= 1:
            name = e.process_group[0]
            issued[name] = max(issued.get(name, 0), e.collective_seq_id)
    waits = _waits_in(dump)
    start = waits.time_created_ns / 1e9 if waits is not None and waits.time_created_ns else t
    return Ledger(
        entries=to_ledger(dump, unfinished="pending"),
        groups=[g for g in groups if g.name in issued],
        issued=issued,
        still_s=None if waits is None else max(t - start, 0.0),
        in_collective=waits is not None,
        stack=[] if waits is None else [frame_text(f) for f in reversed(waits.frames[:64])],
    )


def _waits_in(dump: FrDump) -> FrEntry | None:
    """The newest collective not completed: the one the rank waited in at the dump."""
    open_ = [
        e
        for e in dump.entries
        if not (e.is_p2p or e.retired or e.state == "completed") and e.collective_seq_id >= 1
    ]
    return max(open_, key=lambda e: (e.time_created_ns, e.record_id), default=None)


def _groups(dumps: Iterable[FrDump], names: set[str]) -> list[LedgerGroup]:
    """The groups ``pg_config`` names with their ranks (others: the ledger infers them)."""
    found: dict[str, list[int]] = {}
    for dump in dumps:
        for name, config in dump.pg_config.items():
            ranks = config.ranks
            if isinstance(ranks, str):
                try:
                    ranks = msgspec.json.decode(ranks, type=list[int])
                except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
                    continue
            ok = all(0 <= r < MAX_WORLD_SIZE for r in ranks) and len(ranks) <= MAX_WORLD_SIZE
            if name in names and name not in found and ranks and ok and len(name) <= MAX_NAME:
                found[name] = ranks
    return [LedgerGroup(name=n, ranks=r) for n, r in sorted(found.items())]


def _backend(entries: list[FrEntry]) -> str:
    """The backend most entries name (``"gloo:all_reduce"``), or ``"unknown"``."""
    names = Counter(e.profiling_name.partition(":")[0] for e in entries if ":" in e.profiling_name)
    best = names.most_common(1)
    return best[0][0] if best and best[0][0].isalnum() and len(best[0][0]) <= 32 else "unknown"
