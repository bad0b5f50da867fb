"""One iteration's record on the rank, until it is sent as ``lifecycle_iteration``."""

from __future__ import annotations

from dataclasses import dataclass, field

from interactive_shard.ddp._instance_watch import collective
from interactive_shard.ddp.events import Collective, LifecycleIteration
from interactive_shard.probing import spy as _spy
from interactive_shard.probing.collective_log import Record


@dataclass(slots=True)
class Part:
    forwards: int = 0
    dropped: int = 0
    backward: bool = False
    finished: bool | None = None
    unready: list[str] = field(default_factory=list)
    ready: list[int] = field(default_factory=list)  # parameter indices, in ready order
    collectives: list[Record | _spy.Launch] = field(default_factory=list)
    walk_s: float | None = None
    steps: int = 0

    def empty(self) -> bool:
        return not (self.forwards or self.backward or self.collectives or self.ready)

    def event(
        self, iteration: int, serial: int, names: list[str], group: str
    ) -> LifecycleIteration:
        _spy.settle([c for c in self.collectives if isinstance(c, _spy.Launch)])
        return LifecycleIteration(
            iteration=iteration,
            ddp=serial,
            forwards=self.forwards,
            dropped=self.dropped,
            backward=self.backward,
            finished=self.finished,
            unready=self.unready,
            ready=[names[i] for i in self.ready],
            collectives=[_one(c, serial, group) for c in self.collectives],
            walk_s=self.walk_s,
            steps_in_backward=self.steps,
        )


def _one(c: Record | _spy.Launch, serial: int, group: str) -> Collective:
    if isinstance(c, _spy.Launch):
        return Collective(
            op="all_reduce",
            nbytes=c.nbytes,
            dtype=_dtype(c),
            group=group,
            start=c.start_t,
            end=c.end_t,
            caller="reducer",
            ddp=serial,
        )
    return collective(c)


def _dtype(launch: _spy.Launch) -> str:
    """The bucket's dtype, from the finished all-reduce's result (its flat buffer)."""
    try:
        return str(launch.work.value()[0].dtype) if launch.work.done() else ""
    except Exception:  # a failed all-reduce: the user sees its error, not ours
        return ""
