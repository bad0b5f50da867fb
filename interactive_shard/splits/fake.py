"""Synthetic DDPOptimizer compiles, as the splits probe emits them, without ranks: the
partitions come from the reference planner run on a dynamo graph (``mlp_graph`` writes
the graph dynamo traces of ``split_net`` without torch; ``traced_graph`` traces any
module in this process). For tests, benchmarks and offline demos (``Feature.fake``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec
import msgspec.structs

from interactive_shard.splits.events import (
    ENTER_AUTOCAST,
    EXIT_AUTOCAST,
    SET_GRAD,
    GraphNode,
    ParamUse,
    Partition,
    SplitCompile,
    SplitNothing,
    State,
)
from interactive_shard.splits.plan import GraphPlan, caps, plan_graph, skipped_reason
from interactive_shard.telemetry.schema import Event

# What DDPOptimizer gives every partition it compiles (``compile_subgraph_reason``).
DDP_BREAK_REASON = (
    "DDPOptimizer intentional graph-break (See Note [DDPOptimizer]). Set "
    "`torch._dynamo.config.optimize_ddp = False` to disable."
)
# The probe's ``split_nothing`` for ``torch.compile(DDP(nn.Sequential(...)))``.
NOTHING_REASON = skipped_reason("torch.nn.modules.container", "Sequential") or ""


def split_net(
    layers: int = 4,
    width: int = 64,
    *,
    out: int = 1,
    autocast: str | None = None,
    no_grad: bool = False,
) -> Any:
    """A small ``nn.Module`` whose dynamo graph ``mlp_graph`` writes without torch:
    ``layers`` Linear+relu under ``torch.autocast("cpu", autocast)`` (when given), then
    ``x.float() * 2`` (under ``torch.no_grad()`` when ``no_grad``), then a Linear head."""
    import torch
    from torch import nn

    dtype = getattr(torch, autocast.removeprefix("torch.")) if autocast else None

    class SplitNet(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layers = nn.ModuleList(nn.Linear(width, width) for _ in range(layers))
            self.head = nn.Linear(width, out)

        def body(self, x: torch.Tensor) -> torch.Tensor:
            for layer in self.layers:
                x = torch.relu(layer(x))
            return x

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            if dtype is not None:
                with torch.autocast("cpu", dtype):
                    x = self.body(x)
            else:
                x = self.body(x)
            if no_grad:
                with torch.no_grad():
                    x = x.float() * 2
            else:
                x = x.float() * 2
            # No local for the result: dynamo names the node after it (the graph is tested).
            return self.head(x)  # type: ignore[no-any-return]

    return SplitNet()


def traced_graph(module: Any, example_inputs: Any) -> list[GraphNode]:
    """The first dynamo graph of ``module``, as the probe records it (torch, in-process)."""
    from interactive_shard.splits import _trace

    return _trace.dynamo_graphs(module, example_inputs)[0]


def _param(module: str, name: str, nbytes: int) -> tuple[str, ParamUse]:
    mangled = f"self_modules_{module.replace('.', '_modules_')}_parameters_{name}_"
    return f"l_{mangled}", ParamUse(f"L_{mangled}", f"{module}.{name}", nbytes)


def mlp_graph(
    layers: int = 4,
    width: int = 64,
    *,
    out: int = 1,
    autocast: str | None = None,
    no_grad: bool = False,
    itemsize: int = 4,
) -> list[GraphNode]:
    """The dynamo graph of ``split_net(layers, width, ...)``, node for node, without torch
    (``tests/unit/test_splits_model.py`` checks it against the real trace)."""
    nodes: list[GraphNode] = []

    def linear(name: str, x: str, module: str, fan_in: int, fan_out: int, user: str) -> None:
        w_in, w = _param(module, "weight", fan_in * fan_out * itemsize)
        b_in, b = _param(module, "bias", fan_out * itemsize)
        nodes.append(
            GraphNode(
                name=name,
                op="call_function",
                target="torch._C._nn.linear",
                inputs=[x, w_in, b_in],
                users=[user],
                arg_params=[w, b],
            )
        )

    def fn(name: str, target: str, inputs: list[str], user: str, op: Any = "call_function") -> None:
        nodes.append(GraphNode(name=name, op=op, target=target, inputs=inputs, users=[user]))

    def relu_name(i: int) -> str:
        return "x" if i == 0 else f"x_{i}"

    if autocast:
        state = State(call="enter_autocast", device_type="cpu", dtype=autocast, enabled=True)
        nodes.append(
            GraphNode(
                name="_enter_autocast",
                op="call_function",
                target=ENTER_AUTOCAST,
                users=["_exit_autocast"],
                state=state,
            )
        )
    x = "l_x_"
    for i in range(layers):
        name = "linear" if i == 0 else f"linear_{i}"
        linear(name, x, f"layers.{i}", width, width, relu_name(i))
        x = relu_name(i)
        fn(x, "torch.relu", [name], f"linear_{i + 1}" if i + 1 < layers else "float_1")
    if autocast:
        exit_state = State(call="exit_autocast", enter="_enter_autocast")
        nodes.append(
            GraphNode(
                name="_exit_autocast",
                op="call_function",
                target=EXIT_AUTOCAST,
                inputs=["_enter_autocast"],
                state=exit_state,
            )
        )
    if no_grad:
        nodes.append(_set_grad("_set_grad_enabled", False))
    scaled = relu_name(layers)
    fn("float_1", "float", [x], scaled, op="call_method")
    fn(scaled, "_operator.mul", ["float_1"], f"linear_{layers}")
    if no_grad:
        nodes.append(_set_grad("_set_grad_enabled_1", True))
    linear(f"linear_{layers}", scaled, "head", width, out, "output")
    return nodes


def _set_grad(name: str, enabled: bool) -> GraphNode:
    state = State(call="set_grad", enabled=enabled)
    return GraphNode(name=name, op="call_function", target=SET_GRAD, state=state)


def captured(
    plan: GraphPlan, graph: Sequence[GraphNode], *, s_per_call: float = 2e-3
) -> list[Partition]:
    """The planned partitions as the probe reports them: with the inputs, outputs and
    code of each ``submod_<i>`` (rendered from its calls) and a compile time."""
    by_name = {n.name: n for n in graph}
    out = []
    for p in plan.partitions:
        mine = {c.name for c in p.calls}
        inputs: dict[str, None] = {}
        outputs: dict[str, None] = {}
        for c in p.calls:
            node = by_name.get(c.name)
            if node is None or node.state is not None:  # global-state copies link nothing
                continue
            inputs.update(dict.fromkeys(i for i in node.inputs if i not in mine))
            if any(u not in mine for u in node.users):
                outputs[c.name] = None
        code = _render(p, list(inputs), list(outputs), by_name)
        out.append(
            msgspec.structs.replace(
                p,
                inputs=list(inputs),
                outputs=list(outputs),
                code=code,
                compile_s=s_per_call * (1 + len(p.calls)),
            )
        )
    return out


def _render(
    p: Partition, inputs: list[str], outputs: list[str], by_name: dict[str, GraphNode]
) -> str:
    """Code shaped like ``GraphModule.code`` (the arguments are node names, constants left
    out: the synthetic graph does not keep them)."""
    lines = [f"def forward(self, {', '.join(inputs)}):"]
    for c in p.calls:
        s = c.state
        if s is not None and s.call == "enter_autocast":
            args = f"{s.device_type!r}, {s.dtype}, {s.enabled}, None"
        elif s is not None and s.call == "exit_autocast":
            args = s.enter or ""
        elif s is not None:
            args = str(s.enabled)
        else:
            args = ", ".join(by_name[c.name].inputs if c.name in by_name else [])
        if c.op == "call_method":
            first, *rest = args.split(", ")
            lines.append(f"    {c.name} = {first}.{c.target}({', '.join(rest)})")
        else:
            lines.append(f"    {c.name} = {c.target}({args})")
    lines.append(f"    return ({''.join(o + ', ' for o in outputs)})")
    return "\n".join(lines)


def split_event(record: SplitCompile | SplitNothing, rank: int, t: float = 1000.0) -> Event:
    """One rank's event for ``record``, its payload as the probe sends it."""
    return Event(record.KIND, rank, 0, t, msgspec.to_builtins(record))


