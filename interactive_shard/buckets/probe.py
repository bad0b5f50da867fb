"""Probe on a real DDP model: which bucket held what, when it was reduced, what was left out.

Note [DDP bucket probe]
~~~~~~~~~~~~~~~~~~~~~~~

Background: DDP's C++ ``Reducer`` calls one *comm hook* per gradient bucket with a
``GradBucket`` (its parameters, its flat buffer) and waits for the returned future.
A per-parameter ``register_post_accumulate_grad_hook`` fires inside the parameter's
``AccumulateGrad`` node, just *before* DDP's own hook on that node. Between them they
show the whole reduction without touching DDP's code. Events: ``events.py``
(``docs/events.md``).

Algorithm:

0. Without a user hook, ``attach`` puts a process group in front of the Reducer's
   (``probing/spy.py``): DDP reduces exactly as it would unwatched, in C++, and the spy notes
   when each bucket's all-reduce starts and ends; the Reducer's bucket layout gives
   each launch its parameters. Where that private API is missing, and always with a
   user hook, step 1 applies.
1. Otherwise ``attach`` registers ``_probe_comm_hook`` (DDP allows one hook per model, so
   the user's hook is passed to ``ish.watch`` and called from ours). With no user hook it
   reduces exactly as the Reducer's built-in path: it scales each gradient by the
   world size as ``Reducer::mark_variable_ready_dense`` would have (``x * (1/ws)``
   when copied into the bucket, ``x / ws`` when the gradient already *is* the bucket
   view, ``x / ws`` for sparse), then all-reduces (SUM) the buffer. For a power-of-two
   world size both scalings give the same bits and one ``div_`` covers the buffer.
2. Every parameter's post-accumulate hook appends ``(index, time)``. The first hook,
   or the gradient of DDP's output (a tensor hook added by a forward hook, so it
   runs in the user's own backward even when parameters are reached in nested
   reentrant-checkpoint backwards), opens an iteration and queues an end callback.
3. End of backward: the engine runs queued callbacks in FIFO order, and DDP queues
   its finalize *after* ours, when its last bucket is launched (measured: a callback
   queued from the first hook still sees an unfinalized Reducer). So the callback
   re-queues itself until one pass saw no reduction (comm-hook call or spied
   all-reduce) since the previous one (``static_graph`` iteration 1 launches every
   bucket from a callback of its own), and then runs after DDP's finalize: ``.grad``
   holds the reduced gradient.
4. It emits ``ddp_iteration``: ready order, parameters that never got a gradient
   (``unready``: with ``find_unused_parameters=False`` the next forward will raise
   "Expected to have finished reduction"), parameters reached twice (``repeated``)
   and per-parameter checksums of ``.grad``, which differ across ranks when they
   silently diverge.

Caveats:

* A comm hook cannot be unregistered: after ``detach()`` the hook keeps reducing
  (same numerics) and records nothing; the other hooks are removed (the gradient
  hooks stay where step 1 needs them).
* An end callback that landed in a nested (reentrant) backward notices it
  (``torch._C._current_autograd_node()`` is the outer node then) and lets the next
  hook queue again; if none comes, the next forward emits the iteration.
* Cost: step 0 adds only Python bookkeeping (gradient hooks, checksums, events).
  The comm hook of step 1 costs what any Python comm hook costs: one more pass over
  the gradients (the Reducer fuses the scaling into its copy into the bucket only
  without a hook) and a Python callback per bucket.
  ``benchmarks/bench_probe_overhead.py`` measures it; the probe times its own hooks and
  callbacks (``Attachment.meter``: ``run.overhead``), and the spy its own parts around
  the real all-reduce.
* Not reproduced bit for bit: ``create_graph=True`` gradients (the Reducer divides
  those) and ``Join`` with uneven inputs (it changes the divisor). The python reducer
  (compiled autograd) and DDP native mixed precision are not supported.
* Backwards under ``no_sync`` (DDP does not reduce) are not counted as iterations.
* ``torch.compile(ddp)``: the forward hooks go on the compiled wrapper (dynamo would
  trace hooks on the inner DDP); forwards of the inner DDP called directly are not seen.

Nested backward (reentrant checkpoint):

* DDP queues its finalize (``queue_callback``) in the graph task in which its last bucket
  became ready. Under ``checkpoint(..., use_reentrant=True)`` that is the checkpoint's
  own nested backward: DDP waits for the all-reduces and ends its iteration there, before
  the user's backward ends. A gradient that arrives later (a layer checkpointed twice)
  is not reduced and stays local, so the ranks silently diverge.
* The spy's end time is noted by a callback on the backend's thread, which needs the
  GIL, and the backend wakes DDP's wait *before* it runs its callbacks (``probing/spy.py``).
  That callback could still be waiting when the probe emitted the bucket, whose
  reduction then read 0 ms (seen in about 1 in 8 checkpoint-twice backwards on 2 busy
  cores, where the user's backward goes on after DDP's wait; less often without
  checkpointing). So a launch in a nested backward queues a callback there that runs
  after DDP's finalize and lets the callback of every finished all-reduce run
  (``_spy.settle``); the end of backward does the same before emitting.
* A parameter ready twice gives its bucket the arrival just before the launch (the one
  DDP reduced), not the later one. An end still unknown when an unfinished iteration
  is emitted (the all-reduce had not finished) is sent as ``null``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from interactive_shard.buckets import _probe_checks as checks
from interactive_shard.buckets import _probe_data as data
from interactive_shard.buckets._params import reducer_params
from interactive_shard.buckets._probe_checks import CommHookRegisteredError
from interactive_shard.buckets._probe_state import (
    BEGUN,
    RECORDING,
    UNQUEUED,
    BackwardEnd,
    Collected,
    Phase,
    Scaling,
)
from interactive_shard.buckets.events import Checksum
from interactive_shard.probing import collective_log
from interactive_shard.probing import spy as _spy
from interactive_shard.probing.attachment import Attachment
from interactive_shard.probing.compat import autograd as compat_autograd

if TYPE_CHECKING:
    from torch._C._distributed_c10d import GradBucket
    from torch.futures import Future

__all__ = ["OPTIONS", "WATCHES", "CommHookRegisteredError", "Probe", "attach", "fits"]

# What ``ish.watch`` (watching.py) needs of a feature's probe module.
WATCHES = "torch.nn.parallel.DistributedDataParallel models (compiled or not)"
OPTIONS = frozenset({"comm_hook", "state", "checksum"})

_engine = compat_autograd.engine
_monotonic = time.monotonic
_clock = time.perf_counter  # the probe's own cost (telemetry.meter's clock)
_task_id = compat_autograd.graph_task_id  # -1 outside backward


def fits(obj: object) -> bool:
    # DDP native mixed precision has its own comm hook: the precision probe watches it.
    model = _uncompiled(obj)
    return (
        isinstance(model, DistributedDataParallel)
        and getattr(model, "mixed_precision", None) is None
    )


def _uncompiled(obj: object) -> object:
    """The DDP model inside ``torch.compile(ddp)``: its buckets are the eager Reducer's."""
    return getattr(obj, "_orig_mod", obj)


