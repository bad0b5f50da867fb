"""The planner's dynamo trace: the graphs ``torch.compile`` hands a backend, in the kernel."""

from __future__ import annotations

from typing import Any

import torch
from torch import fx, nn

from interactive_shard.example_inputs import split
from interactive_shard.probing.compat import dynamo as compat_dynamo
from interactive_shard.splits._graph import graph_nodes
from interactive_shard.splits.events import GraphNode


def unwrap(model: Any) -> nn.Module:
    """The module dynamo compiles: inside a compiled model and a DDP model."""
    inner = getattr(model, "_orig_mod", model)  # torch.compile's OptimizedModule
    inner = getattr(inner, "module", inner) if _is_ddp(inner) else inner
    if not isinstance(inner, nn.Module):
        raise TypeError(
            f"plan_splits needs an nn.Module (or a DDP / compiled model around one), got a "
            f"{type(model).__qualname__}"
        )
    return inner


def _is_ddp(obj: object) -> bool:
    from torch.nn.parallel import DistributedDataParallel

    return isinstance(obj, DistributedDataParallel)


def dynamo_graphs(module: nn.Module, example_inputs: Any) -> list[list[GraphNode]]:
    """Run ``module`` once under dynamo with a backend that keeps each graph it gets."""
    args, kwargs = split(example_inputs)
    graphs: list[list[GraphNode]] = []

    def keep(gm: fx.GraphModule, _inputs: list[torch.Tensor]) -> Any:
        graphs.append(graph_nodes(gm, module))
        return gm.forward

    code = type(module).forward.__code__
    try:
        torch.compile(module, backend=keep, dynamic=False)(*args, **kwargs)
    finally:
        # Drop this trace's cache entries so that planning again, or compiling the model
        # for real in this process, starts fresh rather than meeting recompile limits.
        compat_dynamo.reset_code(code)
    if not graphs:
        raise RuntimeError(
            f"dynamo compiled no graph of {type(module).__qualname__}.forward; "
            "torch._dynamo.explain(model)(*example_inputs) says why"
        )
    return graphs
