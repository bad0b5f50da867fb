"""What the kernel and a rank say to each other on the rank's control pipe.

The pipe is anonymous (inherited from the kernel, never a listening socket), so only
the kernel and its rank can write to it; these small types replace positional tuples.
"""

from __future__ import annotations

from dataclasses import dataclass

STARTUP = 0  # the run id of a failure before any run: the rank could not start


# -- kernel -> rank ---------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class RunCall:
    run_id: int
    payload: bytes  # cloudpickle of (fn, args, kwargs, sources)


@dataclass(frozen=True, slots=True)
class Stop:
    pass


# -- rank -> kernel ---------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Ready:
    pid: int


@dataclass(frozen=True, slots=True)
class Done:
    run_id: int
    result: bytes  # cloudpickle of the function's return value
    sent: int = 0  # events the rank sent (or dropped) in the run: the kernel counts them
    group_lost: bool = False  # the function destroyed the process group


@dataclass(frozen=True, slots=True)
class Failed:
    run_id: int  # STARTUP when the rank failed before serving any run
    traceback: str
    interrupted: bool  # a KeyboardInterrupt (the kernel was interrupted)
    broken: bool  # the process group failed: the ranks must restart
    sent: int = 0  # as Done's


ToRank = RunCall | Stop
FromRank = Ready | Done | Failed
