"""The run's own cost in plain words: per rank, its share of the step and each probe's
(what a front end without widgets shows; ``ui/fallback.py``)."""

from __future__ import annotations

from interactive_shard.overhead.model import OverheadModel, percent
from interactive_shard.ui.format import duration_ms


def summary(model: OverheadModel) -> str:
    model.update()
    ranks = model.ranks
    if not ranks:
        return "no probe costs recorded yet"
    lines = [model.badge()]
    for rank in ranks:
        parts = [
            f"{r.probe} {percent(r.share)} ({duration_ms(r.spent)}, {r.calls:,} calls)"
            for r in model.rows()
            if r.rank == rank
        ]
        lines.append(f"rank {rank}: {percent(model.share(rank=rank))}: " + ", ".join(parts))
    return "\n".join(lines)
