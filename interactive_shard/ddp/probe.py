"""Probe: a DDP instance's lifecycle on one rank, from its construction to each backward.

Note [Lifecycle probe]
~~~~~~~~~~~~~~~~~~~~~~

Background: most silent DDP mistakes are lifecycle mistakes, not numerics: a parameter
without a gradient leaves the Reducer unfinished (the *next* forward raises, or another
rank hangs in a bucket all-reduce); a forward whose output is dropped prepares the
Reducer for a backward that never comes (torch 2.13 notices nothing); wrapping a model
twice leaves two Reducers' hooks on every gradient accumulator. And the collectives
that matter happen where a probe attached by ``ish.watch(ddp)`` cannot see them:
``_sync_module_states`` runs inside ``DistributedDataParallel.__init__``.

CollectiveLog (``probing/collective_log.py``, one per process): the cluster's worker starts it
right after ``init_process_group`` (a torchrun rank: the first lifecycle probe does). It listens to
the ``torch.distributed`` wrappers (``probing.collectives``: DDP issues its syncs as
``dist._broadcast_coalesced`` and its delayed all-reduce as ``dist.all_reduce``, looked
up at call time) and keeps the last 4096 in a ring. The caller is found from the code
objects of the frames just above the call (at most 6; ``self`` is read only from a DDP
method's frame), so ``__init__``'s sync, ``_sync_buffers``' broadcast and the delayed
all-reduce hook are told apart without patching those methods. It also wraps
``DDP.__init__`` (a serial per instance, in order; its Reducer's parameters by id) and
``DDP._remove_autograd_hooks``.

Hooks per parameter: the Reducer registers C++ post-hooks on each parameter's
``AccumulateGrad`` node; torch exposes no count. They are live while the instance
exists (the Reducer's destructor removes them), has a Reducer (``delay_all_reduce`` of
every parameter builds none) and ``_remove_autograd_hooks()`` was not called: the
registry tracks exactly that. The delayed all-reduce hook is a Python tensor hook on
``param_to_hook_all_reduce`` (``_backward_hooks``), read directly. Measured on 2.13:
with two instances, the old one's hooks fire on every backward but return early unless
that instance was forwarded (its ``expect_autograd_hooks_``); then it reduces again.

Per iteration (backward cycle): a forward pre-hook counts training forwards and opens an
iteration; a forward hook puts, on each output's ``grad_fn``, a pre-hook (the backward
reached this forward) and a sentinel in the node's ``metadata`` whose finalizer tells
when the node, and so every way to backward through it, died. Post-accumulate-grad hooks
give the ready order. The first output pre-hook queues an engine callback that re-queues
itself (``PASSES``) so that its last pass runs after DDP's own: DDP queues
``finalize_backward`` once its last bucket is launched, and with ``static_graph`` its
first iteration's ``_delay_all_reduce`` from ``_DDPSink``'s backward, both possibly after
ours. The last pass calls ``ddp._check_reducer_finalized()``, DDP's own check.

Graph walk (``_graph_walk_timer.py``): the time from ``_find_tensors(output)`` to
``_tree_flatten_with_rref`` in ``_post_forward`` brackets ``prepare_for_backward``'s
search of the graph, which only ``find_unused_parameters=True`` runs.

Caveats: a check raised by ``_check_reducer_finalized`` is also noted in DDP's logging
data (``has_error``), as the next forward would note it. ``forward_without_backward``
fires at the next forward (before DDP's buffer broadcast) or after the next collective
returns; a graph kept alive (e.g. a loss tensor in a list) hides a dropped forward.
Instances built before the recorder started (torchrun, before ``ish.watch``) are unknown
unless watched. Gradient-bucket all-reduces are seen through the buckets' process-group
spy (``probing.spy``) and are not in the process-wide ring.
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.optim.optimizer import register_optimizer_step_post_hook

from interactive_shard.ddp import _checks, _graph_walk_timer
from interactive_shard.ddp._instance_watch import delayed_owners, watch_event
from interactive_shard.ddp._iteration_record import Part
from interactive_shard.ddp.events import LifecycleCheck
from interactive_shard.probing import collective_log as _ring
from interactive_shard.probing import spy as _spy
from interactive_shard.probing.attachment import Attachment
from interactive_shard.probing.compat import autograd as compat_autograd
from interactive_shard.probing.compat import ddp as compat_ddp
from interactive_shard.telemetry import rank as telemetry

log = logging.getLogger(__name__)

WATCHES = "torch.nn.parallel.DistributedDataParallel models (also torch.compile'd)"
OPTIONS: frozenset[str] = frozenset()
PASSES = 4  # engine-callback passes before the Reducer must have finalized
SEND_AT = 4096  # collectives held before an iteration goes out in parts
_engine = compat_autograd.engine


def _inner(obj: object) -> DDP | None:
    """The DDP model itself, or the one a ``torch.compile``'d model wraps."""
    inner = getattr(obj, "_orig_mod", obj)
    return inner if isinstance(inner, DDP) else None


