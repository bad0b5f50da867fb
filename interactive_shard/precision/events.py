"""The mixed-precision probe's events: one msgspec Struct per event kind, the only definition.

Emitted on the ranks by ``interactive_shard.precision.probe`` (``ish.watch`` of an FSDP2
root, an FSDP1 root or a DDP model with ``mixed_precision=``), read in the kernel by
``interactive_shard.precision.model.PrecisionModel``. Dtypes travel as strings
(``"torch.bfloat16"``). An iteration is one forward of the watched root (1 = the first
after ``ish.watch``); what its backward and the optimizer step that follows show is
reported under the same iteration. The probe batches what it sees: one
``precision_batch`` event per iteration (and at a failure, a flush or detach) holds the
iteration's ``PrecisionSeen`` and ``PrecisionCollective`` records in the order seen.
"""

# docs/events.md is written from this file (tools/gen_event_docs.py). No torch here:
# the kernel imports it to read recordings.

from __future__ import annotations

from typing import Annotated, ClassVar, Literal

import msgspec
from msgspec import Meta

Wrapper = Literal["fsdp2", "fsdp1", "ddp"]
# The phases of a unit whose dtype the planner predicts and the probe observes.
Phase = Literal[
    "input",  # each floating input, after the unit's cast (or passed through)
    "param",  # the unsharded parameters while the unit computes (forward and backward)
    "output",  # the unit's output, after output_dtype
    "grad",  # the unsharded gradients the unit's backward produces
    "reduce",  # the gradient reduction: seen as its PrecisionCollective, not as PrecisionSeen
    "sharded_param",  # the parameters the optimizer steps
    "sharded_grad",  # the gradients the optimizer reads
]
PHASES: tuple[str, ...] = (
    "input",
    "param",
    "output",
    "grad",
    "reduce",
    "sharded_param",
    "sharded_grad",
)
Iteration = Annotated[int, Meta(ge=1, description="forwards of the watched root (1 = the first)")]
Bytes = Annotated[int, Meta(ge=0)]
MAX_BATCH = 4096  # records of one kind per precision_batch; the probe sends at 1024


class Policy(msgspec.Struct, kw_only=True, frozen=True, omit_defaults=True):
    """A unit's mixed-precision policy as plain data (dtypes as strings, null: not set)."""

    kind: Annotated[
        Literal["MixedPrecisionPolicy", "MixedPrecision", "_MixedPrecision", "none"],
        Meta(description="FSDP2's, FSDP1's or DDP's policy class; `none`: no policy"),
    ]
    param_dtype: str | None = None
    reduce_dtype: str | None = None
    output_dtype: Annotated[str | None, Meta(description="FSDP2 only")] = None
    buffer_dtype: Annotated[str | None, Meta(description="FSDP1 and DDP")] = None
    cast_forward_inputs: Annotated[bool | None, Meta(description="FSDP2 and FSDP1")] = None
    cast_root_forward_inputs: Annotated[bool | None, Meta(description="FSDP1 only")] = None
    keep_low_precision_grads: Annotated[bool | None, Meta(description="FSDP1 only")] = None


class Unit(msgspec.Struct, kw_only=True, frozen=True):
    """One unit: a module FSDP wraps (or the DDP model), with its own policy."""

    fqn: Annotated[str, Meta(description="the module's fqn in the user's model (`\"\"`: the root)")]
    parent: Annotated[str | None, Meta(description="the enclosing unit's fqn (null: the root)")]
    module_type: Annotated[str, Meta(description='the module\'s class name, `"Linear"`')]
    policy: Policy
    params: Annotated[list[str], Meta(description="fqns of the parameters the unit manages")]
    param_dtypes: Annotated[list[str], Meta(description="their original dtypes, per entry")]
    numel: Annotated[int, Meta(ge=0, description="elements of those parameters, unsharded")]


class PrecisionWatch(msgspec.Struct, kw_only=True, frozen=True):
    """Once per rank when ``ish.watch`` attaches: the units and their policies."""

    KIND: ClassVar[str] = "precision_watch"

    wrapper: Annotated[Wrapper, Meta(description="FSDP2 (`fully_shard`), FSDP1 or DDP")]
    world_size: Annotated[int, Meta(ge=1, description="ranks the parameters are sharded over")]
    units: Annotated[list[Unit], Meta(description="root first, then in module order")]
    reduce_rule: Annotated[
        Literal["compute", "original"],
        Meta(
            description="FSDP2 with no reduce_dtype reduces in the compute dtype (torch up "
            "to 2.14) or in the parameters' original dtype (2.15 on)"
        ),
    ] = "compute"


class PrecisionSeen(msgspec.Struct, kw_only=True, frozen=True, omit_defaults=True):
    """What one unit showed in one phase of one iteration, on the real run."""

    iteration: Iteration
    unit: Annotated[str, Meta(description="the unit's fqn")]
    phase: Annotated[Phase, Meta(description="see the phases above")]
    dtypes: Annotated[
        list[str],
        Meta(description="input: one per floating input, after the cast; else the distinct dtypes"),
    ]
    before: Annotated[
        list[str],
        Meta(description="input: per floating input, before the cast; output: before output_dtype"),
    ] = []
    cast: Annotated[
        list[bool],
        Meta(
            description="input: per floating input, True when cast, False: the same tensor passed"
        ),
    ] = []


class PrecisionCollective(msgspec.Struct, kw_only=True, frozen=True):
    """One collective a unit issued: an all-gather of its parameters, or the reduction of
    its gradients (its ``reduce`` phase)."""

    iteration: Iteration
    unit: Annotated[str, Meta(description="the unit's fqn")]
    op: Annotated[
        Literal["all_gather", "reduce_scatter", "all_reduce"],
        Meta(description="reduce_scatter / all_reduce: the unit's `reduce` phase"),
    ]
    dtype: Annotated[str, Meta(description="the dtype of the buffer it sent")]
    nbytes: Annotated[Bytes, Meta(description="bytes this rank sent")]
    backward: Annotated[bool, Meta(description="issued during backward")] = False


class PrecisionBatch(msgspec.Struct, kw_only=True, frozen=True, omit_defaults=True):
    """What the probe saw since its previous batch, in the order seen: sent when the next
    forward begins, after the optimizer step reads the sharded state, before a
    ``precision_failure``, when the rank flushes its channel, and at detach. One event
    per iteration instead of one per record: the kernel's cost is per event."""

    KIND: ClassVar[str] = "precision_batch"

    seen: Annotated[
        list[PrecisionSeen], Meta(max_length=MAX_BATCH, description="phases seen, in order")
    ] = []
    collectives: Annotated[
        list[PrecisionCollective],
        Meta(max_length=MAX_BATCH, description="collectives issued, in order"),
    ] = []


class PrecisionFailure(msgspec.Struct, kw_only=True, frozen=True):
    """A forward of the watched root raised (a dtype mismatch, or e.g. DDP mixed precision
    on CPU): where, as the probe located it. What was seen before it stays recorded."""

    KIND: ClassVar[str] = "precision_failure"

    iteration: Iteration
    unit: Annotated[str, Meta(description="the innermost unit holding the failing module")]
    consumer: Annotated[str, Meta(description="the innermost module whose forward raised")]
    message: Annotated[str, Meta(description="the error, as torch raised it")]


EVENTS = (
    PrecisionWatch,
    PrecisionBatch,
    PrecisionFailure,
)  # in docs/events.md, in this order
