"""What a rank is doing: the states a Cluster reports and a run's events record."""

from __future__ import annotations

from enum import Enum


class RankState(str, Enum):
    """What a rank is doing. A Run's ranks go running -> finished | failed."""

    STARTING = "starting"
    IDLE = "idle"
    RUNNING = "running"
    FINISHED = "finished"
    FAILED = "failed"
