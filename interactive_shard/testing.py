"""Test fixtures: synthetic bucket, graph-split and mixed-precision events, as
``ish.watch`` would emit them, without ranks.

For tests and benchmarks, not for rank code. Buckets (``FakeRun``): the layout comes from
the planner (so the observed buckets match the plan unless told otherwise) and the times
from a simple model of one backward pass (gradients ready evenly over ``compute_s``,
buckets reduced one after another at ``bytes_per_s``). Splits (``FakeSplits``): the
partitions come from the reference planner run on a dynamo graph (``mlp_graph`` writes
the graph dynamo traces of ``split_net`` without torch; ``traced_graph`` traces any
module in this process). Mixed precision (``FakePrecision``): units with policies
(``mp_net`` builds the nested model of the measurements) run through FSDP2's, FSDP1's or
DDP's dtype rules. Payloads are built from the event Structs of ``buckets/events.py``,
``splits/events.py`` and ``precision/events.py``, as the probes build them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec
import msgspec.inspect as mi
from msgspec.structs import asdict

from interactive_shard.buckets.events import BucketReduced, DdpDelayed, DdpIteration, DdpWatch
from interactive_shard.buckets.plan import ParamSpec, plan_buckets
from interactive_shard.precision._rules import static_dtypes
from interactive_shard.precision.events import (
    Policy,
    PrecisionBatch,
    PrecisionCollective,
    PrecisionFailure,
    PrecisionSeen,
    PrecisionWatch,
    Unit,
)
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


def payload_types(event: type[Any]) -> dict[str, Any]:
    """Field name -> what ``isinstance`` accepts for it in a decoded payload (lists for
    lists and tuples, ``type(None)`` for null), from an event Struct."""
    info = mi.type_info(event)
    assert isinstance(info, mi.StructType), event
    return {f.encode_name: _python_types(f.type) for f in info.fields}


def _python_types(t: mi.Type) -> Any:
    if isinstance(t, mi.Metadata):
        return _python_types(t.type)
    if isinstance(t, mi.UnionType):
        return tuple(_python_types(u) for u in t.types)
    if isinstance(t, mi.LiteralType):
        return tuple({type(v) for v in t.values})
    simple = {
        mi.StrType: str,
        mi.IntType: int,
        mi.FloatType: float,
        mi.BoolType: bool,
        mi.NoneType: type(None),
        mi.ListType: list,
        mi.VarTupleType: list,  # a tuple on this side, an array on the wire
        mi.DictType: dict,
        mi.StructType: dict,  # a nested record is a map on the wire
    }
    for cls, python in simple.items():
        if isinstance(t, cls):
            return python
    raise TypeError(f"payload_types: no Python type for {t!r}")


@dataclass(frozen=True)
class FakeParam:
    fqn: str
    shape: tuple[int, ...]
    module: str
    module_type: str = "Linear"
    dtype: str = "torch.float32"


def mlp_params(layers: int, width: int, prefix: str = "layers") -> list[FakeParam]:
    """``layers`` Linear(width, width) modules: weight and bias each."""
    out = []
    for i in range(layers):
        module = f"{prefix}.{i}"
        out.append(FakeParam(f"{module}.weight", (width, width), module))
        out.append(FakeParam(f"{module}.bias", (width,), module))
    return out


def module_params(model: Any) -> list[FakeParam]:
    """A real module's parameters as ``FakeParam`` (fqn, shape, owning module and its
    type), e.g. ``example_models.llama_7b()``'s on meta: a real layout for fake runs."""
    owners = {
        f"{m}.{n}" if m else n: (m, type(mod).__name__)
        for m, mod in model.named_modules()
        for n, _ in mod.named_parameters(recurse=False)
    }
    return [FakeParam(fqn, tuple(t.shape), *owners[fqn]) for fqn, t in model.named_parameters()]


