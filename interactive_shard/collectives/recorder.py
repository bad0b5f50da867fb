"""The collective ledger's rank side: every collective this rank issues, per process
group, in order, from the moment its process group exists (``Feature.rank_start``).

Note [Collective ledger]
~~~~~~~~~~~~~~~~~~~~~~~~

Background: collectives reach the backend two ways. Python code (the user's, FSDP,
DDP's buffer sync) calls ``torch.distributed`` functions, which the shared wrappers
(``probing.collectives``) see with the caller's stack. DDP's gradient buckets are
all-reduced by the C++ Reducer and never pass Python. torch's Flight Recorder records
both, each with its group's sequence number (``collective_seq_id``), but reading it
serializes its whole ring, ~30 us an entry (``probing/compat/flight_recorder.py``): too
dear to poll while training. The group's own counter of issued collectives is cheap.

Algorithm: the recorder turns the Flight Recorder on (a ring of ``RING`` entries, unless
the user chose a size: it is read at the first collective). A call listener notes each
Python collective as a ``LedgerEntry``: its group, its sequence number (the group's
counter after the call, minus one), op, dtype, shape, bytes and caller, found on the
stack (a DDP method, FSDP, or the first frame outside torch and this package: the user's
``file:line``). A daemon thread wakes every ``POLL_S``: it reads each known group's
counter (the rank's position) and sends what is new (one ``ledger`` event). When a run
is in progress and the position has not moved for ``STILL_S``, it sends how long, where
the main thread is (its stack) and whether it waits inside a collective, and reads the
Flight Recorder once: that fills in what C++ issued (a pending bucket all-reduce) and
marks what completed. Every explicit flush (a run's end) reads it too, so a finished
run's ledger holds the Reducer's collectives, their callers named by elimination.

Its own cost (``run.overhead``, probe ``collectives``): the listener and the thread's
ticks, in CPU time (``telemetry.meter``); it goes out with the ledger, at most once a
second, and at every explicit flush of a run that recorded a ledger (not the flush's
own read: that runs after the training).

Caveats: what the ring dropped before a read stays a gap in the sequence (the model
says "not recorded"). Point-to-point operations are not in the ledger. A synchronous
Python collective is noted when it returns: one that never returns is seen in the
Flight Recorder when the rank stands still. "A run is in progress" is read from the
main thread's stack: a rank waiting for its next ``cluster.run`` sits in
``multiprocessing``'s connection, and is not reported as still.
"""

from __future__ import annotations

import collections
import logging
import os
import sys
import threading
import time
from types import FrameType
from typing import Any

import msgspec
import torch

from interactive_shard.collectives.events import Ledger, LedgerEntry, LedgerGroup
from interactive_shard.collectives.flight_recorder import decode_json, to_ledger
from interactive_shard.probing import collective_log
from interactive_shard.probing import collectives as _collectives
from interactive_shard.probing.collective_log import CALLERS
from interactive_shard.probing.compat import flight_recorder as compat_fr
from interactive_shard.telemetry import meter as meters
from interactive_shard.telemetry import rank as telemetry

log = logging.getLogger(__name__)

OFF_ENV = "ISH_LEDGER"  # "0": no ledger on ranks started with it in their environment
RING = 2048  # Flight Recorder entries (the user's TORCH_FR_BUFFER_SIZE wins)
POLL_S = 0.25  # how often the thread looks at the rank's position
STILL_S = 1.0  # a position unchanged this long, in a run, is reported with its stack
READ_S = 3.0  # ... this long, waiting in a collective: the Flight Recorder is read once
CALLER_DEPTH = 16  # frames searched above a collective for its caller
STACK_DEPTH = 24  # frames of a still rank's stack sent
_KNOWN_CALLERS = 8192  # (group, seq) -> caller kept for the Flight Recorder's entries
_WORDS = {
    "ddp_init": "DDP construction sync",
    "sync_buffers": "DDP buffer sync",
    "delayed_all_reduce": "DDP delayed all-reduce",
    "ddp_join": "DDP join",
}
_OURS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the package
_TORCH = f"{os.sep}torch{os.sep}"
_FSDP = f"{os.sep}fsdp{os.sep}"
_IDLE = f"multiprocessing{os.sep}connection.py"
_WAITS = (
    os.path.join("torch", "distributed", ""),
    os.path.join("torch", "autograd", ""),
    os.path.join("interactive_shard", "probing", "collectives.py"),
)
_WRAPPER = f"{os.path.basename(_collectives.__file__)}:"  # the wrappers' frames in a stack
_monotonic = time.monotonic


