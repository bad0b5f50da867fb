"""What ``TimelineModel`` returns: aligned spans, collectives matched across ranks,
findings, per-iteration summaries (re-exported by ``model.py``, their home for users)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import msgspec


class TimelineSpan(msgspec.Struct, kw_only=True, frozen=True):
    """A span of one rank, its times in seconds on the aligned clock (rank 0's)."""

    kind: str
    name: str
    start: float
    end: float
    rank: int
    iteration: int
    detail: dict[str, str | int | float | bool] = {}

    @property
    def duration(self) -> float:
        return self.end - self.start


@dataclass(frozen=True)
class Matched:
    """One collective seen on several ranks: the ``index``-th (from 0) of its ``group``
    and ``op`` in the iteration on each of them. Times aligned; ``waited``: how long each
    rank waited in it for the ``straggler`` (the rank that started it last)."""

    index: int
    op: str
    group: str
    nbytes: int
    starts: dict[int, float]
    ends: dict[int, float]
    straggler: int
    waited: dict[int, float]


@dataclass(frozen=True)
class TimelineFinding:
    """Something the timelines show, merged over ranks and iterations."""

    kind: str  # "bunched": no collective of the backward overlapped its compute
    ranks: list[int]
    iterations: list[int]
    message: str


class Summary(NamedTuple):
    """One (rank, iteration)'s backward in four numbers (what overviews of a long run
    plot): its collectives, ``overlap`` (0..1) and ``exposed`` seconds as ``overlap()``
    and ``exposed()`` give them, and whether its collectives were ``bunched``."""

    collectives: int
    overlap: float
    exposed: float
    bunched: bool


class Malformed(ValueError):
    """A payload that follows its Struct but cannot be a real span."""
