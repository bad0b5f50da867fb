"""What ``lifecycle_watch`` says about one DDP instance: settings, construction-time
collectives and the DDP hooks live on each parameter (Note [Lifecycle probe])."""

from __future__ import annotations

from typing import Any

import torch
from torch.nn.parallel import DistributedDataParallel as DDP

from interactive_shard.ddp.events import Collective, Hooks, LifecycleWatch
from interactive_shard.probing.collective_log import CollectiveLog, Record
from interactive_shard.probing.compat import ddp as compat_ddp

_DELAYED_HOOK = DDP._delayed_all_reduce_hook


def collective(r: Record) -> Collective:
    op, nbytes, dtype, group, start, end, caller, serial = r
    return Collective(
        op=op,
        nbytes=nbytes,
        dtype=dtype,
        group=group,
        start=start,
        end=end,
        caller=caller,  # type: ignore[arg-type]
        ddp=serial,
    )


def nbytes(tensors: list[torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def delayed_owners(param: torch.Tensor, rec: CollectiveLog) -> list[int]:
    """Serials of the DDP instances whose delayed all-reduce hook is a tensor hook on
    ``param`` (``param_to_hook_all_reduce.register_hook(self._delayed_all_reduce_hook)``:
    a Python hook, so it can be read)."""
    hooks = getattr(param, "_backward_hooks", None) or {}
    return sorted(
        rec.instance(h.__self__).serial
        for h in hooks.values()
        if getattr(h, "__func__", None) is _DELAYED_HOOK
    )


def hooks(ddp: DDP, rec: CollectiveLog, fqn: dict[int, str]) -> list[Hooks]:
    on = rec.hooked_on()
    return [
        Hooks(fqn=name, reducer=on.get(id(p), []), delayed=delayed_owners(p, rec))
        for name, p in ddp.module.named_parameters()
        if id(p) in fqn
    ]


def comm_hook(ddp: DDP) -> str | None:
    registered: list[tuple[Any, Any]] = getattr(ddp, "_comm_hooks", [])
    if registered:
        return ", ".join(getattr(h, "__qualname__", repr(h)) for h, _ in registered)
    try:  # a built-in hook (FP16_COMPRESS, ...) is only in the logging data
        name = compat_ddp.logging_data(ddp).get("comm_hook")
    except Exception:
        return None
    return str(name) if name else None


def watch_event(ddp: DDP, rec: CollectiveLog, serial: int, fqn: dict[int, str]) -> LifecycleWatch:
    params = [p for p in compat_ddp.params(ddp) if p.requires_grad]
    buffers: list[torch.Tensor] = list(getattr(ddp, "modules_buffers", []))
    buffer_names = [n for n, _ in getattr(ddp, "named_module_buffers", {}).items()]
    hook_param = next((p for p in compat_ddp.delayed_params(ddp) if delayed_owners(p, rec)), None)
    if hook_param is None:  # the hook sits on param_to_hook_all_reduce, maybe not delayed
        hook_param = next(
            (p for p in ddp.module.parameters() if serial in delayed_owners(p, rec)), None
        )
    mp = ddp.mixed_precision
    return LifecycleWatch(
        ddp=serial,
        world_size=ddp.process_group.size(),
        recorded_from="process_group" if rec.since == "process_group" else "watch",
        static_graph=bool(ddp.static_graph),
        find_unused_parameters=bool(ddp.find_unused_parameters),
        forward_sync_buffers=compat_ddp.forward_sync_buffers(ddp),
        init_sync_buffers=_init_synced_buffers(ddp, rec, serial, params, buffers),
        gradient_as_bucket_view=bool(ddp.gradient_as_bucket_view),
        delayed=[fqn.get(id(p), "?") for p in compat_ddp.delayed_params(ddp)],
        hook_param=None if hook_param is None else fqn.get(id(hook_param), "?"),
        comm_hook=comm_hook(ddp),
        mixed_precision=None if mp is None else repr(mp),
        optimizer_in_backward=[
            fqn.get(id(p), "?")
            for p in compat_ddp.params(ddp)
            if hasattr(p, "_in_backward_optimizers")
        ],
        params=[fqn.get(id(p), "?") for p in params],
        param_bytes=nbytes(params),
        buffers=buffer_names,
        buffer_bytes=nbytes(buffers),
        construction=[collective(r) for r in rec.of(serial, "ddp_init")],
        hooks=hooks(ddp, rec, fqn),
    )


def _init_synced_buffers(
    ddp: DDP,
    rec: CollectiveLog,
    serial: int,
    params: list[torch.Tensor],
    buffers: list[torch.Tensor],
) -> bool:
    """Whether the construction-time sync held the buffers: measured from the recorded
    bytes when they were seen (``broadcast_buffers=False`` leaves them out; 2.13's
    ``forward_sync_buffers=False`` does not), else DDP's setting."""
    seen = rec.of(serial, "ddp_init")
    if seen and buffers:
        delayed = nbytes(compat_ddp.delayed_params(ddp))
        return sum(r[1] for r in seen) - delayed >= nbytes(params) + nbytes(buffers)
    return compat_ddp.forward_sync_buffers(ddp)
