"""The DDP lifecycle probe's events: one msgspec Struct per event kind, the only definition.

Emitted on the ranks by ``interactive_shard.ddp.probe`` (attached to a
``DistributedDataParallel`` model). Times are ``time.monotonic()`` seconds on the rank.
A DDP instance is named by its *serial*: 1, 2, ... in the order this rank constructed
them (instances built before the rank's collective recorder started are numbered when
first watched). An iteration is one backward cycle: it begins at the first forward after
the previous backward ended (1 = the first after the probe attached; 0 = before any).
"""

# docs/events.md is written from this file (tools/gen_event_docs.py). No torch here:
# the kernel imports it to read recordings.

from __future__ import annotations

from typing import Annotated, ClassVar, Literal

import msgspec
from msgspec import Meta

Caller = Literal[
    "ddp_init",  # inside DistributedDataParallel.__init__ (its construction-time sync)
    "sync_buffers",  # DDP._sync_buffers: the buffer broadcast before a forward
    "delayed_all_reduce",  # DDP._delayed_all_reduce_hook: the delayed parameters
    "reducer",  # a gradient bucket's all-reduce, launched by the C++ Reducer
    "ddp_join",  # DDP's Join / unused-parameter bookkeeping collectives
    "user",  # anything else: the user's own code, FSDP, another library
]
Check = Literal["unfinished", "forward_without_backward", "double_hooks"]
Iteration = Annotated[int, Meta(ge=0, description="backward cycles since attach (0: before any)")]
Seconds = Annotated[float, Meta(ge=0, description="time.monotonic() on the rank")]
Serial = Annotated[int, Meta(ge=1, description="the DDP instance's serial on this rank")]
Fqns = Annotated[list[str], Meta(description="parameter fqns in the watched model")]
MAX_COLLECTIVES = 65_536  # per event; the probe sends at 4096


class Collective(msgspec.Struct, kw_only=True, frozen=True, omit_defaults=True):
    """One collective this rank issued: what it sent and who called it."""

    op: Annotated[str, Meta(description="all_reduce, broadcast, all_gather, ...")]
    nbytes: Annotated[int, Meta(ge=0, description="bytes this rank sent")]
    dtype: Annotated[str, Meta(description="dtype of the first tensor sent")]
    group: Annotated[str, Meta(description="process group name")]
    start: Seconds
    end: Annotated[
        float | None, Meta(description="when it completed; null: asynchronous, not seen")
    ] = None
    caller: Annotated[Caller, Meta(description="which part of the engine issued it")]
    ddp: Annotated[
        int | None, Meta(description="serial of the DDP instance that issued it (null: none)")
    ] = None


class Hooks(msgspec.Struct, kw_only=True, frozen=True):
    """The DDP autograd hooks live on one parameter."""

    fqn: Annotated[str, Meta(description="the parameter")]
    reducer: Annotated[
        list[int],
        Meta(description="serials of the DDP instances whose Reducer hooks its grad accumulator"),
    ]
    delayed: Annotated[
        list[int],
        Meta(description="serials whose delayed all-reduce tensor hook is on it"),
    ]


