"""Reference planner: the partitions DDPOptimizer cuts a compiled DDP model into.

Note [DDPOptimizer splits]
~~~~~~~~~~~~~~~~~~~~~~~~~~

Background: a compiled backward runs as one autograd node, so every gradient of a
graph becomes ready at once and DDP's all-reduces could not overlap backward. When
dynamo compiles the module inside a DDP model, ``DDPOptimizer`` (torch/_dynamo/
backends/distributed.py) cuts the graph at bucket boundaries, compiles each piece on
its own, and the gradients of a piece become ready when that piece's backward ends.

Algorithm (torch 2.13, ``DDPOptimizer.compile_fn`` and ``torch.fx.passes.split_module``;
checked against real runs in ``tests/integration/test_splits.py``):

1. Walk the graph's nodes in *reverse* (placeholders and output skipped): the order
   gradients become ready. Each node counts the trainable parameters among its
   positional arguments (``call_function``; ``call_method`` only when its self is a node
   with a string target: ``w.t()`` counts ``w``, ``(h + 1).mul(w)`` does not), of its
   submodule (``call_module``, once per module) or itself (``get_attr``), by
   ``untyped_storage().nbytes()``, duplicates included. (A placeholder's parameter is
   dynamo's fake example value, which has lost DDP's ``_ddp_ignored`` marker on 2.13:
   DDP-ignored parameters are counted too.)
2. Before a node joins, if the open bucket holds ``>= cap`` bytes, or it is the first
   bucket (the *last* piece of forward) and holds ``>= first_bucket_cap`` (1 MiB by
   default, whatever DDP's own caps), a new bucket opens, but only if the open one
   has a value used outside it; otherwise the open bucket keeps growing
   (``extended``).
3. A leading bucket with no parameters (a preamble) joins the next one. One bucket:
   the graph is compiled whole, no split.
4. ``split_module`` turns bucket ``i`` into ``submod_i`` and orders them
   topologically (a stack of partitions without pending dependencies). Global-state
   calls taint every later node: an autocast region entered in partition ``a`` and
   left in ``b`` gets an ``_enter_autocast`` copy at the start of every partition
   after ``a`` and an ``_exit_autocast`` copy at the end of every one before ``b``
   (PyTorch PR 113374); a ``_set_grad_enabled`` is copied to the start of every later
   partition until the next one. So each partition compiles in the state its nodes
   ran in.

Caveats: dynamic shapes add symbol inputs (not modelled: inputs/outputs are not
planned); ``python_reducer`` modes of ``optimize_ddp`` do not split.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from interactive_shard.splits.events import Call, GraphNode, Partition, Region

MIB = 2**20
DEFAULT_FIRST_BUCKET_BYTES = MIB  # torch.distributed._DEFAULT_FIRST_BUCKET_BYTES


class SplitPlanError(ValueError):
    """A cap or a model the planner (and DDPOptimizer) cannot split with."""


@dataclass
class _Bucket:
    size: int = 0
    params: list[tuple[str, int]] = field(default_factory=list)  # (fqn, bytes) as counted
    nodes: list[GraphNode] = field(default_factory=list)  # in reverse graph order
    extended: int = 0


@dataclass(frozen=True)
class GraphPlan:
    """The plan of one dynamo graph: its partitions in execution order; ``nodes``, the
    graph it was planned from (planning it at other caps needs no trace)."""

    partitions: list[Partition]
    bucket_bytes_cap: int
    first_bucket_bytes: int
    nodes: Sequence[GraphNode] = field(default=(), compare=False, repr=False)


@dataclass(frozen=True)
class SplitPlan:
    """What DDPOptimizer will do with a model (``ish.plan_splits``).

    ``partitions``: every graph's partitions in execution order; ``graphs``: per dynamo
    graph (more than one when the forward has graph breaks); ``nothing``: why no graph
    will be compiled at all (then both are empty).
    """

    graphs: list[GraphPlan]
    bucket_bytes_cap: int
    first_bucket_bytes: int
    nothing: str | None = None

    @property
    def partitions(self) -> list[Partition]:
        return [p for g in self.graphs for p in g.partitions]

    def replan(
        self, *, bucket_cap_mb: float, first_bucket_cap_mb: float | None = None
    ) -> SplitPlan:
        """The same graphs planned at other caps, without tracing the model again."""
        cap, first = caps(bucket_cap_mb, first_bucket_cap_mb)
        graphs = [plan_graph(g.nodes, cap, first) for g in self.graphs]
        return SplitPlan(graphs, cap, first, nothing=self.nothing)

    def __repr__(self) -> str:
        if self.nothing:
            return f"SplitPlan(nothing compiled: {self.nothing})"
        sizes = [p.nbytes for p in self.partitions]
        return (
            f"SplitPlan({len(self.partitions)} partitions in {len(self.graphs)} graph(s), "
            f"cap {self.bucket_bytes_cap} B, first {self.first_bucket_bytes} B, bytes {sizes})"
        )


def caps(bucket_cap_mb: float, first_bucket_cap_mb: float | None) -> tuple[int, int]:
    """DDPOptimizer's caps in bytes, refused where DDPOptimizer would assert."""
    if not bucket_cap_mb > 0:
        raise SplitPlanError(f"bucket_cap_mb={bucket_cap_mb!r}: give a positive size in MiB")
    cap = int(bucket_cap_mb * MIB)  # as DDP computes bucket_bytes_cap
    first = (
        DEFAULT_FIRST_BUCKET_BYTES
        if first_bucket_cap_mb is None
        else int(first_bucket_cap_mb * MIB)
    )
    if first > cap:
        raise SplitPlanError(
            f"bucket_cap_mb={bucket_cap_mb} is below DDPOptimizer's first-bucket cap of "
            f"{first / MIB:g} MiB: torch.compile of such a DDP model fails with 'First bucket "
            "should be smaller/equal to other buckets'. Use bucket_cap_mb >= "
            f"{first / MIB:g} (or a smaller first_bucket_cap_mb)."
        )
    return cap, first