def attach(
    ddp_model: DistributedDataParallel,
    *,
    comm_hook: Callable[[Any, GradBucket], Future[Any]] | None = None,
    state: object = None,
    checksum: Checksum = "sampled",
) -> Probe:
    """Record DDP's buckets and gradients on this rank; see Note [DDP bucket probe].

    ``ish.watch(ddp, ...)`` calls this on every rank, after wrapping, before the first
    backward to record. ``comm_hook``/``state`` are what you would give
    ``ddp.register_comm_hook(state, hook)``: the probe calls that hook for every bucket.
    ``checksum``: "sampled" (a strided subset of at most 4096 elements per parameter),
    "full" or "off". Events: ``ddp_watch`` now, then ``bucket`` and ``ddp_iteration``
    every step.
    """
    # A compiled model: its forward hooks go on the compiled wrapper, which runs eagerly;
    # on the inner DDP dynamo would trace them (graph breaks, twice the frames converted).
    outer: nn.Module = ddp_model
    ddp_model = _uncompiled(ddp_model)  # type: ignore[assignment]
    checks.check_watchable(ddp_model, checksum, comm_hook, state)
    checks.check_attachable(ddp_model, _probe_comm_hook)
    return Probe(ddp_model, comm_hook, state, checksum, forward_of=outer)


def _probe_comm_hook(probe, bucket):
    # No annotations: DDP compares them with the real types and, under ``from __future__
    # import annotations``, they would be strings. Module-level so that a second
    # ``attach`` recognises it.
    return probe._on_bucket(bucket)


