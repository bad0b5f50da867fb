"""What a function running on a rank receives as its first argument."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

from interactive_shard.telemetry import run_events as events
from interactive_shard.telemetry.channel import Emitter


class RankContext:
    """Per-rank handle: identity, device, persistent state and telemetry.

    ``state`` is a dict that lives as long as the rank process: build a model in one
    ``cluster.run`` and step it in the next.
    """

    def __init__(
        self, rank: int, world_size: int, device: str, backend: str, emitter: Emitter
    ) -> None:
        self.rank = rank
        self.world_size = world_size
        self.device = torch.device(device)
        self.backend = backend
        self.state: dict[str, Any] = {}
        self._emitter = emitter
        # The emitter's keyword entry itself, not the method below that calls it: one
        # Python call an event instead of two (a tenth of what an event costs the rank).
        self.emit = emitter.emit_fields  # type: ignore[method-assign]

    @property
    def step(self) -> int:
        """The step that events are tagged with; set it, or loop over ``ctx.steps(n)``."""
        return self._emitter.step

    @step.setter
    def step(self, value: int) -> None:
        self._emitter.step = int(value)

    def emit(self, kind: str, /, **payload: Any) -> None:
        """Send an event to the notebook. Payload values must be plain data.

        ``ctx.emit("scalar", name="loss", value=loss.item())`` plots a line per rank.
        """
        self._emitter.emit_fields(kind, **payload)

    def steps(self, total: int, start: int = 1) -> Iterator[int]:
        """Iterate ``start .. start+total-1``, setting ``ctx.step`` and reporting progress."""
        if not isinstance(total, int) or total < 0:
            raise ValueError(f"ctx.steps(total) needs a non-negative int, got {total!r}.")
        for step in range(start, start + total):
            self.step = step
            self._emitter.emit(
                events.Progress.KIND, events.payload(events.Progress(total=start + total - 1))
            )
            yield step

    def flush(self) -> None:
        """Send buffered events now (they also go out every 20 ms and at the run's end)."""
        self._emitter.flush()

    def __repr__(self) -> str:
        return (
            f"RankContext(rank={self.rank}, world_size={self.world_size}, "
            f"device={str(self.device)!r}, backend={self.backend!r})"
        )
