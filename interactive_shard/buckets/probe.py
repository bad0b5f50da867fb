"""Probe on a real DDP model: which bucket held what, when it was reduced, what was left out.

Note [DDP bucket probe]
~~~~~~~~~~~~~~~~~~~~~~~

Background: DDP's C++ ``Reducer`` calls one *comm hook* per gradient bucket with a
``GradBucket`` (its parameters, its flat buffer) and waits for the returned future.
A per-parameter ``register_post_accumulate_grad_hook`` fires inside the parameter's
``AccumulateGrad`` node, just *before* DDP's own hook on that node. Between them they
show the whole reduction without touching DDP's code. Events: docs/bucket-events.md.

Algorithm:

0. Without a user hook, ``watch`` puts a process group in front of the Reducer's
   (``_spy.py``): DDP reduces exactly as it would unwatched, in C++, and the spy notes
   when each bucket's all-reduce starts and ends; the Reducer's bucket layout gives
   each launch its parameters. Where that private API is missing, and always with a
   user hook, step 1 applies.
1. Otherwise ``watch`` registers ``_probe_comm_hook`` (DDP allows one hook per model, so the
   user's hook is passed to ``watch`` and called from ours). With no user hook it
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
   re-queues itself until one pass saw no comm-hook call (or spied all-reduce) since
   the previous one
   (``static_graph`` iteration 1 launches every bucket from a callback of its own),
   and then runs after DDP's finalize: ``.grad`` holds the reduced gradient.
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
  ``benchmarks/bench_probe_overhead.py`` measures it.
* Not reproduced bit for bit: ``create_graph=True`` gradients (the Reducer divides
  those) and ``Join`` with uneven inputs (it changes the divisor). The python reducer
  (compiled autograd) and DDP native mixed precision are not supported.
* Backwards under ``no_sync`` (DDP does not reduce) are not counted as iterations.

Nested backward (reentrant checkpoint):

* DDP queues its finalize (``queue_callback``) in the graph task in which its last bucket
  became ready. Under ``checkpoint(..., use_reentrant=True)`` that is the checkpoint's
  own nested backward: DDP waits for the all-reduces and ends its iteration there, before
  the user's backward ends. A gradient that arrives later (a layer checkpointed twice)
  is not reduced and stays local, so the ranks silently diverge.
* The spy's end time is noted by a callback on the backend's thread, which needs the
  GIL, and the backend wakes DDP's wait *before* it runs its callbacks (``_spy.py``).
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

import logging
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils._pytree import tree_leaves

from interactive_shard.buckets import _probe_data as data
from interactive_shard.buckets import _spy
from interactive_shard.buckets._probe_data import CommHookRegisteredError
from interactive_shard.telemetry import rank as telemetry

__all__ = ["CommHookRegisteredError", "Probe", "watch"]

log = logging.getLogger(__name__)

_engine = torch.autograd.Variable._execution_engine
_monotonic = time.monotonic
_task_id = torch._C._current_graph_task_id  # -1 outside backward


def watch(
    ddp_model: DistributedDataParallel,
    *,
    comm_hook: Callable[[Any, dist.GradBucket], torch.futures.Future] | None = None,
    state: object = None,
    checksum: str = "sampled",
) -> Probe:
    """Record DDP's buckets and gradients on this rank; see Note [DDP bucket probe].

    Call it on every rank after wrapping, before the first backward to record.
    ``comm_hook``/``state`` are what you would give ``ddp.register_comm_hook(state,
    hook)``: the probe calls that hook for every bucket. ``checksum``: "sampled" (a
    strided subset of at most 4096 elements per parameter), "full" or "off".
    Events: ``ddp_watch`` now, then ``bucket`` and ``ddp_iteration`` every step.
    """
    data.check_watchable(ddp_model, checksum, comm_hook, state)
    earlier = getattr(ddp_model, "_ish_probe", None)
    if earlier is not None and earlier.attached:
        raise CommHookRegisteredError(
            "ish.watch was already called on this DDP model: keep the Probe it returned."
        )
    data.check_no_hook(ddp_model, _probe_comm_hook)
    return Probe(ddp_model, comm_hook, state, checksum)


def _probe_comm_hook(probe, bucket):  # type: ignore[no-untyped-def]
    # No annotations: DDP compares them with the real types and, under ``from __future__
    # import annotations``, they would be strings. Module-level so that a second
    # ``watch`` recognises it.
    return probe._on_bucket(bucket)


def _current_run() -> int | None:
    emitter = telemetry.emitter()
    return None if emitter is None else emitter.run


def _first(fut: torch.futures.Future) -> torch.Tensor:
    return fut.value()[0]


class Probe:
    """What ``ish.watch(ddp)`` returns: counts DDP iterations and can be detached."""

    def __init__(
        self,
        ddp: DistributedDataParallel,
        user_hook: Callable[..., torch.futures.Future] | None,
        user_state: object,
        checksum: str,
    ) -> None:
        self.ddp = ddp
        self.checksum = checksum
        self._user_hook, self._user_state = user_hook, user_state
        self._group = ddp.process_group
        self.world_size: int = self._group.size()
        rows = data.reducer_params(ddp)
        self.fqns = [r[0] for r in rows]
        self._params = [r[3] for r in rows]
        self._index_of = {id(p): i for i, p in enumerate(self._params)}
        self._bucket_meta: dict[tuple[int, ...], tuple[list[Any], ...]] = {}
        # Note step 1: only gradient_as_bucket_view with a world size that is not a
        # power of two needs to know which gradients already were bucket views.
        pow2 = self.world_size & (self.world_size - 1) == 0
        gabv = bool(getattr(ddp, "gradient_as_bucket_view", False))
        self._grad_ptrs: dict[int, int] | None = {} if gabv and not pow2 else None
        self._scale_by_mul = not pow2 and not gabv
        self._iteration = 0
        self._armed = True  # the last forward prepared DDP for a reducing backward
        self._open = self._queued = self._detached = False
        self._ready: list[tuple[int, float]] = []
        self._reduced: list[tuple[Any, ...]] = []  # buckets of this iteration, to emit
        self._hook_calls, self._calls_seen = 0, -1
        self._end_task = self._settle_task = -1  # graph tasks of our callbacks (Note, nested)

        self._launches: list[_spy.Launch] = []  # this iteration's spied all-reduces
        self._layout: list[tuple[tuple[int, ...], tuple[list[Any], ...]]] = []
        self._layout_key: tuple[int, ...] = ()
        # Note step 0: without a user hook, watch DDP's own reductions from a process
        # group in front of the real one (no comm hook, DDP's numerics and speed).
        self._spy = _spy.attach(ddp, self._on_launch) if user_hook is None else None
        if self._spy is None:
            try:
                ddp.register_comm_hook(self, _probe_comm_hook)
            except RuntimeError as exc:  # a built-in (C++) hook leaves no trace in _comm_hooks
                hooks = getattr(ddp, "_comm_hooks", None)
                if hooks and hooks[-1][0] is _probe_comm_hook:
                    hooks.pop()  # DDP appended ours before the Reducer refused it
                if "only be called once" in str(exc):
                    raise CommHookRegisteredError(data.already_hooked("a built-in hook")) from exc
                raise
        ddp._ish_probe = self  # type: ignore[attr-defined]  # a second watch is refused
        self._handles = [
            p.register_post_accumulate_grad_hook(self._grad_hook(i))
            for i, p in enumerate(self._params)
        ]
        self._handles.append(ddp.register_forward_pre_hook(self._before_forward))
        self._handles.append(ddp.register_forward_hook(self._after_forward))
        payload = data.watch_payload(ddp, rows, self.world_size, user_hook, checksum)
        telemetry.emit(data.DDP_WATCH, payload)
        # A model watched in one cluster.run and trained in the next: describe it
        # again in every run it works in, so each run's bucket map can plan.
        self._watch_payload = payload
        self._announced_in = _current_run()

    @property
    def iteration(self) -> int:
        """DDP iterations seen so far (1 = the first backward after ``watch``)."""
        return self._iteration

    @property
    def attached(self) -> bool:
        return not self._detached

    def detach(self) -> None:
        """Stop recording. DDP cannot unregister a comm hook: the probe's stays and keeps
        reducing exactly as before; every other hook is removed."""
        self._detached = True
        if self._spy is not None:
            _spy.detach(self.ddp, self._spy)
        # The gradient hooks stay where the built-in scaling needs them (Note step 1).
        keep = len(self._params) if self._grad_ptrs is not None and not self._user_hook else 0
        for handle in self._handles[keep:]:
            handle.remove()
        del self._handles[keep:]

    remove = detach

    def __repr__(self) -> str:
        state = "attached" if self.attached else "detached"
        return f"Probe({len(self.fqns)} params, iteration={self._iteration}, {state})"

    # -- hot path: forward hooks, gradient hooks, comm hook ---------------------------------
    def _before_forward(self, module: nn.Module, args: Any) -> None:
        if _task_id() != -1:
            return  # a forward recomputed inside backward (checkpointing the whole model)
        if self._open:  # the end callback never ran in the user's backward
            self._close()
        # DDP prepares a reducing backward under exactly this condition (_pre_forward).
        self._armed = torch.is_grad_enabled() and self.ddp.require_backward_grad_sync

    def _after_forward(self, module: nn.Module, args: Any, output: Any) -> None:
        if not self._armed or self._detached or torch.compiler.is_compiling():
            return
        leaves = [output] if isinstance(output, torch.Tensor) else tree_leaves(output)
        for t in leaves:
            if isinstance(t, torch.Tensor) and t.grad_fn is not None:
                t.register_hook(self._output_grad_hook)

    def _output_grad_hook(self, grad: torch.Tensor) -> None:
        if self._armed and not self._queued and not self._detached:
            self._begin()

    def _grad_hook(self, index: int) -> Callable[[torch.Tensor], None]:
        def hook(param: torch.Tensor) -> None:
            if self._grad_ptrs is not None and param.grad is not None:
                self._grad_ptrs[index] = param.grad.data_ptr()
            if not self._armed or self._detached:
                return
            if not self._queued:
                self._begin()
            self._ready.append((index, _monotonic()))

        return hook

    def _begin(self) -> None:
        if not self._open:
            self._open = True
            self._iteration += 1
            run = _current_run()
            if run != self._announced_in:
                self._announced_in = run
                telemetry.emit(data.DDP_WATCH, self._watch_payload)
        task = _task_id()
        if task != -1:
            self._queued = True
            self._calls_seen = -1
            self._end_task = task
            _engine.queue_callback(self._at_backward_end)

    def _at_backward_end(self) -> None:
        if torch._C._current_autograd_node() is not None:
            self._queued = False  # a nested (reentrant) backward ended, not the user's
            return
        if self._hook_calls != self._calls_seen:  # DDP may still have callbacks queued
            self._calls_seen = self._hook_calls
            _engine.queue_callback(self._at_backward_end)
            return
        self._close()

    def _on_bucket(self, bucket: dist.GradBucket) -> torch.futures.Future:
        ready_t = _monotonic()
        self._hook_calls += 1
        params = bucket.parameters()
        key = tuple(self._index_of.get(id(p), -1) for p in params)
        if self._detached:
            fut, _, unwrap = self._reduce(bucket, key)
            return fut.then(_first) if unwrap else fut
        if not self._open:
            self._begin()
        meta = self._bucket_meta.get(key) or self._meta(key, params)
        buffer = bucket.buffer()
        nbytes = buffer.numel() * buffer.element_size()
        head = (self._iteration, bucket.index(), nbytes, bucket.is_last(), ready_t)
        fut, start_t, unwrap = self._reduce(bucket, key)

        def done(f: torch.futures.Future) -> Any:
            # In .then rather than add_done_callback: DDP waits on the future this
            # returns, so the bucket is recorded before DDP finalizes the iteration.
            # Only a list append here: this runs on the backend's thread, holding the
            # GIL, between two reductions; the events go out at the end of backward.
            self._reduced.append((head, meta, start_t, _monotonic()))
            return f.value()[0] if unwrap else f.value()

        return fut.then(done)

    def _reduce(
        self, bucket: dist.GradBucket, key: tuple[int, ...]
    ) -> tuple[torch.futures.Future, float, bool]:
        """The user's hook, or DDP's built-in reduction (Note step 1): its future, start
        time, and whether the future's value is a list to unwrap (all_reduce's is)."""
        if self._user_hook is not None:
            start_t = _monotonic()
            return self._user_hook(self._user_state, bucket), start_t, False
        buffer, ws = bucket.buffer(), self.world_size
        if buffer.is_sparse or not (self._scale_by_mul or self._grad_ptrs is not None):
            buffer.div_(ws)
        elif self._grad_ptrs is None:
            buffer.mul_(1.0 / ws)
        else:
            for i, view in zip(key, bucket.gradients(), strict=True):
                was_view = self._grad_ptrs.get(i) == view.data_ptr()
                view.div_(ws) if was_view else view.mul_(1.0 / ws)
        start_t = _monotonic()
        work = dist.all_reduce(buffer, group=self._group, async_op=True)
        return work.get_future(), start_t, True

    def _on_launch(self, launch: _spy.Launch) -> None:
        if self._armed and not self._detached:
            self._hook_calls += 1  # as a comm-hook call: the end callback waits (step 3)
            self._launches.append(launch)
            task = _task_id()
            if task not in (self._end_task, self._settle_task, -1):
                # A nested backward: DDP may finish its iteration in it (Note, nested).
                self._settle_task = task
                _engine.queue_callback(self._settle_after_ddp)

    def _settle_after_ddp(self) -> None:
        # Queued before DDP's finalize (DDP queues it after launching its last bucket):
        # queue once more, to run after it, when DDP has waited for the all-reduces.
        _engine.queue_callback(self._settle)

    def _settle(self) -> None:
        _spy.settle(self._launches)

    def _emit_spied(self, ready: list[tuple[int, float]]) -> None:
        """Bucket events from the spied all-reduces: launch k is bucket k (Note step 0)."""
        launches, self._launches = self._launches, []
        if not launches:
            return
        _spy.settle(launches)  # after DDP's finalize: every launched all-reduce is done
        key = tuple(launch[1] for launch in launches)  # element counts
        # The Reducer rebuilds its buckets once, by iteration 3; a rebuild can keep the
        # sizes (one bucket, new order), so ask it for the layout until then.
        if self._iteration <= 3 or key != self._layout_key:
            self._layout_key = key
            self._layout = []
            for params in _spy.layout(self.ddp):
                index = tuple(self._index_of.get(id(p), -1) for p in params)
                self._layout.append(
                    (index, self._bucket_meta.get(index) or self._meta(index, params))
                )
        ready_at = data.ready_at(ready)
        for k, (start_t, numel, size, end_t, *_) in enumerate(launches[: len(self._layout)]):
            index, meta = self._layout[k]
            ready_t = max((ready_at(i, start_t) for i in index), default=start_t)
            head = (
                self._iteration,
                k,
                numel * size,
                k == len(self._layout) - 1,
                min(ready_t, start_t),
            )
            data.emit_bucket(head, meta, start_t, end_t)

    def _meta(self, key: tuple[int, ...], params: list[torch.Tensor]) -> tuple[list[Any], ...]:
        meta = (  # -1: a parameter DDP reduces that was not in its list at watch time
            [self.fqns[i] if i >= 0 else "<unknown>" for i in key],
            [list(p.shape) for p in params],
            [str(p.dtype) for p in params],
        )
        self._bucket_meta[key] = meta
        return meta

    def _close(self) -> None:
        ready, self._ready = self._ready, []
        self._open = self._queued = self._armed = False
        if self._detached:
            return
        reduced, self._reduced = self._reduced, []
        for bucket in reduced:
            data.emit_bucket(*bucket)
        if self._spy is not None:
            self._emit_spied(ready)
        payload = data.iteration_payload(
            self._iteration, ready, self.fqns, self._params, self.checksum
        )
        telemetry.emit(data.DDP_ITERATION, payload)
        ddp, unready = self.ddp, payload["unready"]
        if unready and not ddp.find_unused_parameters and not getattr(ddp, "static_graph", 0):
            log.warning(
                "ish.watch: DDP iteration %d: %d parameter(s) got no gradient: %s. DDP "
                "(find_unused_parameters=False) never finished this reduction, and the next "
                "forward will raise 'Expected to have finished reduction in the prior "
                "iteration'. Use them in the loss or pass find_unused_parameters=True.",
                self._iteration,
                len(unready),
                ", ".join(unready[:8]) + (" ..." if len(unready) > 8 else ""),
            )
