"""Time ``find_unused_parameters``' graph walk after a DDP forward.

See Note [Lifecycle probe], "Graph walk". ``DistributedDataParallel._post_forward`` runs,
only with ``find_unused_parameters=True`` and no static graph::

    self.reducer.prepare_for_backward(list(_find_tensors(output)))   # the walk
    ...
    output_tensor_list, ... = _tree_flatten_with_rref(output)       # right after it

Both are globals of ``torch.nn.parallel.distributed``, looked up at call time, so
wrapping them brackets the walk (the Python tensor search plus the Reducer's C++ search
of the autograd graph) without touching the C++ Reducer, which cannot be wrapped.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

import torch.nn.parallel.distributed as ddp_module

_monotonic = time.monotonic


class Timed(Protocol):
    walk_start: float | None
    walk_end: float | None


ACTIVE: list[Timed] = []  # the watched DDP forwards running now, innermost last
_users = 0
_lock = threading.Lock()
_originals: dict[str, Callable[..., Any]] = {}


def _find_tensors(obj: Any) -> Any:
    if ACTIVE and ACTIVE[-1].walk_start is None:  # the outer call: it recurses through us
        ACTIVE[-1].walk_start = _monotonic()
    return _originals["_find_tensors"](obj)


def _tree_flatten_with_rref(output: Any) -> Any:
    if ACTIVE:
        top = ACTIVE[-1]
        if top.walk_start is not None and top.walk_end is None:
            top.walk_end = _monotonic()
    return _originals["_tree_flatten_with_rref"](output)


def install() -> Callable[[], None]:
    """Wrap the two globals while any probe needs them; returns the undo."""
    global _users
    with _lock:
        if _users == 0:
            for name, fn in (
                ("_find_tensors", _find_tensors),
                ("_tree_flatten_with_rref", _tree_flatten_with_rref),
            ):
                _originals[name] = getattr(ddp_module, name)
                setattr(ddp_module, name, fn)
        _users += 1

    def undo() -> None:
        global _users
        with _lock:
            _users -= 1
            if _users == 0:
                for name, fn in _originals.items():
                    setattr(ddp_module, name, fn)
                _originals.clear()

    return undo