class LifecycleWatch(msgspec.Struct, kw_only=True, frozen=True):
    """Once per rank when the probe attaches (again in a later ``cluster.run`` that trains
    the same model): the instance's settings, its construction-time collectives and the
    DDP hooks live on each of its parameters."""

    KIND: ClassVar[str] = "lifecycle_watch"

    ddp: Serial
    world_size: Annotated[int, Meta(ge=1, description="ranks in DDP's process group")]
    recorded_from: Annotated[
        Literal["process_group", "watch"],
        Meta(
            description="when this rank's collective recorder started: at process-group "
            "creation (construction collectives seen) or at this watch (they were not)"
        ),
    ]
    static_graph: Annotated[bool, Meta(description="DDP(static_graph=...)")]
    find_unused_parameters: Annotated[bool, Meta(description="DDP(find_unused_parameters=...)")]
    forward_sync_buffers: Annotated[
        bool, Meta(description="buffers broadcast from rank 0 before every forward")
    ]
    init_sync_buffers: Annotated[
        bool,
        Meta(
            description="buffers were in the construction-time sync (broadcast_buffers=False: no)"
        ),
    ]
    gradient_as_bucket_view: Annotated[bool, Meta(description="DDP(gradient_as_bucket_view=...)")]
    delayed: Annotated[
        list[str], Meta(description="delay_all_reduce_named_params: reduced outside the Reducer")
    ]
    hook_param: Annotated[
        str | None, Meta(description="param_to_hook_all_reduce: whose gradient hook reduces them")
    ]
    comm_hook: Annotated[str | None, Meta(description="the registered comm hook's name, if any")]
    mixed_precision: Annotated[str | None, Meta(description="DDP(mixed_precision=...), as text")]
    optimizer_in_backward: Annotated[
        list[str], Meta(description="parameters with _apply_optimizer_in_backward optimizers")
    ]
    params: Annotated[list[str], Meta(description="the Reducer's parameters, in DDP's order")]
    param_bytes: Annotated[int, Meta(ge=0, description="bytes of the parameters DDP syncs")]
    buffers: Annotated[list[str], Meta(description="the buffers DDP syncs")]
    buffer_bytes: Annotated[int, Meta(ge=0, description="bytes of those buffers")]
    construction: Annotated[
        list[Collective],
        Meta(description="collectives issued inside this instance's __init__, in order"),
    ]
    hooks: Annotated[list[Hooks], Meta(description="DDP hooks per parameter of the model")]


class LifecycleIteration(msgspec.Struct, kw_only=True, frozen=True):
    """One iteration, sent when the next one begins (and at a flush or detach): usually one
    per iteration; a flush in between sends it in parts with the same ``iteration``, whose
    counts add up and whose lists concatenate."""

    KIND: ClassVar[str] = "lifecycle_iteration"

    iteration: Annotated[int, Meta(ge=1, description="backward cycles since attach")]
    ddp: Serial
    forwards: Annotated[
        int, Meta(ge=0, description="training forwards (grad enabled) before the backward")
    ]
    dropped: Annotated[
        int, Meta(ge=0, description="of those, forwards whose output died without a backward")
    ]
    backward: Annotated[bool, Meta(description="the backward ended in this part")]
    finished: Annotated[
        bool | None,
        Meta(description="the Reducer finished its reduction (null: none expected, no_sync)"),
    ] = None
    unready: Annotated[
        list[str], Meta(description="Reducer parameters that got no gradient in the backward")
    ] = []
    ready: Annotated[
        list[str], Meta(description="parameters in the order their gradients became ready")
    ] = []
    collectives: Annotated[
        list[Collective],
        Meta(max_length=MAX_COLLECTIVES, description="every collective this rank issued, in order"),
    ] = []
    walk_s: Annotated[
        float | None,
        Meta(description="seconds of find_unused_parameters' graph walk (null: not run)"),
    ] = None
    steps_in_backward: Annotated[
        int, Meta(ge=0, description="optimizer steps taken inside the backward")
    ] = 0


class LifecycleCheck(msgspec.Struct, kw_only=True, frozen=True):
    """A lifecycle mistake, sent (and flushed) the moment it is seen, before anything can
    hang: ``unfinished`` right after a backward whose reduction did not finish (the next
    forward raises, or a rank waits); ``forward_without_backward`` at the next forward or
    collective after a forward whose output died without a backward; ``double_hooks``
    when a parameter carries the hooks of two live DDP instances."""

    KIND: ClassVar[str] = "lifecycle_check"

    check: Annotated[Check, Meta(description="which check fired")]
    iteration: Iteration
    ddp: Serial
    fqns: Annotated[list[str], Meta(description="the parameters concerned")]
    others: Annotated[
        list[int], Meta(description="double_hooks: the other DDP instances' serials")
    ] = []
    message: Annotated[str, Meta(description="what happened and how to fix it")]


EVENTS = (LifecycleWatch, LifecycleIteration, LifecycleCheck)  # in docs/events.md, in order
