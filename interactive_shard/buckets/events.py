"""The DDP bucket probe's events: one msgspec Struct per event kind, the only definition.

Emitted on the ranks by ``interactive_shard.buckets.probe`` (``ish.watch(ddp)``), read in
the kernel by ``interactive_shard.buckets.model.BucketMap``. DDP iterations are counted
by the probe (``iteration``, from 1 = the first backward after ``ish.watch``);
``Event.step`` is the user's ``ctx.step``. The probe builds these Structs and sends
``msgspec.structs.asdict(event)``; the model decodes with ``msgspec.convert``.
"""

# docs/events.md is written from this file (tools/gen_event_docs.py). No torch here:
# the kernel imports it to read recordings.

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Annotated, ClassVar, Literal

import msgspec
from msgspec import Meta

# A time on the rank's time.monotonic() clock, in seconds: any finite float.
Time = Annotated[float, Meta(ge=-sys.float_info.max, le=sys.float_info.max)]
Shape = tuple[int, ...]  # a list on the wire; a tuple here, as the planner's shapes
Checksum = Literal["sampled", "full", "off"]
Iteration = Annotated[int, Meta(ge=1, description="DDP iteration (1 = the first backward)")]


def _same_lengths(kind: str, named: dict[str, Sequence[object]]) -> None:
    lengths = {name: len(values) for name, values in named.items()}
    if len(set(lengths.values())) > 1:
        raise ValueError(f"{kind}: per-parameter lists of different lengths {lengths}")


class DdpDelayed(msgspec.Struct, kw_only=True, frozen=True):
    """The parameters of ``DistributedDataParallel(delay_all_reduce_named_params=...)``:
    in no bucket, all-reduced in one flat buffer from a gradient hook on another
    parameter (Note [DDP buckets] in ``buckets/plan.py``, step 6).

    Lists are per parameter, in DDP's ``_delay_all_reduce_params`` order.
    """

    fqns: Annotated[
        list[str],
        Meta(
            description="the names given to DDP, which it matches against its keys "
            "(`module.name`, `.name` for a root parameter: a root one given as `name` "
            "stays in the buckets); `plan_buckets` takes them as they are"
        ),
    ]
    shapes: Annotated[list[Shape], Meta(description="per parameter")]
    dtypes: Annotated[list[str], Meta(description="per parameter")]
    modules: Annotated[list[str], Meta(description='owning module fqn (`""` for the root)')]
    module_types: Annotated[list[str], Meta(description="owning module class name")]
    hook: Annotated[
        str | None,
        Meta(
            description="fqn of `param_to_hook_all_reduce`, whose gradient hook launches "
            "the all-reduce (null: not found)"
        ),
    ] = None

    def __post_init__(self) -> None:
        _same_lengths(
            "ddp_watch.delayed",
            {
                "fqns": self.fqns,
                "shapes": self.shapes,
                "dtypes": self.dtypes,
                "modules": self.modules,
                "module_types": self.module_types,
            },
        )


class DdpWatch(msgspec.Struct, kw_only=True, frozen=True):
    """Once per rank when ``ish.watch(ddp)`` attaches, and again at the first iteration of
    every later ``cluster.run`` (so each run stands alone).

    Lists are per parameter, in the Reducer's parameter order.
    """

    KIND: ClassVar[str] = "ddp_watch"

    fqns: Annotated[
        list[str],
        Meta(
            description="trainable parameters in registration order (the wrapped module's "
            "`named_parameters()`, without the `module.` prefix), i.e. the Reducer's "
            "parameter list: frozen ones and those DDP ignores are left out"
        ),
    ]
    shapes: Annotated[list[Shape], Meta(description="per parameter")]
    dtypes: Annotated[list[str], Meta(description='per parameter, e.g. `"torch.float32"`')]
    modules: Annotated[
        list[str], Meta(description='owning module fqn (`"layers.0.attn"`; `""` for the root)')
    ]
    module_types: Annotated[list[str], Meta(description='owning module class name (`"Linear"`)')]
    bucket_cap_mb: Annotated[
        float | None, Meta(description="as passed to DDP (null: DDP's default)")
    ] = None
    bucket_cap_mb_list: Annotated[
        list[float] | None, Meta(description="as passed to DDP (torch >= 2.13)")
    ] = None
    bucket_bytes_cap: Annotated[
        int, Meta(ge=0, description="DDP's effective cap in bytes (`ddp.bucket_bytes_cap`)")
    ]
    first_bucket_bytes: Annotated[int, Meta(ge=0, description="DDP's first-bucket cap in bytes")]
    find_unused_parameters: Annotated[bool, Meta(description="as passed to DDP")]
    static_graph: Annotated[bool, Meta(description="as passed to DDP")]
    world_size: Annotated[int, Meta(ge=1, description="ranks in DDP's process group")]
    user_hook: Annotated[
        str | None,
        Meta(description="qualified name of the user's comm hook the probe calls (null: none)"),
    ] = None
    checksum: Annotated[
        Checksum, Meta(description="how `ddp_iteration` checksums the gradients")
    ] = "off"
    delayed: Annotated[
        DdpDelayed | None,
        Meta(
            description="the parameters DDP all-reduces outside its buckets "
            "(`delay_all_reduce_named_params`); null: none"
        ),
    ] = None
    first_iteration: Annotated[
        Annotated[int, Meta(ge=1)] | None,
        Meta(
            description="DDP's own number of the first iteration watched: above 1 when "
            "`ish.watch` came after DDP ran (iterations are numbered as DDP numbers them); "
            "null: DDP ran an unknown number of iterations before (they are numbered from "
            "1, and the plan is not compared with them)",
        ),
    ] = 1

    def __post_init__(self) -> None:
        _same_lengths(
            self.KIND,
            {
                "fqns": self.fqns,
                "shapes": self.shapes,
                "dtypes": self.dtypes,
                "modules": self.modules,
                "module_types": self.module_types,
            },
        )