@dataclass
class FakeRun:
    """Settings of the fake run; ``events()`` returns every rank's events in time order."""

    params: Sequence[FakeParam]
    world_size: int = 2
    iterations: int = 3
    bucket_cap_mb: float | None = None
    bucket_cap_mb_list: list[float] | None = None
    find_unused_parameters: bool = False
    static_graph: bool = False
    ready_order: list[str] | None = None  # default: reverse registration (a plain MLP)
    unready: list[str] = field(default_factory=list)  # never get a gradient
    diverge: dict[int, list[str]] = field(default_factory=dict)  # iteration -> fqns
    compute_s: float = 0.010
    bytes_per_s: float = 1e9
    t0: float = 1000.0
    delayed: list[str] = field(default_factory=list)  # delay_all_reduce_named_params
    delay_hook: str | None = None  # param_to_hook_all_reduce

    def events(self) -> list[Event]:
        fqns = [p.fqn for p in self.params if p.fqn not in self.delayed]
        order = self.ready_order or fqns[::-1]
        order = [f for f in order if f not in self.unready and f not in self.delayed]
        plan = plan_buckets(
            [(p.fqn, ParamSpec(p.shape, p.dtype)) for p in self.params],
            bucket_cap_mb=self.bucket_cap_mb,
            bucket_cap_mb_list=self.bucket_cap_mb_list,
            find_unused_parameters=self.find_unused_parameters,
            static_graph=self.static_graph,
            ready_order=order + [f for f in fqns if f not in order],
            delay_all_reduce_named_params=self.delayed or None,
            param_to_hook_all_reduce=self.delay_hook,
        )
        events = [
            self._watch(rank, plan.bucket_cap_bytes, plan.first_bucket_cap_bytes)
            for rank in range(self.world_size)
        ]
        for it in range(1, self.iterations + 1):
            start = self.t0 + it
            step = self.compute_s / max(len(order), 1)
            ready = {f: start + (i + 1) * step for i, f in enumerate(order)}
            for rank in range(self.world_size):
                prev_end = start
                for b in plan.iteration(it):
                    times = [ready[f] for f in b.fqns if f in ready]
                    ready_t = max(times) if times else start + self.compute_s
                    begin = max(ready_t, prev_end)
                    prev_end = begin + b.nbytes / self.bytes_per_s
                    bucket = BucketReduced(
                        iteration=it,
                        index=b.index,
                        fqns=list(b.fqns),
                        shapes=list(b.shapes),
                        dtypes=list(b.dtypes),
                        nbytes=b.nbytes,
                        ready_t=ready_t,
                        start_t=begin,
                        end_t=prev_end,
                        is_last=b.index == len(plan.iteration(it)) - 1,
                    )
                    events.append(Event(bucket.KIND, rank, it, prev_end, asdict(bucket)))
                checksums = {f: math.sin(i + it) for i, f in enumerate(order)}
                for f in self.diverge.get(it, []):
                    checksums[f] += rank
                summary = DdpIteration(
                    iteration=it,
                    backward_start=start,
                    backward_end=start + self.compute_s,
                    ready_order=order,
                    ready_t=[ready[f] for f in order],
                    unready=self.unready,
                    checksums=checksums,
                )
                end = start + self.compute_s
                events.append(Event(summary.KIND, rank, it, end, asdict(summary)))
        return sorted(events, key=lambda e: e.t)

    def _watch(self, rank: int, cap: int, first: int) -> Event:
        reduced = [p for p in self.params if p.fqn not in self.delayed]
        delayed = [p for p in self.params if p.fqn in self.delayed]
        watch = DdpWatch(
            fqns=[p.fqn for p in reduced],
            shapes=[tuple(p.shape) for p in reduced],
            dtypes=[p.dtype for p in reduced],
            modules=[p.module for p in reduced],
            module_types=[p.module_type for p in reduced],
            bucket_cap_mb=self.bucket_cap_mb,
            bucket_cap_mb_list=self.bucket_cap_mb_list,
            bucket_bytes_cap=cap,
            first_bucket_bytes=first,
            find_unused_parameters=self.find_unused_parameters,
            static_graph=self.static_graph,
            world_size=self.world_size,
            user_hook=None,
            checksum="sampled",
            delayed=None
            if not delayed
            else DdpDelayed(
                fqns=[p.fqn for p in delayed],
                shapes=[tuple(p.shape) for p in delayed],
                dtypes=[p.dtype for p in delayed],
                modules=[p.module for p in delayed],
                module_types=[p.module_type for p in delayed],
                hook=self.delay_hook,
            ),
        )
        return Event(watch.KIND, rank, 0, self.t0, msgspec.to_builtins(watch))


# -- graph splits --------------------------------------------------------------------------
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
            return self.head(x)

    return SplitNet()


def split_net_params(layers: int = 4, width: int = 64, *, out: int = 1) -> list[FakeParam]:
    """``split_net``'s parameters, for a ``FakeRun`` of the same model (the bucket map)."""
    head = [
        FakeParam("head.weight", (out, width), "head"),
        FakeParam("head.bias", (out,), "head"),
    ]
    return [*mlp_params(layers, width), *head]


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
            for i in range(self.compiles):
                out.append(split_event(self.compile(i), rank, self.t0 + i))
        return sorted(out, key=lambda e: e.t)


# -- mixed precision -----------------------------------------------------------------------
_DTYPES = {
    "fp32": "torch.float32",
    "bf16": "torch.bfloat16",
    "fp16": "torch.float16",
    "fp64": "torch.float64",
}
# torch's ScalarType names, as its dtype errors print them.
_SCALAR_NAMES = {
    "torch.float16": "Half",
    "torch.bfloat16": "BFloat16",
    "torch.float32": "Float",
    "torch.float64": "Double",
}


