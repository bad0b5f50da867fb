"""What ``ish.watch`` checks before the bucket probe attaches: errors that say how to fix.

DDP allows one comm hook per model, and some DDP settings register one of their own, so
most of these explain why the probe cannot add its hook and how to give it the user's.
"""

from __future__ import annotations

import inspect
from typing import get_args

from torch.nn.parallel import DistributedDataParallel

from interactive_shard.buckets.events import Checksum
from interactive_shard.probing.compat import ddp as compat_ddp

CHECKSUM_MODES: tuple[Checksum, ...] = get_args(Checksum)


class CommHookRegisteredError(RuntimeError):
    """The DDP model already has a comm hook, so the probe cannot register its own."""


def check_watchable(model: object, checksum: str, hook: object, state: object) -> None:
    if not isinstance(model, DistributedDataParallel):
        raise TypeError(
            "ish.watch(model) needs a torch.nn.parallel.DistributedDataParallel model, got "
            f"{type(model).__module__}.{type(model).__qualname__}: wrap it first, "
            "ddp = DistributedDataParallel(model), and pass ddp."
        )
    if checksum not in CHECKSUM_MODES:
        raise ValueError(f"checksum must be one of {CHECKSUM_MODES}, got {checksum!r}")
    if hook is None and state is not None:
        raise ValueError("state= is the state of comm_hook=: pass both or neither")
    if hook is not None:
        if not callable(hook):
            raise TypeError(f"comm_hook must be callable, got {hook!r:.80}")
        if "bucket" not in inspect.signature(hook).parameters:
            raise TypeError(
                f"comm_hook {qualname(hook)}: DDP calls hook(state, bucket) and requires "
                "the second parameter to be named 'bucket'"
            )
        getattr(model, "_check_comm_hook", callable)(hook)  # DDP's own checks and errors
    if getattr(model, "_delay_all_reduce_all_params", False):
        raise ValueError(
            "ish.watch: every trainable parameter of this DDP model is in "
            "delay_all_reduce_named_params, so DDP built no Reducer and has no buckets to "
            "watch (one all-reduce from the hook on param_to_hook_all_reduce does it all)."
        )
    if getattr(model, "mixed_precision", None) is not None:
        raise CommHookRegisteredError(
            "ish.watch cannot attach to DDP(mixed_precision=...): DDP registers its own "
            "comm hook for it and a model can have only one."
        )


def check_attachable(ddp: DistributedDataParallel, probe_hook: object) -> None:
    """Refuse early, with the hook's name, when DDP already has a comm hook."""
    earlier = getattr(ddp, "_ish_probe", None)
    if earlier is not None and earlier.attached:
        raise CommHookRegisteredError(
            "ish.watch was already called on this DDP model: keep the Probe it returned."
        )
    hooks = getattr(ddp, "_comm_hooks", None) or []
    if any(hook is probe_hook for hook, _ in hooks):
        raise CommHookRegisteredError(
            "ish.watch was already called on this DDP model: keep the Probe it returned "
            "(DDP allows one comm hook per model)."
        )
    if hooks:
        raise CommHookRegisteredError(already_hooked(qualname(hooks[0][0])))
    # A built-in (C++) hook leaves no Python trace but DDP's logger names it.
    builtin = None
    builtin = compat_ddp.logging_data(ddp).get("comm_hook")
    if builtin:
        raise CommHookRegisteredError(already_hooked(str(builtin)))


def already_hooked(name: str) -> str:
    return (
        f"this DDP model already has a comm hook ({name}) and DDP allows only one, so "
        "ish.watch cannot add its own. Do not call ddp.register_comm_hook(state, hook); "
        "pass it via ish.watch(ddp, comm_hook=hook, state=state) instead: the probe "
        "calls it for every bucket."
    )


def qualname(fn: object) -> str:
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"


def register_comm_hook(ddp: DistributedDataParallel, state: object, hook: object) -> None:
    """``ddp.register_comm_hook(state, hook)``, with the error a built-in hook deserves."""
    try:
        ddp.register_comm_hook(state, hook)  # type: ignore[arg-type]
    except RuntimeError as exc:  # a built-in (C++) hook leaves no trace in _comm_hooks
        hooks = getattr(ddp, "_comm_hooks", None)
        if hooks and hooks[-1][0] is hook:
            hooks.pop()  # DDP appended ours before the Reducer refused it
        if "only be called once" in str(exc):
            raise CommHookRegisteredError(already_hooked("a built-in hook")) from exc
        raise
