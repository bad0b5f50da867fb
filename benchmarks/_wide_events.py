"""The events of a simulated wide run, per rank, some ranks deliberately faulty: for
``_wide.py`` (``bench_wide.py`` and ``tests/integration/test_wide_stream.py``).

Built with ``interactive_shard.testing``'s fakes (buckets, timeline, DDP lifecycle,
precision, splits) plus scalars. Each fake simulates the whole world where its ranks
interact (the timeline's collectives wait for the last rank), or one rank relabelled
where ranks are alike (lifecycle, precision: simulating 64 would cost 64 times more).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgspec

from interactive_shard import testing
from interactive_shard.telemetry.schema import Event
from interactive_shard.timeline.events import TimelineSpans

DIVERGED_FQN = "layers.3.weight"
UNUSED = ["1.bias"]  # lifecycle: no gradient, so every rank's reduction stays unfinished


@dataclass(frozen=True)
class Faults:
    """The faulty ranks, one per feature (distinct where the world allows)."""

    diverged: int  # buckets: DIVERGED_FQN's checksum differs at iteration ``diverge_at``
    straggler: int  # timeline: starts every iteration ``delay_s`` late
    dropped: int  # lifecycle: one more forward, dropped without backward, at ``dropped_at``
    nothing: int  # splits: torch.compile split nothing on this rank
    full_precision: int  # precision: unit "1" computes in float32 under a bf16 policy
    diverge_at: int
    dropped_at: int
    delay_s: float = 0.005

    @classmethod
    def spread(cls, world_size: int, iterations: int) -> Faults:
        ranks = [(world_size * k) // 5 + 1 for k in range(5)]  # 1, 13, 26, 39, 52 of 64
        ranks = [min(r, world_size - 1) for r in ranks]
        middle = max(1, iterations // 2)
        return cls(*ranks, diverge_at=middle, dropped_at=max(1, iterations // 3))


def rank_streams(world_size: int, iterations: int, faults: Faults) -> dict[int, list[Event]]:
    """Every rank's events (``Event.t`` as the fakes set it: the Emitter stamps its own),
    in the order the rank emits them: by iteration (``step``), each fake's own order kept
    within one iteration."""
    per_rank: dict[int, list[Event]] = {r: [] for r in range(world_size)}

    def add(events: list[Event]) -> None:
        for e in events:
            per_rank[e.rank].append(e)

    add(_buckets(world_size, iterations, faults))
    add(_timeline(world_size, iterations, faults))
    add(_lifecycle(world_size, iterations, faults))
    add(_precision(world_size, iterations, faults))
    splits = testing.FakeSplits(
        testing.mlp_graph(4, 256),
        world_size=world_size,
        bucket_cap_mb=1,
        nothing={faults.nothing: testing.NOTHING_REASON},
    )
    add(splits.events())
    add(
        [
            Event("scalar", r, it, 1000.0 + it, {"name": name, "value": value})
            for it in range(1, iterations + 1)
            for r in range(world_size)
            for name, value in (("loss", 1.0 / it + r * 1e-3), ("lr", 0.1))
        ]
    )
    return {r: sorted(events, key=lambda e: e.step) for r, events in per_rank.items()}


def _buckets(world_size: int, iterations: int, faults: Faults) -> list[Event]:
    # Not FakeRun(diverge=...): that shifts every rank's checksum by its rank, so with
    # many ranks no majority agrees. One rank whose gradient differs is the usual bug.
    fake = testing.FakeRun(testing.mlp_params(8, 16), world_size=world_size, iterations=iterations)
    events = fake.events()
    for e in events:
        if e.kind == "ddp_iteration" and (e.rank, e.step) == (faults.diverged, faults.diverge_at):
            e.payload["checksums"][DIVERGED_FQN] += 1.0
    return events


def _timeline(world_size: int, iterations: int, faults: Faults) -> list[Event]:
    delay = [0.0] * world_size
    delay[faults.straggler] = faults.delay_s
    fake = testing.FakeTimeline(world_size=world_size, iterations=iterations, delay=delay)
    # FakeTimeline.rank_events(rank) simulates all ranks per iteration (collectives wait
    # for the last): one simulation per iteration, split by rank, instead of one per rank.
    out = [_event(fake.watch(r), r, 0, fake.t0 - 1.0) for r in range(world_size)]
    for it in range(1, iterations + 1):
        for r, spans in fake.true_spans(it).items():  # no skew: a rank's clock is true time
            out.append(_event(TimelineSpans(iteration=it, spans=spans), r, it, spans[-1].end))
    return out


def _lifecycle(world_size: int, iterations: int, faults: Faults) -> list[Event]:
    plain = testing.FakeLifecycle(world_size=world_size, iterations=iterations, unused=UNUSED)
    dropped = testing.FakeLifecycle(
        world_size=world_size, iterations=iterations, unused=UNUSED, dropped_at=faults.dropped_at
    )
    # A rank's events differ from another's only in Event.rank: simulate one, relabel.
    return _relabel(plain.rank_events(0), world_size, {faults.dropped: dropped.rank_events(0)})


def _precision(world_size: int, iterations: int, faults: Faults) -> list[Event]:
    policies = {k: testing.fsdp2_policy("bf16", "fp32") for k in ("", "1", "2")}
    units = testing.mp_net(policies)
    plain = testing.FakePrecision(units, world_size=world_size, iterations=iterations)
    odd = testing.FakePrecision(
        units,
        world_size=world_size,
        iterations=iterations,
        alter={("1", "param"): "torch.float32"},
    )
    return _relabel(plain.rank_events(0), world_size, {faults.full_precision: odd.rank_events(0)})


def _relabel(events: list[Event], world_size: int, instead: dict[int, list[Event]]) -> list[Event]:
    return [
        Event(e.kind, r, e.step, e.t, e.payload)
        for r in range(world_size)
        for e in instead.get(r, events)
    ]


def _event(record: Any, rank: int, step: int, t: float) -> Event:
    return Event(record.KIND, rank, step, t, msgspec.to_builtins(record))
