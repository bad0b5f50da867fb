"""Observe DDP's reductions without a comm hook: a process group in front of the real one.

Why: a Python comm hook costs every step (one more pass over the gradients, because the
Reducer fuses the 1/world_size scaling into its copy only without a hook, and a Python
callback per bucket on the critical path). The Reducer can be pointed at another process
group (``Reducer._update_process_group``); this one forwards every collective to the
real backends and only notes when each bucket's all-reduce starts and ends. DDP's own
C++ path (and so every bit of its numerics) is unchanged.

Caveats: private torch API, so ``attach`` returns None where it is missing or fails and
the probe falls back to its comm hook. The Reducer launches buckets in index order, so
the k-th floating-point all-reduce of an iteration is bucket k; integer all-reduces (the
used-parameter map of ``find_unused_parameters``) are not buckets.

The end time is noted by a Python callback on the backend's thread, so it needs the GIL:
the backend marks the future complete (waking DDP's wait) *before* it runs callbacks, and
the callback can still be waiting for the GIL when the probe reads the launch. ``settle``
lets it run (see Note [DDP bucket probe], "Nested backward").

Its own cost (``run.overhead``) counts to the probe that put it there (``meter``): the
time after the real all-reduce returns, until its listeners are called (each listener
times itself); never the all-reduce's launch, which DDP pays unwatched too.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from interactive_shard.telemetry.meter import Meter

log = logging.getLogger(__name__)
_monotonic = time.monotonic
_clock = time.perf_counter  # the spy's own cost (telemetry.meter's clock)


@dataclass(slots=True, eq=False)
class Launch:
    """One floating-point all-reduce the Reducer launched: a bucket's reduction."""

    start_t: float  # noted before the call (it may wait for the GIL on its way back)
    numel: int
    element_size: int
    work: torch.futures.Future[Any]  # the all-reduce's future
    end_t: float | None = None  # set by ``noted`` when the all-reduce completed
    noted: torch.futures.Future[None] | None = None  # the callback that sets ``end_t``

    @property
    def nbytes(self) -> int:
        return self.numel * self.element_size

    def note_end(self, _work: torch.futures.Future[Any]) -> None:
        self.end_t = _monotonic()


# Note [A spy's collectives go through Python]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# Background: torch 2.13's backward stashes a Python object in the thread-local state
# (``_engine_run_backward``: ``_stash_obj_in_tls("context", ...)``), and a gloo work
# captures that state when it is made. So the last reference to a work made during
# backward (a bucket's all-reduce) needs the GIL to go: a gloo worker thread drops it
# after running the work, holding gloo's queue lock.
# Deadlock (seen about once in 25-150 fresh 2-rank runs, gdb on both ranks): a
# collective the Reducer calls on this group that this class does not override (the
# broadcast of ``_rebuild_buckets`` at iteration 2) goes through pybind's trampoline,
# which reaches gloo's queue lock with the GIL held. The worker waits for the GIL
# under the lock, the main thread for the lock under the GIL; the other rank times out.
# Algorithm: every collective the Reducer issues (``allreduce``, ``broadcast``) is a
# Python method here that calls the inner group: its binding releases the GIL before
# it queues the work.


class SpyGroup(dist.ProcessGroup):
    def __init__(
        self,
        inner: dist.ProcessGroup,
        on_launch: Callable[[Launch], None],
        meter: Meter | None = None,
    ) -> None:
        super().__init__(inner.rank(), inner.size())  # type: ignore[call-arg]  # no store: a wrapper
        self.inner = inner
        self.listeners = [on_launch]  # the bucket probe, a timeline probe: one spy for both
        self.meter = Meter() if meter is None else meter  # its own parts (module docstring)
        # Collectives not overridden here dispatch to these: the real backends.
        for device in ("cpu", "cuda"):
            try:
                backend = inner._get_backend(torch.device(device))
            except RuntimeError:
                continue
            self._register_backend(torch.device(device), _backend_type(backend), backend)

    def allreduce(self, tensors: Any, opts: Any = None) -> Any:  # type: ignore[override]
        start = _monotonic()  # before the call: it may wait for the GIL on its way back
        if opts is None:
            work = self.inner.allreduce(tensors)
        else:
            work = self.inner.allreduce(tensors, opts)
        tensor = tensors[0]
        if tensor.is_floating_point():
            own = _clock()
            fut = work.get_future()
            launch = Launch(start, tensor.numel(), tensor.element_size(), fut)
            launch.noted = fut.then(launch.note_end)
            self.meter.add(_clock() - own, start=own)
            for listener in list(self.listeners):
                listener(launch)
        return work

    # Never traced: the Reducer calls this from DDP's forward, which may be compiled.
    @torch.compiler.disable
    def broadcast(self, tensors: Any, opts: Any = None) -> Any:
        # The Reducer's one other collective (its rebuilt bucket indices): forwarded
        # from Python, never left to the base class. Note [A spy's collectives go
        # through Python].
        if opts is None:
            return self.inner.broadcast(tensors)
        return self.inner.broadcast(tensors, opts)

    def getBackendName(self) -> str:
        return self.inner.getBackendName() if hasattr(self.inner, "getBackendName") else "spy"


def _backend_type(backend: Any) -> Any:
    name = type(backend).__name__.lower()
    types = dist.ProcessGroup.BackendType
    if "nccl" in name:
        return types.NCCL
    if "gloo" in name:
        return types.GLOO
    return types.CUSTOM


def attach(
    ddp: Any, on_launch: Callable[[Launch], None], meter: Meter | None = None
) -> SpyGroup | None:
    """Put a spy in front of DDP's process group (or join the one already there); None
    where this torch cannot. ``meter``: the probe its own cost counts to (the first's)."""
    present = ddp.__dict__.get("_ish_spy")
    if isinstance(present, SpyGroup):
        present.listeners.append(on_launch)
        return present
    reducer = getattr(ddp, "reducer", None)
    needed = ("_update_process_group", "_get_zeros_like_grad_buckets")
    if reducer is None or not all(hasattr(reducer, n) for n in needed):
        return None
    # Sparse gradients are all-reduced differently (and not always by allreduce).
    if getattr(ddp, "sparse_gradient", False):
        return None
    if any(getattr(p, "_is_sparse_grad", False) for p in ddp.parameters()):
        return None
    try:
        spy = SpyGroup(ddp.process_group, on_launch, meter)
        reducer._update_process_group(spy)
    except Exception:  # older or different torch: the comm hook path still works
        log.debug("process-group spy unavailable; using a comm hook", exc_info=True)
        return None
    ddp.__dict__["_ish_spy"] = spy
    return spy


def detach(ddp: Any, spy: SpyGroup, on_launch: Callable[[Launch], None]) -> None:
    """Stop telling ``on_launch``; the last listener gives DDP its process group back."""
    if on_launch in spy.listeners:
        spy.listeners.remove(on_launch)
    if not spy.listeners:
        ddp.reducer._update_process_group(spy.inner)
        ddp.__dict__.pop("_ish_spy", None)


def layout(ddp: Any) -> list[list[torch.nn.Parameter]]:
    """The Reducer's current buckets, by index: their parameters in GradBucket order."""
    buckets = sorted(ddp.reducer._get_zeros_like_grad_buckets(), key=lambda b: b.index())
    return [list(b.parameters()) for b in buckets]


def settle(launches: list[Launch]) -> None:
    """Let the end-time callback of every finished all-reduce run: waiting on its future
    releases the GIL it waits for. An all-reduce still running keeps ``None``."""
    for launch in launches:
        if launch.end_t is None and launch.noted is not None and launch.work.done():
            launch.noted.wait()
