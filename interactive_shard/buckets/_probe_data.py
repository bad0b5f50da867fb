"""The probe's cold side: the events it emits, built from DDP's state and its own.

Everything here turns what the probe saw into events (``events.py``); the hooks that run
every step live in ``probe.py``, the checks before attaching in ``_probe_checks.py``.
"""

from __future__ import annotations

import logging
from bisect import bisect_right
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import msgspec
import torch
from msgspec.structs import asdict
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from interactive_shard.buckets._params import ReducerParam
from interactive_shard.buckets._probe_checks import qualname
from interactive_shard.buckets.events import (
    BucketReduced,
    Checksum,
    DdpDelayed,
    DdpIteration,
    DdpWatch,
)
from interactive_shard.probing import spy as _spy
from interactive_shard.probing.compat import ddp as compat_ddp
from interactive_shard.probing.spy import Launch
from interactive_shard.telemetry import rank as telemetry

log = logging.getLogger("interactive_shard.buckets.probe")

SAMPLE = 4096  # at most this many elements per parameter in a "sampled" checksum
_BLOCK = 16  # contiguous elements per sampled block


# -- events -----------------------------------------------------------------------------------
def emit(event: DdpWatch | BucketReduced | DdpIteration) -> None:
    # ddp_watch nests a record (``delayed``): to_builtins makes it a map. The per-bucket
    # events are flat, and asdict is cheaper.
    flat = not isinstance(event, DdpWatch)
    telemetry.emit(event.KIND, asdict(event) if flat else msgspec.to_builtins(event))


def watch_event(
    ddp: DistributedDataParallel,
    rows: list[ReducerParam],
    world_size: int,
    user_hook: object,
    checksum: Checksum,
    first_iteration: int | None = 1,
) -> DdpWatch:
    """``ddp_watch``; DDP's private fields read through ``probing.compat.ddp``."""
    mib = float(2**20)
    cap = int(ddp.bucket_bytes_cap)
    default_cap = bool(getattr(ddp, "bucket_bytes_cap_default", False))
    cap_list = compat_ddp.cap_list_bytes(ddp)
    first = compat_ddp.first_bucket_bytes(ddp, default_cap)
    return DdpWatch(
        fqns=[r.fqn for r in rows],
        shapes=[tuple(r.param.shape) for r in rows],
        dtypes=[str(r.param.dtype) for r in rows],
        modules=[r.module_fqn for r in rows],
        module_types=[type(r.module).__name__ for r in rows],
        bucket_cap_mb=None if default_cap else cap / mib,
        bucket_cap_mb_list=[c / mib for c in cap_list] or None,
        bucket_bytes_cap=cap,
        first_bucket_bytes=int(first),
        find_unused_parameters=bool(ddp.find_unused_parameters),
        static_graph=bool(getattr(ddp, "static_graph", False)),
        world_size=world_size,
        user_hook=None if user_hook is None else qualname(user_hook),
        checksum=checksum,
        delayed=delayed_params(ddp),
        first_iteration=first_iteration,
    )


Place = tuple[str, str, nn.Module]  # (DDP key, owning module fqn, owning module)


def delayed_params(ddp: DistributedDataParallel) -> DdpDelayed | None:
    """``delay_all_reduce_named_params`` as DDP keeps them: the tensors in
    ``_delay_all_reduce_params``, the names given in ``parameters_to_ignore``."""
    params = compat_ddp.delayed_params(ddp)
    if not params:
        return None
    ignored = set(getattr(ddp, "parameters_to_ignore", ()))
    places: dict[int, list[Place]] = {}
    for module_fqn, sub in ddp.module.named_modules():
        for name, p in sub.named_parameters(recurse=False):
            places.setdefault(id(p), []).append((f"{module_fqn}.{name}", module_fqn, sub))
    params = [p for p in params if id(p) in places]  # not the module's: nothing to name
    if not params:
        return None
    rows = [_given(places[id(p)], ignored) for p in params]
    return DdpDelayed(
        fqns=[name for name, _, _ in rows],
        shapes=[tuple(p.shape) for p in params],
        dtypes=[str(p.dtype) for p in params],
        modules=[module_fqn for _, module_fqn, _ in rows],
        module_types=[type_name for _, _, type_name in rows],
        hook=_delay_hook(ddp, places),
    )


def _given(places: list[Place], ignored: set[str]) -> tuple[str, str, str]:
    """(name, module fqn, module type) of a delayed parameter. The name is the one DDP
    was given: a key ("a.weight", ".pos"), a root one's fqn ("pos": DDP's key misses it
    and leaves it in the buckets), or else its fqn (DDP did not take it out either)."""
    for strip in (False, True):
        for key, module_fqn, sub in places:
            name = key.removeprefix(".") if strip else key
            if name in ignored:
                return name, module_fqn, type(sub).__name__
    key, module_fqn, sub = places[0]
    return key.removeprefix("."), module_fqn, type(sub).__name__


def _delay_hook(ddp: DistributedDataParallel, places: dict[int, list[Place]]) -> str | None:
    """The fqn of ``param_to_hook_all_reduce``: the parameter holding DDP's
    ``_delayed_all_reduce_hook`` (a tensor hook, so in its ``_backward_hooks``)."""
    for p in ddp.module.parameters():
        for hook in (getattr(p, "_backward_hooks", None) or {}).values():
            if getattr(hook, "__self__", None) is ddp and (
                getattr(hook, "__name__", "") == "_delayed_all_reduce_hook"
            ):
                return places[id(p)][0][0].removeprefix(".")
    return None


