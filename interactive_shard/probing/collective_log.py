"""The rank's process-wide collective recorder and DDP instance registry.

See Note [Lifecycle probe] in ``ddp/probe.py``, "CollectiveLog". Started once per
process: by the cluster's worker right after ``init_process_group`` (so DDP's
construction-time sync,
which runs inside ``DistributedDataParallel.__init__`` before anyone can watch it, is
recorded), or by the first lifecycle probe on a rank the cluster did not start.
"""

from __future__ import annotations

import collections
import itertools
import logging
import sys
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from types import FrameType
from typing import Any

import torch
from torch.nn.parallel import DistributedDataParallel as DDP

from interactive_shard.probing import collectives as _collectives
from interactive_shard.probing.compat import ddp as compat_ddp

log = logging.getLogger(__name__)

RING = 4096  # the last collectives kept (a construction sync is a handful)
DEPTH = 6  # frames above the torch.distributed call searched for a DDP method

# (op, nbytes, dtype, group, start, end, caller, ddp serial): a tuple, cheap to make.
Record = tuple[str, int, str, str, float, "float | None", str, "int | None"]
Subscriber = Callable[[Record], None]

# id(DDP method code) -> caller label; the nearest DDP frame above the call names it.
# Keyed by id: hashing a code object hashes its bytecode and constants (microseconds);
# the codes live as long as the DDP class, so their ids stay theirs.
CALLERS: dict[int, str] = {}
for _name, _label in (
    ("__init__", "ddp_init"),
    ("_register_delay_all_reduce_hook", "ddp_init"),
    ("_sync_buffers", "sync_buffers"),
    ("_delayed_all_reduce_hook", "delayed_all_reduce"),
    ("_sync_final_model", "ddp_join"),
    ("_find_common_rank", "ddp_join"),
    ("_check_global_requires_backward_grad_sync", "ddp_join"),
    ("_match_all_reduce_for_bwd_pass", "ddp_join"),
    ("_match_unused_params_allreduce", "ddp_join"),
):
    _fn = getattr(DDP, _name, None)
    if _fn is not None:
        CALLERS[id(_fn.__code__)] = _label


@dataclass(eq=False)
class Instance:
    """One DDP instance this rank constructed (or watched): whose hooks are where."""

    serial: int
    ref: weakref.ReferenceType[Any]
    params: frozenset[int] = frozenset()  # id() of the Reducer's parameters
    removed: bool = False  # _remove_autograd_hooks() was called
    born: bool = False  # constructed while this recorder ran: ``forwards`` is exact
    forwards: int = 0  # reducing forwards (DDP's own iteration count), when born

    @property
    def hooked(self) -> bool:
        """Its Reducer's hooks are live: the instance exists (the Reducer's destructor
        removes them), has a Reducer, and nobody removed them."""
        ddp = self.ref()
        return ddp is not None and not self.removed and "reducer" in ddp.__dict__


