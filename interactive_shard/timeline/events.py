"""The timeline probe's events: one msgspec Struct per event kind, the only definition.

Emitted on the ranks by ``interactive_shard.timeline.probe`` (``ish.watch(model,
timeline=True)`` of a DDP model, an FSDP2 or FSDP1 root, or a compiled model), read in
the kernel by ``interactive_shard.timeline.model.TimelineModel``. Times are
``time.monotonic()`` seconds on the rank; ranks on one host share that clock, ranks on
other hosts are aligned in the kernel from the ends of the collectives they share. An
iteration is one forward of the watched model (1 = the first after ``ish.watch``); its
backward, hooks, collectives and optimizer step are reported under the same
iteration. The probe batches: one ``timeline_spans`` event per iteration (and at an
explicit flush and at detach) holds the iteration's spans in the order they ended; its
``Event.step`` is that iteration (``TimelineWatch.step_is_iteration``), not ``ctx.step``.
"""

# docs/events.md is written from this file (tools/gen_event_docs.py). No torch here:
# the kernel imports it to read recordings.

from __future__ import annotations

from typing import Annotated, ClassVar, Literal

import msgspec
from msgspec import Meta

Kind = Literal[
    "forward",  # a module's forward (eager)
    "backward",  # a module's backward: its first autograd node started .. its last ended
    "compiled_forward",  # a compiled region's forward (the compiled callable)
    "compiled_backward",  # a compiled region's backward (its CompiledFunctionBackward node)
    "hook",  # a gradient-ready / post-backward hook (DDP, FSDP) or a user's module hook
    "collective",  # all_reduce, reduce_scatter, all_gather, broadcast: issue .. completion
    "optimizer",  # optimizer.step()
]
KINDS: tuple[str, ...] = (
    "forward",
    "backward",
    "compiled_forward",
    "compiled_backward",
    "hook",
    "collective",
    "optimizer",
)
Iteration = Annotated[int, Meta(ge=1, description="forwards of the watched model (1 = the first)")]
Seconds = Annotated[float, Meta(ge=0, description="time.monotonic() on the rank")]
MAX_SPANS = 65_536  # spans per timeline_spans event; the probe sends at 4096
Scalar = str | int | float | bool


class TimelineWatch(msgspec.Struct, kw_only=True, frozen=True):
    """Once per rank when ``ish.watch(..., timeline=True)`` attaches: what is spanned."""

    KIND: ClassVar[str] = "timeline_watch"

    target: Annotated[
        Literal["ddp", "fsdp2", "fsdp1", "compiled", "module"],
        Meta(description="what was watched (`compiled`: a torch.compile'd model)"),
    ]
    depth: Annotated[
        int | None,
        Meta(description="module depth spanned (null: the default, the units)"),
    ]
    modules: Annotated[list[str], Meta(description="fqns of the modules spanned, in order")]
    world_size: Annotated[int, Meta(ge=1, description="ranks in the default process group")]
    host: Annotated[str, Meta(description="the rank's host name: one clock per host")]
    # Recordings made before this field have their batches filed by the payload's
    # iteration (the event's step was the user's ctx.step then).
    step_is_iteration: Annotated[
        bool,
        Meta(
            description="this rank's `timeline_spans` carry their iteration as the event's "
            "step too, so the kernel files them without reading their spans"
        ),
    ] = False


class Span(msgspec.Struct, kw_only=True, frozen=True, omit_defaults=True):
    """One thing that ran on one rank, from ``start`` to ``end`` (equal: an instant)."""

    kind: Annotated[Kind, Meta(description="see the kinds above")]
    name: Annotated[str, Meta(description="a module fqn, hook or collective name")]
    start: Seconds
    end: Seconds
    detail: Annotated[
        dict[str, Scalar],
        Meta(description="collective: op, nbytes, dtype, group, group_size, backward"),
    ] = {}


class TimelineSpans(msgspec.Struct, kw_only=True, frozen=True):
    """The spans of one iteration (or of its part so far), in the order they ended."""

    KIND: ClassVar[str] = "timeline_spans"

    iteration: Iteration
    spans: Annotated[list[Span], Meta(max_length=MAX_SPANS, description="in the order they ended")]


EVENTS = (TimelineWatch, TimelineSpans)  # in docs/events.md, in this order