def _dt(name: str | None) -> str | None:
    """``"bf16"`` or ``"torch.bfloat16"`` -> ``"torch.bfloat16"``; None stays None."""
    return None if name is None else _DTYPES.get(name, name)


def fsdp2_policy(
    param: str | None = None,
    reduce: str | None = None,
    output: str | None = None,
    *,
    cast_forward_inputs: bool = True,
) -> Policy:
    """An FSDP2 ``MixedPrecisionPolicy`` as the probe reports it (``"bf16"`` is short for
    ``"torch.bfloat16"``)."""
    return Policy(
        kind="MixedPrecisionPolicy",
        param_dtype=_dt(param),
        reduce_dtype=_dt(reduce),
        output_dtype=_dt(output),
        cast_forward_inputs=cast_forward_inputs,
    )


def fsdp1_policy(
    param: str | None = None,
    reduce: str | None = None,
    buffer: str | None = None,
    *,
    cast_forward_inputs: bool = False,
    cast_root_forward_inputs: bool = True,
    keep_low_precision_grads: bool = False,
) -> Policy:
    """An FSDP1 ``MixedPrecision`` as the probe reports it."""
    return Policy(
        kind="MixedPrecision",
        param_dtype=_dt(param),
        reduce_dtype=_dt(reduce),
        buffer_dtype=_dt(buffer),
        cast_forward_inputs=cast_forward_inputs,
        cast_root_forward_inputs=cast_root_forward_inputs,
        keep_low_precision_grads=keep_low_precision_grads,
    )


def ddp_policy(param: str | None, reduce: str | None = None, buffer: str | None = None) -> Policy:
    """DDP's ``_MixedPrecision`` as the probe reports it."""
    return Policy(
        kind="_MixedPrecision",
        param_dtype=_dt(param),
        reduce_dtype=_dt(reduce),
        buffer_dtype=_dt(buffer),
    )


@dataclass(frozen=True)
class FakeUnit:
    """One unit of a fake mixed-precision model. ``body``: what its forward runs, in
    order: the fqn of a child unit, or a leaf module (a Linear) the unit computes itself,
    in its compute dtype, failing on an input of another dtype as ``F.linear`` does."""

    fqn: str
    policy: Policy
    body: tuple[str, ...]
    params: tuple[str, ...]
    numel: int
    module_type: str = "Sequential"
    dtype: str = "torch.float32"  # the parameters' stored dtype


# The model of /tmp/mp's measurements: Sequential(Linear(8, 16), Inner(16), Inner(16),
# Linear(16, 4)), Inner = Linear(16, 16) + relu (module, leaf, elements, class).
_MP_NET = (
    ("0", "0", 8 * 16 + 16, "Linear"),
    ("1", "1.lin", 16 * 16 + 16, "Inner"),
    ("2", "2.lin", 16 * 16 + 16, "Inner"),
    ("3", "3", 16 * 4 + 4, "Linear"),
)


def mp_net(policies: dict[str, Policy]) -> list[FakeUnit]:
    """The units of ``Sequential(Linear(8,16), Inner, Inner, Linear(16,4))`` sharded with
    ``policies`` (fqn -> policy; ``""``, the root, is required; children among "0".."3"):
    the root owns the modules that are not units of their own."""
    if "" not in policies:
        raise ValueError("mp_net: policies needs the root ('')")
    unknown = set(policies) - {"", *(m for m, *_ in _MP_NET)}
    if unknown:
        raise ValueError(f"mp_net: no module {sorted(unknown)} (modules are 0, 1, 2, 3)")
    root_body: list[str] = []
    root_params: list[str] = []
    root_numel = 0
    children = []
    for module, leaf, numel, cls in _MP_NET:
        params = (f"{leaf}.weight", f"{leaf}.bias")
        if module in policies:
            root_body.append(module)
            children.append(FakeUnit(module, policies[module], (leaf,), params, numel, cls))
        else:
            root_body.append(leaf)
            root_params += params
            root_numel += numel
    root = FakeUnit("", policies[""], tuple(root_body), tuple(root_params), root_numel)
    return [root, *children]


class _Failed(Exception):
    def __init__(self, failure: PrecisionFailure) -> None:
        self.failure = failure