def skipped_reason(module_of_forward: str, class_name: str) -> str | None:
    """Why dynamo compiles nothing for a DDP model whose module's forward is this one."""
    if module_of_forward.startswith("torch.nn."):
        return (
            f"dynamo skips frames inside torch.nn: DDP.forward and {class_name}.forward "
            "(defined in torch.nn) both live there, so torch.compile(DDP(...)) compiled no "
            f"graph and the model ran eagerly, silently. Put the layers in your own "
            "nn.Module subclass (class Net(nn.Module) with its own forward) and wrap that."
        )
    return None


# -- step 1-3: buckets ------------------------------------------------------------------------
def _has_external_output(bucket: _Bucket) -> bool:
    seen: set[str] = set()
    for node in bucket.nodes:  # reverse graph order: users come first
        seen.add(node.name)
        if any(user not in seen for user in node.users):
            return True
    return False


def buckets(nodes: Sequence[GraphNode], cap: int, first: int) -> list[_Bucket]:
    """DDPOptimizer's buckets, in forward (execution) order."""
    out = [_Bucket()]
    counted_modules: set[str] = set()
    for node in reversed(nodes):
        head = out[0]
        if head.size >= cap or (len(out) == 1 and head.size >= first):
            if _has_external_output(head):
                out.insert(0, _Bucket())
            else:
                head.extended += 1
        head = out[0]
        uses = list(node.arg_params)
        if node.module is not None and node.module not in counted_modules:
            counted_modules.add(node.module)
            uses = [*node.module_params, *uses]
        for use in uses:
            head.size += use.nbytes
            head.params.append((use.fqn, use.nbytes))
        head.nodes.append(node)
    if len(out) > 1 and out[0].size == 0:  # a parameter-free preamble joins the next bucket
        out[1].nodes.extend(out[0].nodes)
        del out[0]
    return out


# -- step 4: split_module ---------------------------------------------------------------------
def regions_of(calls: Sequence[Call]) -> list[Region]:
    """The global-state regions a partition's calls enter or leave, in entry order."""
    found: list[dict[str, Any]] = []
    autocast: dict[str, int] = {}  # enter node name -> region
    grad: int | None = None
    for c in calls:
        s = c.state
        if s is None:
            continue
        if s.call == "enter_autocast":
            autocast[c.name] = len(found)
            found.append(
                dict(
                    kind="autocast",
                    enters=True,
                    exits=False,
                    device_type=s.device_type,
                    dtype=s.dtype,
                    enabled=s.enabled,
                )
            )
        elif s.call == "exit_autocast":
            opened = autocast.pop(s.enter or "", None)
            if opened is None:
                found.append(dict(kind="autocast", enters=False, exits=True))
            else:
                found[opened]["exits"] = True
        else:
            if grad is not None:
                found[grad]["exits"] = True
            grad = len(found)
            found.append(dict(kind="grad", enters=True, exits=False, enabled=s.enabled))
    return [Region(**r) for r in found]


def _call(node: GraphNode) -> Call:
    return Call(name=node.name, op=node.op, target=node.target, state=node.state)  # type: ignore[arg-type]


