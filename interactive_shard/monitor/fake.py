"""A synthetic run of the events every run records (rank states, progress, a scalar and a
log line per step), as the cluster and ``ctx.emit`` make them, without ranks. For tests,
benchmarks and offline demos (``Feature.fake``).
"""

from __future__ import annotations

from interactive_shard.telemetry.rank_state import RankState
from interactive_shard.telemetry.run_events import Log, Progress, Scalar, State
from interactive_shard.telemetry.schema import Event, record_event


def sample(iterations: int = 3, world_size: int = 2, t0: float = 1000.0) -> list[Event]:
    """The feature's synthetic run (``Feature.fake``): ``iterations`` steps on each rank, each
    with its progress and three scalars (a falling ``loss``, ``lr``, ``grad_norm``), a log
    line every tenth step; the ranks finish."""
    out = []
    for rank in range(world_size):
        t = t0 + rank * 1e-3
        out.append(record_event(State(state=RankState.RUNNING), rank, 0, t))
        for step in range(1, iterations + 1):
            t += 0.01
            out.append(record_event(Progress(total=iterations), rank, step, t))
            for name, value in (("loss", 1.0 / step), ("lr", 1e-3), ("grad_norm", 0.5)):
                out.append(record_event(Scalar(name=name, value=value), rank, step, t))
            if step % 10 == 1:
                line = Log(stream="stdout", text=f"step {step}/{iterations}")
                out.append(record_event(line, rank, 0, t))
        out.append(record_event(State(state=RankState.FINISHED), rank, 0, t + 0.01))
    return sorted(out, key=lambda e: e.t)