@dataclass(frozen=True, slots=True)
class BucketParams:
    """The parameters of one bucket, as its events list them."""

    fqns: list[str]
    shapes: list[tuple[int, ...]]
    dtypes: list[str]


@dataclass(slots=True)
class Reduced:
    """A bucket the probe's comm hook reduced, until the end of backward emits it."""

    iteration: int
    index: int
    nbytes: int
    is_last: bool
    ready_t: float
    start_t: float
    params: BucketParams
    end_t: float | None = None

    def event(self) -> BucketReduced:
        return bucket_event(
            self.iteration,
            self.index,
            self.nbytes,
            self.is_last,
            self.params,
            self.ready_t,
            self.start_t,
            self.end_t,
        )


def bucket_event(
    iteration: int,
    index: int,
    nbytes: int,
    is_last: bool,
    params: BucketParams,
    ready_t: float,
    start_t: float,
    end_t: float | None,
) -> BucketReduced:
    return BucketReduced(
        iteration=iteration,
        index=index,
        fqns=params.fqns,
        shapes=params.shapes,
        dtypes=params.dtypes,
        nbytes=nbytes,
        ready_t=ready_t,
        start_t=start_t,
        end_t=end_t,
        is_last=is_last,
    )


class BucketLayouts:
    """Which parameters each bucket holds, by Reducer index (-1: one DDP reduces that was
    not in its list at watch time); cached, as DDP reuses few layouts."""

    def __init__(self, ddp: DistributedDataParallel, fqns: list[str], index_of: dict[int, int]):
        self.ddp = ddp
        self.fqns = fqns
        self.index_of = index_of
        self._params: dict[tuple[int, ...], BucketParams] = {}
        self._spied_key: tuple[int, ...] = ()  # element counts of the layout below
        self._spied: list[tuple[tuple[int, ...], BucketParams]] = []

    def key(self, params: Sequence[torch.Tensor]) -> tuple[int, ...]:
        return tuple(self.index_of.get(id(p), -1) for p in params)

    def params(self, key: tuple[int, ...], params: Sequence[torch.Tensor]) -> BucketParams:
        found = self._params.get(key)
        if found is None:
            found = self._params[key] = BucketParams(
                [self.fqns[i] if i >= 0 else "<unknown>" for i in key],
                [tuple(p.shape) for p in params],
                [str(p.dtype) for p in params],
            )
        return found

    def spied(
        self, iteration: int, launches: list[Launch], ready: list[tuple[int, float]]
    ) -> list[BucketReduced]:
        """Bucket events from the spied all-reduces: launch k is bucket k (Note step 0)."""
        _spy.settle(launches)  # after DDP's finalize: every launched all-reduce is done
        sizes = tuple(launch.numel for launch in launches)
        # The Reducer rebuilds its buckets once, by iteration 3; a rebuild can keep the
        # sizes (one bucket, new order), so ask it for the layout until then.
        if iteration <= 3 or sizes != self._spied_key:
            self._spied_key = sizes
            self._spied = []
            for tensors in _spy.layout(self.ddp):
                key = self.key(tensors)
                self._spied.append((key, self.params(key, tensors)))
        last_ready = ready_at(ready)
        events = []
        for k, launch in enumerate(launches[: len(self._spied)]):
            key, params = self._spied[k]
            bucket_ready = max((last_ready(i, launch.start_t) for i in key), default=launch.start_t)
            ready_t = min(bucket_ready, launch.start_t)
            is_last = k == len(self._spied) - 1
            events.append(
                bucket_event(
                    iteration,
                    k,
                    launch.nbytes,
                    is_last,
                    params,
                    ready_t,
                    launch.start_t,
                    launch.end_t,
                )
            )
        return events


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


def iteration_event(
    iteration: int,
    ready: list[tuple[int, float]],
    fqns: list[str],
    params: list[nn.Parameter],
    checksum: Checksum,
) -> DdpIteration:
    """``ddp_iteration`` from the ``(param index, time)`` list of one backward."""
    last: dict[int, float] = {}
    repeated: set[int] = set()
    for i, t in ready:  # a parameter reached twice (reentrant backward) counts at the last
        if last.pop(i, None) is not None:
            repeated.add(i)
        last[i] = t
    return DdpIteration(
        iteration=iteration,
        backward_start=ready[0][1] if ready else None,
        backward_end=ready[-1][1] if ready else None,
        ready_order=[fqns[i] for i in last],
        ready_t=list(last.values()),
        unready=[fqns[i] for i in range(len(fqns)) if i not in last],
        repeated=[fqns[i] for i in sorted(repeated)],
        checksums=checksums(fqns, params, checksum),
    )


def warn_unready(ddp: DistributedDataParallel, iteration: int, unready: list[str]) -> None:
    """Name the parameters that will make DDP's next forward fail, before it does."""
    if not unready or ddp.find_unused_parameters or getattr(ddp, "static_graph", False):
        return
    log.warning(
        "ish.watch: DDP iteration %d: %d parameter(s) got no gradient: %s. DDP "
        "(find_unused_parameters=False) never finished this reduction, and the next "
        "forward will raise 'Expected to have finished reduction in the prior "
        "iteration'. Use them in the loss or pass find_unused_parameters=True.",
        iteration,
        len(unready),
        ", ".join(unready[:8]) + (" ..." if len(unready) > 8 else ""),
    )


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