class CollectiveLog:
    def __init__(self) -> None:
        self.ring: collections.deque[Record] = collections.deque(maxlen=RING)
        self.subscribers: list[Subscriber] = []  # probes, told of every record
        self.instances: weakref.WeakKeyDictionary[Any, Instance] = weakref.WeakKeyDictionary()
        self.generation = 0  # bumped when an instance is built or loses its hooks
        self.since = ""  # "process_group" or "watch"
        self._serials = itertools.count(1)
        self._lock = threading.Lock()
        self.undo: list[Callable[[], None]] = []

    # -- instances -------------------------------------------------------------------------
    def instance(self, ddp: Any) -> Instance:
        """The registry entry of ``ddp``, made on first sight (a serial in order)."""
        inst = self.instances.get(ddp)
        if inst is None:
            with self._lock:
                inst = self.instances.get(ddp)
                if inst is None:
                    inst = Instance(next(self._serials), weakref.ref(ddp))
                    self.instances[ddp] = inst
        if not inst.params and "reducer" in ddp.__dict__:
            inst.params = frozenset(id(p) for p in compat_ddp.params(ddp) if p.requires_grad)
        return inst

    def hooked_on(self) -> dict[int, list[int]]:
        """id(parameter) -> serials of the live instances hooking it."""
        out: dict[int, list[int]] = {}
        for inst in sorted(list(self.instances.values()), key=lambda i: i.serial):
            if inst.hooked:
                for pid in inst.params:
                    out.setdefault(pid, []).append(inst.serial)
        return out

    # -- collectives -----------------------------------------------------------------------
    def add(self, record: Record) -> None:
        self.ring.append(record)
        for sub in self.subscribers:
            try:
                sub(record)
            except Exception:  # pragma: no cover - a probe bug, never the user's step
                log.exception("lifecycle: a subscriber failed")

    def on_collective(
        self, op: str, start: float, end: float | None, detail: dict[str, Any], _work: Any
    ) -> None:
        # listener <- report <- the wrapper <- whoever called torch.distributed
        caller, serial = "user", None
        frame: FrameType | None = sys._getframe(3)
        for _ in range(DEPTH):
            if frame is None:
                break
            label = CALLERS.get(id(frame.f_code))
            if label is not None:
                caller = label
                this = frame.f_locals.get("self")  # only on DDP frames: rare
                if this is not None:
                    serial = self.instance(this).serial
                break
            frame = frame.f_back
        self.add(
            (op, detail["nbytes"], detail["dtype"], detail["group"], start, end, caller, serial)
        )

    def of(self, serial: int, caller: str) -> list[Record]:
        return [r for r in list(self.ring) if r[7] == serial and r[6] == caller]

    # -- patches ---------------------------------------------------------------------------
    def install(self) -> None:
        self.undo.append(_collectives.listen(self.on_collective))
        init, remove, pre = DDP.__init__, DDP._remove_autograd_hooks, DDP._pre_forward
        recorder = self

        def __init__(ddp: Any, *args: Any, **kwargs: Any) -> None:
            recorder.instance(ddp).born = True  # a serial before its first collective
            init(ddp, *args, **kwargs)
            recorder.instance(ddp)  # its parameters, now that the Reducer exists
            recorder.generation += 1

        def _pre_forward(ddp: Any, *inputs: Any, **kwargs: Any) -> Any:
            # DDP counts an iteration (Reducer::prepare_for_forward) exactly then.
            if torch.is_grad_enabled() and ddp.require_backward_grad_sync:
                inst = recorder.instances.get(ddp)
                if inst is not None:
                    inst.forwards += 1
            return pre(ddp, *inputs, **kwargs)

        def _remove_autograd_hooks(ddp: Any) -> None:
            remove(ddp)
            recorder.instance(ddp).removed = True
            recorder.generation += 1

        __init__.__wrapped__ = init  # type: ignore[attr-defined]
        _remove_autograd_hooks.__wrapped__ = remove  # type: ignore[attr-defined]
        _pre_forward.__wrapped__ = pre  # type: ignore[attr-defined]
        DDP.__init__ = __init__  # type: ignore[method-assign, assignment]
        DDP._remove_autograd_hooks = _remove_autograd_hooks  # type: ignore[method-assign]
        DDP._pre_forward = _pre_forward  # type: ignore[method-assign, assignment]

        def restore() -> None:
            DDP.__init__ = init  # type: ignore[method-assign]
            DDP._remove_autograd_hooks = remove  # type: ignore[method-assign]
            DDP._pre_forward = pre  # type: ignore[method-assign]

        self.undo.append(restore)

    def stop(self) -> None:
        undo, self.undo = self.undo, []
        for fn in reversed(undo):
            fn()


_recorder: CollectiveLog | None = None
_start_lock = threading.Lock()


def start(since: str = "process_group") -> CollectiveLog:
    """The process's recorder, started on the first call (later calls return it)."""
    global _recorder
    with _start_lock:
        if _recorder is None:
            rec = CollectiveLog()
            rec.since = since
            rec.install()
            _recorder = rec
        return _recorder


def recorder() -> CollectiveLog | None:
    return _recorder


def iterations_done(ddp: Any) -> int | None:
    """Reducing iterations ``ddp`` ran before now (None: unknown): counted from its
    construction where this process's recorder saw it built (a cluster's rank), else
    read from DDP's logger (``compat.ddp.iterations_done``: exact up to ten)."""
    inst = _recorder.instances.get(ddp) if _recorder is not None else None
    if inst is not None and inst.born:
        return inst.forwards
    return compat_ddp.iterations_done(ddp)
