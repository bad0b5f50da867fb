"""A synthetic DDP run of the bucket probe's events, as ``ish.watch`` emits them, without
ranks: the layout from the planner (so the observed buckets match the plan unless told
otherwise), the times from a simple model of one backward pass (gradients ready evenly
over ``compute_s``, buckets reduced one after another at ``bytes_per_s``). For tests,
benchmarks and offline demos (``Feature.fake``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec
from msgspec.structs import asdict

from interactive_shard.buckets.events import BucketReduced, DdpDelayed, DdpIteration, DdpWatch
from interactive_shard.buckets.plan import ParamSpec, plan_buckets
from interactive_shard.telemetry.schema import Event


@dataclass(frozen=True)
class FakeParam:
    fqn: str
    shape: tuple[int, ...]
    module: str
    module_type: str = "Linear"
    dtype: str = "torch.float32"


def mlp_params(layers: int, width: int, prefix: str = "layers") -> list[FakeParam]:
    """``layers`` Linear(width, width) modules: weight and bias each."""
    out = []
    for i in range(layers):
        module = f"{prefix}.{i}"
        out.append(FakeParam(f"{module}.weight", (width, width), module))
        out.append(FakeParam(f"{module}.bias", (width,), module))
    return out


def module_params(model: Any) -> list[FakeParam]:
    """A real module's parameters as ``FakeParam`` (fqn, shape, owning module and its
    type), e.g. ``example_models.llama_7b()``'s on meta: a real layout for fake runs."""
    owners = {
        f"{m}.{n}" if m else n: (m, type(mod).__name__)
        for m, mod in model.named_modules()
        for n, _ in mod.named_parameters(recurse=False)
    }
    return [FakeParam(fqn, tuple(t.shape), *owners[fqn]) for fqn, t in model.named_parameters()]


@dataclass
class FakeRun:
    """Settings of the fake run; ``events()`` returns every rank's events in time order."""

    params: Sequence[FakeParam]
    world_size: int = 2
    iterations: int = 3
    bucket_cap_mb: float | None = None
    bucket_cap_mb_list: list[float] | None = None
    find_unused_parameters: bool = False
    static_graph: bool = False
    ready_order: list[str] | None = None  # default: reverse registration (a plain MLP)
    unready: list[str] = field(default_factory=list)  # never get a gradient
    diverge: dict[int, list[str]] = field(default_factory=dict)  # iteration -> fqns
    compute_s: float = 0.010
    bytes_per_s: float = 1e9
    t0: float = 1000.0
    delayed: list[str] = field(default_factory=list)  # delay_all_reduce_named_params
    delay_hook: str | None = None  # param_to_hook_all_reduce

    def events(self) -> list[Event]:
        fqns = [p.fqn for p in self.params if p.fqn not in self.delayed]
        order = self.ready_order or fqns[::-1]
        order = [f for f in order if f not in self.unready and f not in self.delayed]
        plan = plan_buckets(
            [(p.fqn, ParamSpec(p.shape, p.dtype)) for p in self.params],
            bucket_cap_mb=self.bucket_cap_mb,
            bucket_cap_mb_list=self.bucket_cap_mb_list,
            find_unused_parameters=self.find_unused_parameters,
            static_graph=self.static_graph,
            ready_order=order + [f for f in fqns if f not in order],
            delay_all_reduce_named_params=self.delayed or None,
            param_to_hook_all_reduce=self.delay_hook,
        )
        events = [
            self._watch(rank, plan.bucket_cap_bytes, plan.first_bucket_cap_bytes)
            for rank in range(self.world_size)
        ]
        for it in range(1, self.iterations + 1):
            start = self.t0 + it
            step = self.compute_s / max(len(order), 1)
            ready = {f: start + (i + 1) * step for i, f in enumerate(order)}
            for rank in range(self.world_size):
                prev_end = start
                for b in plan.iteration(it):
                    times = [ready[f] for f in b.fqns if f in ready]
                    ready_t = max(times) if times else start + self.compute_s
                    begin = max(ready_t, prev_end)
                    prev_end = begin + b.nbytes / self.bytes_per_s
                    bucket = BucketReduced(
                        iteration=it,
                        index=b.index,
                        fqns=list(b.fqns),
                        shapes=list(b.shapes),
                        dtypes=list(b.dtypes),
                        nbytes=b.nbytes,
                        ready_t=ready_t,
                        start_t=begin,
                        end_t=prev_end,
                        is_last=b.index == len(plan.iteration(it)) - 1,
                    )
                    events.append(Event(bucket.KIND, rank, it, prev_end, asdict(bucket)))
                checksums = {f: math.sin(i + it) for i, f in enumerate(order)}
                for f in self.diverge.get(it, []):
                    checksums[f] += rank
                summary = DdpIteration(
                    iteration=it,
                    backward_start=start,
                    backward_end=start + self.compute_s,
                    ready_order=order,
                    ready_t=[ready[f] for f in order],
                    unready=self.unready,
                    checksums=checksums,
                )
                end = start + self.compute_s
                events.append(Event(summary.KIND, rank, it, end, asdict(summary)))
        return sorted(events, key=lambda e: e.t)

    def _watch(self, rank: int, cap: int, first: int) -> Event:
        reduced = [p for p in self.params if p.fqn not in self.delayed]
        delayed = [p for p in self.params if p.fqn in self.delayed]
        watch = DdpWatch(
            fqns=[p.fqn for p in reduced],
            shapes=[tuple(p.shape) for p in reduced],
            dtypes=[p.dtype for p in reduced],
            modules=[p.module for p in reduced],
            module_types=[p.module_type for p in reduced],
            bucket_cap_mb=self.bucket_cap_mb,
            bucket_cap_mb_list=self.bucket_cap_mb_list,
            bucket_bytes_cap=cap,
            first_bucket_bytes=first,
            find_unused_parameters=self.find_unused_parameters,
            static_graph=self.static_graph,
            world_size=self.world_size,
            user_hook=None,
            checksum="sampled",
            delayed=None
            if not delayed
            else DdpDelayed(
                fqns=[p.fqn for p in delayed],
                shapes=[tuple(p.shape) for p in delayed],
                dtypes=[p.dtype for p in delayed],
                modules=[p.module for p in delayed],
                module_types=[p.module_type for p in delayed],
                hook=self.delay_hook,
            ),
        )
        return Event(watch.KIND, rank, 0, self.t0, msgspec.to_builtins(watch))


def sample(iterations: int = 3) -> list[Event]:
    """The feature's synthetic run (``Feature.fake``): DDP of 4 Linear(32, 32) over 2 ranks,
    small buckets, ``iterations`` iterations."""
    return FakeRun(mlp_params(4, 32), bucket_cap_mb=0.006, iterations=iterations).events()
