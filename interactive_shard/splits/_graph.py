"""FX graphs as plain records: what the planner and the probe read off a dynamo graph.

Both sides turn a ``torch.fx.GraphModule`` into the records of ``events.py`` with these
functions, so the kernel's planner and the ranks' capture describe a graph the same way.
The parameter accounting mirrors ``DDPOptimizer.compile_fn`` in
``torch/_dynamo/backends/distributed.py`` (torch 2.13): which parameters it counts at
which node, under which name, with which size.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import fx, nn

from interactive_shard.splits.events import (
    ENTER_AUTOCAST,
    EXIT_AUTOCAST,
    SET_GRAD,
    Call,
    GraphNode,
    ParamUse,
    State,
)

_CALLS = ("call_function", "call_method", "call_module")


def target_name(node: fx.Node) -> str:
    """A node's target as text: a function's qualified name, a method or module name."""
    if node.op == "call_function":
        try:
            return fx.node._get_qualified_name(node.target)  # type: ignore[arg-type]
        except Exception:  # some builtins have no importable name
            return getattr(node.target, "__name__", repr(node.target))
    return str(node.target)


def state_of(node: fx.Node, target: str) -> State | None:
    """What a global-state call does (``split_module``'s GLOBAL_STATE_NODES), else None."""
    if target == ENTER_AUTOCAST:
        device, dtype, enabled = [*node.args, None, None, None][:3]
        return State(
            call="enter_autocast",
            device_type=str(device),
            dtype=None if dtype is None else str(dtype),  # autocast(enabled=False) gives None
            enabled=bool(enabled) if enabled is not None else None,
        )
    if target == EXIT_AUTOCAST:
        enter = node.args[0] if node.args else None
        return State(call="exit_autocast", enter=enter.name if isinstance(enter, fx.Node) else None)
    if target == SET_GRAD:
        flag = node.args[0] if node.args else None
        return State(call="set_grad", enabled=bool(flag))
    return None


def calls_of(gm: fx.GraphModule) -> list[Call]:
    """The call nodes of a graph in order, global-state calls marked."""
    out = []
    for node in gm.graph.nodes:
        if node.op in _CALLS:
            target = target_name(node)
            out.append(
                Call(name=node.name, op=node.op, target=target, state=state_of(node, target))
            )
    return out


def placeholders_and_outputs(gm: fx.GraphModule) -> tuple[list[str], list[str]]:
    inputs = [n.name for n in gm.graph.nodes if n.op == "placeholder"]
    outputs: list[str] = []
    for n in gm.graph.nodes:
        if n.op == "output":
            fx.node.map_arg(n.args, lambda a: outputs.append(a.name))
    return inputs, outputs


# -- which parameter a placeholder is -------------------------------------------------------
def _resolve(source: Any, local: str, root: nn.Module) -> Any:
    """Evaluate a dynamo ``Source`` chain against the frame whose ``local`` is ``root``."""
    from interactive_shard.probing.compat.dynamo import sources

    if isinstance(source, sources.LocalSource):
        if source.local_name != local:
            raise LookupError(source.local_name)
        return root
    base = getattr(source, "base", None)
    if base is None:
        raise LookupError(type(source).__name__)
    obj = _resolve(base, local, root)
    if isinstance(source, sources.AttrSource):
        for part in source.member.split("."):
            obj = getattr(obj, part)
        return obj
    if isinstance(source, (sources.DictGetItemSource, sources.GetItemSource)):
        if not isinstance(source.index, (str, int)):
            raise LookupError(repr(source.index))
        return obj[source.index]
    return obj  # a wrapper that names the same object (Unspecialized*Source, ...)


def _first_names(root: nn.Module) -> dict[int, str]:
    """id(parameter) -> its fqn; a shared parameter under its first name, as
    ``named_parameters()`` and DDP (so the bucket map) name it."""
    return {id(p): name for name, p in root.named_parameters()}


def _self_name(root: nn.Module) -> str:
    code = type(root).forward.__code__
    return code.co_varnames[0] if code.co_argcount else "self"


def param_fqns(gm: fx.GraphModule, root: nn.Module) -> dict[str, str]:
    """Placeholder target -> the root module's parameter fqn, by identity.

    Dynamo's placeholder names are mangled (``l_self_modules_net_modules_0_parameters_
    weight_``); each placeholder's ``_dynamo_source`` says where the value came from,
    evaluated here against the root module and checked by identity.
    """
    by_id = _first_names(root)
    local = _self_name(root)
    out: dict[str, str] = {}
    for node in gm.graph.find_nodes(op="placeholder"):
        source = getattr(node, "_dynamo_source", None)
        if source is None:
            continue
        try:
            obj = _resolve(source, local, root)
        except (LookupError, AttributeError, KeyError, IndexError, TypeError):
            continue
        if id(obj) in by_id:
            out[str(node.target)] = by_id[id(obj)]
    return out


# -- the graph as DDPOptimizer counts it ----------------------------------------------------
def _counted(param: object) -> bool:
    """DDPOptimizer counts trainable parameters that DDP does not ignore. (Read off a
    placeholder, ``param`` is dynamo's fake example value, which on 2.13 no longer has
    DDP's ``_ddp_ignored``: such parameters are counted, by DDPOptimizer as here.)"""
    return (
        isinstance(param, nn.Parameter)
        and param.requires_grad
        and not getattr(param, "_ddp_ignored", False)
    )


def _nbytes(param: torch.Tensor) -> int:
    return int(param.untyped_storage().nbytes())  # what DDPOptimizer.add_param adds


def _arg_params(node: fx.Node, fqns: dict[str, str]) -> list[ParamUse]:
    uses = []
    for arg in node.args:  # positional only, not nested: as add_param_args
        if isinstance(arg, fx.Node) and arg.op == "placeholder":
            param = arg.meta.get("example_value")
            if isinstance(param, torch.Tensor) and _counted(param):
                name = str(arg.target)
                uses.append(ParamUse(name, fqns.get(name, name), _nbytes(param)))
    return uses


def _module_params(module: nn.Module, prefix: str, by_id: dict[int, str]) -> list[ParamUse]:
    return [
        ParamUse(f"{prefix}_{name}", by_id.get(id(p), f"{prefix}.{name}"), _nbytes(p))
        for name, p in module.named_parameters()
        if _counted(p)
    ]


def graph_nodes(gm: fx.GraphModule, root: nn.Module) -> list[GraphNode]:
    """The graph's nodes (placeholders and output left out) with what DDPOptimizer counts."""
    fqns = param_fqns(gm, root)
    by_id = _first_names(root)
    module_key: dict[int, str] = {}  # a module object counts once, under its first path
    out = []
    for node in gm.graph.nodes:
        if node.op in ("placeholder", "output"):
            continue
        target = target_name(node)
        module = None
        module_params: list[ParamUse] = []
        arg_params: list[ParamUse] = []
        if node.op == "call_function":
            arg_params = _arg_params(node, fqns)
        elif node.op in ("call_module", "call_method"):
            path = node.target if node.op == "call_module" else _first_arg_target(node)
            sub = _submodule(gm, path)
            if sub is not None:
                module = module_key.setdefault(id(sub), str(path))
                module_params = _module_params(sub, str(node.target), by_id)
            if node.op == "call_method" and path is not None:
                # DDPOptimizer counts a method's parameter arguments only when its self is
                # a node with a string target (a placeholder, a method's result): not on
                # ``(h + 1).mul(self.scale)``, whose self is a function's result.
                arg_params = _arg_params(node, fqns)
        elif node.op == "get_attr":
            value = getattr(gm, str(node.target), None)
            if _counted(value):
                name = str(node.target)
                arg_params = [ParamUse(name, fqns.get(name, name), _nbytes(value))]  # type: ignore[arg-type]
        inputs = _inputs(node)
        out.append(
            GraphNode(
                name=node.name,
                op=node.op,
                target=target,
                inputs=inputs,
                users=[u.name for u in node.users],
                module=module,
                module_params=module_params,
                arg_params=arg_params,
                state=state_of(node, target),
            )
        )
    return out


def _inputs(node: fx.Node) -> list[str]:
    found: list[str] = []
    fx.node.map_arg((node.args, node.kwargs), lambda a: found.append(a.name))
    return found


def _first_arg_target(node: fx.Node) -> str | None:
    first = node.args[0] if node.args else None
    if isinstance(first, fx.Node) and isinstance(first.target, str):
        return first.target
    return None


def _submodule(gm: fx.GraphModule, path: object) -> nn.Module | None:
    if not isinstance(path, str):
        return None
    try:
        return gm.get_submodule(path)
    except AttributeError:
        return None
