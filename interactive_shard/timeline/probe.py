"""Probe: forward, backward, hooks, collectives and the optimizer step on one time axis.

Note [Timeline probe]
~~~~~~~~~~~~~~~~~~~~~

Background: overlap in DDP and FSDP depends on when autograd runs the hooks that launch
collectives, and autograd runs a hook when the node it hangs on runs: the order follows
the order in which forward created those nodes. PyTorch PR 89330: dynamo kept FSDP's
tracing-time parameter views, all created before any compiled forward ran, so every
hook ran after all compiled backwards. Only a trace of the real run shows this.

What is spanned (``ish.watch(model, timeline=True, depth=None)``), all on the rank's
``time.monotonic()``; ``events.py`` (``docs/events.md``) has the event shapes:

1. Iteration and the root: a forward pre-hook on the watched model, prepended, counts
   forwards not recomputed in backward and sends the previous iteration's spans; the
   model's own forward is the span named ``""`` (``compiled_forward`` for a
   ``torch.compile``'d model).
2. Modules (``forward`` / ``backward``): by default the units: FSDP2 modules with their
   own ``fully_shard`` state, FSDP1 wrappers, the children of a DDP model's module;
   ``depth=k``: every module whose fqn has at most k parts. Forward: a pre-hook
   prepended (before FSDP's pre-forward: its all-gather counts) to a forward hook
   appended with ``always_call``. Backward spans: autograd numbers the nodes it creates
   (``Node._sequence_nr()``); a pre-hook appended (after FSDP's pre-forward, whose
   ``RegisterPostBackwardFunction`` node is then outside) takes the highest number the
   inputs' grad_fns have, and the forward hook walks from the outputs' grad_fns to the
   nodes numbered above it (``_graph.walk``): the call's nodes. Its backward starts
   when the first output node starts (``Node.register_prehook``) and ends when the last
   node with no edge to another node of the call has run (``Node.register_hook``).
   Nothing is wrapped around the module's tensors: autograd runs the same nodes.
3. Compiled regions (``compiled_forward`` / ``compiled_backward``): a module compiled
   with ``module.compile()`` runs ``_compiled_call_impl``, traced by dynamo with its
   hooks; its hooks would be traced too, so the probe wraps that instance attribute
   instead and puts no hooks inside the region. Its backward spans are the
   ``CompiledFunctionBackward`` nodes its call created: one per compiled graph, timed
   by their own pre-hook and hook (the compiled function's backward itself). For a
   ``torch.compile``'d model the same walk runs from the root's outputs (DDPOptimizer's
   pieces: ``#0``, ``#1``... in creation order).
4. Hooks (``hook``): FSDP2's ``pre_backward`` / ``post_backward`` per unit (instance
   attributes of each ``FSDPParamGroup``, looked up at call time), DDP's gradient-ready
   point per parameter (a post-accumulate-grad hook: an instant, as DDP's own C++ hook
   runs there), and the user's Python module hooks on spanned modules registered before
   ``ish.watch`` (wrapped, unwrapped at detach; torch's own hooks are not wrapped).
5. Collectives (``collective``): ``_collectives``: the ``torch.distributed`` functions
   while a timeline probe is attached, and DDP's bucket all-reduces through the bucket
   probe's process-group spy (one spy for both probes); op, bytes, dtype, group, and
   whether issued in backward. Asynchronous ones end when their future completes.
6. The optimizer (``optimizer``): process-wide step pre- and post-hooks; the post-hook
   sends the iteration's spans.

Spans are held and sent as one ``timeline_spans`` per iteration: at the next forward,
after the optimizer step, at an explicit flush (``ctx.flush()``, the run's end) and at
detach (one event per iteration, not per span: the kernel's cost is per event). The
event's step is the iteration (``TimelineWatch.step_is_iteration``), so the kernel files
a batch without reading its spans.

Caveats:

* The clock is the host's; on one host every rank shares it, across hosts the kernel
  aligns ranks by the ends of collectives they share.
* A module backward whose last node never runs (no gradient reaches it) has no span. A
  walk that finds more than ``_graph.MAX_NODES`` nodes gives up on that span.
* FSDP1's post-backward hooks are not spanned (its collectives are); user hooks on
  tensors and global module hooks are not spanned.
* Probes stack on FSDP2's ``pre_backward`` / ``post_backward``: detach every probe of a
  model together (``Watch.detach()``).
* A rank killed mid-iteration loses that iteration's spans.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from interactive_shard.timeline import _install
from interactive_shard.timeline._recorder import SpanRecorder

__all__ = ["OPTIONS", "OPT_IN", "WATCHES", "attach", "fits"]

WATCHES = (
    "with timeline=True: DDP models, FSDP2 and FSDP1 roots, torch.compile'd models "
    "(and any nn.Module)"
)
OPTIONS: frozenset[str] = frozenset({"timeline", "depth"})
OPT_IN = "timeline"  # attached only when ish.watch gets timeline=True


def fits(obj: object) -> bool:
    return isinstance(obj, nn.Module)


def attach(model: nn.Module, *, timeline: bool = True, depth: int | None = None) -> SpanRecorder:
    """Span forward, backward, hooks, collectives and optimizer steps of ``model`` on
    this rank; Note [Timeline probe]. ``depth``: None (the units), or the deepest fqn
    depth of modules to span (0: the model only). Events: ``timeline_watch`` now, a
    ``timeline_spans`` per iteration."""
    if depth is not None and (not isinstance(depth, int) or isinstance(depth, bool) or depth < 0):
        raise ValueError(
            f"ish.watch(..., depth={depth!r}): depth must be None (the units) or an int "
            ">= 0 (0: the model only, 1: its children, ...)"
        )
    if not timeline:
        raise ValueError("the timeline probe attaches only with timeline=True")
    earlier: Any = model.__dict__.get("_ish_timeline_probe")
    if earlier is not None and earlier.attached:
        raise RuntimeError(
            "ish.watch(..., timeline=True) was already called on this model: keep the "
            "handle it returned (or detach() it first)"
        )
    recorder = _install.install(model, depth)
    model.__dict__["_ish_timeline_probe"] = recorder
    return recorder
