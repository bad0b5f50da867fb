"""Every collective a rank issues, timed from its call to its completion.

See Note [Timeline probe] in ``probe.py``, "Collectives". Two ways in, because the engine
issues collectives two ways:

* from Python through ``torch.distributed`` functions (FSDP2's ``dist.all_gather_single``
  / ``dist.reduce_scatter_single``, FSDP1's ``dist.all_gather_into_tensor``, DDP's
  ``dist._broadcast_coalesced`` of buffers, a user's ``dist.all_reduce``): while a
  timeline probe is attached those module attributes are wrappers (callers look them up
  at call time as ``dist.<name>``);
* from C++: DDP's Reducer all-reduces its buckets on its process group directly; the
  bucket probe's process-group spy (``probing.spy``) reports each launch.

The end of an asynchronous collective is noted by a callback on its future, which runs
on the backend's thread once it has the GIL (see ``probing.spy``); ``settle`` lets
finished ones run before their spans are sent.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

log = logging.getLogger(__name__)
_monotonic = time.monotonic


def _arg(position: int, *names: str) -> Callable[[tuple[Any, ...], dict[str, Any]], Any]:
    def pick(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if len(args) > position:
            return args[position]
        return next((kwargs[n] for n in names if n in kwargs), None)

    return pick


Pick = Callable[[tuple[Any, ...], dict[str, Any]], Any]
# torch.distributed function -> (op, the buffer this rank sends, the process group).
FUNCTIONS: dict[str, tuple[str, Pick, Pick]] = {
    "all_reduce": ("all_reduce", _arg(0, "tensor"), _arg(2, "group")),
    "broadcast": ("broadcast", _arg(0, "tensor"), _arg(2, "group")),
    "_broadcast_coalesced": ("broadcast", _arg(1), _arg(0)),
    "all_gather": ("all_gather", _arg(1, "tensor"), _arg(2, "group")),
    "all_gather_into_tensor": ("all_gather", _arg(1, "input_tensor"), _arg(2, "group")),
    "all_gather_single": ("all_gather", _arg(1, "input_tensor"), _arg(2, "group")),
    "reduce_scatter": ("reduce_scatter", _arg(1, "input_list"), _arg(3, "group")),
    "reduce_scatter_tensor": ("reduce_scatter", _arg(1, "input"), _arg(3, "group")),
    "reduce_scatter_single": ("reduce_scatter", _arg(1, "input"), _arg(3, "group")),
    "all_to_all_single": ("all_to_all", _arg(1, "input"), _arg(4, "group")),
    "reduce": ("reduce", _arg(0, "tensor"), _arg(3, "group")),
    "barrier": ("barrier", _arg(99), _arg(0, "group")),
}

# Called with (op, start, end or None, detail, future or None) for every collective.
Listener = Callable[[str, float, float | None, dict[str, Any], Any], None]
# The same, then the first tensor sent (or None) and the process group.
CallListener = Callable[[str, float, float | None, dict[str, Any], Any, Any, Any], None]
_LISTENERS: list[Listener] = []
_CALL_LISTENERS: list[CallListener] = []
_lock = threading.Lock()
_originals: dict[str, Any] = {}


def listen(listener: Listener | CallListener, *, call: bool = False) -> Callable[[], None]:
    """Route every collective to ``listener`` until the returned callable is called;
    the wrappers are installed while anyone listens. ``call``: it takes the first
    tensor sent and the process group too (``CallListener``)."""
    listeners: list[Any] = _CALL_LISTENERS if call else _LISTENERS
    with _lock:
        if not _LISTENERS and not _CALL_LISTENERS:
            _install()
        listeners.append(listener)

    def stop() -> None:
        with _lock:
            if listener in listeners:
                listeners.remove(listener)
            if not _LISTENERS and not _CALL_LISTENERS:
                _uninstall()

    return stop


def _install() -> None:
    for name, spec in FUNCTIONS.items():
        fn = getattr(dist, name, None)
        if fn is not None:
            _originals[name] = fn
            setattr(dist, name, _wrapped(fn, *spec))


def _uninstall() -> None:
    for name, fn in _originals.items():
        setattr(dist, name, fn)
    _originals.clear()


def describe(sent: Any, group: Any) -> tuple[dict[str, Any], Any, Any]:
    """(detail, first tensor sent or None, process group) of one collective: detail holds
    bytes, dtype, group and group_size (what this rank sends; plain values only, which
    probes send as they are)."""
    if isinstance(sent, (list, tuple)):
        sent = [t for t in sent if isinstance(t, torch.Tensor)]
        nbytes = sum(t.numel() * t.element_size() for t in sent)
        first = sent[0] if sent else None
    elif isinstance(sent, torch.Tensor):
        nbytes, first = sent.numel() * sent.element_size(), sent
    else:
        nbytes, first = 0, None
    detail: dict[str, Any] = {
        "nbytes": nbytes,
        "dtype": str(first.dtype) if first is not None else "",
    }
    pg = None
    try:
        pg = group if isinstance(group, dist.ProcessGroup) else dist.group.WORLD
        detail["group"] = pg.group_name if pg is not None else "default"
        detail["group_size"] = pg.size() if pg is not None else 1
    except Exception:  # a group object this torch names differently
        detail["group"], detail["group_size"] = "?", 0
    return detail, first, pg


def report(
    op: str, start: float, detail: dict[str, Any], work: Any, first: Any = None, pg: Any = None
) -> None:
    """Tell every listener: ``work`` a Work / Future still running, or None (done now);
    call listeners (``listen(..., call=True)``) also get the first tensor and the group."""
    end = None if work is not None else _monotonic()
    for listener in list(_LISTENERS):
        try:
            listener(op, start, end, detail, work)
        except Exception:  # pragma: no cover - a bug in a probe, never the user's step
            log.exception("timeline: recording a collective failed")
    for call_listener in list(_CALL_LISTENERS):
        try:
            call_listener(op, start, end, detail, work, first, pg)
        except Exception:  # pragma: no cover - a bug in a probe, never the user's step
            log.exception("recording a collective failed")


def _wrapped(fn: Callable[..., Any], op: str, sent: Pick, group: Pick) -> Callable[..., Any]:
    def call(*args: Any, **kwargs: Any) -> Any:
        if not _LISTENERS and not _CALL_LISTENERS:
            return fn(*args, **kwargs)
        start = _monotonic()
        out = fn(*args, **kwargs)
        try:
            detail, first, pg = describe(sent(args, kwargs), group(args, kwargs))
            work = out if out is not None and hasattr(out, "get_future") else None
            report(op, start, detail, work, first, pg)
        except Exception:  # pragma: no cover
            log.exception("timeline: describing %s failed", op)
        return out

    call.__wrapped__ = fn  # type: ignore[attr-defined]
    return call
