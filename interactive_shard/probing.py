"""What every probe's hooks share: never break the user's step, and tell backward apart.

Probes (``*/probe.py``) run inside the user's forward and backward; a bug in one must
cost a log line, not the training step.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch

log = logging.getLogger(__name__)

_task_id = torch._C._current_graph_task_id  # -1 outside backward


def in_backward() -> bool:
    """Whether autograd is running a backward on this thread (a recomputed forward, a
    hook): the forwards probes count are the ones outside it."""
    return _task_id() != -1


def guarded(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` as a hook that never breaks the user's step: a probe bug is logged once,
    not raised, and the hook returns None (the engine goes on as without it)."""

    def call(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except Exception:  # pragma: no cover - a bug in the probe, not in the user's model
            if not getattr(call, "_logged", False):
                call._logged = True  # type: ignore[attr-defined]
                log.exception("probe hook %s failed; it records less from now on", fn)
            return None

    call.__wrapped__ = fn  # type: ignore[attr-defined]
    return call


def fsdp_param_groups(state: Any) -> list[Any]:
    """An FSDP2 state's parameter groups (``FSDPParamGroup``), on every supported torch.

    torch 2.13 keeps a list, ``FSDPState._fsdp_param_groups``; 2.11 and 2.12 keep one
    group or None, ``_fsdp_param_group`` (measured: the list is missing there).
    """
    groups = getattr(state, "_fsdp_param_groups", None)
    if groups is not None:
        return list(groups)
    group = getattr(state, "_fsdp_param_group", None)
    return [] if group is None else [group]