@dataclass
class FakePrecision:
    """Settings of a fake mixed-precision run; ``events()`` returns every rank's events as
    the precision probe emits them: the watch, then per iteration one batch of each unit's input
    (cast or passed through), parameter and output dtypes and its all-gather in forward,
    its parameter, gradient, reduce-scatter (DDP: all-reduce) and sharded-gradient dtypes
    in backward, and the sharded parameters at the optimizer step. The dtypes follow
    FSDP2's, FSDP1's or DDP's rules (``/tmp/mp`` measurements); a leaf that gets an input
    in another dtype than it computes in fails as torch does, and the rank stops there.

    ``alter``: (unit, phase) -> dtype reported instead of the rule's (a probe seeing
    something the plan did not predict)."""

    units: list[FakeUnit]
    wrapper: str = "fsdp2"
    world_size: int = 2
    iterations: int = 2
    input_dtype: str = "torch.float32"
    alter: dict[tuple[str, str], str] = field(default_factory=dict)
    t0: float = 1000.0
    # What FSDP2 reduces in without a reduce_dtype (PrecisionWatch.reduce_rule): torch
    # 2.14's by default, so a fake run is the same on every torch; compare it with the
    # planner under compat.fsdp.reduce_dtype_rule().
    reduce_rule: str = "compute"

    def parent(self, fqn: str) -> str | None:
        if fqn == self.units[0].fqn:
            return None
        prefixes = [u.fqn for u in self.units if u.fqn != fqn and fqn.startswith(u.fqn)]
        return max(prefixes, key=len) if prefixes else self.units[0].fqn

    def watch(self) -> PrecisionWatch:
        return PrecisionWatch(
            wrapper=self.wrapper,  # type: ignore[arg-type]
            world_size=self.world_size,
            reduce_rule=self.reduce_rule,  # type: ignore[arg-type]
            units=[
                Unit(
                    fqn=u.fqn,
                    parent=self.parent(u.fqn),
                    module_type=u.module_type,
                    policy=u.policy,
                    params=list(u.params),
                    param_dtypes=[u.dtype] * len(u.params),
                    numel=u.numel,
                )
                for u in self.units
            ],
        )

    def compute(self, u: FakeUnit) -> str:
        return u.policy.param_dtype or u.dtype

    def cast_to(self, u: FakeUnit) -> str | None:
        p = u.policy
        if p.kind == "none" or p.param_dtype is None:
            return None
        if self.wrapper == "fsdp2":
            return p.param_dtype if p.cast_forward_inputs is not False else None
        if self.wrapper == "fsdp1":
            root = self.parent(u.fqn) is None
            at_root = root and p.cast_root_forward_inputs is not False
            return p.param_dtype if at_root or (u.numel > 0 and p.cast_forward_inputs) else None
        return p.param_dtype

    def events(self) -> list[Event]:
        out: list[Event] = []
        for rank in range(self.world_size):
            out += self.rank_events(rank)
        return sorted(out, key=lambda e: e.t)

    def rank_events(self, rank: int) -> list[Event]:
        records: list[tuple[int, Any]] = [(0, self.watch())]
        for it in range(1, self.iterations + 1):
            try:
                self._forward(self.units[0], self.input_dtype, it, records)
            except _Failed as failed:
                records.append((it, failed.failure))
                break
            self._backward(it, records)
        out = [_event(records[0][1], rank, 0, self.t0)]
        for it in range(1, self.iterations + 1):  # as the probe: a batch per iteration
            mine = [r for i, r in records if i == it]
            batched = [r for r in mine if not isinstance(r, PrecisionFailure)]
            if batched:
                out.append(precision_batch(batched, rank=rank, step=it, t=self.t0 + it))
            failures = [r for r in mine if isinstance(r, PrecisionFailure)]
            out += [_event(r, rank, it, self.t0 + it + 1e-3) for r in failures]
        return out

    def _seen(self, it: int, u: FakeUnit, phase: Any, dtype: str, **kw: Any) -> Any:
        dtype = self.alter.get((u.fqn, phase), dtype)
        return (it, PrecisionSeen(iteration=it, unit=u.fqn, phase=phase, dtypes=[dtype], **kw))

    def _once(self, records: list[Any], it: int, u: FakeUnit, phase: Any, dtype: str) -> None:
        """As the probe: a phase other than input and output is emitted again in one
        iteration only when it shows a new dtype (then with every dtype seen so far)."""
        record = self._seen(it, u, phase, dtype)[1]
        for i, r in records:
            if i == it and isinstance(r, PrecisionSeen) and (r.unit, r.phase) == (u.fqn, phase):
                if record.dtypes[0] in r.dtypes:
                    return
                record = msgspec.structs.replace(record, dtypes=[*r.dtypes, *record.dtypes])
        records.append((it, record))

    def _collective(self, it: int, u: FakeUnit, op: Any, dtype: str, backward: bool) -> Any:
        shard = u.numel if self.wrapper == "ddp" else -(-u.numel // self.world_size)
        full = op != "all_gather" and self.wrapper != "ddp"
        nbytes = shard * (self.world_size if full else 1) * _itemsize(dtype)
        record = PrecisionCollective(
            iteration=it, unit=u.fqn, op=op, dtype=dtype, nbytes=nbytes, backward=backward
        )
        return (it, record)

    def _forward(self, u: FakeUnit, x: str, it: int, records: list[Any]) -> str:
        compute = self.compute(u)
        after = self.cast_to(u) or x
        gather = u.numel and self.wrapper != "ddp"
        if gather and self.wrapper == "fsdp1":  # FSDP1 all-gathers, then casts
            records.append(self._collective(it, u, "all_gather", compute, False))
        records.append(self._seen(it, u, "input", after, before=[x], cast=[after != x]))
        if gather and self.wrapper == "fsdp2":  # FSDP2 casts, then all-gathers
            records.append(self._collective(it, u, "all_gather", compute, False))
        if u.numel:
            self._once(records, it, u, "param", compute)
        children = {c.fqn: c for c in self.units if self.parent(c.fqn) == u.fqn}
        h = after
        for item in u.body:
            if item in children:
                h = self._forward(children[item], h, it, records)
            elif h != compute:
                message = (
                    "RuntimeError: mat1 and mat2 must have the same dtype, but got "
                    f"{_SCALAR_NAMES.get(h, h)} and {_SCALAR_NAMES.get(compute, compute)}"
                )
                raise _Failed(
                    PrecisionFailure(iteration=it, unit=u.fqn, consumer=item, message=message)
                )
            else:
                h = compute
        out = (u.policy.output_dtype if self.wrapper == "fsdp2" else None) or h
        records.append(self._seen(it, u, "output", out, before=[h]))
        return out

    def _backward(self, it: int, records: list[Any]) -> None:
        for u in reversed(self.units):
            if not u.numel:
                continue
            compute = self.compute(u)
            family: Any = self.wrapper
            rules = static_dtypes(
                family,
                u.policy,
                root=False,
                orig=u.dtype,
                trainable=True,
                reduce_rule=self.reduce_rule,
            )
            reduce = rules["reduce"]
            if self.wrapper != "ddp" and self.parent(u.fqn) is not None:
                records.append(self._collective(it, u, "all_gather", compute, True))
            self._once(records, it, u, "param", compute)
            self._once(records, it, u, "grad", rules["grad"])
            op = "all_reduce" if self.wrapper == "ddp" else "reduce_scatter"
            records.append(self._collective(it, u, op, reduce, True))
        for u in self.units:  # the optimizer step: what it steps and reads
            if u.numel:
                keep = self.wrapper == "fsdp1" and u.policy.keep_low_precision_grads
                reduce = u.policy.reduce_dtype or self.compute(u)
                self._once(records, it, u, "sharded_param", u.dtype)
                self._once(records, it, u, "sharded_grad", reduce if keep else u.dtype)


def precision_batch(
    records: list[PrecisionSeen | PrecisionCollective],
    *,
    rank: int = 0,
    step: int = 1,
    t: float = 1.0,
) -> Event:
    """The ``precision_batch`` event holding ``records`` (in order), as the probe sends it."""
    batch = PrecisionBatch(
        seen=[r for r in records if isinstance(r, PrecisionSeen)],
        collectives=[r for r in records if isinstance(r, PrecisionCollective)],
    )
    return _event(batch, rank, step, t)


def _event(record: Any, rank: int, step: int, t: float) -> Event:
    return Event(record.KIND, rank, step, t, msgspec.to_builtins(record))


def _itemsize(dtype: str) -> int:
    return {"torch.float64": 8, "torch.float32": 4, "torch.bfloat16": 2, "torch.float16": 2}[dtype]


# -- timelines -----------------------------------------------------------------------------
# Imported here, not at the top, so that this section stays one block to read.
from interactive_shard.timeline.events import Kind, Span, TimelineSpans, TimelineWatch  # noqa: E402


@dataclass
class FakeTimeline:
    """Settings of a fake timeline run; ``events()`` returns every rank's events as the
    timeline probe emits them: the watch, then one ``timeline_spans`` per iteration with
    the root's forward ``""`` and each unit's forward nested in it, the units' backwards
    in reverse order inside the root's, after each a ``post_backward:<unit>`` hook that
    issues the unit's reduce-scatter, and the optimizer step once the last one completed.

    A collective completes at once on every rank, when the last rank issued it (and the
    one before it completed: one process group runs them in order), ``collective_s``
    after; so a late rank makes the others wait. Interleaved (the default), a unit's
    reduce-scatter runs during the next unit's backward; ``bunched``: every hook and
    collective comes after the last backward (as with a compiled backward that fires
    DDP's hooks only at its end), so none overlaps. ``compiled``: compiled_forward /
    compiled_backward spans. ``hosts``: each rank's host (None: one host); ``skew``: what
    each rank's clock reads ahead of the true time (ranks on one host share a clock: keep
    them equal there); ``delay``: how much later each rank starts every iteration."""

    units: list[str] = field(default_factory=lambda: ["0", "1", "2"])
    world_size: int = 2
    iterations: int = 2
    compiled: bool = False
    bunched: bool = False
    hosts: list[str] | None = None
    skew: list[float] | None = None
    delay: list[float] | None = None
    t0: float = 1000.0
    forward_s: float = 0.002  # per unit
    backward_s: float = 0.004  # per unit
    hook_s: float = 0.0002
    collective_s: float = 0.003
    optimizer_s: float = 0.001
    nbytes: int = 4096  # per unit's reduce-scatter

    def host(self, rank: int) -> str:
        return self.hosts[rank] if self.hosts is not None else "node0"

    def watch(self, rank: int) -> TimelineWatch:
        return TimelineWatch(
            target="compiled" if self.compiled else "fsdp2",
            depth=None,
            modules=["", *self.units],
            world_size=self.world_size,
            host=self.host(rank),
            step_is_iteration=True,
        )

    def period(self) -> float:
        """Seconds between the starts of two iterations (true time)."""
        n = len(self.units)
        per_unit = self.forward_s + self.backward_s + self.hook_s + self.collective_s
        return 2 * n * per_unit + self.optimizer_s + max(self.delay or [0.0]) + 0.01

    def true_spans(self, iteration: int) -> dict[int, list[Span]]:
        """Rank -> the iteration's spans on the true clock, in the order they ended."""
        fwd: Kind = "compiled_forward" if self.compiled else "forward"
        bwd: Kind = "compiled_backward" if self.compiled else "backward"
        ranks = range(self.world_size)
        start = {r: self.t0 + (iteration - 1) * self.period() + self._delay(r) for r in ranks}
        spans: dict[int, list[Span]] = {r: [] for r in ranks}
        issued: dict[int, list[float]] = {r: [] for r in ranks}  # per unit, backward order
        for r in ranks:
            t = start[r] + 1e-5  # the root's pre-forward first
            for u in self.units:
                spans[r].append(Span(kind=fwd, name=u, start=t, end=t + self.forward_s))
                t += self.forward_s
            spans[r].append(Span(kind=fwd, name="", start=start[r], end=t + 1e-5))
            b0 = t + 1e-4
            t = b0 + 1e-5  # the root's own nodes (the loss) first
            hooks = []
            for u in reversed(self.units):
                spans[r].append(Span(kind=bwd, name=u, start=t, end=t + self.backward_s))
                t += self.backward_s
                if self.bunched:
                    hooks.append(u)
                else:
                    t = self._hook(spans[r], issued[r], u, t)
            spans[r].append(Span(kind=bwd, name="", start=b0, end=t))
            for u in hooks:
                t = self._hook(spans[r], issued[r], u, t)
        done = 0.0
        for k in range(len(self.units)):  # one group: in order, once every rank issued it
            done = max(done, *(issued[r][k] for r in ranks)) + self.collective_s
            for r in ranks:
                detail: dict[str, str | int | float | bool] = {
                    "op": "reduce_scatter",
                    "nbytes": self.nbytes,
                    "dtype": "torch.float32",
                    "group": "0",
                    "group_size": self.world_size,
                    "backward": True,
                }
                spans[r].append(
                    Span(
                        kind="collective",
                        name="reduce_scatter",
                        start=issued[r][k],
                        end=done,
                        detail=detail,
                    )
                )
        for r in ranks:
            step = max(done, max(s.end for s in spans[r])) + 1e-4
            spans[r].append(
                Span(kind="optimizer", name="SGD.step", start=step, end=step + self.optimizer_s)
            )
            spans[r].sort(key=lambda s: s.end)
        return spans

    def _hook(self, spans: list[Span], issued: list[float], unit: str, t: float) -> float:
        """The unit's post-backward hook from ``t``; it issues the reduce-scatter."""
        spans.append(Span(kind="hook", name=f"post_backward:{unit}", start=t, end=t + self.hook_s))
        issued.append(t + self.hook_s / 2)
        return t + self.hook_s

    def _delay(self, rank: int) -> float:
        return self.delay[rank] if self.delay is not None else 0.0

    def _skew(self, rank: int) -> float:
        return self.skew[rank] if self.skew is not None else 0.0

    def rank_spans(self, rank: int, iteration: int) -> list[Span]:
        """The iteration's spans as ``rank`` reports them (its own clock)."""
        dt = self._skew(rank)
        return [
            msgspec.structs.replace(s, start=s.start + dt, end=s.end + dt)
            for s in self.true_spans(iteration)[rank]
        ]

    def events(self) -> list[Event]:
        out: list[Event] = []
        for rank in range(self.world_size):
            out += self.rank_events(rank)
        return sorted(out, key=lambda e: e.t)

    def rank_events(self, rank: int) -> list[Event]:
        out = [_event(self.watch(rank), rank, 0, self.t0 + self._skew(rank) - 1.0)]
        for it in range(1, self.iterations + 1):
            spans = self.rank_spans(rank, it)
            batch = TimelineSpans(iteration=it, spans=spans)
            out.append(_event(batch, rank, it, spans[-1].end))
        return out


# -- DDP lifecycles ------------------------------------------------------------------------
# Imported here, not at the top, so that this section stays one block to read.
from interactive_shard.lifecycle import _checks  # noqa: E402
from interactive_shard.lifecycle.events import (  # noqa: E402
    Caller,
    Collective,
    Hooks,
    LifecycleCheck,
    LifecycleIteration,
    LifecycleWatch,
)


@dataclass
class FakeLifecycle:
    """Settings of a fake DDP run; ``events()`` returns every rank's lifecycle events as
    the lifecycle probe emits them: one ``lifecycle_watch`` per rank and instance (its
    construction broadcast of parameters, plus buffers unless ``broadcast_buffers`` is
    off), then per iteration ``forwards`` forwards (each after a buffer broadcast when
    buffers are synced), the gradients ready in reverse order (``shuffled``: rotated by
    one each iteration), one bucket all-reduce per ``bucket`` parameters, the delayed
    parameters' all-reduce, and the ``lifecycle_iteration`` sent when the next iteration
    begins (``split``: in two parts, the forward's and the backward's).

    ``unused`` get no gradient: without ``find_unused_parameters`` (or ``static_graph``)
    their bucket is never reduced, the reduction is unfinished and the ``unfinished``
    check fires. ``dropped_at``: that iteration has one more forward, dropped without a
    backward (``forward_without_backward``). ``twice``: the model is wrapped again after
    the iterations; the new instance (serial 2) carries both instances' hooks
    (``double_hooks``) and trains ``iterations`` more."""

    params: list[str] = field(default_factory=lambda: ["0.weight", "0.bias", "1.weight", "1.bias"])
    param_nbytes: int = 4096  # each
    buffers: list[str] = field(default_factory=lambda: ["0.running_mean"])
    buffer_nbytes: int = 256  # each
    world_size: int = 2
    iterations: int = 3
    forwards: int = 1
    bucket: int = 2  # parameters per gradient bucket
    static_graph: bool = False
    find_unused_parameters: bool = False
    broadcast_buffers: bool = True
    delayed: list[str] = field(default_factory=list)
    hook_param: str | None = None
    unused: list[str] = field(default_factory=list)
    shuffled: bool = False
    dropped_at: int | None = None
    steps_in_backward: int = 0
    twice: bool = False
    split: bool = False
    walk_s: float = 0.0004  # find_unused_parameters' graph walk per forward
    t0: float = 1000.0
    period: float = 0.01  # seconds per iteration
    collective_s: float = 0.0005

    @property
    def reducer_params(self) -> list[str]:
        return [p for p in self.params if p not in self.delayed]

    @property
    def param_bytes(self) -> int:
        return len(self.reducer_params) * self.param_nbytes

    @property
    def buffer_bytes(self) -> int:
        return len(self.buffers) * self.buffer_nbytes

    def _collective(self, caller: Caller, nbytes: int, t: float, serial: int) -> Collective:
        op = "all_reduce" if caller in ("reducer", "delayed_all_reduce") else "broadcast"
        return Collective(
            op=op,
            nbytes=nbytes,
            dtype="torch.float32",
            group="0",
            start=t,
            end=t + self.collective_s,
            caller=caller,
            ddp=serial,
        )

    def watch(self, serial: int = 1) -> LifecycleWatch:
        """The instance's watch: settings, construction sync and hooks per parameter."""
        t = self._start(serial, 1) - self.period / 2
        synced = self.param_bytes + (self.buffer_bytes if self.broadcast_buffers else 0)
        owners = list(range(1, serial + 1))  # wrapped again: the old hooks stay
        return LifecycleWatch(
            ddp=serial,
            world_size=self.world_size,
            recorded_from="process_group",
            static_graph=self.static_graph,
            find_unused_parameters=self.find_unused_parameters,
            forward_sync_buffers=self.broadcast_buffers and bool(self.buffers),
            init_sync_buffers=self.broadcast_buffers,
            gradient_as_bucket_view=False,
            delayed=list(self.delayed),
            hook_param=self.hook_param,
            comm_hook=None,
            mixed_precision=None,
            optimizer_in_backward=[],
            params=self.reducer_params,
            param_bytes=self.param_bytes,
            buffers=list(self.buffers),
            buffer_bytes=self.buffer_bytes,
            construction=[self._collective("ddp_init", synced, t, serial)],
            hooks=[
                Hooks(
                    fqn=p,
                    reducer=[] if p in self.delayed else owners,
                    delayed=owners if self.delayed and p == self.hook_param else [],
                )
                for p in self.params
            ],
        )

    def ready(self, iteration: int) -> list[str]:
        """The gradients' ready order in ``iteration``."""
        order = [p for p in reversed(self.params) if p not in self.unused]
        shift = (iteration - 1) % len(order) if self.shuffled and order else 0
        return order[shift:] + order[:shift]

    def finished(self) -> bool:
        return not self.unused or self.find_unused_parameters or self.static_graph

    def _start(self, serial: int, iteration: int) -> float:
        return self.t0 + ((serial - 1) * (self.iterations + 1) + iteration) * self.period

    def iteration(self, serial: int, index: int) -> list[LifecycleIteration]:
        """The iteration's ``lifecycle_iteration`` event(s) (two with ``split``)."""
        t = self._start(serial, index)
        forwards = self.forwards + (1 if index == self.dropped_at else 0)
        front: list[Collective] = []
        for _ in range(forwards):
            if self.broadcast_buffers and self.buffers:
                front.append(self._collective("sync_buffers", self.buffer_bytes, t, serial))
            t += self.period / (4 * forwards)
        back: list[Collective] = []
        reducer = [p for p in reversed(self.reducer_params)]
        for k in range(0, len(reducer), self.bucket):
            names = reducer[k : k + self.bucket]
            if self.finished() or not set(names) & set(self.unused):
                nbytes = len(names) * self.param_nbytes
                back.append(self._collective("reducer", nbytes, t, serial))
            t += self.collective_s
        if self.delayed:
            nbytes = len(self.delayed) * self.param_nbytes
            back.append(self._collective("delayed_all_reduce", nbytes, t, serial))
        walk = self.walk_s * forwards if self.find_unused_parameters else None
        whole = dict(
            iteration=index,
            ddp=serial,
            forwards=forwards,
            dropped=1 if index == self.dropped_at else 0,
            backward=True,
            finished=self.finished(),
            unready=[p for p in self.reducer_params if p in self.unused],
            ready=self.ready(index),
            collectives=front + back,
            walk_s=walk,
            steps_in_backward=self.steps_in_backward,
        )
        if not self.split:
            return [LifecycleIteration(**whole)]  # type: ignore[arg-type]
        ready = self.ready(index)
        half = len(ready) // 2
        first = LifecycleIteration(
            iteration=index,
            ddp=serial,
            forwards=forwards,
            dropped=whole["dropped"],  # type: ignore[arg-type]
            backward=False,
            ready=ready[:half],
            collectives=front,
            walk_s=walk,
        )
        second = LifecycleIteration(
            iteration=index,
            ddp=serial,
            forwards=0,
            dropped=0,
            backward=True,
            finished=self.finished(),
            unready=whole["unready"],  # type: ignore[arg-type]
            ready=ready[half:],
            collectives=back,
            steps_in_backward=self.steps_in_backward,
        )
        return [first, second]

    def checks(self, serial: int, index: int) -> list[LifecycleCheck]:
        """The checks that fire in ``index`` (0: at the watch)."""
        out: list[LifecycleCheck] = []
        if index == 0 and serial > 1:
            fqns, others = list(self.params), list(range(1, serial))
            message = _checks.double_hooks(fqns, serial, others)
            out.append(
                LifecycleCheck(
                    check="double_hooks",
                    iteration=0,
                    ddp=serial,
                    fqns=fqns,
                    others=others,
                    message=message,
                )
            )
        if index >= 1 and index == self.dropped_at:
            message = _checks.forward_without_backward(index)
            out.append(
                LifecycleCheck(
                    check="forward_without_backward",
                    iteration=index,
                    ddp=serial,
                    fqns=[],
                    message=message,
                )
            )
        if index >= 1 and not self.finished():
            unready = [p for p in self.reducer_params if p in self.unused]
            message = _checks.unfinished(index, unready)
            out.append(
                LifecycleCheck(
                    check="unfinished", iteration=index, ddp=serial, fqns=unready, message=message
                )
            )
        return out

    def serials(self) -> list[int]:
        return [1, 2] if self.twice else [1]

    def rank_events(self, rank: int) -> list[Event]:
        out: list[Event] = []
        for serial in self.serials():
            start = self._start(serial, 1)
            out.append(_event(self.watch(serial), rank, 0, start - self.period / 4))
            out += [_event(c, rank, 0, start - self.period / 4) for c in self.checks(serial, 0)]
            for index in range(1, self.iterations + 1):
                end = self._start(serial, index + 1) - self.period / 8
                out += [_event(c, rank, index, end) for c in self.checks(serial, index)]
                # Sent when the next iteration begins (the last at the run's flush).
                sent = self._start(serial, index + 1)
                out += [_event(part, rank, index, sent) for part in self.iteration(serial, index)]
        return out

    def events(self) -> list[Event]:
        out: list[Event] = []
        for rank in range(self.world_size):
            out += self.rank_events(rank)
        return sorted(out, key=lambda e: e.t)