class LedgerRecorder:
    """The process's recorder (``start``); its thread sends, the listener notes."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # the listener's notes
        self._ticking = threading.Lock()  # one tick at a time
        self._new: list[LedgerEntry] = []
        self._callers: collections.OrderedDict[tuple[str, int], str] = collections.OrderedDict()
        self._done: collections.OrderedDict[tuple[str, int], None] = collections.OrderedDict()
        self._groups: dict[str, Any] = {}  # name -> ProcessGroup
        self._announced: set[str] = set()
        self._position: dict[str, int] = {}
        self._moved = _monotonic()
        self._stage = 0  # standing still: 1 said where, 2 read the Flight Recorder too
        self._run: int | None = None
        self._read_after = -1  # Flight Recorder record ids read so far
        self._main = threading.main_thread().ident
        self._stop = threading.Event()
        self._read_after = _inherited_records()
        self.meter = meters.of("collectives", steady=True)  # its own cost (module docstring)
        self._sent_in: int | None = -1  # the run it last sent a ledger in
        self.records = compat_fr.enable(RING)
        self._undo = [_collectives.listen(self.on_collective, call=True)]
        self._undo.append(telemetry.before_flush(self.flush))
        self._thread = threading.Thread(target=self._loop, name="ish-ledger", daemon=True)
        self._thread.start()

    # -- the listener (the training thread) ---------------------------------------------------
    def on_collective(
        self,
        op: str,
        start: float,
        end: float | None,
        detail: dict[str, Any],
        _work: Any,
        first: Any,
        pg: Any,
    ) -> None:
        if torch.compiler.is_compiling():
            # Traced by dynamo (DDP's buffer broadcast in a compiled forward): not issued
            # now, and a process group's counter is nothing dynamo can trace (it would
            # drop the whole frame to eager). The run's Flight Recorder notes it.
            return
        began = meters.thread_clock()  # its thread's CPU time (telemetry/meter.py)
        self._note(op, start, end, detail, first, pg)
        self.meter.add(meters.thread_clock() - began)

    def _note(
        self,
        op: str,
        start: float,
        end: float | None,
        detail: dict[str, Any],
        first: Any,
        pg: Any,
    ) -> None:
        name = str(detail.get("group", "?"))
        issued = compat_fr.issued(pg) if pg is not None else None
        if issued is None or issued < 1:
            return  # no sequence number: it cannot be aligned with other ranks
        caller = caller_of(sys._getframe(4), op)  # _note <- on_collective <- report <- wrapper
        entry = LedgerEntry(
            group=name,
            seq=issued - 1,
            op=op,
            dtype=str(detail.get("dtype", "")),
            shape=[int(d) for d in first.shape] if first is not None else [],
            nbytes=int(detail.get("nbytes", 0)),
            caller=caller,
            state="completed" if end is not None else "issued",
            start=start,
            end=end,
        )
        with self._lock:
            self._new.append(entry)
            self._callers[(name, issued - 1)] = caller
            if end is not None:
                self._done[(name, issued - 1)] = None
            if len(self._callers) > _KNOWN_CALLERS:
                self._callers.popitem(last=False)
            if len(self._done) > _KNOWN_CALLERS:
                self._done.popitem(last=False)
            if name not in self._groups:
                self._groups[name] = pg

    # -- the thread ---------------------------------------------------------------------------
    def _loop(self) -> None:
        while not self._stop.wait(POLL_S):
            try:
                began = meters.thread_clock()
                self.tick()
                self.meter.add(meters.thread_clock() - began)
            except Exception:  # never the user's training
                log.exception("ledger: a tick failed")

    def tick(self, *, read: bool = False) -> None:
        """Send what is new; when the rank stands still in a run, say where it is. (The
        thread and a flush on the main thread may tick at once: one at a time.)"""
        if telemetry.emitter() is None:
            return  # not connected yet (the rank starts us before its emitter): keep it all
        with self._ticking:
            self._tick(read)

    def _tick(self, read: bool) -> None:
        now = _monotonic()
        position = self._read_position()
        run = telemetry.current_run()
        moved = position != self._position
        if run != self._run:  # each run's store is its own: say the groups again (with
            # the run's first report: a run without collectives records no ledger)
            self._run, self._announced, self._stage = run, set(), 0
        if moved:
            self._position, self._moved, self._stage = position, now, 0
        still: float | None = None
        stack: list[str] = []
        inside = False
        if not moved and self._stage < 2 and now - self._moved >= STILL_S:
            frame = sys._current_frames().get(self._main or 0)
            if frame is not None and not _idle(frame):
                still, stack, inside = now - self._moved, _stack(frame), _inside(frame)
                if self._stage == 1 and not (inside and still >= READ_S):
                    still = None  # said already; the Flight Recorder is read once, later
                else:
                    read = read or self._stage == 1
                    self._stage += 1
        with self._lock:
            entries, self._new = self._new, []
        if read:
            entries += self._read_flight_recorder(stack if inside else [])
        if entries or moved or still is not None:
            self._send(entries, position, still, inside, stack)

    def flush(self) -> None:
        """At an explicit flush (a run's end): what the Flight Recorder holds, sent now,
        and what the ledger cost in this run, if it recorded one."""
        try:
            self.tick(read=True)
            if self._sent_in == telemetry.current_run():
                self._say_cost(now=True)
        except Exception:
            log.exception("ledger: a flush failed")

    def _say_cost(self, *, now: bool = False) -> None:
        if now or self.meter.due():
            event = self.meter.overhead("collectives")
            if event is not None:
                telemetry.emit(event.KIND, msgspec.to_builtins(event))

    def _read_position(self) -> dict[str, int]:
        if not self._groups:
            self._default_group()
        out = {}
        for name, pg in list(self._groups.items()):
            n = compat_fr.issued(pg)
            if n is not None:
                out[name] = n
        return out

    def _default_group(self) -> None:
        import torch.distributed as dist

        if dist.is_initialized() and dist.group.WORLD is not None:
            pg = dist.group.WORLD
            self._groups.setdefault(pg.group_name, pg)

    def _read_flight_recorder(self, waiting: list[str]) -> list[LedgerEntry]:
        """The Flight Recorder's entries not read yet that add to what Python noted:
        what C++ issued, and the state of what Python noted as issued only. ``waiting``:
        the stack of a main thread that waits in a collective (names the pending one)."""
        if not self.records:
            return []
        data = compat_fr.dump_json()
        if data is None:
            return []
        try:
            dump = decode_json(data)
        except (msgspec.ValidationError, msgspec.DecodeError) as err:
            log.warning("ledger: this torch's Flight Recorder dump does not fit: %s", err)
            self.records = False
            return []
        offset = time.monotonic() - time.time()
        with self._lock:
            callers = dict(self._callers)
            done = set(self._done)
        found = to_ledger(
            dump,
            callers=callers,
            wall_to_monotonic=offset,
            after=self._read_after,
            unfinished="issued",
        )
        if dump.entries:
            self._read_after = max(self._read_after, max(e.record_id for e in dump.entries))
        out = [e for e in found if (e.group, e.seq) not in done]  # Python saw those end
        unfinished = [i for i, e in enumerate(out) if e.state != "completed"]
        if waiting and unfinished:
            # The main thread waits in a collective: the newest unfinished one. Issued by
            # Python and not returned, it is named by the frame that called the wrapper.
            last = max(unfinished, key=lambda i: out[i].start or 0.0)
            wrapper = [i for i, f in enumerate(waiting) if f.startswith(_WRAPPER)]
            caller = out[last].caller
            if not caller and wrapper and wrapper[-1] > 0:
                caller = waiting[wrapper[-1] - 1]
            out[last] = msgspec.structs.replace(out[last], state="pending", caller=caller)
        ddp = _has_ddp()
        return [e if e.caller else _from_cpp(e, ddp) for e in out]

    def _send(
        self,
        entries: list[LedgerEntry],
        position: dict[str, int],
        still: float | None,
        inside: bool,
        stack: list[str],
    ) -> None:
        groups = []
        for name in sorted(set(position) - self._announced):
            ranks = _ranks(self._groups.get(name))
            if ranks is not None:
                groups.append(LedgerGroup(name=name, ranks=ranks))
                self._announced.add(name)
        for start in range(0, max(len(entries), 1), 4096):  # one event stays small
            event = Ledger(
                entries=entries[start : start + 4096],
                groups=groups if start == 0 else [],
                issued=position,
                still_s=still,
                in_collective=inside,
                stack=stack,
            )
            telemetry.emit(Ledger.KIND, msgspec.to_builtins(event))
        self._sent_in = self._run
        self._say_cost()  # at most once a second

    def stop(self) -> None:
        self._stop.set()
        for undo in reversed(self._undo):
            undo()


def caller_of(frame: FrameType | None, op: str) -> str:
    """Who issued a collective: a DDP method, FSDP, or the first frame outside torch and
    this package (``file:line in fn``); empty when none is found."""
    for _ in range(CALLER_DEPTH):
        if frame is None:
            break
        code = frame.f_code
        label = CALLERS.get(id(code))
        if label is not None:
            return _WORDS.get(label, label)
        path = code.co_filename
        if _FSDP in path and _TORCH in path:
            return f"FSDP {op.replace('_', '-')}"
        if _TORCH not in path and not path.startswith(_OURS):
            return where(path, frame.f_lineno, code.co_name)
        frame = frame.f_back
    return ""


def where(path: str, line: int, function: str) -> str:
    """``train.py:42 in step``; code without a file (a notebook cell's function, sent to
    the ranks) as ``step() line 3``, counted from its ``def``."""
    name = os.path.basename(path)
    return f"{function}() line {line}" if name.startswith("<") else f"{name}:{line} in {function}"


def _from_cpp(entry: LedgerEntry, ddp: bool) -> LedgerEntry:
    """An entry no Python wrapper saw: issued from C++ (DDP's Reducer, for an all-reduce
    of floating-point gradients on a rank with DDP) or by a function the wrappers do not
    cover (DDP's own checks at construction, ``barrier``'s kin)."""
    caller = "not seen from Python"
    if ddp and entry.op == "all_reduce" and entry.dtype.startswith("torch.float"):
        caller = "DDP gradient bucket (C++ Reducer)"
    elif ddp and entry.dtype.startswith("torch.int"):
        caller = "DDP bookkeeping (C++: parameter checks, bucket order)"
    return msgspec.structs.replace(entry, caller=caller)


def _has_ddp() -> bool:
    """This rank has built a DistributedDataParallel (it may be gone by now)."""
    log_ = collective_log.recorder()
    return log_ is not None and (log_.generation > 0 or len(log_.instances) > 0)


def _idle(frame: FrameType) -> bool:
    """The main thread waits for the next ``cluster.run`` (or the rank is not in one)."""
    return frame.f_code.co_filename.endswith(_IDLE) or (
        frame.f_back is not None and frame.f_back.f_code.co_filename.endswith(_IDLE)
    )


def _inside(frame: FrameType) -> bool:
    """The innermost Python frame is torch.distributed's, autograd's (DDP waits for its
    buckets in backward) or a collective wrapper: the rank waits in a collective."""
    path = frame.f_code.co_filename
    return any(part in path for part in _WAITS)


def _stack(frame: FrameType) -> list[str]:
    """The main thread's frames below the cluster's worker, ``file:line in fn``,
    innermost last (at most ``STACK_DEPTH``)."""
    out: list[str] = []
    f: FrameType | None = frame
    while f is not None and len(out) < 256:
        code = f.f_code
        if code.co_name == "_serve" and code.co_filename.startswith(_OURS):
            break
        out.append(where(code.co_filename, f.f_lineno, code.co_name))
        f = f.f_back
    return out[:STACK_DEPTH][::-1]


def _ranks(pg: Any) -> list[int] | None:
    import torch.distributed as dist

    try:
        return [int(r) for r in dist.get_process_group_ranks(pg)]
    except Exception:
        return None


_recorder: LedgerRecorder | None = None
_start_lock = threading.Lock()


def start() -> LedgerRecorder | None:
    """The process's recorder, started on the first call (``Feature.rank_start``); none
    where the environment says ``ISH_LEDGER=0`` (the ranks then record nothing, and torch's
    Flight Recorder stays as the user set it)."""
    global _recorder
    if os.environ.get(OFF_ENV, "1").strip() == "0":
        return None
    with _start_lock:
        if _recorder is None:
            _recorder = LedgerRecorder()
        return _recorder


def _inherited_records() -> int:
    """The newest record id of the Flight Recorder's entries made before this process
    began (-1: none). A rank forked from a process that ran collectives (a Cluster's,
    started with fork, from a kernel that ran some) inherits its ring: entries of the
    parent's groups, numbered as this rank's own will be. The ledger reads only after."""
    began = _process_start_ns()
    if began is None or not compat_fr.enable(RING):
        return -1
    data = compat_fr.dump_json()
    try:
        entries = decode_json(data).entries if data else []
    except (msgspec.ValidationError, msgspec.DecodeError):
        return -1
    old = [e.record_id for e in entries if e.time_created_ns and e.time_created_ns < began]
    return max(old, default=-1)


def _process_start_ns() -> int | None:
    """When this process began, on the wall clock in ns (Linux; None elsewhere): its
    start in clock ticks after boot (``/proc/self/stat``), against the boot clock now."""
    try:
        with open("/proc/self/stat") as f:
            ticks = int(f.read().rsplit(")", 1)[1].split()[19])  # field 22: starttime
        age = time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, AttributeError):  # not Linux
        return None
    return int((time.time() - age) * 1e9)


def prepare() -> None:
    """What a job's rank runs when it imports the package (``Feature.job_start``), before
    its first collective: turn the Flight Recorder on, so that a ledger started as late
    as ``ish.watch`` (after DDP's construction-time broadcast) still reads what C++ issued."""
    if os.environ.get(OFF_ENV, "1").strip() != "0":
        compat_fr.enable(RING)


def stop() -> None:
    """Stop and forget the process's recorder (``start`` makes a new one): its listener,
    flush hook and thread go; torch's Flight Recorder stays on."""
    global _recorder
    with _start_lock:
        if _recorder is not None:
            _recorder.stop()
            _recorder = None


def recorder() -> LedgerRecorder | None:
    return _recorder