class Probe(Attachment):
    """The bucket probe of one DDP model: counts DDP iterations and can be detached
    (``probing.attachment.Attachment``). ``iteration`` is the DDP iteration seen last,
    numbered as DDP does (1 = DDP's first backward; from 1 at ``ish.watch`` when DDP's
    own count is unknown)."""

    kind = "bucket probe"
    feature = "buckets"

    def __init__(
        self,
        ddp: DistributedDataParallel,
        user_hook: Callable[..., Future[Any]] | None,
        user_state: object,
        checksum: Checksum,
        forward_of: nn.Module | None = None,
    ) -> None:
        super().__init__()
        self.ddp = ddp
        self.checksum: Checksum = checksum
        self._user_hook, self._user_state = user_hook, user_state
        self._group = ddp.process_group
        self.world_size: int = self._group.size()
        rows = reducer_params(ddp)
        self.fqns = [r.fqn for r in rows]
        self._params = [r.param for r in rows]
        self._layouts = data.BucketLayouts(
            ddp, self.fqns, {id(p): i for i, p in enumerate(self._params)}
        )
        self._scaling = Scaling.of(ddp, self.world_size)
        # Which gradients already were the bucket view (Scaling.PER_GRADIENT only).
        self._grad_ptrs: dict[int, int] = {}
        self._track_views = self._scaling is Scaling.PER_GRADIENT and user_hook is None
        self.phase = Phase.ARMED  # no forward seen yet: assume one prepared DDP
        # Numbered as DDP numbers them, also when watched late (None: unknown, from 1).
        done = collective_log.iterations_done(ddp)
        self.iteration = done or 0
        self._now = Collected()
        self._end = BackwardEnd()
        self._launch_s = 0.0  # the last _reduce's time in the real reduction (not ours)
        with self.installing():
            self._install(ddp, ddp if forward_of is None else forward_of)
        # A model watched in one cluster.run and trained in the next: describe it again
        # in every run it works in, so each run's bucket map can plan.
        first = None if done is None else done + 1
        self.watching(data.watch_event(ddp, rows, self.world_size, user_hook, checksum, first))

    def _install(self, ddp: DistributedDataParallel, hooked: nn.Module) -> None:
        # Note step 0: without a user hook, watch DDP's own reductions from a process
        # group in front of the real one (no comm hook, DDP's numerics and speed).
        spy = _spy.attach(ddp, self._on_launch, self.meter) if self._user_hook is None else None
        if spy is None:  # DDP cannot unregister it: after detach it reduces, unrecorded
            checks.register_comm_hook(ddp, self, _probe_comm_hook)
        else:
            self.undo.append(lambda: _spy.detach(ddp, spy, self._on_launch))
        ddp._ish_probe = self  # type: ignore[assignment]  # a second attach is refused
        for i, p in enumerate(self._params):
            handle = p.register_post_accumulate_grad_hook(self._grad_hook(i))  # type: ignore[no-untyped-call, unused-ignore]
            if not self._track_views:  # else the built-in scaling still needs it (step 1)
                self.undo.append(handle.remove)
        pre = hooked.register_forward_pre_hook(self._before_forward)
        post = hooked.register_forward_hook(self._after_forward)
        self.undo += [pre.remove, post.remove]

    def describe(self) -> str:
        return f"{len(self.fqns)} params"

    def detach(self) -> None:
        """Stop recording. DDP cannot unregister a comm hook: the probe's stays and keeps
        reducing exactly as before; every other hook is removed."""
        self.phase = Phase.DETACHED
        super().detach()

    # -- hot path: forward hooks, gradient hooks, comm hook ---------------------------------
    # Each times itself (``with self.meter``: the probe's own cost, run.overhead).
    def _before_forward(self, module: nn.Module, args: Any) -> None:
        with self.meter:
            if _task_id() != -1 or self.phase is Phase.DETACHED:
                return  # a forward recomputed inside backward (checkpointing the whole model)
            if self.phase in BEGUN:  # the end callback never ran in the user's backward
                self._close()
            # DDP prepares a reducing backward under exactly this condition (_pre_forward).
            reduces = torch.is_grad_enabled() and self.ddp.require_backward_grad_sync
            self.phase = Phase.ARMED if reduces else Phase.IDLE

    def _after_forward(self, module: nn.Module, args: Any, output: Any) -> None:
        if self.phase not in RECORDING or torch.compiler.is_compiling():
            return
        with self.meter:
            leaves = (
                [output]
                if isinstance(output, torch.Tensor)
                else compat_autograd.tree_leaves(output)
            )
            for t in leaves:
                if isinstance(t, torch.Tensor) and t.grad_fn is not None:
                    t.register_hook(self._output_grad_hook)  # type: ignore[no-untyped-call, unused-ignore]

    def _output_grad_hook(self, grad: torch.Tensor) -> None:
        with self.meter:
            if self.phase in UNQUEUED:
                self._begin()

    def _grad_hook(self, index: int) -> Callable[[torch.Tensor], None]:
        meter = self.meter

        def hook(param: torch.Tensor) -> None:
            with meter:
                if self._track_views and param.grad is not None:
                    self._grad_ptrs[index] = param.grad.data_ptr()
                phase = self.phase
                if phase not in RECORDING:
                    return
                if phase in UNQUEUED:
                    self._begin()
                if param.grad is not None:  # Note [Undefined gradients] in probing/__init__.py
                    self._now.ready.append((index, _monotonic()))

        return hook

    def _begin(self) -> None:
        if self.phase not in BEGUN:
            self.phase = Phase.OPEN
            self.iteration += 1
            if self.new_run():  # watched in one cluster.run, trained in the next
                self.announce()
        task = _task_id()
        if task != -1:
            self.phase = Phase.QUEUED
            self._end.seen = -1
            self._end.end_task = task
            _engine.queue_callback(self._at_backward_end)

    def _at_backward_end(self) -> None:
        with self.meter:
            if self.phase is not Phase.QUEUED:
                return  # detached, or closed by the next forward
            if compat_autograd.current_node() is not None:
                self.phase = Phase.OPEN  # a nested (reentrant) backward ended, not the user's
                return
            if self._end.reductions != self._end.seen:  # DDP may still have callbacks queued
                self._end.seen = self._end.reductions
                _engine.queue_callback(self._at_backward_end)
                return
            self._close()

    def _on_bucket(self, bucket: GradBucket) -> Future[Any]:
        # The comm hook wraps the real reduction: only its own parts are its cost.
        entered = _clock()
        ready_t = _monotonic()
        self._end.reductions += 1
        params = bucket.parameters()
        key = self._layouts.key(params)
        if self.phase is Phase.DETACHED:
            fut, _, unwrap = self._reduce(bucket, key)
            return fut.then(_first) if unwrap else fut
        if self.phase not in BEGUN:
            self._begin()
        names = self._layouts.params(key, params)
        buffer = bucket.buffer()
        nbytes = buffer.numel() * buffer.element_size()
        fut, start_t, unwrap = self._reduce(bucket, key)
        seen = data.Reduced(
            self.iteration, bucket.index(), nbytes, bucket.is_last(), ready_t, start_t, names
        )
        meter = self.meter

        def done(f: Future[Any]) -> Any:
            # In .then rather than add_done_callback: DDP waits on the future this
            # returns, so the bucket is recorded before DDP finalizes the iteration.
            # Only an append here: this runs on the backend's thread, holding the GIL,
            # between two reductions; the events go out at the end of backward.
            with meter:
                seen.end_t = _monotonic()
                self._now.reduced.append(seen)
            return f.value()[0] if unwrap else f.value()

        out = fut.then(done)
        meter.add(_clock() - entered - self._launch_s, start=entered)
        return out

    def _reduce(self, bucket: GradBucket, key: tuple[int, ...]) -> tuple[Future[Any], float, bool]:
        """The user's hook, or DDP's built-in reduction (Note step 1): its future, start
        time, and whether the future's value is a list to unwrap (all_reduce's is).
        ``_launch_s``: the time in the user's hook or the all-reduce's launch (not the
        probe's own cost; the scaling, which DDP fuses into its copy, is)."""
        if self._user_hook is not None:
            start_t, started = _monotonic(), _clock()
            fut = self._user_hook(self._user_state, bucket)
            self._launch_s = _clock() - started
            return fut, start_t, False
        buffer = bucket.buffer()
        self._scaling.scale(bucket, buffer, key, self.world_size, self._grad_ptrs)
        start_t, started = _monotonic(), _clock()
        work = dist.all_reduce(buffer, group=self._group, async_op=True)
        self._launch_s = _clock() - started
        return work.get_future(), start_t, True

    def _on_launch(self, launch: _spy.Launch) -> None:
        if self.phase not in RECORDING:
            return
        with self.meter:
            self._end.reductions += 1  # as a comm-hook call: the end callback waits (step 3)
            self._now.launches.append(launch)
            task = _task_id()
            if task not in (self._end.end_task, self._end.settle_task, -1):
                # A nested backward: DDP may finish its iteration in it (Note, nested).
                self._end.settle_task = task
                _engine.queue_callback(self._settle_after_ddp)

    def _settle_after_ddp(self) -> None:
        # Queued before DDP's finalize (DDP queues it after launching its last bucket):
        # queue once more, to run after it, when DDP has waited for the all-reduces.
        _engine.queue_callback(self._settle)

    def _settle(self) -> None:
        with self.meter:
            _spy.settle(self._now.launches)

    def _close(self) -> None:
        """Emit the iteration (Note step 4) and wait for the next forward."""
        now, self._now = self._now, Collected()
        self.phase = Phase.IDLE
        iteration = self.iteration
        for reduced in now.reduced:
            data.emit(reduced.event())
        if now.launches:
            for bucket in self._layouts.spied(iteration, now.launches, now.ready):
                data.emit(bucket)
        summary = data.iteration_event(iteration, now.ready, self.fqns, self._params, self.checksum)
        data.emit(summary)
        data.warn_unready(self.ddp, iteration, summary.unready)
        self.report_cost()  # at most once a second: a live view sees it while training


def _first(fut: Future[list[torch.Tensor]]) -> torch.Tensor:
    reduced: list[torch.Tensor] = fut.value()
    return reduced[0]
