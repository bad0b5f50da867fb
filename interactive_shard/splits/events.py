"""The graph-split probe's events, and the partition records planner and probe share.

Emitted on the ranks by ``interactive_shard.splits.probe`` (``ish.watch(compiled_ddp)``),
read in the kernel by ``interactive_shard.splits.model.SplitsModel``. The planner
(``plan.py``) builds the same ``Partition`` / ``Region`` records, so a planned and a
captured partition compare field by field. Only plain data: node targets as strings,
parameter fqns, byte counts, generated code as text.
"""

# docs/events.md is written from this file (tools/gen_event_docs.py). No torch here:
# the kernel imports it to read recordings.

from __future__ import annotations

from typing import Annotated, ClassVar, Literal

import msgspec
from msgspec import Meta

Bytes = Annotated[int, Meta(ge=0)]
Seconds = Annotated[float, Meta(ge=0.0, le=1e9)]

# Global-state calls of a dynamo graph (torch.amp and torch._C), as their targets read.
ENTER_AUTOCAST = "torch.amp.autocast_mode._enter_autocast"
EXIT_AUTOCAST = "torch.amp.autocast_mode._exit_autocast"
SET_GRAD = "torch._C._set_grad_enabled"


class State(msgspec.Struct, kw_only=True, frozen=True, omit_defaults=True):
    """What a global-state call does: the calls ``split_module`` copies into partitions."""

    call: Annotated[
        Literal["enter_autocast", "exit_autocast", "set_grad"],
        Meta(description="`_enter_autocast`, `_exit_autocast` or `_set_grad_enabled`"),
    ]
    device_type: Annotated[str | None, Meta(description='enter_autocast: e.g. `"cpu"`')] = None
    dtype: Annotated[
        str | None,
        Meta(description='enter_autocast: e.g. `"torch.bfloat16"` (None: the device\'s default)'),
    ] = None
    enabled: Annotated[
        bool | None, Meta(description="enter_autocast: autocast on; set_grad: grad mode on")
    ] = None
    enter: Annotated[
        str | None, Meta(description="exit_autocast: the name of the enter node it closes")
    ] = None


class Call(msgspec.Struct, kw_only=True, frozen=True, omit_defaults=True):
    """One ``call_function`` / ``call_method`` / ``call_module`` node of a partition."""

    name: Annotated[str, Meta(description="the FX node's name")]
    op: Annotated[Literal["call_function", "call_method", "call_module"], Meta()]
    target: Annotated[
        str,
        Meta(description='qualified function name (`"torch._C._nn.linear"`), method or module'),
    ]
    state: Annotated[State | None, Meta(description="set for global-state calls")] = None


class Region(msgspec.Struct, kw_only=True, frozen=True, omit_defaults=True):
    """A global-state region as one partition sees it: an autocast or a grad-mode region."""

    kind: Annotated[Literal["autocast", "grad"], Meta()]
    enters: Annotated[
        bool, Meta(description="the partition enters it (an enter or set-grad call is in it)")
    ]
    exits: Annotated[
        bool,
        Meta(
            description="the partition leaves it (autocast: an exit call; grad: the next set-grad)"
        ),
    ]
    device_type: Annotated[str | None, Meta(description="autocast only")] = None
    dtype: Annotated[str | None, Meta(description="autocast only")] = None
    enabled: Annotated[
        bool | None,
        Meta(description="autocast: on (False: a region that turns autocast off); grad: the mode"),
    ] = None

    def describe(self) -> str:
        if self.kind == "autocast":
            what = f"autocast({self.device_type}, {self.dtype})"
            what += " disabled" if self.enabled is False else ""
        else:
            what = f"grad enabled={self.enabled}"
        ends = [w for w, on in (("enters", self.enters), ("exits", self.exits)) if on]
        return f"{what} [{', '.join(ends) or 'neither entered nor left here'}]"