def _state_regions(
    order: Sequence[GraphNode], pid: dict[str, int]
) -> tuple[dict[str, list[int]], dict[str, GraphNode], dict[str, list[int]]]:
    """Per enter / set-grad node: the partitions it is active in (split_module's walk)."""
    autocast: dict[str, set[int]] = {}
    exits: dict[str, GraphNode] = {}
    grad: dict[str, set[int]] = {}
    active_grad: str | None = None
    active: set[str] = set()
    for node in order:
        here = pid[node.name]
        s = node.state
        if s is not None and s.call == "set_grad":
            active_grad = node.name
            grad[node.name] = {here}
        elif s is not None and s.call == "enter_autocast":
            active.add(node.name)
            autocast[node.name] = {here}
        elif s is not None and s.call == "exit_autocast" and s.enter in autocast:
            autocast[s.enter].add(here)
            active.discard(s.enter)
            exits[s.enter] = node
        if active_grad is not None:
            grad[active_grad].add(here)
        for name in active:
            autocast[name].add(here)
    return (
        {k: sorted(v) for k, v in autocast.items()},
        exits,
        {k: sorted(v) for k, v in grad.items()},
    )


def _topological(order: Sequence[GraphNode], pid: dict[str, int]) -> list[int]:
    """split_module's partition order: a stack of partitions with no pending inputs."""
    first_seen: list[int] = []
    deps: dict[int, dict[int, None]] = {}
    dependents: dict[int, dict[int, None]] = {}
    for node in order:
        used = pid[node.name]
        if used not in deps:
            first_seen.append(used)
            deps[used], dependents[used] = {}, {}
        if node.state is not None:  # global-state calls carry no cross-partition values
            continue
        for name in node.inputs:
            defined = pid.get(name)
            if defined is not None and defined != used:
                deps[used].setdefault(defined)
                dependents[defined].setdefault(used)
    roots = [p for p in first_seen if not deps[p]]
    out: list[int] = []
    while roots:
        p = roots.pop()
        out.append(p)
        for d in dependents[p]:
            deps[d].pop(p)
            if not deps[d]:
                roots.append(d)
    if len(out) != len(first_seen):
        raise SplitPlanError("the partitions depend on each other in a cycle")
    return out


def _params(bucket: _Bucket) -> dict[str, int]:
    """fqn -> bytes of the parameters a bucket counted, each once, in counting order."""
    return dict(bucket.params)


def plan_graph(nodes: Sequence[GraphNode], cap: int, first: int) -> GraphPlan:
    """Plan one dynamo graph (its nodes as ``_graph.graph_nodes`` records them)."""
    found = buckets(nodes, cap, first)
    if len(found) == 1:
        b = found[0]
        calls = [_call(n) for n in nodes if n.op != "get_attr"]
        whole = Partition(
            index=0,
            name="graph",
            calls=calls,
            fqns=list(_params(b)),
            param_bytes=list(_params(b).values()),
            nbytes=b.size,
            regions=regions_of(calls),
            extended=b.extended,
        )
        return GraphPlan([whole], cap, first, nodes)
    pid = {n.name: i for i, b in enumerate(found) for n in b.nodes if n.op != "get_attr"}
    order = [n for n in nodes if n.name in pid]
    autocast, exits, grad = _state_regions(order, pid)
    by_name = {n.name: n for n in order}
    partitions = []
    for index, p in enumerate(_topological(order, pid)):
        calls = [_call(by_name[k]) for k, r in (*autocast.items(), *grad.items()) if p in r[1:]]
        calls += [_call(n) for n in order if pid[n.name] == p]
        calls += [_call(exits[k]) for k in reversed(autocast) if p in autocast[k][:-1]]
        b = found[p]
        partitions.append(
            Partition(
                index=index,
                name=f"submod_{p}",
                calls=calls,
                fqns=list(_params(b)),
                param_bytes=list(_params(b).values()),
                nbytes=b.size,
                regions=regions_of(calls),
                extended=b.extended,
            )
        )
    return GraphPlan(partitions, cap, first, nodes)


def plan_splits(
    model: Any,
    example_inputs: Any,
    *,
    bucket_cap_mb: float = 25,
    first_bucket_cap_mb: float | None = None,
) -> SplitPlan:
    """Predict the partitions DDPOptimizer cuts ``torch.compile(DDP(model))`` into.

    Traces ``model`` (a module, or a DDP / compiled model around one) once with dynamo
    in this process, no process group, and plans each graph as Note [DDPOptimizer
    splits] says. ``example_inputs``: a tensor, a tuple of positional inputs or a dict
    of keyword inputs, as every planner takes them (``example_inputs.py``; meta tensors
    work for a model on the meta device). ``bucket_cap_mb`` is the DDP
    model's cap; ``first_bucket_cap_mb`` defaults to DDPOptimizer's 1 MiB.
    """
    from interactive_shard.splits import _trace

    cap, first = caps(bucket_cap_mb, first_bucket_cap_mb)
    module = _trace.unwrap(model)
    forward = type(module).forward
    nothing = skipped_reason(forward.__module__, type(module).__name__)
    if nothing:
        return SplitPlan([], cap, first, nothing=nothing)
    graphs = _trace.dynamo_graphs(module, example_inputs)
    return SplitPlan([plan_graph(g, cap, first) for g in graphs], cap, first)