class BucketReduced(msgspec.Struct, kw_only=True, frozen=True):
    """Once per bucket per iteration per rank, sent at the end of that backward.

    Events arrive in completion order, which need not be index order. Lists are per
    parameter, in ``GradBucket.parameters()`` order.
    """

    KIND: ClassVar[str] = "bucket"

    iteration: Iteration
    index: Annotated[int, Meta(ge=0, description="`GradBucket.index()`")]
    fqns: Annotated[list[str], Meta(description="the bucket's parameters")]
    shapes: Annotated[list[Shape], Meta(description="per parameter")]
    dtypes: Annotated[list[str], Meta(description="per parameter")]
    nbytes: Annotated[int, Meta(ge=0, description="bucket buffer bytes")]
    ready_t: Annotated[
        Time,
        Meta(
            description="the bucket became ready: its last gradient was ready (a gradient "
            "ready twice, under reentrant checkpointing, counts at the arrival before the "
            "launch); with a user comm hook: the hook was entered"
        ),
    ]
    start_t: Annotated[
        Time,
        Meta(
            description="reduction launched: just before the all-reduce (after the "
            "averaging, when the probe's comm hook reduces); with a user hook, when the "
            "probe calls it"
        ),
    ]
    end_t: Annotated[
        Time | None,
        Meta(
            description="the reduction's future completed (noted by a callback on the "
            "backend's thread); null: not known, the all-reduce had not finished when the "
            "bucket was sent (DDP never finished the iteration)"
        ),
    ]
    is_last: Annotated[bool, Meta(description="`GradBucket.is_last()`")] = False

    def __post_init__(self) -> None:
        named: dict[str, Sequence[object]] = {
            "fqns": self.fqns,
            "shapes": self.shapes,
            "dtypes": self.dtypes,
        }
        _same_lengths(self.KIND, named)


class DdpIteration(msgspec.Struct, kw_only=True, frozen=True):
    """Once per iteration per rank, at the end of backward, after DDP's own end-of-backward
    work (so ``checksums`` see the reduced gradients).

    A backward under ``no_sync()`` (DDP does not reduce) is not an iteration and emits
    nothing.
    """

    KIND: ClassVar[str] = "ddp_iteration"

    iteration: Iteration
    backward_start: Annotated[
        Time | None,
        Meta(
            description="the first gradient became ready (about the start of backward "
            "compute); null when no gradient became ready"
        ),
    ] = None
    backward_end: Annotated[
        Time | None,
        Meta(description="the last gradient became ready (end of backward compute); null as above"),
    ] = None
    ready_order: Annotated[
        list[str],
        Meta(
            description="fqns in the order their gradients became ready (a parameter ready "
            "more than once is placed at its last time)"
        ),
    ]
    ready_t: Annotated[list[Time], Meta(description="per entry of `ready_order`")]
    unready: Annotated[
        list[str],
        Meta(description="trainable parameters whose gradient never became ready this iteration"),
    ] = []
    repeated: Annotated[
        list[str],
        Meta(
            description="parameters whose gradient became ready more than once (reentrant "
            "checkpointing)"
        ),
    ] = []
    checksums: Annotated[
        dict[str, float],
        Meta(
            description="per parameter, a checksum of the final `.grad` after DDP finished "
            "(sampled or full, see `ddp_watch.checksum`); a parameter without `.grad` is absent"
        ),
    ] = {}

    def __post_init__(self) -> None:
        if len(self.ready_t) != len(self.ready_order):
            raise ValueError(
                f"{self.KIND}: {len(self.ready_t)} ready_t for {len(self.ready_order)} "
                "ready_order entries; give one time per entry"
            )


EVENTS = (DdpWatch, BucketReduced, DdpIteration)  # in docs/events.md, in this order