class Partition(msgspec.Struct, kw_only=True, frozen=True):
    """One piece of the split graph (``submod_<index>``), in execution order."""

    index: Annotated[int, Meta(ge=0, description="execution position (0 runs first)")]
    name: Annotated[str, Meta(description='the submodule\'s name, `"submod_0"`')]
    calls: Annotated[list[Call], Meta(description="its call nodes, in order")]
    fqns: Annotated[
        list[str],
        Meta(
            description="parameters DDPOptimizer counted into its bucket, as the model's "
            "fqns, in the order it counted them (reverse graph order: gradient-ready order)"
        ),
    ]
    nbytes: Annotated[Bytes, Meta(description="the bucket's size as DDPOptimizer counted it")]
    param_bytes: Annotated[list[Bytes], Meta(description="per entry of `fqns`")] = []
    regions: Annotated[list[Region], Meta(description="global-state regions, in entry order")]
    inputs: Annotated[list[str], Meta(description="placeholder names")] = []
    outputs: Annotated[list[str], Meta(description="names of the values it returns")] = []
    extended: Annotated[
        int,
        Meta(
            ge=0,
            description="nodes DDPOptimizer added past the cap so the bucket has an output",
        ),
    ] = 0
    code: Annotated[str, Meta(description="generated Python of the partition (captured only)")] = ""
    compile_s: Annotated[
        Seconds, Meta(description="the backend's compile time (captured only)")
    ] = 0.0

    @property
    def targets(self) -> list[str]:
        """Each call node's target, in order."""
        return [c.target for c in self.calls]


class ParamUse(msgspec.Struct, array_like=True, frozen=True):
    """A parameter DDPOptimizer counts at a node: its name there, fqn and bytes."""

    name: str
    fqn: str
    nbytes: Bytes


class GraphNode(msgspec.Struct, kw_only=True, frozen=True, omit_defaults=True):
    """A node of the dynamo graph DDPOptimizer split (placeholders and output left out),
    with what DDPOptimizer counts at it: enough to plan the split again for any cap."""

    name: str
    op: Annotated[Literal["call_function", "call_method", "call_module", "get_attr"], Meta()]
    target: str
    inputs: Annotated[list[str], Meta(description="names of the nodes it reads")] = []
    users: Annotated[
        list[str], Meta(description='names of the nodes reading it (`"output"`: the graph output)')
    ] = []
    module: Annotated[
        str | None, Meta(description="the submodule whose parameters it counts (once per module)")
    ] = None
    module_params: Annotated[list[ParamUse], Meta(description="that submodule's parameters")] = []
    arg_params: Annotated[list[ParamUse], Meta(description="parameters among its arguments")] = []
    state: Annotated[State | None, Meta(description="set for global-state calls")] = None


class SplitCompile(msgspec.Struct, kw_only=True, frozen=True):
    """Once per DDPOptimizer compile of the watched model on a rank (every recompile and
    every graph of a forward with graph breaks is one more)."""

    KIND: ClassVar[str] = "split_compile"

    index: Annotated[int, Meta(ge=0, description="compiles of this model on this rank so far")]
    backend: Annotated[
        str, Meta(description='the backend that compiled each partition, `"aot_eager"`')
    ]
    bucket_bytes_cap: Annotated[Bytes, Meta(description="DDPOptimizer's cap (the DDP model's)")]
    first_bucket_bytes: Annotated[Bytes, Meta(description="DDPOptimizer's first-bucket cap")]
    graph: Annotated[list[GraphNode], Meta(description="the dynamo graph it split")]
    partitions: Annotated[list[Partition], Meta(description="in execution order")]
    parent: Annotated[str, Meta(description='the split graph\'s code (`""`: one partition)')] = ""
    break_reasons: Annotated[list[str], Meta(description="one per compiled partition")] = []
    compile_s: Annotated[Seconds, Meta(description="DDPOptimizer's whole compile")] = 0.0


class SplitNothing(msgspec.Struct, kw_only=True, frozen=True):
    """The watched compiled model ran, and DDPOptimizer compiled nothing for it."""

    KIND: ClassVar[str] = "split_nothing"

    reason: Annotated[str, Meta(description="why, in words, with the fix")]
    calls: Annotated[int, Meta(ge=1, description="forwards run when this was noticed")] = 1


EVENTS = (SplitCompile, SplitNothing)  # in docs/events.md, in this order
