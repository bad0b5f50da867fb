"""A synthetic 2-rank run of ``Overhead`` events, as the probes send them (``Feature.fake``):
cumulative numbers at most once a second while training and at the run's end; a DDP
model watched with ``ish.watch(ddp)``, the ledger and the channel's flushes."""

from __future__ import annotations

from interactive_shard.telemetry.run_events import Overhead
from interactive_shard.telemetry.schema import Event, record_event

STEP_S = 0.2  # one training step
# probe -> (seconds of its own per step, calls per step); rank 1 pays a little more
COSTS = {"buckets": (0.0009, 40), "ddp": (0.0004, 30), "collectives": (0.0001, 2)}
SENDING = (0.0002, 1)  # the background flushes, per step


def sample(iterations: int = 10, world_size: int = 2, t0: float = 1000.0) -> list[Event]:
    """``iterations`` steps on ``world_size`` ranks: every probe's ``Overhead`` once per
    simulated second and after the last step (an explicit flush)."""
    out: list[Event] = []
    every = max(1, round(1.0 / STEP_S))
    for rank in range(world_size):
        slower = 1.0 + 0.25 * rank
        said = [it for it in range(1, iterations + 1) if it % every == 0 or it == iterations]
        for it in said:
            t = t0 + it * STEP_S + rank * 1e-3
            for probe, (spent, calls) in (*COSTS.items(), ("sending", SENDING)):
                background = probe in ("collectives", "sending")
                event = Overhead(
                    probe=probe,
                    spent_s=spent * slower * it,
                    active_s=it * STEP_S if background else (it - 0.05) * STEP_S,
                    calls=calls * it,
                    iterations=0 if background else it,
                )
                out.append(record_event(event, rank, it, t))
    return sorted(out, key=lambda e: e.t)