def fits(obj: object) -> bool:
    return _inner(obj) is not None


def attach(obj: DDP | Any) -> LifecycleProbe:
    """Record a DDP model's lifecycle on this rank (Note [Lifecycle probe]): ``obj`` is
    the DDP model or ``torch.compile(ddp)`` (the forward hooks then go on the compiled
    wrapper: dynamo would trace them on the DDP model). Events: ``lifecycle_watch`` now,
    ``lifecycle_iteration`` per iteration, ``lifecycle_check`` the moment one fires."""
    ddp = _inner(obj)
    assert ddp is not None, f"not a DDP model: {type(obj).__qualname__}"
    return LifecycleProbe(ddp, outer=obj)


class _Forward:
    """One training forward: are its outputs' graphs alive, did a backward reach them."""

    __slots__ = ("alive", "began")

    def __init__(self) -> None:
        self.alive = 0
        self.began = False


class LifecycleProbe(Attachment):
    """Each hook and callback times itself (``with self.meter``: run.overhead)."""

    kind = "lifecycle probe"
    feature = "ddp"

    def __init__(self, ddp: DDP, outer: Any = None) -> None:
        super().__init__()
        self.ddp = ddp
        self.rec = _ring.start(since="watch")
        self.serial = self.rec.instance(ddp).serial
        self.fqn = {id(p): n for n, p in ddp.module.named_parameters()}
        self.params = [p for p in compat_ddp.params(ddp) if p.requires_grad]
        self.tracked = self.params + compat_ddp.delayed_params(ddp)
        self.names = [self.fqn.get(id(p), "?") for p in self.tracked]
        # Numbered as DDP numbers them, also when watched late (the bucket probe agrees).
        self._done_at_watch = _ring.iterations_done(ddp) or 0
        self.iteration = self._done_at_watch
        self.walk_start: float | None = None  # set by _walk during a forward
        self.walk_end: float | None = None
        self._part = Part()
        self._open = False  # a training forward ran, its backward has not ended
        self._in_backward = False
        self._cb_queued = False  # this iteration's end-of-backward callback
        self._dead: list[_Forward] = []  # forwards whose graph died unreached
        self._got: set[int] = set()
        self._lock = threading.Lock()
        self._seen_generation = -1
        self._double: set[tuple[tuple[str, ...], tuple[int, ...]]] = set()
        self._group = getattr(ddp.process_group, "group_name", "default")
        self.rec.subscribers.append(self._on_record)
        self.undo.append(lambda: self.rec.subscribers.remove(self._on_record))
        self.undo.append(_graph_walk_timer.install())
        hooked = ddp if outer is None else outer
        pre = hooked.register_forward_pre_hook(self._before_forward, prepend=True)
        post = hooked.register_forward_hook(self._after_forward)
        self.undo += [pre.remove, post.remove]
        for index, p in enumerate(self.tracked):
            handle = p.register_post_accumulate_grad_hook(self._ready_hook(index))
            self.undo.append(handle.remove)
        spy = _spy.attach(ddp, self._on_launch, self.meter)
        if spy is not None:
            self.undo.append(lambda: _spy.detach(ddp, spy, self._on_launch))
        self.undo.append(register_optimizer_step_post_hook(self._stepped).remove)
        self.announce()
        self._check_hooks()

    # -- lifecycle ---------------------------------------------------------------------------
    def describe(self) -> str:
        return f"ddp #{self.serial}"

    def send(self) -> None:
        """Emit what the open iteration holds so far (nothing before the first)."""
        with self._lock:
            part, self._part = self._part, Part()
        if self.iteration > self._done_at_watch and not part.empty() and self.in_announced_run():
            self.emit(part.event(self.iteration, self.serial, self.names, self._group))

    # -- forward -----------------------------------------------------------------------------
    def _before_forward(self, _module: Any, _args: Any) -> None:
        if not self.attached:
            return
        with self.meter:
            self._report_dead()
            training = torch.is_grad_enabled() and self.ddp.require_backward_grad_sync
            if training and not self._open:
                self.send()
                self.report_cost()  # at most once a second: a live view sees it
                self.iteration += 1
                self._open, self._cb_queued = True, False
                self._got = set()
                if self.new_run():  # watched in one cluster.run, trained in the next
                    self.announce()
                if self.rec.generation != self._seen_generation:
                    self._check_hooks()
            if training:
                self._part.forwards += 1
            self.walk_start = self.walk_end = None
            _graph_walk_timer.ACTIVE.append(self)

    def _after_forward(self, _module: Any, _args: Any, output: Any) -> None:
        with self.meter:
            self._forward_ended(output)

    def _forward_ended(self, output: Any) -> None:
        if _graph_walk_timer.ACTIVE and _graph_walk_timer.ACTIVE[-1] is self:
            _graph_walk_timer.ACTIVE.pop()
        if not self.attached:
            return
        if self.walk_start is not None and self.walk_end is not None:
            self._part.walk_s = (self._part.walk_s or 0.0) + self.walk_end - self.walk_start
        if not (torch.is_grad_enabled() and self.ddp.require_backward_grad_sync):
            return
        fwd = _Forward()
        nodes = {id(t.grad_fn): t.grad_fn for t in _tensors(output) if t.grad_fn is not None}
        for node in nodes.values():
            node.register_prehook(self._began(fwd))
            sentinel = _Sentinel()
            meta: dict[str, Any] = node.metadata  # type: ignore[assignment]  # a dict
            meta[f"ish_lifecycle_{id(self)}"] = sentinel
            weakref.finalize(sentinel, self._node_died, weakref.ref(self), fwd)
            fwd.alive += 1

    @staticmethod
    def _node_died(ref: weakref.ReferenceType[LifecycleProbe], fwd: _Forward) -> None:
        fwd.alive -= 1
        probe = ref()
        if probe is not None and fwd.alive == 0 and not fwd.began:
            probe._dead.append(fwd)  # reported at the next forward or collective

    def _report_dead(self) -> None:
        if not self._dead:
            return
        dead, self._dead = self._dead, []
        self._part.dropped += len(dead)
        self._check(
            "forward_without_backward", [], [], _checks.forward_without_backward(self.iteration)
        )

    # -- backward ----------------------------------------------------------------------------
    def _began(self, fwd: _Forward) -> Callable[[Any], None]:
        meter = self.meter

        def hook(_grad_outputs: Any) -> None:
            with meter:
                fwd.began = True
                if self.attached and not self._cb_queued:
                    self._cb_queued, self._in_backward = True, True
                    _engine.queue_callback(self._at_end(PASSES))

        return hook

    def _ready_hook(self, index: int) -> Callable[[torch.Tensor], None]:
        meter = self.meter

        def hook(param: torch.Tensor) -> None:
            with meter:
                # An undefined gradient (Note [Undefined gradients]) is no gradient.
                if self.attached and index not in self._got and param.grad is not None:
                    self._got.add(index)
                    self._part.ready.append(index)

        return hook

    def _at_end(self, passes: int) -> Callable[[], None]:
        def callback() -> None:
            with self.meter:
                if passes > 1:
                    _engine.queue_callback(self._at_end(passes - 1))
                else:
                    self._backward_ended()

        return callback

    def _backward_ended(self) -> None:
        self._open, self._in_backward = False, False
        if not self.attached:
            return
        part = self._part
        # After DDP's finalize every bucket's all-reduce is done, but the spy's end-time
        # callbacks may still wait for the GIL on gloo's worker thread; DDP's next
        # blocking collective (_rebuild_buckets' broadcast, from Python with the GIL held)
        # would then wait behind them for ever. Let them run now (as the bucket probe does).
        with self._lock:
            launches = [c for c in part.collectives if isinstance(c, _spy.Launch)]
        _spy.settle(launches)
        part.backward = True
        expected = set(range(len(self.params)))
        part.unready = [self.names[i] for i in sorted(expected - self._got)]
        if "reducer" not in self.ddp.__dict__:  # every parameter delayed: no Reducer
            return
        try:
            self.ddp._check_reducer_finalized()
            part.finished = True
        except RuntimeError:
            part.finished = False
            message = _checks.unfinished(self.iteration, part.unready)
            self._check("unfinished", part.unready, [], message)

    def _stepped(self, optimizer: Any, _args: Any, _kwargs: Any) -> None:
        if self._in_backward:
            with self.meter:
                if any(id(p) in self.fqn for g in optimizer.param_groups for p in g["params"]):
                    self._part.steps += 1

    # -- collectives -------------------------------------------------------------------------
    def _on_record(self, record: _ring.Record) -> None:
        # Nothing in a cluster.run this instance has not forwarded in (a probe never
        # detached, from an earlier run); then only its own collectives, and the user's
        # while its iteration is open.
        if not self.attached or not self.in_announced_run():
            return
        with self.meter:
            self._report_dead()
            issuer = record[7]
            if self.iteration > self._done_at_watch and (
                issuer == self.serial or (issuer is None and self._open)
            ):
                self._hold(record)

    def _on_launch(self, launch: _spy.Launch) -> None:
        if self.attached and self.iteration > self._done_at_watch and self.in_announced_run():
            with self.meter:
                self._hold(launch)

    def _hold(self, item: _ring.Record | _spy.Launch) -> None:
        with self._lock:
            self._part.collectives.append(item)
            full = len(self._part.collectives) >= SEND_AT
        if full:
            self.send()

    # -- checks and emission -----------------------------------------------------------------
    def _check_hooks(self) -> None:
        """``double_hooks`` once per distinct set of parameters and other instances."""
        self._seen_generation = self.rec.generation
        on = self.rec.hooked_on()
        by_others: dict[tuple[int, ...], list[str]] = {}
        for p in self.tracked:
            owners = set(on.get(id(p), [])) | set(delayed_owners(p, self.rec))
            others = tuple(sorted(owners - {self.serial}))
            if others and self.serial in owners:
                by_others.setdefault(others, []).append(self.fqn.get(id(p), "?"))
        for others, fqns in by_others.items():
            key = (tuple(fqns), others)
            if key not in self._double:
                self._double.add(key)
                message = _checks.double_hooks(fqns, self.serial, list(others))
                self._check("double_hooks", fqns, list(others), message)

    def _check(self, check: str, fqns: list[str], others: list[int], message: str) -> None:
        event = LifecycleCheck(
            check=check,  # type: ignore[arg-type]
            iteration=self.iteration,
            ddp=self.serial,
            fqns=fqns,
            others=others,
            message=message,
        )
        log.warning("lifecycle check %s: %s", check, message)
        self.emit(event)
        emitter = telemetry.emitter()
        if emitter is not None:  # out now: the next step may hang
            emitter.flush()

    def announce(self) -> None:
        self.emit(watch_event(self.ddp, self.rec, self.serial, self.fqn))


class _Sentinel:
    """Lives in an output node's ``metadata``: collected when the node is."""

    __slots__ = ("__weakref__",)


def _tensors(tree: Any, depth: int = 0) -> list[torch.Tensor]:
    if isinstance(tree, torch.Tensor):
        return [tree]
    if depth > 16:
        return []
    if isinstance(tree, dict):
        tree = list(tree.values())
    if isinstance(tree, (list, tuple)):
        return [t for x in tree for t in _tensors(x, depth + 1)]
    return []
