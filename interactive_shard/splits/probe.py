"""Probe on a compiled DDP model: the partitions DDPOptimizer really cut, as it compiles.

Note [Split capture]
~~~~~~~~~~~~~~~~~~~~

Background: dynamo builds a fresh ``DDPOptimizer`` for every frame it converts inside a
DDP forward (``convert_frame.py``: ``DistributedDataParallel._get_active_ddp_module()``
is the DDP model being run) and hands it the graph; DDPOptimizer buckets the graph,
splits it (``split_module``) and calls the user's backend once per partition.

Algorithm: ``attach`` wraps ``DDPOptimizer.compile_fn`` (once per process, undone when
the last probe detaches). For the watched DDP model, the wrapper

1. records the graph as the planner reads it (``_graph.graph_nodes``), so the kernel
   can plan it again for any cap;
2. swaps the DDPOptimizer's backend for a timing wrapper that records every graph the
   backend receives: each partition's calls (with the ``_enter_autocast`` /
   ``_exit_autocast`` / ``_set_grad_enabled`` copies ``split_module`` put in), inputs,
   outputs, code, compile reason and compile time;
3. after DDPOptimizer returns, reads its bucket table (``ddp_optimizer.buckets``: sizes,
   parameter names, which DDPOptimizer keeps for debugging) and the split graph's
   call order, and emits one ``split_compile``.

A forward hook on the compiled model notices a first forward that compiled nothing
and emits ``split_nothing`` with the reason (``torch.compile(DDP(nn.Sequential()))``
compiles nothing, silently: Note [DDPOptimizer splits], ``plan.skipped_reason``).

Caveats: the backend wrapper adds a Python call and a ``code`` render per partition
(``benchmarks/bench_splits_compile.py`` measures it). Models compiled before
``ish.watch`` are not captured (their graphs come from dynamo's cache).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any

import msgspec
from torch import fx
from torch.nn.parallel import DistributedDataParallel

from interactive_shard.probing.compat import dynamo as compat_dynamo
from interactive_shard.probing.compat.dynamo import DDPOptimizer, OptimizedModule
from interactive_shard.splits._graph import calls_of, graph_nodes, placeholders_and_outputs
from interactive_shard.splits.events import Call, GraphNode, Partition, SplitCompile, SplitNothing
from interactive_shard.splits.plan import regions_of, skipped_reason
from interactive_shard.telemetry import rank as telemetry
from interactive_shard.telemetry import schema

__all__ = ["OPTIONS", "WATCHES", "SplitProbe", "attach", "fits"]

WATCHES = "torch.compile'd DDP models (torch.compile(DistributedDataParallel(model)))"
OPTIONS: frozenset[str] = frozenset()
MAX_CODE_CHARS = 64 * 1024  # per partition: a huge graph's code is cut, not sent whole
MAX_EVENT_BYTES = schema.MAX_MESSAGE_BYTES * 3 // 4  # room for the batch around it

_lock = threading.Lock()
_probes: dict[int, SplitProbe] = {}  # id(DDP model) -> its probe
_original_compile_fn = DDPOptimizer.compile_fn


def fits(obj: object) -> bool:
    return isinstance(obj, OptimizedModule) and isinstance(obj._orig_mod, DistributedDataParallel)


def attach(compiled: OptimizedModule) -> SplitProbe:
    """Record every DDPOptimizer compile of ``compiled`` on this rank; Note [Split capture].

    ``ish.watch(torch.compile(ddp))`` calls this on every rank before the first forward.
    Events: ``split_compile`` per compile, ``split_nothing`` if the first forward
    compiled nothing.
    """
    return SplitProbe(compiled)


def _compile_fn(self: DDPOptimizer, gm: fx.GraphModule, example_inputs: Any, **configs: Any) -> Any:
    active = DistributedDataParallel._get_active_ddp_module()
    probe = _probes.get(id(active)) if active is not None else None
    if probe is None:
        return _original_compile_fn(self, gm, example_inputs, **configs)
    return probe._compile(self, gm, example_inputs, configs)


@dataclass
class _Received:
    """What the backend received for one partition (read before it compiles: inductor
    rewrites the graph), and how long it took."""

    calls: list[Call]
    inputs: list[str]
    outputs: list[str]
    code: str
    reason: str | None
    seconds: float = 0.0


class SplitProbe:
    """The split probe of one compiled DDP model (``ish.watch(torch.compile(ddp))``)."""

    def __init__(self, compiled: OptimizedModule) -> None:
        ddp = compiled._orig_mod
        assert isinstance(ddp, DistributedDataParallel)
        if id(ddp) in _probes:
            raise RuntimeError(
                "this compiled DDP model is already watched: detach() the first watch"
            )
        self.compiled, self.ddp, self.module = compiled, ddp, ddp.module
        self.compiles = 0
        self.calls = 0
        self._reported_nothing = False
        self._handle = compiled.register_forward_hook(self._after_forward)
        with _lock:
            _probes[id(ddp)] = self
            DDPOptimizer.compile_fn = _compile_fn  # type: ignore[method-assign]

    def detach(self) -> None:
        self._handle.remove()
        with _lock:
            if _probes.get(id(self.ddp)) is self:
                del _probes[id(self.ddp)]
            if not _probes:
                DDPOptimizer.compile_fn = _original_compile_fn  # type: ignore[method-assign]

    def __repr__(self) -> str:
        return f"SplitProbe({type(self.module).__qualname__}, compiles={self.compiles})"

    # -- capture --------------------------------------------------------------------------
    def _compile(
        self, ddpo: DDPOptimizer, gm: fx.GraphModule, example_inputs: Any, configs: dict[str, Any]
    ) -> Any:
        graph = graph_nodes(gm, self.module)
        backend = ddpo.backend_compile_fn
        received: list[_Received] = []

        def timed(sub: fx.GraphModule, args: Any, **kw: Any) -> Any:
            reason = getattr(sub, "compile_subgraph_reason", None)
            said = (
                reason.reason
                if reason is not None and getattr(reason, "graph_break", True)
                else None
            )
            got = _Received(calls_of(sub), *placeholders_and_outputs(sub), _code(sub), said)
            received.append(got)
            start = time.perf_counter()
            out = backend(sub, args, **kw)
            got.seconds = time.perf_counter() - start
            return out

        ddpo.backend_compile_fn = timed
        start = time.perf_counter()
        try:
            result = _original_compile_fn(ddpo, gm, example_inputs, **configs)
        except Exception as err:
            self._nothing(f"DDPOptimizer failed to compile: {type(err).__name__}: {err}")
            raise
        finally:
            ddpo.backend_compile_fn = backend
        event = self._event(ddpo, gm, result, graph, received, backend, time.perf_counter() - start)
        telemetry.emit(event.KIND, _fitting(event))
        self.compiles += 1
        return result

    def _event(
        self,
        ddpo: DDPOptimizer,
        gm: fx.GraphModule,
        result: Any,
        graph: list[GraphNode],
        received: list[_Received],
        backend: Any,
        seconds: float,
    ) -> SplitCompile:
        uses = {u.name: u for n in graph for u in (*n.module_params, *n.arg_params)}
        table = ddpo.buckets
        if len(table) == 1:  # compiled whole: the backend got the dynamo graph itself
            order, parent = [("graph", 0)], ""
        else:
            calls = [n for n in result.graph.nodes if n.op == "call_module"]
            order = [(n.name, int(n.name.rpartition("_")[2])) for n in calls]
            parent = _code(result)
        partitions = []
        for index, ((name, bucket), got) in enumerate(zip(order, received, strict=False)):
            b = table[bucket]
            counted = {
                (uses[p].fqn if p in uses else p): (uses[p].nbytes if p in uses else 0)
                for p in b.params
            }
            partitions.append(
                Partition(
                    index=index,
                    name=name,
                    calls=got.calls,
                    fqns=list(counted),
                    param_bytes=list(counted.values()),
                    nbytes=b.size,
                    regions=regions_of(got.calls),
                    inputs=got.inputs,
                    outputs=got.outputs,
                    extended=b.opcount_increased_to_capture_external_output,
                    code=got.code,
                    compile_s=got.seconds,
                )
            )
        reasons = [r.reason for r in received if r.reason]
        return SplitCompile(
            index=self.compiles,
            backend=_backend_name(backend),
            bucket_bytes_cap=int(ddpo.bucket_bytes_cap),
            first_bucket_bytes=int(ddpo.first_bucket_cap),
            graph=graph,
            partitions=partitions,
            parent=parent,
            break_reasons=reasons,
            compile_s=seconds,
        )

    # -- nothing compiled -----------------------------------------------------------------
    def _after_forward(self, _module: object, _args: object, _out: object) -> None:
        self.calls += 1
        if self.compiles or self._reported_nothing or self.calls > 1:
            return
        self._nothing(self._why_nothing())

    def _why_nothing(self) -> str:
        mode = compat_dynamo.optimize_ddp_mode()
        cls = type(self.module)
        if mode != "ddp_optimizer":
            return (
                f"torch._dynamo.config.optimize_ddp is {mode!r}: DDPOptimizer is off and the "
                "graph is not split at bucket boundaries (set it to True to split)"
            )
        skipped = skipped_reason(cls.forward.__module__, cls.__name__)
        if skipped:
            return skipped
        if compat_dynamo.cached(cls.forward.__code__):
            return (
                f"{cls.__name__}.forward was compiled before ish.watch: its graphs came from "
                "dynamo's cache. Call ish.watch before the first forward (or "
                "torch._dynamo.reset() first)."
            )
        return (
            f"dynamo compiled no graph of {cls.__name__}.forward (the frame was skipped or "
            "fell back to eager); torch._dynamo.explain(model)(*inputs) says why"
        )

    def _nothing(self, reason: str) -> None:
        self._reported_nothing = True
        event = SplitNothing(reason=reason, calls=max(self.calls, 1))
        telemetry.emit(event.KIND, msgspec.to_builtins(event))


def _fitting(event: SplitCompile) -> dict[str, Any]:
    """The event's payload, made to fit one telemetry message: a huge graph's code goes
    first, then the graph the kernel would re-plan from (its what-if then says so)."""
    payload: dict[str, Any] = msgspec.to_builtins(event)
    if len(msgspec.msgpack.encode(payload)) <= MAX_EVENT_BYTES:
        return payload
    cut = "# left out: the compile's record would not fit in one telemetry message"
    parts = [msgspec.structs.replace(p, code=cut) for p in event.partitions]
    event = msgspec.structs.replace(event, partitions=parts, parent=cut)
    payload = msgspec.to_builtins(event)
    if len(msgspec.msgpack.encode(payload)) > MAX_EVENT_BYTES:
        payload = msgspec.to_builtins(msgspec.structs.replace(event, graph=[]))
    return payload


def _code(gm: fx.GraphModule) -> str:
    code = gm.code.strip("\n")
    if len(code) > MAX_CODE_CHARS:
        return code[:MAX_CODE_CHARS] + f"\n# ... cut at {MAX_CODE_CHARS} characters"
    return code


def _backend_name(backend: Any) -> str:
    name = getattr(backend, "compiler_name", None) or getattr(backend, "__name__", None)
    return str(name or type(backend).__name__)
