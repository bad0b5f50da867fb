"""The monitor in plain words: each rank's state, step and last log line, each scalar's
latest values (what a front end without widgets shows; ``ui/fallback.py``)."""

from __future__ import annotations

from interactive_shard.monitor.model import MonitorModel
from interactive_shard.telemetry import rank_info
from interactive_shard.ui.fallback import listed

MAX_SCALARS = 6


def summary(model: MonitorModel) -> str:
    model.update()
    lines = []
    label = rank_info.of(model.store).label
    for rank, status in enumerate(model.ranks):
        total = f" of {status.total}" if status.total else ""
        detail = f" ({status.detail})" if status.detail else ""
        last = f" · last log: {status.logs[-1]}" if status.logs else ""
        state = f"{status.state.value}{detail}, step {status.step}{total}{last}"
        lines.append(f"rank {label(rank)}: {state}")
    names = sorted(model.scalars)
    for name in names[:MAX_SCALARS]:
        latest = [
            f"rank {r}: {series.values[-1]:.4g} at step {series.steps[-1]}"
            for r, series in sorted(model.scalars[name].items())
            if len(series)
        ]
        lines.append(f"scalar {name}: {listed(latest)}")
    if len(names) > MAX_SCALARS:
        lines.append(f"and {len(names) - MAX_SCALARS} more scalars: {listed(names[MAX_SCALARS:])}")
    if not names:
        lines.append('no scalars (ctx.emit("scalar", name=..., value=...))')
    return "\n".join(lines)
