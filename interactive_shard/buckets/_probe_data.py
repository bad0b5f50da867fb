"""The probe's cold side: what ``ish.watch`` checks before attaching, and what it emits.

Everything here turns DDP state into plain data (docs/bucket-events.md) or into an
error that says how to fix it; the hooks that run every step live in ``probe.py``.
"""

from __future__ import annotations

import inspect
from bisect import bisect_right
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from interactive_shard.telemetry import rank as telemetry

DDP_WATCH, BUCKET, DDP_ITERATION = "ddp_watch", "bucket", "ddp_iteration"
CHECKSUM_MODES = ("sampled", "full", "off")
SAMPLE = 4096  # at most this many elements per parameter in a "sampled" checksum
_BLOCK = 16  # contiguous elements per sampled block


class CommHookRegisteredError(RuntimeError):
    """The DDP model already has a comm hook, so the probe cannot register its own."""


# -- checks before attaching ----------------------------------------------------------------
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
    if getattr(model, "mixed_precision", None) is not None:
        raise CommHookRegisteredError(
            "ish.watch cannot attach to DDP(mixed_precision=...): DDP registers its own "
            "comm hook for it and a model can have only one."
        )


def check_no_hook(ddp: DistributedDataParallel, probe_hook: object) -> None:
    """Refuse early, with the hook's name, when DDP already has a Python comm hook."""
    hooks = getattr(ddp, "_comm_hooks", None) or []
    if any(hook is probe_hook for hook, _ in hooks):
        raise CommHookRegisteredError(
            "ish.watch was already called on this DDP model: keep the Probe it returned "
            "(DDP allows one comm hook per model)."
        )
    if hooks:
        raise CommHookRegisteredError(already_hooked(qualname(hooks[0][0])))
    # A built-in (C++) hook leaves no Python trace but DDP's logger names it.
    builtin = ddp._get_ddp_logging_data().get("comm_hook") if hasattr(ddp, "logger") else None
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


# -- what DDP reduces, and its settings ---------------------------------------------------
def reducer_params(ddp: DistributedDataParallel) -> list[tuple[str, str, str, nn.Parameter]]:
    """(fqn, owning module fqn, module class, parameter) as ``_build_params_for_reducer``
    lists them: the list index is the Reducer's parameter index."""
    ignored = set(getattr(ddp, "parameters_to_ignore", ()))
    out, seen = [], set()
    for mname, module in ddp.module.named_modules():
        for pname, p in module.named_parameters(recurse=False):
            key = f"{mname}.{pname}"  # DDP's ignore key: a root parameter is ".name"
            if p.requires_grad and key not in ignored and id(p) not in seen:
                seen.add(id(p))
                out.append((key if mname else pname, mname, type(module).__name__, p))
    return out


def watch_payload(
    ddp: DistributedDataParallel,
    rows: list[tuple[str, str, str, nn.Parameter]],
    world_size: int,
    user_hook: object,
    checksum: str,
) -> dict[str, Any]:
    """``ddp_watch``; private DDP fields read with getattr (torch 2.5 to 2.13)."""
    mib = float(2**20)
    cap = int(ddp.bucket_bytes_cap)
    default_cap = bool(getattr(ddp, "bucket_bytes_cap_default", False))
    cap_list = list(getattr(ddp, "bucket_bytes_cap_list", None) or [])  # torch >= 2.13
    first = getattr(getattr(ddp, "_bucket_config", None), "first_bucket_bytes_cap", None)
    if first is None:  # torch < 2.13: the 1 MiB first bucket only when no cap was given
        first = dist._DEFAULT_FIRST_BUCKET_BYTES if default_cap else cap
    params = [r[3] for r in rows]
    return {
        "fqns": [r[0] for r in rows],
        "shapes": [list(p.shape) for p in params],
        "dtypes": [str(p.dtype) for p in params],
        "modules": [r[1] for r in rows],
        "module_types": [r[2] for r in rows],
        "bucket_cap_mb": None if default_cap else cap / mib,
        "bucket_cap_mb_list": [c / mib for c in cap_list] or None,
        "bucket_bytes_cap": cap,
        "first_bucket_bytes": int(first),
        "find_unused_parameters": bool(ddp.find_unused_parameters),
        "static_graph": bool(getattr(ddp, "static_graph", False)),
        "world_size": world_size,
        "user_hook": None if user_hook is None else qualname(user_hook),
        "checksum": checksum,
    }