@dataclass
class FakeSplits:
    """Settings of a fake compiled DDP run; ``events()`` returns every rank's split events.

    Each rank compiles ``graph`` ``compiles`` times (recompiles repeat it) at the given
    caps; the partitions are the planner's (so captured == planned unless a test alters
    a compile). A rank in ``nothing`` reports ``split_nothing`` with that reason instead.
    """

    graph: list[GraphNode]
    world_size: int = 2
    bucket_cap_mb: float = 25.0
    first_bucket_cap_mb: float | None = None
    compiles: int = 1
    backend: str = "aot_eager"
    nothing: dict[int, str] = field(default_factory=dict)
    t0: float = 1000.0

    def compile(self, index: int = 0) -> SplitCompile:
        cap, first = caps(self.bucket_cap_mb, self.first_bucket_cap_mb)
        plan = plan_graph(self.graph, cap, first)
        partitions = captured(plan, self.graph)
        split = len(partitions) > 1
        parent = ""
        if split:
            body = "\n".join(
                f"    {p.name} = self.{p.name}({', '.join(p.inputs)})" for p in partitions
            )
            parent = f"def forward(self, *args):\n{body}\n    return {partitions[-1].name}"
        return SplitCompile(
            index=index,
            backend=self.backend,
            bucket_bytes_cap=cap,
            first_bucket_bytes=first,
            graph=list(self.graph),
            partitions=partitions,
            parent=parent,
            break_reasons=[DDP_BREAK_REASON] * len(partitions) if split else [],
            compile_s=sum(p.compile_s for p in partitions) + 0.01,
        )

    def events(self) -> list[Event]:
        out = []
        for rank in range(self.world_size):
            if rank in self.nothing:
                out.append(split_event(SplitNothing(reason=self.nothing[rank]), rank, self.t0))
                continue
            first = self.compile(0)  # every compile of the graph plans alike: plan once
            for i in range(self.compiles):
                record = first if i == 0 else msgspec.structs.replace(first, index=i)
                out.append(split_event(record, rank, self.t0 + i))
        return sorted(out, key=lambda e: e.t)


# More compiles than a storm: dynamo recompiles a frame at most ``cache_size_limit`` times.
MAX_SAMPLE_COMPILES = 200


def sample(iterations: int = 1) -> list[Event]:
    """The feature's synthetic run (``Feature.fake``): ``torch.compile`` of DDP over 6
    Linear(256, 256) split at 1 MB, compiled ``iterations`` times (at most
    ``MAX_SAMPLE_COMPILES``) on each of 2 ranks."""
    compiles = min(iterations, MAX_SAMPLE_COMPILES)
    return FakeSplits(mlp_graph(6, 256), bucket_cap_mb=1, compiles=compiles).events()
