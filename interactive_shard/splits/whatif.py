"""What-if on the ranks: ``split_module`` as it was before PyTorch PR 113374.

``regions_undone()`` makes every split graph a compiled DDP model gets, while the block
runs, lose the ``_enter_autocast`` / ``_exit_autocast`` copies that
``torch.fx.passes.split_module.split_module`` puts into the partitions after the one
that entered the region, so the reader can see what that PR fixed (Note [Regions
undone]). It is for teaching and for tests; never train with it.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx.passes.split_module as split_module_pass
from torch import fx

__all__ = ["Undone", "regions_undone"]

log = logging.getLogger(__name__)

# Put on the enter and exit nodes of the graph being split; split_module copies a node's
# meta into every copy it makes, so the copies carry it too.
_TAG = "_ish_autocast_region"


@dataclass
class Undone:
    """What ``regions_undone`` removed: one line per partition that lost nodes."""

    removed: list[str] = field(default_factory=list)
    splits: int = 0  # split_module calls seen inside the block


@contextlib.contextmanager
def regions_undone() -> Iterator[Undone]:
    """Compile, inside this block, with autocast regions that stop at the first split.

    Note [Regions undone]
    ~~~~~~~~~~~~~~~~~~~~~

    Background: DDPOptimizer (``torch/_dynamo/backends/distributed.py``) cuts a
    compiled DDP model's graph at bucket boundaries with ``fx.passes.split_module.
    split_module`` and compiles every partition on its own. A forward under
    ``torch.autocast`` has one ``_enter_autocast`` node before the region and one
    ``_exit_autocast`` after it, so a cut inside the region leaves the partitions after
    the first without the enter. Compiled on their own, those partitions trace their
    ops outside autocast: they compute in float32 where the model asked for bfloat16,
    and a partition whose inputs are already bfloat16 fails with a dtype mismatch
    (PyTorch issue 111794: on torch 2.1, ``torch.compile`` + AMP + DDP failed to
    compile). PyTorch PR 113374 ("fx.split_module will setup/unwind autocast &
    grad_mode", November 2023) made ``split_module`` copy the ``_enter_autocast`` to
    the start of every later partition in the region and an ``_exit_autocast`` to the
    end of every earlier one (and ``_set_grad_enabled`` likewise), so each partition
    compiles in the state its nodes ran in.

    Algorithm: while the block runs, ``torch.fx.passes.split_module.split_module`` is
    replaced by a wrapper that

    1. tags the graph's ``_enter_autocast`` nodes, and each ``_exit_autocast`` with
       its enter (in ``node.meta``, which ``split_module`` copies into every copy);
    2. calls the real ``split_module``;
    3. walks the partitions in execution order: the first partition that holds a
       region's tag keeps its nodes (the original enter and the exit copy that closes
       it there, so the autocast state never leaks out of that partition); every later
       one loses the enter copy and the exit that closes it;
    4. removes the tags and recompiles the changed partitions.

    On leaving the block the real ``split_module`` is back. Yields an ``Undone``
    record that lists the nodes removed per partition.

    Caveats: only models compiled inside the block are affected (dynamo caches a
    compiled graph: call ``torch._dynamo.reset()`` or compile a fresh model). Grad-mode
    copies (``_set_grad_enabled``) are kept: dropping the one that restores grad mode
    would leave it off after the forward. A cut that hands a bfloat16 value to a
    partition without its region makes the compile fail as it did before the PR (keep
    float32 values at the cuts, e.g. a residual stream, to see the float32 outputs).
    Not thread-safe: one block at a time per process.
    """
    undone = Undone()
    original = split_module_pass.split_module

    def split_module(
        m: fx.GraphModule, root_m: Any, split_callback: Any, *a: Any, **kw: Any
    ) -> Any:
        tagged = _tag(m.graph)
        try:
            split = original(m, root_m, split_callback, *a, **kw)
        finally:
            for node in tagged:
                node.meta.pop(_TAG, None)
        undone.splits += 1
        undone.removed += _drop_copies(split)
        return split

    split_module_pass.split_module = split_module
    try:
        yield undone
    finally:
        split_module_pass.split_module = original


def _tag(graph: fx.Graph) -> list[fx.Node]:
    tagged = []
    for node in graph.nodes:
        if node.op != "call_function":
            continue
        if node.target is torch.amp._enter_autocast:
            node.meta[_TAG] = node.name
        elif node.target is torch.amp._exit_autocast and node.args:
            enter = node.args[0]
            node.meta[_TAG] = enter.name if isinstance(enter, fx.Node) else None
        else:
            continue
        tagged.append(node)
    return tagged


def _partitions(split: fx.GraphModule) -> list[tuple[str, fx.GraphModule]]:
    """The split graph's partitions in the order it calls them."""
    out = []
    for node in split.graph.nodes:
        if node.op == "call_module":
            sub = split.get_submodule(str(node.target))
            if isinstance(sub, fx.GraphModule):
                out.append((str(node.target), sub))
    return out


def _drop_copies(split: fx.GraphModule) -> list[str]:
    """Step 3-4: keep each region's nodes in its first partition only."""
    seen: set[str] = set()
    removed = []
    for name, sub in _partitions(split):
        mine = [n for n in sub.graph.nodes if n.meta.get(_TAG) is not None]
        here = {n.meta[_TAG] for n in mine}
        drop = [n for n in mine if n.meta[_TAG] in seen]
        for node in mine:
            del node.meta[_TAG]
        seen |= here
        if not drop:
            continue
        _erase(sub.graph, drop)
        sub.recompile()
        removed.append(f"{name}: {', '.join(_short(n.target) for n in drop)}")
        log.info("regions_undone: %s lost %d autocast node(s)", name, len(drop))
    return removed


def _erase(graph: fx.Graph, nodes: list[fx.Node]) -> None:
    """Erase exits before the enters they read (an enter's users are its exits)."""
    for node in sorted(nodes, key=lambda n: n.target is torch.amp._enter_autocast):
        for user in list(node.users):  # a dropped enter's exit is dropped too
            if user not in nodes:
                raise AssertionError(f"{node.name} is read by {user.name}, which is kept")
        graph.erase_node(node)


def _short(target: Callable[..., Any] | str) -> str:
    return getattr(target, "__name__", str(target))
