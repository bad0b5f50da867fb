"""Which autograd nodes one module call created, and hooks that time them in backward.

See Note [Timeline probe] in ``probe.py``, "Backward spans". Autograd numbers every node
it creates (``Node._sequence_nr()``, increasing per thread); the nodes one call of a
module created are those reachable from its outputs with a number above every node its
inputs already had. Walking them never reads tensor data.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import torch

ACCUMULATE = 2**64 - 1  # AccumulateGrad's sequence number: a leaf, never inside a call
COMPILED = "CompiledFunctionBackward"  # AOTAutograd's node: one per compiled graph
MAX_NODES = 20_000  # a walk that finds more gives up (a whole model inside one unit)


def tensors(tree: Any, depth: int = 0) -> Iterable[torch.Tensor]:
    """Tensors in args / kwargs / outputs: tensors, lists, tuples, dicts (not deeper
    than 8 levels; other objects are not walked)."""
    if isinstance(tree, torch.Tensor):
        yield tree
    elif depth < 8 and isinstance(tree, (list, tuple)):
        for x in tree:
            yield from tensors(x, depth + 1)
    elif depth < 8 and isinstance(tree, dict):
        for x in tree.values():
            yield from tensors(x, depth + 1)


def boundary(*trees: Any) -> int:
    """The highest sequence number among the inputs' grad_fns (-1: none has one)."""
    found = -1
    for tree in trees:
        for t in tensors(tree):
            fn = t.grad_fn
            if fn is not None:
                found = max(found, fn._sequence_nr())
    return found


@dataclass(slots=True)
class Walk:
    """The nodes one call created: ``tops`` (its outputs' grad_fns: backward starts
    there), ``sinks`` (no edge to another node of the call: backward ends at the last
    of them) and ``compiled`` (CompiledFunctionBackward nodes, in creation order)."""

    tops: list[Any] = field(default_factory=list)
    sinks: list[Any] = field(default_factory=list)
    compiled: list[Any] = field(default_factory=list)


def walk(outputs: Any, above: int) -> Walk | None:
    """The nodes reachable from ``outputs`` numbered above ``above``; None when there
    are none (no grad) or more than ``MAX_NODES``."""
    found = Walk()
    # Keyed by id, holding the node: a node's Python object lives only while referenced
    # (next_functions makes a new one after), and a freed one's id is reused at once.
    seen: dict[int, Any] = {}
    for t in tensors(outputs):
        fn = t.grad_fn
        if fn is not None and id(fn) not in seen and _inside(fn, above):
            seen[id(fn)] = fn
            found.tops.append(fn)
    stack = list(found.tops)
    while stack:
        node = stack.pop()
        if type(node).__name__ == COMPILED:
            found.compiled.append(node)
        inner = False
        for nxt, _ in node.next_functions:
            if nxt is None or not _inside(nxt, above):
                continue
            inner = True
            if id(nxt) not in seen:
                if len(seen) >= MAX_NODES:
                    return None
                seen[id(nxt)] = nxt
                stack.append(nxt)
        if not inner:
            found.sinks.append(node)
    if not found.tops:
        return None
    found.compiled.sort(key=lambda n: n._sequence_nr())
    return found


def _inside(node: Any, above: int) -> bool:
    seq = node._sequence_nr()
    return above < seq != ACCUMULATE


def time_span(
    nodes_start: list[Any],
    nodes_end: list[Any],
    clock: Callable[[], Any],
    done: Callable[[Any, Any], None],
) -> None:
    """Call ``done(start, end)`` once the last of ``nodes_end`` ran in backward, where
    start is when the first of ``nodes_start`` began. The hooks live as long as the
    graph (autograd frees them with it); they read the clock, nothing else."""
    started: list[Any] = []
    left = [len(nodes_end)]

    def began(grad_outputs: Any) -> None:
        if not started:
            started.append(clock())

    def ended(grad_inputs: Any, grad_outputs: Any) -> None:
        left[0] -= 1
        if left[0] == 0:
            end = clock()
            done(started[0] if started else end, end)

    for node in nodes_start:
        node.register_prehook(began)
    for node in nodes_end:
        node.register_hook(ended)
