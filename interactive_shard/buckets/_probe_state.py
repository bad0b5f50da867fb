"""The bucket probe's state: where it is in DDP's iteration, and what that iteration saw.

Kept apart from the hooks in ``probe.py`` so that each state reads on its own: one enum
member says what is true now (instead of parallel flags), and named dataclasses hold
what an iteration collected until the end of backward emits it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum, auto
from typing import TYPE_CHECKING

import torch
from torch.nn.parallel import DistributedDataParallel

from interactive_shard.buckets._probe_data import Reduced
from interactive_shard.probing.spy import Launch

if TYPE_CHECKING:
    from torch._C._distributed_c10d import GradBucket


class Phase(Enum):
    """Where the probe is in DDP's iteration (Note [DDP bucket probe], steps 2 and 3)."""

    IDLE = auto()  # the next backward does not reduce (no_sync, no_grad), or it was emitted
    ARMED = auto()  # the last forward prepared DDP for a reducing backward
    OPEN = auto()  # an iteration began; no end callback queued (or it ran in a nested one)
    QUEUED = auto()  # an iteration began and its end callback is queued
    DETACHED = auto()  # ``detach()`` was called: nothing is recorded any more

    # Identity hash, in C: hooks test membership for every gradient (Enum's is Python).
    __hash__ = object.__hash__


RECORDING = frozenset({Phase.ARMED, Phase.OPEN, Phase.QUEUED})  # a gradient now is DDP's
BEGUN = frozenset({Phase.OPEN, Phase.QUEUED})  # an iteration is open
UNQUEUED = frozenset({Phase.ARMED, Phase.OPEN})  # recording, and no end callback queued


@dataclass(slots=True)
class Collected:
    """What the current DDP iteration saw; emitted (and replaced) at its end."""

    ready: list[tuple[int, float]] = field(default_factory=list)  # (param index, time)
    reduced: list[Reduced] = field(default_factory=list)  # by the comm hook (step 1)
    launches: list[Launch] = field(default_factory=list)  # spied all-reduces (step 0)


@dataclass(slots=True)
class BackwardEnd:
    """The end callback's bookkeeping (Note step 3, and "Nested backward")."""

    reductions: int = 0  # comm-hook calls and spied all-reduces so far
    seen: int = -1  # ``reductions`` at the callback's previous pass (-1: none yet)
    end_task: int = -1  # graph task the end callback was last queued in
    settle_task: int = -1  # graph task a settle callback was last queued in


class Scaling(Enum):
    """How the probe's comm hook averages a bucket exactly as the Reducer would (Note
    [DDP bucket probe], step 1)."""

    DIV = "buffer / world size"  # a power-of-two world size: both scalings agree
    MUL = "buffer * (1 / world size)"  # every gradient was copied into the bucket
    PER_GRADIENT = "each gradient by how it got there"  # gradient_as_bucket_view

    @classmethod
    def of(cls, ddp: DistributedDataParallel, world_size: int) -> Scaling:
        if world_size & (world_size - 1) == 0:
            return cls.DIV
        if getattr(ddp, "gradient_as_bucket_view", False):
            return cls.PER_GRADIENT  # only then may a gradient already be the bucket view
        return cls.MUL

    def scale(
        self,
        bucket: GradBucket,
        buffer: torch.Tensor,
        key: tuple[int, ...],
        world_size: int,
        grad_ptrs: dict[int, int],
    ) -> None:
        """Average ``buffer`` in place; ``key``: the bucket's Reducer indices,
        ``grad_ptrs``: where each gradient was when it was ready (PER_GRADIENT only)."""
        if buffer.is_sparse or self is Scaling.DIV:
            buffer.div_(world_size)
        elif self is Scaling.MUL:
            buffer.mul_(1.0 / world_size)
        else:
            for i, view in zip(key, bucket.gradients(), strict=True):
                if grad_ptrs.get(i) == view.data_ptr():
                    view.div_(world_size)  # the gradient already was the bucket view
                else:
                    view.mul_(1.0 / world_size)  # it was copied into the bucket