# -- per-step payloads ---------------------------------------------------------------------
def emit_bucket(
    head: tuple[int, int, int, bool, float],
    meta: tuple[list[str], list[list[int]], list[str]],
    start_t: float,
    end_t: float | None,
) -> None:
    iteration, index, nbytes, is_last, ready_t = head
    fqns, shapes, dtypes = meta
    telemetry.emit(
        BUCKET,
        {
            "iteration": iteration,
            "index": index,
            "fqns": fqns,
            "shapes": shapes,
            "dtypes": dtypes,
            "nbytes": nbytes,
            "ready_t": ready_t,
            "start_t": start_t,
            "end_t": end_t,
            "is_last": is_last,
        },
    )


def ready_at(ready: list[tuple[int, float]]) -> Callable[[int, float], float]:
    """``at(i, t)``: when parameter ``i`` was last ready at or before ``t`` (``t`` if never),
    from the ``(param index, time)`` list of one backward, in time order. A parameter
    ready twice (reentrant checkpoint) has its bucket launched after the first arrival:
    that arrival made the bucket ready, not the later one (Note [DDP bucket probe])."""
    last = dict(ready)
    if len(last) == len(ready):  # each parameter ready once: the usual case, no search
        return lambda i, t: last.get(i, t)
    arrivals: dict[int, list[float]] = {}
    for i, t in ready:
        arrivals.setdefault(i, []).append(t)

    def at(i: int, t: float) -> float:
        times = arrivals.get(i, [])
        j = bisect_right(times, t)
        return times[j - 1] if j else t

    return at


def iteration_payload(
    iteration: int,
    ready: list[tuple[int, float]],
    fqns: list[str],
    params: list[nn.Parameter],
    checksum: str,
) -> dict[str, Any]:
    """``ddp_iteration`` from the ``(param index, time)`` list of one backward."""
    last: dict[int, float] = {}
    repeated: set[int] = set()
    for i, t in ready:  # a parameter reached twice (reentrant backward) counts at the last
        if last.pop(i, None) is not None:
            repeated.add(i)
        last[i] = t
    return {
        "iteration": iteration,
        "backward_start": ready[0][1] if ready else None,
        "backward_end": ready[-1][1] if ready else None,
        "ready_order": [fqns[i] for i in last],
        "ready_t": list(last.values()),
        "unready": [fqns[i] for i in range(len(fqns)) if i not in last],
        "repeated": [fqns[i] for i in sorted(repeated)],
        "checksums": checksums(fqns, params, checksum),
    }


def checksums(fqns: list[str], params: list[nn.Parameter], mode: str) -> dict[str, float]:
    """Per-parameter float64 sum of ``.grad``: a strided sample (``SAMPLE`` elements in
    evenly spaced blocks of ``_BLOCK``), all of it, or nothing."""
    if mode == "off":
        return {}
    by_device: dict[torch.device, tuple[list[str], list[torch.Tensor]]] = {}
    for fqn, p in zip(fqns, params, strict=True):
        g = p.grad
        if g is None:
            continue
        flat = (g._values() if g.is_sparse else g.detach()).reshape(-1)
        if mode == "sampled" and flat.numel() > SAMPLE:
            # SAMPLE elements in blocks of one 64-byte line, spread evenly: one element
            # every n/SAMPLE would touch a page per element (milliseconds on CPU).
            blocks = SAMPLE // _BLOCK
            stride = flat.numel() // blocks
            flat = flat[: blocks * stride].view(blocks, stride)[:, :_BLOCK]
        names, parts = by_device.setdefault(flat.device, ([], []))
        names.append(fqn)
        parts.append(flat.sum(dtype=torch.float32 if flat.device.type == "mps" else torch.float64))
    out: dict[str, float] = {}
    for names, parts in by_device.values():  # one transfer (a sync on CUDA) per device
        out.update(zip(names, torch.stack(parts).tolist(), strict=True))
    return out
